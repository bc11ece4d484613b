"""Keyed Gaussian sketch operators on a canonical tile grid (spec section 5.4)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline._sealed import Sealed, derived, unseal
from pipeline._types import FloatArray, IntArray
from pipeline.params import DEFAULT_TILE_SIZE


class OperatorCode(enum.IntEnum):
    """Fixed stream identifiers: two operators never share a code under one root.

    Codes below 100 are sketch operators (root = sketch seed); noise streams use
    their own codes under a different, secret root (``pipeline.mechanisms.noise``).
    """

    PHI = 1
    S = 2
    PSI = 3
    T = 4
    PHI_C = 5
    T_PAD = 6
    # sparse sign versions of the co-range / core operators (non-private runs)
    S_SPARSE = 12
    T_SPARSE = 14
    T_PAD_SPARSE = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class GaussianOperator:
    """Description of one JL-normalised Gaussian operator; cheap to pickle.

    The operator is the array ``G`` of shape (length, dim) with i.i.d. N(0, 1/dim)
    entries, indexed along the data axis. ``Phi = G`` multiplies ``A`` from the
    right (data axis = columns of ``A``); ``S = G.T`` multiplies from the left
    (data axis = rows of ``A``).

    Parameters
    ----------
    root : int or Sealed
        128-bit sketch seed. Confidential until release [spec 4.6, item 4]; on a
        cluster it is a :class:`~pipeline._sealed.Sealed` reference, so that it
        never travels inside a task.
    code : OperatorCode
        Stream identifier of this operator.
    length : int
        Length of the data axis.
    dim : int
        Sketch dimension d; entries have variance ``1/dim``.
    tile_size : int
        Rows per generation tile.
    """

    root: int | Sealed
    code: int
    length: int
    dim: int
    tile_size: int = DEFAULT_TILE_SIZE

    def __repr__(self) -> str:
        # the root seed is confidential until release: keep it out of reprs, task
        # listings and logs
        return (
            f"GaussianOperator(code={int(self.code)}, length={self.length}, "
            f"dim={self.dim}, tile_size={self.tile_size})"
        )

    def block(self, start: int, stop: int, dtype: type = np.float64) -> FloatArray:
        """Rows ``start:stop`` of ``G``, of shape (stop - start, dim)."""
        return operator_block(self, start, stop, dtype=dtype)

    def rows(self, index: IntArray, dtype: type = np.float64) -> FloatArray:
        """Rows ``index`` of ``G`` (any order, repeats allowed), of shape (len, dim)."""
        return operator_rows(self, index, dtype=dtype)

    def dense(self) -> FloatArray:
        """The whole operator ``G`` of shape (length, dim); for tests and small sizes."""
        return operator_block(self, 0, self.length)

    def left_block(self, start: int, stop: int, dtype: type = np.float64) -> FloatArray:
        """``G[start:stop].T`` (dim, stop - start) in ``dtype``, to multiply blocks with."""
        return self.block(start, stop).astype(dtype, copy=False).T

    def left(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``G[start:stop].T @ x`` of shape (dim, x.shape[1]), computed in ``dtype``."""
        return self.left_block(start, stop, dtype) @ np.asarray(x, dtype=dtype)

    def right(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``x @ G[start:stop]`` of shape (x.shape[0], dim), computed in ``dtype``."""
        return np.asarray(x, dtype=dtype) @ self._right_block(start, stop, dtype)

    def right_block(
        self, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """Rows ``start:stop`` in ``dtype``: the block :meth:`right` multiplies by
        (kept between a worker's tasks, read-only, when small; see below)."""
        return self._right_block(start, stop, dtype)

    #: Largest operator block :meth:`right` keeps between tasks (bytes).
    RIGHT_CACHE_BYTES = 16 * 2**20

    def _right_block(self, start: int, stop: int, dtype: type) -> FloatArray:
        """Rows ``start:stop`` in ``dtype``; on a worker, generated once per job.

        Every row chunk of a pass multiplies its columns by the same rows of the
        operator, so they are kept with the job's secret (:func:`pipeline._sealed.derived`)
        when small enough, and read-only.
        """

        def make() -> FloatArray:
            block: FloatArray = self.block(start, stop).astype(dtype, copy=False)
            block.setflags(write=False)
            return block

        if (stop - start) * self.dim * np.dtype(
            dtype
        ).itemsize > self.RIGHT_CACHE_BYTES:
            return self.block(start, stop).astype(dtype, copy=False)
        key = (
            "right",
            int(self.code),
            self.length,
            self.dim,
            self.tile_size,
            start,
            stop,
            np.dtype(dtype).str,
        )
        return derived(self.root, key, make)


def operator_tile(op: GaussianOperator, tile: int) -> FloatArray:
    """Tile ``tile`` of ``op``: a full (tile_size, dim) float64 block.

    Deterministic in (root, code, tile, tile_size, dim) on any machine for a fixed
    NumPy version; ``Generator.standard_normal`` streams are not promised stable
    across NumPy releases (NEP 19), so reports record the NumPy version.
    """
    seq = np.random.SeedSequence(
        entropy=int(unseal(op.root)), spawn_key=(int(op.code), tile)
    )
    rng = np.random.Generator(np.random.Philox(seq))
    block = rng.standard_normal((op.tile_size, op.dim))
    # JL normalisation N(0, 1/d) is part of the privacy contract: the sensitivity
    # factor Delta_JL(d, beta) assumes exactly this variance [spec 5.3]
    block *= 1.0 / np.sqrt(op.dim)
    return block


def operator_block(
    op: GaussianOperator, start: int, stop: int, *, dtype: type = np.float64
) -> FloatArray:
    """Rows ``start:stop`` of ``op`` assembled from the tiles they overlap."""
    if not 0 <= start <= stop <= op.length:
        raise ValueError(
            f"block [{start}, {stop}) is outside the operator's data axis "
            f"[0, {op.length})."
        )
    b = op.tile_size
    first, last = start // b, (stop - 1) // b if stop > start else start // b - 1
    out: FloatArray = np.empty((stop - start, op.dim), dtype=dtype)
    for g in range(first, last + 1):
        lo, hi = max(start, g * b), min(stop, (g + 1) * b)
        out[lo - start : hi - start] = operator_tile(op, g)[lo - g * b : hi - g * b]
    return out


def tile_groups(
    index: IntArray, length: int, tile_size: int
) -> Iterator[tuple[int, IntArray, IntArray]]:
    """Row indices grouped by generation tile, after a range check.

    Yields ``(tile, positions, offsets)``: ``index[positions]`` are the requested
    rows that fall in ``tile``, at ``offsets`` within it. Each touched tile is
    yielded once, in increasing order.
    """
    index = np.asarray(index, dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= length):
        raise ValueError(
            f"row indices must be in [0, {length}); got indices outside it."
        )
    tiles = index // tile_size
    for g in np.unique(tiles):
        sel = np.flatnonzero(tiles == g)
        yield int(g), sel, index[sel] - g * tile_size


def operator_rows(
    op: GaussianOperator, index: IntArray, *, dtype: type = np.float64
) -> FloatArray:
    """Rows ``index`` of ``op``, generating each touched tile once."""
    out: FloatArray = np.empty((np.size(index), op.dim), dtype=dtype)
    for g, sel, local in tile_groups(index, op.length, op.tile_size):
        out[sel] = operator_tile(op, g)[local]
    return out
