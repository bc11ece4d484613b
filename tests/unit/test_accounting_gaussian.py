"""Analytic Gaussian mechanism and JL sensitivity factor (spec section 4.2, 4.3; T1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pipeline.accounting.gaussian import (
    classical_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
    jl_sensitivity_factor,
    paper_gaussian_sigma,
)
from pipeline.errors import InvalidParameterError, PrivacyConfigError

EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
DELTAS = (1e-3, 1e-6, 1e-9, 1e-12)
GRID = [(e, d) for e in EPSILONS for d in DELTAS]


def _delta_direct(z: float, eps: float) -> float:
    """[BW18, Thm 8] evaluated naively with scipy.stats (oracle for small eps)."""
    return float(
        stats.norm.cdf(0.5 / z - eps * z)
        - np.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z)
    )


@pytest.mark.parametrize(("epsilon", "delta"), GRID)
def test_noise_multiplier_is_tight_and_safe(epsilon: float, delta: float) -> None:
    # T1 (spec section 7.5): safe at z, unsafe 0.1% below it.
    z = gaussian_noise_multiplier(epsilon, delta)
    assert gaussian_delta(z, epsilon) <= delta
    assert gaussian_delta(0.999 * z, epsilon) > delta


@pytest.mark.parametrize(("epsilon", "delta"), [g for g in GRID if g[0] < 1])
def test_analytic_not_larger_than_classical(epsilon: float, delta: float) -> None:
    # [BW18, Thm 8] is exact, so it can only improve on [DR14, Thm A.1].
    assert gaussian_noise_multiplier(epsilon, delta) <= classical_gaussian_sigma(
        epsilon, delta
    )


def test_classical_is_itself_safe() -> None:
    # Cross-check of gaussian_delta: a known-valid calibration satisfies it.
    for eps, dlt in [(0.5, 1e-6), (0.1, 1e-9)]:
        assert gaussian_delta(classical_gaussian_sigma(eps, dlt), eps) <= dlt


def test_classical_rejects_epsilon_at_least_one() -> None:
    with pytest.raises(InvalidParameterError, match=r"epsilon must be in \(0, 1\)"):
        classical_gaussian_sigma(1.0, 1e-6)


def test_paper_sigma_violates_delta() -> None:
    # Regression for [Upa18, Thm 37] (spec section 4.3 table: true delta 1.1e-5
    # at epsilon=1, delta=1e-6; 1.06e-5 to three digits).
    sigma = paper_gaussian_sigma(1.0, 1e-6)
    true_delta = gaussian_delta(sigma, 1.0)
    assert true_delta > 1e-5
    # Spec figure 1.06e-5 has 3 significant digits: half a unit is 5e-8.
    np.testing.assert_allclose(true_delta, 1.06e-5, rtol=0, atol=5e-8)


@pytest.mark.parametrize(
    ("epsilon", "expected"), [(0.5, 8.348), (1.0, 4.365), (2.0, 2.298)]
)
def test_reference_noise_multipliers(epsilon: float, expected: float) -> None:
    # Spec section 4.3 reference values s(eps, 5e-7), printed to 3 decimals,
    # so the tolerance is half a unit in the last printed digit.
    np.testing.assert_allclose(
        gaussian_noise_multiplier(epsilon, 5e-7), expected, rtol=0, atol=5e-4
    )


@pytest.mark.parametrize(
    ("d", "beta", "expected"),
    [(40, 2.5e-7, 1.730), (160, 2.5e-7, 1.344), (500, 1e-7, 1.193)],
)
def test_jl_sensitivity_factor_numbers(d: int, beta: float, expected: float) -> None:
    # Spec section 4.2 figures, printed to 3 decimals: half a unit tolerance.
    np.testing.assert_allclose(
        jl_sensitivity_factor(d, beta), expected, rtol=0, atol=5e-4
    )


def test_jl_factor_upper_bounds_chi_square_quantile() -> None:
    # Rank-one E: ||E Phi||_F^2 / ||E||_F^2 ~ chi^2_d / d exactly (spec 4.2), so
    # the Laurent-Massart factor must dominate the exact quantile (1.315 vs 1.269
    # at d=200, beta=1e-7).
    for d, beta in [(20, 0.01), (200, 1e-7), (40, 2.5e-7)]:
        exact = math.sqrt(stats.chi2.isf(beta, d) / d)
        assert jl_sensitivity_factor(d, beta) >= exact


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_delta_matches_direct_formula(epsilon: float) -> None:
    # Log-space evaluation against the textbook form; 1e-9 relative covers the
    # cancellation in the direct form at these moderate deltas (>= 1e-8).
    for z in (0.5, 1.0, 2.0, 4.0):
        np.testing.assert_allclose(
            gaussian_delta(z, epsilon), _delta_direct(z, epsilon), rtol=1e-9, atol=0
        )


def test_large_epsilon_does_not_overflow() -> None:
    # e^50 overflows nothing, but e^eps Phi(b) does for eps > 709 naively.
    for eps in (50.0, 800.0):
        z = gaussian_noise_multiplier(eps, 1e-6)
        assert math.isfinite(z)
        assert z > 0
        assert gaussian_delta(z, eps) <= 1e-6
        assert gaussian_delta(0.999 * z, eps) > 1e-6
        assert 0.0 <= gaussian_delta(0.01, eps) <= 1.0


def test_special_cases() -> None:
    assert gaussian_delta(0.0, 1.0) == 1.0
    assert gaussian_delta(math.inf, 1.0) == 0.0
    assert gaussian_epsilon(0.0, 1e-6) == math.inf
    assert gaussian_epsilon(math.inf, 1e-6) == 0.0
    # Huge noise: already (0, delta)-DP.
    assert gaussian_epsilon(1e7, 1e-3) == 0.0


@pytest.mark.parametrize(("epsilon", "delta"), GRID)
def test_epsilon_inverts_delta(epsilon: float, delta: float) -> None:
    z = gaussian_noise_multiplier(epsilon, delta)
    eps = gaussian_epsilon(z, delta)
    assert gaussian_delta(z, eps) <= delta
    # Both inverses are brentq roots to ~1e-15 relative, nudged up; 1e-9
    # relative is far above that and far below any meaningful epsilon change.
    np.testing.assert_allclose(eps, epsilon, rtol=1e-9, atol=0)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-6), (1.0, 1e-6), (3.0, 1e-9)])
def test_against_dp_accounting(epsilon: float, delta: float) -> None:
    import dp_accounting

    # 1e-3 relative: dp_accounting solves the same equation [BW18, Thm 8] with
    # its own bracketing; the brief's cross-check tolerance.
    z_ref = dp_accounting.get_sigma_gaussian(epsilon, delta)
    np.testing.assert_allclose(
        gaussian_noise_multiplier(epsilon, delta), z_ref, rtol=1e-3, atol=0
    )
    z = gaussian_noise_multiplier(epsilon, delta)
    np.testing.assert_allclose(
        dp_accounting.get_epsilon_gaussian(z, delta), epsilon, rtol=1e-3, atol=0
    )
    np.testing.assert_allclose(gaussian_delta(z_ref, epsilon), delta, rtol=1e-3, atol=0)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: gaussian_noise_multiplier(0.0, 1e-6), "epsilon"),
        (lambda: gaussian_noise_multiplier(1.0, 0.0), "delta"),
        (lambda: gaussian_noise_multiplier(1.0, 1.0), "delta"),
        (lambda: gaussian_delta(-1.0, 1.0), "noise_multiplier"),
        (lambda: gaussian_delta(1.0, -0.1), "epsilon"),
        (lambda: gaussian_epsilon(1.0, 0.0), "delta"),
        (lambda: jl_sensitivity_factor(40, 0.0), "beta"),
    ],
)
def test_invalid_privacy_parameters(call: object, name: str) -> None:
    with pytest.raises(PrivacyConfigError, match=rf"^{name} must be "):
        call()  # type: ignore[operator]


def test_invalid_dimension() -> None:
    with pytest.raises(InvalidParameterError, match=r"d must be >= 1, got d=0\."):
        jl_sensitivity_factor(0, 0.1)
