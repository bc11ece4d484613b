"""Turnstile streams with continual release: create, ingest, release, inspect.

A stream is a matrix of public shape that changes by batches of updates
``(entity, i, j, s)`` over epochs ``1..T`` (the horizon). Its state
(:class:`pipeline.io.stream_state.StreamStore`) holds the running exact sketches
(and a BLT's noise buffers; a ``tree`` stream: the exact p-sums of its binary
tree), the clipped cells of the batches of epochs not yet closed, each
entity's spent clipping budget, and the table that gives each string entity id
its own key (:mod:`pipeline.io.entity_ids`). Every step is one atomic commit of the state:

* :func:`stream_init` plans the stream, charges its whole (epsilon, delta)
  **once**, before any data exists, to the ledger of the stream's population
  (named by the caller: every stream and release on that population composes
  there, so the stream that continues one after its horizon does too [spec
  9.18]), and creates the state with a fresh secret sketch seed and noise key;
* :func:`stream_ingest` validates a batch, clips it per entity against the
  budgets left [spec sketch-lrf 1.3] and records its clipped, coalesced cells
  under its epoch; a batch already ingested, or for an epoch already closed, is
  refused;
* :func:`stream_release` closes the epochs up to ``epoch``: each epoch's cells
  are sketched once (in parallel on Dask when a client is given, each part
  regenerating only the operator rows its cells touch [spec 6.4]) and added to
  the running sums (the tree: folded into it [spec 3.4]); it then adds the
  mechanism's keyed noise of ``epoch`` once and publishes the factorization of
  ``A(epoch)`` atomically. A release is a pure
  function of the committed state, so a rerun after a crash at any point
  publishes byte-identical arrays and charges nothing.

Sketching at the close of an epoch rather than at every ingest generates each
touched operator tile once per epoch instead of once per batch, and keeps 24
bytes per cell in the state instead of a dense sketch delta per batch
(``t`` + ``v`` floats per touched row and column).

Privacy. The whole stream is one Gaussian mechanism, on ``R X`` for the
stream's factorization ``A = L R`` of the prefix sums
(:mod:`pipeline.algorithms.continual_factorization`: ``blt`` by default,
``sqrt-factorization``, or the tree over its ``L = floor(log2 T) + 1`` levels
[spec 4.5]), calibrated at ``max_s ||R e_s||`` times the one-shot sensitivity
under the continual relation of spec 1.4, which per-entity clipping enforces. Errors, logs and progress never
show data values, counts of clipped entities or norms.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import glob
import hashlib
import math
import os
import shlex
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline._validation import (
    check_enum,
    check_int_in_range,
)
from pipeline._version import __version__
from pipeline.accounting.contract import Accountant, EntityUnit, PrivacyContract
from pipeline.algorithms.base import Factorization
from pipeline.algorithms.continual import (
    LEGACY_PLAN_VERSION,
    PLAN_VERSION,
    StreamPlan,
    advance_tree,
    model_error,
    noise_code,
    noise_std,
    noisy_sketches,
    operator_notes,
    partition_cells,
    plan_stream,
    release_factorization,
    sum_deltas,
    tree_nodes,
)
from pipeline.algorithms.continual_factorization import (
    BLT,
    SQRT,
    TREE,
    ContinualMechanism,
    NoiseTerm,
    blt_advance,
    blt_noise,
    continual_mechanism,
    released_sketches,
)
from pipeline.algorithms.lrf import noise_level, seed_fingerprint
from pipeline.errors import (
    EpochError,
    HorizonExceededError,
    InvalidParameterError,
    PipelineError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.io.batches import UpdateBatch, read_batch
from pipeline.io.entity_ids import EntityIds
from pipeline.io.objectstore import local_path
from pipeline.io.stream_state import (
    LEGACY_FORMAT,
    STATE_FORMAT,
    StateLockedError,
    StreamStore,
)
from pipeline.jobs.engine import InputRef, ReleaseJob, ReleaseSpec
from pipeline.jobs.engine import crash_point as _crash_point
from pipeline.jobs.reports import OMIT, NonPrivate, StreamPrivacy, StreamReport
from pipeline.mechanisms.entities import (
    EntityTable,
    clip_updates,
    coalesce,
    zero_non_finite_entities,
)
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
from pipeline.mechanisms.signal import signal_of
from pipeline.params import (
    Algorithm,
    ClipSpec,
    LrfParams,
    Neighboring,
    OperatorKind,
    PrivacyUnit,
    StreamMechanism,
    StreamParams,
    StreamUnit,
)

__all__ = [
    "DuplicateBatchError",
    "StateLockedError",
    "StreamInfo",
    "StreamManifest",
    "StreamParams",
    "continue_advice",
    "continue_command",
    "mechanism_of",
    "noisy_state_sketches",
    "open_stream",
    "read_manifest",
    "stream_contract",
    "stream_ingest",
    "stream_init",
    "stream_release",
    "stream_status",
]


class DuplicateBatchError(InvalidParameterError):
    """The batch's content was already ingested into this stream."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# -- the plan, rebuilt from the manifest's public parameters -------------------


def _lrf_params(p: dict[str, Any]) -> LrfParams:
    return LrfParams(
        algorithm=Algorithm(p["algorithm"]),
        rank=p["rank"],
        sketch_size=p["sketch_size"],
        core_size=p["core_size"],
        private=p["private"],
        epsilon=p["epsilon"],
        delta=p["delta"],
        # streams clip per entity (pipeline.mechanisms.entities); the full-matrix
        # unit of LrfParams is not used, only the clip norm
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=p["clip_norm"]),
        neighboring=Neighboring(p["neighboring"]),
        delta_jl_fraction=p["delta_jl_fraction"],
        # states written before the field existed used Gaussian operators; a new
        # stream's is chosen by its plan (None) and recorded
        operator=None
        if p.get("operator", "gaussian") is None
        else OperatorKind(p.get("operator", OperatorKind.GAUSSIAN.value)),
    )


def _plan_params(p: dict[str, Any], mech: ContinualMechanism) -> StreamPlan:
    """The stream's plan from its manifest's public parameters (by its plan version)."""
    return plan_stream(
        _lrf_params(p),
        (p["n_rows"], p["n_cols"]),
        p["horizon"],
        unit=StreamUnit(p.get("unit", StreamUnit.GENERAL.value)),
        public_seed=p.get("public_seed"),
        sensitivity_factor=None if mech.name == TREE else mech.sensitivity_factor,
        noise_factor=mech.rms_noise_factor,
        # states written before the version was recorded: the operators, sizes and
        # split they were created with
        version=int(p.get("plan_version", LEGACY_PLAN_VERSION)),
    )


def plan_of(manifest: dict[str, Any]) -> StreamPlan:
    """The stream's plan, rebuilt from its manifest and checked against it."""
    p = manifest["params"]
    if manifest.get("public_sketch_seed") and p["private"] and "public_seed" not in p:
        raise StoreLayoutError(
            "the stream was created with a public sketch seed by a dplr version that "
            "calibrated its noise for a secret one, so its releases would claim more "
            "privacy than they have; create a new stream."
        )
    mech = mechanism_of(manifest)
    try:
        plan = _plan_params(p, mech)
    except InvalidParameterError as e:  # e.g. a recorded operator no longer exact
        raise StoreLayoutError(
            f"the stream state's plan cannot be rebuilt by this dplr version ({e}); "
            "use the dplr version that created the stream."
        ) from None
    want = manifest["plan"]
    recorded = want.get("mechanism", {}).get("sensitivity_factor")
    cal = plan.lrf.calibration
    if (
        (plan.lrf.t, plan.lrf.v, plan.lrf.transpose, plan.levels)
        != (want["sketch_size"], want["core_size"], want["transposed"], want["levels"])
        or (recorded is not None and recorded != mech.sensitivity_factor)
        or (cal is not None and want.get("calibration") not in (None, cal.to_dict()))
    ):
        raise StoreLayoutError(
            "the stream state's plan does not match what this dplr version derives "
            "from its parameters; use the dplr version that created the stream."
        )
    return plan


def mechanism_of(manifest: dict[str, Any]) -> ContinualMechanism:
    """The stream's continual-release mechanism, as its manifest records it.

    A state written before streams had a choice (no ``mechanism`` parameter)
    releases by the binary tree, as it always did; a BLT's parameters are read
    from the manifest, never fitted again.
    """
    p = manifest["params"]
    name = str(p.get("mechanism", TREE))
    rec = manifest["plan"].get("mechanism") or {}
    if name == BLT and not rec.get("theta"):
        raise StoreLayoutError(
            "the stream's manifest names the 'blt' mechanism without its parameters; "
            "the state is damaged or was not written by dplr."
        )
    return ContinualMechanism(
        name=name,
        horizon=int(p["horizon"]),
        theta=tuple(float(x) for x in rec.get("theta", ())),
        omega=tuple(float(x) for x in rec.get("omega", ())),
    )


def _mechanism_record(mech: ContinualMechanism) -> dict[str, Any]:
    """What the manifest's plan records of the mechanism (public values)."""
    return {
        "name": mech.name,
        "theta": list(mech.theta),
        "omega": list(mech.omega),
        "sensitivity_factor": mech.sensitivity_factor,
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamManifest:
    """The stream's committed state as a run reads it (public values only).

    A typed view of the manifest: the epochs closed and released so far and the
    horizon of the stream's plan.
    """

    stream_id: str
    last_closed: int
    horizon: int
    releases: dict[int, str]  # epoch -> where it was published

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> StreamManifest:
        """Read ``manifest`` (its plan rebuilt and checked, :func:`plan_of`)."""
        return cls(
            stream_id=str(manifest["stream_id"]),
            last_closed=int(manifest["last_closed"]),
            horizon=plan_of(manifest).horizon,
            releases={int(e): r["out"] for e, r in manifest["releases"].items()},
        )


def read_manifest(store: Any) -> StreamManifest:
    """The typed committed state of an open (locked) stream store."""
    return StreamManifest.of(store.manifest)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamInfo:
    """Public summary of a stream (what ``dplr stream status`` prints)."""

    path: str
    stream_id: str
    shape: tuple[int, int]
    rank: int
    algorithm: str
    private: bool
    horizon: int
    levels: int
    last_closed: int
    released: tuple[int, ...]
    pending_epochs: tuple[int, ...]
    n_batches: int
    epsilon: float | None
    delta: float | None
    #: the population's ledger, charged once at creation (None: non-private)
    ledger: str | None
    #: what each entity's updates are bound to (``--unit``: row, column, entry, general)
    unit: str
    #: no two entities share a row (column, cell): ``--exclusive``
    exclusive: bool
    #: whom the stream's one charge protects: ``entity``, or the matrix unit of an
    #: exclusive stream (:func:`stream_contract`); None for a non-private stream
    privacy_unit: str | None
    #: the continual-release mechanism ("blt", "sqrt-factorization", "tree")
    mechanism: str
    #: per-entry noise std at the last closed epoch over the one-shot sigma
    #: (None before the first epoch closes)
    noise_factor: float | None
    #: the released singular values' noise level at the last closed epoch
    #: (the report's signal level; None if non-private or no epoch closed)
    predicted_error: float | None
    #: the error model's additive spectral error at the last closed epoch, with
    #: the mechanism's noise factor (None if non-private or no epoch closed)
    model_error: dict[str, float] | None
    #: the operators and sizes the stream was planned with, and why
    operators: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def _privacy_unit(params: dict[str, Any]) -> str | None:
    """The unit a stream's charge protects, as its contract reads it (None: non-private)."""
    if not params["private"]:
        return None
    return str(stream_contract(params, params["epsilon"], params["delta"]).unit.value)


def _info(store: Any) -> StreamInfo:
    m = store.manifest
    p = m["params"]
    plan, mech, tau = plan_of(m), mechanism_of(m), int(m["last_closed"])
    return StreamInfo(
        path=store.path,
        stream_id=m["stream_id"],
        shape=(p["n_rows"], p["n_cols"]),
        rank=p["rank"],
        algorithm=p["algorithm"],
        private=p["private"],
        horizon=p["horizon"],
        levels=m["plan"]["levels"],
        last_closed=m["last_closed"],
        released=tuple(sorted(int(e) for e in m["releases"])),
        pending_epochs=tuple(sorted(int(e) for e in m["pending"])),
        n_batches=len(m["batches"]),
        epsilon=p["epsilon"],
        delta=p["delta"],
        ledger=None if m["ledger"] is None else m["ledger"]["path"],
        unit=p["unit"],
        exclusive=bool(p.get("exclusive", False)),
        privacy_unit=_privacy_unit(p),
        mechanism=mech.name,
        noise_factor=mech.noise_factor(tau) if tau else None,
        predicted_error=_noise_level(plan, mech, tau) if tau else None,
        model_error=model_error(plan, mech.noise_factor(tau)) if tau else None,
        operators=operator_notes(plan),
    )


def open_stream(state: str | os.PathLike[str]) -> Any:
    """Open a stream state (a :class:`~pipeline.io.stream_state.StreamStore`)."""
    return StreamStore.open(state)


def stream_status(state: str | os.PathLike[str]) -> StreamInfo:
    """Public summary of the stream at ``state``."""
    return _info(open_stream(state))


# -- init -----------------------------------------------------------------------


def stream_init(
    state: str | os.PathLike[str],
    *,
    n_rows: int,
    n_cols: int,
    rank: int,
    horizon: int,
    epsilon: float | None = None,
    delta: float | None = None,
    algorithm: str = "spectral",
    private: bool = True,
    clip_norm: float = 1.0,
    unit: str = "general",
    neighboring: str = "add-remove",
    sketch_size: int | None = None,
    core_size: int | None = None,
    mechanism: str = "blt",
    exclusive: bool = False,
    ledger: str | os.PathLike[str] | None = None,
    budget: tuple[float, float] | None = None,
    seed: int | None = None,
    insecure_noise_seed: int | None = None,
) -> StreamInfo:
    """Create a stream: plan it, charge its budget once, write its empty state.

    Parameters
    ----------
    state : path
        The state directory to create (must not exist).
    n_rows, n_cols : int
        Public shape, fixed from a public id space [spec 1.1].
    rank : int
        Target rank k of every release.
    horizon : int
        ``T``: the number of epochs the budget covers.
    epsilon, delta : float
        Budget of the **whole stream**, every release included.
    algorithm : {"spectral", "low-space"}
    private : bool
        False: no clipping, no noise, no ledger (the linearity reference).
    clip_norm : float
        ``C``: each entity's contributions over the whole stream have total
        Frobenius norm at most C.
    unit : {"general", "row", "column", "entry"}
        What one entity may touch [spec 1.3, rule 4].
    neighboring : {"add-remove", "replace"}
        ``Delta_F = C`` or ``2C``.
    sketch_size, core_size : int or None
        ``t``, ``v``; None takes the defaults of one-shot releases.
    mechanism : {"blt", "sqrt-factorization", "tree"}
        The continual-release mechanism
        (:mod:`pipeline.algorithms.continual_factorization`): the buffered
        Toeplitz factorization (default; its parameters are fitted to the
        horizon here and recorded), the square-root factorization, or the
        binary tree (for comparison).
    exclusive : bool
        No two entities share a row (column, cell) of ``unit``: refused at
        ingest otherwise. Each entity is then one row's (column's, cell's)
        individual, and the stream is charged as a release at that unit
        (:func:`stream_contract`), composing on a ``row`` (``column``,
        ``entry``) ledger with ``factorize`` and ``pca`` releases. Without
        it, the stream protects entities and composes only on an ``entity``
        ledger.
    ledger : path
        The privacy ledger of the stream's population, which every stream and
        release on that population charges. Required for a private stream
        (there is no default: a ledger of the stream's own would let each new
        stream start from a fresh budget); refused for a non-private one.
    budget : (epsilon, delta) or None
        Lifetime budget of the population, declared when ``ledger`` does not
        exist yet (it is then created with this stream's charge). For an
        existing ledger, None or its declared budget.
    seed : int or None
        Public sketch seed (default: 128 secret bits). The noise is then
        calibrated with the worst-case sensitivity of its operators
        (spec private-lrf-2 section 3), which is larger.
    insecure_noise_seed : int or None
        Reproducible noise, for tests only: releases say NOT PRIVATE.

    Returns
    -------
    StreamInfo

    Raises
    ------
    InvalidParameterError, PrivacyConfigError
        Bad parameters, no ledger, a new ledger without a budget; nothing is
        created or charged.
    BudgetExceededError
        The ledger cannot afford the stream on top of what it already holds;
        nothing is created or charged.
    StoreLayoutError
        ``state`` exists.

    Notes
    -----
    Privacy. Charges one Gaussian mechanism over the whole tree [spec 4.5] to
    the population's ledger, where it composes with every earlier release and
    stream (spec 9.18: the tree after a horizon composes with the one before);
    releases are post-processing and are never charged again.
    """
    if seed is not None:
        seed = check_int_in_range(seed, "seed", 0, 2**128 - 1)
    params = StreamParams(
        n_rows=n_rows,
        n_cols=n_cols,
        rank=rank,
        horizon=horizon,
        epsilon=epsilon,
        delta=delta,
        algorithm=check_enum(Algorithm, algorithm, "algorithm"),
        private=private,
        clip_norm=clip_norm,
        unit=check_enum(StreamUnit, unit, "unit"),
        neighboring=check_enum(Neighboring, neighboring, "neighboring"),
        sketch_size=sketch_size,
        core_size=core_size,
        mechanism=check_enum(StreamMechanism, mechanism, "mechanism"),
        exclusive=exclusive,
    ).to_manifest()
    params["public_seed"] = (
        seed  # a user-given seed is public: the noise covers its operators
    )
    if not private and (ledger is not None or budget is not None):
        raise InvalidParameterError(
            "a non-private stream is charged to no ledger; drop ledger and budget."
        )
    mech = continual_mechanism(params["mechanism"], params["horizon"])
    # the plan picks the operators (exact where the unit allows); both are recorded,
    # and every later step re-plans from them (plan_of)
    params |= {"operator": None, "plan_version": PLAN_VERSION}
    plan = _plan_params(params, mech)
    params["operator"] = plan.lrf.operator.value
    state = local_path(state, "stream state")
    spec = functools.partial(
        _init_spec, params, plan, state, ledger, budget, seed, insecure_noise_seed
    )
    if os.path.lexists(state):
        if _created_by(spec, state):  # a crash after the state, before the clean-up
            return _info(open_stream(state))
        raise StoreLayoutError(
            f"stream state {state!r} already exists; a stream is created once (its "
            "budget cannot be reset). Choose another path."
        )
    job = ReleaseJob(spec())
    job.prepare()  # refused here (contract vs ledger, budget): nothing exists yet
    assert job.sketch_seed is not None  # drawn (or the given one) by job.prepare()
    manifest = _new_manifest(params, plan, job, public_seed=seed is not None)
    manifest["plan"]["mechanism"] = _mechanism_record(mech)
    p = params
    # the key and the seed go to a journal beside the ledger, then the one charge:
    # a crash before the state exists is finished by the same command, not recharged
    job.charge(
        algorithm=f"continual-{p['algorithm']}",
        details={
            "stream": state, "stream_id": manifest["stream_id"], "horizon": p["horizon"],
            "tree_levels": plan.levels, "rank": p["rank"], "sketch_size": plan.lrf.t,
            "core_size": plan.lrf.v, "mechanism": mech.name,
            "sensitivity_factor": mech.sensitivity_factor,
        },
    )  # fmt: skip
    store = StreamStore.create(
        state, manifest=manifest, sketch_seed=job.sketch_seed, noise_key=job.noise_key
    )
    _crash_point("after-state")
    job.publish(None)  # the state holds the key and the seed now
    return _info(store)


def _created_by(make_spec: Callable[[], ReleaseSpec], state: str) -> bool:
    """True if ``state`` is the stream this very job created; its journal is removed.

    A crash between writing the state and removing the job's journal (beside
    the ledger, holding the noise key) leaves both; the same command finds the
    journal of the same job naming that stream and finishes the clean-up.
    """
    from pipeline.io import FileJournal  # heavy: dask

    try:
        spec = make_spec()
    except PipelineError:
        return False  # not a job that could have created a stream
    jpath = spec.journal_path()
    if jpath is None or not os.path.isdir(jpath):
        return False
    try:
        jr = FileJournal.find(jpath, spec.header(), strict=True)
        stream_id = open_stream(state).manifest["stream_id"]
    except PipelineError:
        return False
    if jr is None or jr.release_id != stream_id:
        return False
    jr.remove()
    return True


def _init_spec(
    params: dict[str, Any],
    plan: StreamPlan,
    state: str,
    ledger: Any,
    budget: Any,
    seed: int | None,
    insecure: int | None,
) -> ReleaseSpec:
    """The release spec of a stream's creation: the whole tree, charged once."""
    cal = plan.lrf.calibration
    if cal is not None and ledger is None:
        raise PrivacyConfigError(
            "a private stream is charged to its population's privacy ledger and none was "
            "given; pass --ledger PATH (ledger=PATH), with --budget-epsilon/--budget-delta "
            "(budget=(epsilon, delta)) if that ledger does not exist yet."
        )
    contract = None if cal is None else stream_contract(
        params, cal.epsilon, cal.delta, secret_noise=insecure is None,
        public_operators=seed is not None,
    )  # fmt: skip
    shape = (params["n_rows"], params["n_cols"])
    return ReleaseSpec(
        kind="stream", contract=contract, calibration=cal,
        parameters={**params, "state": state},
        input=InputRef(path=None, fingerprint=None, shape=shape, dtype="float64", chunks=()),
        ledger=ledger, budget=None if budget is None else tuple(budget),
        insecure_noise_seed=insecure, sketch_seed=seed, uses_sketch_seed=True,
        sketch_seed_fingerprint=None if seed is None else seed_fingerprint(seed),
    )  # fmt: skip


def stream_contract(
    params: dict[str, Any],
    epsilon: float,
    delta: float,
    *,
    secret_noise: bool = True,
    public_operators: bool = False,
) -> PrivacyContract:
    """The privacy contract of a stream's one charge, from its manifest's parameters.

    The individual is an entity id (unit ``entity``), whatever row, column or
    cell it is bound to: several entities may share one. An **exclusive**
    stream refuses at ingest any row (column, cell) touched by two entities,
    so one row's individual is exactly one entity and its guarantee per
    entity is a guarantee per row (column, cell): it is charged at that unit,
    under the same relation (removing the row's individual removes the
    entity's whole contribution over all epochs). A stream of cells is read
    at the entry unit only (``entry_reads`` empty): its sensitivity is a sum
    over epochs, so a row of cells spent in different epochs is not bounded
    by ``sqrt(n_cols)`` cells (:mod:`pipeline.accounting.contract`).
    """
    unit: PrivacyUnit | EntityUnit = EntityUnit.ENTITY
    if params.get("exclusive", False):  # states before the field: not exclusive
        unit = PrivacyUnit(params["unit"])
    return PrivacyContract(
        unit=unit, neighboring=params["neighboring"], clip_norm=params["clip_norm"],
        epsilon=epsilon, delta=delta, accountant=Accountant.ANALYTIC_GAUSSIAN,
        shape=(params["n_rows"], params["n_cols"]), secret_noise=secret_noise,
        public_operators=public_operators,
        entry_reads=() if unit is PrivacyUnit.ENTRY else ("row", "column"),
    )  # fmt: skip


def _new_manifest(
    params: dict[str, Any], plan: StreamPlan, job: ReleaseJob, *, public_seed: bool
) -> dict[str, Any]:
    cal, book = plan.lrf.calibration, job.book
    stream_id = job.release_id
    assert job.sketch_seed is not None  # drawn (or the given one) by job.prepare()
    return {
        "dplr_version": _version(),
        "stream_id": stream_id,
        "created": _now(),
        "params": params,
        "plan": {
            "sketch_size": plan.lrf.t,
            "core_size": plan.lrf.v,
            "transposed": plan.lrf.transpose,
            "levels": plan.levels,
            "tile_size": plan.lrf.params.tile_size,
            "calibration": None if cal is None else cal.to_dict(),
        },
        "sketch_seed_fingerprint": seed_fingerprint(job.sketch_seed),
        "insecure_noise": job.spec.insecure_noise_seed is not None,
        "public_sketch_seed": public_seed,
        "ledger": None
        if book is None
        else {"path": str(book.path), "release_id": stream_id},
        "entity_kind": None,
        "last_closed": 0,
        "closed": {},
        "pending": {},
        "next_batch": 0,
        "batches": [],
        "releases": {},
    }


# -- the horizon ----------------------------------------------------------------


def continue_command(manifest: dict[str, Any]) -> str:
    """The ``dplr stream init`` command of a stream that continues this one.

    Same shape, rank, horizon, algorithm, contract and sizes; for a private
    stream, the same ledger, where the new stream's charge composes with this
    one's [spec 9.18]. ``NEW_STATE`` stands for the new state's path.
    """
    p = manifest["params"]
    words = [
        "dplr",
        "stream",
        "init",
        "NEW_STATE",
        "--rows",
        p["n_rows"],
        "--cols",
        p["n_cols"],
        "--rank",
        p["rank"],
        "--horizon",
        p["horizon"],
    ]
    if p["private"]:
        words += ["--epsilon", repr(p["epsilon"]), "--delta", repr(p["delta"])]
    else:
        words += ["--non-private"]
    words += [
        "--algorithm",
        p["algorithm"],
        "--clip-norm",
        repr(p["clip_norm"]),
        "--unit",
        p["unit"],
        "--neighboring",
        p["neighboring"],
    ]
    for flag, key in (("--sketch-size", "sketch_size"), ("--core-size", "core_size")):
        if p[key] is not None:
            words += [flag, p[key]]
    words += ["--mechanism", p.get("mechanism", TREE)]
    if p.get("exclusive", False):
        words += ["--exclusive"]
    if manifest["ledger"] is not None:
        words += ["--ledger", manifest["ledger"]["path"]]
    return shlex.join(str(w) for w in words)


def continue_advice(manifest: dict[str, Any]) -> str:
    """The sentence that says how to continue after the horizon (no data, public parameters only)."""
    if manifest["ledger"] is None:
        return f"To continue, create a new stream: {continue_command(manifest)}"
    return (
        f"To continue, create a new stream on the same ledger {manifest['ledger']['path']!r}, "
        f"where its charge composes with this one's: {continue_command(manifest)}"
    )


def _check_epoch(plan: StreamPlan, manifest: dict[str, Any], epoch: Any) -> int:
    """``plan.check_epoch``, whose horizon refusal says how to continue on the same ledger."""
    try:
        return plan.check_epoch(epoch)
    except HorizonExceededError:
        raise HorizonExceededError(
            f"epoch {int(epoch)} is beyond the stream's horizon of {plan.horizon} epochs; its "
            f"budget was calibrated for the horizon. {continue_advice(manifest)}"
        ) from None


def _version() -> str:
    return __version__


# -- ingest ---------------------------------------------------------------------


@contextmanager
def _locked(state: Any, store: Any = None) -> Iterator[Any]:
    if store is not None:  # the caller holds the lock (a nightly run)
        yield store
        return
    st = open_stream(state)
    with st.lock():
        yield st


def _legacy_entity_key(manifest: dict[str, Any]) -> bytes:
    """The hash key with which format-1 states keyed string ids (derived from the public stream id)."""
    return hashlib.sha256(f"dplr-entity-ids:{manifest['stream_id']}".encode()).digest()[
        :16
    ]


def _hashes_string_ids(manifest: dict[str, Any]) -> bool:
    """Whether the state's string ids were hashed (format 1), so that two ids may share a key."""
    return bool(
        manifest["format"] == LEGACY_FORMAT and manifest["entity_kind"] == "str"
    )


def _load_entities(store: Any) -> EntityTable:
    if not store.has("entities/keys"):
        return EntityTable.empty()
    return EntityTable(
        keys=store.read("entities/keys"),
        spent=store.read("entities/spent"),
        anchor=store.read("entities/anchor"),
    )


def _load_entity_ids(store: Any) -> EntityIds:
    """The stream's table of string entity ids (their keys are their positions)."""
    if not store.has("entities/ids_data"):
        return EntityIds.empty()
    return EntityIds.from_arrays(
        store.read("entities/ids_data"), store.read("entities/ids_offsets")
    )


def _read_stream_batch(
    store: Any, manifest: dict[str, Any], batch: Any
) -> tuple[UpdateBatch, int]:
    """Read a batch with the stream's id mapping; also the number of ids the stream knew.

    The mapping is the stream's id table, or for a format-1 state holding string
    ids the hash it used (only to recognise the batches it already holds).
    """
    p = manifest["params"]
    shape = (p["n_rows"], p["n_cols"])
    if _hashes_string_ids(manifest):
        return read_batch(
            batch, shape=shape, entity_key=_legacy_entity_key(manifest)
        ), 0
    ids = _load_entity_ids(store)
    return read_batch(batch, shape=shape, entity_ids=ids), len(ids)


def _entity_id_arrays(b: UpdateBatch, known: int) -> dict[str, np.ndarray | None]:
    """The id table's arrays to commit with the batch: only when it brings new ids."""
    if b.id_table is None or len(b.id_table) == known:
        return {}
    data, offsets = b.id_table.to_arrays()
    return {"entities/ids_data": data, "entities/ids_offsets": offsets}


def _check_entity_kind(manifest: dict[str, Any], b: UpdateBatch) -> None:
    if not len(b):
        return
    if manifest["entity_kind"] not in (None, b.entity_kind):
        raise InvalidParameterError(
            f"this stream's entity ids are of kind {manifest['entity_kind']!r}, the batch's "
            f"are {b.entity_kind!r}; one stream keeps one kind of id."
        )
    if b.entity_kind == "str" and b.id_table is None:
        raise StoreLayoutError(
            f"this stream was created by a dplr version that hashed string entity ids to keys "
            f"that two ids can share (state format {LEGACY_FORMAT!r}), so it cannot take more "
            "string ids safely; create a new stream with this version and ingest there. "
            "Nothing was applied."
        )


def _known_batch(
    m: dict[str, Any], fp: str, b: UpdateBatch, skip_known: bool
) -> dict[str, Any] | None:
    """The record of a batch of the same content, to skip (``skip_known``), or None.

    Raises :class:`DuplicateBatchError` for a non-empty batch already ingested.
    """
    rec: dict[str, Any] | None = next(
        (r for r in m["batches"] if r["fingerprint"] == fp), None
    )
    if rec is not None and skip_known:
        return rec
    # an empty batch applies nothing, so it cannot be a harmful replay (quiet
    # nights deliver empty files with identical content)
    if rec is not None and len(b):
        raise DuplicateBatchError(
            f"this batch's content was already ingested into epoch {rec['epoch']} "
            f"(as {rec['file']!r}); replaying it would count its updates twice. "
            "Nothing was applied."
        )
    return None


def _clipped_cells(
    st: Any, plan: StreamPlan, p: dict[str, Any], b: UpdateBatch
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """The batch's cells ``(rows, cols, vals)``, coalesced, and the entity arrays
    to commit with them.

    Private streams clip each entity's net contribution against its remaining
    budget (:func:`clip_updates`): the new budgets are committed with the cells.
    Non-private streams only zero the entities holding a non-finite value.
    """
    if plan.lrf.calibration is None:
        vals = zero_non_finite_entities(b.entity, b.s)  # as clip_updates does
        rows, cols, vals = coalesce(b.i, b.j, vals, p["n_cols"])
        return rows, cols, vals, {}
    clipped = clip_updates(
        b.entity,
        b.i,
        b.j,
        b.s,
        table=_load_entities(st),
        unit=StreamUnit(p["unit"]),
        clip_norm=p["clip_norm"],
        n_cols=p["n_cols"],
        exclusive=bool(p.get("exclusive", False)),
    )
    budgets: dict[str, Any] = {}
    if clipped.table is not None and len(b):
        budgets = {
            "entities/keys": clipped.table.keys,
            "entities/spent": clipped.table.spent,
            "entities/anchor": clipped.table.anchor,
        }
    return clipped.rows, clipped.cols, clipped.vals, budgets


def stream_ingest(
    state: str | os.PathLike[str],
    batch: str | os.PathLike[str],
    *,
    epoch: int,
    store: Any = None,
    skip_known: bool = False,
) -> dict[str, Any]:
    """Apply one batch of updates to epoch ``epoch`` of the stream.

    Parameters
    ----------
    state : path
        The stream state.
    batch : path
        A ``.parquet``, ``.csv``, ``.npz`` or ``.zarr`` batch with columns
        ``entity, i, j, s`` (:func:`pipeline.io.batches.read_batch`).
    epoch : int
        The epoch the batch belongs to: after the last closed epoch, at most
        the horizon.
    store : StreamStore or None
        An already locked state (nightly runs); None locks ``state``.
    skip_known : bool
        A batch whose content the stream already holds is skipped (the result
        says ``skipped``) instead of refused: a nightly rerun after a crash.

    Returns
    -------
    dict
        ``fingerprint``, ``epoch``, ``batch`` (file name), ``seconds``: public
        facts only (no counts of updates, entities or clipped entities).

    Raises
    ------
    BatchError
        The batch is unreadable or invalid; nothing changed.
    EpochError
        The epoch is already closed (released) or not a positive integer.
    HorizonExceededError
        The epoch is beyond the horizon (exit code 3).
    DuplicateBatchError
        The same content was already ingested.
    StoreLayoutError
        String ids for a state of format 1, whose hashed keys two ids can share.
    PrivacyUnitError
        An entity contradicts the stream's unit, or (an exclusive stream) two
        entities touch one row (column, cell), in the batch or with the
        entities of earlier batches; nothing is applied.
    StateLockedError
        Another process is writing the stream.
    """
    t0 = time.perf_counter()
    with _locked(state, store) as st:
        m = st.manifest
        plan = plan_of(m)
        p = m["params"]
        epoch = _check_epoch(plan, m, epoch)
        if epoch <= m["last_closed"]:
            raise EpochError(
                f"epoch {epoch} is already closed (the stream is released up to epoch "
                f"{m['last_closed']}); a batch for it would rewrite a published release. "
                f"Ingest it into epoch {m['last_closed'] + 1} or later."
            )
        b, known = _read_stream_batch(st, m, batch)
        fp = b.fingerprint()
        rec = _known_batch(m, fp, b, skip_known)
        if rec is not None:
            return {
                "fingerprint": fp,
                "epoch": rec["epoch"],
                "batch": rec["file"],
                "skipped": True,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        _check_entity_kind(m, b)
        # the new ids and the budgets they index change in one commit, so a rerun of
        # an ingest that did not commit assigns the same keys again
        arrays = _entity_id_arrays(b, known)
        rows, cols, vals, budgets = _clipped_cells(st, plan, p, b)
        arrays |= budgets
        number = int(m["next_batch"])
        prefix = f"pending/{epoch}/{number:06d}/"
        # the clipped, coalesced cells (24 bytes each): sketched once per epoch, when
        # it closes, so that operator tiles are generated once however many batches
        arrays |= {prefix + "rows": rows, prefix + "cols": cols, prefix + "vals": vals}
        pending = dict(m["pending"])
        pending[str(epoch)] = [*pending.get(str(epoch), []), number]
        record = {
            "fingerprint": fp,
            "epoch": epoch,
            "file": os.path.basename(os.fspath(batch).rstrip("/")),
            "batch": number,
            "applied": _now(),
        }
        st.commit(
            arrays=arrays,
            changes={
                "pending": pending,
                "next_batch": number + 1,
                "batches": [*m["batches"], record],
                "entity_kind": m["entity_kind"] or (b.entity_kind if len(b) else None),
                # a format-1 state that takes its first string ids now keys them by table
                "format": STATE_FORMAT
                if len(b) and b.entity_kind == "str"
                else m["format"],
            },
        )
        _crash_point("after-ingest")
    return {
        "fingerprint": fp,
        "epoch": epoch,
        "batch": record["file"],
        "skipped": False,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def epoch_cells(store: Any, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clipped cells of every batch ingested into ``epoch`` (A's orientation).

    As sensitive as the data. Cells of different batches may repeat (they are summed).
    """
    parts = [
        tuple(
            store.read(f"pending/{epoch}/{number:06d}/{x}")
            for x in ("rows", "cols", "vals")
        )
        for number in store.manifest["pending"].get(str(epoch), [])
    ]
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), np.zeros(0)
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def epoch_sketch(
    store: Any, plan: StreamPlan, epoch: int, client: Any = None
) -> dict[str, np.ndarray] | None:
    """Exact sketch of the batches ingested into ``epoch`` (None if there are none).

    The cells are split into row ranges aligned with the operator tiles and
    sketched in parallel on ``client``'s workers (or here), each range
    regenerating only the operator rows its cells touch [spec 6.4]. As sensitive
    as the data: used to close the epoch, and by the tests of linearity.
    """
    if not store.manifest["pending"].get(str(epoch)):
        return None
    rows, cols, vals = epoch_cells(store, epoch)
    if plan.lrf.transpose:
        rows, cols = cols, rows
    order = np.argsort(rows, kind="stable")
    rows, cols, vals = rows[order], cols[order], vals[order]
    n_parts = (
        1
        if client is None
        else 2 * max(1, len(client.scheduler_info().get("workers", {})))
    )
    parts = partition_cells(rows, cols, vals, n_parts, plan.lrf.params.tile_size)
    from pipeline.execution.stream import sketch_partitions  # heavy: distributed

    seed, _ = store.secrets()
    return sum_deltas(plan, sketch_partitions(plan, seed, parts, client))


# -- release --------------------------------------------------------------------


def _load_tree(store: Any, plan: StreamPlan) -> dict[int, dict[str, np.ndarray]]:
    levels: dict[int, dict[str, np.ndarray]] = {}
    for name in store.names("tree/"):
        _, lvl, stat = name.split("/")
        levels.setdefault(int(lvl), {})[stat] = store.read(name)
    return levels


def _close_epochs(store: Any, plan: StreamPlan, epoch: int, client: Any = None) -> None:
    """Fold the batches of epochs ``last_closed + 1 .. epoch`` into the tree; one commit.

    A factorization mechanism's state is the running exact sums instead
    (:func:`_close_running`).

    The epochs closed here share one time, taken before any batch is sketched: an
    epoch's release publishes it as ``created``, and a time stamped after the
    sketching would tell how long the epoch's updates took to fold in.
    """
    mech = mechanism_of(store.manifest)
    if mech.name != TREE:
        _close_running(store, plan, mech, epoch, client)
        return
    stamp = _now()
    m = store.manifest
    levels = _load_tree(store, plan)
    before = {f"tree/{j}/{n}" for j, part in levels.items() for n in part}
    closed = dict(m["closed"])
    pending = dict(m["pending"])
    arrays: dict[str, np.ndarray | None] = {}
    for tau in range(m["last_closed"] + 1, epoch + 1):
        levels = advance_tree(levels, tau - 1, epoch_sketch(store, plan, tau, client))
        for number in pending.pop(str(tau), []):
            for name in store.names(f"pending/{tau}/{number:06d}/"):
                arrays[name] = None
        closed[str(tau)] = stamp
    after = {f"tree/{j}/{n}": v for j, part in levels.items() for n, v in part.items()}
    arrays |= {name: None for name in before - set(after)}
    arrays |= after
    store.commit(
        arrays=arrays,
        changes={"last_closed": epoch, "closed": closed, "pending": pending},
    )


def _load_prefix(store: Any, plan: StreamPlan, prefix: str) -> dict[str, np.ndarray]:
    """The arrays ``prefix + name`` of every statistic (zeros before the first close)."""
    shapes = plan.shapes()
    return {
        name: store.read(prefix + name)
        if store.has(prefix + name)
        else np.zeros(shapes[name])
        for name in plan.names
    }


def _epoch_noise(
    plan: StreamPlan, mech: ContinualMechanism, key: NoiseKey, name: str, s: int
) -> np.ndarray:
    """``z_s`` of statistic ``name``: epoch s's keyed standard normal array.

    The same sub-key as the term ``(s,)`` of :meth:`ContinualMechanism.noise_terms`.
    """
    length, dim = plan.shapes()[name]
    return GaussianNoise(
        key=mech.key(key, noise_code(plan, name), NoiseTerm((s,), 1.0)),
        sigma=1.0,
        length=length,
        dim=dim,
        tile_size=plan.lrf.params.tile_size,
    ).dense()


def _blt_buffers(
    store: Any, plan: StreamPlan, mech: ContinualMechanism
) -> dict[str, list[np.ndarray]]:
    """The BLT's noise buffers ``b_i`` of every statistic at epoch ``last_closed``."""
    return {
        name: [
            store.read(f"blt/{i}/{name}")
            if store.has(f"blt/{i}/{name}")
            else np.zeros(plan.shapes()[name])
            for i in range(len(mech.theta))
        ]
        for name in plan.names
    }


def _close_running(
    store: Any,
    plan: StreamPlan,
    mech: ContinualMechanism,
    epoch: int,
    client: Any = None,
) -> None:
    """Add the batches of epochs ``last_closed + 1 .. epoch`` to the running sums; one commit.

    The state of a factorization mechanism: ``running/<stat>`` holds
    ``sum_{s <= last_closed} x_s``; for a private BLT stream, ``blt/<i>/<stat>``
    holds the noise buffer ``b_i = sum_{s < last_closed} theta_i^(last_closed-1-s)
    z_s`` (unit sigma), advanced by ``b_i <- theta_i b_i + z_{tau-1}`` as each
    epoch tau closes. The epochs closed here share one time, as in
    :func:`_close_epochs`.
    """
    stamp = _now()
    m = store.manifest
    running = _load_prefix(store, plan, "running/")
    blt = mech.name == BLT and plan.lrf.calibration is not None
    buffers = _blt_buffers(store, plan, mech) if blt else {}
    key = store.secrets()[1] if blt else None
    closed, pending = dict(m["closed"]), dict(m["pending"])
    arrays: dict[str, np.ndarray | None] = {}
    for tau in range(m["last_closed"] + 1, epoch + 1):
        d = epoch_sketch(store, plan, tau, client)
        if d is not None:
            running = {name: running[name] + d[name] for name in plan.names}
        if blt and tau > 1:
            assert key is not None  # a private stream holds its noise key
            buffers = {
                name: blt_advance(mech, b, _epoch_noise(plan, mech, key, name, tau - 1))
                for name, b in buffers.items()
            }
        for number in pending.pop(str(tau), []):
            for name in store.names(f"pending/{tau}/{number:06d}/"):
                arrays[name] = None
        closed[str(tau)] = stamp
    arrays |= {f"running/{name}": x for name, x in running.items()}
    for name, bs in buffers.items():
        arrays |= {f"blt/{i}/{name}": b for i, b in enumerate(bs)}
    store.commit(
        arrays=arrays,
        changes={"last_closed": epoch, "closed": closed, "pending": pending},
    )


def noisy_state_sketches(store: Any, epoch: int) -> dict[str, np.ndarray]:
    """The released (noisy) sketches of ``A(epoch)`` from a locked state closed at ``epoch``.

    Tree: each p-sum of ``epoch``'s set bits plus its node's noise. Square
    root: the running sums plus ``sigma sum_s c_{epoch-s} z_s``. BLT: the running
    sums plus ``sigma (z_epoch + sum_i omega_i b_i)``. As sensitive as the data
    only before the noise: the result is what the release factorizes.

    Notes
    -----
    Privacy. Noise is added once to each entry, after the exact sum; every
    ``z_s`` is regenerated from the stream's key, so a rerun adds the same noise.
    """
    plan, mech = plan_of(store.manifest), mechanism_of(store.manifest)
    if int(store.manifest["last_closed"]) != epoch:
        raise EpochError(f"the state does not hold the running sums of epoch {epoch}.")
    _, key = store.secrets()
    if mech.name == TREE:
        return noisy_sketches(plan, _load_tree(store, plan), epoch, key)
    running = _load_prefix(store, plan, "running/")
    if plan.lrf.calibration is None:
        return running
    if key is None:
        raise InvalidParameterError("a private stream needs its noise key.")
    sigmas = {name: plan.lrf.sigma(name) for name in plan.names}
    if mech.name == SQRT:
        return released_sketches(mech, plan, running, epoch, key, sigmas)
    buffers = _blt_buffers(store, plan, mech)
    return {
        name: running[name]
        + sigmas[name]
        * blt_noise(mech, buffers[name], _epoch_noise(plan, mech, key, name, epoch))
        for name in plan.names
    }


def _noise_stds(
    plan: StreamPlan, mech: ContinualMechanism, epoch: int
) -> dict[str, float]:
    """Per-entry noise std of each released sketch at ``epoch``: ``||L[epoch, :]|| sigma_i``."""
    if mech.name == TREE:
        return noise_std(plan, epoch)
    row = math.sqrt(mech.variance_factor(epoch))
    return {name: row * plan.lrf.sigma(name) for name in plan.names}


def _noise_level(
    plan: StreamPlan, mech: ContinualMechanism, epoch: int
) -> float | None:
    """The one-pass noise level of the singular values released at ``epoch`` (public)."""
    if plan.lrf.calibration is None:
        return None
    stds = _noise_stds(plan, mech, epoch)
    return noise_level(
        plan.lrf.params.algorithm, plan.lrf.oriented_shape, plan.lrf.t, stds
    )


def _release_report(
    store: Any, plan: StreamPlan, epoch: int, released: np.ndarray
) -> dict[str, Any]:
    """The release's report: a deterministic function of the committed state
    and the released singular values (its ``signal``)."""
    m = store.manifest
    p = m["params"]
    cal = plan.lrf.calibration
    insecure = bool(m["insecure_noise"])
    mech = mechanism_of(m)
    level = _noise_level(plan, mech, epoch)
    report = StreamReport(
        release_id=f"{m['stream_id']}-epoch-{epoch}",
        created=m["closed"][str(epoch)],
        private=cal is not None and not insecure,
        algorithm=f"continual-{p['algorithm']}",
        rank=p["rank"],
        shape=[p["n_rows"], p["n_cols"]],
        parameters={
            "sketch_size": plan.lrf.t,
            "core_size": plan.lrf.v,
            "transposed": plan.lrf.transpose,
            "tile_size": plan.lrf.params.tile_size,
        },
        stream=_stream_section(m, plan, mech, epoch),
        n_passes=0,
        sketch_seed_fingerprint=m["sketch_seed_fingerprint"],
        versions={"dplr": m["dplr_version"]},
        privacy=NonPrivate(
            note="non-private stream: no clipping, no noise; NOT PRIVATE"
        ),
    )
    if cal is None or level is None:
        return report.to_dict()
    # the epoch's sketches carry noise of std ||L[epoch, :]|| sigma: the same
    # one-pass post-processing, so the one-pass level with those stds
    return dataclasses.replace(
        report,
        privacy=StreamPrivacy(
            mechanism=_mechanism_text(mech),
            epsilon=cal.epsilon,
            delta=cal.delta,
            budget_scope="the whole stream (every epoch's release together)",
            accountant="analytic Gaussian mechanism; charged once to the ledger at stream creation",
            idealized_numerics=True,
            insecure_noise_seed=insecure,
            privacy_unit=p["unit"],
            neighboring=p["neighboring"],
            neighbour_relation="continual: sum over epochs of ||D_tau - D'_tau||_F <= Delta_F",
            clip_norm=p["clip_norm"],
            calibration=cal.to_dict(),
            sketches=[s.summary() for s in cal.sketches],
            ledger=m["ledger"],
            note="noise drawn from a public seed (insecure_noise_seed): NOT PRIVATE"
            if insecure
            else OMIT,
        ),
        signal=signal_of(released, level),
    ).to_dict()


def _stream_section(
    m: dict[str, Any], plan: StreamPlan, mech: ContinualMechanism, epoch: int
) -> dict[str, Any]:
    """The report's ``stream`` entry: the epoch, the mechanism and its noise (public)."""
    out = {
        "stream_id": m["stream_id"],
        "epoch": epoch,
        "horizon": plan.horizon,
        "mechanism": mech.name,
        "sensitivity_factor": mech.sensitivity_factor,
        "noise_factor": mech.noise_factor(epoch),
        "noise_std": _noise_stds(plan, mech, epoch),
        "predicted_error": _noise_level(plan, mech, epoch),
        "model_error": model_error(plan, mech.noise_factor(epoch)),
        "operators": operator_notes(plan),
    }
    if mech.name == TREE:
        out["tree_levels"] = plan.levels
        out["tree_nodes"] = [list(x) for x in tree_nodes(epoch)]
    return out


def _mechanism_text(mech: ContinualMechanism) -> str:
    """The report's one-line description of the stream's mechanism."""
    if mech.name == TREE:
        return (
            "Gaussian binary-tree mechanism over all epochs, one joint mechanism over "
            "every node and sketch (analytic calibration [BW18]); this release is "
            "post-processing of the tree"
        )
    return (
        f"Gaussian {mech.name} factorization mechanism A = L R over all epochs: one "
        "joint Gaussian mechanism on R X over every sketch, its sensitivity "
        f"max_s ||R e_s|| = {mech.sensitivity_factor:.6g} times the one-shot one "
        "(analytic calibration [BW18]); this release is post-processing (row epoch of L)"
    )


def _release_digest(f: Factorization) -> str:
    h = hashlib.sha256()
    for x in (f.U, f.S, f.V):
        a = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def stream_release(
    state: str | os.PathLike[str],
    *,
    epoch: int,
    out: str | os.PathLike[str],
    client: Any = None,
    store: Any = None,
) -> tuple[Factorization, bool]:
    """Publish the factorization of ``A(epoch)`` to ``out``.

    Closes the epochs after the last closed one up to ``epoch`` (their batches
    go into the running sums, or the tree), adds the mechanism's keyed noise
    (:func:`noisy_state_sketches`), factorizes, and writes ``out`` atomically.

    Parameters
    ----------
    state : path
    epoch : int
        At least the last closed epoch, at most the horizon.
    out : path
        The Zarr v3 group to publish (must not exist, unless it is this very
        release, published before a crash).
    client : distributed.Client or None
        Sketch the batches of the epochs being closed on this cluster; None:
        in this process.
    store : StreamStore or None
        An already locked state (nightly runs).

    Returns
    -------
    (Factorization, bool)
        The release, and whether it was published now (False: it already was).

    Raises
    ------
    EpochError
        ``epoch`` was closed without a release (the tree no longer holds it),
        or was released elsewhere.
    HorizonExceededError
        ``epoch`` is beyond the horizon (exit code 3).
    StoreLayoutError
        ``out`` exists and is not this release.

    Notes
    -----
    Privacy. Post-processing of the mechanism's Gaussian release ``R X``
    (the tree: its noisy p-sums, each noised once per node [spec 3.4, 6.3]);
    nothing is charged.
    """
    from pipeline.io.release import read_release, write_release  # heavy: dask

    out = local_path(out, "stream release")  # its publication record needs a rename
    with _locked(state, store) as st:
        m = st.manifest
        plan = plan_of(m)
        epoch = _check_epoch(plan, m, epoch)
        done = m["releases"].get(str(epoch))
        if done is not None:
            if done["out"] != out:
                raise EpochError(
                    f"epoch {epoch} was already released to {done['out']!r}; a release "
                    "is published once. Read it from there."
                )
            if os.path.isdir(out):
                return read_release(out), False
            raise StoreLayoutError(
                f"epoch {epoch} was released to {out!r}, which no longer exists; "
                "restore it from a backup."
            )
        if epoch < m["last_closed"]:
            raise EpochError(
                f"epoch {epoch} was closed without a release (the stream is at epoch "
                f"{m['last_closed']}); the tree no longer holds its state. Release epoch "
                f"{m['last_closed']} or later."
            )
        if os.path.lexists(out) and not _is_this_release(out, m, epoch):
            raise StoreLayoutError(
                f"the output {out!r} exists; nothing was replaced. Choose another path."
            )
        _remove_stale_temporaries(out)
        if epoch > m["last_closed"]:
            _close_epochs(st, plan, epoch, client)
            _crash_point("after-close")
        seed, _ = st.secrets()
        noisy = noisy_state_sketches(st, epoch)
        result = release_factorization(plan, noisy, seed)
        del noisy
        _crash_point("after-noise")
        report = _release_report(st, plan, epoch, np.asarray(result.S))
        final = Factorization(U=result.U, S=result.S, V=result.V, report=report)
        digest = _release_digest(final)
        if os.path.lexists(
            out
        ):  # published before a crash: it must be this very release
            if _release_digest(read_release(out)) != digest:
                raise StoreLayoutError(
                    f"the output {out!r} claims to be this release but differs from it; "
                    "nothing was replaced."
                )
        else:
            write_release(
                out,
                final,
                overwrite=False,
                before_publish=lambda: _crash_point("during-write"),
            )
        _crash_point("after-write")
        releases = dict(st.manifest["releases"])
        releases[str(epoch)] = {"out": out, "digest": digest, "published": _now()}
        st.commit(changes={"releases": releases})
        _crash_point("after-record")
    return final, True


def _remove_stale_temporaries(out: str) -> None:
    """Hidden groups a killed publication of ``out`` left beside it (we hold the lock)."""
    parent, base = os.path.split(out)
    for tmp in glob.glob(
        os.path.join(glob.escape(parent), f".{glob.escape(base)}.tmp-*")
    ):
        shutil.rmtree(tmp, ignore_errors=True)


def _is_this_release(out: str, m: dict[str, Any], epoch: int) -> bool:
    from pipeline.io.release import read_release  # heavy: dask

    try:
        rep = read_release(out).report
    except (StoreLayoutError, OSError, ValueError, KeyError, TypeError):
        return False
    return bool(rep.get("release_id") == f"{m['stream_id']}-epoch-{epoch}")
