"""Operator products with a sparse band, in O(non-zeros).

Problem. A band ``X`` (b x N) of a sparse matrix with ``z`` stored entries must be
multiplied by the sketch operators without forming the dense b x N block, at a
cost that grows with ``z``, not with ``b N`` (a sketch is dense, of course). Its
clipping is in :mod:`pipeline.linalg.clipping` (``sparse_clip``).

Kernels (``G`` an operator block of ``d`` columns, ``zeta`` non-zeros per row for a
sparse sign operator):

* :func:`sparse_right` ``X G``: ``2 z d`` flops (Gaussian or dense ``G``, scipy's
  sparse-dense product); for a sparse sign ``G``, :func:`sign_right`: ``z zeta``
  multiply-adds;
* :func:`sparse_left` ``G^T X``: the same counts (:func:`sign_left` for a sparse
  sign ``G``), plus writing the dense d x N result.

The sparse sign kernels write the dense result directly, with no sparse product
(scipy's sparse-sparse product sizes, then builds, a sparse result that is dense
here). :func:`sign_right` expands every stored entry ``x_ij`` of ``X`` into the
``zeta`` products ``x_ij G[j, t]`` of row ``j`` of ``G``, as a CSR matrix whose
duplicates scipy's ``toarray`` sums in C. :func:`sign_left` gathers the rows of
``[c X; -c X]`` (``c = 1/sqrt(zeta)``, the operator's one magnitude) that each
output row ``t`` receives -- ``X[i]`` for every ``(i, t)`` with ``G[i, t] = +c``,
``-X[i]`` for ``-c`` -- grouped by ``t`` (a stable radix sort of the operator's
columns), and lets scipy sum each group into the dense output row ``t``; a
product of at least :data:`~pipeline.linalg.compiled.COMPILED_TERMS` terms adds
the same terms in the same order in a compiled loop instead (the same bits, in
about half the time, without the expanded copies). Both
work in blocks of output rows of at most :data:`BLOCK_ENTRIES` expanded entries
(memory O(block), not O(z zeta)); :func:`sign_left` also goes through the band
in chunks of rows of :func:`default_chunk_nnz` stored entries (cache-sized, and
at least the output's size: each chunk after the first copies the output once),
adding each chunk's terms onto the running sums in order. So every output entry
is summed in the same order whatever the blocks and chunks: they change no bit
(the chunks follow the band's stored entries, the bits do not).

Rounding. Each entry of a product is a sum of at most K products (K the inner
dimension), formed in another order than a dense BLAS product of ``X.toarray()``;
both are within ``gamma_K |G|^T |X|`` of the exact value [Hig02, eq. (3.5)], so they
differ by at most ``2 gamma_K`` times that, entry by entry; the tests check it.
The sparse sign kernels form the products ``fl(G[i, t] x_ij)`` and add them in
increasing ``i`` (``j`` in stored order for :func:`sign_right`) onto zero, as the
sparse-sparse product did; the same computation on the same bytes gives the same
bits.

References
----------
.. [Hig02] N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
   SIAM 2002.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray, IntArray
from pipeline.linalg.compiled import COMPILED_TERMS, sign_csr_into
from pipeline.sketches.dense import DenseOperator
from pipeline.sketches.gaussian import GaussianOperator
from pipeline.sketches.sparse import SparseSignOperator

__all__ = [
    "BLOCK_ENTRIES",
    "CHUNK_NNZ",
    "default_chunk_nnz",
    "left_product",
    "sign_left",
    "sign_right",
    "sparse_left",
    "sparse_right",
]

#: Any operator a pass applies.
Operator = GaussianOperator | SparseSignOperator | DenseOperator

#: Expanded entries (stored entries times operator entries) per block of output
#: rows of the sparse sign kernels: about 6 MB of float64 values and int32
#: indices (cache-sized; larger blocks measured slower).
BLOCK_ENTRIES = 1 << 19

#: Stored entries of the band per chunk of its rows in :func:`sign_left`: 3 MB of
#: values and indices (twice that for ``[c X; -c X]``); chunks of a large band
#: measured 1.3x faster than one. A chunk after the first adds its sums onto a
#: copy of the output's rows, so by default a chunk holds at least as many stored
#: entries as the output has entries (:func:`default_chunk_nnz`): for a wide band
#: (N = 20000, d = 100) chunks of ``CHUNK_NNZ`` spent more time copying the
#: output than summing (a 10000 x 100000 band at density 0.002: 212 ms against
#: 82 ms).
CHUNK_NNZ = 1 << 18


def left_product(g_t: Any, x: Any) -> FloatArray:
    """``g_t @ x`` as a dense float array, for ``g_t`` (d, b) dense or sparse and
    ``x`` (b, N) sparse: O(nnz(x) d) or, for sparse ``g_t``, O(nnz(x) zeta)."""
    if sp.issparse(g_t):
        if g_t.format == "csc" and _one_magnitude(g_t.data):
            return _sign_left(g_t, sp.csr_array(x))
        # the operator in the band's format: scipy converts the right operand of
        # a product of two formats, the band (O(z)) where the operator costs
        # O(b zeta). Either way each entry sums over the band's rows in
        # increasing order: the same products in the same order, the same bits
        if g_t.format != x.format and x.format in ("csr", "csc"):
            g_t = g_t.asformat(x.format)
        return np.asarray((g_t @ x).toarray())
    # dense @ sparse as (x^T g_t^T)^T: scipy's sparse-dense kernel streams x once
    return np.ascontiguousarray(np.asarray(x.T @ np.asarray(g_t).T).T)


def default_chunk_nnz(d: int, n: int) -> int:
    """Stored entries per chunk of :func:`sign_left` for a (d, n) output: at least
    :data:`CHUNK_NNZ` and at least ``d n`` (from the shapes alone: a chunk size
    changes no bit, and never depends on the data)."""
    return max(CHUNK_NNZ, d * n)


def _one_magnitude(values: FloatArray) -> bool:
    """Whether all ``values`` (at least one) have the same absolute value."""
    return bool(values.size) and bool(np.all(np.abs(values) == abs(values[0])))


def _cuts(weights_cum: IntArray, limit: int) -> list[int]:
    """Boundaries ``0 = c_0 < c_1 < ... = n`` of blocks of lines whose weights
    (cumulated, length n + 1) sum to at most ``limit``, or one line each."""
    n = len(weights_cum) - 1
    cuts = [0]
    while cuts[-1] < n:
        lo = cuts[-1]
        hi = int(np.searchsorted(weights_cum, weights_cum[lo] + limit, side="right"))
        cuts.append(min(n, max(lo + 1, hi - 1)))
    return cuts


def sign_left(
    g_t: Any,
    x: Any,
    *,
    block_entries: int = BLOCK_ENTRIES,
    chunk_nnz: int | None = None,
) -> FloatArray:
    """``g_t @ x`` of shape (d, N) for a sparse sign block and a sparse band.

    Parameters
    ----------
    g_t : scipy.sparse CSC matrix or array of shape (d, b)
        ``G^T``: its stored values all have one magnitude ``c`` (signs free), as
        :meth:`SparseSignOperator.left_block` gives; column ``i`` is row ``i`` of
        ``G``.
    x : scipy.sparse matrix or array of shape (b, N)
        The band (CSR; another format is converted, O(nnz)).
    block_entries : int
        At most this many expanded entries (a stored entry of ``x`` times a
        stored entry of ``g_t`` in its row) per block of output rows, or one row.
    chunk_nnz : int or None
        At most this many stored entries of ``x`` per chunk of its rows, or one
        row; each chunk's sums are added onto the previous chunks'. None:
        :func:`default_chunk_nnz`.

    Returns
    -------
    ndarray of shape (d, N), the dtype of ``g_t.data * x.data``
        Entry ``(t, j)`` is ``sum_i fl(G[i, t] x_ij)``, added in increasing ``i``
        onto zero, whatever the blocks and chunks.
    """
    g = sp.csc_array(g_t)
    if g.nnz and not _one_magnitude(g.data):
        raise ValueError("the operator's values do not all have one magnitude.")
    return _sign_left(g, sp.csr_array(x), block_entries, chunk_nnz)


def _sign_left(
    g: Any,
    xr: Any,
    block_entries: int = BLOCK_ENTRIES,
    chunk_nnz: int | None = None,
) -> FloatArray:
    """:func:`sign_left` of a CSC ``g`` (values of one magnitude) and a CSR ``xr``."""
    (d, b), n = g.shape, xr.shape[1]
    if xr.shape[0] != b:
        raise ValueError(f"shapes {g.shape} and {xr.shape} do not multiply.")
    dtype = np.result_type(g.dtype, xr.dtype)
    out: FloatArray = np.zeros((d, n), dtype=dtype)
    if g.nnz == 0 or xr.nnz == 0:
        return out
    if _expanded_terms(g, xr) >= COMPILED_TERMS:
        # the same terms in the same order, added in one compiled loop
        sign_csr_into(out, xr, g)
        return out
    # int16 targets sort by radix (stable, linear)
    target = g.indices.astype(np.int16 if d < 2**15 else np.intp)
    if chunk_nnz is None:
        chunk_nnz = default_chunk_nnz(d, n)
    cuts = _cuts(xr.indptr - xr.indptr[0], chunk_nnz)
    for k, (r0, r1) in enumerate(itertools.pairwise(cuts)):
        _add_chunk(out, g, target, xr, (r0, r1), block_entries, onto=k > 0)
    return out


def _expanded_terms(g: Any, xr: Any) -> int:
    """Terms of ``g @ xr``: each row's stored entries times its operator entries."""
    return int(np.dot(np.diff(g.indptr), np.diff(xr.indptr)))


def _add_chunk(
    out: FloatArray,
    g: Any,
    target: IntArray,
    xr: Any,
    rows: tuple[int, int],
    block_entries: int,
    *,
    onto: bool,
) -> None:
    """Add ``G[r0:r1]^T X[r0:r1]`` onto ``out`` (write it when not ``onto``),
    each entry's terms in increasing row order after the running sum."""
    (r0, r1), n = rows, out.shape[1]
    p0, p1 = xr.indptr[r0], xr.indptr[r1]
    ptr = xr.indptr[r0 : r1 + 1] - p0
    # [c X; -c X]: row i + b is -c X[i]; fl(-c x) = -fl(c x) exactly
    c = np.abs(g.data[0]).astype(out.dtype)
    scaled = xr.data[p0:p1].astype(out.dtype, copy=False) * c
    both = sp.csr_array(
        (
            np.concatenate([scaled, -scaled]),
            np.concatenate([xr.indices[p0:p1], xr.indices[p0:p1]]),
            np.concatenate([ptr, ptr[1:] + (p1 - p0)]),
        ),
        shape=(2 * (r1 - r0), n),
    )
    # entry e of g: G[i_e, t_e] = +-c feeds output row t_e with the row source_e
    # of [c X; -c X]; the stable sort keeps increasing i within a target
    e0, e1 = g.indptr[r0], g.indptr[r1]
    t = target[e0:e1]
    order = np.argsort(t, kind="stable")
    per_col = np.diff(g.indptr[r0 : r1 + 1])
    negative = g.data[e0:e1] < 0
    source = (np.repeat(np.arange(r1 - r0), per_col) + (r1 - r0) * negative)[order]
    # the entries of target t are order[bounds[t]:bounds[t + 1]]
    bounds = np.zeros(out.shape[0] + 1, dtype=np.intp)
    np.cumsum(np.bincount(t, minlength=out.shape[0]), out=bounds[1:])
    expanded = np.concatenate([[0], np.cumsum(np.diff(both.indptr)[source])])
    for t0, t1 in itertools.pairwise(_cuts(expanded[bounds], block_entries)):
        picked = both[source[bounds[t0] : bounds[t1]]]
        grouped = sp.csr_array(
            (
                picked.data,
                picked.indices,
                picked.indptr[bounds[t0 : t1 + 1] - bounds[t0]],
            ),
            shape=(t1 - t0, n),
        )
        if onto:  # scipy adds the entries, in order, onto a copy of the sums
            out[t0:t1] = grouped + out[t0:t1]
        else:
            grouped.toarray(out=out[t0:t1])  # sums each group in order, onto zero


def sign_right(
    cols: IntArray,
    vals: FloatArray,
    x: Any,
    dim: int,
    *,
    block_entries: int = BLOCK_ENTRIES,
) -> FloatArray:
    """``x @ G`` of shape (b, dim) for a sparse band and a sparse sign block.

    Parameters
    ----------
    cols, vals : ndarray of shape (N, zeta)
        Row ``j`` of ``G`` (N, dim) holds ``vals[j]`` in the columns ``cols[j]``
        (distinct), as :meth:`SparseSignOperator.structure` gives.
    x : scipy.sparse matrix or array of shape (b, N)
        The band (CSR; another format is converted, O(nnz)).
    dim : int
        Columns of ``G``.
    block_entries : int
        At most this many expanded entries per block of rows of ``x``, or one row.

    Returns
    -------
    ndarray of shape (b, dim), the dtype of ``x.data * vals``
        Entry ``(i, t)`` is ``sum_j fl(x_ij G[j, t])``, added in the stored order
        of row ``i`` of ``x``.
    """
    xr = sp.csr_array(x)
    b, n = xr.shape
    if cols.shape != vals.shape or cols.shape[0] != n:
        raise ValueError(f"shapes {xr.shape} and {cols.shape} do not multiply.")
    zeta = cols.shape[1]
    dtype = np.result_type(xr.dtype, vals.dtype)
    out: FloatArray = np.zeros((b, dim), dtype=dtype)
    if xr.nnz == 0 or zeta == 0:
        return out
    for r0, r1 in itertools.pairwise(_cuts(xr.indptr * zeta, block_entries)):
        a, e = xr.indptr[r0], xr.indptr[r1]
        j = xr.indices[a:e]
        expanded = sp.csr_array(
            (
                (xr.data[a:e, None] * vals[j]).astype(dtype, copy=False).ravel(),
                cols[j].ravel(),
                (xr.indptr[r0 : r1 + 1] - a) * zeta,
            ),
            shape=(r1 - r0, dim),
        )
        expanded.toarray(out=out[r0:r1])  # sums the duplicates, in stored order
    return out


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
        cols, vals = op.structure(start, stop)
        return sign_right(cols, vals.astype(dtype, copy=False), x, op.dim)
    if isinstance(op, GaussianOperator):
        g = op.right_block(start, stop, dtype)
    else:
        g = op.block(start, stop, dtype)
    return np.asarray(x @ g)
