"""scikit-learn estimators over the private releases: ``DPPCA`` and ``DPLowRank``.

Problem. Expose :func:`pipeline.api.pca` and :func:`pipeline.api.factorize` as
scikit-learn transformers, so that a private projection can be cloned, grid
searched over *public* hyper-parameters and placed in a
:class:`sklearn.pipeline.Pipeline`. ``fit`` is the private step: it makes one
release (and charges the dataset's ledger when there is one). ``transform`` and
``inverse_transform`` are post-processing of that release: they are linear maps
built from released values only, and may be applied to any data.

Inputs of ``fit``: a numpy array (or anything :func:`sklearn.utils.validation.
validate_data` accepts, such as a pandas DataFrame), a dask array, or a Zarr
path. Dask arrays and Zarr paths run on a Dask cluster exactly as in the
functional API. This module never imports dask or zarr itself: it only calls
methods of the dask arrays it is given, and ``pipeline.io`` / ``pipeline.execution``
for opening stores and for clients.

Centring (spec power-pca section 7, D8). The PCA is uncentred by default.
``DPPCA(centre=True)`` releases the mean of the clipped rows with the Gaussian
mechanism, centres the rows with that *released* mean, re-clips them and runs
the PCA on them; the two releases are composed exactly as Gaussian mechanisms
(mu-GDP) so that together they satisfy the requested ``(epsilon, delta)``
(:mod:`pipeline.jobs.centred_pca`; the estimators only hand off to functions).

References
----------
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS-B 84(1), 2022,
   arXiv:1905.02383 (Cor. 3.3: composition of Gaussian mechanisms).
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530 (Thm 8: the exact (epsilon, delta)
   curve of a Gaussian mechanism).
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
)
from sklearn.utils.validation import check_is_fitted, validate_data

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.api import pca, release_factorization, release_pca
from pipeline.errors import InvalidParameterError
from pipeline.jobs.centred_pca import (  # noqa: F401 - re-exported for existing callers
    MEAN_SENSITIVITY,
    centred_pca,
    split_mean_budget,
)
from pipeline.jobs.pca import PCA_BAND_BYTES, Selection
from pipeline.params import LrfParams, PcaParams, ReleaseOptions, Runtime, check_param

__all__ = ["DPPCA", "DPLowRank"]


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------
def _input_kind(X: Any) -> str:
    """``"path"``, ``"dask"``, ``"zarr"`` or ``"memory"`` (numpy and array-likes)."""
    if isinstance(X, str | os.PathLike):
        return "path"
    # Only a caller who already imported dask (zarr) can hold such an array, so
    # looking the class up in sys.modules never imports either library here.
    dask_array = sys.modules.get("dask.array")
    if dask_array is not None and isinstance(X, dask_array.Array):
        return "dask"
    zarr = sys.modules.get("zarr")
    if zarr is not None and isinstance(X, zarr.Array):
        return "zarr"
    return "memory"


def _is_sparse(X: Any) -> bool:
    """A scipy.sparse matrix or array (only if scipy.sparse is already imported)."""
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and bool(sparse.issparse(X))


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise InvalidParameterError(
            f"{name} must be True or False, got {name}={value!r}."
        )
    return bool(value)


def _check_random_state(random_state: Any, *, high: int) -> int | None:
    """None or a non-negative int (a seed that may be published)."""
    if random_state is None:
        return None
    return check_int_in_range(random_state, "random_state", 0, high)


def _insecure_seed(insecure_noise: bool, random_state: int | None) -> int | None:
    """The public noise seed of a test-only run (None in every private run)."""
    if not insecure_noise:
        return None
    if random_state is None:
        raise InvalidParameterError(
            "insecure_noise=True needs an integer random_state to seed the noise "
            "(test-only: the result is NOT PRIVATE), got random_state=None."
        )
    return random_state


def _validate_fit_input(est: BaseEstimator, X: Any, *, min_samples: int) -> Any:
    """Check an in-memory ``X`` (sets ``n_features_in_`` and feature names).

    NaN and +-Inf pass: the release counts an individual holding them as a
    zero individual (docs/privacy.md, "Non-finite values"), as for Zarr input.

    Dask arrays and Zarr paths are validated from metadata by ``pipeline.io``;
    their feature names, if any were recorded by an earlier fit, are dropped.
    """
    if _input_kind(X) == "memory":
        return validate_data(
            est,
            X,
            reset=True,
            # scipy.sparse stays sparse (any other format becomes CSR)
            accept_sparse=("csr", "csc", "coo"),
            dtype=[np.float64, np.float32],
            ensure_all_finite=False,
            ensure_min_samples=min_samples,
            # rank k < d needs two columns; said here in sklearn's words
            ensure_min_features=2,
        )
    if hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    return X


def _validate_transform_input(est: BaseEstimator, X: Any, *, allow_nan: bool) -> Any:
    """Check ``X`` for ``transform``: numpy-like through sklearn, dask by shape."""
    kind = _input_kind(X)
    if kind == "dask":
        if X.ndim != 2 or X.shape[1] != est.n_features_in_:
            raise ValueError(
                f"X has shape {tuple(X.shape)}, but {type(est).__name__} is expecting "
                f"{est.n_features_in_} features as input."
            )
        return X
    if kind in ("path", "zarr"):
        raise InvalidParameterError(
            "transform takes a numpy or dask array; open a Zarr store with "
            "dask.array.from_zarr first."
        )
    return validate_data(
        est,
        X,
        reset=False,
        accept_sparse=("csr", "csc", "coo"),
        dtype=[np.float64, np.float32],
        ensure_all_finite="allow-nan" if allow_nan else True,
    )


def _pca_accepts(name: str) -> bool:
    return name in inspect.signature(pca).parameters


# --------------------------------------------------------------------------
# DPPCA
# --------------------------------------------------------------------------
# scikit-learn ships no type information: its base classes are Any to mypy
class DPPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):  # type: ignore[misc]
    """Differentially private PCA (top-k principal subspace) as a scikit-learn transformer.

    ``fit`` runs :func:`pipeline.api.pca`: the clipped, preconditioned power
    method (Analyze Gauss start) or Analyze Gauss alone, (epsilon, delta)-DP for
    neighbouring datasets that differ in one row.

    Parameters
    ----------
    n_components : int or None, default=None
        ``k``, the number of components, ``1 <= k <= n_features``. Public.
        None keeps every component (``k = n_features``), as scikit-learn's
        ``PCA``.
    epsilon : float, default=1.0
        Privacy budget of the release (of the DP mean and the PCA together when
        ``centre=True``); ignored when ``private=False``.
    delta : float, default=1e-6
        In (0, 1); ignored when ``private=False``.
    method : {"auto", "power", "analyze-gauss"}, default="auto"
        ``"auto"``: Analyze Gauss, or the power method with public ``T = 3``
        and ``R = sqrt(k / n)`` when ``n / d`` exceeds 8 eigenvalue
        floors (a rule on public quantities only,
        :mod:`pipeline.algorithms.pca.auto`; a given ``n_iter`` or
        ``clip_radius`` means the power method). ``"power"``: the clipped,
        preconditioned power method. ``"analyze-gauss"``: Analyze Gauss alone
        with the whole budget (no ``n_iter``, no ``clip_radius``).
    n_iter : int or None, default=None
        Public number of power iterations ``T`` (``1 + T`` passes over the
        data). Required for ``method="power"`` unless ``select=True``; never
        chosen from the data; 3 to 10 is typical after the Analyze Gauss warm
        start (spec power-pca D5).
    clip_radius : float or None, default=None
        Public clip radius ``R`` of the power iterations. Required for a
        private ``method="power"`` run unless ``select=True``
        (``private=False`` without it does not clip). For near-i.i.d. rows
        ``2 sqrt(k log(n) / n)`` is a reasonable *public* guess; never choose
        it by looking at the data.
    select : bool, default=False
        Choose ``(R, T)`` privately over :func:`pipeline.api.pca`'s default
        public grids (spec power-pca 2.5), inside the same budget; ``n_iter``
        and ``clip_radius`` must then be None, with ``method="power"``,
        ``private=True`` and ``centre=False``. If the installed
        :func:`pipeline.api.pca` has no selection, ``fit`` raises
        ``InvalidParameterError``.
    accounting : {"gdp", "paper"}, default="gdp"
        Exact Gaussian (GDP) calibration, or the paper's literal constants
        (reproduction only; far more noise).
    sensitivity : {"tight", "paper"}, default="tight"
        The exact sensitivities, or the paper's constants for comparison (Gram
        and ``H``: 2 instead of sqrt(2) under replacement).
    neighboring : {"add-remove", "replace"}, default="add-remove"
        Neighbouring datasets: one row present or a zero row (as
        :class:`DPLowRank` and :func:`pipeline.api.factorize`), or one row
        replaced.
    init_fraction, h_fraction : float, default=0.5
        Public budget split: initialisation vs iterations, ``H`` vs ``Z``.
    beta : float, default=0.1
        Failure probability of the utility analysis (sets the eigenvalue floor
        only, never privacy).
    gamma_scale : float, default=1.0
        Public multiplier of the eigenvalue floor ``gamma``.
    row_norm_bound : float, default=1.0
        Public ``C``: rows are divided by ``C``, then clipped to norm 1. Rows
        holding NaN or +-Inf count as zero rows, silently (raising or counting
        them would be a data-dependent side channel); huge finite values are
        clipped like any other.
    centre : bool, default=False
        Centre the rows with a DP mean before the PCA (see Notes). The default
        is the uncentred PCA of the paper (second-moment matrix ``A^T A``).
    mean_fraction : float, default=0.1
        With ``centre=True``: share of the budget (of ``mu^2`` in GDP terms)
        spent on the mean, in (0, 1).
    private : bool, default=True
        False runs the classical block power method (no clipping, no noise, no
        ledger; exact mean when ``centre=True``): a non-private baseline whose
        report says NOT PRIVATE.
    ledger : str, path or Ledger, default=None
        The dataset's privacy ledger. For a Zarr path it defaults to the ledger
        file beside the store; in-memory and dask arrays without one are
        charged to this process's accountant (``dataset``;
        ``privacy_report_["ledger"]["kind"] == "in-process"``).
    budget : (float, float) or None, default=None
        Lifetime ``(epsilon, delta)`` declared when the ledger does not exist.
    dataset : str or None, default=None
        Without a persistent ledger: a public label of the population ``X``
        holds, whose in-process accountant is charged (one per name). None:
        the one accountant of every in-memory input of the process, which
        composes them all, since it cannot tell whether two arrays hold the
        same people (see :func:`pipeline.api.factorize`). Refused with a
        persistent ledger.
    scheduler : str or None, default=None
        Dask scheduler address for dask and Zarr inputs (otherwise the active
        client, ``DASK_SCHEDULER_ADDRESS``, or an embedded LocalCluster).
    random_state : int or None, default=None
        The PCA has no data-independent randomness (no sketch), so in a private
        run this seeds nothing: the noise is always drawn from a fresh secret
        key. It is used only with ``insecure_noise=True``. (The name follows
        scikit-learn, so that ``clone`` and ``set_params`` work as usual.)
    insecure_noise : bool, default=False
        Test-only: draw the noise from a key derived from ``random_state``, so
        that fits are reproducible. The result is NOT PRIVATE and
        ``privacy_report_`` says so.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal rows spanning the private estimate of the principal
        subspace (the transpose of the ``(d, k)`` matrix of :func:`pca`).
    n_components_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when ``X`` had string column names.
    explained_variance_ : ndarray of shape (n_components,)
        Noisy estimates of the top eigenvalues of ``A^T A / n`` (of the rows
        as prepared for the PCA: clipped and, with ``centre=True``, centred and
        re-clipped), in the units of ``X``: the top-k eigenvalues of the
        released Analyze Gauss matrix ``M`` times ``C^2 / n`` for the public
        ``n`` (times ``1 / n`` with ``private=False``, which does not scale). Post-processing of the release only; they come from ``M``, not
        from the final power-method components. No explained variance *ratio*
        is given: the total variance is not released.
    mean_ : ndarray of shape (n_features,) or None
        The DP mean (``centre=True``), or None for the uncentred PCA.
    n_iter_ : int
        Iterations ``T`` run (0 for Analyze Gauss; the selected ``T`` with
        ``select=True``).
    clip_radius_ : float or None
        Clip radius used (after the public cap), or None.
    privacy_report_ : dict
        The release's privacy report (the :func:`pca` report; with
        ``centre=True`` extended by the mean release and the composition).

    Notes
    -----
    Privacy. (epsilon, delta)-DP for one row of norm at most
    ``row_norm_bound`` added or removed (or replaced, with
    ``neighboring="replace"``), for everything ``fit`` stores (all attributes are
    released values or post-processing of them) [spec power-pca 1.2, 3.4].
    ``transform`` and ``inverse_transform`` are post-processing of the release
    and apply to any data; their outputs on private rows are of course not
    differentially private themselves.

    Centring (``centre=True``, spec power-pca D8). Rows are scaled by ``1/C``
    and clipped to norm 1; the mean ``(sum_i a_i + N(0, sigma_m^2 I_d)) / n``
    is released with L2 sensitivity 1 (add/remove) or 2 (replacement) and
    ``sigma_m = sensitivity / mu_m``; the rows are centred with this released
    mean, re-clipped to norm 1 (centred rows can reach norm 2) and the PCA runs
    on them, calibrated with its replacement sensitivities under both relations
    (a removed row is a zero row, which centring turns into ``-mean``). With ``mu_total = 1 / s(epsilon, delta)``, the mean gets
    ``mu_m = sqrt(mean_fraction) mu_total`` (lowered if the rounding of the
    calibrations requires it) and the PCA is calibrated to the
    epsilon at which ``sqrt(1 - mean_fraction) mu_total``-GDP is
    ``(epsilon, delta)``-DP; the adaptive composition is
    ``sqrt(mu_m^2 + mu_pca^2)``-GDP [DRS22, Cor. 3.3], checked to be within
    ``(epsilon, delta)`` on the actual calibrated values before any data is
    read. The fit is one release: the two are charged together, once, before
    the mean's noise is drawn, and a persistent ledger keeps the fit's journal
    beside it, so a retry of a failed fit reuses the released mean and is not
    charged again. Not available with ``select=True``: the centred fit composes
    the DP mean with one PCA run of public ``n_iter`` and ``clip_radius``; a
    private selection over centred rows is not implemented.

    Passes over the data: as :func:`pca` (``1 + T``), plus one for the mean.

    scikit-learn conventions. All common checks of
    :func:`sklearn.utils.estimator_checks.check_estimator` pass in the
    test-only configuration ``insecure_noise=True`` with a fixed
    ``random_state`` (fits are then deterministic). A private run draws fresh
    secret noise on every fit, so it is randomized (tag
    ``non_deterministic``) and:

    - ``check_fit_idempotent`` fails: two fits on the same data are two
      releases with independent noise (and a refit is charged again);
    - sklearn skips ``check_pipeline_consistency``,
      ``check_transformer_general`` and ``check_transformer_data_not_an_array``
      for non-deterministic estimators: each compares two separate fits;
    - sklearn also skips ``check_methods_sample_order_invariance`` and
      ``check_methods_subset_invariance``, although they hold: they compare
      one fitted estimator on reordered and sliced inputs, and ``transform``
      is a fixed linear map.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(500, 6)) * [3, 2, 1, 1, 1, 1] / 8
    >>> est = DPPCA(2, epsilon=1.0, method="analyze-gauss").fit(X)
    >>> est.components_.shape, est.transform(X).shape
    ((2, 6), (500, 2))
    """

    def __init__(
        self,
        n_components: int | None = None,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-6,
        method: str = "auto",
        n_iter: int | None = None,
        clip_radius: float | None = None,
        select: bool = False,
        accounting: str = "gdp",
        sensitivity: str = "tight",
        neighboring: str = "add-remove",
        init_fraction: float = 0.5,
        h_fraction: float = 0.5,
        beta: float = 0.1,
        gamma_scale: float = 1.0,
        row_norm_bound: float = 1.0,
        centre: bool = False,
        mean_fraction: float = 0.1,
        private: bool = True,
        ledger: Any = None,
        budget: tuple[float, float] | None = None,
        dataset: str | None = None,
        scheduler: str | None = None,
        random_state: int | None = None,
        insecure_noise: bool = False,
    ) -> None:
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.method = method
        self.n_iter = n_iter
        self.clip_radius = clip_radius
        self.select = select
        self.accounting = accounting
        self.sensitivity = sensitivity
        self.neighboring = neighboring
        self.init_fraction = init_fraction
        self.h_fraction = h_fraction
        self.beta = beta
        self.gamma_scale = gamma_scale
        self.row_norm_bound = row_norm_bound
        self.centre = centre
        self.mean_fraction = mean_fraction
        self.private = private
        self.ledger = ledger
        self.budget = budget
        self.dataset = dataset
        self.scheduler = scheduler
        self.random_state = random_state
        self.insecure_noise = insecure_noise

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # NaN/Inf rows become zero rows, silently (spec power-pca 1.4, rule 2)
        tags.input_tags.allow_nan = True
        # scipy.sparse is read from its stored entries (centre=True refuses it)
        tags.input_tags.sparse = not self.centre
        tags.non_deterministic = bool(self.private) and not self.insecure_noise
        return tags

    # -- parameters --------------------------------------------------------
    def _check_params(self) -> tuple[bool, int | None]:
        """Validate the parameters (no data): True to select, and the noise seed
        of a test-only run (None in every private run)."""
        if self.n_components is not None:
            check_param(PcaParams, "rank", self.n_components, label="n_components")
        private = _check_bool(self.private, "private")
        insecure = _check_bool(self.insecure_noise, "insecure_noise")
        _check_bool(self.centre, "centre")
        # the checks of PcaParams' fields, under the estimator's names
        for name in ("accounting", "sensitivity", "neighboring", "init_fraction",
                     "h_fraction", "beta"):  # fmt: skip
            check_param(PcaParams, name, getattr(self, name))
        check_float_in_interval(self.mean_fraction, "mean_fraction", 0.0, 1.0)
        for name in ("gamma_scale", "row_norm_bound"):
            check_param(PcaParams, name, getattr(self, name))
        seed = _check_random_state(self.random_state, high=2**63 - 1)
        select = self._check_iterations()
        if private:
            check_privacy_pair(self.epsilon, self.delta)
            return select, _insecure_seed(insecure, seed)
        return select, None

    def _params(self, rank: int) -> PcaParams:
        """The fit's parameter set (its values checked by :meth:`_check_params`)."""
        eps = dlt = None
        if self.private:
            eps, dlt = check_privacy_pair(self.epsilon, self.delta)
        return PcaParams(
            rank=rank, epsilon=eps, delta=dlt, method=self.method,
            iterations=self.n_iter, clip_radius=self.clip_radius,
            accounting=self.accounting, sensitivity=self.sensitivity,
            neighboring=self.neighboring, init_fraction=self.init_fraction,
            h_fraction=self.h_fraction, beta=self.beta, gamma_scale=self.gamma_scale,
            row_norm_bound=self.row_norm_bound, private=self.private,
        )  # fmt: skip

    def _check_iterations(self) -> bool:
        """Check ``method``, ``select``, ``n_iter``, ``clip_radius``; True to select."""
        method = check_param(PcaParams, "method", self.method)
        if self.n_iter is not None:
            check_param(PcaParams, "iterations", self.n_iter, label="n_iter")
        if self.clip_radius is not None:
            check_param(PcaParams, "clip_radius", self.clip_radius)
        given = f"n_iter={self.n_iter!r}, clip_radius={self.clip_radius!r}"
        if _check_bool(self.select, "select"):
            if not _pca_accepts("select"):
                raise InvalidParameterError(
                    "select=True is not available yet: this version of pipeline.api.pca "
                    "has no private selection of (R, T); give n_iter and clip_radius."
                )
            if self.centre or not self.private or method == "analyze-gauss":
                raise InvalidParameterError(
                    "select=True needs method='auto' or 'power', private=True and centre=False "
                    "(a centred fit composes the DP mean with one PCA run of public n_iter "
                    "and clip_radius; a private selection over centred rows is not "
                    "implemented)."
                )
            if self.n_iter is not None or self.clip_radius is not None:
                raise InvalidParameterError(
                    f"select=True chooses n_iter and clip_radius privately; leave them "
                    f"None, got {given}."
                )
            return True
        if method == "analyze-gauss":
            if self.n_iter is not None or self.clip_radius is not None:
                raise InvalidParameterError(
                    f"n_iter and clip_radius apply to method='power' only, got {given}."
                )
            return False
        if method == "auto":  # the public rule fills what is not given
            return False
        # a non-private run may leave R unset (no clipping), never T
        required = ("n_iter", "clip_radius") if self.private else ("n_iter",)
        missing = [name for name in required if getattr(self, name) is None]
        if missing:
            raise InvalidParameterError(
                f"{' and '.join(missing)} must be given for method='power' (public "
                "T, e.g. 3 to 10, and public R, e.g. 2 sqrt(k log(n) / n)); they are "
                "never chosen from the data. Use select=True, or "
                "method='analyze-gauss', to do without them."
            )
        return False

    # -- fit ---------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> DPPCA:
        """Release the private principal subspace of ``X``.

        Parameters
        ----------
        X : array-like, scipy.sparse matrix, dask array or Zarr path, of shape (n_samples, n_features)
            The private matrix, one individual per row. Zarr paths (dense or
            CSR) and dask arrays run on a Dask cluster; a sparse matrix is never
            densified (``centre=True`` refuses it).
        y : None
            Ignored.

        Returns
        -------
        self : DPPCA

        Raises
        ------
        InvalidParameterError
            A parameter is out of range or missing (before any data is read).
        BudgetExceededError
            The release does not fit the dataset's ledger; nothing read.

        Notes
        -----
        Privacy. See the class Notes: one (epsilon, delta)-DP release for one
        row (``neighboring``).
        """
        select, insecure_seed = self._check_params()
        X = _validate_fit_input(self, X, min_samples=1)
        params = self._params(self._rank(X))
        options = ReleaseOptions(
            ledger=self.ledger, budget=self.budget, dataset=self.dataset,
            insecure_noise_seed=insecure_seed,
        )  # fmt: skip
        runtime = Runtime(scheduler=self.scheduler)
        if self.centre:  # the DP mean, then the PCA: pipeline.jobs.centred_pca
            rel, mean, report = centred_pca(
                X, params, options, runtime, mean_fraction=float(self.mean_fraction)
            )
        else:
            selection = Selection() if select else None
            rel = release_pca(X, params, options, runtime, selection=selection)
            mean, report = None, dict(rel.report)
        n, d = (int(s) for s in report["shape"])
        scale = float(self.row_norm_bound) ** 2 if params.private else 1.0
        self.components_ = np.ascontiguousarray(np.asarray(rel.components).T)
        self.n_components_ = int(self.components_.shape[0])
        self.n_features_in_ = d
        self._n_features_out = self.n_components_
        # post-processing: released eigenvalues of M, in the units of X, over public n
        self.explained_variance_ = (
            np.asarray(rel.eigenvalues[: self.n_components_], dtype=np.float64)
            * scale
            / n
        )
        self.mean_ = mean
        self.n_iter_ = int(report["parameters"].get("iterations") or 0)
        self.clip_radius_ = report["parameters"].get("clip_radius")
        self.privacy_report_ = report
        return self

    def _rank(self, X: Any) -> int:
        """``n_components``, or the number of columns of ``X`` (a shape) if None."""
        if self.n_components is not None:
            return int(self.n_components)
        if isinstance(X, tuple):
            return int(X[1])
        if not hasattr(X, "shape"):  # a Zarr path: its shape from the metadata
            from pipeline.jobs.data import open_input  # heavy: zarr

            # the shape only: the fit's job checks the store when it reads it
            X = open_input(X, unit=None, band_bytes=PCA_BAND_BYTES, validate=False)[1]
        return int(X.shape[1])

    # -- post-processing ---------------------------------------------------
    def transform(self, X: Any) -> Any:
        """Project ``X`` on the released components: ``(X - mean_) @ components_.T``.

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)

        Returns
        -------
        ndarray (or dask array) of shape (n_samples, n_components), float64
            NaN in a row of ``X`` gives NaN in that row of the output.
        """
        check_is_fitted(self, "components_")
        X = _validate_transform_input(self, X, allow_nan=True)
        if self.mean_ is not None and _is_sparse(X):
            # X C^T - mean C^T: a sparse X is never densified
            return np.asarray(X @ self.components_.T) - self.mean_ @ self.components_.T
        if self.mean_ is not None:
            X = X - self.mean_
        return X @ self.components_.T

    def inverse_transform(self, X: Any) -> Any:
        """Map projections back: ``X @ components_ + mean_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self, "components_")
        if _input_kind(X) != "dask":
            X = np.asarray(X, dtype=np.float64)
        out = X @ self.components_
        return out if self.mean_ is None else out + self.mean_


# --------------------------------------------------------------------------
# DPLowRank
# --------------------------------------------------------------------------
# scikit-learn ships no type information: its base classes are Any to mypy
class DPLowRank(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):  # type: ignore[misc]
    """Differentially private rank-k factorization ``A ~ U diag(S) V^T`` as a transformer.

    ``fit`` runs :func:`pipeline.api.factorize` (one pass over the data,
    Gaussian noise on the sketches); ``transform`` projects on the released
    right factor ``V``.

    Parameters
    ----------
    n_components : int
        Target rank ``k``, ``1 <= k <= min(n_samples, n_features) - 1``. Public.
    epsilon : float, default=1.0
        Budget of the release; ignored when ``private=False``.
    delta : float, default=1e-6
        In (0, 1); ignored when ``private=False``.
    algorithm : {"auto", "spectral", "low-space", "two-pass"}, default="auto"
        ``"auto"``: two-pass for a private fit (the most accurate), Spectral-LRF
        for a non-private one (:func:`pipeline.api.factorize`).
    private : bool, default=True
        False runs the non-private variant (no clipping, no noise, no ledger).
    sketch_size, core_size : int or None, default=None
        ``t`` and ``v`` of the sketches; None picks the defaults.
    clip_norm : float, default=1.0
        ``C``: every individual's contribution is clipped to norm ``<= C``.
    unit : {"row", "column", "entry"}, default="row"
        Who an individual is. An individual holding NaN or +-Inf counts as a
        zero individual, silently (as in :func:`pipeline.api.factorize`).
    neighboring : {"add-remove", "replace"}, default="add-remove"
    padded : bool, default=False
        Low-Space-LRF in the paper's padded form (comparison only).
    operator : {"auto", "gaussian", "sparse-sign"}, default="auto"
        Distribution of the co-range sketch: Gaussian when private (the only
        kind the noise calibration covers), sparse sign when not.
    ledger : str, path or Ledger, default=None
        As in :class:`DPPCA`.
    budget : (float, float) or None, default=None
        Lifetime budget declared when the ledger does not exist.
    dataset : str or None, default=None
        As in :class:`DPPCA`.
    scheduler : str or None, default=None
        Dask scheduler address for dask and Zarr inputs.
    random_state : int or None, default=None
        Seeds the sketch matrices (data-independent randomness, passed as
        ``seed``); None draws a fresh secret seed. A given seed is public, so a
        private fit is calibrated with the worst-case sensitivity of its
        operators. It never seeds the noise, except with ``insecure_noise=True``.
    insecure_noise : bool, default=False
        Test-only: noise drawn from a key derived from ``random_state``;
        reproducible and NOT PRIVATE (the report says so).

    Attributes
    ----------
    U_ : ndarray of shape (n_samples, n_components)
    S_ : ndarray of shape (n_components,)
    V_ : ndarray of shape (n_features, n_components)
    components_ : ndarray of shape (n_components, n_features)
        ``V_.T``.
    n_components_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when ``X`` had string column names.
    privacy_report_ : dict

    Notes
    -----
    Privacy. (epsilon, delta)-DP for neighbours differing in one individual's
    clipped contribution, as :func:`factorize`; all fitted attributes are
    released values. ``transform`` is post-processing of ``V_``.

    scikit-learn conventions. As for :class:`DPPCA`: every common check
    passes with ``insecure_noise=True`` and a fixed ``random_state``; a private
    run fails ``check_fit_idempotent`` (fresh noise per fit), and sklearn skips
    ``check_pipeline_consistency``, ``check_transformer_general`` and
    ``check_transformer_data_not_an_array`` (two separate fits) as well as
    ``check_methods_sample_order_invariance`` and
    ``check_methods_subset_invariance`` (which hold: one fit, a fixed linear
    ``transform``) because it is non-deterministic. With ``private=False`` and
    a fixed ``random_state`` the estimator is deterministic.

    Examples
    --------
    >>> A = np.random.default_rng(0).normal(size=(60, 40)) / 10
    >>> est = DPLowRank(3, private=False, random_state=1).fit(A)
    >>> est.U_.shape, est.S_.shape, est.V_.shape, est.transform(A).shape
    ((60, 3), (3,), (40, 3), (60, 3))
    """

    def __init__(
        self,
        n_components: int,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-6,
        algorithm: str = "auto",
        private: bool = True,
        sketch_size: int | None = None,
        core_size: int | None = None,
        clip_norm: float = 1.0,
        unit: str = "row",
        neighboring: str = "add-remove",
        padded: bool = False,
        operator: str = "auto",
        ledger: Any = None,
        budget: tuple[float, float] | None = None,
        dataset: str | None = None,
        scheduler: str | None = None,
        random_state: int | None = None,
        insecure_noise: bool = False,
    ) -> None:
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.algorithm = algorithm
        self.private = private
        self.sketch_size = sketch_size
        self.core_size = core_size
        self.clip_norm = clip_norm
        self.unit = unit
        self.neighboring = neighboring
        self.padded = padded
        self.operator = operator
        self.ledger = ledger
        self.budget = budget
        self.dataset = dataset
        self.scheduler = scheduler
        self.random_state = random_state
        self.insecure_noise = insecure_noise

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        reproducible = self.random_state is not None and (
            self.insecure_noise or not self.private
        )
        tags.non_deterministic = not reproducible
        # an individual holding NaN/Inf is a zero individual, as in factorize
        tags.input_tags.allow_nan = True
        tags.input_tags.sparse = True  # read from its stored entries
        return tags

    def _release_values(self) -> tuple[LrfParams, ReleaseOptions, Runtime, int | None]:
        """Validate every parameter (no data) into the release's value objects."""
        check_param(LrfParams, "rank", self.n_components, label="n_components")
        private = _check_bool(self.private, "private")
        insecure = _check_bool(self.insecure_noise, "insecure_noise")
        seed = _check_random_state(self.random_state, high=2**128 - 1)
        params = LrfParams.of(
            int(self.n_components),
            epsilon=self.epsilon if private else None,
            delta=self.delta if private else None,
            algorithm=self.algorithm, private=private, sketch_size=self.sketch_size,
            core_size=self.core_size, clip_norm=self.clip_norm, unit=self.unit,
            neighboring=self.neighboring, padded=_check_bool(self.padded, "padded"),
            operator=self.operator,
        )  # fmt: skip
        options = ReleaseOptions(
            ledger=self.ledger, budget=self.budget, dataset=self.dataset,
            insecure_noise_seed=_insecure_seed(insecure, seed) if private else None,
        )  # fmt: skip
        return params, options, Runtime(scheduler=self.scheduler), seed

    def fit(self, X: Any, y: Any = None) -> DPLowRank:
        """Release a private rank-k factorization of ``X``.

        Parameters
        ----------
        X : array-like, scipy.sparse matrix, dask array or Zarr path, of shape (n_samples, n_features)
        y : None
            Ignored.

        Returns
        -------
        self : DPLowRank

        Raises
        ------
        InvalidParameterError
            A parameter is out of range (before any data is read).
        BudgetExceededError
            The release does not fit the dataset's ledger; nothing read.

        Notes
        -----
        Privacy. One (epsilon, delta)-DP release, as :func:`factorize`.
        """
        params, options, runtime, seed = self._release_values()
        X = _validate_fit_input(self, X, min_samples=2)
        f = release_factorization(X, params, options, runtime, seed=seed)
        self.U_ = np.asarray(f.U)
        self.S_ = np.asarray(f.S)
        self.V_ = np.asarray(f.V)
        self.components_ = np.ascontiguousarray(self.V_.T)
        self.n_components_ = int(self.V_.shape[1])
        self.n_features_in_ = int(self.V_.shape[0])
        self._n_features_out = self.n_components_
        self.privacy_report_ = f.report
        return self

    def transform(self, X: Any) -> Any:
        """Project ``X`` on the released right factor: ``X @ V_``.

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)

        Returns
        -------
        ndarray (or dask array) of shape (n_samples, n_components), float64
            NaN in a row of ``X`` gives NaN in that row of the output.
        """
        check_is_fitted(self, "V_")
        X = _validate_transform_input(self, X, allow_nan=True)
        return X @ self.V_

    def inverse_transform(self, X: Any) -> Any:
        """Map projections back: ``X @ V_.T``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self, "V_")
        if _input_kind(X) != "dask":
            X = np.asarray(X, dtype=np.float64)
        return X @ self.V_.T
