"""Coherence-adaptive DP PCA: Analyze Gauss and the private clipped power method.

Problem. ``A`` is an (n, d) matrix whose rows are individuals. Find ``X`` of
shape (d, k) with orthonormal columns whose span is close to ``span(V_k)``, the
top-k right singular subspace of ``A`` (uncentred PCA: the top eigenvectors of
``A^T A``), measured by ``sin theta_max = ||(I - X X^T) V_k||_2``, such that
releasing ``X`` is (epsilon, delta)-DP for neighbours that differ in one row:
present or a zero row (the default), or replaced by another; n is public under
both (spec power-pca section 1.2).

Method (spec sections 2.1-2.3).

1. Rows are clipped to norm ``<= 1 - 1e-9`` before anything touches them
   (after an optional public rescaling ``a_i / C``); a row holding NaN or Inf
   becomes the zero row -- silently, because raising or counting would be a
   data-dependent side channel (spec 1.4, rules 1-2).
2. Analyze Gauss [DTTZ14]: release ``M = A^T A + noise_init sym(G)`` and take
   its top-k eigenvectors ``X0``. Alone (with the whole budget) it is the
   baseline method ``"analyze-gauss"``.
3. The preconditioned clipped power method, ``t = 0 .. T-1``: release
   ``H = X^T A^T A X + noise_H sym(G_t)``; ``B = (H floored at gamma)^(-1/2)``;
   release ``Z = sum_i a_i Clip_R(a_i^T X B) + noise_Z R G~_t``; ``X = qr(Z)``.
   ``B`` whitens ``A X`` so that, near the answer, ``a_i^T X B ~ e_i^T U_k``,
   whose norm is at most ``sqrt(k) ||U||_inf``: on incoherent data a small
   clip radius ``R`` -- hence little noise -- suffices [P, section 3].

Everything data-derived that leaves :func:`run_pca` passes through exactly one
Gaussian release (``M``, ``H_t``, ``Z_t``) whose noise is drawn here, on the
reduced statistic, from the secret keyed generator of
:mod:`pipeline.mechanisms.noise`; ``B``, ``X`` and the eigenvalues are
post-processing of releases only. Exact aggregates travel inside
:class:`Secret` wrappers that refuse to be printed or pickled.

Passes over A: 1 (Gram) + T (one per iteration); the ``H`` releases are
computed on the client from the Gram matrix (spec 4.4). The ``"two-pass"``
route recomputes ``H`` from the data instead (1 + 2T passes) and never holds a
d x d matrix after the first step (spec 4.5).

This module holds the row sources, the release journals, the releases (keyed
noise, journal, the one charge) and :func:`run_pca`. One module per other
concern, whose names are re-exported here: :mod:`~pipeline.algorithms.pca_kernels`
(row preparation and per-band kernels), :mod:`~pipeline.algorithms.pca_linalg`
(secrets and the post-processing of releases), :mod:`~pipeline.algorithms.pca_plan`
(parameters and plan), :mod:`~pipeline.algorithms.pca_auto` (the ``auto`` rule)
and :mod:`~pipeline.algorithms.pca_select_run` (the private selection run).

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
.. [DTTZ14] Dwork, Talwar, Thakurta, Zhang. Analyze Gauss: optimal bounds for
   privacy-preserving principal component analysis. STOC 2014.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline._types import FloatArray, Shape2D
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey

__all__ = [
    "ArrayRowSource",
    "MemoryJournal",
    "PcaParams",
    "PcaPlan",
    "PcaRelease",
    "PcaResult",
    "ReleaseJournal",
    "RowSource",
    "Secret",
    "band_gram",
    "band_pass",
    "band_products",
    "band_update",
    "clip_rows",
    "default_selection_grids",
    "eig_floor_inv_sqrt",
    "plan_pca",
    "prep_factors",
    "prep_rows",
    "qr_pos",
    "run_pca",
    "run_selection",
    "sym",
    "topk_eig",
]


# One module per concern; their names stay importable from here.
from pipeline.algorithms.pca_kernels import (  # noqa: F401 - re-exported
    RADIUS_SLACK,
    ROW_CLIP,
    SUB_BLOCK_BYTES,
    band_gram,
    band_pass,
    band_products,
    band_update,
    clip_rows,
    prep_factors,
    prep_rows,
    update_factors,
)
from pipeline.algorithms.pca_linalg import (  # noqa: F401 - re-exported
    Secret,
    _released,
    eig_floor_inv_sqrt,
    qr_pos,
    sym,
    topk_eig,
)
from pipeline.algorithms.pca_plan import (  # noqa: F401 - re-exported
    GRAM_CLIENT_BYTES,
    METHODS,
    NONPRIVATE_GAMMA,
    ROUTES,
    PcaParams,
    PcaPlan,
    plan_pca,
)


# --------------------------------------------------------------------------
# Sources and journals
# --------------------------------------------------------------------------
class RowSource(Protocol):
    """A matrix read in full-width row bands; each call is one pass over it.

    Every band is prepared by :func:`prep_rows` inside the task that reads it;
    the sums are reduced in a fixed order, so results are reproducible.
    """

    @property
    def shape(self) -> Shape2D: ...

    n_passes: int

    def gram(self) -> Secret:
        """``sum_i a_i a_i^T`` of the prepared rows, shape (d, d)."""

    def products(self, X: FloatArray) -> Secret:
        """``(A X)^T (A X)``, shape (k', k') for ``X`` of shape (d, k')."""

    def power_step(
        self, X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
    ) -> Secret:
        """``sum_i a_i Clip_R(a_i^T X_j B_j)`` for every trial j, side by side."""


class ArrayRowSource:
    """In-memory reference :class:`RowSource` (one band = the whole matrix)."""

    def __init__(
        self, A: Any, *, row_norm_bound: float = 1.0, clip: bool = True
    ) -> None:
        self._A = np.asarray(A)
        self.row_norm_bound = float(row_norm_bound)
        self.clip = clip
        self.n_passes = 0

    @property
    def shape(self) -> Shape2D:
        return int(self._A.shape[0]), int(self._A.shape[1])

    def _pass(self, kind: str, payload: Any) -> Secret:
        self.n_passes += 1
        return Secret(band_pass(self._A, kind, payload, self.row_norm_bound, self.clip))

    def gram(self) -> Secret:
        return self._pass("gram", None)

    def products(self, X: FloatArray) -> Secret:
        return self._pass("products", X)

    def power_step(
        self, X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
    ) -> Secret:
        return self._pass("update", (X, list(trials)))


class ReleaseJournal(Protocol):
    """Write-ahead log of releases: a label is drawn and charged once, ever (spec 4.9)."""

    def load(self, label: str) -> FloatArray | None:
        """The released value recorded under ``label``, or None."""

    def record(self, label: str, value: FloatArray) -> None:
        """Durably record a release before it is used."""


class MemoryJournal:
    """A :class:`ReleaseJournal` held in memory (no crash recovery)."""

    def __init__(self) -> None:
        self.values: dict[str, FloatArray] = {}

    def load(self, label: str) -> FloatArray | None:
        v = self.values.get(label)
        return None if v is None else v.copy()

    def record(self, label: str, value: FloatArray) -> None:
        self.values[label] = np.array(value, copy=True)


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PcaResult:
    """Output of :func:`run_pca` (all of it released or derived from releases).

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal estimate of the top-k right singular subspace.
    eigenvalues : ndarray of shape (min(k + 1, d),)
        Top eigenvalues of the released ``M`` (noisy estimates of the top
        eigenvalues of ``A^T A`` of the clipped rows).
    n_passes : int
        Reads of A made by this run (resumed releases need none).
    releases : tuple of str
        Labels of the releases, in order.
    resumed : tuple of str
        Labels taken from the journal instead of being drawn.
    history : tuple of ndarray
        ``X`` after each iteration (``X0`` first); post-processing only.
    """

    components: FloatArray
    eigenvalues: FloatArray
    n_passes: int
    releases: tuple[str, ...]
    resumed: tuple[str, ...]
    history: tuple[FloatArray, ...] = field(repr=False, default=())


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaRelease:
    """A published private PCA.

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal columns spanning the private estimate of the top-k
        principal subspace (uncentred).
    eigenvalues : ndarray of shape (k + 1,)
        Top eigenvalues of the released noisy Gram matrix ``M`` (post-processing
        of a release; noisy estimates of the eigenvalues of ``A^T A``).
    report : dict
        Privacy report and run metadata.
    """

    components: FloatArray
    eigenvalues: FloatArray
    report: dict[str, Any] = field(default_factory=dict)


def _noise(
    key: NoiseKey | None, label: str, shape: tuple[int, int], symmetric: bool
) -> FloatArray:
    """Unit-scale noise of one release from its own keyed stream (zero when key is None)."""
    if key is None:
        return np.zeros(shape)
    G = GaussianNoise(
        key=key.derive("pca", label), sigma=1.0, length=shape[0], dim=shape[1]
    ).dense()
    return sym(G) if symmetric else G


class _Releases:
    """The releases of one run: journal lookups, the one charge, keyed noise, the Gram.

    Every data-derived value leaves through :meth:`release`: a label already in
    the journal is reused (no pass, no draw, no charge); otherwise the exact
    value is computed, the ledger hook runs once before the first draw, the
    keyed noise is added and the result is journaled before it is used.
    """

    def __init__(
        self,
        source: RowSource,
        noise_key: NoiseKey | None,
        journal: ReleaseJournal | None,
        before_first_release: Callable[[], None] | None,
        on_step: Callable[[str], None] | None,
    ) -> None:
        self.source = source
        self.noise_key = noise_key
        self.journal: ReleaseJournal = (
            journal if journal is not None else MemoryJournal()
        )
        self.before_first_release = before_first_release
        self.on_step = on_step
        self.passes0 = source.n_passes
        self.labels: list[str] = []
        self.resumed: list[str] = []
        self.charged = False
        self._gram: Secret | None = None

    def say(self, msg: str) -> None:
        if self.on_step is not None:
            self.on_step(msg)

    @property
    def n_passes(self) -> int:
        return self.source.n_passes - self.passes0

    def gram(self) -> Secret:
        """``A^T A`` of the clipped rows, symmetrised; one pass, at most once."""
        if self._gram is None:
            self.say("Gram pass: A^T A of the clipped rows")
            self._gram = Secret(sym(self.source.gram().value))
        return self._gram

    def release(
        self,
        label: str,
        exact: Callable[[], Secret],
        sigma: float,
        shape: tuple[int, int],
        symmetric: bool,
    ) -> FloatArray:
        self.labels.append(label)
        old = self.journal.load(label)
        if old is not None:
            self.resumed.append(label)
            return old
        value = exact().value
        if not self.charged and self.before_first_release is not None:
            self.before_first_release()
        self.charged = True
        noisy = value + sigma * _noise(self.noise_key, label, shape, symmetric)
        self.journal.record(label, noisy)
        return noisy


def run_pca(
    source: RowSource,
    plan: PcaPlan,
    *,
    noise_key: NoiseKey | None,
    journal: ReleaseJournal | None = None,
    before_first_release: Callable[[], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> PcaResult:
    """Run the planned PCA over ``source``.

    Parameters
    ----------
    source : RowSource
    plan : PcaPlan
        From :func:`plan_pca`.
    noise_key : NoiseKey or None
        The release's secret key; None only for a non-private plan.
    journal : ReleaseJournal or None
        Releases already recorded there are reused (never redrawn, their passes
        skipped); new ones are recorded before use. None keeps them in memory.
    before_first_release : callable or None
        Called once before the first new noise draw (charge the ledger there).
    on_step : callable or None
        Receives public progress messages (step names only).

    Returns
    -------
    PcaResult
    """
    if (plan.calibration is None) != (noise_key is None):
        raise InvalidParameterError(
            "a private plan needs a noise key and a non-private plan must not have one."
        )
    d = plan.shape[1]
    k = plan.params.rank
    rel = _Releases(source, noise_key, journal, before_first_release, on_step)
    release, exact_gram, say = rel.release, rel.gram, rel.say

    M = release("M", exact_gram, plan.noise_init, (d, d), True)
    X, lam = topk_eig(M, k)
    history = [X]
    for t in range(plan.iterations):
        say(f"power iteration {t + 1}/{plan.iterations}")
        Xc = X

        def h_exact(Xc: FloatArray = Xc) -> Secret:
            if plan.route == "gram":
                return Secret(sym(Xc.T @ exact_gram().value @ Xc))
            return Secret(sym(source.products(Xc).value))

        H = release(f"H{t}", h_exact, plan.noise_H, (k, k), True)
        B = eig_floor_inv_sqrt(H, plan.gamma)

        def z_exact(Xc: FloatArray = Xc, B: FloatArray = B) -> Secret:
            return source.power_step(Xc, [(B, plan.clip_radius)])

        Z = release(
            f"Z{t}",
            z_exact,
            plan.noise_Z * plan.clip_radius if plan.noise_Z else 0.0,
            (d, k),
            False,
        )
        X = qr_pos(Z)
        history.append(X)
    return PcaResult(
        components=X,
        eigenvalues=lam,
        n_passes=rel.n_passes,
        releases=tuple(rel.labels),
        resumed=tuple(rel.resumed),
        history=tuple(history),
    )


# The selection run (it uses this module's releases, so it is imported last).
from pipeline.algorithms.pca_select_run import (  # noqa: F401 - re-exported
    MAX_CONCURRENT_TRIALS,
    SelectionResult,
    _draw_trials,
    default_selection_grids,
    exact_score,
    run_selection,
    score_basis,
    score_setup,
)
