"""Turnstile sketches and the binary-tree mechanism (spec sketch-lrf 3.4, 4.5, 6.4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.continual import (
    advance_tree,
    empty_sketches,
    lowest_set_bit,
    node_noise,
    noise_std,
    noisy_sketches,
    operators,
    partition_cells,
    plan_stream,
    release_factorization,
    sketch_cells,
    sum_deltas,
    tree_levels,
    tree_nodes,
)
from pipeline.algorithms.lrf import pass_request, plan_lrf, run_lrf
from pipeline.errors import EpochError, HorizonExceededError, InvalidParameterError
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import Algorithm, LrfParams

SEED = 20261129
# Linearity is exact in real arithmetic; the float64 sums of ~1e4 terms in another
# order differ by a few ulps of the largest partial sum (acceptance: < 1e-10).
LINEARITY_RTOL = 1e-10


def _params(alg, private=False, **kw):
    if private:
        return LrfParams(algorithm=alg, rank=3, epsilon=1.0, delta=1e-6, **kw)
    return LrfParams(algorithm=alg, rank=3, private=False, **kw)


def _updates(shape, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, shape[0], n), rng.integers(0, shape[1], n), rng.normal(size=n)


def _oriented(plan, i, j, s):
    r, c = (j, i) if plan.lrf.transpose else (i, j)
    order = np.argsort(r, kind="stable")
    return r[order], c[order], s[order]


def _one_shot_sketches(plan, A):
    ex = ArraySource(A).sketch(pass_request(plan.lrf, SEED))
    return {k: (v.T if k in plan.wide else v) for k, v in ex.items()}


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("alg", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])  # streams: one pass
@pytest.mark.parametrize("shape", [(300, 170), (170, 300)])
def test_linearity_any_order_and_split(alg, shape):
    """Sketch of batches B1..Bk in any order and split == sketch of their sum."""
    plan = plan_stream(_params(alg), shape, 16)
    ops = operators(plan, SEED)
    batches = [_updates(shape, 3000, s) for s in range(4)]
    A = np.zeros(shape)
    for i, j, s in batches:
        np.add.at(A, (i, j), s)
    want = _one_shot_sketches(plan, A)
    rng = np.random.default_rng(1)
    for trial in range(3):
        acc = empty_sketches(plan)
        for b in rng.permutation(len(batches)):
            i, j, s = batches[b]
            cut = rng.integers(0, i.size)  # split each batch in two at random
            for sl in (slice(0, cut), slice(cut, None)):
                r, c, v = _oriented(plan, i[sl], j[sl], s[sl])
                parts = partition_cells(r, c, v, 1 + trial, tile_size=64)
                sum_deltas(plan, [sketch_cells(plan, ops, *p) for p in parts], into=acc)
        for k in want:
            assert _rel(acc[k], want[k]) < LINEARITY_RTOL, k


@pytest.mark.parametrize("alg", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])  # streams: one pass
def test_stream_factorization_equals_one_shot_without_noise(alg):
    shape = (240, 150)
    plan = plan_stream(_params(alg), shape, 4)
    i, j, s = _updates(shape, 5000, 7)
    A = np.zeros(shape)
    np.add.at(A, (i, j), s)
    acc = sum_deltas(plan, [sketch_cells(plan, operators(plan, SEED), *_oriented(plan, i, j, s))])
    f = release_factorization(plan, acc, SEED)
    g = run_lrf(
        ArraySource(A),
        plan_lrf(plan.lrf.params, shape),
        ReleaseHooks(sketch_seed=SEED, noise_key=None),
    )
    np.testing.assert_allclose(f.S, g.S, rtol=1e-12)
    np.testing.assert_allclose(f.U, g.U, atol=1e-10)
    np.testing.assert_allclose(f.V, g.V, atol=1e-10)


def test_tree_bookkeeping_sums_to_the_total_for_every_epoch():
    """After closing tau, the levels are the set bits of tau and sum to A(tau) [spec 3.4]."""
    rng = np.random.default_rng(3)
    levels: dict[int, dict[str, np.ndarray]] = {}
    total = np.zeros(4)
    for tau in range(1, 65):
        d = None if tau % 5 == 0 else {"Y": rng.normal(size=4)}  # some epochs are empty
        if d is not None:
            total = total + d["Y"]
        levels = advance_tree(levels, tau - 1, d)
        assert set(levels) <= {j for j, _ in tree_nodes(tau)}
        got = sum((p["Y"] for p in levels.values()), np.zeros(4))
        np.testing.assert_allclose(got, total, rtol=1e-12, atol=1e-12)
    assert tree_nodes(6) == [(1, 3), (2, 1)]
    assert lowest_set_bit(12) == 2


def test_nodes_of_an_epoch_partition_its_prefix():
    """The p-sums released at tau cover epochs 1..tau exactly once [spec 3.4, step 5]."""
    for tau in range(1, 129):
        covered = []
        for j, q in tree_nodes(tau):
            covered.extend(range((q - 1) * 2**j + 1, q * 2**j + 1))  # node q of level j
        assert sorted(covered) == list(range(1, tau + 1))
        assert len(tree_nodes(tau)) == tau.bit_count() <= tree_levels(tau)


def test_tree_calibration_is_one_gaussian_over_L_levels():
    """sigma_i(stream) = sqrt(L) sigma_i(one-shot); the ledger sees 1/Delta_eff = s [spec 4.5]."""
    p = _params(Algorithm.SPECTRAL, private=True)
    one = plan_stream(p, (500, 300), 1).lrf  # a stream's sizes, split and operators, L = 1
    for T, L in ((1, 1), (2, 2), (64, 7), (100, 7)):
        plan = plan_stream(p, (500, 300), T)
        assert plan.levels == L == plan.lrf.calibration.tree_levels
        for name in ("Y", "Z"):
            assert plan.lrf.sigma(name) == pytest.approx(math.sqrt(L) * one.sigma(name), rel=1e-12)
        cal = plan.lrf.calibration
        assert cal.effective_sensitivity == pytest.approx(1 / cal.noise_multiplier, rel=1e-9)
        cal.check()
    assert noise_std(plan, 7)["Y"] == pytest.approx(math.sqrt(3) * plan.lrf.sigma("Y"))


def test_node_noise_is_keyed_fresh_and_reproducible():
    plan = plan_stream(_params(Algorithm.SPECTRAL, private=True), (200, 120), 8)
    key = NoiseKey.insecure_from_seed(1)
    a = node_noise(plan, key, "Y", 1, 3)
    np.testing.assert_array_equal(a, node_noise(plan, key, "Y", 1, 3))  # a retry regenerates it
    for other in (node_noise(plan, key, "Y", 1, 2), node_noise(plan, key, "Y", 2, 3),
                  node_noise(plan, NoiseKey.insecure_from_seed(2), "Y", 1, 3)):
        assert abs(np.corrcoef(a.ravel(), other.ravel())[0, 1]) < 0.05  # independent streams
    assert a.shape == plan.shapes()["Y"]
    assert node_noise(plan, key, "Z", 0, 1).shape == plan.shapes()["Z"]


def test_noisy_sketches_add_one_noise_per_node():
    plan = plan_stream(_params(Algorithm.SPECTRAL, private=True), (200, 120), 8)
    key = NoiseKey.insecure_from_seed(5)
    levels = {1: {n: np.zeros(s) for n, s in plan.shapes().items()},
              2: {n: np.zeros(s) for n, s in plan.shapes().items()}}
    out = noisy_sketches(plan, levels, 6, key)
    want = node_noise(plan, key, "Y", 1, 3) + node_noise(plan, key, "Y", 2, 1)
    np.testing.assert_array_equal(out["Y"], want)
    with pytest.raises(EpochError):
        noisy_sketches(plan, {0: levels[1]}, 6, key)  # a level that epoch 6 does not hold
    with pytest.raises(InvalidParameterError):
        noisy_sketches(plan, levels, 6, None)


def test_plan_refuses_padding_and_checks_epochs():
    with pytest.raises(InvalidParameterError, match="padded"):
        plan_stream(_params(Algorithm.LOW_SPACE, private=True, padded=True), (300, 200), 8)
    plan = plan_stream(_params(Algorithm.SPECTRAL, private=True), (300, 200), 8)
    assert plan.check_epoch(8) == 8
    with pytest.raises(HorizonExceededError, match="horizon of 8"):
        plan.check_epoch(9)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(EpochError):
            plan.check_epoch(bad)


def test_partition_cuts_fall_on_tile_boundaries():
    r = np.sort(np.random.default_rng(0).integers(0, 1000, 5000))
    parts = partition_cells(r, r, r.astype(float), 4, tile_size=64)
    assert sum(p[0].size for p in parts) == r.size
    for a, b in itertools.pairwise(parts):
        assert a[0][-1] // 64 < b[0][0] // 64  # no tile is shared by two parts
