"""Row preparation and the per-band kernels of the private PCA (run inside tasks).

Problem. Every statistic of the PCA is a sum over rows of a function of the
row, computed band by band where the data lives: rows are rescaled by the
public ``C`` and clipped to norm ``1 - 1e-9`` (NaN/Inf rows become zero rows,
silently; spec power-pca 1.4), then each band returns its Gram matrix, its
``X^T a_i a_i^T X`` sums or its clipped sums ``sum_i a_i Clip_R(a_i^T X B)``
for one or several trials. Nothing here draws noise or leaves the trusted
zone; the results are exact partial sums (wrapped in ``Secret`` by the
sources).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray

#: Rows are clipped to this norm: the 1e-9 slack absorbs rounding in the norm,
#: so that the analysed bound ``||a_i|| <= 1`` holds in floating point (spec 1.4).
ROW_CLIP = 1.0 - 1e-9
#: Same slack for the clip radius R of the power iterations (spec 2.0).
RADIUS_SLACK = 1.0 - 1e-9


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
        a: FloatArray = np.array(block, dtype=np.float64, copy=True)
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
    norms: FloatArray = np.sqrt(np.einsum("ij,ij->i", Y, Y))
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
    _clip_products(PT, scale, radii, k)
    if m <= _GEMV_COLS:
        ZT = np.empty((m, a.shape[1]))
        for j in range(m):
            np.matmul(PT[j], a, out=ZT[j])
        return ZT
    return PT @ a


def _clip_products(
    PT: FloatArray, scale: FloatArray | None, radii: FloatArray, k: int
) -> None:
    """``PT`` (k * n_trials, r) = ``(a X B)^T`` becomes, in place, the clipped and
    scaled ``(Clip_R((a X B) f) f)^T`` of every trial (:func:`_update_part`)."""
    r = PT.shape[1]
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

#: Rows of one partial Gram matrix inside a band, at least (the cache-sized
#: sub-block when that is larger: at most 32 columns, whose Gram is then formed
#: as before, bit for bit). Each partial costs a fresh d x d product and its
#: addition besides its r d^2 multiply-adds: with the 131-row sub-blocks of
#: 1000-column rows those overheads (page faults included, on workers whose
#: allocator returns every large block to the system) cost as much as the
#: products, and the Gram pass ran at 2x its floor. With 4096 rows the kernel
#: measured 0.16 s per 10000 x 1000 float32 band on one thread, against 0.15 s
#: for ``X^T X`` of the band in float64 and 0.45 s for 131-row partials.
#: The float64 buffer is then at most the band's own float64 size.
GRAM_ROWS = 4096


def band_pass(
    block: Any, kind: str, payload: Any, row_norm_bound: float, clip: bool
) -> FloatArray:
    """One band's exact partial statistic, in cache-sized sub-blocks of rows
    (of at least :data:`GRAM_ROWS` rows for the Gram matrix).

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
    if sp.issparse(block):
        return _sparse_band_pass(block, kind, payload, row_norm_bound, clip)
    x = np.asarray(block)
    n_rows, d = x.shape
    step = max(64, SUB_BLOCK_BYTES // (8 * max(d, 1)))
    if kind == "gram":
        step = max(step, GRAM_ROWS)
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
# Sparse (CSR) bands: the same statistics on the stored entries, O(non-zeros)
# --------------------------------------------------------------------------
def sparse_prep_factors(
    block: Any, row_norm_bound: float = 1.0, *, clip: bool = True
) -> tuple[sp.csr_matrix, FloatArray]:
    """:func:`prep_factors` of a sparse band: float64 CSR rows and factors ``f``.

    Parameters
    ----------
    block : scipy sparse matrix of shape (r, d)
        Full-width rows.
    row_norm_bound, clip
        As in :func:`prep_factors`.

    Returns
    -------
    a : scipy.sparse.csr_matrix of shape (r, d), float64
        A copy; rows holding NaN/Inf have their stored entries zeroed, rows
        needing the careful path (:func:`_prep_rows_careful`) are prepared in it.
    f : ndarray of shape (r,)
        The prepared rows are ``a * f[:, None]``, as for a dense band.

    Notes
    -----
    A row's norm, peak and clipping depend on its stored entries only, so the
    careful path runs on those (zero-padded to the longest such row), never on
    a dense row.
    """
    a = sp.csr_matrix(block, dtype=np.float64, copy=True)
    r = a.shape[0]
    rows = np.repeat(np.arange(r), np.diff(a.indptr))
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        sumsq = np.bincount(rows, weights=a.data * a.data, minlength=r)
        if clip and row_norm_bound >= _SMALL_C and sumsq.max(initial=0.0) < math.inf:
            return a, np.minimum(1.0 / row_norm_bound, ROW_CLIP / np.sqrt(sumsq))
        odd = np.flatnonzero(~(sumsq < math.inf))
        if odd.size:
            bad_rows = np.zeros(r, dtype=bool)
            bad_rows[rows[~np.isfinite(a.data)]] = True
            a.data[bad_rows[rows]] = 0.0
            sumsq[bad_rows] = 0.0
        if not clip:
            return a, np.ones(r)
        inv_c = 1.0 / row_norm_bound
        safe = (sumsq < math.inf) & ((sumsq >= _TINY) | (row_norm_bound >= _SMALL_C))
        f = np.ones(r)
        f[safe] = np.minimum(inv_c, ROW_CLIP / np.sqrt(sumsq[safe]))
        bad = np.flatnonzero(~safe)
        if bad.size:
            lengths = np.diff(a.indptr)[bad]
            pad = np.zeros((bad.size, int(lengths.max(initial=0))))
            cols = np.arange(pad.shape[1])
            mask = cols[None, :] < lengths[:, None]
            pos = a.indptr[bad][:, None] + cols[None, :]
            pad[mask] = a.data[pos[mask]]
            a.data[pos[mask]] = _prep_rows_careful(pad, row_norm_bound)[mask]
        return a, f


def _sparse_band_pass(
    block: Any, kind: str, payload: Any, row_norm_bound: float, clip: bool
) -> FloatArray:
    """:func:`band_pass` of a sparse band, in one piece and O(non-zeros).

    Gram: ``b^T b`` by scipy's sparse product (O(sum of squared row counts));
    products: ``(a X) f``, O(nnz k); update: ``a (X B)`` and ``a^T W`` as
    sparse-dense products, O(nnz k n_trials). Equal to the dense band's
    statistics up to the rounding of a different summation order.
    """
    a, f = sparse_prep_factors(block, row_norm_bound, clip=clip)
    if kind == "gram":
        b = sp.csr_matrix(a.multiply(f[:, None]))
        return np.asarray((b.T @ b).toarray())
    if kind == "products":
        P = np.asarray(a @ payload)
        P *= f[:, None]
        return np.asarray(P.T @ P)
    XBT, radii, k = update_factors(*payload)
    PT = np.ascontiguousarray(np.asarray(a @ XBT.T).T)
    _clip_products(PT, f, radii, k)
    # (PT a)^T = a^T PT^T: one sparse-dense product, (d, k * n_trials)
    return np.ascontiguousarray(np.asarray(a.T @ PT.T))
