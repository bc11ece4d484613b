"""Norm clipping kernels shared by the per-chunk sketches and the mechanisms.

Each individual's vector (a row, a column, a cell) is rescaled to norm ``<= C``
before anything touches it [spec sketch-lrf 1.3, rule 6]; :mod:`pipeline.sketches`
applies these kernels to every block before a product, and
:mod:`pipeline.mechanisms.clipping` states the privacy units they serve. They draw no
randomness and are safe to run per chunk: a row's scale factor depends on the whole
row, so callers reduce sums of squares across column chunks first
(:func:`scale_factors_from_sumsq`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray
from pipeline.linalg import compiled
from pipeline.linalg.compiled import COMPILED_ENTRIES, LANES, row_sumsq, scale_rows
from pipeline.params import ClipSpec, PrivacyUnit

__all__ = [
    "CLIP_SHRINK",
    "ClipSpec",
    "clip_by_peak",
    "dense_row_sumsq",
    "scale_factors_from_sumsq",
    "sparse_clip",
    "sparse_sumsq",
    "sparse_zero_non_finite",
    "stored_float",
    "zero_non_finite",
]


#: The factor by which a clip factor ``C / ||x||`` is shrunk: the clipped
#: vector's computed norm stays at or below ``C`` despite the roundings.
CLIP_SHRINK = 1.0 - 4.0 * np.finfo(np.float64).eps


def scale_factors_from_sumsq(sumsq: FloatArray, clip_norm: float) -> FloatArray:
    """Scale factors ``min(1, C / ||x||_2)`` from squared norms.

    Parameters
    ----------
    sumsq : ndarray of shape (n,)
        Squared L2 norms of the n rows (or columns), summed over all chunks.
    clip_norm : float
        The clip norm ``C > 0``.

    Returns
    -------
    ndarray of shape (n,)
        Factors in (0, 1]; zero vectors get 1.

    Notes
    -----
    Privacy. Multiplying row i by ``scale[i]`` makes ``||a_i||_2 <= C`` exactly
    (up to one rounding), so removing or replacing one row changes the matrix by
    at most ``C`` (``2C``) in Frobenius norm [spec 1.3, rule 6]. The factors are
    non-private statistics: they never leave the workers and are never logged.

    Examples
    --------
    >>> scale_factors_from_sumsq(np.array([0.0, 4.0, 0.25]), 1.0).shape
    (3,)
    """
    norms = np.sqrt(np.asarray(sumsq, dtype=np.float64))
    scale = np.ones_like(norms)
    big = norms > clip_norm
    # divide only where the norm exceeds C; zero rows keep factor 1
    scale[big] = clip_norm / norms[big]
    # guard against the one-ulp overshoot of C / ||x|| * x
    scale[big] *= CLIP_SHRINK
    return scale


def stored_float(x: Any) -> bool:
    """Whether the compiled dense loops read ``x`` as it is: a C-contiguous
    float32 or float64 matrix."""
    return x.dtype in (np.float32, np.float64) and bool(x.flags.c_contiguous)


def dense_row_sumsq(
    x: Any, *, fast: bool = False, into: FloatArray | None = None
) -> FloatArray:
    """Squared L2 norms of the rows of the dense matrix ``x``, in float64.

    One summation order, whatever computes it: :data:`LANES` running sums over
    the columns ``j = r (mod LANES)``, each in increasing ``j`` onto zero, added
    pairwise (``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))``), then the
    last ``n mod LANES`` squares in order. ``fast`` computes it in a compiled loop
    (:func:`pipeline.linalg.compiled.dense_row_sumsq`) when ``x`` is a
    C-contiguous float32 or float64 matrix (:func:`stored_float`), reading each
    entry once with no float64 copy: the same bits, so the choice is about
    speed alone. A squared norm is within ``gamma_n`` of the exact one either
    way (Higham, eq. 3.5). ``into``: a float64 array of ``x``'s shape that also
    receives ``x``'s values (the compiled loop copies each row while it is in
    the core's cache).

    Examples
    --------
    >>> dense_row_sumsq(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [25.0, 0.0]
    """
    rows, n = x.shape
    if fast and x.size and stored_float(x):
        return compiled.dense_row_sumsq(x, into)
    if into is not None:
        np.copyto(into, x, casting="unsafe")
    x64 = np.asarray(x if into is None else into, dtype=np.float64)
    body = n - n % LANES
    s = np.zeros(rows)
    with np.errstate(over="ignore", invalid="ignore"):  # inf or NaN: the caller's
        if body:
            sq = np.square(x64[:, :body]).reshape(rows, body // LANES, LANES)
            a = np.cumsum(sq, axis=1)[:, -1, :]  # each lane's sum, in order
            s = ((a[:, 0] + a[:, 1]) + (a[:, 2] + a[:, 3])) + (
                (a[:, 4] + a[:, 5]) + (a[:, 6] + a[:, 7])
            )
        for j in range(body, n):
            s = s + x64[:, j] * x64[:, j]
    return s


def zero_non_finite(block: FloatArray, unit: PrivacyUnit | None) -> FloatArray:
    """``block`` with every individual holding NaN or +-Inf set to zero.

    Parameters
    ----------
    block : ndarray of shape (r, d)
        A block of ``A`` (whole rows, whole columns or any part of them).
    unit : PrivacyUnit or None
        Whose data is zeroed: the row (``ROW``, and None: a run without a
        unit), the column (``COLUMN``) or the cell (``ENTRY``) holding a
        non-finite value. A block holding part of a row (column) zeroes that
        part; the caller zeroes the rest by its scale factor.

    Returns
    -------
    ndarray of shape (r, d)
        ``block`` itself when every entry is finite, else a new array.

    Notes
    -----
    Privacy. The one rule for non-finite input (docs/privacy.md): such an
    individual counts as a zero individual, silently, before clipping. Each
    individual's fate depends on its own values only, so neighbouring
    datasets stay neighbours; nothing is raised, counted or logged, since
    any of these would publish a data-dependent fact. Huge finite values
    (1e308) are not touched here: clipping scales them down.

    Examples
    --------
    >>> zero_non_finite(np.array([[1.0, np.nan], [2.0, 3.0]]), PrivacyUnit.ROW).tolist()
    [[0.0, 0.0], [2.0, 3.0]]
    """
    # the sum is finite only if every entry is (NaN and +-Inf propagate; +Inf and
    # -Inf make NaN): a finite total clears the block in one reduction, with no
    # block-sized temporary; an overflowing total takes the entry-wise check
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(block)
    if np.isfinite(total):
        return block
    bad = ~np.isfinite(block)
    if not bad.any():
        return block
    out = np.array(block, copy=True)
    if unit is PrivacyUnit.ENTRY:
        out[bad] = 0
    elif unit is PrivacyUnit.COLUMN:
        out[:, bad.any(axis=0)] = 0
    else:
        out[bad.any(axis=1)] = 0
    return out


def clip_by_peak(vectors: FloatArray, clip_norm: float) -> FloatArray:
    """Clip rows whose sum of squares overflows float64, to norm ``<= C``.

    Parameters
    ----------
    vectors : ndarray of shape (r, d)
        Rows (or transposed columns) with finite entries whose squared norm is
        ``inf`` in float64 (entries near 1e154 and beyond, up to the float max).
    clip_norm : float
        The clip norm ``C > 0``.

    Returns
    -------
    ndarray of shape (r, d)
        ``(x / peak) * C / ||x / peak||``, with ``peak = max_j |x_j|``: the same
        direction as ``x`` at norm ``C (1 - 4 eps)``. Rows holding Inf or NaN
        come out NaN: callers zero them first (:func:`zero_non_finite`).

    Notes
    -----
    Privacy. Without this, ``C / sqrt(inf) = 0`` zeroes such a row: still
    within ``C``, but not the clipping the release declares. Dividing by the
    peak first keeps the norm in [1, sqrt(d)], so nothing overflows or
    underflows [spec 1.3, rule 6].

    Examples
    --------
    >>> out = clip_by_peak(np.array([[3e300, 4e300]]), 1.0)
    >>> np.round(out, 6).tolist()
    [[0.6, 0.8]]
    """
    x = np.asarray(vectors, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        peak = np.abs(x).max(axis=1, keepdims=True)
        scaled = x / peak
        sn = np.sqrt(np.einsum("ij,ij->i", scaled, scaled))[:, None]
        out: FloatArray = scaled * (clip_norm * CLIP_SHRINK / sn)
        return out


# --------------------------------------------------------------------------
# Sparse (CSR) bands: the same rules on the stored entries, in O(non-zeros)
# --------------------------------------------------------------------------
def _owners(x: sp.csr_matrix, unit: PrivacyUnit | None) -> tuple[Any, int]:
    """Per stored entry, the index of the individual owning it, and their count:
    its row (``ROW``, None), its column (``COLUMN``); None for ``ENTRY``."""
    if unit is PrivacyUnit.COLUMN:
        return x.indices, x.shape[1]
    if unit is PrivacyUnit.ENTRY:
        return None, x.nnz
    rows = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
    return rows, x.shape[0]


def sparse_zero_non_finite(x: sp.csr_matrix, unit: PrivacyUnit | None) -> None:
    """Zero, in place, every individual of ``x`` holding NaN or +-Inf.

    The CSR analogue of :func:`zero_non_finite`: the
    row (``ROW``, None), the column (``COLUMN``: its part in this band; the caller
    zeroes the rest by its scale factor) or the entry (``ENTRY``). Implicit zeros
    are finite, so only ``x.data`` is looked at: O(nnz).

    Notes
    -----
    Privacy. The one rule for non-finite input (docs/privacy.md): such an
    individual counts as a zero individual, silently, before clipping; nothing
    is raised, counted or logged.
    """
    bad = ~np.isfinite(x.data)
    if not bad.any():
        return
    owner, count = _owners(x, unit)
    if owner is None:
        x.data[bad] = 0
        return
    hit = np.zeros(count, dtype=bool)
    hit[owner[bad]] = True
    x.data[hit[owner]] = 0


def _vector_factors(
    x: sp.csr_matrix, owner: Any, count: int, clip_norm: float
) -> tuple[FloatArray, list[tuple[Any, FloatArray]]]:
    """Per stored entry, the factor that clips its row (column) to norm ``<= C``.

    Each vector's norm needs only its stored entries. A vector whose squares
    overflow float64 gets the factor 1 here and its clipped entries
    (:func:`clip_by_peak` on its stored entries alone) in the returned list of
    ``(positions in x.data, values)``, as a dense block does.
    """
    data = np.asarray(x.data, dtype=np.float64)
    with np.errstate(over="ignore"):
        sumsq: FloatArray = np.asarray(
            np.bincount(owner, weights=data * data, minlength=count),
            dtype=np.float64,
        )
    huge = np.flatnonzero(np.isposinf(sumsq))
    sumsq[huge] = 0.0
    factors: FloatArray = scale_factors_from_sumsq(sumsq, clip_norm)[owner]
    fixes = []
    for v in huge:
        sel = np.flatnonzero(owner == v)
        fixes.append((sel, clip_by_peak(data[sel][None, :], clip_norm)[0]))
    return factors, fixes


def sparse_clip(
    x: sp.csr_matrix,
    clip: ClipSpec | None,
    row_scale: FloatArray | None = None,
    col_scale: FloatArray | None = None,
) -> None:
    """Clip the CSR band ``x`` in place for its privacy unit.

    Parameters
    ----------
    x : scipy.sparse.csr_matrix of shape (b_rows, b_cols)
        Finite values (:func:`sparse_zero_non_finite` first).
    clip : ClipSpec or None
        None: nothing to do (non-private).
    row_scale : ndarray of shape (b_rows,) or None
        Precomputed row factors (unit ``row``); None when the band spans all
        columns, so they come from its own rows.
    col_scale : ndarray of shape (b_cols,) or None
        Same for unit ``column``; None only when the band spans all rows.

    Notes
    -----
    Privacy. After it every individual's contribution has norm ``<= C``
    [spec 1.3, rule 6], as for a dense block
    (:func:`pipeline.sketches.apply.clip_block`): clipping an entry to ``[-C, C]``
    leaves implicit zeros at zero, and a row's or column's norm is that of its
    stored entries. The factors never leave this function.
    """
    if clip is None:
        return
    c = clip.clip_norm
    if clip.unit is PrivacyUnit.ENTRY:
        np.clip(x.data, -c, c, out=x.data)
        return
    given = row_scale if clip.unit is PrivacyUnit.ROW else col_scale
    if clip.unit is PrivacyUnit.ROW and _compiled_rows(x):
        _clip_rows_compiled(x, given, c)
        return
    owner, count = _owners(x, clip.unit)
    fixes: list[tuple[Any, FloatArray]] = []
    if given is not None:
        factors = np.asarray(given, dtype=np.float64)[owner]
    else:
        factors, fixes = _vector_factors(x, owner, count, c)
    x.data *= factors.astype(x.dtype, copy=False)
    for sel, values in fixes:
        x.data[sel] = values


def _compiled_rows(x: sp.csr_matrix) -> bool:
    """Whether ``x``'s rows are clipped by the compiled loops: a float64 band of
    at least :data:`~pipeline.linalg.compiled.COMPILED_ENTRIES` stored entries
    (the same bits as the numpy path, so the switch changes none)."""
    return bool(x.dtype == np.float64 and x.nnz >= COMPILED_ENTRIES)


def _clip_rows_compiled(
    x: sp.csr_matrix, given: FloatArray | None, clip_norm: float
) -> None:
    """The row branch of :func:`sparse_clip` by the compiled loops: the sums of
    squares in ``np.bincount``'s order, then each row scaled in place; a row
    whose squares overflow is clipped by its peak, as :func:`_vector_factors`."""
    fixes = []
    if given is None:
        sumsq = row_sumsq(x)
        huge = np.flatnonzero(np.isposinf(sumsq))
        sumsq[huge] = 0.0
        factors = scale_factors_from_sumsq(sumsq, clip_norm)
        for v in huge:
            sel = slice(int(x.indptr[v]), int(x.indptr[v + 1]))
            fixes.append((sel, clip_by_peak(x.data[sel][None, :], clip_norm)[0]))
    else:
        factors = np.asarray(given, dtype=np.float64)
    scale_rows(x, factors)
    for sel, values in fixes:
        x.data[sel] = values


def sparse_sumsq(x: sp.csr_matrix, axis: int) -> FloatArray:
    """Per row (axis 1) or column (axis 0) of the band: the sum of squares, the
    peak's binary exponent ``e``, the sum of squares of the entries scaled by
    ``2**-e`` and the number of NaN/Inf entries; shape (4, b_rows or b_cols).

    The sparse analogue of the dense norm pre-pass of the execution layer (same
    rows, same meaning): summed over bands, the first row gives the factors, the
    second and third the norm of a vector whose squares overflow, the fourth
    the non-finite vectors (factor 0). O(nnz + length).

    Notes
    -----
    Privacy. Non-private per-vector statistics: they are reduced into clip
    factors inside the trusted zone and never released or logged.
    """
    owner, count = _owners(x, PrivacyUnit.COLUMN if axis == 0 else PrivacyUnit.ROW)
    data = np.asarray(x.data, dtype=np.float64)
    bad = ~np.isfinite(data)
    n_bad = np.bincount(owner[bad], minlength=count).astype(np.float64)
    if bad.any():
        data = np.where(bad, 0.0, data)
    with np.errstate(over="ignore"):
        plain = np.bincount(owner, weights=data * data, minlength=count)
    peak = np.zeros(count)
    np.maximum.at(peak, owner, np.abs(data))
    _, e = np.frexp(peak)
    scaled = np.ldexp(data, -e[owner])
    return np.stack(
        [
            plain,
            e.astype(np.float64),
            np.bincount(owner, weights=scaled * scaled, minlength=count),
            n_bad,
        ]
    )
