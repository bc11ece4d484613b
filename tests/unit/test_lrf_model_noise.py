"""The error model's budget split at a noise above the one-shot release's.

``sketch_ratio(..., noise_factor=f)`` keeps the range term and scales the
co-range term by ``f^2`` (pipeline/algorithms/lrf/model.py, "Noise above the
one-shot release's"); ``best_weight`` is its minimiser ``a / (a + f b)`` by
Lagrange. Checked against a fine grid (the ratio is smooth and convex in w on
(0, 1), so the grid minimum is within one grid step of the true one), with
``f = 1`` the one-shot model unchanged, and a control: the one-shot split is
not the minimiser at ``f = 3``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.algorithms.lrf.model import best_weight, sketch_ratio

SHAPES = [(10000, 500, 1.399), (9838, 128, 1.399), (4000, 2000, 1.0), (20000, 400, 1.33)]


@pytest.mark.parametrize(("M", "N", "g"), SHAPES)
@pytest.mark.parametrize("f", [1.0, 1.7, 2.75, 6.0])
def test_best_weight_minimises_the_ratio_at_its_noise(M: int, N: int, g: float, f: float):
    grid = np.linspace(0.05, 0.97, 9201)  # step 1e-4, the split's clamp range
    ratios = [sketch_ratio(M, N, weight=w, g_range=g, g_corange=1.0, noise_factor=f)
              for w in grid]  # fmt: skip
    w = best_weight(M, N, g_range=g, g_corange=1.0, noise_factor=f)
    assert abs(w - grid[int(np.argmin(ratios))]) <= 1e-4
    one_shot = best_weight(M, N, g_range=g, g_corange=1.0)
    if f > 1.0:
        assert w < one_shot  # more of the budget to the co-range side
    else:
        assert w == one_shot


def test_the_one_shot_split_is_not_best_at_a_stream_noise():
    w1 = best_weight(10000, 500, g_range=1.399, g_corange=1.0)
    w3 = best_weight(10000, 500, g_range=1.399, g_corange=1.0, noise_factor=3.0)
    at = {w: sketch_ratio(10000, 500, weight=w, g_range=1.399, g_corange=1.0, noise_factor=3.0)
          for w in (w1, w3)}  # fmt: skip
    assert at[w3] < 0.95 * at[w1]
    # f = 1: the one-shot model, term by term
    assert sketch_ratio(10000, 500, weight=0.9, g_range=1.4, g_corange=1.0) == sketch_ratio(
        10000, 500, weight=0.9, g_range=1.4, g_corange=1.0, noise_factor=1.0
    )
