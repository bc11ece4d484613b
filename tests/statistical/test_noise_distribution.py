"""Calibrated noise and private utility, checked as distributions (spec 4.4, 7.3; T5, T17, T18).

Every check here is seeded (insecure noise keys derived from ``global_seed``), so CI is
deterministic. Each distributional assertion fails when its p-value is below
``P_FAIL`` = 1e-4 (1e-6 in the 100-seed nightly sweep, style B.10); under the null
hypothesis each one therefore fails with probability <= P_FAIL per seed, and each
test's docstring states how many such checks it makes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import LrfPlan, plan_lrf, run_lrf
from pipeline.algorithms.lrf import kernels as lrf
from pipeline.linalg.metrics import spectral_error
from pipeline.linalg.synthetic import low_rank_matrix
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Algorithm, ClipSpec, LrfParams, PrivacyUnit

pytestmark = pytest.mark.statistical

P_FAIL = 1e-6 if os.environ.get("PIPELINE_TEST_SEEDS") == "all" else 1e-4
SPECTRAL, LOW_SPACE = Algorithm.SPECTRAL, Algorithm.LOW_SPACE


def _normal_pvalues(x: np.ndarray) -> tuple[float, float]:
    """(KS p-value against N(0, 1), two-sided chi-square p-value of sum x^2 ~ chi2_N)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    ks = stats.kstest(x, "norm").pvalue
    q, n = float(np.sum(x * x)), x.size
    chi = 2.0 * min(stats.chi2.cdf(q, n), stats.chi2.sf(q, n))
    return float(ks), float(chi)


def _assert_standard_normal(x: np.ndarray, what: str) -> None:
    ks, chi = _normal_pvalues(x)
    assert ks >= P_FAIL, f"{what}: KS p = {ks:.2e} < {P_FAIL:g} against N(0, 1)"
    assert chi >= P_FAIL, (
        f"{what}: variance chi-square p = {chi:.2e} < {P_FAIL:g} (var = {np.var(x):.4f})"
    )


def _plan(
    shape: tuple[int, int],
    alg: Algorithm,
    *,
    k: int = 5,
    t: int = 40,
    v: int = 160,
    epsilon: float = 1.0,
    clip_norm: float = 1.0,
) -> LrfPlan:
    return plan_lrf(
        LrfParams(
            algorithm=alg,
            rank=k,
            sketch_size=t,
            core_size=v,
            epsilon=epsilon,
            delta=1e-6,
            clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=clip_norm),
            # the spec's worked-example calibration: Gaussian S, the tail bound on
            # Phi (no sketch-space clipping), even split
            operator="gaussian",
            range_clip=False,
            range_weight=0.5 if alg is SPECTRAL else 2.0 / 3.0,
        ),
        shape,
    )


def _key(global_seed: int, i: int = 0) -> NoiseKey:
    return NoiseKey.insecure_from_seed(1000 * global_seed + i)


def _zeta(plan: LrfPlan) -> float:
    """Spec 7.3 noise-floor estimate ``max_i sigma_i (sqrt(m) + sqrt(n))``."""
    assert plan.calibration is not None
    m, n = plan.shape
    return max(s.sigma for s in plan.calibration.sketches) * (
        math.sqrt(m) + math.sqrt(n)
    )


# ------------------------------------------------------------ the noise generator


def test_gaussian_noise_with_plan_sigma_is_calibrated(global_seed: int) -> None:
    """noise / sigma_Y ~ N(0, 1) (KS + chi-square), with sigma from the worked-example plan.

    2 checks: false-failure probability <= 2 P_FAIL per seed.
    """
    plan = _plan((5000, 300), SPECTRAL)
    sigma = plan.sigma("Y")
    # spec 4.4 worked example, printed digits (same plan as test_plan.py)
    np.testing.assert_allclose(sigma, 10.68, rtol=0, atol=0.005)
    noise = GaussianNoise(
        key=_key(global_seed).derive(int(NoiseCode.Y)),
        sigma=sigma,
        length=5000,
        dim=plan.t,
    )
    x = noise.dense() / sigma
    _assert_standard_normal(x, "GaussianNoise")
    # negative control: a 5% error in sigma is caught (chi-square z ~ 30 at N = 2e5)
    assert min(_normal_pvalues(x * 1.05)) < P_FAIL
    # and so is noise added twice, as per-chunk noise on two chunks would be
    assert min(_normal_pvalues(x * math.sqrt(2.0))) < P_FAIL


# --------------------------------------------------- the noise the algorithm adds


class _Recorder(ArraySource):
    """Records the exact sketches and the tall ``Y`` before and after noise."""

    def sketch(self, request: Any) -> dict[str, Any]:
        result = super().sketch(request)
        self.exact = dict(result)  # the algorithm pops its dict once the noise is added
        return result

    def tall_noise_gram(self, Y: np.ndarray, fn: Any, op: Any) -> Any:
        out = super().tall_noise_gram(Y, fn, op)
        self.before, self.after = np.array(Y), np.array(out[0])
        return out


def test_spectral_release_noise_is_calibrated(
    rng: np.random.Generator, global_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(released - exact) / sigma is N(0, 1) for Y and for Z, as the algorithm adds it.

    Z is captured where the factorization reads it (the argument of
    ``core_one_sided``). 4 checks: false-failure probability <= 4 P_FAIL per seed.
    """
    A = rng.standard_normal((600, 300)) * 0.2
    plan = _plan(A.shape, SPECTRAL)
    seen: dict[str, np.ndarray] = {}
    real = lrf.core_one_sided

    def core(SU: np.ndarray, Z: np.ndarray, rank: int) -> Any:
        seen["Z"] = np.array(Z)
        return real(SU, Z, rank)

    monkeypatch.setattr(lrf, "core_one_sided", core)
    src = _Recorder(A)
    run_lrf(
        src, plan, ReleaseHooks(sketch_seed=global_seed, noise_key=_key(global_seed))
    )
    np.testing.assert_array_equal(
        src.before, src.exact["Y"]
    )  # noise goes on the exact Y
    _assert_standard_normal((src.after - src.exact["Y"]) / plan.sigma("Y"), "Y")
    assert seen["Z"].shape == (plan.v, 300)
    _assert_standard_normal((seen["Z"] - src.exact["Z"]) / plan.sigma("Z"), "Z")


def test_low_space_release_noise_is_calibrated(
    rng: np.random.Generator, global_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Y_c, Y_r and the core Z of Low-Space-LRF carry N(0, sigma_i^2) noise.

    Y_r is captured where the algorithm takes its top right singular vectors, Z at
    ``core_two_sided``.
    6 checks: false-failure probability <= 6 P_FAIL per seed.
    """
    A = rng.standard_normal((600, 300)) * 0.2
    plan = _plan(A.shape, LOW_SPACE)
    seen: dict[str, np.ndarray] = {}
    real_core, real_top = lrf.core_two_sided, lrf.top_singular_vectors
    N = plan.oriented_shape[1]

    def core(SU: np.ndarray, TtV: np.ndarray, Z: np.ndarray, rank: int) -> Any:
        seen["Z"] = np.array(Z)
        return real_core(SU, TtV, Z, rank)

    def top(Y: np.ndarray, rank: int) -> np.ndarray:
        if Y.shape[0] == N:  # Y_r^T (the other call gets Y_c's t x t R)
            seen["Yr"] = np.array(Y).T
        return real_top(Y, rank)

    monkeypatch.setattr(lrf, "core_two_sided", core)
    monkeypatch.setattr(lrf, "top_singular_vectors", top)
    src = _Recorder(A)
    run_lrf(
        src, plan, ReleaseHooks(sketch_seed=global_seed, noise_key=_key(global_seed))
    )
    _assert_standard_normal((src.after - src.exact["Yc"]) / plan.sigma("Yc"), "Yc")
    _assert_standard_normal((seen["Yr"] - src.exact["Yr"]) / plan.sigma("Yr"), "Yr")
    _assert_standard_normal((seen["Z"] - src.exact["Z"]) / plan.sigma("Z"), "Z")


# -------------------------------------------------------------------- T18 zero matrix


def _scaled(plan: LrfPlan, factor: float) -> LrfPlan:
    """The same plan with every sigma multiplied by ``factor`` (a broken-noise control)."""
    cal = plan.calibration
    assert cal is not None
    sketches = tuple(
        dataclasses.replace(s, sigma=s.sigma * factor) for s in cal.sketches
    )
    return dataclasses.replace(
        plan, calibration=dataclasses.replace(cal, sketches=sketches)
    )


@pytest.mark.parametrize("alg", [SPECTRAL, LOW_SPACE], ids=["spectral", "low-space"])
def test_t18_zero_matrix_output_is_at_the_noise_floor(
    global_seed: int, alg: Algorithm
) -> None:
    """T18: A = 0 gives ||M_k||_2 / zeta_est in a band: [0.1, 3] for Spectral, [0.04, 0.6]
    for Low-Space.

    Spectral's band is spec 7.5 T18's (observed ~0.55 there; here 0.36-0.44 over
    12 seeds with the denoised range basis). Low-Space keeps only the top k
    directions of Y_c and Y_r (private-lrf-2 section 4), so much less core noise
    reaches a zero matrix's output: 0.089-0.174 over 12 seeds (the spec's ~0.25
    was for orth over all t columns); its band keeps >= 2.2x from both ends.
    Controls: noise x0 gives 0 and noise x10 leaves the band (x10 gives >= 0.89
    for Low-Space, >= 3.6 for Spectral), so missing or multiplied noise fails.
    Deterministic given the seed.
    """
    A = np.zeros((400, 200))
    plan = _plan(A.shape, alg)
    zeta = _zeta(plan)

    def ratio(p: LrfPlan) -> float:
        f = run_lrf(
            ArraySource(A),
            p,
            ReleaseHooks(sketch_seed=global_seed, noise_key=_key(global_seed, 1)),
        )
        return float(np.linalg.norm((f.U * f.S) @ f.V.T, 2)) / zeta

    low, high = (0.1, 3.0) if alg is SPECTRAL else (0.04, 0.6)
    r = ratio(plan)
    assert low <= r <= high, f"||M_k|| / zeta_est = {r:.3f}"
    assert ratio(_scaled(plan, 0.0)) < 1e-12  # no noise: M_k = 0, far below the band
    assert ratio(_scaled(plan, 10.0)) > high  # 10x noise: above the band


# ------------------------------------------------------------ T17 and DP utility


def _low_rank(m: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    # sigma_i = sqrt(m / k): rows have norm ~1, the largest signal row clipping allows
    return low_rank_matrix(m, n, np.full(k, math.sqrt(m / k)), rng)


@pytest.mark.parametrize("alg", [SPECTRAL, LOW_SPACE], ids=["spectral", "low-space"])
def test_t17_error_scales_as_one_over_epsilon(
    rng: np.random.Generator, global_seed: int, alg: Algorithm
) -> None:
    """T17: err(eps/2) / err(eps) in [1.6, 2.4] for a noise-dominated low-rank A.

    C >= the largest row norm, so clipping is the identity and the noise is the
    only perturbation. Then sigma_Y(eps/2)/sigma_Y(eps) = s(0.5)/s(1) = 8.348/4.365
    = 1.91 (spec 4.3) and the error follows it (measured 1.91 for both algorithms).
    The interval is T17's; deterministic given the seed.
    """
    k = 5
    A = _low_rank(400, 200, k, rng)
    C = float(np.linalg.norm(A, axis=1).max())
    errs = []
    for eps in (1.0, 0.5):
        plan = _plan(A.shape, alg, epsilon=eps, clip_norm=C)
        f = run_lrf(
            ArraySource(A),
            plan,
            ReleaseHooks(sketch_seed=global_seed, noise_key=_key(global_seed, 2)),
        )
        errs.append(spectral_error(A, f.U, f.S, f.V))  # sigma_{k+1}(A) = 0
    ratio = errs[1] / errs[0]
    assert 1.6 <= ratio <= 2.4, f"err(eps/2) / err(eps) = {ratio:.3f}"


@pytest.mark.parametrize("alg", [SPECTRAL, LOW_SPACE], ids=["spectral", "low-space"])
def test_dp_utility_additive_error_tracks_noise_floor(
    rng: np.random.Generator, global_seed: int, alg: Algorithm
) -> None:
    """Acceptance "DP utility": additive error vs zeta_est = max_i sigma_i (sqrt(m) + sqrt(n)).

    For (m, n) = (400, 200) and (1600, 800) (both 4x), with one clip norm
    C >= every row norm (clipping is the identity), the additive error
    ``||A - M_k||_2 - sigma_{k+1}`` must be

    * of the order of zeta_est (Spectral: in [0.2 zeta, 3 zeta]; spec 7.3 observed
      0.8-1.2 zeta for orth over all t columns; with the denoised range basis
      we measure 0.35-0.42 over 12 seeds). Low-Space is held to [0.02, 3] zeta:
      its noise-floor error comes from the v x v core noise, does not grow with
      m, n, and its denoised bases let little of it through (measured
      0.042-0.137 over 12 seeds);
    * Spectral: growing like sqrt(m) + sqrt(n), i.e. err ratio within [0.5, 2] of
      the (sqrt(m) + sqrt(n)) ratio 2 (measured 0.84-1.13 over 4 seeds).

    Row clipping bounds sigma_k(A) <= C sqrt(m/k) < zeta_est / (10 sqrt(k)) at eps = 1,
    so A is necessarily below the noise floor here (spec 8, "when DP is hopeless").
    Deterministic given the seed; thresholds are >= 1.7x away from every measured
    value (12 seeds, both sizes).
    """
    k = 5
    sizes = [(400, 200), (1600, 800)]
    mats = [_low_rank(m, n, k, rng) for m, n in sizes]
    C = max(float(np.linalg.norm(A, axis=1).max()) for A in mats)  # one public C
    rows = []
    for (m, n), A in zip(sizes, mats, strict=True):
        plan = _plan((m, n), alg, clip_norm=C)
        f = run_lrf(
            ArraySource(A),
            plan,
            ReleaseHooks(sketch_seed=global_seed, noise_key=_key(global_seed, 3)),
        )
        additive = spectral_error(A, f.U, f.S, f.V) - 0.0  # sigma_{k+1}(A) = 0: rank k
        rows.append((m, n, additive, _zeta(plan)))
    print(
        f"\nDP utility, {alg.value}, k={k}, t=40, v=160, eps=1, delta=1e-6, C={C:.3f}"
    )
    print(f"{'m':>6} {'n':>6} {'additive err':>13} {'zeta_est':>10} {'err/zeta':>9}")
    for m, n, err, zeta in rows:
        print(f"{m:>6} {n:>6} {err:>13.2f} {zeta:>10.2f} {err / zeta:>9.3f}")
    growth = rows[1][2] / rows[0][2]
    sqrt_ratio = (math.sqrt(1600) + math.sqrt(800)) / (math.sqrt(400) + math.sqrt(200))
    print(
        f"err growth {growth:.3f} vs (sqrt(m)+sqrt(n)) growth {sqrt_ratio:.3f}: ratio {growth / sqrt_ratio:.3f}"
    )
    low = 0.2 if alg is SPECTRAL else 0.02
    for m, n, err, zeta in rows:
        assert low * zeta <= err <= 3.0 * zeta, (
            f"{alg.value} {m}x{n}: err/zeta = {err / zeta:.3f}"
        )
    if alg is SPECTRAL:
        assert 0.5 <= growth / sqrt_ratio <= 2.0, (
            f"growth / sqrt ratio = {growth / sqrt_ratio:.3f}"
        )
