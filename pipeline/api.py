"""``pipeline.factorize`` and ``pipeline.pca``: thin functions over the one release job.

Each validates its parameters, opens the input from metadata only, plans the
release (public inputs only) and hands a :class:`~pipeline.release.ReleaseSpec`
and its algorithm hooks to :func:`~pipeline.release.run_release`, which runs
the fixed, durable steps of every release [design 2, "The release job"]:
refuse (output, budget, contract) before any read; the passes (clipping first,
NaN/Inf refused); the journal; the ledger charge, once and before any noise;
the noise, once; post-processing; the atomic publication; the clean-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from pipeline import _scratch
from pipeline._validation import (
    check_int_in_range,
)
from pipeline.accounting.contract import Accountant, PrivacyContract
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms import lrf_model
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
    PrivacyConfigError,
)
from pipeline.mechanisms.clipping import Neighboring, PrivacyUnit
from pipeline.release import (
    InputRef,
    ReleaseJob,
    ReleaseOptions,
    ReleaseSpec,
    Runtime,
    crash_point,
    package_versions,
    run_release,
)
from pipeline.sketches.operators import OperatorKind

__all__ = [
    "Selection",
    "build_pca_report",
    "build_report",
    "factorize",
    "make_params",
    "package_versions",
    "pca",
    "plan_factorization",
    "release_factorization",
    "release_pca",
]

if TYPE_CHECKING:
    from pipeline.execution.clusters import ClusterConfig


def make_params(
    rank: int,
    *,
    epsilon: float | None,
    delta: float | None,
    algorithm: str | Algorithm = "auto",
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
    return LrfParams.of(
        rank, epsilon=epsilon, delta=delta, algorithm=algorithm, private=private,
        sketch_size=sketch_size, core_size=core_size, clip_norm=clip_norm, unit=unit,
        neighboring=neighboring, padded=padded, operator=operator,
    )  # fmt: skip


def build_report(
    plan: LrfPlan,
    job: ReleaseJob,
    *,
    info: Any,
    passes: int,
    cluster: dict[str, Any] | None,
) -> dict[str, Any]:
    """The privacy report and run metadata of a release (public values only)."""
    p, cal = plan.params, plan.calibration
    m, n = plan.shape
    report: dict[str, Any] = {
        "format": "dplr-release/1",
        **job.report_core(),
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
            **_split_fields(plan),
        },
        "n_passes": passes,
        "n_passes_planned": 2 if p.algorithm is Algorithm.TWO_PASS else 1,
        "input": _input_report(info),
        "cluster": cluster,
        "sketch_seed_fingerprint": seed_fingerprint(job.sketch_seed),
        "public_sketch_seed": plan.public_sketch_seed,
    }
    if cal is None:
        return report | _NON_PRIVATE
    two = p.algorithm is Algorithm.TWO_PASS
    predicted = lrf_model.predict(plan)
    return report | {
        "mechanism": _TWO_PASS_MECHANISM if two else "Gaussian, one joint mechanism over all released sketches (analytic calibration [BW18])",
        "epsilon": cal.epsilon,
        "delta": cal.delta,
        "accountant": "analytic Gaussian mechanism; releases on one dataset compose exactly in the ledger",
        "idealized_numerics": True,
        "privacy_unit": p.clip.unit.value,
        "neighboring": p.neighboring.value,
        "clip_norm": p.clip.clip_norm,
        # a user-given seed is public: the calibration used its operators' worst case
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
        # spec 7.3: public pre-flight estimate of the additive error, from the
        # error model (public values only)
        "noise_floor_estimate": predicted.error,
        "error_model": predicted.to_dict(),
    }


_TWO_PASS_MECHANISM = (
    "two Gaussian mechanisms, Z = S X + N_Z then Y = X V_k + N_Y with V_k from the noisy Z, "
    "composed exactly in GDP (analytic calibration [BW18]); both sensitivities exactly Delta_F"
)

_NON_PRIVATE = {
    "mechanism": None,
    "epsilon": None,
    "delta": None,
    "note": "non-private run: no clipping, no noise; NOT PRIVATE",
}


def _input_report(info: Any) -> dict[str, Any]:
    return {
        "path": info.path,
        "dtype": info.dtype,
        "store_chunks": info.store_chunks,
        "n_chunks": [len(c) for c in info.dask_chunks],
    }


def factorize(
    source: Any,
    rank: int,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    algorithm: str = "auto",
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
    algorithm : {"auto", "spectral", "low-space", "two-pass"}
        ``"auto"`` (default): ``"two-pass"`` for a private release unless
        ``sketch_size``, ``padded`` or ``operator="gaussian"`` asks for one pass,
        ``"spectral"`` for a non-private run (docs/algorithms.md, "Which
        algorithm"). ``"two-pass"`` reads a stored matrix twice, with both sensitivities
        exact (:mod:`pipeline.algorithms.two_pass`); both passes are charged
        once, after the first pass and before any noise, and ``sketch_size``,
        ``padded`` and a Gaussian ``operator`` do not apply to it.
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
        ``<store>.dplr-ledger.json`` beside the store (an ``s3://`` input needs
        one given: a ledger needs atomic writes, on a local or shared path).
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
        ``.<out>.dplr-journal`` beside ``out``; without ``out``, beside a
        persistent ledger (named by a digest of the job's public header), and
        none otherwise. Rerunning an interrupted job with the same arguments
        resumes from it: no second pass, the same noise, no second ledger charge.
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
        and ``report``. With ``out``, ``U`` and ``V`` are
        :class:`~pipeline.io.release.StoredArray` views of the published store,
        read only when asked (``np.asarray(f.U)``).

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
    params = make_params(
        rank, epsilon=epsilon, delta=delta, algorithm=algorithm, private=private,
        sketch_size=sketch_size, core_size=core_size, clip_norm=clip_norm, unit=unit,
        neighboring=neighboring, padded=padded, operator=operator,
    )  # fmt: skip
    options = ReleaseOptions(
        out=out, overwrite=overwrite, ledger=ledger, budget=budget, journal=journal,
        scratch=scratch, insecure_noise_seed=insecure_noise_seed,
    )  # fmt: skip
    runtime = Runtime(scheduler=scheduler, cluster_config=cluster_config, progress=progress)
    return release_factorization(source, params, options, runtime, seed=seed)


def plan_factorization(source: Any, params: LrfParams) -> list[dict[str, Any]]:
    """The error model's prediction for each algorithm, before anything is read.

    Parameters
    ----------
    source : str, os.PathLike, zarr.Array, dask.array.Array or numpy.ndarray
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
        :mod:`pipeline.algorithms.lrf_model`).

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
    from pipeline.io import open_input

    if not params.private:
        raise PrivacyConfigError(
            "--plan predicts the error of a private release's noise; drop --non-private."
        )
    _, info = open_input(source, unit=params.clip.unit.value)
    rows = []
    for alg in Algorithm:
        padded = params.padded and alg is Algorithm.LOW_SPACE
        try:
            plan = plan_lrf(dataclasses.replace(params, algorithm=alg, padded=padded), info.shape)
        except InvalidParameterError as exc:  # e.g. sizes this algorithm cannot take
            rows.append({"algorithm": alg.value, "refused": str(exc)})
            continue
        two = alg is Algorithm.TWO_PASS
        rows.append({
            "algorithm": alg.value, "sketch_size": plan.t, "core_size": plan.v,
            "range_weight": plan.weight_y if two else plan.range_weight,  # type: ignore[union-attr]
            "operator": plan.operator.value, "passes": 2 if two else 1,
            **lrf_model.predict(plan).to_dict(),
        })  # fmt: skip
    return rows


def release_factorization(
    source: Any,
    params: LrfParams,
    options: ReleaseOptions | None = None,
    runtime: Runtime | None = None,
    *,
    seed: int | None = None,
) -> Factorization:
    """:func:`factorize` with its parameters as value objects.

    ``params`` says what is released, ``options`` where it is published and
    charged, ``runtime`` where it runs; ``seed`` is a public sketch seed (None:
    a fresh secret one). The CLI and the estimators call this.

    Examples
    --------
    >>> A = np.random.default_rng(0).normal(size=(60, 40)) / 10
    >>> f = release_factorization(A, LrfParams.of(3, private=False), seed=1)
    >>> f.S.shape
    (3,)
    """
    if seed is not None:
        seed = check_int_in_range(seed, "seed", 0, 2**128 - 1)
    spec, job = _lrf_release(params, source, seed, options or ReleaseOptions())
    return run_release(spec, job, runtime or Runtime())  # type: ignore[no-any-return]


def _lrf_release(
    params: LrfParams, source: Any, seed: int | None, options: ReleaseOptions
) -> tuple[ReleaseSpec, _LrfJob]:
    """The release spec and the algorithm hooks of one factorization."""
    from pipeline.io import open_input

    _scratch.remove_dead(options.scratch, options.out)  # what a killed job left here
    array, info = open_input(
        source, unit=params.clip.unit.value if params.private else None
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
    )  # fmt: skip
    scratch = options.scratch
    if scratch is not None:
        scratch = _scratch.check_scratch(scratch)
    return spec, _LrfJob(plan=plan, array=array, info=info, scratch=scratch)


def _lrf_parameters(plan: LrfPlan) -> dict[str, Any]:
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


def _split_fields(plan: LrfPlan) -> dict[str, Any]:
    """The budget split (and one pass's range basis rank) of a private plan."""
    if plan.calibration is None:
        return {}
    if plan.params.algorithm is Algorithm.TWO_PASS:
        return {"weight_z": plan.weight_z, "weight_y": plan.weight_y}  # type: ignore[attr-defined]
    return {"range_weight": plan.range_weight, "basis_rank": plan.basis_rank}


@dataclasses.dataclass(eq=False)
class _LrfJob:
    """The hooks of a factorization for :func:`pipeline.release.run_release`."""

    plan: LrfPlan
    array: Any
    info: Any
    scratch: str | None
    source: Any = None
    cluster: dict[str, Any] | None = None

    @property
    def local(self) -> bool:
        return isinstance(self.array, np.ndarray)

    @contextlib.contextmanager
    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Iterator[Any]:
        if self.local:
            self.source = ArraySource(self.array)
            yield self.source
            return
        from pipeline.execution import DaskSource

        tmp = _scratch.make_scratch(self.scratch, job.spec.out)
        self.cluster = {**(cluster or {}), "n_graph_tasks_pass": 0}
        self.source = DaskSource(
            self.array, client, progress=job.runtime.progress,
            reader=self.info.reader, scratch=tmp,
        )  # fmt: skip
        try:
            yield self.source
        finally:
            self.source.close()  # the job's sealed secrets leave the cluster
            if tmp is not None:
                _scratch.remove_scratch(tmp)

    def compute(self, job: ReleaseJob, src: Any) -> Factorization:
        plan, p = self.plan, self.plan.params
        exact = None if job.journal is None else job.journal.load_sketches()

        # a stored input is fingerprinted (a resume refuses a changed one), so the
        # tall exact sketches are recomputed on resume rather than written on
        # every run; a dask array input may not read the same twice: written
        tall = "recompute" if self.info.path is not None else "write"

        def journal(sketches: dict[str, Any]) -> None:
            jr = job.durable_journal()  # the exact sketches, key and seed: durable
            if jr is not None:
                jr.record_sketches(sketches, client=getattr(src, "client", None), tall=tall)
            crash_point("after-pass")  # the N-th time: after pass N was journaled

        details = {"rank": p.rank, "sketch_size": plan.t, "core_size": plan.v}
        result = run_lrf(
            src, plan, sketch_seed=job.sketch_seed, noise_key=job.noise_key,
            before_noise=lambda: job.charge(algorithm=p.algorithm.value, details=details),
            input_dtype=self.array.dtype, exact=exact, after_pass=journal,
        )  # fmt: skip
        job.mark("post")
        if self.cluster is not None:
            self.cluster["n_graph_tasks_pass"] = src.n_tasks
        report = build_report(
            plan, job, info=self.info, passes=src.n_passes, cluster=self.cluster
        )
        report["resumed_from_journal"] = exact is not None
        return Factorization(U=result.U, S=result.S, V=result.V, report=report)

    def publish(self, job: ReleaseJob, staged: Factorization, client: Any) -> Any:
        from pipeline.io import read_release, write_release

        out, total = job.spec.out, job.t0
        if out is None:
            job.publish(None)
            final = Factorization(
                U=_gather(staged.U, client), S=staged.S, V=_gather(staged.V, client),
                report=staged.report,
            )  # fmt: skip
        else:
            job.publish(
                lambda: write_release(
                    out, staged, overwrite=job.spec.overwrite, client=client
                )
            )
            final = read_release(out, load=False)  # U stays in the store
        final.report["timings_seconds"]["total"] = round(time.perf_counter() - total, 4)
        return final

    def read(self, out: str) -> Any:
        from pipeline.io import read_release

        return read_release(out, load=False)


def _gather(x: Any, client: Any) -> np.ndarray:
    """A (tall) dask array in client memory, its blocks fetched in one gather."""
    if isinstance(x, np.ndarray):
        return x
    from pipeline.execution.source import gather_blocks

    (out,) = gather_blocks(client, [x])
    return out


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
    method: str = "auto",
    iterations: int | None = None,
    clip_radius: float | None = None,
    accounting: str = "gdp",
    sensitivity: str = "tight",
    neighboring: str = "add-remove",
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
        ``k``, ``1 <= k <= d`` (``k < d`` with ``select``).
    epsilon, delta : float
        Budget of this release (one row, under ``neighboring``); required
        unless ``private=False``.
    method : {"auto", "power", "analyze-gauss"}
        ``"auto"`` (default): Analyze Gauss, or the power method with public
        ``T = 3`` and ``R = sqrt(k / n)`` when ``n / d`` exceeds 8
        eigenvalue floors ``gamma`` (:mod:`pipeline.algorithms.pca_auto`; public
        quantities only; given ``iterations``/``clip_radius`` mean the power
        method). ``"power"``: the clipped, preconditioned power method
        (Analyze Gauss start, then ``iterations`` steps). ``"analyze-gauss"``:
        Analyze Gauss alone with the whole budget.
    iterations : int
        Public ``T`` (power method): 1 + T passes over the data.
    clip_radius : float
        Public ``R`` (power method). For near-i.i.d. data ``||U||_inf`` is about
        ``sqrt(log(n) / n)``, so ``2 sqrt(k log(n) / n)`` is a reasonable public
        guess [spec power-pca D5]; never choose it by looking at the data.
    accounting : {"gdp", "paper"}
        Exact Gaussian (GDP) calibration, or the paper's constants (reproduction
        only: about 30x more noise per iteration).
    sensitivity : {"tight", "paper"}
        The exact sensitivities (default) or the paper's constants (Gram and
        ``H``: 2 instead of sqrt(2) under replacement), for comparison.
    neighboring : {"add-remove", "replace"}
        One row present or a zero row (default, as :func:`factorize`), or one
        row replaced by another: sensitivities 1, 1, R or sqrt(2), sqrt(2), 2R.
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
        ``.<out>.dplr-journal`` beside ``out``; without ``out``, beside a
        persistent ledger; in memory otherwise.
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
    Privacy. (epsilon, delta)-DP for one row (rows clipped to norm 1), added
    or removed (default) or replaced: a composition of Gaussian releases
    ``M``, ``H_t``, ``Z_t`` with sensitivities 1, 1, R (add/remove) or
    sqrt(2), sqrt(2), 2R (replace; [P]'s 2, 2, 2R with
    ``sensitivity="paper"``), calibrated exactly as one ``mu``-GDP mechanism
    [spec power-pca 3.4].

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(2000, 8)) * [3, 2, 1, 1, 1, 1, 1, 1] / 6
    >>> r = pca(A, 2, iterations=3, private=False)
    >>> r.components.shape
    (8, 2)
    """
    from pipeline.algorithms.power_pca import PcaParams

    if not isinstance(private, bool):
        raise InvalidParameterError(
            f"private must be True or False, got private={private!r}."
        )
    params = PcaParams(
        rank=rank, epsilon=epsilon, delta=delta, method=method, iterations=iterations,
        clip_radius=clip_radius, accounting=accounting, sensitivity=sensitivity,
        neighboring=neighboring, init_fraction=init_fraction, h_fraction=h_fraction, beta=beta,
        gamma_scale=gamma_scale, row_norm_bound=row_norm_bound, route=route,
        private=private,
    )  # fmt: skip
    selection = Selection.of(
        params, select, radius_grid, iterations_grid, expected_trials
    )
    options = ReleaseOptions(
        out=out, overwrite=overwrite, ledger=ledger, budget=budget, journal=journal,
        insecure_noise_seed=insecure_noise_seed,
    )  # fmt: skip
    runtime = Runtime(scheduler=scheduler, cluster_config=cluster_config, progress=progress)
    return release_pca(source, params, options, runtime, selection=selection)


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


def release_pca(
    source: Any,
    params: Any,
    options: ReleaseOptions | None = None,
    runtime: Runtime | None = None,
    *,
    selection: Selection | None = None,
) -> PcaRelease:
    """:func:`pca` with its parameters as value objects (a ``PcaParams``).

    ``selection`` (a :class:`Selection`) chooses ``(R, T)`` privately; then
    ``params`` has no ``iterations`` or ``clip_radius``.

    Examples
    --------
    >>> from pipeline.algorithms.power_pca import PcaParams
    >>> A = np.random.default_rng(0).normal(size=(500, 6)) / 6
    >>> r = release_pca(A, PcaParams(rank=2, iterations=2, private=False))
    >>> r.components.shape
    (6, 2)
    """
    if selection is not None:
        Selection.of(params, True, selection.radii, selection.iterations,
                     selection.expected_trials)  # fmt: skip
    spec, job = _pca_release(params, source, selection, options or ReleaseOptions())
    return run_release(spec, job, runtime or Runtime())  # type: ignore[no-any-return]


def _pca_plan(params: Any, shape: tuple[int, int], selection: Selection | None) -> Any:
    """The plan of a fixed run, or of a selection with its calibration."""
    from pipeline.accounting.pca import calibrate_selection
    from pipeline.algorithms.power_pca import default_selection_grids, plan_pca

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
    expected = selection.expected_trials
    cal = calibrate_selection(
        epsilon=params.epsilon, delta=params.delta, rank=params.rank,
        n_rows=shape[0], n_features=shape[1], radii=radii, iteration_grid=grid,
        beta=params.beta,
        expected_trials=expected if expected is not None else 4.0 * len(radii) * len(grid),
        sensitivity=params.sensitivity, gamma_scale=params.gamma_scale,
        neighboring=params.neighboring,
    )  # fmt: skip
    return dataclasses.replace(plan, calibration=cal, n_passes=-1)


def _candidates_of(params: Any, shape: tuple[int, int], selection: Selection) -> Any:
    """Exhaustive selection: Analyze Gauss and the public (R, T) candidates.

    Default candidates: Analyze Gauss and the power method at the ``auto``
    rule's ``T`` and ``R``; given grids: Analyze Gauss and their product.
    """
    from pipeline.accounting.pca_selection import calibrate_candidates
    from pipeline.algorithms.pca_auto import AUTO_ITERATIONS, auto_radius

    radii = selection.radii or (auto_radius(shape[0], params.rank),)
    iterations = selection.iterations or (AUTO_ITERATIONS,)
    candidates = [(None, 0)] + [(float(r), int(t)) for t in iterations for r in radii]
    return calibrate_candidates(
        epsilon=params.epsilon, delta=params.delta, rank=params.rank,
        n_rows=shape[0], n_features=shape[1], candidates=candidates,
        sensitivity=params.sensitivity, neighboring=params.neighboring,
        h_fraction=params.h_fraction, beta=params.beta, gamma_scale=params.gamma_scale,
    )  # fmt: skip


def _pca_release(
    params: Any, source: Any, selection: Selection | None, options: ReleaseOptions
) -> tuple[ReleaseSpec, _PcaJob]:
    """The release spec and the algorithm hooks of one PCA."""
    from pipeline.io import open_input

    array, info = open_input(source, unit=None, band_bytes=PCA_BAND_BYTES)
    plan = _pca_plan(params, info.shape, selection)
    cal, select = plan.calibration, selection is not None
    random_stopping = select and selection.expected_trials is not None
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
    return spec, _PcaJob(plan=plan, array=array, info=info, select=select)


@dataclasses.dataclass(eq=False)
class _PcaJob:
    """The hooks of a PCA release for :func:`pipeline.release.run_release`."""

    plan: Any
    array: Any
    info: Any
    select: bool
    cluster: dict[str, Any] | None = None
    source: Any = None

    @property
    def local(self) -> bool:
        return isinstance(self.array, np.ndarray)

    @contextlib.contextmanager
    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Iterator[Any]:
        from pipeline.algorithms.power_pca import ArrayRowSource

        p = self.plan.params
        if self.local:
            self.source = ArrayRowSource(
                self.array, row_norm_bound=p.row_norm_bound, clip=p.private
            )
            yield self.source
            return
        from pipeline.execution.pca import DaskRowSource

        self.source = DaskRowSource(
            self.array, client, row_norm_bound=p.row_norm_bound, clip=p.private,
            # a selection's passes would reveal the number of trials (spec 3.5)
            progress=None if self.select else job.runtime.progress,
        )  # fmt: skip
        self.cluster = {**(cluster or {}), "n_row_bands": self.source.n_bands}
        yield self.source

    def compute(self, job: ReleaseJob, src: Any) -> PcaRelease:
        from pipeline.algorithms.power_pca import run_pca, run_selection

        p, cal = self.plan.params, self.plan.calibration
        details = {
            "rank": p.rank,
            "iterations": None if self.select else self.plan.iterations,
            "clip_radius": None if self.select else getattr(cal, "clip_radius", None),
        }
        kw: dict[str, Any] = {
            "noise_key": job.noise_key,
            "journal": _JobJournal(job),
            "before_first_release": lambda: job.charge(
                algorithm="pca-select" if self.select else f"pca-{p.method}",
                details=details,
            ),
        }
        if self.select:
            job.runtime.say(
                "private selection of (R, T): running; its progress is withheld (it "
                "would reveal the number of trials)"
            )
            result: Any = run_selection(src, cal, **kw)
        else:
            result = run_pca(src, self.plan, on_step=job.runtime.say, **kw)
        job.mark("run")
        if self.cluster is not None and not self.select:
            self.cluster["n_graph_tasks"] = src.n_tasks
        report = build_pca_report(self.plan, result, job, info=self.info, cluster=self.cluster)
        return PcaRelease(
            components=result.components, eigenvalues=result.eigenvalues, report=report
        )

    def publish(self, job: ReleaseJob, rel: PcaRelease, client: Any) -> PcaRelease:
        from pipeline.io import write_group

        if not self.select:  # the time of a selection would reveal its trials
            rel.report["timings_seconds"]["total"] = round(time.perf_counter() - job.t0, 4)
        out = job.spec.out
        arrays = {"components": rel.components, "eigenvalues": rel.eigenvalues}
        job.publish(
            None
            if out is None
            else lambda: write_group(out, arrays, rel.report, overwrite=job.spec.overwrite)
        )
        return rel

    def read(self, out: str) -> PcaRelease:
        from pipeline.io import read_group

        arrays, report = read_group(out, ("components", "eigenvalues"))
        return PcaRelease(
            components=arrays["components"], eigenvalues=arrays["eigenvalues"],
            report=report,
        )  # fmt: skip


class _JobJournal:
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
    selected = hasattr(result, "gap")
    report: dict[str, Any] = {
        "format": "dplr-pca-release/1",
        **job.report_core(),
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
            "neighboring": p.neighboring,
            "init_fraction": p.init_fraction,
            "h_fraction": p.h_fraction,
            "beta": p.beta,
            "gamma_scale": p.gamma_scale,
            "centred": False,
        },
        "auto": plan.auto,
        "n_passes": result.n_passes,
        "n_passes_planned": plan.n_passes,
        "releases": list(result.releases),
        "resumed_releases": list(result.resumed),
        "selection": None,
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
        return report | _NON_PRIVATE
    if selected:
        return _selection_report(report, result, cal)
    cd = cal.to_dict()
    report.update(
        {
            "mechanism": "Gaussian releases M, H_t, Z_t composed exactly (mu-GDP); analytic calibration",
            "epsilon": cal.epsilon,
            "delta": cal.delta,
            "realised_epsilon": cal.realised_epsilon(),
            "accountant": p.accounting,
            "neighboring": _relation_text(p.neighboring),
            "idealized_numerics": True,
            "calibration": cd,
            "mechanisms": cd.get("mechanisms"),
        }
    )
    return report


def _relation_text(neighboring: str) -> str:
    """The report's words for a PCA's neighbouring relation."""
    what = "add or remove" if neighboring == "add-remove" else "replace"
    return f"{what} one row (rows clipped to norm 1)"


def _selection_report(report: dict[str, Any], result: Any, cal: Any) -> dict[str, Any]:
    """The report of a private selection: the winner only.

    The number of trials N, and anything that reveals it (passes, release
    labels, task counts, the run's time), stays in the trusted zone, as the
    random-stopping analysis requires (spec 3.5).
    """
    exhaustive = hasattr(cal, "candidates")
    if result.iterations == 0:
        gamma = None
    elif exhaustive:
        gamma = cal.gamma_of(cal.candidates.index((result.clip_radius, result.iterations)))
    else:
        gamma = cal.gamma(result.iterations)
    report["parameters"].update(
        {
            "method": "private selection of the method, R and T"
            if exhaustive
            else "power (private selection of R and T)",
            "accounting": "gdp" if exhaustive else "rdp",
            "iterations": result.iterations,
            "clip_radius": result.clip_radius,
            "requested_clip_radius": None,
            "gamma": gamma,
        }
    )
    report.update(
        {
            # the run's time, like its passes, would reveal the number of trials
            "timings_seconds": {},
            "n_passes": None,
            "n_passes_planned": None,
            "releases": None,
            "resumed_releases": [] if not result.resumed else ["(withheld)"],
            "selection": {
                "selected_clip_radius": result.clip_radius,
                "selected_iterations": result.iterations,
                "score_gap": result.gap,
                "warm_start_gap_test_passed": result.gap > 0,
                "withheld": "passes and per-trial values"
                if exhaustive
                else "number of trials, passes and per-trial values (they would void the random-stopping analysis)",
            },
            "mechanism": "Analyze Gauss and power-method candidates, each run once, the best noisy score released; composed exactly (mu-GDP)"
            if exhaustive
            else "Analyze Gauss warm start + Papernot-Steinke random stopping over (R, T) trials; RDP accountant",
            "epsilon": cal.epsilon,
            "delta": cal.delta,
            "realised_epsilon": cal.realised_epsilon() if exhaustive else cal.rdp_epsilon,
            "accountant": "gdp (every candidate once)"
            if exhaustive
            else "rdp (dp_accounting RepeatAndSelectDpEvent), capped number of trials",
            "neighboring": _relation_text(cal.neighboring),
            "idealized_numerics": True,
            "calibration": cal.to_dict(),
            "mechanisms": [m.to_dict() for m in cal.mechanisms] if exhaustive else [],
        }
    )
    return report
