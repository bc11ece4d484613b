"""``pipeline.factorize`` and ``pipeline.pca``: thin functions over the one release job.

Each validates its parameters into value objects; :mod:`pipeline.jobs.factorize` and
:mod:`pipeline.jobs.pca` open the input from metadata only, plan the release
(public inputs only) and give a :class:`~pipeline.jobs.engine.ReleaseSpec` and the
algorithm's hooks to :func:`~pipeline.jobs.engine.run_release`, which runs
the fixed, durable steps of every release [design 2, "The release job"]:
refuse (output, budget, contract) before any read; the passes (clipping first,
an individual holding NaN/Inf counted as zero); the journal; the ledger charge,
once and before any noise; the noise, once; post-processing; the atomic
publication; the clean-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from pipeline._validation import (
    check_int_in_range,
)
from pipeline.jobs.engine import Ledger, package_versions, run_release
from pipeline.jobs.factorize import (
    Factorization,
    build_report,
    lrf_release_spec,
    plan_factorization,
)
from pipeline.jobs.pca import (
    PCA_BAND_BYTES,
    PcaRelease,
    Selection,
    build_pca_report,
    pca_release_spec,
    plan_pca_release,
)
from pipeline.params import (
    Algorithm,
    LrfParams,
    Neighboring,
    OperatorKind,
    PcaParams,
    PrivacyUnit,
    ReleaseOptions,
    Runtime,
)

__all__ = [
    "PCA_BAND_BYTES",
    "Selection",
    "build_pca_report",
    "build_report",
    "factorize",
    "make_params",
    "package_versions",
    "pca",
    "plan_factorization",
    "plan_pca_release",
    "release_factorization",
    "release_pca",
]

if TYPE_CHECKING:
    from pipeline.jobs.clusters import ClusterConfig


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
    dataset: str | None = None,
    scheduler: str | None = None,
    cluster_config: str | os.PathLike[str] | ClusterConfig | None = None,
    journal: str | os.PathLike[str] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    insecure_noise_seed: int | None = None,
    progress: TextIO | None = None,
    cache: str = "auto",
) -> Factorization:
    """Differentially private rank-``rank`` factorization ``A ~ U diag(S) V^T``.

    A private release reads a stored matrix twice by default (the two-pass
    algorithm) or once (Spectral-LRF, Low-Space-LRF); a non-private run reads
    it once.

    Parameters
    ----------
    source : str, zarr.Array, dask.array.Array, numpy.ndarray or scipy.sparse matrix of shape (n_rows, n_cols)
        The private matrix. Zarr paths (a dense array, or a CSR matrix in
        AnnData's layout, docs/sparse.md) and dask arrays (of numpy or
        scipy.sparse chunks) run on a Dask cluster (the active client,
        ``scheduler``, ``DASK_SCHEDULER_ADDRESS``, or an embedded LocalCluster);
        numpy arrays and scipy.sparse matrices or arrays (CSR, CSC, COO: read as
        CSR, never densified) run in memory.
    rank : int
        Target rank k, ``1 <= k <= min(n_rows, n_cols) - 1``.
    epsilon, delta : float
        Budget of this release; required unless ``private=False``.
    algorithm : {"auto", "spectral", "low-space", "two-pass"}
        ``"auto"`` (default): ``"two-pass"`` for a private release unless
        ``sketch_size`` or ``operator="gaussian"`` asks for one pass
        (``"spectral"``) or ``padded`` for the paper's padding (``"low-space"``);
        ``"spectral"`` for a non-private run (docs/algorithms.md, "Which
        algorithm"). ``"two-pass"`` reads a stored matrix twice, with both sensitivities
        exact (:mod:`pipeline.algorithms.lrf.two_pass`); both passes are charged
        once, after the first pass and before any noise, and ``sketch_size``,
        ``padded`` and a Gaussian ``operator`` do not apply to it.
    private : bool
        False runs the non-private variant (no clipping, no noise, no ledger).
    sketch_size, core_size : int or None
        ``t`` and ``v`` [spec 2.3]; None picks the defaults (a private one-pass
        release: the error model's t and ``v = 2 max(t, t_model)``; two-pass:
        ``v = max(10k, 100)``; see ``plan_factorization``).
    clip_norm : float
        ``C``: every individual's contribution is clipped to norm ``<= C``.
    unit : {"row", "column", "entry"}
        Who an individual is. An individual holding NaN or +-Inf counts as a
        zero individual, silently (docs/privacy.md, "Non-finite values").
    neighboring : {"add-remove", "replace"}
        ``Delta_F = C`` or ``2C``.
    padded : bool
        Low-Space-LRF in the paper's padded form (comparison only).
    operator : {"gaussian", "sparse-sign"} or None
        Distribution of the co-range operator ``S`` (and ``T``). None (or
        ``"auto"``): a sparse sign map (8 non-zeros per row of ``A``, columns of
        norm exactly 1) wherever its sensitivity is exact
        (:func:`pipeline.algorithms.lrf.plan.sparse_is_exact`: every non-private run;
        a private release whose individual is one row of the sketched matrix,
        or one entry with a secret seed [spec private-lrf-2, 2]); Gaussian
        elsewhere, where ``"sparse-sign"`` is refused.
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
    dataset : str or None
        Without a persistent ledger (an in-memory or dask input), the release
        is charged to this process's accountant, which reports what the
        process has spent. By default there is one for every in-memory input of
        the process, since it cannot tell whether two arrays hold the same
        people (a copy, another dtype, the rows reordered): all are composed,
        over-charging several populations rather than under-reporting one. A
        caller that knows its populations names each with a public label, and
        each name gets an accountant of its own. Refused with a persistent
        ledger, which is the dataset's account.
    scheduler : str or None
        Dask scheduler address.
    cluster_config : path, ClusterConfig or None
        A cluster configuration file (``cluster/*.yaml``), or the name of one
        installed with the package (``"local"``, ``"slurm"``, ...), to start or
        connect to instead; not together with ``scheduler``.
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
    cache : {"auto", "never", "always"}
        Whether the row bands of a dense stored or dask input, read by the first
        pass, stay in the workers' memory for the later passes (the two-pass
        release's second pass): ``"auto"`` when they fit within the workers'
        memory limits with a margin (decided from public sizes before the
        first read; the report's ``cluster.cache`` says what was decided),
        ``"never"`` (every pass reads the store), or ``"always"`` (refused
        before anything is read when they cannot fit). The release is the same
        either way; the bands are released when the job ends.

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
    >>> import numpy as np
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
        out=_path(out), overwrite=overwrite, ledger=ledger, budget=budget,
        journal=_path(journal), scratch=_path(scratch),
        insecure_noise_seed=insecure_noise_seed, dataset=dataset,
    )  # fmt: skip
    runtime = Runtime(
        scheduler=scheduler,
        cluster_config=cluster_config,
        progress=progress,
        cache=cache,
    )
    return release_factorization(source, params, options, runtime, seed=seed)


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
    >>> import numpy as np
    >>> A = np.random.default_rng(0).normal(size=(60, 40)) / 10
    >>> f = release_factorization(A, LrfParams.of(3, private=False), seed=1)
    >>> f.S.shape
    (3,)
    """
    if seed is not None:
        seed = check_int_in_range(seed, "seed", 0, 2**128 - 1)
    spec, job = lrf_release_spec(params, source, seed, options or ReleaseOptions())
    return run_release(spec, job, runtime or Runtime())  # type: ignore[no-any-return]


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
    dataset: str | None = None,
    scheduler: str | None = None,
    cluster_config: str | os.PathLike[str] | ClusterConfig | None = None,
    journal: str | os.PathLike[str] | None = None,
    insecure_noise_seed: int | None = None,
    progress: TextIO | None = None,
    cache: str = "auto",
) -> PcaRelease:
    """Differentially private top-``rank`` PCA subspace of a matrix whose rows are individuals.

    Parameters
    ----------
    source : str, zarr.Array, dask.array.Array, numpy.ndarray or scipy.sparse matrix of shape (n, d)
        The private matrix, one individual per row. Zarr paths (dense or CSR)
        and dask arrays run on a Dask cluster (as in :func:`factorize`); numpy
        arrays and scipy.sparse matrices in memory.
    rank : int
        ``k``, ``1 <= k <= d`` (``k < d`` with ``select``).
    epsilon, delta : float
        Budget of this release (one row, under ``neighboring``); required
        unless ``private=False``.
    method : {"auto", "power", "analyze-gauss"}
        ``"auto"`` (default): Analyze Gauss, or the power method with public
        ``T = 3`` and ``R = sqrt(k / n)`` when ``n / d`` exceeds 8
        eigenvalue floors ``gamma`` (:mod:`pipeline.algorithms.pca.auto`; public
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
        Choose the method and ``(R, T)`` privately [P, App. C]. By default
        every candidate runs once -- Analyze Gauss and the power method at
        the ``auto`` rule's ``T`` and ``R`` (with grids: Analyze Gauss and
        every ``(R, T)`` of their product) -- and the best noisy score is
        released, the whole run composed exactly as one mu-GDP mechanism.
        With ``expected_trials``, Papernot-Steinke random stopping over the
        grids instead: a capped geometric number of trials, run in lockstep
        (trials with equal T share passes), accounted with RDP; about 3.6x
        the noise of a fixed run with the same budget (spec 3.5).
        ``iterations`` and ``clip_radius`` must be None.
    radius_grid, iterations_grid : sequence or None
        Public grids for ``select`` (default: the ``auto`` rule's ``R`` and
        ``T``; with ``expected_trials``, :func:`default_selection_grids`).
    expected_trials : float or None
        ``E[N]`` of a random-stopping ``select``; None (default): every
        candidate once, no random stopping. A smaller ``E[N]`` than [P]'s
        ``8m / beta`` (``m`` grid points) lowers the noise; it affects
        utility only, never privacy.
    out : path or None
        Zarr v3 group to publish to (``components``, ``eigenvalues``, report).
    overwrite : bool
    ledger, budget, dataset, scheduler, cluster_config, insecure_noise_seed, progress, cache
        As in :func:`factorize` (``cache``: every power iteration and every
        candidate of a selection reads the held bands).
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
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(2000, 8)) * [3, 2, 1, 1, 1, 1, 1, 1] / 6
    >>> r = pca(A, 2, iterations=3, private=False)
    >>> r.components.shape
    (8, 2)
    """
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
        out=_path(out), overwrite=overwrite, ledger=ledger, budget=budget,
        journal=_path(journal), insecure_noise_seed=insecure_noise_seed, dataset=dataset,
    )  # fmt: skip
    runtime = Runtime(
        scheduler=scheduler,
        cluster_config=cluster_config,
        progress=progress,
        cache=cache,
    )
    return release_pca(source, params, options, runtime, selection=selection)


def release_pca(
    source: Any,
    params: PcaParams,
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
    >>> import numpy as np
    >>> from pipeline.params import PcaParams
    >>> A = np.random.default_rng(0).normal(size=(500, 6)) / 6
    >>> r = release_pca(A, PcaParams(rank=2, iterations=2, private=False))
    >>> r.components.shape
    (6, 2)
    """
    if selection is not None:
        Selection.of(params, True, selection.radii, selection.iterations,
                     selection.expected_trials)  # fmt: skip
    spec, job = pca_release_spec(params, source, selection, options or ReleaseOptions())
    return run_release(spec, job, runtime or Runtime())  # type: ignore[no-any-return]


def _path(value: str | os.PathLike[str] | None) -> str | None:
    """``value`` as the ``str`` path :class:`ReleaseOptions` holds (None stays None)."""
    return None if value is None else os.fspath(value)
