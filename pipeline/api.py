"""``pipeline.factorize``: plan, check the budget, one pass, noise once, publish.

The order is the privacy contract [design 3; style B.3]:

1. validate every parameter and open the input from metadata only;
2. plan the release (sizes, orientation, calibration) -- public inputs only;
3. refuse an existing output and an over-budget plan, **before any data is read**;
4. one pass over the data on the cluster (clipping first, NaN/Inf refused);
5. charge the ledger (locked, re-checked, fsynced) -- before any noise exists;
6. add the noise once, post-process, publish atomically.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import importlib.metadata as _md
import math
import os
import platform
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from pipeline._validation import (
    check_enum,
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.accounting.ledger import Ledger, default_ledger_path
from pipeline.algorithms.base import ArraySource, Factorization
from pipeline.algorithms.lrf import (
    Algorithm,
    LrfParams,
    LrfPlan,
    plan_lrf,
    run_lrf,
    seed_fingerprint,
)
from pipeline.algorithms.power_pca import PcaRelease
from pipeline.errors import (
    InvalidParameterError,
    PipelineError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.mechanisms.clipping import ClipSpec, Neighboring, PrivacyUnit
from pipeline.mechanisms.noise import NoiseKey
from pipeline.sketches.operators import OperatorKind

if TYPE_CHECKING:
    from pipeline.execution.clusters import ClusterConfig


def make_params(
    rank: int,
    *,
    epsilon: float | None,
    delta: float | None,
    algorithm: str | Algorithm = "spectral",
    private: bool = True,
    sketch_size: int | None = None,
    core_size: int | None = None,
    clip_norm: float = 1.0,
    unit: str | PrivacyUnit = "row",
    neighboring: str | Neighboring = "add-remove",
    padded: bool = False,
    operator: str | OperatorKind | None = None,
) -> LrfParams:
    """Validate user-facing parameters into :class:`LrfParams` (no data needed)."""
    alg = check_enum(Algorithm, algorithm, "algorithm")
    rank = check_int_in_range(rank, "rank", 1)
    if sketch_size is not None:
        check_int_in_range(sketch_size, "sketch_size", 2)
    if core_size is not None:
        check_int_in_range(core_size, "core_size", 3)
    if private:
        eps, dlt = check_privacy_pair(epsilon, delta)
    else:
        if epsilon is not None or delta is not None:
            raise PrivacyConfigError(
                "a non-private run takes no epsilon or delta; drop them or drop non-private."
            )
        eps = dlt = None
    clip = ClipSpec(
        unit=check_enum(PrivacyUnit, unit, "unit"),
        clip_norm=check_float_in_interval(
            clip_norm, "clip_norm", 0.0, math.inf, privacy=True
        ),
    )
    return LrfParams(
        algorithm=alg,
        rank=rank,
        sketch_size=sketch_size,
        core_size=core_size,
        private=bool(private),
        epsilon=eps,
        delta=dlt,
        clip=clip,
        neighboring=check_enum(Neighboring, neighboring, "neighboring"),
        padded=bool(padded),
        operator=None if operator in (None, "auto") else check_enum(OperatorKind, operator, "operator"),
    )


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Versions of Python, dplr and its dependencies (plus ``extra``), for reports."""
    return dict(_package_versions(tuple(extra)))


@functools.cache
def _package_versions(extra: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    # read once per process: the metadata lookups cost ~25 ms per report
    out = {"python": platform.python_version()}
    for pkg in (
        "dplr",
        "numpy",
        "scipy",
        "dask",
        "distributed",
        "zarr",
        "dp-accounting",
        "randomgen",
        *extra,
    ):
        try:
            out[pkg] = _md.version(pkg)
        except _md.PackageNotFoundError:
            out[pkg] = "not installed"
    return tuple(out.items())


_INSECURE_NOTE = "noise drawn from a public seed (--insecure-noise-seed): NOT PRIVATE"


def _ledger_summary(ledger: Any) -> dict[str, Any] | None:
    """The ledger's state after the charge, for a report (None without a ledger)."""
    if ledger is None:
        return None
    return {"path": str(ledger.path), **ledger.remaining_summary()}


def build_report(
    plan: LrfPlan,
    *,
    release_id: str,
    insecure: bool,
    seed: int,
    info: Any,
    ledger: Any,
    passes: int,
    timings: dict[str, float],
    cluster: dict[str, Any] | None,
) -> dict[str, Any]:
    """The privacy report and run metadata of a release (public values only)."""
    p, cal = plan.params, plan.calibration
    m, n = plan.shape
    report: dict[str, Any] = {
        "format": "dplr-release/1",
        "release_id": release_id,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "private": cal is not None and not insecure,
        "algorithm": p.algorithm.value,
        "rank": p.rank,
        "shape": [m, n],
        "parameters": {
            "sketch_size": plan.t,
            "core_size": plan.v,
            "transposed": plan.transpose,
            "padded": p.padded,
            "tile_size": p.tile_size,
            "operator": plan.operator.value,
        },
        "n_passes": passes,
        "timings_seconds": {k: round(v, 4) for k, v in timings.items()},
        "input": {
            "path": info.path,
            "dtype": info.dtype,
            "store_chunks": info.store_chunks,
            "n_chunks": [len(c) for c in info.dask_chunks],
        },
        "cluster": cluster,
        "sketch_seed_fingerprint": seed_fingerprint(seed),
        "versions": package_versions(),
    }
    if cal is None:
        report.update(
            {
                "mechanism": None,
                "epsilon": None,
                "delta": None,
                "note": "non-private run: no clipping, no noise; NOT PRIVATE",
            }
        )
        return report
    report.update(
        {
            "mechanism": "Gaussian, one joint mechanism over all released sketches (analytic calibration [BW18])",
            "epsilon": cal.epsilon,
            "delta": cal.delta,
            "accountant": "analytic Gaussian mechanism; releases on one dataset compose exactly in the ledger",
            "idealized_numerics": True,
            "insecure_noise_seed": insecure,
            "privacy_unit": p.clip.unit.value,
            "neighboring": p.neighboring.value,
            "clip_norm": p.clip.clip_norm,
            "public_sketch_seed": plan.public_sketch_seed,
            "sensitivity": cal.sensitivity,
            "calibration": cal.to_dict(),
            "sketches": [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "sensitivity": s.sensitivity,
                    "sigma": s.sigma,
                    "weight": s.weight,
                }
                for s in cal.sketches
            ],
            # spec 7.3: public pre-flight estimate of the additive error
            "noise_floor_estimate": max(s.sigma for s in cal.sketches)
            * (math.sqrt(m) + math.sqrt(n)),
            "ledger": _ledger_summary(ledger),
        }
    )
    if insecure:
        report["note"] = _INSECURE_NOTE
    return report


def factorize(
    source: Any,
    rank: int,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    algorithm: str = "spectral",
    private: bool = True,
    sketch_size: int | None = None,
    core_size: int | None = None,
    clip_norm: float = 1.0,
    unit: str = "row",
    neighboring: str = "add-remove",
    padded: bool = False,
    operator: str | None = None,
    seed: int | None = None,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    ledger: str | os.PathLike[str] | Ledger | None = None,
    budget: tuple[float, float] | None = None,
    scheduler: str | None = None,
    cluster_config: str | os.PathLike[str] | ClusterConfig | None = None,
    journal: str | os.PathLike[str] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    insecure_noise_seed: int | None = None,
    progress: TextIO | None = None,
) -> Factorization:
    """Differentially private rank-``rank`` factorization ``A ~ U diag(S) V^T`` in one pass.

    Parameters
    ----------
    source : str, zarr.Array, dask.array.Array or numpy.ndarray of shape (n_rows, n_cols)
        The private matrix. Zarr paths and dask arrays run on a Dask cluster (the
        active client, ``scheduler``, ``DASK_SCHEDULER_ADDRESS``, or an embedded
        LocalCluster); numpy arrays run in memory.
    rank : int
        Target rank k, ``1 <= k <= min(n_rows, n_cols) - 1``.
    epsilon, delta : float
        Budget of this release; required unless ``private=False``.
    algorithm : {"spectral", "low-space"}
    private : bool
        False runs the non-private variant (no clipping, no noise, no ledger).
    sketch_size, core_size : int or None
        ``t`` and ``v`` [spec 2.3]; None picks the defaults.
    clip_norm : float
        ``C``: every individual's contribution is clipped to norm ``<= C``.
    unit : {"row", "column", "entry"}
        Who an individual is.
    neighboring : {"add-remove", "replace"}
        ``Delta_F = C`` or ``2C``.
    padded : bool
        Low-Space-LRF in the paper's padded form (comparison only).
    operator : {"gaussian", "sparse-sign"} or None
        Distribution of the co-range operator ``S`` (and ``T``). None (or
        ``"auto"``): Gaussian when private -- the only kind the noise calibration
        covers, so ``"sparse-sign"`` is refused there -- and sparse sign (8
        non-zeros per row of ``A``) when not, which is as accurate and several
        times cheaper [spec 5.3].
    seed : int or None
        Sketch seed (data-independent; None draws a fresh secret one). Never
        seeds the noise. A given seed is public: a private release is then
        calibrated with the worst-case sensitivity of its operators
        (``report["sensitivity"] == "worst-case"``), which costs more noise.
    out : path or None
        Zarr v3 group to publish to (atomically); None returns arrays only.
    overwrite : bool
        Replace an existing ``out``.
    ledger : path, Ledger or None
        The dataset's privacy ledger; for a Zarr path it defaults to
        ``<store>.dplr-ledger.json`` beside the store.
    budget : (epsilon, delta) or None
        Lifetime budget declared when the ledger does not exist yet.
    scheduler : str or None
        Dask scheduler address.
    cluster_config : path, ClusterConfig or None
        A cluster configuration file (``cluster/*.yaml``) to start or connect
        to instead; not together with ``scheduler``.
    journal : path or None
        The crash-recovery journal (trusted zone: it holds the exact sketches
        of the pass, the noise key and the sketch seed). Default
        ``.<out>.dplr-journal`` beside ``out``; none when ``out`` is None.
        Rerunning an interrupted job with the same arguments resumes from it:
        no second pass, the same noise, no second ledger charge.
    scratch : path or None
        An existing directory, reachable by every worker, where the tall
        intermediates (``Y``, its orthonormal basis: ``n_rows x t`` each) wait
        between steps, so that worker memory does not grow with the number of
        rows. Trusted zone, like the journal: the job keeps its files in a
        private (0700) subdirectory and removes it when done. Default: beside
        ``out``; worker memory when ``out`` is None. Dask inputs only.
    insecure_noise_seed : int or None
        Test-only: reproducible noise; the report says ``"private": false``.
    progress : text stream or None
        Where progress bars go.

    Returns
    -------
    Factorization
        ``U`` (n_rows, rank), ``S`` (rank,), ``V`` (n_cols, rank) as numpy arrays,
        and ``report``.

    Raises
    ------
    InvalidParameterError, StoreLayoutError, SchedulerUnavailableError
        Bad input; nothing read, written or charged.
    StoreLayoutError
        Also when the journal belongs to another job or input, or is damaged;
        the message says whether that job was charged and what removing its
        journal costs.
    BudgetExceededError
        The plan exceeds the dataset's budget; refused before any read.

    Notes
    -----
    Privacy. (epsilon, delta)-DP for neighbours differing in one individual's
    clipped contribution (``||A - A'||_F <= Delta_F``) [spec 4.4]. Emits one
    Gaussian mechanism, recorded in the ledger before noise is drawn.

    Durable steps, in this order, so that a crash between any two of them and a
    rerun of the same command give the same release charged once [design 3.2]:
    the pass; the exact sketches, noise key and sketch seed to the journal; the
    ledger charge (with the release id) and its marker in the journal; noise,
    post-processing and the atomic write of ``out``; removal of the journal.
    A rerun that finds committed sketches skips the pass, reuses the key (the
    same noise, not a second draw) and charges only if the ledger does not
    hold the release id yet.

    Passes over A: 1 (2 when rows must be clipped across column chunks that are
    too wide to read together); 0 when resumed from a journal.

    Examples
    --------
    >>> A = np.random.default_rng(0).normal(size=(60, 40)) / 10
    >>> f = factorize(A, 3, private=False, seed=1)
    >>> f.U.shape, f.S.shape, f.V.shape
    ((60, 3), (3,), (40, 3))
    """
    from pipeline.io import (
        FileJournal,
        check_output_path,
        default_journal_path,
        open_input,
        read_release,
        write_release,
    )

    t0 = time.perf_counter()
    params = make_params(
        rank,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        private=private,
        sketch_size=sketch_size,
        core_size=core_size,
        clip_norm=clip_norm,
        unit=unit,
        neighboring=neighboring,
        padded=padded,
        operator=operator,
    )
    if seed is not None:
        seed = check_int_in_range(seed, "seed", 0, 2**128 - 1)
    if insecure_noise_seed is not None:
        insecure_noise_seed = check_int_in_range(
            insecure_noise_seed, "insecure_noise_seed", 0
        )
    array, info = open_input(
        source, unit=params.clip.unit.value if params.private else None
    )
    plan = plan_lrf(params, info.shape, public_seed=seed)
    jpath = (
        os.fspath(journal)
        if journal is not None
        else (default_journal_path(out) if out is not None else None)
    )
    header: dict[str, Any] = {}
    jr: FileJournal | None = None
    if jpath is not None:
        header = _factorize_header(
            plan,
            info,
            array,
            seed=seed,
            insecure_noise_seed=insecure_noise_seed,
            ledger=_ledger_location(ledger, info.path, plan),
        )
        jr = _find_factorize_journal(jpath, header)
        if jr is not None and out is not None and _published_by(out, jr):
            # the crash came after the publication: only the journal is left to remove
            jr.remove()
            return read_release(out)
    if out is not None:
        check_output_path(out, overwrite=overwrite, inputs=(info.path,))
    if scratch is not None:
        scratch = _check_scratch(scratch)
    book = _resolve_ledger(ledger, info.path, budget, plan)
    release_id = (
        str(jr.release_id)
        if jr is not None
        else str(header.get("release_id") or uuid.uuid4().hex)
    )

    def already_charged() -> bool:
        return isinstance(book, Ledger) and any(
            r["release_id"] == release_id for r in book.releases
        )

    if jr is not None and jr.charged() is not None and not already_charged():
        raise StoreLayoutError(
            f"the journal at {jr.path!r} records a ledger charge for release "
            f"{release_id} but the ledger {header.get('ledger')!r} does not hold it; the "
            "ledger was replaced or edited. Restore it before resuming; removing the "
            "journal abandons the charged release."
        )
    if book is not None and plan.calibration is not None and not already_charged():
        book.check(plan.calibration)  # refused here, before the first read
    if jr is not None:
        if jr.sketch_seed is None or (plan.calibration is not None) != (
            jr.noise_key is not None
        ):
            raise StoreLayoutError(
                f"the journal at {jr.path!r} lacks its sketch seed or noise key; it is "
                "damaged and the job cannot resume safely."
            )
        sketch_seed, noise_key = jr.sketch_seed, jr.noise_key
        exact = jr.load_sketches()  # None: the crash came before they were committed
    else:
        sketch_seed = seed if seed is not None else secrets.randbits(128)
        noise_key = None
        if plan.calibration is not None:
            noise_key = (
                NoiseKey.insecure_from_seed(insecure_noise_seed)
                if insecure_noise_seed is not None
                else NoiseKey.fresh()
            )
        exact = None
    timings: dict[str, float] = {"plan": time.perf_counter() - t0}

    def journal_sketches(sketches: dict[str, Any], client: Any) -> None:
        # the exact sketches, the key and the seed are durable before any charge
        nonlocal jr
        if jpath is None:
            return
        if jr is None:
            jr = FileJournal.create(
                jpath, header, noise_key=noise_key, sketch_seed=sketch_seed
            )
        jr.record_sketches(sketches, client=client)

    def charge() -> None:
        timings["pass"] = time.perf_counter() - t0 - timings["plan"]
        if book is None or plan.calibration is None:
            return
        if not already_charged():
            book.charge(
                plan.calibration,
                release_id=release_id,
                algorithm=params.algorithm.value,
                details={
                    "rank": params.rank,
                    "sketch_size": plan.t,
                    "core_size": plan.v,
                    "output": None if out is None else os.fspath(out),
                    "noise_reproducible_not_private": insecure_noise_seed is not None,
                },
            )
        if jr is not None and jr.charged() is None:
            jr.mark_charged(str(book.path))

    def execute(src: Any, cluster: dict[str, Any] | None, client: Any) -> Factorization:
        result = run_lrf(
            src,
            plan,
            sketch_seed=sketch_seed,
            noise_key=noise_key,
            before_noise=charge,
            input_dtype=array.dtype,
            exact=exact,
            after_pass=lambda sketches: journal_sketches(sketches, client),
        )
        timings["post"] = (
            time.perf_counter() - t0 - timings["plan"] - timings.get("pass", 0.0)
        )
        report = build_report(
            plan,
            release_id=release_id,
            insecure=insecure_noise_seed is not None,
            seed=sketch_seed,
            info=info,
            ledger=book,
            passes=src.n_passes,
            timings=timings,
            cluster=cluster,
        )
        report["resumed_from_journal"] = exact is not None
        return Factorization(U=result.U, S=result.S, V=result.V, report=report)

    def finish() -> None:
        if jr is not None:
            jr.remove()  # the release is out; the journal held its key and sketches

    if isinstance(array, np.ndarray):
        final = execute(ArraySource(array), None, None)
        final.report["timings_seconds"]["total"] = round(time.perf_counter() - t0, 4)
        if out is not None:
            write_release(out, final, overwrite=overwrite)
        finish()
        return final
    from pipeline.execution import DaskSource, cluster_client

    with cluster_client(
        scheduler, cluster_config=cluster_config, progress=progress
    ) as (client, cinfo):
        if progress is not None and cinfo.dashboard:
            print(
                f"dask cluster: {cinfo.kind}, {cinfo.n_workers} workers, dashboard {cinfo.dashboard}",
                file=progress,
            )
        if exact is not None and progress is not None:
            print(
                "resuming from the journal of an interrupted run: no pass, same noise, "
                "no new charge",
                file=progress,
            )
        tmp = _make_scratch(scratch, out)
        dsrc = DaskSource(
            array, client, progress=progress, reader=info.reader, scratch=tmp
        )
        cluster = {
            "kind": cinfo.kind,
            "n_workers": cinfo.n_workers,
            "n_graph_tasks_pass": 0,
        }
        try:
            staged = execute(dsrc, cluster, client)
            cluster["n_graph_tasks_pass"] = dsrc.n_tasks  # the report holds this dict
            if out is not None:
                write_release(out, staged, overwrite=overwrite, client=client)
                finish()
                final = read_release(out)
                final.report["timings_seconds"]["total"] = round(
                    time.perf_counter() - t0, 4
                )
                return final
            U, V = _gather(staged.U, client), _gather(staged.V, client)
        finally:
            dsrc.close()  # the job's sealed secrets leave the cluster
            if tmp is not None:
                _remove_scratch(tmp)
        finish()
        staged.report["timings_seconds"]["total"] = round(time.perf_counter() - t0, 4)
        return Factorization(U=U, S=staged.S, V=V, report=staged.report)


def _factorize_header(
    plan: LrfPlan,
    info: Any,
    array: Any,
    *,
    seed: int | None,
    insecure_noise_seed: int | None,
    ledger: str | None,
) -> dict[str, Any]:
    """The public description of a factorize job that a resumed run must match."""
    from pipeline.io.journal import array_fingerprint, input_fingerprint

    p = plan.params
    if info.path is not None:
        fingerprint = input_fingerprint(info.path)
    elif isinstance(array, np.ndarray):
        fingerprint = array_fingerprint(array)
    else:
        fingerprint = None  # a dask array: shape, dtype and chunks are all we see
    return {
        "kind": "factorize",
        "parameters": {
            "algorithm": p.algorithm.value,
            "rank": p.rank,
            "sketch_size": plan.t,
            "core_size": plan.v,
            "transposed": plan.transpose,
            "private": p.private,
            "epsilon": p.epsilon,
            "delta": p.delta,
            "unit": p.clip.unit.value,
            "clip_norm": p.clip.clip_norm,
            "neighboring": p.neighboring.value,
            "padded": p.padded,
            "delta_jl_fraction": p.delta_jl_fraction,
            "tile_size": p.tile_size,
            "operator": plan.operator.value,
            # a one-way tag of a user-chosen seed; a secret seed lives in the journal
            "seed": None if seed is None else seed_fingerprint(seed),
            "insecure_noise_seed": insecure_noise_seed,
        },
        "shape": [int(x) for x in info.shape],
        "dtype": str(info.dtype),
        "chunks": [[int(c) for c in dim] for dim in info.dask_chunks],
        "input": None if info.path is None else os.path.abspath(info.path),
        "input_fingerprint": fingerprint,
        "ledger": ledger,
        "release_id": uuid.uuid4().hex,
    }


def _ledger_location(ledger: Any, path: str | None, plan: LrfPlan) -> str | None:
    """Absolute path of the ledger a private run charges (None: no ledger)."""
    if plan.calibration is None:
        return None
    if isinstance(ledger, Ledger):
        return os.path.abspath(ledger.path)
    if ledger is not None:
        return os.path.abspath(os.fspath(ledger))
    return None if path is None else os.path.abspath(default_ledger_path(path))


def _find_factorize_journal(jpath: str, header: dict[str, Any]) -> Any:
    """The journal of an interrupted run of this very job, or None.

    A journal of any other job or input is refused (never reused, never
    silently replaced), with what removing it would cost.
    """
    from pipeline.io.journal import FileJournal, JournalMismatchError

    try:
        return FileJournal.find(jpath, header, strict=True)
    except JournalMismatchError as exc:
        charged = exc.charged is not None or _in_ledger(exc.ledger, exc.release_id)
        what = ", ".join(exc.differences)
        cost = (
            "that job was already charged to its ledger "
            f"(release {exc.release_id}): rerun it with its original arguments to "
            "finish it at no further cost; removing the journal abandons it and its "
            "charge stays spent"
            if charged
            else "nothing was charged or published for that job yet, so removing the "
            "journal costs no privacy budget (only that job's pass is lost)"
        )
        raise StoreLayoutError(
            f"a journal of another interrupted job exists at {exc.path!r} (different "
            f"{what}); it is never reused for a different job or input. {cost[0].upper()}"
            f"{cost[1:]}. To start this job instead, remove the journal (rm -r "
            f"{exc.path}) or pass --journal (journal=) with another path."
        ) from None


def _in_ledger(ledger: str | None, release_id: str | None) -> bool:
    if ledger is None or release_id is None or not os.path.exists(ledger):
        return False
    try:
        book = Ledger.open(ledger)
    except PipelineError:
        return False
    return any(r["release_id"] == release_id for r in book.releases)


def _published_by(out: str | os.PathLike[str], jr: Any) -> bool:
    """True if ``out`` holds the release of the journaled job (then it is finished)."""
    from pipeline.io import read_group

    if not os.path.isdir(out):
        return False
    try:
        _, report = read_group(out, ())
    except (PipelineError, OSError):
        return False
    return report.get("release_id") == jr.release_id


def _gather(x: Any, client: Any) -> np.ndarray:
    """A (tall) dask array in client memory, its blocks fetched in one gather."""
    if isinstance(x, np.ndarray):
        return x
    from pipeline.execution.source import gather_blocks

    (out,) = gather_blocks(client, [x])
    return out


def _check_scratch(scratch: str | os.PathLike[str]) -> str:
    """Refuse an unusable scratch directory before anything is read or charged."""
    path = os.fspath(scratch)
    if not os.path.isdir(path):
        raise StoreLayoutError(f"the scratch directory {path!r} does not exist.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreLayoutError(f"the scratch directory {path!r} is not writable.")
    return path


def _make_scratch(
    scratch: str | None, out: str | os.PathLike[str] | None
) -> str | None:
    """The job's private (0700) scratch subdirectory, or None (worker memory)."""
    if scratch is not None:
        return tempfile.mkdtemp(prefix=".dplr-scratch-", dir=scratch)
    if out is None:
        return None
    parent, base = os.path.split(os.path.abspath(os.fspath(out)))
    return tempfile.mkdtemp(prefix=f".{base}.dplr-scratch-", dir=parent)


def _remove_scratch(path: str) -> None:
    """Remove the job's scratch directory, even while tasks still write to it.

    When one task of a step fails, the step's other tasks may still be running
    on the workers and spilling their blocks. A file one of them creates while
    the tree is being removed would make the final ``rmdir`` fail and leave the
    directory behind. So the directory is first renamed: a task that opens a
    file under the old name after that fails (its step has already failed), and
    the files created before it are all listed by the removal that follows.
    """
    doomed = f"{path}.removing"
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path  # removed already, or a file system that cannot rename it
    for pause in (0.0, 0.05, 0.25, 1.0):  # a writer that held an open handle
        time.sleep(pause)
        shutil.rmtree(doomed, ignore_errors=True)
        if not os.path.lexists(doomed):
            return


def _resolve_ledger(
    ledger: Any, path: str | None, budget: tuple[float, float] | None, plan: LrfPlan
) -> Ledger | _NewLedger | None:
    """The dataset's ledger, or the declaration of a new one (created at charge time)."""
    if plan.calibration is None:
        return None  # non-private runs are not accounted (and say NOT PRIVATE)
    if isinstance(ledger, Ledger):
        return ledger
    where = (
        ledger
        if ledger is not None
        else (default_ledger_path(path) if path is not None else None)
    )
    if where is None:
        return None
    if os.path.exists(where):
        book = Ledger.open(where)
        if budget is not None and tuple(map(float, budget)) != tuple(book.budget):
            raise PrivacyConfigError(
                f"the ledger at {os.fspath(where)!r} already declares the lifetime budget "
                f"(epsilon={book.budget[0]:g}, delta={book.budget[1]:g}); a budget is declared "
                "once and never changed: drop --budget-epsilon/--budget-delta."
            )
        return book
    if budget is None:
        raise PrivacyConfigError(
            f"no privacy ledger at {os.fspath(where)!r}; declare the dataset's lifetime budget "
            "with --budget-epsilon/--budget-delta (budget=(epsilon, delta)) or `dplr budget init`."
        )
    beps, bdelta = check_privacy_pair(*budget)
    if not os.path.isdir(os.path.dirname(os.path.abspath(where))):
        raise PrivacyConfigError(
            f"the directory of the ledger {os.fspath(where)!r} does not exist."
        )
    name = os.path.basename(os.path.normpath(path)) if path else "in-memory"
    return _NewLedger(path=os.fspath(where), dataset=name, epsilon=beps, delta=bdelta)


class _NewLedger:
    """A declared budget whose ledger file is written only with the first charge.

    A job that fails on bad input (NaN in a chunk, an unreachable scheduler) then
    leaves nothing behind.
    """

    def __init__(
        self, *, path: str, dataset: str, epsilon: float, delta: float
    ) -> None:
        self.path, self.dataset, self.epsilon, self.delta = (
            path,
            dataset,
            epsilon,
            delta,
        )
        self.ledger: Ledger | None = None

    def check(self, calibration: Any) -> None:
        Ledger.check_against_budget(calibration, epsilon=self.epsilon, delta=self.delta)

    def charge(self, calibration: Any, **kw: Any) -> dict[str, Any]:
        from pipeline.errors import StoreLayoutError

        try:
            self.ledger = Ledger.create(
                self.path, dataset=self.dataset, epsilon=self.epsilon, delta=self.delta
            )
        except StoreLayoutError:
            if not os.path.exists(self.path):
                raise
            self.ledger = Ledger.open(self.path)  # another job created it meanwhile
        return self.ledger.charge(calibration, **kw)

    def remaining_summary(self) -> dict[str, Any]:
        assert self.ledger is not None, "summary of a ledger before its first charge"
        return self.ledger.remaining_summary()


# ---------------------------------------------------------------------------
# PCA
# ---------------------------------------------------------------------------
#: Target size (float64 bytes) of the full-width row band one PCA task reads.
PCA_BAND_BYTES = 64 * 2**20


def pca(
    source: Any,
    rank: int,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    method: str = "power",
    iterations: int | None = None,
    clip_radius: float | None = None,
    accounting: str = "gdp",
    sensitivity: str = "paper",
    init_fraction: float = 0.5,
    h_fraction: float = 0.5,
    beta: float = 0.1,
    gamma_scale: float = 1.0,
    row_norm_bound: float = 1.0,
    route: str = "auto",
    private: bool = True,
    select: bool = False,
    radius_grid: Sequence[float] | None = None,
    iterations_grid: Sequence[int] | None = None,
    expected_trials: float | None = None,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    ledger: str | os.PathLike[str] | Ledger | None = None,
    budget: tuple[float, float] | None = None,
    scheduler: str | None = None,
    cluster_config: str | os.PathLike[str] | ClusterConfig | None = None,
    journal: str | os.PathLike[str] | None = None,
    insecure_noise_seed: int | None = None,
    progress: TextIO | None = None,
) -> PcaRelease:
    """Differentially private top-``rank`` PCA subspace of a matrix whose rows are individuals.

    Parameters
    ----------
    source : str, zarr.Array, dask.array.Array or numpy.ndarray of shape (n, d)
        The private matrix, one individual per row. Zarr paths and dask arrays
        run on a Dask cluster (as in :func:`factorize`); numpy arrays in memory.
    rank : int
        ``k``, ``1 <= k < d``.
    epsilon, delta : float
        Budget of this release (replacement of one row); required unless
        ``private=False``.
    method : {"power", "analyze-gauss"}
        The clipped, preconditioned power method (Analyze Gauss start, then
        ``iterations`` steps) or Analyze Gauss alone with the whole budget.
    iterations : int
        Public ``T`` (power method): 1 + T passes over the data.
    clip_radius : float
        Public ``R`` (power method). For near-i.i.d. data ``||U||_inf`` is about
        ``sqrt(log(n) / n)``, so ``2 sqrt(k log(n) / n)`` is a reasonable public
        guess [spec power-pca D5]; never choose it by looking at the data.
    accounting : {"gdp", "paper"}
        Exact Gaussian (GDP) calibration, or the paper's constants (reproduction
        only: about 30x more noise per iteration).
    sensitivity : {"paper", "tight"}
        Gram sensitivity 2 (the paper's) or sqrt(2) (the exact supremum).
    init_fraction, h_fraction, beta, gamma_scale : float
        Budget split and eigenvalue-floor parameters (public; spec 3.4, 7 D3-D4).
    row_norm_bound : float
        Public ``C``: rows are divided by it, then clipped to norm 1. Rows with
        NaN or Inf count as zero rows (silently: reporting them would leak).
    route : {"auto", "gram", "two-pass"}
        ``H`` from the client's Gram matrix (1 + T passes) or from the data
        (1 + 2T passes, no d x d matrix kept); ``auto`` picks by ``d``.
    private : bool
        False runs the non-private block power method (no clipping or noise).
    select : bool
        Choose ``(R, T)`` privately over public grids [P, App. C]: Papernot-
        Steinke random stopping with a capped geometric number of trials, run
        in lockstep (trials with equal T share passes), accounted with RDP.
        ``iterations`` and ``clip_radius`` must then be None. Costs about 3.6x
        the noise of a fixed run with the same budget (spec 3.5).
    radius_grid, iterations_grid : sequence or None
        Public grids for ``select`` (default :func:`default_selection_grids`).
    expected_trials : float or None
        ``E[N]`` for ``select``; default ``4 m`` for an ``m``-point grid
        (a smaller ``E[N]`` than [P]'s ``8m / beta`` lowers the noise; it
        affects utility only, never privacy).
    out : path or None
        Zarr v3 group to publish to (``components``, ``eigenvalues``, report).
    overwrite : bool
    ledger, budget, scheduler, cluster_config, insecure_noise_seed, progress
        As in :func:`factorize`.
    journal : path or None
        The release journal (trusted zone; holds the noise key). Default
        ``.<out>.dplr-journal`` beside ``out``; in memory when ``out`` is None.
        Rerunning an interrupted job with the same arguments resumes from it:
        recorded releases are neither redrawn nor recharged, and their passes
        are skipped.

    Returns
    -------
    PcaRelease
        ``components`` (d, k), ``eigenvalues`` (k + 1,) of the released ``M``
        divided by nothing (noisy eigenvalues of ``A^T A``), ``report``.

    Raises
    ------
    InvalidParameterError, StoreLayoutError, SchedulerUnavailableError
        Bad input; nothing read, written or charged.
    BudgetExceededError
        The plan exceeds the dataset's budget; refused before any read.

    Notes
    -----
    Privacy. (epsilon, delta)-DP under replacement of one row (rows clipped to
    norm 1): a composition of Gaussian releases ``M``, ``H_t``, ``Z_t`` with
    sensitivities 2 (or sqrt 2), 2 (or sqrt 2) and 2R, calibrated exactly as
    one ``mu``-GDP mechanism [spec power-pca 3.4].

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(2000, 8)) * [3, 2, 1, 1, 1, 1, 1, 1] / 6
    >>> r = pca(A, 2, iterations=3, private=False)
    >>> r.components.shape
    (8, 2)
    """
    from pipeline.algorithms.power_pca import (
        ArrayRowSource,
        MemoryJournal,
        PcaParams,
        default_selection_grids,
        plan_pca,
        run_pca,
        run_selection,
    )
    from pipeline.io import (
        FileJournal,
        PendingJournal,
        check_output_path,
        default_journal_path,
        input_fingerprint,
        open_input,
        write_group,
    )

    t0 = time.perf_counter()
    if not isinstance(private, bool):
        raise InvalidParameterError(
            f"private must be True or False, got private={private!r}."
        )
    params = PcaParams(
        rank=rank,
        epsilon=epsilon,
        delta=delta,
        method=method,
        iterations=iterations,
        clip_radius=clip_radius,
        accounting=accounting,
        sensitivity=sensitivity,
        init_fraction=init_fraction,
        h_fraction=h_fraction,
        beta=beta,
        gamma_scale=gamma_scale,
        row_norm_bound=row_norm_bound,
        route=route,
        private=private,
    )
    if insecure_noise_seed is not None:
        insecure_noise_seed = check_int_in_range(
            insecure_noise_seed, "insecure_noise_seed", 0
        )
    if not isinstance(select, bool):
        raise InvalidParameterError(
            f"select must be True or False, got select={select!r}."
        )
    if select and (
        iterations is not None
        or clip_radius is not None
        or not private
        or method != "power"
    ):
        raise InvalidParameterError(
            "select=True chooses the clip radius and the number of iterations privately; "
            "do not pass iterations or clip_radius, and use method='power' with private=True."
        )
    if not select and (
        radius_grid is not None
        or iterations_grid is not None
        or expected_trials is not None
    ):
        raise InvalidParameterError(
            "radius_grid, iterations_grid and expected_trials apply to select=True only."
        )
    array, info = open_input(source, unit=None, band_bytes=PCA_BAND_BYTES)
    if select:
        from pipeline.accounting.pca import calibrate_selection

        # validated as a fixed run first (rank, budget, route, bounds), then calibrated
        plan = plan_pca(
            dataclasses.replace(params, iterations=1, clip_radius=1.0), info.shape
        )
        radii, grid = default_selection_grids(info.shape[0], params.rank)
        radii = tuple(radius_grid) if radius_grid is not None else radii
        grid = tuple(iterations_grid) if iterations_grid is not None else grid
        sel_cal = calibrate_selection(
            epsilon=params.epsilon,
            delta=params.delta,
            rank=params.rank,
            n_rows=info.shape[0],
            n_features=info.shape[1],
            radii=radii,
            iteration_grid=grid,
            beta=params.beta,
            expected_trials=(
                expected_trials
                if expected_trials is not None
                else 4.0 * len(radii) * len(grid)
            ),
            sensitivity=params.sensitivity,
            gamma_scale=params.gamma_scale,
        )
        plan = dataclasses.replace(plan, calibration=sel_cal, n_passes=-1)
    else:
        plan = plan_pca(params, info.shape)
    if out is not None:
        check_output_path(out, overwrite=overwrite, inputs=(info.path,))
    book = _resolve_ledger(ledger, info.path, budget, plan)  # type: ignore[arg-type]
    cal = plan.calibration
    new_key = None
    if cal is not None:
        new_key = (
            NoiseKey.insecure_from_seed(insecure_noise_seed)
            if insecure_noise_seed is not None
            else NoiseKey.fresh()
        )
    jpath = (
        journal
        if journal is not None
        else (default_journal_path(out) if out is not None else None)
    )
    header = {
        "kind": "pca-select" if select else "pca",
        "grids": None
        if not select
        else {
            "radii": list(cal.radii),
            "iterations": list(cal.iteration_grid),
            "expected_trials": cal.expected_trials,
        },
        "parameters": {k: v for k, v in dataclasses.asdict(params).items()},
        "shape": list(info.shape),
        "input": info.path,
        "input_fingerprint": input_fingerprint(info.path),
        "release_id": uuid.uuid4().hex,
    }
    jr: Any = None
    if jpath is not None:
        jr = FileJournal.find(jpath, header)  # an interrupted run of this job?
    if jr is not None:
        noise_key, release_id = jr.noise_key, str(jr.release_id)
    else:
        noise_key, release_id = new_key, header["release_id"]
        # written only just before the first noise draw: a refused job leaves no key
        jr = (
            PendingJournal(jpath, header, noise_key)
            if jpath is not None
            else MemoryJournal()
        )

    def already_charged() -> bool:
        return isinstance(book, Ledger) and any(
            r["release_id"] == release_id for r in book.releases
        )

    if book is not None and cal is not None:
        if isinstance(book, Ledger):
            book.reload()
        if not already_charged():
            book.check(cal)  # refused here, before the first read
    timings: dict[str, float] = {"plan": time.perf_counter() - t0}

    def charge() -> None:
        if isinstance(jr, PendingJournal):
            jr.ensure()  # the key is on disk before the ledger charge and any noise
        if book is None or cal is None or already_charged():
            return
        book.charge(
            cal,
            release_id=release_id,
            algorithm="pca-select" if select else f"pca-{params.method}",
            details={
                "rank": params.rank,
                "iterations": None if select else plan.iterations,
                "clip_radius": None if select else cal.clip_radius,
                "output": None if out is None else os.fspath(out),
                "noise_reproducible_not_private": insecure_noise_seed is not None,
            },
        )

    def say(msg: str) -> None:
        if progress is not None:
            print(msg, file=progress, flush=True)

    def execute(src: Any, cluster: dict[str, Any] | None) -> PcaRelease:
        if select:
            result: Any = run_selection(
                src,
                cal,
                noise_key=noise_key,
                journal=jr,
                before_first_release=charge,
                on_step=say,
            )
        else:
            result = run_pca(
                src,
                plan,
                noise_key=noise_key,
                journal=jr,
                before_first_release=charge,
                on_step=say,
            )
        timings["run"] = time.perf_counter() - t0 - timings["plan"]
        report = build_pca_report(
            plan,
            result,
            release_id=release_id,
            insecure=insecure_noise_seed is not None,
            info=info,
            ledger=book,
            timings=timings,
            cluster=cluster,
        )
        return PcaRelease(
            components=result.components, eigenvalues=result.eigenvalues, report=report
        )

    def publish(rel: PcaRelease) -> PcaRelease:
        rel.report["timings_seconds"]["total"] = round(time.perf_counter() - t0, 4)
        if out is not None:
            write_group(
                out,
                {"components": rel.components, "eigenvalues": rel.eigenvalues},
                rel.report,
                overwrite=overwrite,
            )
        if isinstance(jr, (FileJournal, PendingJournal)):
            jr.remove()  # it holds the noise key; the release is out
        return rel

    if isinstance(array, np.ndarray):
        src = ArrayRowSource(
            array, row_norm_bound=plan.params.row_norm_bound, clip=params.private
        )
        return publish(execute(src, None))
    from pipeline.execution import cluster_client
    from pipeline.execution.pca import DaskRowSource

    with cluster_client(
        scheduler, cluster_config=cluster_config, progress=progress
    ) as (client, cinfo):
        if progress is not None and cinfo.dashboard:
            print(
                f"dask cluster: {cinfo.kind}, {cinfo.n_workers} workers, dashboard {cinfo.dashboard}",
                file=progress,
            )
        dsrc = DaskRowSource(
            array,
            client,
            row_norm_bound=plan.params.row_norm_bound,
            clip=params.private,
            progress=progress,
        )
        cluster = {
            "kind": cinfo.kind,
            "n_workers": cinfo.n_workers,
            "n_row_bands": dsrc.n_bands,
        }
        rel = execute(dsrc, cluster)
        if not select:  # in selection mode the task count would reveal N
            cluster["n_graph_tasks"] = dsrc.n_tasks
        return publish(rel)


def build_pca_report(
    plan: Any,
    result: Any,
    *,
    release_id: str,
    insecure: bool,
    info: Any,
    ledger: Any,
    timings: dict[str, float],
    cluster: dict[str, Any] | None,
) -> dict[str, Any]:
    """The privacy report and run metadata of a PCA release (public values only)."""
    p, cal = plan.params, plan.calibration
    n, d = plan.shape
    selected = hasattr(result, "gap")
    report: dict[str, Any] = {
        "format": "dplr-pca-release/1",
        "release_id": release_id,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "private": cal is not None and not insecure,
        "algorithm": f"pca-{p.method}",
        "rank": p.rank,
        "shape": [n, d],
        "parameters": {
            "method": p.method,
            "iterations": plan.iterations,
            "clip_radius": None if math.isinf(plan.clip_radius) else plan.clip_radius,
            "requested_clip_radius": p.clip_radius,
            "gamma": plan.gamma,
            "route": plan.route,
            "row_norm_bound": p.row_norm_bound,
            "accounting": p.accounting,
            "sensitivity": p.sensitivity,
            "init_fraction": p.init_fraction,
            "h_fraction": p.h_fraction,
            "beta": p.beta,
            "gamma_scale": p.gamma_scale,
            "centred": False,
        },
        "n_passes": result.n_passes,
        "n_passes_planned": plan.n_passes,
        "releases": list(result.releases),
        "resumed_releases": list(result.resumed),
        "selection": None,
        "timings_seconds": {k: round(v, 4) for k, v in timings.items()},
        "input": {
            "path": info.path,
            "dtype": info.dtype,
            "store_chunks": info.store_chunks,
            "n_row_bands": len(info.dask_chunks[0]),
        },
        "cluster": cluster,
        "versions": package_versions(),
    }
    if cal is None:
        report.update(
            {
                "mechanism": None,
                "epsilon": None,
                "delta": None,
                "note": "non-private run: no clipping, no noise; NOT PRIVATE",
            }
        )
        return report
    if selected:
        # Only the winner is public: the number of trials N (and anything that
        # reveals it -- passes, release labels, task counts) stays in the trusted
        # zone, as the random-stopping analysis requires (spec 3.5).
        report["parameters"].update(
            {
                "method": "power (private selection of R and T)",
                "accounting": "rdp",
                "iterations": result.iterations,
                "clip_radius": result.clip_radius,
                "requested_clip_radius": None,
                "gamma": None
                if result.iterations == 0
                else cal.gamma(result.iterations),
            }
        )
        report.update(
            {
                "n_passes": None,
                "n_passes_planned": None,
                "releases": None,
                "resumed_releases": [] if not result.resumed else ["(withheld)"],
                "selection": {
                    "selected_clip_radius": result.clip_radius,
                    "selected_iterations": result.iterations,
                    "score_gap": result.gap,
                    "warm_start_gap_test_passed": result.iterations > 0,
                    "withheld": "number of trials, passes and per-trial values (they would void the random-stopping analysis)",
                },
                "mechanism": "Analyze Gauss warm start + Papernot-Steinke random stopping over (R, T) trials; RDP accountant",
                "epsilon": cal.epsilon,
                "delta": cal.delta,
                "realised_epsilon": cal.rdp_epsilon,
                "accountant": "rdp (dp_accounting RepeatAndSelectDpEvent), capped number of trials",
                "neighboring": "replace one row (rows clipped to norm 1)",
                "idealized_numerics": True,
                "insecure_noise_seed": insecure,
                "calibration": cal.to_dict(),
                "mechanisms": [],
                "ledger": _ledger_summary(ledger),
            }
        )
        if insecure:
            report["note"] = _INSECURE_NOTE
        return report
    cd = cal.to_dict()
    report.update(
        {
            "mechanism": "Gaussian releases M, H_t, Z_t composed exactly (mu-GDP); analytic calibration",
            "epsilon": cal.epsilon,
            "delta": cal.delta,
            "realised_epsilon": cal.realised_epsilon(),
            "accountant": p.accounting,
            "neighboring": "replace one row (rows clipped to norm 1)",
            "idealized_numerics": True,
            "insecure_noise_seed": insecure,
            "calibration": cd,
            "mechanisms": cd.get("mechanisms"),
            "ledger": _ledger_summary(ledger),
        }
    )
    if insecure:
        report["note"] = _INSECURE_NOTE
    return report
