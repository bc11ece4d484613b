"""Core tests of the private PCA (spec power-pca 5.1-5.3, A1-A7, 4.5, 4.9, P6).

Numpy only, no Dask: the runs read an in-memory :class:`ArrayRowSource`.

Ground truth comes from matrices built with a known SVD ``A = U diag(s) V^T``
(``U`` of Walsh columns, so every row has the same norm, set below 1 so that
the clipping of prep_rows leaves the rows unchanged; ``V`` Haar-random), so
``V_k``, ``Sigma_k`` and the gap are exact up to rounding and the same in
every seed. Subspace distances use ``||X2 - X1 (X1^T X2)||_2``
(spec 5.3: ``sqrt(1 - sigma_min^2)`` loses precision below 1e-8).

Tolerances: identities that are exact in exact arithmetic use 1e-10 (the
float64 entry of ``RTOL`` in tests/conftest.py, as the spec asks) or 1e-12
where the spec asks for it; every other tolerance names its lemma. The noise
of the private runs comes from insecure (seeded) noise keys, so every test is
deterministic for a given ``global_seed``.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from typing import Any

import numpy as np
import pytest

from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import (
    ArrayRowSource,
    MemoryJournal,
    PcaPlan,
    PcaResult,
    Secret,
    band_pass,
    band_update,
    clip_rows,
    eig_floor_inv_sqrt,
    plan_pca,
    prep_rows,
    qr_pos,
    run_pca,
    sym,
    topk_eig,
)
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
from pipeline.params import PcaParams

#: Exact-arithmetic identities in float64 (tests/conftest.py RTOL; spec 5.3 A1, A3, A4).
EXACT = 1e-10
#: spec 5.3 A2 asks for the whitening identity to 1e-12.
WHITE = 1e-12


# --------------------------------------------------------------------- helpers
@dataclasses.dataclass(frozen=True)
class Known:
    """A matrix with a known SVD: ``A = U diag(s) V^T``, every row norm < 1."""

    A: np.ndarray
    V: np.ndarray
    s: np.ndarray
    k: int

    @property
    def Vk(self) -> np.ndarray:
        return self.V[:, : self.k]

    @property
    def Vrest(self) -> np.ndarray:
        return self.V[:, self.k :]

    @property
    def sig2(self) -> np.ndarray:
        return self.s**2

    @property
    def gap(self) -> float:
        """``Delta_k = sigma_k^2 - sigma_{k+1}^2`` (the eigengap of A^T A)."""
        return float(self.sig2[self.k - 1] - self.sig2[self.k])

    @property
    def rate(self) -> float:
        """Noiseless contraction factor ``sigma_{k+1}^2 / sigma_k^2`` (spec 0)."""
        return float(self.sig2[self.k] / self.sig2[self.k - 1])

    def gram(self) -> np.ndarray:
        return self.A.T @ self.A


def known_svd(
    rng: np.random.Generator, n: int, rel_sig2: Any, k: int, row_norm: float = 0.95
) -> Known:
    """``A = U diag(s) V^T`` with ``s^2`` proportional to ``rel_sig2``.

    ``U`` is made of distinct Walsh columns ``+-1/sqrt(n)`` (``n`` a power of
    two) with random row signs and order: orthonormal, and every row of ``A``
    has norm exactly ``sqrt(sum s^2 / n)``, set to ``row_norm`` (< 1 - 1e-9, so
    prep_rows leaves every row bit for bit unchanged). The spectrum is thus the
    same in every seed; ``V`` is Haar-random (spec Appendix B).
    """
    rel = np.asarray(rel_sig2, dtype=np.float64)
    d = rel.size
    cols = rng.choice(np.arange(1, n), size=d, replace=False).astype(np.uint64)
    i = np.arange(n, dtype=np.uint64)[:, None]
    walsh = 1.0 - 2.0 * (np.bitwise_count(i & cols[None, :]) & 1)
    U = walsh[rng.permutation(n)] * rng.choice([-1.0, 1.0], (n, 1)) / math.sqrt(n)
    V = np.linalg.qr(rng.standard_normal((d, d)))[0]
    s = np.sqrt(rel * (row_norm**2 * n / rel.sum()))
    A = (U * s) @ V.T
    assert np.linalg.norm(A, axis=1).max() < 1.0 - 1e-9
    np.testing.assert_array_equal(prep_rows(A), A)  # clipping is inactive
    return Known(A=A, V=V, s=s, k=k)


def subspace_dist(X1: np.ndarray, X2: np.ndarray) -> float:
    """``||X2 - X1 (X1^T X2)||_2`` for orthonormal X1, X2 (spec 5.3)."""
    return float(np.linalg.norm(X2 - X1 @ (X1.T @ X2), 2))


def sin_theta(X: np.ndarray, Vk: np.ndarray) -> float:
    """``||(I - X X^T) V_k||_2`` (spec 0)."""
    return float(np.linalg.norm(Vk - X @ (X.T @ Vk), 2))


def cde(X: np.ndarray, kn: Known) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``C = V_k^T X``, ``D = V_{>k}^T X``, ``E = D C^{-1}`` (spec 5.1, Lemma 14)."""
    C = kn.Vk.T @ X
    D = kn.Vrest.T @ X
    E = np.linalg.solve(C.T, D.T).T
    return C, D, E


def start_gram(kn: Known, rng: np.random.Generator, tilt: float) -> np.ndarray:
    """A symmetric ``M`` whose top-k eigenvectors span ``X0 = qr(V_k + tilt V_{>k} G)``.

    Stored in a journal under label ``"M"``, it gives a noise-free run a
    non-trivial start (with no noise at all, ``X0`` would already be ``V_k`` and
    the iterations would have nothing to do). ``G[0, k-1] = 1`` makes the slowest
    mode (``v_{k+1}`` in the direction of ``v_k``) present in every seed; the
    other entries are ``N(0, 0.3^2)``.
    """
    d, k = kn.A.shape[1], kn.k
    G = 0.3 * rng.standard_normal((d - k, k))
    G[0, k - 1] = 1.0
    X0 = np.linalg.qr(kn.Vk + tilt * kn.Vrest @ G)[0]
    return sym((X0 * np.arange(k, 0, -1)) @ X0.T)


def nonprivate_run(
    kn: Known,
    M0: np.ndarray,
    T: int,
    route: str = "gram",
) -> tuple[PcaPlan, PcaResult, MemoryJournal]:
    plan = plan_pca(
        PcaParams(rank=kn.k, iterations=T, private=False, route=route), kn.A.shape
    )
    journal = MemoryJournal()
    journal.record("M", M0)
    res = run_pca(
        ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=None, journal=journal)
    )
    assert res.resumed == ("M",)
    return plan, res, journal


def private_plan(shape: tuple[int, int], **kw: Any) -> PcaPlan:
    base: dict[str, Any] = {"rank": 2, "epsilon": 4.0, "delta": 1e-6}
    base.update(kw)
    if base.get("method", "power") == "power":
        base.setdefault("iterations", 3)
        base.setdefault("clip_radius", 1.0)
    return plan_pca(PcaParams(**base), shape)


def keyed_noise(key: NoiseKey, label: str, shape: tuple[int, int]) -> np.ndarray:
    """The unit noise of release ``label`` as documented (independent of run_pca)."""
    return GaussianNoise(
        key=key.derive("pca", label), sigma=1.0, length=shape[0], dim=shape[1]
    ).dense()


#: A spectrum with a slow noiseless rate sigma_{k+1}^2 / sigma_k^2 = 0.9, so that
#: after 20 iterations the iterates are still far from V_k (A1 is not trivial).
SLOW = [3.0, 2.5, 2.0, 1.8, 1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.08]
#: Rate 0.75 for k = 2; the next-slowest modes decay relative to it by
#: (sigma_k^2 / sigma_{k-1}^2) = 0.5 and sigma_{k+2}^2 / sigma_{k+1}^2 = 0.4.
CONTRACT = [1.0, 0.5, 0.375, 0.15, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04]
#: Large gap sigma_2^2 - sigma_3^2 for k = 2, for the private runs.
GAPPED = [0.08, 0.06, 0.03, 0.02, 0.015, 0.012, 0.01, 0.008, 0.006, 0.005, 0.004]
#: A smaller matrix of the same shape of spectrum, for the run-level tests.
SMALL = [0.08, 0.06, 0.03, 0.02, 0.015, 0.01]


# ------------------------------------------------- A1, A2: noise off = classical
@pytest.mark.parametrize("route", ["gram", "two-pass"])
def test_a1_noise_off_equals_orthogonal_iteration(
    rng: np.random.Generator, route: str
) -> None:
    """A1: with noise off, span(X_t) = span of orthogonal iteration from the same X0.

    ``B`` is invertible, so ``span(A^T A X B) = span(A^T A X)``: the preconditioner
    changes no span, only conditioning. Checked for every ``t <= 20``.
    """
    kn = known_svd(rng, 512, SLOW, k=3)
    T = 20
    _, res, _ = nonprivate_run(kn, start_gram(kn, rng, 0.5), T, route)
    assert len(res.history) == T + 1
    S = kn.gram()
    ref = [res.history[0]]
    for _ in range(T):
        ref.append(np.linalg.qr(S @ ref[-1])[0])
    dists = [subspace_dist(a, b) for a, b in zip(ref, res.history, strict=True)]
    assert max(dists) <= EXACT, dists
    # The comparison is not trivial: at t = 20 the iterates are still far from V_k.
    assert sin_theta(res.history[-1], kn.Vk) > 1e-3
    # Negative controls: the tolerance tells one step apart, and tells orthogonal
    # iteration on a Gram matrix perturbed by 1e-6 (relative) apart.
    lagged = [
        subspace_dist(a, b) for a, b in zip(ref[:-1], res.history[1:], strict=True)
    ]
    assert min(lagged) > 1e3 * EXACT
    W = sym(rng.standard_normal(S.shape))
    Sp = S + 1e-6 * np.linalg.norm(S, 2) * W / np.linalg.norm(W, 2)
    other = [res.history[0]]
    for _ in range(T):
        other.append(np.linalg.qr(Sp @ other[-1])[0])
    assert (
        max(subspace_dist(a, b) for a, b in zip(other, res.history, strict=True))
        > 1e2 * EXACT
    )


def test_a2_whitening_noise_off(rng: np.random.Generator) -> None:
    """A2: noise off, ``B = H^(-1/2)`` whitens ``A X``: ``(A X B)^T (A X B) = I_k``."""
    kn = known_svd(rng, 512, SLOW, k=3)
    T = 6
    plan, res, journal = nonprivate_run(kn, start_gram(kn, rng, 0.5), T)
    assert plan.gamma == 1e-12
    assert math.isinf(plan.clip_radius)
    for t in range(T):
        X, H = res.history[t], journal.load(f"H{t}")
        assert H is not None
        assert np.linalg.eigvalsh(H).min() > 1e6 * plan.gamma  # the floor is inactive
        B = eig_floor_inv_sqrt(H, plan.gamma)
        P = kn.A @ X @ B
        np.testing.assert_allclose(P.T @ P, np.eye(kn.k), rtol=0, atol=WHITE)
        # Negative control: without the preconditioner A X is far from orthonormal.
        Q = kn.A @ X
        assert np.abs(Q.T @ Q - np.eye(kn.k)).max() > 0.1


# --------------------------------------------------------- A3: noiseless rate
def test_a3_noiseless_contraction_and_rate(rng: np.random.Generator) -> None:
    """A3 / Lemma 19 without noise: ``E_{t+1} = Sigma_{>k}^2 E_t Sigma_k^{-2}``.

    Hence ``E_t = Sigma_{>k}^{2t} E_0 Sigma_k^{-2t}``, ``m_{t+1} <= r m_t`` with
    ``r = sigma_{k+1}^2 / sigma_k^2``, and ``sin theta_t`` (a function of ``m_t`` by
    Lemma 14) decays at rate ``r``. The measured rate (geometric mean of
    ``sin theta_{t+1} / sin theta_t`` over ``t = 10..19``) must match ``r``: by the
    closed form the other entries of ``E_t`` shrink relative to the leading one by
    ``q^t`` with ``q = max(sigma_k^2/sigma_{k-1}^2, sigma_{k+2}^2/sigma_{k+1}^2) = 0.5``
    here, and the ``m -> m / sqrt(1 + m^2)`` map changes the ratio by
    ``O(m_t^2) < 1e-3``; at ``t >= 10`` both are below 1e-3, so 1% (relative) is a
    safe tolerance that still tells ``r = 0.75`` from the ratio an index slip
    would give (0.5, 0.4, 0.375 or 0.3: at least 33% away).
    """
    kn = known_svd(rng, 512, CONTRACT, k=2)
    T = 20
    _, res, _ = nonprivate_run(kn, start_gram(kn, rng, 0.5), T)
    s2 = kn.sig2
    Lk, Lrest = s2[: kn.k], s2[kn.k :]
    Es = [cde(X, kn)[2] for X in res.history]
    for t in range(T):
        pred = (Lrest[:, None] * Es[t]) / Lk[None, :]
        np.testing.assert_allclose(Es[t + 1], pred, rtol=0, atol=EXACT)
        m0, m1 = np.linalg.norm(Es[t], 2), np.linalg.norm(Es[t + 1], 2)
        assert m1 <= kn.rate * m0 * (1 + EXACT)  # spec 5.3 A3
    sins = np.array([sin_theta(X, kn.Vk) for X in res.history])
    assert sins[0] > 0.05  # a real warm start, not already converged
    measured = float(np.exp(np.mean(np.diff(np.log(sins[10:])))))
    np.testing.assert_allclose(measured, kn.rate, rtol=0.01, atol=0)
    # Negative control: the ratios an index slip would give are outside the 1%
    # tolerance, so the test can catch a wrong contraction factor.
    k = kn.k
    for slip in (s2[k - 1] / s2[k - 2], s2[k + 1] / s2[k], s2[k] / s2[k - 2]):
        assert abs(measured / slip - 1) > 0.3


# ----------------------------------------------- A4: Lemma 19 with the noise on
def _recorded_private_run(
    rng: np.random.Generator, seed: int, T: int = 4
) -> tuple[Known, PcaPlan, PcaResult, MemoryJournal, NoiseKey]:
    """A private run on data with a large gap (clipping inactive, C invertible).

    ``R = 1`` is large: the calibration caps it at ``gamma^(-1/2)``, a radius that
    never clips since ``||a^T X B|| <= ||B|| <= gamma^(-1/2)`` (spec 2.2); the
    test asserts inactivity directly anyway.
    """
    kn = known_svd(rng, 4096, GAPPED, k=2)
    plan = private_plan(kn.A.shape, epsilon=4.0, iterations=T, clip_radius=1.0)
    key = NoiseKey.insecure_from_seed(seed)
    journal = MemoryJournal()
    res = run_pca(
        ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=key, journal=journal)
    )
    return kn, plan, res, journal, key


def test_a4_lemma19_identity_with_noise(
    rng: np.random.Generator, global_seed: int
) -> None:
    """A4: ``E_{t+1} = (Sigma_{>k}^2 E_t Sigma_k^{-2} + L_t)(I + F_t)^{-1}`` [P, Lemma 19].

    ``K_t = Sigma_k^2 C_t B_t``, ``F_t = sigma_Z V_k^T G~_t K_t^{-1}``,
    ``L_t = sigma_Z V_{>k}^T G~_t K_t^{-1}`` with ``sigma_Z = noise_Z R`` and
    ``G~_t`` the unit noise of release ``Z_t``, reconstructed from the key. The
    identity is exact algebra for any invertible ``B`` (floored or not) once
    clipping is inactive, ``C_t`` is invertible and ``||F_t|| < 1``; those
    preconditions are asserted first.
    """
    kn, plan, res, journal, key = _recorded_private_run(rng, global_seed)
    d, k = kn.A.shape[1], kn.k
    sigma_Z = plan.noise_Z * plan.clip_radius
    assert sigma_Z > 0
    s2 = kn.sig2
    Lk, Lrest = s2[:k], s2[k:]
    for t in range(plan.iterations):
        X = res.history[t]
        H, Z = journal.load(f"H{t}"), journal.load(f"Z{t}")
        assert H is not None
        assert Z is not None
        B = eig_floor_inv_sqrt(H, plan.gamma)
        G = keyed_noise(key, f"Z{t}", (d, k))
        # The released Z is the exact clipped sum plus sigma_Z G~ (the documented
        # noise of label Z_t): reconstructing the exact part from the data.
        exact = band_update(kn.A, X, [(B, plan.clip_radius)])
        np.testing.assert_allclose(Z - exact, sigma_Z * G, rtol=0, atol=EXACT * sigma_Z)
        # Preconditions of Lemma 19.
        row_norms = np.linalg.norm(kn.A @ X @ B, axis=1)
        assert row_norms.max() < plan.clip_radius * (1 - 1e-9)  # clipping inactive
        C, _, E = cde(X, kn)
        assert np.linalg.svd(C, compute_uv=False).min() > 0.5
        K = Lk[:, None] * C @ B
        Kinv = np.linalg.inv(K)
        F = sigma_Z * kn.Vk.T @ G @ Kinv
        L = sigma_Z * kn.Vrest.T @ G @ Kinv
        assert np.linalg.norm(F, 2) < 1
        E1 = cde(res.history[t + 1], kn)[2]
        pred = ((Lrest[:, None] * E) / Lk[None, :] + L) @ np.linalg.inv(np.eye(k) + F)
        np.testing.assert_allclose(E1, pred, rtol=0, atol=EXACT)
        # Negative control: the noiseless recurrence misses by the noise terms.
        noiseless = (Lrest[:, None] * E) / Lk[None, :]
        assert np.abs(E1 - noiseless).max() > 1e3 * EXACT


# -------------------------------------------------------- A5: Lemmas 13 and 14
def test_a5_lemmas_13_14(rng: np.random.Generator, global_seed: int) -> None:
    """A5: ``s^2 = 1 - sigma_min^2(V_k^T X)`` (Lemma 13) and ``s = m / sqrt(1 + m^2)``,
    ``m = ||D C^{-1}||_2`` (Lemma 14), for the iterates of a private run and for
    random orthonormal ``X``. Both are identities; the atol of Lemma 13 is absolute
    because ``1 - sigma_min^2`` is formed by a subtraction from 1 (rounding 1e-16).
    """
    kn, _, res, _, _ = _recorded_private_run(rng, global_seed, T=2)
    d = kn.A.shape[1]
    Xs = list(res.history) + [
        np.linalg.qr(rng.standard_normal((d, kn.k)))[0] for _ in range(5)
    ]
    for X in Xs:
        s = sin_theta(X, kn.Vk)
        C, _, E = cde(X, kn)
        smin = np.linalg.svd(C, compute_uv=False).min()
        np.testing.assert_allclose(s**2, 1 - smin**2, rtol=0, atol=1e-14)
        m = np.linalg.norm(E, 2)
        np.testing.assert_allclose(s, m / math.sqrt(1 + m * m), rtol=EXACT, atol=0)


# ------------------------------------------------------ A6: Analyze Gauss, Lemma 9
def test_a6_analyze_gauss_within_davis_kahan(
    rng: np.random.Generator, global_seed: int
) -> None:
    """A6 [P, Lemma 9]: ``sin theta(X0, V_k) <= ||W|| / (Delta_k - ||W||)`` per run,
    with ``W = M - A^T A`` recorded from the journal, whenever ``||W|| < Delta_k``.

    The budget (epsilon = 0.3) makes ``||W||`` about a quarter of the gap, so the
    bound is not vacuous: in a 20-run simulation ``sin theta / bound`` ranged over
    0.18-0.42 and ``||W|| / Delta_k`` stayed below 0.27. Negative control:
    swapping the k-th returned eigenvector for the (k+1)-th violates the bound.
    """
    kn = known_svd(rng, 4096, [0.08, 0.06, 0.03, 0.02, 0.015, 0.012, 0.01, 0.008], k=2)
    plan = private_plan(kn.A.shape, method="analyze-gauss", epsilon=0.3)
    S = kn.gram()
    ratios = []
    for run in range(8):
        key = NoiseKey.insecure_from_seed(1000 * global_seed + run)
        journal = MemoryJournal()
        res = run_pca(
            ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=key, journal=journal)
        )
        assert res.n_passes == 1
        assert res.releases == ("M",)
        M = journal.load("M")
        assert M is not None
        w = np.linalg.norm(M - S, 2)
        if w >= kn.gap:  # outside the lemma's hypothesis
            continue
        bound = w / (kn.gap - w)
        err = sin_theta(res.components, kn.Vk)
        assert err <= bound
        ratios.append(err / bound)
        Q = np.linalg.eigh(M)[1][:, ::-1]
        wrong = np.column_stack([Q[:, : kn.k - 1], Q[:, kn.k]])
        assert sin_theta(wrong, kn.Vk) > bound
    assert len(ratios) >= 6  # ||W|| < gap/3 in every simulated run
    assert max(ratios) > 0.1  # the check is not vacuous (simulation: >= 0.18)


def test_analyze_gauss_is_topk_of_released_m(
    rng: np.random.Generator, global_seed: int
) -> None:
    """Analyze Gauss returns the top-k eigenvectors (and top k+1 eigenvalues) of the
    released M, checked against numpy's dense eigh. Eigenvector accuracy of a
    backward-stable eigh is ``eps ||M|| / gap`` (Davis-Kahan); ``1e-10`` covers it
    with the gap of M below (asserted)."""
    kn = known_svd(rng, 2048, SMALL, k=2)
    plan = private_plan(kn.A.shape, method="analyze-gauss", epsilon=2.0)
    journal = MemoryJournal()
    key = NoiseKey.insecure_from_seed(global_seed)
    res = run_pca(
        ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=key, journal=journal)
    )
    M = journal.load("M")
    assert M is not None
    np.testing.assert_array_equal(M, M.T)
    lam, Q = np.linalg.eigh(M)
    lam, Q = lam[::-1], Q[:, ::-1]
    assert (lam[kn.k - 1] - lam[kn.k]) > 1e-3 * abs(lam[0])
    assert subspace_dist(Q[:, : kn.k], res.components) <= EXACT
    np.testing.assert_allclose(res.eigenvalues, lam[: kn.k + 1], rtol=EXACT, atol=0)
    np.testing.assert_allclose(
        res.components.T @ res.components, np.eye(kn.k), rtol=0, atol=EXACT
    )
    # M is the exact Gram plus noise_init sym(G) with G the documented keyed noise.
    d = kn.A.shape[1]
    G = keyed_noise(key, "M", (d, d))
    np.testing.assert_allclose(
        M - sym(kn.gram()),
        plan.noise_init * sym(G),
        rtol=0,
        atol=EXACT * plan.noise_init,
    )


# ---------------------------------------------------------------- A7: Lemma 17
def _lemma17_case(
    sig2: np.ndarray, k: int, X: np.ndarray, W: np.ndarray, gamma: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """``(lambda_min(H), eig(P^T P), B)`` for ``H = X^T A^T A X + W`` in the eigenbasis.

    In the basis of ``V`` (``A^T A = diag(sig2)``), ``X`` has blocks ``C`` (top k
    rows) and ``D``; ``P = Sigma_k C B`` with ``B`` from the implementation.
    """
    H = sym(X.T @ (sig2[:, None] * X) + W)
    B = eig_floor_inv_sqrt(H, gamma)
    C = X[:k]
    P = np.sqrt(sig2[:k])[:, None] * C @ B
    return float(np.linalg.eigvalsh(H).min()), np.linalg.eigvalsh(P.T @ P), B


def test_a7_lemma17_adversarial(rng: np.random.Generator) -> None:
    """A7 [P, Lemma 17]: if ``||W|| <= gamma/4``, ``s_t <= 1/2``, ``gamma <= sigma_k^2/4``
    then ``H >= 11/16 sigma_k^2 >= gamma`` (the floor is inactive, so ``B = H^(-1/2)``)
    and ``9/13 I <= P^T P <= 12/11 I`` for ``P = Sigma_k C B``.

    Adversarial cases sit on the boundary of the hypotheses (``s = 1/2`` exactly,
    ``gamma = sigma_k^2/4``, ``W = +-gamma/4`` along the worst direction,
    ``sigma_{k+1} -> sigma_k`` or trailing ``sigma -> 0``), plus random ones. The
    bounds on ``lambda_min(H)`` and the top of ``P^T P`` are attained (to 1e-9), so
    the cases really are the worst; the lowest ``P^T P`` eigenvalue found is
    ``12/17 = 0.706 > 9/13 = 0.692``, the sharp value of this argument
    (``(1 + (1/4 + 1/16)/(3/4))^-1``). Negative control: ``||W|| = gamma`` or
    ``s = 0.9`` breaks the bounds.
    """
    d, k = 8, 3
    sk2 = 1.0
    gamma = sk2 / 4
    tiny = 1e-12

    def tilted(s: float, into: int) -> np.ndarray:
        """``X = [e_1, .., e_{k-1}, sqrt(1-s^2) e_k + s e_into]``: sin theta = s."""
        X = np.zeros((d, k))
        X[: k - 1, : k - 1] = np.eye(k - 1)
        X[k - 1, k - 1] = math.sqrt(1 - s * s)
        X[into, k - 1] = s
        return X

    worst_low_h, worst_high_p, worst_low_p = np.inf, 0.0, np.inf
    configs = []
    # Case 1: trailing direction with sigma ~ 0, W = -gamma/4 on that direction:
    # lambda_min(H) -> (3/4 - 1/16) sigma_k^2 and P^T P -> 12/11.
    sig2 = np.array([4.0, 2.0, sk2, 1.0 - 1e-6, 0.5, 0.3, 0.1, tiny])
    X = tilted(0.5, d - 1)
    W = np.zeros((k, k))
    W[k - 1, k - 1] = -gamma / 4
    configs.append((sig2, X, W))
    # Case 2: tilt into sigma_{k+1} ~ sigma_k with W = +gamma/4: lowest P^T P.
    X = tilted(0.5, k)
    W = np.zeros((k, k))
    W[k - 1, k - 1] = gamma / 4
    configs.append((sig2, X, W))
    # Random cases within the hypotheses.
    for _ in range(300):
        sig2r = np.sort(rng.uniform(0, sk2, d))[::-1]
        sig2r[:k] = np.sort(rng.uniform(sk2, 4 * sk2, k))[::-1]
        sig2r[k - 1] = sk2
        Y = np.linalg.qr(rng.standard_normal((d, k)))[0]
        # Rotate Y towards V_k until its sin theta is at most 1/2.
        target = rng.uniform(0, 0.5)
        Ck, Dk = Y[:k], Y[k:]
        Dk = Dk / max(np.linalg.norm(Dk, 2), 1e-300)
        Xr = np.vstack([np.linalg.qr(Ck)[0] * math.sqrt(1 - target**2), Dk * target])
        Xr = np.linalg.qr(Xr)[0]
        assert sin_theta(Xr, np.eye(d)[:, :k]) <= 0.5 + 1e-12
        Wr = sym(rng.standard_normal((k, k)))
        Wr *= rng.choice([-1, 1]) * gamma / 4 / np.linalg.norm(Wr, 2)
        configs.append((sig2r, Xr, Wr))
    for sig2c, Xc, Wc in configs:
        lo_h, pp, B = _lemma17_case(sig2c, k, Xc, Wc, gamma)
        assert lo_h >= 11 / 16 * sk2 * (1 - 1e-12)
        assert lo_h >= gamma
        H = sym(Xc.T @ (sig2c[:, None] * Xc) + Wc)
        lam, Q = np.linalg.eigh(H)
        np.testing.assert_allclose(B, (Q / np.sqrt(lam)) @ Q.T, rtol=EXACT, atol=0)
        assert pp.min() >= 9 / 13
        assert pp.max() <= 12 / 11 * (1 + 1e-12)
        worst_low_h = min(worst_low_h, lo_h)
        worst_high_p = max(worst_high_p, pp.max())
        worst_low_p = min(worst_low_p, pp.min())
    # The adversarial cases attain the bounds (tight to the 1e-6 gap and sigma ~ 0).
    np.testing.assert_allclose(worst_low_h, 11 / 16 * sk2, rtol=1e-9, atol=0)
    np.testing.assert_allclose(worst_high_p, 12 / 11, rtol=1e-9, atol=0)
    np.testing.assert_allclose(worst_low_p, 12 / 17, rtol=1e-5, atol=0)
    # Negative controls: outside the hypotheses the conclusions fail.
    W = np.zeros((k, k))
    W[k - 1, k - 1] = -gamma  # ||W|| = gamma, four times too large
    lo_h, pp, _ = _lemma17_case(sig2, k, tilted(0.5, d - 1), W, gamma)
    assert lo_h < 11 / 16 * sk2
    assert pp.max() > 12 / 11
    lo_h, pp, _ = _lemma17_case(sig2, k, tilted(0.9, d - 1), np.zeros((k, k)), gamma)
    assert lo_h < gamma  # the floor becomes active


# ------------------------------------------------------ passes and the two routes
def test_passes_and_routes_agree(rng: np.random.Generator, global_seed: int) -> None:
    """``n_passes`` = 1 + T (Gram route), 1 + 2T (two-pass); same key => same releases
    to 1e-10 (spec 4.5: the routes differ only in the rounding of ``H``)."""
    kn = known_svd(rng, 1024, SMALL, k=2)
    T = 3
    key = NoiseKey.insecure_from_seed(global_seed)
    out = {}
    for route, passes in (("gram", 1 + T), ("two-pass", 1 + 2 * T)):
        plan = private_plan(kn.A.shape, iterations=T, route=route)
        assert plan.n_passes == passes
        src = ArrayRowSource(kn.A)
        journal = MemoryJournal()
        res = run_pca(src, plan, ReleaseHooks(noise_key=key, journal=journal))
        assert res.n_passes == passes == src.n_passes
        assert res.releases == ("M", "H0", "Z0", "H1", "Z1", "H2", "Z2")
        out[route] = (res, journal)
    (rg, jg), (rt, jt) = out["gram"], out["two-pass"]
    for label in rg.releases:
        a, b = jg.load(label), jt.load(label)
        assert a is not None
        assert b is not None
        np.testing.assert_allclose(b, a, rtol=0, atol=EXACT * np.abs(a).max())
    np.testing.assert_allclose(rt.components, rg.components, rtol=0, atol=EXACT)
    # Analyze Gauss reads the data once.
    plan = private_plan(kn.A.shape, method="analyze-gauss")
    assert plan.n_passes == 1
    assert run_pca(ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=key)).n_passes == 1


# ------------------------------------------------------------ journal and resume
def test_journal_full_resume_reads_nothing(
    rng: np.random.Generator, global_seed: int
) -> None:
    """A second run on a complete journal: zero passes, identical output, every
    label resumed, and the ledger hook (``charge``) never called."""
    kn = known_svd(rng, 1024, SMALL, k=2)
    plan = private_plan(kn.A.shape, iterations=3)
    key = NoiseKey.insecure_from_seed(global_seed)
    journal = MemoryJournal()
    calls: list[int] = []
    first = run_pca(
        ArrayRowSource(kn.A),
        plan,
        ReleaseHooks(noise_key=key, journal=journal, charge=lambda: calls.append(1)),
    )
    assert calls == [1]
    assert first.resumed == ()
    src = ArrayRowSource(kn.A)
    again = run_pca(
        src,
        plan,
        ReleaseHooks(noise_key=key, journal=journal, charge=lambda: calls.append(2)),
    )
    assert calls == [1]
    assert again.n_passes == 0 == src.n_passes
    assert again.resumed == again.releases == first.releases
    np.testing.assert_array_equal(again.components, first.components)
    np.testing.assert_array_equal(again.eigenvalues, first.eigenvalues)


def test_journal_partial_resume_is_bitwise(
    rng: np.random.Generator, global_seed: int
) -> None:
    """A journal holding only M and H0 resumes at Z0 and ends bit for bit where the
    uninterrupted run ends (keyed noise + deterministic reductions, spec 4.9)."""
    kn = known_svd(rng, 1024, SMALL, k=2)
    plan = private_plan(kn.A.shape, iterations=3)
    key = NoiseKey.insecure_from_seed(global_seed)
    full_journal = MemoryJournal()
    full = run_pca(
        ArrayRowSource(kn.A), plan, ReleaseHooks(noise_key=key, journal=full_journal)
    )
    partial = MemoryJournal()
    for label in ("M", "H0"):
        v = full_journal.load(label)
        assert v is not None
        partial.record(label, v)
    calls: list[int] = []
    resumed = run_pca(
        ArrayRowSource(kn.A),
        plan,
        ReleaseHooks(noise_key=key, journal=partial, charge=lambda: calls.append(1)),
    )
    assert calls == [1]
    assert resumed.resumed == ("M", "H0")
    np.testing.assert_array_equal(resumed.components, full.components)
    for label in full.releases:
        a, b = full_journal.load(label), partial.load(label)
        assert a is not None
        assert b is not None
        np.testing.assert_array_equal(b, a)
    # Negative control: a different key gives a different Z0, so the equality
    # above is not automatic.
    other = run_pca(
        ArrayRowSource(kn.A),
        plan,
        ReleaseHooks(noise_key=NoiseKey.insecure_from_seed(global_seed + 1)),
    )
    assert subspace_dist(other.components, full.components) > 1e-6


# ------------------------------------------------------------------- P6 taint
def test_secret_is_redacted_and_unpicklable() -> None:
    """P6: a Secret prints no value and cannot be pickled."""
    value = np.array([[1234.5678, 0.25], [0.25, 9876.5]])
    s = Secret(value)
    for text in (repr(s), str(s), f"{s}", repr([s])):
        assert "redacted" in text
        for token in ("1234", "9876", "0.25"):
            assert token not in text
    with pytest.raises(TypeError, match="not serialisable"):
        pickle.dumps(s)
    # Negative control: the bare array pickles (the refusal is the wrapper's).
    assert pickle.loads(pickle.dumps(value)).shape == (2, 2)


@pytest.mark.parametrize(
    ("func", "args"),
    [(topk_eig, (1,)), (eig_floor_inv_sqrt, (1e-3,)), (qr_pos, ())],
    ids=["topk_eig", "eig_floor_inv_sqrt", "qr_pos"],
)
def test_postprocessing_refuses_secrets(func: Any, args: tuple[Any, ...]) -> None:
    """P6: post-processing functions accept released values only."""
    M = np.array([[2.0, 0.5], [0.5, 1.0]])
    with pytest.raises(TypeError, match="released"):
        func(Secret(M), *args)
    func(M, *args)  # negative control: the released array is accepted


class RecordingSource(ArrayRowSource):
    """Records the preconditioners handed to each power step."""

    def __init__(self, A: np.ndarray) -> None:
        super().__init__(A)
        self.trials: list[list[tuple[np.ndarray, float]]] = []

    def power_step(self, X: np.ndarray, trials: Any) -> Secret:
        self.trials.append([(np.array(B, copy=True), R) for B, R in trials])
        return super().power_step(X, trials)


def test_preconditioner_reads_released_h_only(
    rng: np.random.Generator, global_seed: int
) -> None:
    """P6 / MUST 1.4.5: with the released M and H0 fixed, changing the data (hence
    the exact H0) leaves B0 bit for bit unchanged, and the noise of Z0 too."""
    kn = known_svd(rng, 1024, SMALL, k=2)
    plan = private_plan(kn.A.shape, iterations=2)
    key = NoiseKey.insecure_from_seed(global_seed)
    src1 = RecordingSource(kn.A)
    j1 = MemoryJournal()
    run_pca(src1, plan, ReleaseHooks(noise_key=key, journal=j1))
    A2 = kn.A.copy()
    A2[: A2.shape[0] // 2] *= 0.5  # a very different exact Gram and exact H0
    j2 = MemoryJournal()
    for label in ("M", "H0"):
        v = j1.load(label)
        assert v is not None
        j2.record(label, v)
    src2 = RecordingSource(A2)
    run_pca(src2, plan, ReleaseHooks(noise_key=key, journal=j2))
    X0 = topk_eig(j1.load("M"), kn.k)[0]
    h_exact_1 = X0.T @ kn.A.T @ kn.A @ X0
    h_exact_2 = X0.T @ A2.T @ A2 @ X0
    assert np.abs(h_exact_1 - h_exact_2).max() > 1.0  # the exact H0 did change
    (B1, R1), (B2, R2) = src1.trials[0][0], src2.trials[0][0]
    np.testing.assert_array_equal(B2, B1)
    assert R1 == R2 == plan.clip_radius
    # Same noise on Z0: the releases differ exactly by the change of the exact sums.
    z1, z2 = j1.load("Z0"), j2.load("Z0")
    assert z1 is not None
    assert z2 is not None
    d1 = band_update(prep_rows(kn.A), X0, [(B1, R1)])
    d2 = band_update(prep_rows(A2), X0, [(B1, R1)])
    np.testing.assert_allclose(z2 - z1, d2 - d1, rtol=0, atol=EXACT * np.abs(z1).max())
    # Negative control: a different released H0 gives a different B0.
    j3 = MemoryJournal()
    j3.record("M", j1.load("M"))
    j3.record("H0", 2.0 * j1.load("H0"))
    src3 = RecordingSource(kn.A)
    run_pca(src3, plan, ReleaseHooks(noise_key=key, journal=j3))
    assert not np.array_equal(src3.trials[0][0][0], B1)


# -------------------------------------------------------------- plan validation
@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"rank": 7}, "rank"),  # rank > d
        ({"rank": 9}, "rank"),
        ({"rank": 0}, "rank"),
        ({"rank": 2.0}, "rank"),
        ({"iterations": None, "method": "power"}, "iterations"),
        ({"iterations": 0}, "iterations"),
        ({"clip_radius": None, "method": "power"}, "clip_radius"),
        ({"clip_radius": -1.0}, "clip_radius"),
        ({"route": "three-pass"}, "route"),
        ({"method": "svd"}, "method"),
        ({"method": "analyze-gauss", "iterations": 3}, "iterations"),
        ({"epsilon": None}, "epsilon"),
        (
            {"private": False, "epsilon": None, "delta": None, "clip_radius": 0.0},
            "clip_radius",
        ),
        ({"private": False}, "epsilon"),  # a non-private run takes no budget
    ],
)
def test_plan_validation_names_the_parameter(kw: dict[str, Any], needle: str) -> None:
    """Bad plans raise InvalidParameterError whose message names the parameter."""
    base: dict[str, Any] = {
        "rank": 2,
        "epsilon": 1.0,
        "delta": 1e-6,
        "iterations": 3,
        "clip_radius": 0.5,
    }
    base.update(kw)
    with pytest.raises(InvalidParameterError, match=needle):
        plan_pca(PcaParams(**base), (100, 6))


def test_plan_validation_accepts_the_boundary() -> None:
    """Negative control of the table above: ``rank = d`` and a valid route pass."""
    plan = plan_pca(
        PcaParams(
            rank=6,
            epsilon=1.0,
            delta=1e-6,
            iterations=1,
            clip_radius=0.5,
            route="two-pass",
        ),
        (100, 6),
    )
    assert plan.n_passes == 3
    with pytest.raises(InvalidParameterError, match="shape"):
        plan_pca(PcaParams(rank=1, private=False, iterations=1), (100, 1))


@pytest.mark.parametrize("n_trials", [1, 3])
@pytest.mark.parametrize("sub_block_bytes", [2**12, 2**20])
def test_update_kernel_matches_the_definition(
    rng: np.random.Generator,
    monkeypatch: pytest.MonkeyPatch,
    n_trials: int,
    sub_block_bytes: int,
) -> None:
    """``band_pass`` and ``band_update`` equal ``sum_i a_i Clip_R(a_i^T X_t B_t)``.

    Reference: prepared rows, then each trial's block clipped on its own with
    :func:`clip_rows`. Covers the matrix-vector route (2 columns) and the
    matrix-matrix route (6 columns), sub-blocks that split the band unevenly,
    rows far outside ``[-1, 1]``, a zero row, a non-finite row and an unclipped
    trial (``R = inf``).
    """
    from pipeline.algorithms.pca import kernels as pca_kernels

    monkeypatch.setattr(pca_kernels, "SUB_BLOCK_BYTES", sub_block_bytes)
    n, d, k = 301, 7, 2
    A = rng.standard_normal((n, d)) * rng.choice([0.01, 1.0, 1e3], size=(n, 1))
    A[5] = 0.0
    A[17, 3] = np.nan
    A = A.astype(np.float32)  # as read from a float32 store
    X = np.linalg.qr(rng.standard_normal((d, k * n_trials)))[0]
    radii = [0.05, math.inf, 0.3][:n_trials]
    trials = [(rng.standard_normal((k, k)), R) for R in radii]
    C = 2.0
    a = prep_rows(A, C)
    ref = np.hstack(
        [
            a.T @ clip_rows(a @ X[:, t * k : (t + 1) * k] @ B, R)
            for t, (B, R) in enumerate(trials)
        ]
    )
    got = band_pass(A, "update", (X, trials), C, True)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(band_update(a, X, trials), ref, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize(("d", "want_rows"), [(200, [4096, 4096, 808]), (16, [8192, 808])])
def test_gram_kernel_partials_span_thousands_of_rows(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, d: int, want_rows: list[int]
) -> None:
    """A band's Gram matrix is summed from partial Grams of 4096 rows or more.

    Each partial costs a fresh ``d x d`` product and an addition besides its
    ``r d^2`` multiply-adds, so cache-sized sub-blocks (655 rows of 200 columns)
    would spend as much on those as on the products. Control: 16 columns, whose
    cache-sized sub-blocks (8192 rows) are already larger, keep them. The sum
    equals the Gram of the prepared rows to the bound of a float64 sum of
    ``n`` products of entries at most 1 in size (``n^2 eps``, Higham 3.1).
    """
    from pipeline.algorithms.pca import kernels as pca_kernels

    rows: list[int] = []
    real = pca_kernels.band_gram

    def counting(a: np.ndarray, scale: Any = None) -> np.ndarray:
        rows.append(a.shape[0])
        return real(a, scale)

    monkeypatch.setattr(pca_kernels, "band_gram", counting)
    n = 9000
    A = (rng.standard_normal((n, d)) * rng.choice([0.01, 1.0, 1e3], size=(n, 1))).astype(
        np.float32
    )
    got = band_pass(A, "gram", None, 2.0, True)
    assert rows == want_rows
    a = prep_rows(A, 2.0)
    np.testing.assert_allclose(got, a.T @ a, rtol=0, atol=n * n * np.finfo(float).eps)
