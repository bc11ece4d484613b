"""A public dense operator: a small matrix applied along one axis of the data.

Problem. The second pass of the two-pass factorization
(:mod:`pipeline.algorithms.lrf.two_pass`) multiplies ``X`` by ``V_k`` (N x k), a
matrix computed on the client from a noisy release. It is not generated from a
seed, so the keyed operators (:mod:`~pipeline.sketches.gaussian`,
:mod:`~pipeline.sketches.sparse`) cannot describe it.

Solution. :class:`DenseOperator` holds the matrix itself and offers the methods
of the keyed operators (``block``, ``rows``, ``dense``, ``left_block``, ``left``,
``right``) with the same meaning, so a
:class:`~pipeline.sketches.apply.PassRequest` takes it wherever it takes a
Gaussian operator. It is pickled into the pass's tasks: it must be public (it
carries no key and is never sealed). ``V_k`` is post-processing of a noisy
release, so it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline._types import FloatArray, IntArray


@dataclass(frozen=True, eq=False, slots=True)
class DenseOperator:
    """The operator ``G`` of shape (length, dim) given by its entries.

    Parameters
    ----------
    matrix : ndarray of shape (length, dim)
        The entries; copied, float64, read-only.

    Examples
    --------
    >>> op = DenseOperator(np.eye(3)[:, :2])
    >>> op.length, op.dim, op.right(np.ones((1, 3)), 0, 3).tolist()
    (3, 2, [[1.0, 1.0]])
    """

    matrix: FloatArray

    def __post_init__(self) -> None:
        m = np.array(self.matrix, dtype=np.float64, copy=True)
        if m.ndim != 2 or not np.isfinite(m).all():
            raise ValueError("a dense operator is a finite 2-D matrix.")
        m.setflags(write=False)
        object.__setattr__(self, "matrix", m)

    def __repr__(self) -> str:
        return f"DenseOperator(length={self.length}, dim={self.dim})"

    @property
    def length(self) -> int:
        """Length of the data axis."""
        return int(self.matrix.shape[0])

    @property
    def dim(self) -> int:
        """Sketch dimension d."""
        return int(self.matrix.shape[1])

    def block(self, start: int, stop: int, dtype: type = np.float64) -> FloatArray:
        """Rows ``start:stop`` of ``G``, of shape (stop - start, dim)."""
        if not 0 <= start <= stop <= self.length:
            raise ValueError(
                f"block [{start}, {stop}) is outside the operator's data axis "
                f"[0, {self.length})."
            )
        return self.matrix[start:stop].astype(dtype, copy=False)

    def rows(self, index: IntArray, dtype: type = np.float64) -> FloatArray:
        """Rows ``index`` of ``G`` (any order, repeats allowed)."""
        return self.matrix[np.asarray(index, dtype=np.int64)].astype(dtype, copy=False)

    def dense(self) -> FloatArray:
        """The whole operator ``G`` of shape (length, dim)."""
        return self.matrix

    def left_block(self, start: int, stop: int, dtype: type = np.float64) -> FloatArray:
        """``G[start:stop].T`` (dim, stop - start)."""
        return self.block(start, stop, dtype).T

    def left(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``G[start:stop].T @ x`` of shape (dim, x.shape[1])."""
        return self.left_block(start, stop, dtype) @ np.asarray(x, dtype=dtype)

    def right(
        self, x: FloatArray, start: int, stop: int, dtype: type = np.float64
    ) -> FloatArray:
        """``x @ G[start:stop]`` of shape (x.shape[0], dim)."""
        return np.asarray(x, dtype=dtype) @ self.block(start, stop, dtype)


__all__ = ["DenseOperator"]
