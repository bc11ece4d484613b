"""The noise level of a release is a valid bound: pure noise stays below it.

For the zero matrix every released value is noise, so the top released value
exceeds the level with probability at most ``1 - confidence`` = 0.05 (the
operator-norm bounds of :mod:`pipeline.mechanisms.signal`). Over ``TRIALS``
seeded releases the count of exceedances is at most the binomial
``Binomial(TRIALS, 0.05)`` quantile at upper tail 1e-4 (style B.10: a false
failure per seed has probability below 1e-4). A level half as large is caught
(negative control).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

import pipeline

pytestmark = pytest.mark.statistical

TRIALS = 120
#: Largest count of exceedances a valid 95% level allows (upper tail 1e-4).
ALLOWED = int(binom.isf(1e-4, TRIALS, 0.05))


#: the trials charge an accountant of their own, not the process's shared one
OWN = "signal-level-trials"


def _exceed(values: list[float], levels: list[float], scale: float) -> int:
    return int(sum(v > scale * lv for v, lv in zip(values, levels, strict=True)))


def test_two_pass_level_bounds_pure_noise(global_seed: int) -> None:
    A = np.zeros((300, 40))
    top, levels = [], []
    for i in range(TRIALS):
        s = global_seed * TRIALS + i
        f = pipeline.factorize(
            A, 3, epsilon=1.0, delta=1e-6, insecure_noise_seed=s, seed=s, dataset=OWN
        )
        top.append(float(f.S[0]))
        levels.append(f.report["signal"]["noise_level"])
    assert _exceed(top, levels, 1.0) <= ALLOWED
    assert _exceed(top, levels, 0.5) > ALLOWED  # negative control


def test_analyze_gauss_level_bounds_pure_noise(global_seed: int) -> None:
    A = np.zeros((300, 40))
    top, levels = [], []
    for i in range(TRIALS):
        s = global_seed * TRIALS + i
        r = pipeline.pca(
            A,
            3,
            epsilon=1.0,
            delta=1e-6,
            method="analyze-gauss",
            insecure_noise_seed=s,
            dataset=OWN,
        )
        top.append(float(r.eigenvalues[0]))
        levels.append(r.report["signal"]["noise_level"])
    assert _exceed(top, levels, 1.0) <= ALLOWED
    assert _exceed(top, levels, 0.5) > ALLOWED  # negative control
