"""Exact worst-case norms of one generated sketch operator, streamed tile by tile.

Problem. When the sketch seed is public, an adversary may choose the neighbouring
datasets after seeing the operators, so a sketch's L2 sensitivity is the
worst case over all differences of the actual operator ``G`` (length x dim), not a
tail bound for a fixed difference (spec private-lrf-2 section 3). Two norms of
``G`` cover every privacy unit:

* the spectral norm ``||G||_2 = sqrt(lambda_max(G^T G))``: the worst case of
  ``||x^T G||`` over unit vectors ``x`` along the data axis;
* the largest row norm ``max_i ||G[i, :]||``: the worst case when the difference
  touches one data index.

Method. The rows of ``G`` are regenerated in the operator's own tiles, with the
same keyed generator that the pass uses (so they are the same numbers), and
reduced as they come: the ``dim x dim`` Gram matrix ``sum_g G_g^T G_g`` and the
running maximum of the row norms. Memory is O(tile_size dim + dim^2) whatever the
length; work is ``length dim^2`` flops for the Gram matrix, ``length dim`` for
the row norms.

Rounding. The returned values are upper bounds of the norms of the operator as
stored in float64: each Gram entry is a dot product of length ``length`` whose
error is at most ``gamma_length`` times the dot product of the absolute values
[Hig02, eq. (3.5)], so the Gram matrix is off by at most ``gamma_length
trace(G^T G)`` in Frobenius norm, and the symmetric eigensolver adds a backward
error of order ``dim u lambda_max`` [Hig02, section 2.7; LAPACK dsyevd]. Both are
added before the square root.

References
----------
.. [Hig02] N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
   SIAM 2002.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.sketches.gaussian import GaussianOperator
from pipeline.sketches.sparse import SparseSignOperator

__all__ = ["OperatorNorms", "operator_norms"]

#: Unit roundoff of float64.
_U = float(np.finfo(np.float64).eps) / 2.0


def _gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)`` [Hig02, Lemma 3.1]."""
    ku = k * _U
    return ku / (1.0 - ku)


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorNorms:
    """Upper bounds (exact up to float64 rounding) of two norms of one operator ``G``.

    Attributes
    ----------
    spectral : float or None
        ``||G||_2``; None when it was not asked for.
    max_row : float or None
        ``max_i ||G[i, :]||`` over the data axis; None when not asked for.
    """

    spectral: float | None
    max_row: float | None


def operator_norms(
    op: GaussianOperator | SparseSignOperator, *, spectral: bool, max_row: bool
) -> OperatorNorms:
    """The spectral norm and/or the largest row norm of the generated operator.

    Parameters
    ----------
    op : GaussianOperator or SparseSignOperator
        With an integer root (the public seed).
    spectral, max_row : bool
        Which norms to compute.

    Returns
    -------
    OperatorNorms

    Notes
    -----
    A sparse sign operator has exactly ``zeta`` entries ``+-1/sqrt(zeta)`` per
    row, so its row norms are exactly 1 and are not generated (the same
    idealized numerics as the rest of the calibration). Everything else is
    generated tile by tile (module docstring).

    Examples
    --------
    >>> from pipeline.sketches.gaussian import OperatorCode
    >>> op = GaussianOperator(root=7, code=OperatorCode.PHI, length=300, dim=10, tile_size=64)
    >>> G = op.dense()
    >>> nm = operator_norms(op, spectral=True, max_row=True)
    >>> bool(np.linalg.norm(G, 2) <= nm.spectral <= np.linalg.norm(G, 2) * (1 + 1e-12))
    True
    """
    sparse_rows = isinstance(op, SparseSignOperator)
    need_rows = max_row and not sparse_rows
    gram = np.zeros((op.dim, op.dim)) if spectral else None
    row_sq = 0.0
    b = op.tile_size
    if spectral or need_rows:
        for start in range(0, op.length, b):
            block = op.block(start, min(op.length, start + b))
            if gram is not None:
                gram += block.T @ block
            if need_rows:
                row_sq = max(row_sq, float(np.einsum("ij,ij->i", block, block).max()))
    spec = None
    if gram is not None:
        lam = float(np.linalg.eigvalsh(gram)[-1])
        trace = float(np.trace(gram))
        spec = math.sqrt(lam + _gamma(op.length + 4 * op.dim) * trace)
    rows = None
    if max_row:
        rows = 1.0 if sparse_rows else math.sqrt(row_sq * (1.0 + _gamma(op.dim + 2)))
    return OperatorNorms(spectral=spec, max_row=rows)
