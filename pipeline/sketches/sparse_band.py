"""Operator products with a sparse band, in O(non-zeros).

Problem. A band ``X`` (b x N) of a sparse matrix with ``z`` stored entries must be
multiplied by the sketch operators without forming the dense b x N block, at a
cost that grows with ``z``, not with ``b N`` (a sketch is dense, of course). Its
clipping is in :mod:`pipeline.linalg.clipping` (``sparse_clip``).

Kernels (``G`` an operator block of ``d`` columns, ``zeta`` non-zeros per row for a
sparse sign operator):

* :func:`sparse_right` ``X G``: ``2 z d`` flops (Gaussian or dense ``G``), ``2 z zeta``
  for a sparse sign ``G`` (scipy's sparse-sparse product);
* :func:`sparse_left` ``G^T X``: the same counts, plus writing the dense d x N result.

Rounding. Each entry of a product is a sum of at most K products (K the inner
dimension), formed in another order than a dense BLAS product of ``X.toarray()``;
both are within ``gamma_K |G|^T |X|`` of the exact value [Hig02, eq. (3.5)], so they
differ by at most ``2 gamma_K`` times that, entry by entry; the tests check it.

References
----------
.. [Hig02] N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
   SIAM 2002.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray
from pipeline.sketches.dense import DenseOperator
from pipeline.sketches.gaussian import GaussianOperator
from pipeline.sketches.sparse import SparseSignOperator

__all__ = ["left_product", "sparse_left", "sparse_right"]

#: Any operator a pass applies.
Operator = GaussianOperator | SparseSignOperator | DenseOperator


def left_product(g_t: Any, x: Any) -> FloatArray:
    """``g_t @ x`` as a dense float array, for ``g_t`` (d, b) dense or sparse and
    ``x`` (b, N) sparse: O(nnz(x) d) or, for sparse ``g_t``, O(nnz(x) zeta)."""
    if sp.issparse(g_t):
        # the operator in the band's format: scipy converts the right operand of
        # a product of two formats, the band (O(z)) where the operator costs
        # O(b zeta). Either way each entry sums over the band's rows in
        # increasing order: the same products in the same order, the same bits
        if g_t.format != x.format and x.format in ("csr", "csc"):
            g_t = g_t.asformat(x.format)
        return np.asarray((g_t @ x).toarray())
    # dense @ sparse as (x^T g_t^T)^T: scipy's sparse-dense kernel streams x once
    return np.ascontiguousarray(np.asarray(x.T @ np.asarray(g_t).T).T)


def sparse_left(
    op: Operator, x: Any, start: int, stop: int, dtype: type = np.float64
) -> FloatArray:
    """``G[start:stop].T @ x`` of shape (dim, N) for a sparse ``x`` (stop - start, N)."""
    return left_product(op.left_block(start, stop, dtype), x)


def sparse_right(
    op: Operator, x: Any, start: int, stop: int, dtype: type = np.float64
) -> FloatArray:
    """``x @ G[start:stop]`` of shape (b, dim) for a sparse ``x`` (b, stop - start).

    A Gaussian operator's block is the one its dense products use (generated once
    per job on a worker, :meth:`GaussianOperator.right_block`).
    """
    if isinstance(op, SparseSignOperator):
        return np.asarray((x @ op.left_block(start, stop, dtype).T).toarray())
    if isinstance(op, GaussianOperator):
        g = op.right_block(start, stop, dtype)
    else:
        g = op.block(start, stop, dtype)
    return np.asarray(x @ g)
