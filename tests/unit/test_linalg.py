"""Core solves and metrics against brute-force oracles (spec 3.0; T13, T12 pieces)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.linalg.core import (
    cholesky_qr2,
    core_one_sided,
    core_two_sided,
    orth,
    sign_convention,
)
from pipeline.linalg.metrics import hmt_bound, spectral_error
from pipeline.linalg.synthetic import (
    low_rank_matrix,
    make_spectrum,
    orthonormal_columns,
)

ORTHO_ATOL = 1e-10  # T12: U^T U = I to 1e-10


def _trunc(M: np.ndarray, k: int) -> np.ndarray:
    """``[M]_k`` by numpy's SVD (the oracle, independent of the module's scipy path)."""
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, :k] * s[:k]) @ Vt[:k]


def _projector(L: np.ndarray) -> np.ndarray:
    """Orthogonal projector onto range(L)."""
    return L @ np.linalg.pinv(L)


def _assert_orthonormal(Q: np.ndarray) -> None:
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), rtol=0, atol=ORTHO_ATOL)


def _assert_spectrum(s: np.ndarray, k: int) -> None:
    assert s.shape == (k,)
    assert (s >= 0).all()
    assert (np.diff(s) <= 0).all()


@pytest.mark.parametrize(
    ("v", "t", "n", "k"), [(30, 8, 25, 3), (17, 6, 40, 6), (12, 11, 9, 1)]
)
def test_core_one_sided_equals_brute_force(
    rng: np.random.Generator, v: int, t: int, n: int, k: int
) -> None:
    """X = L^+ [P_L Z]_k with L = S U (spec 3.0 CORE_ONE_SIDED, R = I)."""
    L = rng.standard_normal((v, t))
    Z = rng.standard_normal((v, n)) * 3.0
    W, s, V = core_one_sided(L, Z, k)
    assert W.shape == (t, k)
    assert V.shape == (n, k)
    _assert_orthonormal(W)
    _assert_orthonormal(V)
    _assert_spectrum(s, k)
    want = np.linalg.pinv(L) @ _trunc(_projector(L) @ Z, k)
    got = (W * s) @ V.T
    # backward-stable SVDs of well-conditioned Gaussian L (cond <= ~20 here)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    # negative control: truncating Z before projecting is a different (wrong) formula
    wrong = np.linalg.pinv(L) @ _trunc(Z, k)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(
            wrong, want, rtol=1e-6, atol=1e-6 * np.abs(want).max()
        )


@pytest.mark.parametrize(("v", "t", "k"), [(30, 8, 3), (20, 6, 6), (14, 13, 2)])
def test_core_two_sided_equals_brute_force(
    rng: np.random.Generator, v: int, t: int, k: int
) -> None:
    """X = L^+ [P_L Z P_R]_k R^+ with L = S U, R = V^T T (spec 3.0 CORE_TWO_SIDED)."""
    L = rng.standard_normal((v, t))
    TtV = rng.standard_normal((v, t))
    R = TtV.T
    Z = rng.standard_normal((v, v)) * 3.0
    WL, s, WR = core_two_sided(L, TtV, Z, k)
    assert WL.shape == (t, k)
    assert WR.shape == (t, k)
    _assert_orthonormal(WL)
    _assert_orthonormal(WR)
    _assert_spectrum(s, k)
    P_R = np.linalg.pinv(R) @ R  # projector onto the row space of R
    want = np.linalg.pinv(L) @ _trunc(_projector(L) @ Z @ P_R, k) @ np.linalg.pinv(R)
    got = (WL * s) @ WR.T
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    if k == t:
        return  # no truncation happens: every placement of the projections agrees
    # negative control: omitting the right projection P_R before truncating gives
    # a different matrix, so the check can tell the formulas apart
    one_sided = np.linalg.pinv(L) @ _trunc(_projector(L) @ Z, k) @ np.linalg.pinv(R)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(
            one_sided, want, rtol=1e-6, atol=1e-6 * np.abs(want).max()
        )


def test_core_one_sided_is_exact_on_consistent_sketches(
    rng: np.random.Generator,
) -> None:
    """If Z = L X0 with rank(X0) <= k, the core returns X0 exactly."""
    v, t, n, k = 25, 7, 18, 3
    L = rng.standard_normal((v, t))
    X0 = low_rank_matrix(t, n, np.array([5.0, 2.0, 1.0]), rng)
    W, s, V = core_one_sided(L, L @ X0, k)
    np.testing.assert_allclose((W * s) @ V.T, X0, rtol=0, atol=1e-12 * 5.0 * 10)


# ------------------------------------------------------------------ sign convention


def test_sign_convention_makes_largest_entry_positive(rng: np.random.Generator) -> None:
    V = rng.standard_normal((9, 4))
    signs = sign_convention(V)
    assert set(np.unique(signs)) <= {-1.0, 1.0}
    Vs = V * signs
    idx = np.argmax(np.abs(Vs), axis=0)
    assert (Vs[idx, np.arange(4)] > 0).all()
    np.testing.assert_array_equal(sign_convention(Vs), np.ones(4))  # idempotent
    np.testing.assert_array_equal(sign_convention(-V), -signs)  # equivariant
    # the same signs on both factors leave U diag(s) V^T unchanged
    U, s = rng.standard_normal((6, 4)), np.array([4.0, 3.0, 2.0, 1.0])
    np.testing.assert_allclose(
        ((U * signs) * s) @ Vs.T, (U * s) @ V.T, rtol=1e-15, atol=1e-15
    )


def test_sign_convention_zero_column_and_doc_example() -> None:
    np.testing.assert_array_equal(sign_convention(np.zeros((3, 2))), [1.0, 1.0])
    np.testing.assert_array_equal(
        sign_convention(np.array([[1.0, -3.0], [-2.0, 1.0]])), [-1.0, -1.0]
    )


# ----------------------------------------------------------------------- metrics


@pytest.mark.parametrize("shape", [(30, 20), (20, 30), (25, 25)])
def test_spectral_error_matches_numpy_norm(
    rng: np.random.Generator, shape: tuple[int, int]
) -> None:
    m, n = shape
    k = 4
    A = rng.standard_normal((m, n))
    U, s, V = (
        rng.standard_normal((m, k)),
        rng.random(k) * 5,
        rng.standard_normal((n, k)),
    )
    want = np.linalg.norm(A - (U * s) @ V.T, 2)
    # eigvalsh of the Gram matrix squares the condition, but only the top
    # eigenvalue is needed: relative accuracy ~ eps * min(m, n)
    np.testing.assert_allclose(spectral_error(A, U, s, V), want, rtol=1e-10, atol=0)


def test_spectral_error_of_the_truncated_svd_is_sigma_k_plus_one(
    rng: np.random.Generator,
) -> None:
    sv = make_spectrum(15, decay=0.7)
    A = low_rank_matrix(40, 30, sv, rng)
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    k = 5
    # Eckart-Young: ||A - [A]_k||_2 = sigma_{k+1}
    np.testing.assert_allclose(
        spectral_error(A, U[:, :k], s[:k], Vt[:k].T), sv[k], rtol=1e-10, atol=1e-14
    )


def test_hmt_bound_formula() -> None:
    sv = np.array([10.0, 5.0, 2.0, 1.0, 1.0, 0.5])
    k, t = 2, 5
    p = t - k
    want = (1 + np.sqrt(k / (p - 1))) * 2.0 + np.e * np.sqrt(t) / p * np.sqrt(
        4 + 1 + 1 + 0.25
    )
    np.testing.assert_allclose(hmt_bound(sv, k, t), want, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match="oversampling"):
        hmt_bound(sv, 2, 3)


def test_orth_and_synthetic_helpers(rng: np.random.Generator) -> None:
    Y = rng.standard_normal((20, 5))
    Q = orth(Y)
    _assert_orthonormal(Q)
    np.testing.assert_allclose(Q @ (Q.T @ Y), Y, rtol=0, atol=1e-12 * np.abs(Y).max())
    _assert_orthonormal(orthonormal_columns(12, 12, rng))
    sv = np.array([3.0, 2.0, 0.5])
    A = low_rank_matrix(9, 7, sv, rng)
    np.testing.assert_allclose(
        np.linalg.svd(A, compute_uv=False)[:3], sv, rtol=1e-12, atol=0
    )
    np.testing.assert_allclose(
        np.linalg.svd(A, compute_uv=False)[3:], 0.0, rtol=0, atol=1e-14
    )
    flat = make_spectrum(6, kind="flat", head=2, head_value=7.0)
    np.testing.assert_array_equal(flat, [7.0, 7.0, 1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="kind"):
        make_spectrum(3, kind="linear")


def test_cholesky_qr2_is_a_qr_to_working_precision(rng: np.random.Generator) -> None:
    # kappa(Y) = 1e3: inside CholeskyQR2's range (kappa <= u^{-1/2}), where
    # ||Q^T Q - I|| and ||QR - Y|| / ||Y|| are O(m t u) [Yamamoto et al. 2015, Thm 3.3]
    m, t = 3000, 12
    u, _ = np.linalg.qr(rng.standard_normal((m, t)))
    w, _ = np.linalg.qr(rng.standard_normal((t, t)))
    Y = (u * np.geomspace(1.0, 1e-3, t)) @ w
    out = cholesky_qr2(Y)
    assert out is not None
    Q, R = out
    bound = m * t * np.finfo(np.float64).eps
    np.testing.assert_allclose(Q.T @ Q, np.eye(t), rtol=0, atol=bound)
    np.testing.assert_allclose(Q @ R, Y, rtol=0, atol=bound * np.abs(Y).max())
    np.testing.assert_allclose(R, np.triu(R), rtol=0, atol=0)
    # the same column space as Householder QR: Q differs by column signs only
    Qh, _ = np.linalg.qr(Y)
    np.testing.assert_allclose(np.abs(Qh.T @ Q), np.eye(t), rtol=0, atol=1e3 * bound)
    # negative controls: beyond its range (rank-deficient, or kappa = 1e7) and on
    # non-finite input it declines, and the caller falls back to Householder QR
    assert cholesky_qr2(np.hstack([Y, Y[:, :1]])) is None
    assert cholesky_qr2((u * np.geomspace(1.0, 1e-7, t)) @ w) is None
    bad = Y.copy()
    bad[0, 0] = np.nan
    assert cholesky_qr2(bad) is None
