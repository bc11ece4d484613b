"""Coherence-adaptive DP PCA: Analyze Gauss and the private clipped power method.

Problem. ``A`` is an (n, d) matrix whose rows are individuals. Find ``X`` of
shape (d, k) with orthonormal columns whose span is close to ``span(V_k)``, the
top-k right singular subspace of ``A`` (uncentred PCA: the top eigenvectors of
``A^T A``), measured by ``sin theta_max = ||(I - X X^T) V_k||_2``, such that
releasing ``X`` is (epsilon, delta)-DP for neighbours that replace one row
(spec power-pca section 1.2).

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

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
.. [DTTZ14] Dwork, Talwar, Thakurta, Zhang. Analyze Gauss: optimal bounds for
   privacy-preserving principal component analysis. STOC 2014.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.linalg

from pipeline._types import FloatArray, Shape2D
from pipeline._validation import check_float_in_interval, check_int_in_range
from pipeline.errors import InvalidParameterError, PrivacyConfigError
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
    "eig_floor_inv_sqrt",
    "plan_pca",
    "prep_factors",
    "prep_rows",
    "qr_pos",
    "run_pca",
    "sym",
    "topk_eig",
]

#: Rows are clipped to this norm: the 1e-9 slack absorbs rounding in the norm,
#: so that the analysed bound ``||a_i|| <= 1`` holds in floating point (spec 1.4).
ROW_CLIP = 1.0 - 1e-9
#: Same slack for the clip radius R of the power iterations (spec 2.0).
RADIUS_SLACK = 1.0 - 1e-9
#: Eigenvalue floor of the non-private variant (only keeps B finite).
NONPRIVATE_GAMMA = 1e-12
#: Client memory allowed for the d x d Gram matrix before the two-pass route is used.
GRAM_CLIENT_BYTES = 4 * 2**30

METHODS = ("auto", "power", "analyze-gauss")
ROUTES = ("auto", "gram", "two-pass")


# --------------------------------------------------------------------------
# Exact aggregates
# --------------------------------------------------------------------------
class Secret:
    """An exact, non-private aggregate (e.g. ``A^T A``): usable, never shown.

    Its ``repr`` is redacted and it refuses to be pickled, so it cannot reach a
    log, an exception message, a file or a worker by accident (spec 1.4, rule 3).
    Only the mechanisms of :func:`run_pca` read :attr:`value`.
    """

    __slots__ = ("_value",)

    def __init__(self, value: FloatArray) -> None:
        self._value = value

    @property
    def value(self) -> FloatArray:
        return self._value

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value.shape)

    def __repr__(self) -> str:
        return f"Secret(<redacted>, shape={self.shape})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("exact aggregates are not serialisable; release them first.")


def _released(x: Any, name: str) -> FloatArray:
    """Guard for post-processing functions: they accept released values only."""
    if isinstance(x, Secret):
        raise TypeError(
            f"{name} must be a released (noisy) value; got an exact aggregate. "
            "Pass it through its Gaussian release first."
        )
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------
# Per-band kernels (run on workers; pure, deterministic, no randomness)
# --------------------------------------------------------------------------
def prep_rows(
    block: Any, row_norm_bound: float = 1.0, *, clip: bool = True
) -> FloatArray:
    """Rows of ``block`` in float64, rescaled by ``1/C`` and clipped to norm ``<= 1``.

    Parameters
    ----------
    block : array_like of shape (r, d)
        Full-width rows (a row's norm needs all of its columns).
    row_norm_bound : float
        Public bound ``C``: rows are divided by it before clipping.
    clip : bool
        False for the non-private variant: the float64 cast and the zeroing of
        non-finite rows only.

    Returns
    -------
    ndarray of shape (r, d)
        ``a_i min(1/C, (1 - 1e-9) / ||a_i||)``; rows with NaN or Inf are zero.
        Equal to ``a * f[:, None]`` for ``(a, f) = prep_factors(block, ...)``.

    Notes
    -----
    The norm of a row whose squares overflow (entries near 1e308) or underflow
    (with a tiny public ``C``) is computed with a per-row scaling, so such rows
    are clipped correctly, never zeroed, left unclipped or turned into Inf; and
    no floating-point warning escapes (it would tell a log which rows are
    extreme: a data-dependent side channel, spec 1.4).

    Examples
    --------
    >>> prep_rows(np.array([[3.0, 4.0], [0.3, 0.4], [np.nan, 1.0]])).round(6)
    array([[0.6, 0.8],
           [0.3, 0.4],
           [0. , 0. ]])
    """
    a, f = prep_factors(block, row_norm_bound, clip=clip)
    a *= f[:, None]
    return a


#: Below this public C, rows whose sum of squares underflows need the careful path.
_SMALL_C = 1e-100


def prep_factors(
    block: Any,
    row_norm_bound: float = 1.0,
    *,
    clip: bool = True,
    out: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Rows in float64 (non-finite rows zeroed) and per-row factors ``f``.

    The prepared rows of :func:`prep_rows` are ``a * f[:, None]``. The kernels
    take the pair, so that ``(a X) f`` and ``a^T (W f)`` replace a scaled copy
    of the band (one pass over it fewer per task); mathematically identical.

    Parameters
    ----------
    block, row_norm_bound, clip
        As in :func:`prep_rows`.
    out : ndarray of shape (>= r, d), float64, or None
        Buffer for ``a`` (its first r rows are overwritten and returned). A
        kernel that reuses one buffer for all of its sub-blocks avoids a fresh
        allocation per sub-block: on workers whose allocator returns every
        large block to the system (Dask sets ``MALLOC_TRIM_THRESHOLD_``), each
        one costs page faults and zeroing, which measured about as much as the
        arithmetic of the update kernel itself.

    Returns
    -------
    a : ndarray of shape (r, d)
    f : ndarray of shape (r,)
        ``min(1/C, (1 - 1e-9) / ||a_i||)`` (1 for rows handled by the careful
        path, which prepares them in ``a`` directly).
    """
    if out is None:
        a = np.array(block, dtype=np.float64, copy=True)
    else:
        a = out[: len(block)]
        np.copyto(a, block, casting="unsafe")
    r = a.shape[0]
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        sumsq = np.vecdot(a, a)
        if clip and row_norm_bound >= _SMALL_C and sumsq.max(initial=0.0) < math.inf:
            # the common case, decided by one reduction: every row finite with a
            # finite sum of squares and C not tiny, so that the general test
            # below marks every row safe; rows of norm 0 get 1/C
            return a, np.minimum(1.0 / row_norm_bound, ROW_CLIP / np.sqrt(sumsq))
        # NaN/Inf rows have a NaN or Inf sum: look for them only among those rows
        odd = np.flatnonzero(~(sumsq < math.inf))
        if odd.size:
            nonfinite = odd[~np.isfinite(a[odd]).all(axis=1)]
            a[nonfinite] = 0.0
            sumsq[nonfinite] = 0.0
        if not clip:
            return a, np.ones(r)
        inv_c = 1.0 / row_norm_bound
        # a sum of squares below the smallest normal float is exact enough unless
        # C is tiny too (then the row may need clipping): careful path
        safe = (sumsq < math.inf) & ((sumsq >= _TINY) | (row_norm_bound >= _SMALL_C))
        if safe.all() and math.isfinite(inv_c):
            return a, np.minimum(inv_c, ROW_CLIP / np.sqrt(sumsq))
        f = np.ones(r)
        f[safe] = np.minimum(inv_c, ROW_CLIP / np.sqrt(sumsq[safe]))
        bad = np.flatnonzero(~safe)
        a[bad] = _prep_rows_careful(a[bad], row_norm_bound)
        return a, f


_TINY = float(np.finfo(np.float64).tiny)


def _prep_rows_careful(rows: FloatArray, row_norm_bound: float) -> FloatArray:
    """Prepared ``rows`` whose sum of squares over- or underflows, or when ``1/C`` does.

    The norm is kept as ``peak * sn`` (``peak = max_j |a_ij|``, ``sn`` the norm
    of the row divided by its peak, in [1, sqrt(d)]), which never overflows or
    underflows; a row is clipped iff ``sn > ROW_CLIP C / peak`` and becomes
    ``(a_i / peak) (ROW_CLIP / sn)``, else ``a_i / C``. Output norms are at
    most ``ROW_CLIP (1 + O(ulp))`` whatever the magnitudes. Called inside the
    caller's ``np.errstate``.
    """
    out = np.zeros_like(rows)
    peak = np.abs(rows).max(axis=1) if rows.size else np.zeros(rows.shape[0])
    nz = np.flatnonzero(peak > 0.0)  # all-zero rows stay zero
    if nz.size == 0:
        return out
    rows, peak = rows[nz], peak[nz]
    scaled = rows / peak[:, None]
    sn = np.sqrt(np.einsum("ij,ij->i", scaled, scaled))
    clipped = sn > (ROW_CLIP * row_norm_bound) / peak
    inv_c = 1.0 / row_norm_bound
    kept = rows * inv_c if math.isfinite(inv_c) else rows / row_norm_bound
    out[nz] = np.where(clipped[:, None], scaled * (ROW_CLIP / sn)[:, None], kept)
    return out


def band_gram(a: FloatArray, scale: FloatArray | None = None) -> FloatArray:
    """``b^T b`` for the prepared band ``b = a * scale[:, None]``, shape (d, d)."""
    if scale is not None:
        a = a * scale[:, None]
    return a.T @ a


def clip_rows(Y: FloatArray, radius: float) -> FloatArray:
    """``Clip_R`` on every row: ``y min(1, R / ||y||)``, with ``R (1 - 1e-9)``.

    Examples
    --------
    >>> clip_rows(np.array([[3.0, 4.0], [0.0, 0.0]]), 1.0).round(6)
    array([[0.6, 0.8],
           [0. , 0. ]])
    """
    if math.isinf(radius):
        return Y
    r = radius * RADIUS_SLACK
    norms = np.sqrt(np.einsum("ij,ij->i", Y, Y))
    return Y * (r / np.maximum(norms, r))[:, None]


def band_update(
    a: FloatArray,
    X: FloatArray,
    trials: Sequence[tuple[FloatArray, float]],
    scale: FloatArray | None = None,
) -> FloatArray:
    """One band's share of ``Z = sum_i a_i Clip_R(a_i^T X B)``, for several trials.

    Parameters
    ----------
    a : ndarray of shape (r, d)
        Prepared rows.
    X : ndarray of shape (d, k * n_trials)
        The trials' current iterates side by side.
    trials : sequence of (B, R)
        Per trial: preconditioner (k, k) and clip radius. Rows are clipped per
        trial block, never on the concatenation (spec 1.4, rule 6).
    scale : ndarray of shape (r,) or None
        Per-row factors: the prepared rows are ``a * scale[:, None]``
        (:func:`prep_factors`); ``(a X) scale`` and ``a^T (W scale)`` avoid a
        scaled copy of the band.

    Returns
    -------
    ndarray of shape (d, k * n_trials)
    """
    XBT, radii, k = update_factors(X, trials)
    return np.ascontiguousarray(_update_part(a, scale, XBT, radii, k).T)


def update_factors(
    X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
) -> tuple[FloatArray, FloatArray, int]:
    """Per-pass constants of :func:`band_update`, computed once per band.

    Returns
    -------
    XBT : ndarray of shape (k * n_trials, d)
        ``(X_t B_t)^T`` of every trial, stacked: ``a (X B)`` is one skinny
        product per row block instead of ``a X`` followed by ``(a X) B``.
    radii : ndarray of shape (n_trials,)
        The clip radii with their slack, ``R (1 - 1e-9)`` (inf: no clipping).
    k : int
        Columns per trial.
    """
    k = X.shape[1] // len(trials)
    XBT = np.empty((X.shape[1], X.shape[0]))
    for i, (B, _R) in enumerate(trials):
        XBT[i * k : (i + 1) * k] = (X[:, i * k : (i + 1) * k] @ B).T
    radii = np.array([float(R) * RADIUS_SLACK for _B, R in trials])
    return XBT, radii, k


#: Up to this many columns the skinny products run one matrix-vector product per
#: column: for the 2 columns of a rank-2 iterate on 64-column rows that measured
#: about 1.7x faster than one matrix-matrix product (whose kernels are tuned for
#: wider panels), and break-even near 4 columns.
_GEMV_COLS = 4


def _update_part(
    a: FloatArray,
    scale: FloatArray | None,
    XBT: FloatArray,
    radii: FloatArray,
    k: int,
    out: FloatArray | None = None,
) -> FloatArray:
    """``(a^T W)^T`` for one block of rows: :func:`band_update`, transposed.

    The per-row intermediates are kept transposed, shape (k * n_trials, r), so
    that the scalings and the clip run on contiguous rows and every trial is
    clipped with one set of vector operations. ``Clip_R(y) f`` equals
    ``y (c f)`` with ``c = min(1, R / ||y||)``; ``y = (a X B) f`` is formed
    first, as in :func:`clip_rows`, so that no product of two factors can
    underflow or overflow where the prepared rows do not. ``out``, of shape
    (k * n_trials, >= r), is a reusable buffer for the intermediates (see
    :func:`prep_factors`).
    """
    m, r = XBT.shape[0], a.shape[0]
    PT = np.empty((m, r)) if out is None else out[:, :r]
    if m <= _GEMV_COLS:
        for j in range(m):
            np.matmul(a, XBT[j], out=PT[j])
    else:
        np.matmul(XBT, a.T, out=PT)
    if scale is not None:
        PT *= scale
    P3 = PT.reshape(len(radii), k, r)
    norms = np.sqrt(np.einsum("tki,tki->ti", P3, P3))
    with np.errstate(divide="ignore"):
        # rows of norm 0, and R = inf, give inf / ... -> the factor 1: unclipped
        c = np.minimum(1.0, radii[:, None] / norms)
    if scale is not None:
        c *= scale
    P3 *= c[:, None, :]
    if m <= _GEMV_COLS:
        ZT = np.empty((m, a.shape[1]))
        for j in range(m):
            np.matmul(PT[j], a, out=ZT[j])
        return ZT
    return PT @ a


def band_products(
    a: FloatArray, X: FloatArray, scale: FloatArray | None = None
) -> FloatArray:
    """``(b X)^T (b X)`` for ``b = a * scale[:, None]``: one band's share of ``X^T A^T A X``."""
    P = a @ X
    if scale is not None:
        P *= scale[:, None]
    return P.T @ P


#: Bytes of float64 rows processed together inside a band (about the L2 cache):
#: the cast, the norms and both skinny products then run on cached data, which
#: measured 1.5x faster than whole-band arrays for 131072 x 64 bands.
SUB_BLOCK_BYTES = 2**20


def band_pass(
    block: Any, kind: str, payload: Any, row_norm_bound: float, clip: bool
) -> FloatArray:
    """One band's exact partial statistic, in cache-sized sub-blocks of rows.

    Parameters
    ----------
    block : array_like of shape (r, d)
        Raw full-width rows, as read.
    kind : {"gram", "products", "update"}
        :func:`band_gram`, :func:`band_products` (``payload`` = X) or
        :func:`band_update` (``payload`` = (X, trials)).
    row_norm_bound, clip
        As in :func:`prep_factors`.

    Returns
    -------
    ndarray
        The sum over the band's sub-blocks, in a fixed order (deterministic).
    """
    x = np.asarray(block)
    n_rows, d = x.shape
    step = max(64, SUB_BLOCK_BYTES // (8 * max(d, 1)))
    # one buffer per band for the float64 rows (and the update's intermediates),
    # reused by every sub-block (see prep_factors)
    buf = np.empty((min(step, n_rows), d))
    if kind == "update":
        XBT, radii, k = update_factors(*payload)
        pbuf = np.empty((XBT.shape[0], buf.shape[0]))
    total: FloatArray | None = None
    for start in range(0, max(n_rows, 1), step):
        a, f = prep_factors(x[start : start + step], row_norm_bound, clip=clip, out=buf)
        if kind == "gram":
            a *= f[:, None]
            part = band_gram(a)
        elif kind == "products":
            part = band_products(a, payload, f)
        else:
            part = _update_part(a, f, XBT, radii, k, out=pbuf)
        if total is None:
            total = part
        else:
            total += part
    assert total is not None
    # the update parts are summed transposed (see _update_part)
    return np.ascontiguousarray(total.T) if kind == "update" else total


# --------------------------------------------------------------------------
# Post-processing (released inputs only)
# --------------------------------------------------------------------------
def sym(G: FloatArray) -> FloatArray:
    """``(G + G^T) / 2``: isotropic noise on symmetric matrices (spec 3.2)."""
    return 0.5 * (G + G.T)


def topk_eig(M: Any, k: int) -> tuple[FloatArray, FloatArray]:
    """Top-k eigenvectors (d, k) and top k+1 eigenvalues of a released symmetric ``M``."""
    M = _released(M, "M")
    d = M.shape[0]
    lo = max(d - k - 1, 0)
    lam, Q = scipy.linalg.eigh(M, subset_by_index=[lo, d - 1])
    lam, Q = lam[::-1], Q[:, ::-1]
    return _sign_fix(Q[:, :k]), lam[: k + 1].copy()


def _sign_fix(X: FloatArray) -> FloatArray:
    """Flip columns so the largest-magnitude entry is positive (determinism only)."""
    idx = np.argmax(np.abs(X), axis=0)
    signs = np.sign(X[idx, np.arange(X.shape[1])])
    signs[signs == 0] = 1.0
    return X * signs


def eig_floor_inv_sqrt(H: Any, gamma: float) -> FloatArray:
    """``B = Q diag(max(lambda, gamma))^(-1/2) Q^T`` for the released ``H = Q diag(lambda) Q^T``."""
    H = _released(H, "H")
    lam, Q = np.linalg.eigh(H)
    lam = np.maximum(lam, gamma)
    return (Q / np.sqrt(lam)) @ Q.T


def qr_pos(Z: Any) -> FloatArray:
    """Orthonormal factor of the reduced QR of a released ``Z``, with ``diag(R) >= 0``."""
    Z = _released(Z, "Z")
    Q, R = np.linalg.qr(Z)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs


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
# Parameters and plan
# --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PcaParams:
    """Public parameters of one private PCA (all fixed before the data is read).

    Attributes
    ----------
    rank : int
        ``k``, ``1 <= k <= d``.
    epsilon, delta : float or None
        Budget (None only when ``private`` is False).
    method : {"auto", "power", "analyze-gauss"}
        ``"auto"`` picks one of the two (and ``T``, ``R``) from public
        quantities (:mod:`pipeline.algorithms.pca_auto`).
    iterations : int or None
        ``T`` for the power method (required; never chosen from the data).
    clip_radius : float or None
        ``R`` for the power method (required when private).
    accounting : {"gdp", "paper"}
        Exact Gaussian (GDP) calibration, or the paper's literal constants.
    sensitivity : {"tight", "paper"}
        The exact sensitivities (default) or [P]'s (Gram and ``H``: 2 instead
        of sqrt(2) under replacement; the same under add/remove).
    neighboring : {"add-remove", "replace"}
        One row present or zero (default, as ``factorize``), or replaced.
    init_fraction, h_fraction : float
        Budget split: initialisation vs iterations, ``H`` vs ``Z`` (spec 3.4).
    beta : float
        Failure probability of the utility analysis (sets ``gamma`` only).
    gamma_scale : float
        Public multiplier of the eigenvalue floor ``gamma``.
    row_norm_bound : float
        Public ``C``: rows are divided by it, then clipped to norm 1.
    route : {"auto", "gram", "two-pass"}
    private : bool
        False: no clipping, no noise, ``gamma`` tiny, ``R`` infinite unless
        given -- the classical block power method, for comparison only.
    """

    rank: int
    epsilon: float | None = None
    delta: float | None = None
    method: str = "auto"
    iterations: int | None = None
    clip_radius: float | None = None
    accounting: str = "gdp"
    sensitivity: str = "tight"
    neighboring: str = "add-remove"
    init_fraction: float = 0.5
    h_fraction: float = 0.5
    beta: float = 0.1
    gamma_scale: float = 1.0
    row_norm_bound: float = 1.0
    route: str = "auto"
    private: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaPlan:
    """Calibrated plan of a PCA run over an (n, d) matrix.

    ``calibration`` is None for the non-private variant. ``n_passes`` counts
    reads of A: 1 + T (Gram route) or 1 + 2T (two-pass route).
    """

    params: PcaParams
    shape: Shape2D
    route: str
    calibration: Any
    noise_init: float
    noise_H: float
    noise_Z: float
    gamma: float
    clip_radius: float
    n_passes: int
    auto: dict[str, Any] | None = None

    @property
    def iterations(self) -> int:
        return (
            0
            if self.params.method == "analyze-gauss"
            else int(self.params.iterations or 0)
        )


def _choice(value: Any, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidParameterError(
            f"{name} must be one of {', '.join(map(repr, allowed))}, got {name}={value!r}."
        )
    return str(value)


def plan_pca(params: PcaParams, shape: Shape2D) -> PcaPlan:
    """Validate ``params`` against the public ``shape`` and calibrate the noise.

    Raises
    ------
    InvalidParameterError
        Bad rank, method, iterations, clip radius or fractions.
    PrivacyConfigError
        Bad budget, or a paper-mode precondition that does not hold.
    """
    n, d = int(shape[0]), int(shape[1])
    if d < 2:
        raise InvalidParameterError(
            f"PCA needs at least 2 columns, got shape ({n}, {d})."
        )
    # k = d is allowed: the components are then an orthonormal basis ordered
    # by the released eigenvalues (eigenvalues has d entries, not k + 1)
    k = check_int_in_range(params.rank, "rank", 1, d, what="[1, n_features]")
    if _choice(params.method, "method", METHODS) == "auto":
        params, auto = _resolve_auto(params, (n, d))
        return dataclasses.replace(plan_pca(params, shape), auto=auto)
    method = params.method
    route = _choice(params.route, "route", ROUTES)
    _choice(params.neighboring, "neighboring", ("add-remove", "replace"))
    check_float_in_interval(params.row_norm_bound, "row_norm_bound", 0.0, math.inf)
    if route == "auto":
        route = "gram" if 8 * d * d <= GRAM_CLIENT_BYTES else "two-pass"
    T = 0
    if method == "power":
        if params.iterations is None:
            raise InvalidParameterError(
                "iterations must be given for method='power' (a public T, e.g. 3 to 10); "
                "it is never chosen from the data."
            )
        T = check_int_in_range(params.iterations, "iterations", 1, 10_000)
    elif params.iterations not in (None, 0):
        raise InvalidParameterError(
            f"iterations applies to method='power' only, got iterations={params.iterations!r} "
            "with method='analyze-gauss'."
        )
    passes = 1 + (T if route == "gram" else 2 * T)
    if not params.private and (params.epsilon is not None or params.delta is not None):
        raise PrivacyConfigError(
            "a non-private run takes no epsilon or delta; drop them or drop non-private "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    if not params.private:
        R = (
            math.inf
            if params.clip_radius is None
            else check_float_in_interval(
                params.clip_radius, "clip_radius", 0.0, math.inf
            )
        )
        return PcaPlan(
            params=params,
            shape=(n, d),
            route=route,
            calibration=None,
            noise_init=0.0,
            noise_H=0.0,
            noise_Z=0.0,
            gamma=NONPRIVATE_GAMMA,
            clip_radius=R,
            n_passes=passes,
        )
    from pipeline.accounting.pca import calibrate_pca

    if params.epsilon is None or params.delta is None:
        raise InvalidParameterError(
            "epsilon and delta are required for a private PCA "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    cal = calibrate_pca(
        epsilon=params.epsilon,
        delta=params.delta,
        rank=k,
        n_features=d,
        method=method,
        iterations=T if method == "power" else None,
        clip_radius=params.clip_radius if method == "power" else None,
        accounting=params.accounting,
        sensitivity=params.sensitivity,
        neighboring=params.neighboring,
        init_fraction=params.init_fraction,
        h_fraction=params.h_fraction,
        beta=params.beta,
        gamma_scale=params.gamma_scale,
    )
    return PcaPlan(
        params=params,
        shape=(n, d),
        route=route,
        calibration=cal,
        noise_init=cal.noise_init,
        noise_H=cal.noise_H or 0.0,
        noise_Z=cal.noise_Z or 0.0,
        gamma=cal.gamma if cal.gamma is not None else NONPRIVATE_GAMMA,
        clip_radius=cal.clip_radius if cal.clip_radius is not None else math.inf,
        n_passes=passes,
    )


def _resolve_auto(
    params: PcaParams, shape: Shape2D
) -> tuple[PcaParams, dict[str, Any]]:
    """``method="auto"`` replaced by the rule's method, ``T`` and ``R``."""
    from pipeline.algorithms.pca_auto import choose_method

    if not params.private:
        # the exact eigenvectors of A^T A, unless T is given for a power run
        method = "analyze-gauss" if params.iterations is None else "power"
        out = dataclasses.replace(params, method=method)
        return out, {"chosen": method, "rule": "non-private run"}
    if params.epsilon is None or params.delta is None:
        raise InvalidParameterError(
            "epsilon and delta are required for a private PCA "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    choice = choose_method(params, shape)
    out = dataclasses.replace(
        params, method=choice.method, iterations=choice.iterations,
        clip_radius=choice.clip_radius,
    )  # fmt: skip
    return out, choice.to_dict()


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


# --------------------------------------------------------------------------
# Private selection of (R, T) [P, Algorithms 4 and 5; spec 2.4, 2.5, 4.6]
# --------------------------------------------------------------------------
#: Trials advanced together in one pass (memory: r x k x this many doubles per task).
MAX_CONCURRENT_TRIALS = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectionResult:
    """Output of :func:`run_selection` (the winner only; nothing else about trials).

    Attributes
    ----------
    components : ndarray of shape (d, k)
    eigenvalues : ndarray of shape (k + 1,)
        Top eigenvalues of the released ``M``.
    clip_radius : float or None
        The selected ``R`` (from the public grid; None when Analyze Gauss, a
        candidate of the exhaustive selection, is selected).
    iterations : int
        The selected ``T`` (0 for Analyze Gauss: when it is selected, or when
        the warm-start gap test failed and ``X0`` is returned).
    gap : float
        The public score gap ``h`` (from released values only).
    n_passes : int
        Reads of A (trusted-zone information: it reveals the number of trials).
    releases, resumed : tuple of str
        Journal labels (trusted zone, for the same reason).
    """

    components: FloatArray
    eigenvalues: FloatArray
    clip_radius: float | None
    iterations: int
    gap: float
    n_passes: int
    releases: tuple[str, ...]
    resumed: tuple[str, ...]


def score_setup(
    eigenvalues: Any, noise_init: float, k: int, d: int, beta: float
) -> tuple[float, float, float]:
    """Public ``(a, b, h)`` of the score function from the released eigenvalues.

    ``eps_w = noise_init (2 sqrt(d) + sqrt(2 log(8 / beta)))`` bounds the noise
    of ``M`` in spectral norm w.p. ``1 - beta/8`` (Lemma 5);
    ``a = lam_{k+1} + eps_w``, ``b = lam_k - eps_w``, ``h = b - a`` [P, Alg. 4].
    """
    lam = _released(eigenvalues, "eigenvalues")
    eps_w = noise_init * (2.0 * math.sqrt(d) + math.sqrt(2.0 * math.log(8.0 / beta)))
    a = float(lam[k]) + eps_w
    b = float(lam[k - 1]) - eps_w
    return a, b, b - a


def score_basis(S: Secret, a: float, h: float) -> Secret:
    """``(W_+, D_+)`` with ``f_{a,b}(S) = W_+ diag(D_+) W_+^T`` (exact; a Secret).

    ``f(x) = min(1, max(0, (x - a) / h))`` by spectral calculus; only the
    eigenvectors with ``f > 0`` are kept (about k of them).
    """
    lam, W = np.linalg.eigh(S.value)
    f = np.clip((lam - a) / h, 0.0, 1.0)
    keep = f > 0.0
    return Secret(np.vstack([W[:, keep], f[keep][None, :]]))


def exact_score(X: FloatArray, basis: Secret) -> Secret:
    """``s(X) = ||(I - X X^T) f_{a,b}(S)||_2`` (exact; a Secret), in O(d r_F^2)."""
    packed = basis.value
    if packed.shape[1] == 0:
        return Secret(np.array(0.0))
    W, D = packed[:-1], packed[-1]
    R = (W - X @ (X.T @ W)) * D
    return Secret(np.array(np.linalg.norm(R, 2)))


def _draw_trials(key: NoiseKey | None, cal: Any) -> list[tuple[int, int]]:
    """Number of trials and each trial's grid point, before any data is read.

    ``N`` is geometric(theta) on {1, 2, ...} conditioned on ``N <= N_max`` (the
    cap is charged in the calibration, spec 3.5), drawn by inversion from the
    secret stream; grid points are uniform. All of it is data-independent.
    """
    from pipeline.mechanisms.noise import secret_generator

    if key is None:
        raise InvalidParameterError("private selection needs a noise key.")
    rng = secret_generator(key.derive("pca", "select"))
    theta, q = cal.theta, cal.truncation_q
    u = rng.random()
    n_trials = math.ceil(math.log1p(-u * (1.0 - q)) / math.log1p(-theta))
    n_trials = min(max(n_trials, 1), cal.max_trials)
    J, L = len(cal.radii), len(cal.iteration_grid)
    return [(int(rng.integers(J)), int(rng.integers(L))) for _ in range(n_trials)]


@dataclass(frozen=True, slots=True)
class _Trial:
    """One trial's public settings: requested and effective R, T, noises, floor."""

    radius: float | None
    r_eff: float
    T: int
    h_sigma: float
    z_sigma: float
    gamma: float


def _trials(key: NoiseKey | None, cal: Any) -> list[_Trial]:
    """The trials of a selection, fixed before any data is read.

    An exhaustive selection (a ``CandidateSelection``) runs each candidate
    once, in order; a random-stopping one (a ``SelectionCalibration``) draws
    ``N`` and the grid points from the secret stream (:func:`_draw_trials`).
    """
    if hasattr(cal, "candidates"):
        out = []
        for j, (R, T) in enumerate(cal.candidates):
            r = cal.radius_of(j)
            out.append(
                _Trial(R, r or 0.0, T, cal.h_noise(j),
                       cal.z_noise(j, r) if r else 0.0, cal.gamma_of(j) if T else 0.0)
            )  # fmt: skip
        return out
    out = []
    for j, l in _draw_trials(key, cal):
        R, T = float(cal.radii[j]), int(cal.iteration_grid[l])
        r = cal.effective_clip_radius(R, T)
        out.append(_Trial(R, r, T, cal.noise_iter(T), cal.noise_iter(T) * r, cal.gamma(T)))
    return out


def run_selection(
    source: RowSource,
    cal: Any,
    *,
    noise_key: NoiseKey | None,
    journal: ReleaseJournal | None = None,
    before_first_release: Callable[[], None] | None = None,
    on_step: Callable[[str], None] | None = None,
    max_concurrent_trials: int = MAX_CONCURRENT_TRIALS,
) -> SelectionResult:
    """Private PCA with private selection of ``(R, T)`` over public grids.

    Parameters
    ----------
    source : RowSource
    cal : SelectionCalibration
        From :func:`pipeline.accounting.pca.calibrate_selection`.
    noise_key : NoiseKey
    journal, before_first_release, on_step
        As in :func:`run_pca`. The journal of a selection run is secret (it
        holds non-selected trials, whose publication would void the analysis).
    max_concurrent_trials : int
        Trials advanced together in one pass. Trials are sorted by ``T`` and
        cut into batches of this size; a batch runs in lockstep (each trial
        leaves after its own ``T``), so passes = 1 + sum over batches of their
        largest ``T`` (1 + T_max when all trials fit one batch).

    Returns
    -------
    SelectionResult

    Notes
    -----
    Algorithm [P, App. C; spec 2.5, 4.6]: release ``M`` once (shared warm
    start); derive the public score gap ``h`` from its eigenvalues; if
    ``h <= 0`` return ``X0`` (post-processing only). Otherwise draw ``N`` and
    the trials' grid points, run every trial's power method in lockstep (per
    band, each trial block is clipped separately), release each trial's
    noisy score ``s(X) + score_noise(h) g`` and return the arg-min. The cost is
    the Papernot-Steinke random-stopping bound accounted in ``cal``.
    """
    if noise_key is None:
        raise InvalidParameterError("private selection needs a noise key.")
    max_concurrent_trials = check_int_in_range(
        max_concurrent_trials, "max_concurrent_trials", 1
    )
    d = source.shape[1]
    k = cal.rank
    rel = _Releases(source, noise_key, journal, before_first_release, on_step)
    release, exact_gram, say = rel.release, rel.gram, rel.say

    M = release("M", exact_gram, cal.noise_init, (d, d), True)
    X0, lam = topk_eig(M, k)
    a, _b, h = score_setup(lam, cal.noise_init, k, d, cal.beta)
    if not h > 0.0:
        say("warm-start gap test failed: returning the Analyze Gauss estimate")
        return SelectionResult(
            components=X0,
            eigenvalues=lam,
            clip_radius=None,
            iterations=0,
            gap=h,
            n_passes=rel.n_passes,
            releases=tuple(rel.labels),
            resumed=tuple(rel.resumed),
        )
    basis: list[Secret] = []

    def score_of(X: FloatArray) -> Callable[[], Secret]:
        def f() -> Secret:
            if not basis:
                basis.append(score_basis(exact_gram(), a, h))
            return Secret(np.atleast_2d(exact_score(X, basis[0]).value))

        return f

    trials = _trials(noise_key, cal)
    # Lockstep (spec 4.6): a batch's trials start together and each leaves after
    # its own T, so a batch costs max T passes; sorting by T keeps equal T together.
    # A trial with T = 0 is Analyze Gauss: X0, scored like the others.
    T_of = {i: trials[i].T for i in range(len(trials))}
    order = sorted(range(len(trials)), key=lambda i: (T_of[i], i))
    batches = [
        order[j : j + max_concurrent_trials]
        for j in range(0, len(order), max_concurrent_trials)
    ]
    best: tuple[float, int, FloatArray] | None = None
    for bno, batch in enumerate(batches):
        radii = {i: trials[i].r_eff for i in batch}
        Xs = {i: X0 for i in batch}
        T_max = max(T_of[i] for i in batch)
        for t in range(T_max):
            say(f"selection batch {bno + 1}/{len(batches)}: step {t + 1}/{T_max}")
            active = [i for i in batch if T_of[i] > t]
            Bs = {}
            for i in active:
                Xi = Xs[i]
                H = release(
                    f"H{i}_{t}",
                    lambda Xi=Xi: Secret(sym(Xi.T @ exact_gram().value @ Xi)),
                    trials[i].h_sigma,
                    (k, k),
                    True,
                )
                Bs[i] = eig_floor_inv_sqrt(H, trials[i].gamma)
            todo = [i for i in active if rel.journal.load(f"Z{i}_{t}") is None]
            exact_Z: dict[int, FloatArray] = {}
            if todo:  # one pass for every active trial (each block clipped on its own)
                Xcat = np.hstack([Xs[i] for i in todo])
                Zcat = source.power_step(Xcat, [(Bs[i], radii[i]) for i in todo]).value
                for j, i in enumerate(todo):
                    exact_Z[i] = Zcat[:, j * k : (j + 1) * k]
            for i in active:
                Z = release(
                    f"Z{i}_{t}",
                    lambda i=i, ez=exact_Z: Secret(ez[i]),
                    trials[i].z_sigma,
                    (d, k),
                    False,
                )
                Xs[i] = qr_pos(Z)
        for i in batch:
            s = float(
                release(f"s{i}", score_of(Xs[i]), cal.score_noise(h), (1, 1), False)[
                    0, 0
                ]
            )
            # post-processing of the noisy scores: a power trial must beat Analyze
            # Gauss by `margin` standard deviations of a difference of two scores
            s += getattr(cal, "margin", 0.0) * math.sqrt(2.0) * cal.score_noise(h) * (T_of[i] > 0)
            if best is None or (s, i) < (best[0], best[1]):
                best = (s, i, Xs[i])
    assert best is not None
    _, win, X = best
    return SelectionResult(
        components=X,
        eigenvalues=lam,
        clip_radius=trials[win].radius,
        iterations=trials[win].T,
        gap=h,
        n_passes=rel.n_passes,
        releases=tuple(rel.labels),
        resumed=tuple(rel.resumed),
    )


def default_selection_grids(
    n_rows: int, rank: int
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Public default grids of the selection (spec 7, D6), from ``n`` and ``k`` only.

    Radii: powers of two from [P]'s ``R_min = sqrt(k / n)`` up to the first one
    ``>= 1`` (at most 11 values; whitened rows rarely exceed norm 1 once ``B``
    is floored). Iterations: 1, 2, 4, 8, 16.
    """
    r_min = math.sqrt(rank / n_rows)
    J = min(10, max(0, math.ceil(math.log2(1.0 / r_min))))
    return tuple(r_min * 2.0**j for j in range(J + 1)), (1, 2, 4, 8, 16)
