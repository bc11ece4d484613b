"""Matrices with a prescribed spectrum, for the generator, tests and benchmarks."""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from pipeline._types import FloatArray


def make_spectrum(r: int, *, kind: str = "geometric", decay: float = 0.9, head: int = 10, head_value: float = 10.0) -> FloatArray:
    """Singular values ``sigma_1 >= ... >= sigma_r > 0``, of shape (r,).

    ``geometric``: ``sigma_j = decay^(j-1)``. ``flat``: ``head`` values equal to
    ``head_value`` followed by a flat tail of ones -- the case where one-pass
    sketches are furthest from ``(1 + alpha) sigma_{k+1}`` [spec 7.2].

    Examples
    --------
    >>> make_spectrum(4, decay=0.5).tolist()
    [1.0, 0.5, 0.25, 0.125]
    """
    if kind == "geometric":
        return decay ** np.arange(r, dtype=np.float64)
    if kind == "flat":
        s = np.ones(r)
        s[: min(head, r)] = head_value
        return s
    raise ValueError(f"spectrum kind must be 'geometric' or 'flat', got kind={kind!r}.")


def orthonormal_columns(n: int, r: int, rng: np.random.Generator) -> FloatArray:
    """Haar-distributed ``Q`` of shape (n, r) with orthonormal columns (``n >= r``)."""
    Q, R = np.linalg.qr(rng.standard_normal((n, r)))
    return Q * np.sign(np.diag(R))  # Haar measure needs the sign fix [Mezzadri 2007]


def cholesky_factor(gram: FloatArray) -> FloatArray:
    """Upper ``R`` with ``R^T R = gram`` (CholeskyQR of a tall Gaussian matrix)."""
    return sla.cholesky(gram, lower=False)  # type: ignore[no-any-return]


def low_rank_matrix(m: int, n: int, singular_values: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Dense ``U diag(s) V^T`` of shape (m, n) with exactly the given singular values.

    Examples
    --------
    >>> low_rank_matrix(6, 4, np.array([2.0, 1.0]), np.random.default_rng(0)).shape
    (6, 4)
    """
    s = np.asarray(singular_values, dtype=np.float64)
    U = orthonormal_columns(m, s.size, rng)
    V = orthonormal_columns(n, s.size, rng)
    return (U * s) @ V.T  # type: ignore[no-any-return]
