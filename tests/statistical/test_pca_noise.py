"""The symmetric noise of the PCA releases M and H (spec 3.2, 5.2 P1).

``sigma sym(G) = sigma (G + G^T) / 2`` must be exactly symmetric, with
var(diagonal) = sigma^2 and var(off-diagonal) = sigma^2 / 2: in the orthonormal
basis ``{E_ii} u {(E_ij + E_ji) / sqrt(2)}_{i<j}`` of symmetric matrices its
coordinates (``S_ii`` and ``sqrt(2) S_ij``) are i.i.d. N(0, sigma^2), i.e. the
standard Gaussian mechanism in R^{m(m+1)/2}.

The noise is drawn by the function run_pca uses (``power_pca._noise``, scaled by
sigma as run_pca scales it), under seeded insecure keys derived from
``global_seed``: deterministic in CI.

Variance tolerances. For N i.i.d. draws ``x`` of N(0, v) (mean known to be 0),
``sum x^2 / v ~ chi^2_N``; the sample variance ``mean(x^2)`` is accepted iff it
lies in ``v [q(P_FAIL/2), q(1 - P_FAIL/2)] / N`` with ``q`` the chi^2_N quantiles.
KS tests compare the basis coordinates with N(0, sigma^2). Each check fails
with probability ``P_FAIL`` (1e-4 in CI, 1e-6 in the 100-seed sweep, style
B.10) when the noise is right; the docstrings count the checks.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import stats

from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import ArrayRowSource, MemoryJournal, plan_pca, run_pca
from pipeline.algorithms.pca import power as power_pca
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
from pipeline.params import PcaParams

pytestmark = pytest.mark.statistical

P_FAIL = 1e-6 if os.environ.get("PIPELINE_TEST_SEEDS") == "all" else 1e-4
SIGMA = 2.5
#: Draws per matrix size m: about 2000-6000 samples per variance check, so the
#: chi-square acceptance band is about +-12% at P_FAIL = 1e-4 while the pitfalls
#: of spec 3.2 change a variance by a factor of 2.
DRAWS = {1: 2000, 2: 1000, 5: 200, 64: 3}


def sym_noise(key: NoiseKey, m: int, draws: int) -> np.ndarray:
    """``draws`` symmetric noise matrices of size m, as run_pca draws them."""
    return np.stack(
        [SIGMA * power_pca._noise(key, f"H{i}", (m, m), True) for i in range(draws)]
    )


def mirrored_noise(key: NoiseKey, m: int, draws: int) -> np.ndarray:
    """Negative control (spec 3.2 pitfall): the same keyed Gaussians with the upper
    triangle mirrored instead of symmetrised (off-diagonal variance sigma^2)."""
    out = []
    for i in range(draws):
        G = SIGMA * power_pca._noise(key, f"H{i}", (m, m), False)
        out.append(np.triu(G) + np.triu(G, 1).T)
    return np.stack(out)


def coordinates(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(diagonal coordinates, off-diagonal coordinates ``sqrt(2) S_ij``, i < j)."""
    m = S.shape[-1]
    iu = np.triu_indices(m, 1)
    diag = np.diagonal(S, axis1=-2, axis2=-1).ravel()
    off = np.sqrt(2.0) * S[:, iu[0], iu[1]].ravel()
    return diag, off


def variance_ok(x: np.ndarray, v: float) -> tuple[bool, float, tuple[float, float]]:
    """Chi-square acceptance of ``mean(x^2)`` for variance ``v`` (module docstring)."""
    n = x.size
    lo = stats.chi2.ppf(P_FAIL / 2, n) / n * v
    hi = stats.chi2.isf(P_FAIL / 2, n) / n * v
    s2 = float(np.mean(x * x))
    return lo <= s2 <= hi, s2, (lo, hi)


@pytest.mark.parametrize("m", sorted(DRAWS))
def test_sym_noise_is_isotropic(m: int, global_seed: int) -> None:
    """P1: exactly symmetric; var(diag) ~ sigma^2; var(off-diag) ~ sigma^2/2; basis
    coordinates pass KS vs N(0, sigma^2). Checks at P_FAIL each: 2 (m = 1) or 4."""
    key = NoiseKey.insecure_from_seed(global_seed).derive("p1", m)
    S = sym_noise(key, m, DRAWS[m])
    np.testing.assert_array_equal(S, np.swapaxes(S, -1, -2))
    diag, off = coordinates(S)
    ok, s2, band = variance_ok(diag, SIGMA**2)
    assert ok, f"var(diag) = {s2:.4f} outside {band} (sigma^2 = {SIGMA**2})"
    if m > 1:
        raw = off / np.sqrt(2.0)
        ok, s2, band = variance_ok(raw, SIGMA**2 / 2)
        assert ok, (
            f"var(offdiag) = {s2:.4f} outside {band} (sigma^2/2 = {SIGMA**2 / 2})"
        )
    coords = np.concatenate([diag, off])
    ks = stats.kstest(coords / SIGMA, "norm").pvalue
    assert ks >= P_FAIL, f"KS p = {ks:.2e} for the basis coordinates"
    if m > 1:
        # diagonal and off-diagonal coordinates share one scale
        ks_off = stats.kstest(off / SIGMA, "norm").pvalue
        assert ks_off >= P_FAIL, f"KS p = {ks_off:.2e} for the off-diagonal coordinates"


#: Draws for the negative controls: >= 4000 off-diagonal coordinates, so that the KS
#: test has power against a sqrt(2) scale error (population KS distance 0.083 vs a
#: critical value of 0.043 at p = 1e-6 and n = 4000; a simulation over 100 seeds with
#: 1000 coordinates missed it 16 times).
NEG_DRAWS = {2: 4000, 5: 400, 64: 3}


@pytest.mark.parametrize("m", sorted(NEG_DRAWS))
def test_wrong_symmetrisations_fail_the_same_checks(m: int, global_seed: int) -> None:
    """Negative controls (spec 3.2 pitfalls), on the same keyed Gaussians:

    * mirroring the upper triangle (Dwork et al.'s description) doubles the
      off-diagonal variance: the variance test and the KS test of the off-diagonal
      coordinates reject it (the diagonal, unchanged, still passes: 1 check at
      P_FAIL);
    * dividing sym noise by an extra sqrt(2) (under-noised) fails the variance test
      of the pooled coordinates.
    """
    key = NoiseKey.insecure_from_seed(global_seed).derive("p1-neg", m)
    S = mirrored_noise(key, m, NEG_DRAWS[m])
    np.testing.assert_array_equal(S, np.swapaxes(S, -1, -2))  # symmetric too
    diag, off = coordinates(S)
    assert variance_ok(diag, SIGMA**2)[0]  # the diagonal is right ...
    assert not variance_ok(off / np.sqrt(2.0), SIGMA**2 / 2)[0]  # ... the rest is not
    assert stats.kstest(off / SIGMA, "norm").pvalue < P_FAIL
    good = sym_noise(key, m, NEG_DRAWS[m])
    pooled = np.concatenate(coordinates(good / np.sqrt(2.0)))
    assert not variance_ok(pooled, SIGMA**2)[0]


def test_k1_noise_is_the_plain_gaussian(global_seed: int) -> None:
    """For m = 1, ``sym(G) = G``: the noise is exactly ``sigma N(0, 1)`` from the
    release's keyed stream."""
    key = NoiseKey.insecure_from_seed(global_seed)
    for label in ("H0", "H7"):
        plain = GaussianNoise(key=key.derive("pca", label), sigma=1.0, length=1, dim=1)
        np.testing.assert_array_equal(
            power_pca._noise(key, label, (1, 1), True), plain.dense()
        )


def test_run_pca_adds_exactly_this_noise(global_seed: int) -> None:
    """The releases of run_pca are exact value + sigma * _noise(label): on the zero
    matrix (all exact statistics 0) M, H0 and Z0 equal their scaled noise bit for bit,
    so the distribution tested above is the one released."""
    d, k = 5, 1
    plan = plan_pca(
        PcaParams(rank=k, epsilon=1.0, delta=1e-6, iterations=1, clip_radius=0.5),
        (64, d),
    )
    key = NoiseKey.insecure_from_seed(global_seed)
    journal = MemoryJournal()
    run_pca(
        ArrayRowSource(np.zeros((64, d))),
        plan,
        ReleaseHooks(noise_key=key, journal=journal),
    )
    expect = {
        "M": plan.noise_init * power_pca._noise(key, "M", (d, d), True),
        "H0": plan.noise_H * power_pca._noise(key, "H0", (k, k), True),
        "Z0": plan.noise_Z
        * plan.clip_radius
        * power_pca._noise(key, "Z0", (d, k), False),
    }
    for label, value in expect.items():
        got = journal.load(label)
        assert got is not None
        np.testing.assert_array_equal(got, value)
    assert plan.noise_init > 0
    assert plan.noise_H > 0
    assert plan.noise_Z > 0
