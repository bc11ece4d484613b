"""Keyed sparse sign operators: the fast co-range sketch.

Problem. In Spectral-LRF the co-range sketch ``S A`` (v x n) costs ``2 m n v`` flops
with a dense Gaussian ``S``, and generating ``S`` costs ``m v`` normal draws -- for
the default ``v = 6t + 1`` that is most of a non-private pass, and the factorization
regenerates ``S`` once more for ``S U``.

Solution [TYUC19, section 3.3; spec sketch-lrf 5.3]. A *sparse sign* operator has, for
every data index ``i``, exactly ``zeta`` non-zero entries ``+-1/sqrt(zeta)`` in
``zeta`` distinct coordinates chosen uniformly at random, with independent random
signs (a sparse Johnson-Lindenstrauss transform / OSNAP with ``zeta`` non-zeros per
column). Applying it to a dense block costs ``zeta`` multiply-adds per entry instead
of ``2v``; generating it costs ``zeta`` small integers per index instead of ``v``
normals. With ``zeta = 8`` it behaves like a Gaussian embedding in practice
[TYUC19, section 7], which our accuracy tests check on the spectra of the
acceptance criteria.

Like :class:`~pipeline.sketches.gaussian.GaussianOperator`, the operator is defined
along the data axis in fixed tiles drawn from ``Philox(SeedSequence(root,
spawn_key=(code, g)))``, so results do not depend on the chunking or on the number
of workers, and any row can be regenerated on any worker.

Privacy. Every row of the operator has norm exactly 1, for every draw, so ``S``
applied along the axis where one individual's data lies in one index (one row of
the sketched matrix) moves the sketch by exactly that individual's norm: no
``Delta_JL`` factor and no share of delta [private-lrf-2, 2].
:func:`pipeline.algorithms.lrf.plan.sparse_is_exact` says where that holds; elsewhere
a private plan keeps a Gaussian ``S`` and refuses an explicit sparse one.

References
----------
.. [TYUC19] J. A. Tropp, A. Yurtsever, M. Udell, V. Cevher, "Streaming low-rank
   matrix approximation with an application to scientific simulation", SIAM J. Sci.
   Comput. 41(4), 2019, arXiv:1902.08651.
.. [KN14] D. M. Kane, J. Nelson, "Sparser Johnson-Lindenstrauss transforms",
   J. ACM 61(1), 2014.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from pipeline._sealed import Sealed, unseal
from pipeline._types import FloatArray, IntArray
from pipeline.linalg import compiled
from pipeline.params import DEFAULT_TILE_SIZE
from pipeline.sketches.gaussian import tile_groups

#: Non-zeros per data index [TYUC19, section 3.3 recommends 8].
DEFAULT_NNZ = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class SparseSignOperator:
    """Description of one sparse sign operator; cheap to pickle.

    The operator is the array ``G`` of shape (length, dim) whose row ``i`` holds
    ``min(nnz, dim)`` entries ``+-1/sqrt(min(nnz, dim))`` in distinct columns, so
    every row has Euclidean norm exactly 1 (the analogue of the N(0, 1/dim)
    normalisation of the Gaussian operators: ``E[G^T G] = (length/dim) I``).

    Parameters
    ----------
    root : int or Sealed
        128-bit sketch seed (a sealed reference on a cluster).
    code : int
        Stream identifier; must differ from every other operator's under ``root``.
    length : int
        Length of the data axis.
    dim : int
        Sketch dimension d.
    nnz : int
        Non-zeros per data index, ``zeta`` (capped at ``dim``).
    tile_size : int
        Rows per generation tile.
    """

    root: int | Sealed
    code: int
    length: int
    dim: int
    nnz: int = DEFAULT_NNZ
    tile_size: int = DEFAULT_TILE_SIZE

    def __repr__(self) -> str:
        return (
            f"SparseSignOperator(code={int(self.code)}, length={self.length}, "
            f"dim={self.dim}, nnz={self.nnz}, tile_size={self.tile_size})"
        )

    @property
    def zeta(self) -> int:
        """Non-zeros actually placed per data index."""
        return min(self.nnz, self.dim)

    def structure(self, start: int, stop: int) -> tuple[IntArray, FloatArray]:
        """Columns (stop - start, zeta) and values (same shape) of rows ``start:stop``."""
        if not 0 <= start <= stop <= self.length:
            raise ValueError(
                f"block [{start}, {stop}) is outside the operator's data axis "
                f"[0, {self.length})."
            )
        b, z = self.tile_size, self.zeta
        cols = np.empty((stop - start, z), dtype=np.int64)
        vals = np.empty((stop - start, z), dtype=np.float64)
        if stop > start:
            for g in range(start // b, (stop - 1) // b + 1):
                lo, hi = max(start, g * b), min(stop, (g + 1) * b)
                tc, tv = sparse_tile(self, g)
                cols[lo - start : hi - start] = tc[lo - g * b : hi - g * b]
                vals[lo - start : hi - start] = tv[lo - g * b : hi - g * b]
        return cols, vals

    def block(self, start: int, stop: int, dtype: type = np.float64) -> FloatArray:
        """Rows ``start:stop`` of ``G`` as a dense array of shape (stop - start, dim)."""
        cols, vals = self.structure(start, stop)
        out: FloatArray = np.zeros((stop - start, self.dim), dtype=dtype)
        np.put_along_axis(out, cols, vals.astype(dtype, copy=False), axis=1)
        return out

    def rows(self, index: IntArray, dtype: type = np.float64) -> FloatArray:
        """Rows ``index`` of ``G`` (any order, repeats allowed), dense."""
        out: FloatArray = np.zeros((np.size(index), self.dim), dtype=dtype)
        for g, sel, local in tile_groups(index, self.length, self.tile_size):
            tc, tv = sparse_tile(self, g)
            out[sel[:, None], tc[local]] = tv[local]
        return out

    def dense(self) -> FloatArray:
        """The whole operator ``G`` of shape (length, dim); for tests and small sizes."""
        return self.block(0, self.length)

    def left_block(
        self, start: int, stop: int, dtype: type = np.float64
    ) -> sp.csc_array:
        """``G[start:stop].T`` (dim, stop - start) in CSC form (column j = row j of G),
        to multiply blocks with."""
        cols, vals = self.structure(start, stop)
        n, z = cols.shape
        indptr = np.arange(0, n * z + 1, z, dtype=np.int64)
        return sp.csc_array(
            (vals.astype(dtype, copy=False).ravel(), cols.ravel(), indptr),
            shape=(self.dim, n),
        )

    def left(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``G[start:stop].T @ x`` of shape (dim, x.shape[1]); ``x`` has stop - start rows.

        Costs ``zeta`` multiply-adds per entry of ``x`` (scipy's sparse-dense
        product), against ``2 dim`` for a dense operator.
        """
        g_t = self.left_block(start, stop, dtype)
        return np.asarray(g_t @ np.asarray(x, dtype=dtype))

    def right(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``x @ G[start:stop]`` of shape (x.shape[0], dim); ``x`` has stop - start columns."""
        g_t = self.left_block(start, stop, dtype)
        # (G^T x^T)^T: the CSC product streams over the rows of x^T = columns of x
        return np.asarray(g_t @ np.asarray(x, dtype=dtype).T).T


def sparse_tile(op: SparseSignOperator, tile: int) -> tuple[IntArray, FloatArray]:
    """Tile ``tile`` of ``op``: columns and values, each of shape (tile_size, zeta).

    Each row's ``zeta`` columns are drawn uniformly with replacement and the rows
    that came out with a repeated column are drawn again, in a fixed order, until
    none does: conditioned on being distinct, the ``zeta``-tuple is uniform over
    all distinct tuples, so the set is a uniform ``zeta``-subset. (At zeta = 8,
    dim = 181 about 15% of rows need a second draw.) Deterministic in (root,
    code, tile, tile_size, dim, zeta) for a fixed NumPy version.
    """
    seq = np.random.SeedSequence(
        entropy=int(unseal(op.root)), spawn_key=(int(op.code), tile)
    )
    rng = np.random.Generator(np.random.Philox(seq))
    b, z, d = op.tile_size, op.zeta, op.dim
    cols = rng.integers(0, d, size=(b, z), dtype=np.int64)
    # the compiled check where this process already loaded the compiled loops,
    # else numpy's: the same rows either way, so the same draws
    repeats = compiled.repeated_rows if compiled.loaded() else _repeated_rows
    redo = repeats(cols, np.arange(b, dtype=np.int64), d)
    while redo.size:
        cols[redo] = rng.integers(0, d, size=(redo.size, z), dtype=np.int64)
        redo = repeats(cols, redo, d)
    signs = rng.integers(0, 2, size=(b, z), dtype=np.int8)
    c = 1.0 / np.sqrt(z)
    vals: FloatArray = np.where(signs == 1, c, -c)  # the entries +-1/sqrt(zeta)
    return cols, vals


def _repeated_rows(cols: IntArray, rows: IntArray, dim: int) -> IntArray:
    """The rows of ``rows`` whose columns in ``cols`` repeat: two neighbours of
    the row's sorted copy are equal (no (rows, zeta^2) temporaries: they cost a
    worker fresh pages each tile); ``dim`` as for the compiled check."""
    sub = np.sort(cols[rows], axis=1)
    found: IntArray = rows[(sub[:, 1:] == sub[:, :-1]).any(axis=1)]
    return found


__all__ = ["DEFAULT_NNZ", "SparseSignOperator", "sparse_tile"]
