"""Core solves of the one-pass factorizations (spec sketch-lrf, section 3.0)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import scipy.linalg as sla
from threadpoolctl import threadpool_limits

from pipeline._types import FloatArray


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS and LAPACK on one thread inside the block.

    The small dense algebra of a release's post-processing (eigen- and
    singular value decompositions of t x t and v x t matrices) gives different
    last bits on different numbers of BLAS threads. Pinned to one thread, as
    the workers are, a release is the same bit for bit whatever the client's
    thread count: a resumed release is then exactly the interrupted one.
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def orth(Y: FloatArray) -> FloatArray:
    """Orthonormal basis of the column space of ``Y`` (thin Householder QR).

    Parameters
    ----------
    Y : ndarray of shape (n, t), n >= t

    Returns
    -------
    Q : ndarray of shape (n, t) with ``Q.T @ Q = I``

    Examples
    --------
    >>> orth(np.ones((5, 2))).shape
    (5, 2)
    """
    Q, _ = np.linalg.qr(np.asarray(Y, dtype=np.float64), mode="reduced")
    return Q


#: Smallest ``lambda_min / lambda_max`` of ``Y^T Y`` at which :func:`cholesky_qr2`
#: runs: ``kappa(Y) <= 1e4``, well inside CholeskyQR2's range ``kappa <= u^{-1/2}``.
CHOLESKY_QR_MIN_RATIO = 1e-8


def cholesky_qr2(Y: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """Thin QR of a tall, well-conditioned ``Y`` by CholeskyQR2; None otherwise.

    Two rounds of ``R_i = chol(Q^T Q)``, ``Q <- Q R_i^{-1}``: the second corrects
    the first's loss of orthogonality, so ``||Q^T Q - I||`` and
    ``||Q R - Y|| / ||Y||`` are O(m t u) like Householder QR's, at the cost of
    four BLAS-3 products instead of a panel factorization (4-5x faster for
    m >> t on one thread) [Fukaya et al. 2014; Yamamoto et al. 2015, Thm 3.3].

    Parameters
    ----------
    Y : ndarray of shape (m, t), m >= t

    Returns
    -------
    (Q, R) or None
        ``Q`` (m, t) orthonormal and ``R`` (t, t) upper triangular with
        ``Y = Q R`` (``R``'s diagonal positive), or None when ``Y`` is not finite
        or its Gram matrix's eigenvalue ratio is below
        :data:`CHOLESKY_QR_MIN_RATIO` (then Householder QR is the answer).
    """
    Y = np.asarray(Y, dtype=np.float64)
    gram = Y.T @ Y
    if not np.isfinite(gram).all():
        return None
    w = np.linalg.eigvalsh(gram)
    if not w[0] > CHOLESKY_QR_MIN_RATIO * w[-1]:  # also catches w[-1] == 0
        return None
    eye = np.eye(Y.shape[1])
    R1 = sla.cholesky(gram, lower=False)
    # Y R^{-1} as a GEMM with the inverted triangle: the second round absorbs
    # the first's rounding
    Q = Y @ sla.solve_triangular(R1, eye, lower=False)
    R2 = sla.cholesky(Q.T @ Q, lower=False)
    Q = Q @ sla.solve_triangular(R2, eye, lower=False)
    return Q, R2 @ R1


def _svd(M: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    # gesdd is fast but can fail to converge on rare inputs; gesvd is the fallback
    try:
        return sla.svd(M, full_matrices=False, lapack_driver="gesdd")  # type: ignore[no-any-return]
    except np.linalg.LinAlgError:  # pragma: no cover - LAPACK corner case
        return sla.svd(M, full_matrices=False, lapack_driver="gesvd")  # type: ignore[no-any-return]


def core_one_sided(
    SU: FloatArray, Z: FloatArray, rank: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Rank-k core of Spectral-LRF: ``X = (S U)^+ [P Z]_k`` in factored form.

    Parameters
    ----------
    SU : ndarray of shape (v, t)
        ``S @ U`` with ``U`` the orthonormal range basis of the noisy ``Y``.
    Z : ndarray of shape (v, n)
        The noisy co-range sketch ``S A + N_2``.
    rank : int
        Target rank k, ``1 <= k <= t``.

    Returns
    -------
    W : ndarray of shape (t, k)
        Orthonormal; the left factor is ``U @ W``.
    s : ndarray of shape (k,)
        Non-negative, non-increasing.
    V : ndarray of shape (n, k)
        Orthonormal right factor; ``X = W diag(s) V.T``.

    Notes
    -----
    Implements CORE_ONE_SIDED [spec 3.0; Upa18, Fig. 1, step 4]: with
    ``SU = Ut diag(st) Vt^T`` and ``P = Ut Ut^T``, ``[P Z]_k = Ut [Ut^T Z]_k``, so
    only the t x n matrix ``Ut^T Z`` is factorized. Pure post-processing of noisy
    statistics. Cost O(v t n + n t^2).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W, s, V = core_one_sided(rng.normal(size=(9, 4)), rng.normal(size=(9, 6)), 2)
    >>> W.shape, s.shape, V.shape
    ((4, 2), (2,), (6, 2))
    """
    Ut, st, Vth = _svd(SU)  # step 2; st > 0 w.p. 1 for v >= t
    W = Ut.T @ Z  # step 3, t x n
    P, D, Qh = _svd(W)  # step 4
    Pk, Dk, Qk = P[:, :rank], D[:rank], Qh[:rank].T
    C = (Vth.T / st) @ (Pk * Dk)  # step 5, t x k
    W2, s2, Rh = _svd(C)  # step 6
    return W2, s2, Qk @ Rh.T  # step 7: X = C Qk^T = W2 diag(s2) (Qk R)^T


def core_two_sided(
    SU: FloatArray, TtV: FloatArray, Z: FloatArray, rank: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Rank-k core of Low-Space-LRF: ``X = (SU)^+ [P_L Z P_R]_k (V^T T)^+``.

    Parameters
    ----------
    SU : ndarray of shape (v, t)
        ``S @ U``, U the orthonormal basis of the noisy column sketch.
    TtV : ndarray of shape (v, t)
        ``T.T @ V``, V the orthonormal basis of the noisy row sketch.
    Z : ndarray of shape (v, v)
        The noisy core sketch ``S A T + N``.
    rank : int
        Target rank k, ``1 <= k <= t``.

    Returns
    -------
    WL : ndarray of shape (t, k)
        Orthonormal; the left factor is ``U @ WL``.
    s : ndarray of shape (k,)
    WR : ndarray of shape (t, k)
        Orthonormal; the right factor is ``V @ WR``.

    Notes
    -----
    CORE_TWO_SIDED of [spec 3.0], which corrects the dimensionally inconsistent
    step 4 of [Upa18, Fig. 2]: because the SVD taken is of ``T^T V`` (not of
    ``V^T T``), the roles of its singular-vector factors are swapped. Pure
    post-processing; cost O(v^2 t + v t^2).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> WL, s, WR = core_two_sided(rng.normal(size=(9, 4)), rng.normal(size=(9, 4)),
    ...                            rng.normal(size=(9, 9)), 2)
    >>> WL.shape, s.shape, WR.shape
    ((4, 2), (2,), (4, 2))
    """
    Us, ss, Vsh = _svd(SU)  # step 1
    Ut, st, Vth = _svd(TtV)  # step 2
    W = Us.T @ Z @ Ut  # step 3, t x t
    P, D, Qh = _svd(W)  # step 4
    Pk, Dk, Qk = P[:, :rank], D[:rank], Qh[:rank].T
    CL = (Vsh.T / ss) @ Pk  # step 5
    CR = (Vth.T / st) @ Qk
    QL, RL = np.linalg.qr(CL)  # step 6
    QR, RR = np.linalg.qr(CR)
    P2, s2, Q2h = _svd((RL * Dk) @ RR.T)  # step 7
    return QL @ P2, s2, QR @ Q2h.T


def sign_convention(V: FloatArray) -> FloatArray:
    """Column signs that make the largest-magnitude entry of each column positive.

    Applying the same signs to the left and right factors leaves ``U diag(s) V^T``
    unchanged and makes the factors reproducible across chunkings and clusters
    (sklearn's ``svd_flip`` convention, on the right factor).

    Parameters
    ----------
    V : ndarray of shape (n, k)

    Returns
    -------
    signs : ndarray of shape (k,) with entries +1.0 or -1.0

    Examples
    --------
    >>> sign_convention(np.array([[1.0, -3.0], [-2.0, 1.0]]))
    array([-1., -1.])
    """
    idx = np.argmax(np.abs(V), axis=0)
    signs: FloatArray = np.sign(V[idx, np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return signs
