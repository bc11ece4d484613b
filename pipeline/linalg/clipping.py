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

import numpy as np

from pipeline._types import FloatArray
from pipeline.params import ClipSpec, PrivacyUnit

__all__ = ["ClipSpec", "clip_by_peak", "scale_factors_from_sumsq", "zero_non_finite"]


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
    scale[big] *= 1.0 - 4.0 * np.finfo(np.float64).eps
    return scale


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
        out: FloatArray = scaled * (
            clip_norm * (1.0 - 4.0 * np.finfo(np.float64).eps) / sn
        )
        return out
