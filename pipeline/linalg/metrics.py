"""Error metrics and reference bounds for low-rank approximations."""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg as sla

from pipeline._types import FloatArray


def spectral_error(A: FloatArray, U: FloatArray, s: FloatArray, V: FloatArray) -> float:
    """``||A - U diag(s) V^T||_2`` computed exactly through the smaller Gram matrix.

    Parameters
    ----------
    A : ndarray of shape (m, n)
    U : ndarray of shape (m, k)
    s : ndarray of shape (k,)
    V : ndarray of shape (n, k)

    Returns
    -------
    float

    Notes
    -----
    Forms ``E = A - M_k`` once in float64 and takes the largest eigenvalue of the
    min(m, n)-sized Gram matrix; a test and benchmark oracle, not a pipeline step.

    Examples
    --------
    >>> A = np.eye(3)
    >>> round(spectral_error(A, A[:, :1], np.ones(1), A[:, :1]), 12)
    1.0
    """
    E = np.asarray(A, dtype=np.float64) - (U * s) @ V.T
    G = E.T @ E if E.shape[0] >= E.shape[1] else E @ E.T
    top = sla.eigvalsh(G, subset_by_index=[G.shape[0] - 1, G.shape[0] - 1])
    return float(math.sqrt(max(float(top[0]), 0.0)))


def hmt_bound(singular_values: FloatArray, rank: int, sketch_size: int) -> float:
    """Right side of [HMT11, Thm 10.6] for a Gaussian range sketch of size t.

    ``(1 + sqrt(k/(p-1))) sigma_{k+1} + (e sqrt(t) / p) (sum_{j>k} sigma_j^2)^{1/2}``
    with ``p = t - k >= 2``; bounds ``E ||(I - U U^T) A||_2``.

    Parameters
    ----------
    singular_values : ndarray of shape (r,)
        All singular values of A, non-increasing.
    rank : int
    sketch_size : int

    Returns
    -------
    float

    Examples
    --------
    >>> round(hmt_bound(np.array([3.0, 1.0, 1.0]), 1, 3), 3) > 1
    True
    """
    p = sketch_size - rank
    if p < 2:
        raise ValueError(f"oversampling t - k must be >= 2, got {p}.")
    sv = np.asarray(singular_values, dtype=np.float64)
    tail = sv[rank:]
    first = (1.0 + math.sqrt(rank / (p - 1))) * (tail[0] if tail.size else 0.0)
    return float(first + math.e * math.sqrt(sketch_size) / p * np.linalg.norm(tail))


def sin_theta(X: FloatArray, Vk: FloatArray) -> float:
    """Largest principal-angle sine between ``span(X)`` and ``span(Vk)``.

    ``||Vk - X (X^T Vk)||_2``, which equals ``sin theta_max = ||(I - X X^T) Vk||_2``
    for orthonormal ``X``. This form stays accurate down to round-off, unlike
    ``sqrt(1 - sigma_min(X^T Vk)^2)``, which loses precision below about 1e-8
    [spec power-pca, 5.3].

    Parameters
    ----------
    X : ndarray of shape (n_cols, rank)
        Orthonormal columns (e.g. a private PCA estimate).
    Vk : ndarray of shape (n_cols, rank_true)
        Orthonormal columns (e.g. the true top right singular vectors).

    Returns
    -------
    float
        In [0, 1] for orthonormal inputs; 0 when ``span(Vk)`` is inside ``span(X)``.

    Examples
    --------
    >>> I = np.eye(3)
    >>> sin_theta(I[:, :2], I[:, :2]), sin_theta(I[:, :1], I[:, 1:2])
    (0.0, 1.0)
    """
    X = np.asarray(X, dtype=np.float64)
    Vk = np.asarray(Vk, dtype=np.float64)
    return float(np.linalg.norm(Vk - X @ (X.T @ Vk), 2))
