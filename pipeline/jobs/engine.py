"""The one release job: every private release goes through these steps, in this order.

::

    plan -> refuse (output, budget, contract vs ledger) -> resume? -> passes
         -> journal the exact statistics -> charge the ledger once (by release id)
         -> noise -> post-process -> publish atomically -> clean up

An algorithm (factorize, PCA with or without selection, the estimators' DP
mean) supplies a :class:`ReleaseSpec` -- its plan, its privacy contract and
its public parameters -- and a :class:`ReleaseAlgorithm`: how to compute its
statistics from a source, how to post-process and write them. Everything
around the arithmetic is written here once:

* the journal header is derived from the *whole* spec (contract, parameters,
  input, ledger, the noise kind), so a resume can never change any of them;
* the ledger is resolved, the contract checked against it and the budget
  checked **before the first read**; a journal that records a charge the
  ledger lacks is refused;
* the noise key is fresh (secret) or public (test only, ``NOT PRIVATE``), and
  on a resume it is the journal's, so no noise is ever drawn twice;
* the charge happens once, after the journal holds the key, before any noise;
* a crash after publication leaves only the journal, which the rerun removes;
* :func:`crash_point` is the one seam where the tests kill the process.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata as _md
import json
import os
import platform
import secrets
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from pipeline._validation import check_privacy_pair
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.ledger import (
    InProcessLedger,
    Ledger,
    default_ledger_path,
    in_process_ledger,
)
from pipeline.errors import (
    InvalidParameterError,
    PipelineError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.io.objectstore import is_url, local_path, location, redact
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import Runtime, check_dataset_name

__all__ = [
    "CRASH_ENV",
    "NON_PRIVATE_REPORT",
    "InputRef",
    "Ledger",
    "ReleaseAlgorithm",
    "ReleaseJob",
    "ReleaseSpec",
    "crash_point",
    "default_ledger_of",
    "package_versions",
    "publication_stamp",
    "run_release",
]

#: Environment variable naming a step at which the process kills itself with
#: SIGKILL: ``STEP`` (the first time STEP is reached) or ``STEP#N`` (the N-th
#: time). Fault injection for the crash-safety tests; unset in production.
CRASH_ENV = "DPLR_CRASH_AT"
_crash_counts: dict[str, int] = {}

#: The steps of the job at which :func:`crash_point` is called, in order.
#: ("after-pass" comes before the charge in one pass, after it in two passes,
#: once per pass: ``after-pass#2`` is after the second.)
JOB_STEPS = (
    "after-journal",
    "after-pass",
    "after-charge",
    "before-publish",
    "after-publish",
)

INSECURE_NOTE = "noise drawn from a public seed (--insecure-noise-seed): NOT PRIVATE"

#: The privacy fields of a non-private release's report.
NON_PRIVATE_REPORT = {
    "mechanism": None,
    "epsilon": None,
    "delta": None,
    "note": "non-private run: no clipping, no noise; NOT PRIVATE",
}


def crash_point(step: str) -> None:
    """Kill this process with SIGKILL if ``DPLR_CRASH_AT`` names ``step``.

    The one fault-injection seam of the release job and the streams; a no-op
    unless the variable is set (tests only).
    """
    target = os.environ.get(CRASH_ENV)
    if not target:
        return
    name, _, nth = target.partition("#")
    if name != step:
        return
    _crash_counts[step] = _crash_counts.get(step, 0) + 1
    if _crash_counts[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def publication_stamp() -> str:
    """The one time a release publishes: now, to the second, in UTC (ISO 8601).

    A job takes it when it starts, before the plan is checked and before any
    data is read, and writes that same stamp as its report's ``created`` and
    its ledger record's ``time`` (a resumed job reuses its record's). A time
    taken later would reveal how long data-dependent work ran -- for a private
    selection, its number of trials, which the random-stopping bound needs
    hidden (docs/privacy.md, "Times").
    """
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Versions of Python, dplr and its dependencies (plus ``extra``), for reports."""
    return dict(_package_versions(tuple(extra)))


@functools.cache
def _package_versions(extra: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    # read once per process: the metadata lookups cost ~25 ms per report
    out = {"python": platform.python_version()}
    names = ("dplr", "numpy", "scipy", "dask", "distributed", "zarr")
    for pkg in (*names, "dp-accounting", "randomgen", *extra):
        try:
            out[pkg] = _md.version(pkg)
        except _md.PackageNotFoundError:
            out[pkg] = "not installed"
    return tuple(out.items())


# ---------------------------------------------------------------------------
# What a release is
# ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class InputRef:
    """The public description of a release's input (no data).

    ``path`` is the input's :func:`~pipeline.io.objectstore.location`, as
    recorded: an object-store URL verbatim (its user-info redacted), a local
    path made absolute; None for an in-memory or dask array. ``fingerprint``
    identifies a stored input; an in-memory array's is ``digest()``, a digest of
    all its bytes made when a journal first asks for it (:meth:`identity`), so
    a job without a journal never reads its input for it. ``sparse``: the
    entries are stored sparse, so a pass's duration grows with their number (a
    count of the data) and the job publishes no durations
    (:attr:`ReleaseJob.durations_public`).
    """

    path: str | None
    fingerprint: str | None
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[tuple[int, ...], ...]
    sparse: bool = False
    digest: Callable[[], str] | None = field(default=None, repr=False, compare=False)

    def identity(self) -> str | None:
        """``fingerprint``, else ``digest()`` (computed once), else None."""
        if self.fingerprint is None and self.digest is not None:
            return self.digest()
        return self.fingerprint

    @classmethod
    def of(cls, info: Any, array: Any) -> InputRef:
        """From :func:`pipeline.io.open_input`'s info and array."""
        from pipeline.io.journal import (  # heavy: zarr, dask
            array_fingerprint,
            input_fingerprint,
        )

        fingerprint, digest = None, None  # a dask array: shape, dtype, chunks only
        if info.path is not None:
            fingerprint = input_fingerprint(info.path)
        elif isinstance(array, np.ndarray) or sp.issparse(array):
            digest = functools.cache(functools.partial(array_fingerprint, array))
        return cls(
            path=None if info.path is None else redact(location(info.path)),
            fingerprint=fingerprint,
            digest=digest,
            shape=tuple(int(x) for x in info.shape),
            dtype=str(info.dtype),
            chunks=tuple(tuple(int(c) for c in dim) for dim in info.dask_chunks),
            sparse=bool(info.sparse),
        )


def default_ledger_of(input_path: str | os.PathLike[str]) -> str:
    """The absolute path of the ledger beside a store (``<store>.dplr-ledger.json``).

    Raises
    ------
    InvalidParameterError
        The store is in object storage, where a ledger cannot live: every
        release of it must name its ledger (``--ledger``), or two working
        directories would each keep one.
    """
    if is_url(os.fspath(input_path)):
        raise InvalidParameterError(
            f"the input {redact(os.fspath(input_path))!r} is in object storage, where the "
            "ledger cannot live (it needs atomic writes); pass --ledger PATH on a local "
            "or shared filesystem."
        )
    return location(default_ledger_path(input_path))


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseSpec:
    """Everything public that fixes one release; its journal header derives from it.

    Attributes
    ----------
    kind : str
        ``"factorize"``, ``"pca"``, ``"pca-select"``, ``"dp-mean"``...
    contract : PrivacyContract or None
        None for a non-private run (no ledger, no noise).
    calibration : object or None
        What the ledger charges (a ``ReleaseCalibration``, ``PcaCalibration``,
        ``SelectionCalibration``); None exactly when ``contract`` is.
    parameters : mapping
        The algorithm's public parameters, JSON-ready.
    input : InputRef
    out, overwrite, journal, ledger, budget
        As in :func:`pipeline.api.factorize`.
    insecure_noise_seed : int or None
        Test only: the noise key is derived from it and the release says NOT PRIVATE.
    sketch_seed : int or None
        A user-given sketch seed (public). None: the job draws a secret one,
        kept in the journal, when ``uses_sketch_seed``.
    sketch_seed_fingerprint : str or None
        A one-way tag of ``sketch_seed``, given with it by the job (the
        algorithm's operators define it; the engine knows none): what the
        journal header records of a user-given seed.
    uses_sketch_seed : bool
    dataset : str or None
        As in :class:`ReleaseOptions`. Not in the journal header: it says which
        in-process accountant is charged, not what is released.
    """

    kind: str
    contract: PrivacyContract | None
    calibration: Any
    parameters: Mapping[str, Any]
    input: InputRef
    out: str | None = None
    overwrite: bool = False
    journal: str | None = None
    ledger: Any = None
    budget: tuple[float, float] | None = None
    insecure_noise_seed: int | None = None
    sketch_seed: int | None = None
    sketch_seed_fingerprint: str | None = None
    uses_sketch_seed: bool = False
    dataset: str | None = None

    def __post_init__(self) -> None:
        if (self.contract is None) != (self.calibration is None):
            raise PrivacyConfigError(
                "a release has a privacy contract exactly when it has a calibration."
            )
        if (self.sketch_seed is None) != (self.sketch_seed_fingerprint is None):
            raise InvalidParameterError(
                "a release spec names a sketch seed exactly when it gives its fingerprint."
            )
        check_dataset_name(self.dataset)

    @property
    def private(self) -> bool:
        """True for a noised release (secret or not)."""
        return self.contract is not None

    def journal_path(self) -> str | None:
        """The journal directory: given; else beside ``out``; else beside the ledger.

        A release with no output but a persistent ledger (an estimator's fit, an
        in-memory input) keeps its journal beside the ledger, named by a digest
        of its header without the input's fingerprint (a digest of the data must
        not show in a directory listing): a retry of the same job finds it, so it
        is charged once; the same job on other data finds it and is refused.
        """
        from pipeline.io import default_journal_path  # heavy: zarr, dask

        if self.journal is not None:
            return local_path(self.journal, "journal", "--journal")
        if self.out is not None and not is_url(os.fspath(self.out)):
            return default_journal_path(self.out)
        ledger = self.ledger_path()
        if ledger is None:
            return None
        # named after the public header only: the input's fingerprint (a digest
        # of an in-memory array's bytes) must not show in a directory listing
        public = self.header(with_fingerprint=False)
        digest = hashlib.sha256(
            json.dumps(public, sort_keys=True).encode()
        ).hexdigest()[:16]
        where, name = os.path.split(ledger)
        return os.path.join(where, f".{name}.{self.kind}-{digest}.dplr-journal")

    def ledger_path(self) -> str | None:
        """Absolute path of the ledger a private run charges (None: no ledger file)."""
        if not self.private:
            return None
        if isinstance(self.ledger, Ledger):
            return location(self.ledger.path)
        if self.ledger is not None:
            return local_path(self.ledger, "ledger", "--ledger")
        return None if self.input.path is None else default_ledger_of(self.input.path)

    def header(self, *, with_fingerprint: bool = True) -> dict[str, Any]:
        """The public description of the job that a resumed run must match
        (``with_fingerprint=False``: without the input's fingerprint)."""
        header = {
            "kind": self.kind,
            "contract": None if self.contract is None else self.contract.to_dict(),
            "parameters": dict(self.parameters),
            # a one-way tag of a user-chosen seed; a secret seed lives in the journal
            "sketch_seed": self.sketch_seed_fingerprint,
            "insecure_noise_seed": self.insecure_noise_seed,
            "shape": list(self.input.shape),
            "dtype": self.input.dtype,
            "chunks": [list(c) for c in self.input.chunks],
            "input": self.input.path,
            "ledger": self.ledger_path(),
        }
        if with_fingerprint:
            header["input_fingerprint"] = self.input.identity()
        # as the journal will read it back: tuples become lists, keys strings
        return json.loads(json.dumps(header, allow_nan=False))  # type: ignore[no-any-return]


class ReleaseAlgorithm(Protocol):
    """What an algorithm supplies to :func:`run_release`."""

    @property
    def local(self) -> bool:
        """True when the input is in client memory (no cluster)."""

    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Any:
        """A context manager yielding the source the passes read."""

    def compute(self, job: ReleaseJob, source: Any) -> Any:
        """Passes, journal, ``job.charge()`` before any noise, noise, post-processing."""

    def publish(self, job: ReleaseJob, staged: Any, client: Any) -> Any:
        """Write ``staged`` to ``job.spec.out`` (through ``job.publish``) or return it."""

    def read(self, out: str) -> Any:
        """The release already published at ``out``."""


# ---------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------
@dataclass(eq=False)
class ReleaseJob:
    """The durable state of one release, step by step (see the module docstring)."""

    spec: ReleaseSpec
    runtime: Runtime = field(default_factory=Runtime)
    release_id: str = field(init=False)
    noise_key: NoiseKey | None = field(init=False, default=None)
    sketch_seed: int | None = field(init=False, default=None)
    journal: Any = field(init=False, default=None)
    book: Any = field(init=False, default=None)
    resumed: bool = field(init=False, default=False)
    timings: dict[str, float] = field(init=False, default_factory=dict)
    t0: float = field(init=False, default_factory=time.perf_counter)
    stamp: str = field(init=False, default_factory=publication_stamp)

    def __post_init__(self) -> None:
        self.release_id = uuid.uuid4().hex

    @functools.cached_property
    def header(self) -> dict[str, Any]:
        """The job's header, made when a journal first needs it (an in-memory
        input's fingerprint reads all its bytes)."""
        return self.spec.header()

    # -- plan, refuse, resume: nothing is read before these pass -------------
    def prepare(self) -> bool:
        """Refuse or resume before the first read; True if already published."""
        from pipeline.io import check_output_path  # heavy: zarr, dask

        spec = self.spec
        jpath = spec.journal_path()
        if jpath is not None:
            self.journal = _find_journal(jpath, self.header)
            if self.journal is not None and _published_by(spec.out, self.journal):
                self.journal.remove()  # the crash came after the publication
                return True
        if spec.out is not None:
            check_output_path(
                spec.out, overwrite=spec.overwrite, inputs=(spec.input.path,)
            )
        self.book = _resolve_ledger(spec)
        self._resume_or_start()
        if self.book is not None and not self.already_charged():
            # refused here, before the first read: budget, and contract vs ledger
            self.book.check(spec.calibration, contract=spec.contract)
        self.mark("plan")
        return False

    def _resume_or_start(self) -> None:
        jr, spec = self.journal, self.spec
        if jr is None:
            self.sketch_seed = spec.sketch_seed
            if spec.uses_sketch_seed and self.sketch_seed is None:
                self.sketch_seed = secrets.randbits(128)
            if spec.private:
                seed = spec.insecure_noise_seed
                self.noise_key = (
                    NoiseKey.fresh()
                    if seed is None
                    else NoiseKey.insecure_from_seed(seed)
                )
            return
        self.resumed, self.release_id = True, str(jr.release_id)
        charged = self.charge_record()
        if charged is not None:
            self.stamp = str(charged["time"])  # the one stamp of this release
        if jr.charged() is not None and charged is None:
            raise StoreLayoutError(
                f"the journal at {jr.path!r} records a ledger charge for release "
                f"{self.release_id} but the ledger {self.header['ledger']!r} does not "
                "hold it; the ledger was replaced or edited. Restore it before "
                "resuming; removing the journal abandons the charged release."
            )
        missing_seed = spec.uses_sketch_seed and jr.sketch_seed is None
        if missing_seed or spec.private != (jr.noise_key is not None):
            raise StoreLayoutError(
                f"the journal at {jr.path!r} lacks its sketch seed or noise key; it is "
                "damaged and the job cannot resume safely."
            )
        self.sketch_seed, self.noise_key = jr.sketch_seed, jr.noise_key

    def already_charged(self) -> bool:
        """True when the ledger holds this release id (a resumed or charged job)."""
        return self.charge_record() is not None

    def charge_record(self) -> dict[str, Any] | None:
        """The ledger's record of this release id, or None if it is not charged."""
        book = getattr(self.book, "ledger", self.book)  # a declared one, once created
        if not isinstance(book, Ledger):
            return None
        mine = (r for r in book.releases if r["release_id"] == self.release_id)
        return next(mine, None)

    # -- journal, charge ------------------------------------------------------
    def durable_journal(self) -> Any:
        """The journal on disk (created now if needed), or None without a path.

        It holds the noise key and the sketch seed before any charge or noise.
        """
        from pipeline.io import FileJournal  # heavy: zarr, dask

        jpath = self.spec.journal_path()
        if self.journal is None and jpath is not None:
            self.journal = FileJournal.create(
                jpath, {**self.header, "release_id": self.release_id},
                noise_key=self.noise_key, sketch_seed=self.sketch_seed,
            )  # fmt: skip
            crash_point("after-journal")
        return self.journal

    def charge(self, *, algorithm: str, details: Mapping[str, Any]) -> None:
        """Charge the ledger once for this release, before any noise is drawn."""
        self.mark("pass")
        if not self.spec.private:
            return
        jr = self.durable_journal()
        if self.book is not None and not self.already_charged():
            self.book.charge(
                self.spec.calibration,
                contract=self.spec.contract,
                release_id=self.release_id,
                algorithm=algorithm,
                stamp=self.stamp,
                details={
                    **details,
                    "output": None
                    if self.spec.out is None
                    else redact(location(self.spec.out)),
                    "noise_reproducible_not_private": self.spec.insecure_noise_seed
                    is not None,
                },
            )
        if jr is not None and self.book is not None and jr.charged() is None:
            jr.mark_charged(str(self.book.path))
        crash_point("after-charge")

    # -- publish, clean up ----------------------------------------------------
    def publish(self, write: Callable[[], object] | None) -> None:
        """Write the release atomically (``write``), then remove the journal."""
        if write is not None and self.spec.out is not None:
            crash_point("before-publish")
            write()
            crash_point("after-publish")
        if self.journal is not None:
            self.journal.remove()  # it held the key and the exact statistics

    @property
    def durations_public(self) -> bool:
        """Whether the report may state how long the job's steps took.

        A dense input's passes cover a public shape; a sparse input's work
        grows with its stored entries, so its durations would publish a count
        of the data (docs/privacy.md, "Times").
        """
        return not self.spec.input.sparse

    def stamp_total(self, report: dict[str, Any]) -> None:
        """Set ``report``'s total duration since the job began, if public."""
        if self.durations_public:
            total = time.perf_counter() - self.t0
            report["timings_seconds"]["total"] = round(total, 4)

    def mark(self, step: str) -> None:
        """Add the time since the last mark (or the start) to ``step``."""
        now = time.perf_counter()
        last = self.t0 + sum(self.timings.values())
        self.timings[step] = self.timings.get(step, 0.0) + (now - last)

    def report_core(self) -> dict[str, Any]:
        """The fields every release report starts with (public values only)."""
        spec = self.spec
        insecure = spec.insecure_noise_seed is not None
        core: dict[str, Any] = {
            "release_id": self.release_id,
            # stamped before any read: a later time would reveal the run's
            # duration (for a selection, its number of trials; docs/privacy.md)
            "created": self.stamp,
            "private": spec.private and not insecure,
            "contract": None if spec.contract is None else spec.contract.to_dict(),
            "timings_seconds": {k: round(v, 4) for k, v in self.timings.items()}
            if self.durations_public
            else {},
            "versions": package_versions(),
        }
        if spec.private:
            core["insecure_noise_seed"] = insecure
            core["ledger"] = _ledger_summary(self.book)
            if insecure:
                core["note"] = INSECURE_NOTE
        return core


def run_release(
    spec: ReleaseSpec, algorithm: ReleaseAlgorithm, runtime: Runtime
) -> Any:
    """Run one release job through its fixed steps (module docstring)."""
    job = ReleaseJob(spec, runtime)
    if job.prepare():
        assert spec.out is not None
        return algorithm.read(spec.out)
    if algorithm.local:
        with algorithm.open_source(job, None, None) as source:
            return algorithm.publish(job, algorithm.compute(job, source), None)
    from pipeline.execution import cluster_client  # heavy: distributed, dask

    with cluster_client(
        runtime.scheduler,
        cluster_config=runtime.cluster_config,
        progress=runtime.progress,
    ) as (client, cinfo):
        if cinfo.dashboard:
            runtime.say(
                f"dask cluster: {cinfo.kind}, {cinfo.n_workers} workers, "
                f"dashboard {cinfo.dashboard}"
            )
        if job.resumed:
            runtime.say(
                "resuming from the journal of an interrupted run: the same noise, "
                "no new charge"
            )
        cluster = {"kind": cinfo.kind, "n_workers": cinfo.n_workers}
        with algorithm.open_source(job, client, cluster) as source:
            return algorithm.publish(job, algorithm.compute(job, source), client)


# ---------------------------------------------------------------------------
# Journal lookups
# ---------------------------------------------------------------------------
def _find_journal(jpath: str, header: dict[str, Any]) -> Any:
    """The journal of an interrupted run of this very job, or None.

    A journal of any other job or input is refused (never reused, never
    silently replaced), with what removing it would cost.
    """
    from pipeline.io.journal import (  # heavy: zarr, dask
        FileJournal,
        JournalMismatchError,
    )

    try:
        return FileJournal.find(jpath, header, strict=True)
    except JournalMismatchError as exc:
        charged = exc.charged is not None or _in_ledger(exc.ledger, exc.release_id)
        what = ", ".join(exc.differences)
        cost = (
            "That job was already charged to its ledger "
            f"(release {exc.release_id}): rerun it with its original arguments to "
            "finish it at no further cost; removing the journal abandons it and its "
            "charge stays spent"
            if charged
            else "Nothing was charged or published for that job yet, so removing the "
            "journal costs no privacy budget (only that job's pass is lost)"
        )
        raise StoreLayoutError(
            f"a journal of another interrupted job exists at {exc.path!r} (different "
            f"{what}); it is never reused for a different job or input. {cost}. To "
            f"start this job instead, remove the journal (rm -r {exc.path}) or pass "
            "--journal (journal=) with another path."
        ) from None


def _in_ledger(ledger: str | None, release_id: str | None) -> bool:
    if ledger is None or release_id is None or not os.path.exists(ledger):
        return False
    try:
        book = Ledger.open(ledger)
    except PipelineError:
        return False
    return any(r["release_id"] == release_id for r in book.releases)


def _published_by(out: str | None, jr: Any) -> bool:
    """True if ``out`` holds the release of the journaled job (then it is finished)."""
    from pipeline.io import read_group  # heavy: zarr, dask
    from pipeline.io.release import release_exists  # heavy: zarr, dask

    if out is None or not release_exists(out):
        return False
    try:
        _, report = read_group(out, ())
    except (PipelineError, OSError):
        return False
    published: bool = report.get("release_id") == jr.release_id
    return published


# ---------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------
def _ledger_summary(ledger: Any) -> dict[str, Any] | None:
    """The ledger's state after the charge, for a report (None without a ledger)."""
    if ledger is None:
        return None
    if isinstance(ledger, InProcessLedger):
        return {"path": None, **ledger.remaining_summary()}
    return {"path": str(ledger.path), "kind": "file", **ledger.remaining_summary()}


def _resolve_ledger(spec: ReleaseSpec) -> Ledger | _NewLedger | None:
    """The dataset's ledger, the declaration of a new one (created at charge time),
    or, with neither a ledger nor a store path, this process's accountant."""
    if not spec.private:
        return None  # non-private runs are not accounted (and say NOT PRIVATE)
    where, budget = spec.ledger_path(), spec.budget
    if where is None:
        # no persistent ledger: this process's accountant records it -- the one of
        # every unnamed in-memory input, or the one of the dataset the caller names
        assert spec.contract is not None, "a private release has a contract"
        return in_process_ledger(spec.dataset, spec.contract)
    if spec.dataset is not None:
        raise InvalidParameterError(
            f"dataset={spec.dataset!r} names an in-process accountant, but this release "
            f"is charged to the ledger at {where!r}, its dataset's account; drop dataset."
        )
    if isinstance(spec.ledger, Ledger):
        spec.ledger.reload()
        return spec.ledger
    if os.path.exists(where):
        book = Ledger.open(where)
        if budget is not None and tuple(map(float, budget)) != tuple(book.budget):
            raise PrivacyConfigError(
                f"the ledger at {where!r} already declares the lifetime budget "
                f"(epsilon={book.budget[0]:g}, delta={book.budget[1]:g}); a budget is "
                "declared once and never changed: drop --budget-epsilon/--budget-delta."
            )
        return book
    if budget is None:
        raise PrivacyConfigError(
            f"no privacy ledger at {where!r}; declare the dataset's lifetime budget "
            "with --budget-epsilon/--budget-delta (budget=(epsilon, delta)) or "
            "`dplr budget init`."
        )
    if not isinstance(budget, tuple | list) or len(budget) != 2:
        raise InvalidParameterError(
            f"budget must be a pair (epsilon, delta), got budget={budget!r}."
        )
    beps, bdelta = check_privacy_pair(*budget)
    if not os.path.isdir(os.path.dirname(where)):
        raise PrivacyConfigError(
            f"the directory of the ledger {where!r} does not exist."
        )
    return _NewLedger(path=where, dataset=_dataset_name(spec.input.path, where),
                      epsilon=beps, delta=bdelta)  # fmt: skip


def _dataset_name(input_path: str | None, ledger: str) -> str:
    """The input store's name, else the ledger file's (``ratings.dplr-ledger.json``)."""
    if is_url(input_path):
        return str(input_path).rstrip("/").rsplit("/", 1)[-1]
    if input_path:
        return os.path.basename(os.path.normpath(input_path))
    name = os.path.basename(ledger)
    for suffix in (".dplr-ledger.json", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


@dataclass
class _NewLedger:
    """A declared budget whose ledger file is written only with the first charge.

    A job that fails on bad input (NaN in a chunk, an unreachable scheduler) then
    leaves nothing behind.
    """

    path: str
    dataset: str
    epsilon: float
    delta: float
    ledger: Ledger | None = None

    def check(self, calibration: Any, *, contract: PrivacyContract) -> None:
        Ledger.check_against_budget(
            calibration, contract=contract, epsilon=self.epsilon, delta=self.delta
        )

    def charge(
        self, calibration: Any, *, contract: PrivacyContract, **kw: Any
    ) -> dict[str, Any]:
        # a ledger created by a release declares that release's unit and relation
        try:
            self.ledger = Ledger.create(
                self.path, dataset=self.dataset, epsilon=self.epsilon,
                delta=self.delta, unit=contract.unit, neighboring=contract.neighboring,
            )  # fmt: skip
        except StoreLayoutError:
            if not os.path.exists(self.path):
                raise
            self.ledger = Ledger.open(self.path)  # another job created it meanwhile
        return self.ledger.charge(calibration, contract=contract, **kw)

    def remaining_summary(self) -> dict[str, Any]:
        assert self.ledger is not None, "summary of a ledger before its first charge"
        return self.ledger.remaining_summary()
