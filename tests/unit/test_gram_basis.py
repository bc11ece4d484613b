"""The range basis of a noisy sketch from its Gram matrix.

A private release forms the basis of its noisy range sketch ``Y`` from ``Y^T Y``
(summed over the row blocks in the step that adds the noise) instead of a TSQR.
Both are post-processing of the same noisy ``Y``; these tests check that they
give the same release, that the Gram route is the one taken, and that an
ill-conditioned ``Y`` falls back to TSQR.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import gram_basis, gram_svd, plan_lrf, run_lrf
from pipeline.algorithms.lrf import kernels as lrf
from pipeline.algorithms.lrf.kernels import GRAM_MIN_RATIO
from pipeline.algorithms.lrf.two_pass import top_right_vectors
from pipeline.linalg.core import sign_convention
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import Algorithm, ClipSpec, LrfParams, PrivacyUnit

#: Orthonormality of ``Y B`` from the Gram matrix: about eps * s_1^2 / s_r^2
#: (gram_svd's docstring); the test matrices have s_1 / s_r <= 1e2, so 1e-11.
ORTH_TOL = 1e-11
#: Gram route against TSQR on the same noisy Y: both are orthonormal bases of the
#: same subspace, so the releases differ by round-off amplified by the core
#: solve's conditioning; measured <= 6e-14 (product) and 5e-13 (S) on these
#: plans for seeds 0, 1, 2, 42; 1e-9 leaves margin, a different noise is ~1e-1.
SAME_RELEASE_RTOL = 1e-9


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("rank", [None, 1, 3])
def test_gram_svd_matches_the_svd_of_y(rng: np.random.Generator, rank: int | None) -> None:
    Y = rng.standard_normal((300, 6)) @ np.diag([50.0, 20.0, 9.0, 3.0, 1.0, 0.5])
    B, s, W = gram_svd(Y.T @ Y, rank)  # type: ignore[misc]
    U_ref, s_ref, Wt_ref = np.linalg.svd(Y, full_matrices=False)
    r = 6 if rank is None else rank
    np.testing.assert_allclose(s, s_ref[:r], rtol=1e-12)
    U = Y @ B
    np.testing.assert_allclose(U.T @ U, np.eye(r), atol=ORTH_TOL)
    # the same singular vectors, up to sign
    np.testing.assert_allclose(np.abs(U.T @ U_ref[:, :r]), np.eye(r), atol=1e-10)
    np.testing.assert_allclose(np.abs(W.T @ Wt_ref[:r].T), np.eye(r), atol=1e-10)
    np.testing.assert_allclose((U * s) @ W.T, (U_ref[:, :r] * s_ref[:r]) @ Wt_ref[:r], atol=1e-10 * s_ref[0])


def test_gram_basis_refuses_an_ill_conditioned_sketch(rng: np.random.Generator) -> None:
    Y = rng.standard_normal((200, 4)) @ np.diag([1.0, 1.0, 1.0, 1e-5])
    gram = Y.T @ Y  # s_4^2 / s_1^2 ~ 1e-10 < GRAM_MIN_RATIO
    assert gram_basis(gram, None) is None
    assert gram_basis(gram, 3) is not None  # the top 3 are well conditioned
    # negative control: the same sketch with its last column at 1e-3 is accepted
    Y2 = Y @ np.diag([1.0, 1.0, 1.0, 1e2])
    assert gram_basis(Y2.T @ Y2, None) is not None
    assert 1e-3**2 > GRAM_MIN_RATIO > 1e-5**2


class _CountingSource(ArraySource):
    def __init__(self, A: np.ndarray) -> None:
        super().__init__(A)
        self.calls: list[str] = []

    def tall_noise_gram(self, Y: Any, fn: Any, op: Any) -> Any:
        self.calls.append("noise_gram")
        return super().tall_noise_gram(Y, fn, op)

    def tall_qr(self, Y: Any, *, with_r: bool = False) -> Any:
        self.calls.append("qr")
        return super().tall_qr(Y, with_r=with_r)


def _plan(algorithm: Algorithm, shape: tuple[int, int]) -> Any:
    params = LrfParams(
        algorithm=algorithm,
        rank=3,
        epsilon=4.0,
        delta=1e-6,
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
    )
    return plan_lrf(params, shape)


@pytest.mark.parametrize("algorithm", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE, Algorithm.TWO_PASS])
def test_gram_route_gives_the_tsqr_release(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, algorithm: Algorithm
) -> None:
    m, n = 600, 80
    A = rng.standard_normal((m, 3)) @ rng.standard_normal((3, n)) / np.sqrt(n)
    A += 0.05 * rng.standard_normal((m, n)) / np.sqrt(n)
    plan = _plan(algorithm, A.shape)
    key = NoiseKey.insecure_from_seed(5)

    src = _CountingSource(A)
    f = run_lrf(src, plan, ReleaseHooks(sketch_seed=11, noise_key=key))
    assert src.calls == ["noise_gram"]  # noise, Gram matrix, S^T Y: one step, no TSQR
    np.testing.assert_allclose(f.U.T @ f.U, np.eye(3), atol=ORTH_TOL)

    # the same release with the Gram route refused: TSQR on the same noisy Y (and,
    # for two-pass, V_k from the SVD of Z: the same signed vectors)
    monkeypatch.setattr(lrf, "GRAM_MIN_RATIO", np.inf)
    src_qr = _CountingSource(A)
    g = run_lrf(src_qr, plan, ReleaseHooks(sketch_seed=11, noise_key=key))
    assert src_qr.calls == ["noise_gram", "qr"]  # the fallback ran
    np.testing.assert_allclose(g.S, f.S, rtol=SAME_RELEASE_RTOL)
    assert _rel((g.U * g.S) @ g.V.T, (f.U * f.S) @ f.V.T) < SAME_RELEASE_RTOL

    # negative control: another noise key gives a release this comparison rejects
    h = run_lrf(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=11, noise_key=NoiseKey.insecure_from_seed(6)),
    )
    assert _rel((h.U * h.S) @ h.V.T, (f.U * f.S) @ f.V.T) > 1e-3


def test_top_right_vectors_from_the_gram_matrix_are_the_svds(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V_k of a wide noisy Z from Z Z^T: the SVD's right singular vectors, signed
    by the convention (so the noise of Y meets the same columns either way);
    a Z of rank below t goes to the SVD and is still orthonormal."""
    spectrum = np.diag([40.0, 30.0, 20.0, 10.0])
    Z = rng.standard_normal((50, 4)) @ spectrum @ rng.standard_normal((4, 700))
    Z += rng.standard_normal(Z.shape)
    got = top_right_vectors(Z, 6)
    ref = np.linalg.svd(Z, full_matrices=False)[2][:6].T
    ref = ref * sign_convention(ref)
    # eps s_1^2 / s_6^2 (gram_svd's docstring) amplified by the gaps: <= 1e-10
    np.testing.assert_allclose(got, ref, atol=1e-10)
    monkeypatch.setattr(lrf, "GRAM_MIN_RATIO", np.inf)  # the SVD route
    np.testing.assert_allclose(top_right_vectors(Z, 6), got, atol=1e-10)
    monkeypatch.undo()
    # rank 4 < t = 6 without noise: refused by the Gram check, SVD taken
    low = rng.standard_normal((50, 4)) @ rng.standard_normal((4, 700))
    v = top_right_vectors(low, 6)
    np.testing.assert_allclose(v.T @ v, np.eye(6), atol=1e-12)
    # negative control: one vector flipped is a different V_k
    flipped = got.copy()
    flipped[:, 2] *= -1
    assert not np.allclose(flipped, ref, atol=1e-10)
