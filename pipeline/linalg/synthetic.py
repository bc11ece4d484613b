"""Matrices with a prescribed spectrum, for the generator, tests and benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

from pipeline._types import FloatArray, IntArray, RngLike
from pipeline._validation import check_float_in_interval, check_int_in_range
from pipeline.errors import InvalidParameterError


def make_spectrum(
    r: int,
    *,
    kind: str = "geometric",
    decay: float = 0.9,
    head: int = 10,
    head_value: float = 10.0,
) -> FloatArray:
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


def low_rank_matrix(
    m: int, n: int, singular_values: FloatArray, rng: np.random.Generator
) -> FloatArray:
    """Dense ``U diag(s) V^T`` of shape (m, n) with exactly the given singular values.

    Examples
    --------
    >>> low_rank_matrix(6, 4, np.array([2.0, 1.0]), np.random.default_rng(0)).shape
    (6, 4)
    """
    s = np.asarray(singular_values, dtype=np.float64)
    U = orthonormal_columns(m, s.size, rng)
    V = orthonormal_columns(n, s.size, rng)
    return (U * s) @ V.T


# --- PCA test data with controlled coherence and eigengap [spec power-pca, App. B] ---


@dataclass(frozen=True, kw_only=True, eq=False)
class CoherentMatrix:
    """A matrix with an exact, known SVD and a chosen coherence (read-only arrays).

    Attributes
    ----------
    A : ndarray of shape (n_rows, n_cols), float64
        ``U diag(singular_values) V^T``; every row has L2 norm <= 1.
    Uk : ndarray of shape (n_rows, rank), float64
        Top-``rank`` left singular vectors; non-zero only on ``support`` rows.
    Vk : ndarray of shape (n_cols, rank), float64
        Top-``rank`` right singular vectors (the PCA ground truth).
    singular_values : ndarray of shape (n_cols,), float64
        All singular values of ``A``, non-increasing: ``sqrt(head_ratio * top)``
        ``rank - 1`` times, ``sqrt(top)``, then ``sqrt(bottom)`` ``n_cols - rank`` times.
    support : int
        Number m of rows on which ``Uk`` is supported.
    coherence : float
        ``||U_k||_inf = max_ij |U_k[i, j]| = 1 / sqrt(support)`` exactly.
    row_coherence : float
        ``rho_U = max_i ||e_i^T U_k||_2 = sqrt(rank / support)`` [spec power-pca, 5.4].
    gap_k : float
        Eigengap of ``A^T A``: ``sigma_k^2 - sigma_{k+1}^2 = top - bottom``.
    kappa_k : float
        Relative gap ``gap_k / sigma_k^2 = 1 - bottom / top``.
    max_row_norm : float
        ``max_i ||a_i||_2`` (<= 1).
    """

    A: FloatArray
    Uk: FloatArray
    Vk: FloatArray
    singular_values: FloatArray
    support: int
    coherence: float
    row_coherence: float
    gap_k: float
    kappa_k: float
    max_row_norm: float


def walsh_columns(n_rows: int, idx: IntArray) -> FloatArray:
    """Walsh functions ``W[i, j] = (-1)^popcount(i & idx[j])``, of shape (n_rows, len(idx)).

    Entries are +-1 and the columns for distinct ``idx < n_rows`` are orthogonal
    when ``n_rows`` is a power of two (they are columns of the Sylvester-Hadamard
    matrix) [spec power-pca, App. B].

    Examples
    --------
    >>> walsh_columns(4, np.array([1, 2])).shape
    (4, 2)
    """
    i = np.arange(n_rows, dtype=np.uint64)[:, None]
    j = np.asarray(idx, dtype=np.uint64)[None, :]
    return 1.0 - 2.0 * (np.bitwise_count(i & j) & 1)  # type: ignore[no-any-return]


def coherent_spectrum(
    n_cols: int, rank: int, *, top: float, bottom: float, head_ratio: float = 1.2
) -> FloatArray:
    """Eigenvalues ``sig2`` of ``A^T A``, of shape (n_cols,), non-increasing.

    ``[head_ratio * top] * (rank - 1) + [top] + [bottom] * (n_cols - rank)``, so
    ``gap_k = top - bottom`` and ``kappa_k = 1 - bottom / top`` do not depend on the
    coherence [spec power-pca, App. B].

    Examples
    --------
    >>> coherent_spectrum(4, 2, top=10.0, bottom=1.0).tolist()
    [12.0, 10.0, 1.0, 1.0]
    """
    sig2 = np.full(n_cols, float(bottom))
    sig2[: rank - 1] = head_ratio * top
    sig2[rank - 1] = top
    return sig2


def coherent_matrix(
    n_rows: int,
    n_cols: int,
    rank: int,
    *,
    support: int,
    top: float,
    bottom: float,
    head_ratio: float = 1.2,
    rng: RngLike = None,
) -> CoherentMatrix:
    """PCA test matrix with a known top-``rank`` subspace, eigengap and coherence.

    Builds ``A = U diag(sqrt(sig2)) V^T`` (an exact SVD) with [spec power-pca, App. B]:

    * ``U_k`` (first ``rank`` columns) supported on ``support`` random rows S,
      where it holds Walsh-Hadamard columns 1..rank with a random sign per row,
      scaled by ``1/sqrt(support)``: ``||U_k||_inf = 1/sqrt(support)`` and every
      row of S has ``||e_i^T U_k|| = sqrt(rank/support)``. ``support = n_rows``
      is perfectly incoherent; a small ``support`` is coherent.
    * ``U_{>k}``: a Gaussian matrix projected off ``U_k``, orthonormalised by QR
      (generic, low coherence).
    * ``V``: Haar-random orthogonal (n_cols, n_cols).
    * ``sig2`` from :func:`coherent_spectrum`: ``gap_k = top - bottom`` and
      ``kappa_k = 1 - bottom/top`` are the same at every coherence level, so
      runs that differ only in ``support`` isolate the effect of coherence.

    Parameters
    ----------
    n_rows : int
        Number of rows n (individuals), ``n_rows >= n_cols`` and ``>= support``.
    n_cols : int
        Number of columns d (features), ``2 <= n_cols <= n_rows``.
    rank : int
        Target rank k, ``1 <= rank <= min(n_cols, support) - 1``.
    support : int
        Number m of rows carrying ``U_k``; a power of two in ``[2, n_rows]``.
    top : float
        ``sigma_k^2 > 0``, the k-th eigenvalue of ``A^T A`` (s in the spec).
    bottom : float
        ``sigma_{k+1}^2 = ... = sigma_d^2``, ``0 <= bottom < top`` (b in the spec).
    head_ratio : float, default 1.2
        ``sigma_1^2 = ... = sigma_{k-1}^2 = head_ratio * top``, ``>= 1``.
    rng : None, int, SeedSequence, BitGenerator or Generator
        Manages all randomness in this call (``np.random.default_rng(rng)``).

    Returns
    -------
    CoherentMatrix
        ``A`` (n_rows, n_cols), ``Uk`` (n_rows, rank), ``Vk`` (n_cols, rank),
        ``singular_values`` (n_cols,), all float64, and the public facts
        ``coherence``, ``row_coherence``, ``gap_k``, ``kappa_k``, ``max_row_norm``.

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range, or if a row of ``A`` would have norm > 1
        (the input constraint of private PCA); the message says to lower ``top``
        or ``bottom``, or to raise ``support``.

    Notes
    -----
    Row norms. A row of S has squared norm ``sum_{j<=k} sig2_j / support + bottom
    * ||e_i^T U_{>k}||^2``, so ``(head_ratio (k-1) + 1) top <= support`` is
    necessary; it is checked before anything is drawn, the exact maximum after.

    Memory: a few (n_rows, n_cols) float64 arrays (``A``, the Gaussian and its Q
    factor); 2^19 x 64 needs about 1 GB. Test data only: not a pipeline step.

    Examples
    --------
    >>> data = coherent_matrix(256, 8, 2, support=64, top=10.0, bottom=2.0, rng=0)
    >>> data.A.shape, data.Uk.shape, data.Vk.shape, data.singular_values.shape
    ((256, 8), (256, 2), (8, 2), (8,))
    """
    n = check_int_in_range(n_rows, "n_rows", 2)
    d = check_int_in_range(n_cols, "n_cols", 2, n, what="[2, n_rows]")
    m = check_int_in_range(support, "support", 2, n, what="[2, n_rows]")
    if m & (m - 1):
        raise InvalidParameterError(
            f"support must be a power of two (Walsh-Hadamard columns), got support={m}."
        )
    k = check_int_in_range(
        rank, "rank", 1, min(d, m) - 1, what="[1, min(n_cols, support) - 1]"
    )
    s = check_float_in_interval(top, "top", 0.0, math.inf)
    b = check_float_in_interval(bottom, "bottom", 0.0, s, low_open=False)
    h = check_float_in_interval(head_ratio, "head_ratio", 1.0, math.inf, low_open=False)
    head_energy = (h * (k - 1) + 1.0) * s
    if head_energy > m:
        raise InvalidParameterError(
            "rows of A must have norm <= 1, but the top-rank part alone gives rows of "
            f"norm^2 (head_ratio*(rank-1)+1)*top/support = {head_energy / m:.6g} > 1; "
            f"lower top to <= {m / (h * (k - 1) + 1.0):.6g} or raise support, "
            f"got top={s!r}, support={m}."
        )
    return _coherent_matrix(
        n,
        d,
        k,
        m,
        coherent_spectrum(d, k, top=s, bottom=b, head_ratio=h),
        np.random.default_rng(rng),
    )


def _coherent_matrix(
    n: int, d: int, k: int, m: int, sig2: FloatArray, rng: np.random.Generator
) -> CoherentMatrix:
    rows = rng.choice(n, size=m, replace=False)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(m, 1))
    Uk_S = walsh_columns(m, np.arange(1, k + 1)) * signs / math.sqrt(m)  # [spec App. B]
    Uk = np.zeros((n, k))
    Uk[rows] = Uk_S
    # U_{>k}: Gaussian projected off U_k (only the rows of S meet U_k), then QR
    G = rng.standard_normal((n, d - k))
    G[rows] -= Uk_S @ (Uk_S.T @ G[rows])
    Q = np.linalg.qr(G)[0]
    del G
    V = orthonormal_columns(d, d, rng)
    sigma = np.sqrt(sig2)
    A = (Uk * sigma[:k]) @ V[:, :k].T
    A += (Q * sigma[k:]) @ V[:, k:].T
    row_sq = np.einsum("ij,ij->i", A, A)
    worst = int(np.argmax(row_sq))
    if row_sq[worst] > 1.0:
        tail_sq = np.einsum("ij,ij->i", Q, Q)
        head_sq = float(sig2[:k].sum()) / m
        in_s = np.zeros(n, dtype=bool)
        in_s[rows] = True
        room = np.where(in_s, 1.0 - head_sq, 1.0) / np.maximum(
            tail_sq, np.finfo(float).tiny
        )
        raise InvalidParameterError(
            f"rows of A must have norm <= 1, got a largest row norm of {math.sqrt(row_sq[worst]):.6g}; "
            f"lower bottom to <= {float(room.min()):.6g} for this rng, lower top, or raise support, "
            f"got top={float(sig2[k - 1])!r}, bottom={float(sig2[k])!r}, support={m}."
        )
    Vk = np.ascontiguousarray(V[:, :k])
    for arr in (A, Uk, Vk, sigma):
        arr.flags.writeable = False
    gap = float(sig2[k - 1] - sig2[k])
    return CoherentMatrix(
        A=A,
        Uk=Uk,
        Vk=Vk,
        singular_values=sigma,
        support=m,
        coherence=1.0 / math.sqrt(m),
        row_coherence=math.sqrt(k / m),
        gap_k=gap,
        kappa_k=gap / float(sig2[k - 1]),
        max_row_norm=math.sqrt(float(row_sq[worst])),
    )
