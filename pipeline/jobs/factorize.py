"""What a factorization supplies to the one release job [design 2, "The release job"].

:func:`lrf_release_spec` opens the input from metadata, plans the release (public
inputs only) and returns the :class:`~pipeline.jobs.engine.ReleaseSpec` and the hooks
(:class:`LrfJob`) that :func:`~pipeline.jobs.engine.run_release` calls: the source of
the passes, the computation between them (journal, charge, noise through
:func:`~pipeline.algorithms.lrf.run_lrf`), the publication. :func:`build_report`
is the release's privacy report (public values only).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline.accounting.contract import Accountant, PrivacyContract
from pipeline.algorithms.base import ArraySource, Factorization
from pipeline.algorithms.lrf import (
    SKETCHES,
    LrfPlan,
    TwoPassPlan,
    plan_lrf,
    plan_noise_level,
    run_lrf,
    seed_fingerprint,
)
from pipeline.algorithms.lrf import model as lrf_model
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.io import scratch as scratch_dirs
from pipeline.io.objectstore import redact
from pipeline.jobs.engine import (
    InputRef,
    ReleaseJob,
    ReleaseSpec,
    crash_point,
)
from pipeline.jobs.hooks import release_hooks
from pipeline.jobs.reports import (
    OMIT,
    FactorizePrivacy,
    FactorizeReport,
    NonPrivate,
    ReleaseCore,
)
from pipeline.mechanisms.signal import signal_of
from pipeline.params import Algorithm, LrfParams, ReleaseOptions

__all__ = [
    "Factorization",
    "LrfJob",
    "SketchJournal",
    "build_report",
    "lrf_release_spec",
    "plan_factorization",
]


def build_report(
    plan: LrfPlan | TwoPassPlan,
    job: ReleaseJob,
    *,
    info: Any,
    passes: int,
    cluster: dict[str, Any] | None,
    released: np.ndarray | None = None,
    resumed: bool | None = None,
) -> dict[str, Any]:
    """The privacy report and run metadata of a release (public values only).

    ``released`` (the released singular values) adds the ``signal`` entry of a
    private release; ``resumed`` the ``resumed_from_journal`` one.
    """
    p = plan.params
    m, n = plan.shape
    # job.prepare() drew or resumed the seed: a factorization always has one
    assert job.sketch_seed is not None
    level = plan_noise_level(plan)
    return FactorizeReport(
        core=ReleaseCore(**job.report_core()),
        algorithm=p.algorithm.value,
        rank=p.rank,
        shape=[m, n],
        parameters={
            "sketch_size": plan.t,
            "core_size": plan.v,
            "transposed": plan.transpose,
            "padded": p.padded,
            "tile_size": p.tile_size,
            "operator": plan.operator.value,
            **_split_fields(plan),
        },
        n_passes=passes,
        n_passes_planned=2 if p.algorithm is Algorithm.TWO_PASS else 1,
        input=_input_report(info),
        cluster=cluster,
        sketch_seed_fingerprint=seed_fingerprint(job.sketch_seed),
        public_sketch_seed=plan.public_sketch_seed,
        privacy=_privacy(plan),
        signal=OMIT
        if level is None or released is None
        else signal_of(released, level),
        resumed_from_journal=OMIT if resumed is None else resumed,
    ).to_dict()


def _privacy(plan: LrfPlan | TwoPassPlan) -> NonPrivate | FactorizePrivacy:
    """The privacy fields of a factorization's report."""
    p, cal = plan.params, plan.calibration
    if cal is None:
        return NonPrivate()
    two = p.algorithm is Algorithm.TWO_PASS
    predicted = lrf_model.predict(plan)
    return FactorizePrivacy(
        # post-processing with public values: the noise's energy taken out of S
        singular_values=_TWO_PASS_SINGULAR_VALUES if two else OMIT,
        mechanism=_TWO_PASS_MECHANISM
        if two
        else "Gaussian, one joint mechanism over all released sketches (analytic calibration [BW18])",
        epsilon=cal.epsilon,
        delta=cal.delta,
        accountant="analytic Gaussian mechanism; releases on one dataset compose exactly in the ledger",
        idealized_numerics=True,
        privacy_unit=p.clip.unit.value,
        neighboring=p.neighboring.value,
        clip_norm=p.clip.clip_norm,
        # a user-given seed is public: the calibration used its operators' worst case
        sensitivity=cal.sensitivity,
        calibration=cal.to_dict(),
        sketches=[s.summary() for s in cal.sketches],
        # spec 7.3: public pre-flight estimate of the additive error, from the
        # error model (public values only)
        noise_floor_estimate=predicted.error,
        error_model=predicted.to_dict(),
    )


_TWO_PASS_SINGULAR_VALUES = (
    "debiased: S_i = sqrt(max(s_i^2 - M sigma_Y^2, 0)) for the singular values s of the "
    "noisy Y (M rows); the noisy s_i = sqrt(S_i^2 + M sigma_Y^2) where S_i > 0"
)

_TWO_PASS_MECHANISM = (
    "two Gaussian mechanisms, Z = S X + N_Z then Y = X V_k + N_Y with V_k from the noisy Z, "
    "composed exactly in GDP (analytic calibration [BW18]); both sensitivities exactly Delta_F"
)


def _input_report(info: Any) -> dict[str, Any]:
    return {
        "path": None if info.path is None else redact(info.path),
        "dtype": info.dtype,
        "store_chunks": info.store_chunks,
        "n_chunks": [len(c) for c in info.dask_chunks],
    }


def lrf_release_spec(
    params: LrfParams, source: Any, seed: int | None, options: ReleaseOptions
) -> tuple[ReleaseSpec, LrfJob]:
    """The release spec and the algorithm hooks of one factorization."""
    from pipeline.io import open_input  # heavy: zarr, dask

    scratch_dirs.remove_dead(
        options.scratch, options.out
    )  # what a killed job left here
    # a CSR store's column indices are checked by the cluster's workers, in
    # parallel, before the first pass (DaskSource)
    array, info = open_input(
        source,
        unit=params.clip.unit.value if params.private else None,
        check_indices=False,
    )
    plan = plan_lrf(params, info.shape, public_seed=seed)
    contract = None
    if plan.calibration is not None:
        contract = PrivacyContract(
            unit=params.clip.unit, neighboring=params.neighboring,
            clip_norm=params.clip.clip_norm, epsilon=plan.calibration.epsilon,
            delta=plan.calibration.delta, accountant=Accountant.ANALYTIC_GAUSSIAN,
            shape=info.shape, secret_noise=options.insecure_noise_seed is None,
            public_operators=seed is not None, entry_reads=plan.entry_reads,
        )  # fmt: skip
    spec = ReleaseSpec(
        kind="factorize", contract=contract, calibration=plan.calibration,
        parameters=_lrf_parameters(plan), input=InputRef.of(info, array),
        sketch_seed=seed, uses_sketch_seed=True, **options.spec_fields(),
        sketch_seed_fingerprint=None if seed is None else seed_fingerprint(seed),
    )  # fmt: skip
    scratch = options.scratch
    if scratch is not None:
        scratch = scratch_dirs.check_scratch(scratch)
    return spec, LrfJob(plan=plan, array=array, info=info, scratch=scratch)


def _lrf_parameters(plan: LrfPlan | TwoPassPlan) -> dict[str, Any]:
    """The public parameters of a factorization (journal header)."""
    p = plan.params
    return {
        "algorithm": p.algorithm.value,
        "rank": p.rank,
        "sketch_size": plan.t,
        "core_size": plan.v,
        "transposed": plan.transpose,
        "private": p.private,
        "unit": p.clip.unit.value,
        "clip_norm": p.clip.clip_norm,
        "neighboring": p.neighboring.value,
        "padded": p.padded,
        "delta_jl_fraction": p.delta_jl_fraction,
        "tile_size": p.tile_size,
        "operator": plan.operator.value,
        **_split_fields(plan),
    }


def _split_fields(plan: LrfPlan | TwoPassPlan) -> dict[str, Any]:
    """The budget split (and one pass's range basis rank) of a private plan."""
    if plan.calibration is None:
        return {}
    if isinstance(plan, TwoPassPlan):  # what plan_lrf returns for algorithm='two-pass'
        return {"weight_z": plan.weight_z, "weight_y": plan.weight_y}
    # range_clip: rho of the sketch-space clipping of Y (rows to rho C), or None
    return {
        "range_weight": plan.range_weight, "basis_rank": plan.basis_rank,
        "range_clip": plan.range_clip,
    }  # fmt: skip


@dataclasses.dataclass(eq=False)
class LrfJob:
    """The hooks of a factorization for :func:`pipeline.jobs.engine.run_release`."""

    plan: LrfPlan | TwoPassPlan
    array: Any
    info: Any
    scratch: str | None
    source: Any = None
    cluster: dict[str, Any] | None = None

    @property
    def local(self) -> bool:
        return isinstance(self.array, np.ndarray) or sp.issparse(self.array)

    @contextlib.contextmanager
    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Iterator[Any]:
        if self.local:
            self.source = ArraySource(self.array)
            yield self.source
            return
        from pipeline.execution import DaskSource  # heavy: distributed, dask

        tmp = scratch_dirs.make_scratch(self.scratch, job.spec.out)
        self.cluster = {**(cluster or {}), "n_graph_tasks_pass": 0}
        source = None
        try:
            # the cache is decided (or refused) here, before anything is read
            source = self.source = DaskSource(
                self.array, client, progress=job.runtime.progress,
                reader=self.info.reader, scratch=tmp, cache=job.runtime.cache,
                gather_tall=job.spec.out is None,
            )  # fmt: skip
            self.cluster["cache"] = source.cache_plan.to_dict()
            yield source
        finally:
            if source is not None:
                # the job's sealed secrets and held bands leave the cluster
                source.close()
            if tmp is not None:
                scratch_dirs.remove_scratch(tmp)

    def compute(self, job: ReleaseJob, src: Any) -> Factorization:
        plan, p = self.plan, self.plan.params
        journal = SketchJournal(job, src, stored=self.info.path is not None)
        details = {"rank": p.rank, "sketch_size": plan.t, "core_size": plan.v}
        hooks = release_hooks(
            job, algorithm=p.algorithm.value, details=details, journal=journal
        )
        result = run_lrf(src, plan, hooks, input_dtype=self.array.dtype)
        job.mark("post")
        if self.cluster is not None:
            # a pass over held bands has fewer tasks: withheld where whether they
            # were held is itself withheld (a sparse input, execution/cache.py)
            public = src.cache_plan.published
            self.cluster["n_graph_tasks_pass"] = src.n_tasks if public else None
        report = build_report(
            plan, job, info=self.info, passes=src.n_passes, cluster=self.cluster,
            released=np.asarray(result.S), resumed=journal.resumed,
        )  # fmt: skip
        return Factorization(U=result.U, S=result.S, V=result.V, report=report)

    def publish(self, job: ReleaseJob, staged: Factorization, client: Any) -> Any:
        from pipeline.io import read_release, write_release  # heavy: zarr, dask

        out = job.spec.out
        if out is None:
            job.publish(None)
            final = Factorization(
                U=_gather(staged.U, client), S=staged.S, V=_gather(staged.V, client),
                report=staged.report,
            )  # fmt: skip
        else:
            job.publish(
                lambda: write_release(
                    out,
                    staged,
                    overwrite=job.spec.overwrite,
                    client=client,
                    before_publish=lambda: crash_point("during-publish"),
                )
            )
            final = read_release(out, load=False)  # U stays in the store
        job.stamp_total(final.report)
        return final

    def read(self, out: str) -> Any:
        from pipeline.io import read_release  # heavy: zarr, dask

        return read_release(out, load=False)


class SketchJournal:
    """The job's journal as a factorization's pass journal (label :data:`SKETCHES`).

    It loads the exact sketches an interrupted run journaled, and records the
    exact sketches of each new pass durably (with the key and the seed) before
    the charge.

    Parameters
    ----------
    job : ReleaseJob
    src : MatrixSource
        The source of the passes (its client writes tall sketches).
    stored : bool
        True for a stored input: it is fingerprinted (a resume refuses a
        changed one), so the tall exact sketches are recomputed on resume
        rather than written on every run; a dask array input may not read the
        same twice: they are written.
    """

    def __init__(self, job: ReleaseJob, src: Any, *, stored: bool) -> None:
        self.job, self.src = job, src
        self.tall = "recompute" if stored else "write"
        self.resumed = False

    def load(self, label: str) -> dict[str, Any] | None:
        assert label == SKETCHES, label
        jr = self.job.journal
        exact: dict[str, Any] | None = None if jr is None else jr.load_sketches()
        self.resumed = exact is not None
        return exact

    def record(self, label: str, sketches: dict[str, Any]) -> None:
        assert label == SKETCHES, label
        jr = self.job.durable_journal()  # the exact sketches, key and seed: durable
        if jr is not None:
            jr.record_sketches(
                sketches, client=getattr(self.src, "client", None), tall=self.tall
            )
        crash_point("after-pass")  # the N-th time: after pass N was journaled


def _gather(x: Any, client: Any) -> np.ndarray:
    """A (tall) dask array in client memory, its blocks fetched in one gather."""
    if isinstance(x, np.ndarray):
        return x
    from pipeline.execution.source import gather_blocks  # heavy: distributed, dask

    (out,) = gather_blocks(client, [x])
    return out


def plan_factorization(source: Any, params: LrfParams) -> list[dict[str, Any]]:
    """The error model's prediction for each algorithm, before anything is read.

    Parameters
    ----------
    source : str, os.PathLike, zarr.Array, dask.array.Array, numpy.ndarray or scipy.sparse matrix
        The input; only its metadata (the shape) is opened.
    params : LrfParams
        A private release's parameters; each algorithm is planned with them
        (its own sizes and split unless ``params`` fixes them).

    Returns
    -------
    list of dict
        One per algorithm: ``algorithm``, ``sketch_size``, ``core_size``,
        ``range_weight``, ``operator``, ``passes``, ``predicted_error``,
        ``full_gm_error`` and ``ratio_to_full_gm`` (public values only:
        :mod:`pipeline.algorithms.lrf.model`), and ``noise_level``: the level at
        95% that released singular values must exceed to stand above the noise
        (:mod:`pipeline.algorithms.lrf.signal`).

    Raises
    ------
    PrivacyConfigError
        If ``params`` is not private (there is no noise to predict).

    Examples
    --------
    >>> import numpy as np
    >>> rows = plan_factorization(np.zeros((20000, 400)),
    ...                           LrfParams.of(5, epsilon=4.0, delta=1e-6, unit="entry"))
    >>> [(r["algorithm"], r["passes"]) for r in rows]
    [('spectral', 1), ('low-space', 1), ('two-pass', 2)]
    """
    from pipeline.io import open_input  # heavy: zarr

    if not params.private:
        raise PrivacyConfigError(
            "--plan predicts the error of a private release's noise; drop --non-private."
        )
    _, info = open_input(source, unit=params.clip.unit.value)
    rows: list[dict[str, Any]] = []
    for alg in Algorithm:
        padded = params.padded and alg is Algorithm.LOW_SPACE
        try:
            plan = plan_lrf(
                dataclasses.replace(params, algorithm=alg, padded=padded), info.shape
            )
        except InvalidParameterError as exc:  # e.g. sizes this algorithm cannot take
            rows.append({"algorithm": alg.value, "refused": str(exc)})
            continue
        two = alg is Algorithm.TWO_PASS
        rows.append({
            "algorithm": alg.value, "sketch_size": plan.t, "core_size": plan.v,
            "range_weight": (
                plan.weight_y if isinstance(plan, TwoPassPlan) else plan.range_weight
            ),
            "operator": plan.operator.value, "passes": 2 if two else 1,
            **lrf_model.predict(plan).to_dict(),
            "noise_level": plan_noise_level(plan),
        })  # fmt: skip
    return rows
