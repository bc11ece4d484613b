"""Clipping of each individual's contribution before anything touches the data.

Privacy units on a full matrix ``A`` (n_rows, n_cols) [spec sketch-lrf 1.3, rule 6]:

* ``row``: individual i owns row i; rows are rescaled to ``||a_i||_2 <= C``;
* ``column``: the same for columns;
* ``entry``: individual (i, j) owns one cell; entries are clipped to ``|a_ij| <= C``.

In every case two neighbouring matrices differ by ``E`` with ``||E||_F <= C``
(add/remove) or ``<= 2C`` (replace one), which is the ``Delta_F`` of calibration.
These kernels draw no randomness and are safe to run per chunk: a row's scale factor
depends on the whole row, so callers reduce sums of squares across column chunks
first (:func:`scale_factors_from_sumsq`). The kernels the per-chunk sketches apply to
every block (:class:`ClipSpec`, :func:`scale_factors_from_sumsq`,
:func:`zero_non_finite`, :func:`clip_by_peak`) live in :mod:`pipeline.linalg.clipping`,
below :mod:`pipeline.sketches`, and are re-exported here.
"""

from __future__ import annotations

import numpy as np

from pipeline._types import FloatArray
from pipeline.linalg.clipping import (
    ClipSpec,
    clip_by_peak,
    scale_factors_from_sumsq,
    zero_non_finite,
)

__all__ = [
    "ClipSpec",
    "clip_by_peak",
    "clip_entries",
    "clip_rows",
    "scale_factors_from_sumsq",
    "zero_non_finite",
]


def clip_rows(block: FloatArray, bound: float) -> FloatArray:
    """``block`` in float64 with every row rescaled to norm ``<= bound``.

    Sketch-space clipping of a range sketch ``Y = X Phi`` (rows of ``X``
    already clipped, so every entry is finite and no square overflows).

    Parameters
    ----------
    block : ndarray of shape (r, d)
    bound : float
        ``> 0``.

    Returns
    -------
    ndarray of shape (r, d)
        A new array when a row is clipped, else ``block`` itself (as float64);
        ``block`` is never modified, and rows within ``bound`` are unchanged
        bit for bit.

    Notes
    -----
    Privacy. After it, one row of the sketch moves by at most ``bound`` when
    its individual is added or removed (``2 bound`` when replaced), whatever
    the operator that made it: the bound needs no tail event and holds for a
    public operator too.

    Examples
    --------
    >>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).round(6).tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    x = np.asarray(block, dtype=np.float64)
    scale = scale_factors_from_sumsq(np.einsum("ij,ij->i", x, x), bound)
    big = np.flatnonzero(scale < 1.0)
    if big.size == 0:
        return x
    x = x.copy()
    x[big] *= scale[big, None]
    return x


def clip_entries(block: FloatArray, clip_norm: float) -> FloatArray:
    """Clip every entry to ``[-C, C]`` (privacy unit ``entry``).

    Parameters
    ----------
    block : ndarray of shape (n_rows_block, n_cols_block)
        A chunk of ``A``.
    clip_norm : float
        The clip norm ``C > 0``.

    Returns
    -------
    ndarray of shape (n_rows_block, n_cols_block)

    Notes
    -----
    Privacy. One individual owns one cell, so neighbours differ by ``|e| <= C``
    (add/remove) in Frobenius norm [spec 1.3].

    Examples
    --------
    >>> clip_entries(np.array([[3.0, -0.5]]), 1.0).shape
    (1, 2)
    """
    return np.clip(block, -clip_norm, clip_norm)
