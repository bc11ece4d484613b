"""The released noise of a stream follows the sqrt(popcount(tau)) law of spec sketch-lrf 4.5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.algorithms.continual import (
    advance_tree,
    noise_std,
    noisy_sketches,
    plan_stream,
)
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import Algorithm, LrfParams

T = 16
SHAPE = (400, 120)


def _released_noise(plan, key, tau):
    """Run the tree over empty epochs to tau; the release is then pure noise."""
    levels: dict = {}
    for e in range(1, tau + 1):
        zero = {n: np.zeros(s) for n, s in plan.shapes().items()}
        levels = advance_tree(levels, e - 1, zero)
    return noisy_sketches(plan, levels, tau, key)


@pytest.mark.parametrize("alg", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])  # streams: one pass
def test_noise_std_is_sqrt_popcount_sigma(alg):
    plan = plan_stream(LrfParams(algorithm=alg, rank=3, epsilon=1.0, delta=1e-6), SHAPE, T)
    key = NoiseKey.insecure_from_seed(11)
    for tau in (1, 2, 3, 7, 8, 15, 16):
        got = _released_noise(plan, key, tau)
        want = noise_std(plan, tau)
        for name, x in got.items():
            n = x.size
            # std of a sample std of n Gaussians is sigma / sqrt(2n); 6 of them bound
            # the 7 x 2-3 checks here jointly at ~1e-8
            tol = 6.0 / math.sqrt(2 * n)
            assert abs(x.std() / want[name] - 1.0) < tol, (alg, tau, name)
            assert want[name] == pytest.approx(math.sqrt(tau.bit_count()) * plan.lrf.sigma(name))


def test_negative_control_one_node_per_release_is_detected():
    """A tree that released only the newest node's noise would show std sigma at tau = 15."""
    plan = plan_stream(LrfParams(algorithm=Algorithm.SPECTRAL, rank=3, epsilon=1.0, delta=1e-6), SHAPE, T)
    x = _released_noise(plan, NoiseKey.insecure_from_seed(12), 15)["Y"]
    tol = 6.0 / math.sqrt(2 * x.size)
    assert abs(x.std() / plan.lrf.sigma("Y") - 1.0) > tol  # 2 sigma, not sigma: the check can fail
