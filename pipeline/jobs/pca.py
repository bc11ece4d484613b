"""What a PCA supplies to the one release job [design 2, "The release job"].

:func:`pca_release_spec` opens the input from metadata, plans the release (and a
private selection's candidates; public inputs only) and returns the
:class:`~pipeline.jobs.engine.ReleaseSpec` and the hooks (:class:`PcaJob`) that
:func:`~pipeline.jobs.engine.run_release` calls. :func:`build_pca_report` is the
release's privacy report (public values only; a selection's report names the
winner only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline.accounting.contract import Accountant, PrivacyContract
from pipeline.accounting.pca import calibrate_selection
from pipeline.accounting.pca_selection import calibrate_candidates
from pipeline.algorithms.pca import (
    AUTO_ITERATIONS,
    ArrayRowSource,
    PcaRelease,
    auto_radius,
    default_selection_grids,
    plan_pca,
    run_pca,
    run_selection,
)
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.io.objectstore import redact
from pipeline.jobs.engine import (
    InputRef,
    ReleaseJob,
    ReleaseSpec,
    crash_point,
)
from pipeline.jobs.hooks import release_hooks
from pipeline.jobs.reports import NonPrivate, PcaPrivacy, PcaReport, ReleaseCore
from pipeline.mechanisms.signal import (
    CONFIDENCE,
    Signal,
    signal_of,
    symmetric_norm_bound,
)
from pipeline.params import Neighboring, PcaParams, PrivacyUnit, ReleaseOptions

__all__ = [
    "PCA_BAND_BYTES",
    "JobJournal",
    "PcaJob",
    "PcaRelease",
    "Selection",
    "build_pca_report",
    "pca_noise_level",
    "pca_plan",
    "pca_plan_summary",
    "pca_release_spec",
    "pca_signal",
    "plan_pca_release",
    "relation_text",
]

#: Target size (float64 bytes) of the full-width row band one PCA task reads.
PCA_BAND_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """The public grids of a private selection of ``(R, T)`` (None: the defaults)."""

    radii: tuple[float, ...] | None = None
    iterations: tuple[int, ...] | None = None
    expected_trials: float | None = None

    @staticmethod
    def of(
        params: Any,
        select: bool,
        radius_grid: Sequence[float] | None,
        iterations_grid: Sequence[int] | None,
        expected_trials: float | None,
    ) -> Selection | None:
        """The selection's public grids (None: a fixed run); refuses a bad mix."""
        if not isinstance(select, bool):
            raise InvalidParameterError(
                f"select must be True or False, got select={select!r}."
            )
        fixed = params.iterations is not None or params.clip_radius is not None
        method_ok = params.method in ("auto", "power")
        if select and (fixed or not params.private or not method_ok):
            raise InvalidParameterError(
                "select=True chooses the method, the clip radius and the number of iterations "
                "privately; do not pass iterations or clip_radius, and use method='auto' (or "
                "'power') with private=True."
            )
        grids = (radius_grid, iterations_grid, expected_trials)
        if not select:
            if any(g is not None for g in grids):
                raise InvalidParameterError(
                    "radius_grid, iterations_grid and expected_trials apply to select=True only."
                )
            return None
        return Selection(
            radii=None if radius_grid is None else tuple(radius_grid),
            iterations=None if iterations_grid is None else tuple(iterations_grid),
            expected_trials=expected_trials,
        )


def pca_plan(
    params: PcaParams, shape: tuple[int, int], selection: Selection | None
) -> Any:
    """The plan of a fixed run, or of a selection with its calibration."""
    if selection is None:
        return plan_pca(params, shape)
    # validated as a fixed run first (rank, budget, route, bounds), then calibrated
    params = dataclasses.replace(params, method="power")
    plan = plan_pca(dataclasses.replace(params, iterations=1, clip_radius=1.0), shape)
    if params.rank >= shape[1]:
        raise InvalidParameterError(
            f"select=True needs rank < n_features (with k = d every candidate spans the "
            f"whole space, so there is nothing to select), got rank={params.rank} for "
            f"{shape[1]} columns."
        )
    if selection.expected_trials is None:
        return dataclasses.replace(
            plan, calibration=_candidates_of(params, shape, selection), n_passes=-1
        )
    radii, grid = default_selection_grids(shape[0], params.rank)
    radii = selection.radii if selection.radii is not None else radii
    grid = selection.iterations if selection.iterations is not None else grid
    cal = calibrate_selection(
        params, n_rows=shape[0], n_features=shape[1], radii=radii, iteration_grid=grid,
        expected_trials=selection.expected_trials,
    )  # fmt: skip
    return dataclasses.replace(plan, calibration=cal, n_passes=-1)


def _candidates_of(
    params: PcaParams, shape: tuple[int, int], selection: Selection
) -> Any:
    """Exhaustive selection: Analyze Gauss and the public (R, T) candidates.

    Default candidates: Analyze Gauss and the power method at the ``auto``
    rule's ``T`` and ``R``; given grids: Analyze Gauss and their product.
    """
    radii = selection.radii or (auto_radius(shape[0], params.rank),)
    iterations = selection.iterations or (AUTO_ITERATIONS,)
    candidates = [(None, 0)] + [(float(r), int(t)) for t in iterations for r in radii]
    return calibrate_candidates(
        params, n_rows=shape[0], n_features=shape[1], candidates=candidates
    )


def pca_release_spec(
    params: Any, source: Any, selection: Selection | None, options: ReleaseOptions
) -> tuple[ReleaseSpec, PcaJob]:
    """The release spec and the algorithm hooks of one PCA."""
    from pipeline.io import open_input  # heavy: zarr, dask

    # a CSR store's column indices are checked by the cluster's workers, in
    # parallel, before the first pass (DaskRowSource)
    array, info = open_input(
        source, unit=None, band_bytes=PCA_BAND_BYTES, check_indices=False
    )
    plan = pca_plan(params, info.shape, selection)
    cal, select = plan.calibration, selection is not None
    random_stopping = selection is not None and selection.expected_trials is not None
    contract = None
    if cal is not None:
        contract = PrivacyContract(
            unit=PrivacyUnit.ROW, neighboring=Neighboring(params.neighboring),
            clip_norm=params.row_norm_bound, epsilon=cal.epsilon, delta=cal.delta,
            accountant=Accountant.RDP if random_stopping
            else Accountant.GDP if select else Accountant(params.accounting),
            shape=info.shape, secret_noise=options.insecure_noise_seed is None,
        )  # fmt: skip
    parameters = dataclasses.asdict(params)
    if random_stopping:
        parameters["grids"] = {
            "radii": list(cal.radii),
            "iterations": list(cal.iteration_grid),
            "expected_trials": cal.expected_trials,
        }
    elif select:
        parameters["candidates"] = [list(c) for c in cal.candidates]
    spec = ReleaseSpec(
        kind="pca-select" if select else "pca", contract=contract, calibration=cal,
        parameters=parameters, input=InputRef.of(info, array), **options.spec_fields(),
    )  # fmt: skip
    return spec, PcaJob(plan=plan, array=array, info=info, select=select)


@dataclasses.dataclass(eq=False)
class PcaJob:
    """The hooks of a PCA release for :func:`pipeline.jobs.engine.run_release`."""

    plan: Any
    array: Any
    info: Any
    select: bool
    cluster: dict[str, Any] | None = None
    source: Any = None

    @property
    def local(self) -> bool:
        return isinstance(self.array, np.ndarray) or sp.issparse(self.array)

    @contextlib.contextmanager
    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Iterator[Any]:
        p = self.plan.params
        if self.local:
            self.source = ArrayRowSource(
                self.array, row_norm_bound=p.row_norm_bound, clip=p.private
            )
            yield self.source
            return
        from pipeline.execution.pca import DaskRowSource  # heavy: distributed, dask

        # the cache is decided (or refused) here, before anything is read
        source = self.source = DaskRowSource(
            self.array, client, row_norm_bound=p.row_norm_bound, clip=p.private,
            # a selection's passes would reveal the number of trials (spec 3.5)
            progress=None if self.select else job.runtime.progress,
            cache=job.runtime.cache, reader=self.info.reader,
        )  # fmt: skip
        self.cluster = {
            **(cluster or {}), "n_row_bands": source.n_bands,
            "cache": source.cache_plan.to_dict(),
        }  # fmt: skip
        try:
            yield source
        finally:
            source.close()  # the held bands leave the workers

    def compute(self, job: ReleaseJob, src: Any) -> PcaRelease:
        p, cal = self.plan.params, self.plan.calibration
        details = {
            "rank": p.rank,
            "iterations": None if self.select else self.plan.iterations,
            "clip_radius": None if self.select else getattr(cal, "clip_radius", None),
        }
        hooks = release_hooks(
            job,
            algorithm="pca-select" if self.select else f"pca-{p.method}",
            details=details,
            journal=JobJournal(job),
            # a selection's steps would reveal its number of trials (spec 3.5)
            progress=not self.select,
        )
        if self.select:
            job.runtime.say(
                "private selection of (R, T): running; its progress is withheld (it "
                "would reveal the number of trials)"
            )
            result: Any = run_selection(src, cal, hooks)
        else:
            result = run_pca(src, self.plan, hooks)
        job.mark("run")
        if self.cluster is not None and not self.select:
            # withheld where the cache decision is (a sparse input): a graph over
            # held bands may count other tasks
            public = src.cache_plan.published
            self.cluster["n_graph_tasks"] = src.n_tasks if public else None
        report = build_pca_report(
            self.plan, result, job, info=self.info, cluster=self.cluster
        )
        return PcaRelease(
            components=result.components, eigenvalues=result.eigenvalues, report=report
        )

    def publish(self, job: ReleaseJob, rel: PcaRelease, client: Any) -> PcaRelease:
        from pipeline.io import write_group  # heavy: zarr, dask

        if not self.select:  # the time of a selection would reveal its trials
            job.stamp_total(rel.report)
        out = job.spec.out
        arrays = {"components": rel.components, "eigenvalues": rel.eigenvalues}
        job.publish(
            None
            if out is None
            else lambda: write_group(
                out,
                arrays,
                rel.report,
                overwrite=job.spec.overwrite,
                before_publish=lambda: crash_point("during-publish"),
            )
        )
        return rel

    def read(self, out: str) -> PcaRelease:
        from pipeline.io import read_group  # heavy: zarr, dask

        arrays, report = read_group(out, ("components", "eigenvalues"))
        return PcaRelease(
            components=arrays["components"], eigenvalues=arrays["eigenvalues"],
            report=report,
        )  # fmt: skip


class JobJournal:
    """The job's journal as a per-label release journal (written at the charge)."""

    def __init__(self, job: ReleaseJob) -> None:
        self.job = job
        self.memory: dict[str, np.ndarray] = {}

    def load(self, label: str) -> np.ndarray | None:
        jr = self.job.journal
        if jr is not None:
            return jr.load(label)  # type: ignore[no-any-return]
        v = self.memory.get(label)
        return None if v is None else v.copy()

    def record(self, label: str, value: np.ndarray) -> None:
        jr = self.job.durable_journal()
        if jr is not None:
            jr.record(label, value)
        else:
            self.memory[label] = np.array(value, copy=True)


def build_pca_report(
    plan: Any,
    result: Any,
    job: ReleaseJob,
    *,
    info: Any,
    cluster: dict[str, Any] | None,
) -> dict[str, Any]:
    """The privacy report and run metadata of a PCA release (public values only)."""
    p, cal = plan.params, plan.calibration
    n, d = plan.shape
    report = PcaReport(
        core=ReleaseCore(**job.report_core()),
        algorithm=f"pca-{p.method}",
        rank=p.rank,
        shape=[n, d],
        parameters={
            "method": p.method,
            "iterations": plan.iterations,
            "clip_radius": None if math.isinf(plan.clip_radius) else plan.clip_radius,
            "requested_clip_radius": p.clip_radius,
            "gamma": plan.gamma,
            "route": plan.route,
            "row_norm_bound": p.row_norm_bound,
            "accounting": p.accounting,
            "sensitivity": p.sensitivity,
            "neighboring": p.neighboring,
            "init_fraction": p.init_fraction,
            "h_fraction": p.h_fraction,
            "beta": p.beta,
            "gamma_scale": p.gamma_scale,
            "centred": False,
        },
        auto=plan.auto,
        n_passes=result.n_passes,
        n_passes_planned=plan.n_passes,
        releases=list(result.releases),
        resumed_releases=list(result.resumed),
        selection=None,
        input={
            "path": None if info.path is None else redact(info.path),
            "dtype": info.dtype,
            "store_chunks": info.store_chunks,
            "n_row_bands": len(info.dask_chunks[0]),
        },
        cluster=cluster,
        privacy=NonPrivate(),
    )
    if cal is None:
        return report.to_dict()
    signal = pca_signal(
        result.eigenvalues, rank=p.rank, dim=d, noise_init=cal.noise_init
    )
    if hasattr(result, "gap"):
        return _selection_report(report, result, cal, signal)
    cd = cal.to_dict()
    return dataclasses.replace(
        report,
        privacy=PcaPrivacy(
            mechanism="Gaussian releases M, H_t, Z_t composed exactly (mu-GDP); analytic calibration",
            epsilon=cal.epsilon,
            delta=cal.delta,
            realised_epsilon=cal.realised_epsilon(),
            accountant=p.accounting,
            neighboring=relation_text(p.neighboring),
            idealized_numerics=True,
            calibration=cd,
            mechanisms=cd.get("mechanisms"),
        ),
        signal=signal,
    ).to_dict()


def pca_signal(eigenvalues: Any, *, rank: int, dim: int, noise_init: float) -> Signal:
    """The components of a PCA above the noise of its released Gram matrix ``M``.

    The eigenvalues (the top ``rank``; the ``k + 1``-th is not a component) are
    those of ``M = A^T A + noise_init sym(G)``, whose noise is bounded by
    :func:`~pipeline.mechanisms.signal.symmetric_norm_bound` (every method and a
    selection release ``M`` first, with this noise).
    """
    return signal_of(
        np.asarray(eigenvalues)[:rank], pca_noise_level(dim, noise_init),
        remedies="a larger epsilon or more rows",
    )  # fmt: skip


def pca_noise_level(dim: int, noise_init: float) -> float:
    """The level at 95% of a PCA's released eigenvalues: the noise of ``M`` (d x d,
    ``noise_init sym(G)``) stays below it (a release's ``signal.noise_level`` and
    ``dplr pca --plan`` both come from here).

    Examples
    --------
    >>> round(pca_noise_level(16, 0.5), 3)
    5.224
    """
    return symmetric_norm_bound(dim, noise_init, CONFIDENCE)


def pca_plan_summary(plan: Any, selection: Selection | None) -> dict[str, Any]:
    """What a private PCA of ``plan`` (from :func:`pca_plan`) will release, before any read.

    Returns
    -------
    dict
        ``method`` (``auto``'s choice; None for a selection, whose choice is
        private and data-dependent: ``method_depends_on`` says on what), ``auto``
        (the rule's public numbers), ``iterations``, ``clip_radius``, ``route``,
        ``passes`` (None for a selection: its trials are private), the noise
        (``noise_init``, the std of ``M``'s noise, and ``mechanisms``, each
        release's sensitivity and sigma, when the calibration lists them),
        ``noise_level`` at ``confidence`` (:func:`pca_noise_level`, what a
        released eigenvalue must exceed to stand above the noise) and
        ``true_eigenvalue_above`` (twice it: by Weyl's inequality an eigenvalue
        of ``A^T A``, rows divided by ``C``, above it is released above the
        level with the same confidence).

    Notes
    -----
    Privacy. Public values only (shape, parameters, calibration): nothing is
    read or charged.
    """
    p, cal = plan.params, plan.calibration
    n, d = plan.shape
    level = pca_noise_level(d, cal.noise_init)
    select = selection is not None
    depends = None
    if select:
        depends = (
            "chosen privately when the release runs, from noisy scores of the data "
            "(Analyze Gauss or the power method at a public (R, T))"
        )
    radius = None if select or math.isinf(plan.clip_radius) else plan.clip_radius
    return {
        "kind": "pca-select" if select else "pca",
        "shape": [n, d],
        "rank": p.rank,
        "epsilon": cal.epsilon,
        "delta": cal.delta,
        "neighboring": p.neighboring,
        "row_norm_bound": p.row_norm_bound,
        "method": None if select else p.method,
        "method_depends_on": depends,
        "auto": plan.auto,
        "iterations": None if select else plan.iterations,
        "clip_radius": radius,
        "route": plan.route,
        "passes": None if select else plan.n_passes,
        "noise_init": cal.noise_init,
        "mechanisms": cal.to_dict().get("mechanisms"),
        "noise_level": level,
        "confidence": CONFIDENCE,
        "true_eigenvalue_above": 2.0 * level,
    }


def relation_text(neighboring: str) -> str:
    """The report's words for a PCA's neighbouring relation (n is public under both)."""
    if neighboring == "add-remove":
        return "one row present or a zero row, n public (rows clipped to norm 1)"
    return "one row replaced by another, n public (rows clipped to norm 1)"


def _selection_report(
    report: PcaReport, result: Any, cal: Any, signal: Signal
) -> dict[str, Any]:
    """The report of a private selection: the winner only.

    The number of trials N, and anything that reveals it (passes, release
    labels, task counts, the run's time), stays in the trusted zone, as the
    random-stopping analysis requires (spec 3.5).
    """
    exhaustive = hasattr(cal, "candidates")
    if result.iterations == 0:
        gamma = None
    elif exhaustive:
        gamma = cal.gamma_of(
            cal.candidates.index((result.clip_radius, result.iterations))
        )
    else:
        gamma = cal.gamma(result.iterations)
    parameters = report.parameters | {
        "method": "private selection of the method, R and T"
        if exhaustive
        else "power (private selection of R and T)",
        "accounting": "gdp" if exhaustive else "rdp",
        "iterations": result.iterations,
        "clip_radius": result.clip_radius,
        "requested_clip_radius": None,
        "gamma": gamma,
    }
    # the run's time, like its passes, would reveal the number of trials
    core = dataclasses.replace(report.core, timings_seconds={})
    return dataclasses.replace(
        report,
        core=core,
        parameters=parameters,
        n_passes=None,
        n_passes_planned=None,
        releases=None,
        resumed_releases=[] if not result.resumed else ["(withheld)"],
        selection={
            "selected_clip_radius": result.clip_radius,
            "selected_iterations": result.iterations,
            "score_gap": result.gap,
            "warm_start_gap_test_passed": result.gap > 0,
            "withheld": "passes and per-trial values"
            if exhaustive
            else "number of trials, passes and per-trial values (they would void the random-stopping analysis)",
        },
        privacy=PcaPrivacy(
            mechanism="Analyze Gauss and power-method candidates, each run once, the best noisy score released; composed exactly (mu-GDP)"
            if exhaustive
            else "Analyze Gauss warm start + Papernot-Steinke random stopping over (R, T) trials; RDP accountant",
            epsilon=cal.epsilon,
            delta=cal.delta,
            realised_epsilon=cal.realised_epsilon() if exhaustive else cal.rdp_epsilon,
            accountant="gdp (every candidate once)"
            if exhaustive
            else "rdp (dp_accounting RepeatAndSelectDpEvent), capped number of trials",
            neighboring=relation_text(cal.neighboring),
            idealized_numerics=True,
            calibration=cal.to_dict(),
            mechanisms=[m.to_dict() for m in cal.mechanisms] if exhaustive else [],
        ),
        signal=signal,
    ).to_dict()


def plan_pca_release(
    source: Any, params: PcaParams, *, selection: Selection | None = None
) -> dict[str, Any]:
    """What a private PCA will release, and its noise level, before anything is read.

    Parameters
    ----------
    source : str, os.PathLike, zarr.Array, dask.array.Array or numpy.ndarray
        The input; only its metadata (the shape) is opened.
    params : PcaParams
        A private release's parameters (``method="auto"`` is resolved by its
        public rule).
    selection : Selection or None
        A private selection's grids (its method is then chosen when it runs).

    Returns
    -------
    dict
        :func:`pipeline.jobs.pca.pca_plan_summary`: the method, passes, the
        noise of each release, and ``noise_level``, the level at 95% that a
        released eigenvalue must exceed to stand above the noise -- the value a
        release with these parameters records as ``signal.noise_level``.

    Raises
    ------
    PrivacyConfigError
        If ``params`` is not private (there is no noise to predict).

    Notes
    -----
    Privacy. Public values only: no data is read, nothing is charged or written.

    Examples
    --------
    >>> import numpy as np
    >>> plan = plan_pca_release(np.zeros((4096, 32)),
    ...                         PcaParams(rank=2, epsilon=1.0, delta=1e-6))
    >>> plan["method"], plan["passes"]
    ('analyze-gauss', 1)
    """
    from pipeline.io import open_input  # heavy: zarr

    if not params.private:
        raise PrivacyConfigError(
            "--plan predicts the noise of a private release; drop --non-private."
        )
    if selection is not None:
        Selection.of(params, True, selection.radii, selection.iterations,
                     selection.expected_trials)  # fmt: skip
    _, info = open_input(source, unit=None, band_bytes=PCA_BAND_BYTES)
    return pca_plan_summary(pca_plan(params, info.shape, selection), selection)
