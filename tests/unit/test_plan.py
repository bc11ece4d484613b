"""Release planning: validation messages, default sizes, calibration (spec 2.3, 3.2, 3.3, 4.4)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pipeline.algorithms.lrf import default_sketch_sizes, plan_lrf
from pipeline.algorithms.lrf import model as lrf_model
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.params import Algorithm, ClipSpec, LrfParams, Neighboring, PrivacyUnit

SPECTRAL, LOW_SPACE = Algorithm.SPECTRAL, Algorithm.LOW_SPACE


def _params(**kw) -> LrfParams:  # type: ignore[no-untyped-def]
    base = {"algorithm": SPECTRAL, "rank": 3, "private": False}
    base.update(kw)
    if base["private"]:
        base.setdefault("epsilon", 1.0)
        base.setdefault("delta", 1e-6)
    return LrfParams(**base)


def _assert_printed(actual: float, printed: float, decimals: int) -> None:
    # spec figures are rounded to the printed digits: half a unit in the last place
    np.testing.assert_allclose(actual, printed, rtol=0, atol=0.5 * 10.0**-decimals)


# ------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kw", "shape", "needle"),
    [
        ({"rank": 0}, (50, 30), "rank=0"),
        ({"rank": -2}, (50, 30), "rank=-2"),
        ({"rank": 30}, (50, 30), "rank=30"),  # rank >= min(m, n)
        ({"rank": 45}, (30, 50), "rank=45"),
        ({"rank": 2.0}, (50, 30), "rank=2.0"),  # not an integer
        ({"rank": True}, (50, 30), "rank=True"),
        ({"rank": 5, "sketch_size": 5}, (50, 30), "sketch_size=5"),  # t <= k
        ({"rank": 5, "sketch_size": 31}, (50, 30), "sketch_size=31"),  # t > min(m, n)
        (
            {"rank": 5, "sketch_size": 10, "core_size": 10},
            (50, 30),
            "core_size=10",
        ),  # v <= t
        (
            {"rank": 5, "sketch_size": 10, "core_size": 51},
            (50, 30),
            "core_size=51",
        ),  # spectral v > max(m, n)
        (
            {"rank": 5, "sketch_size": 10, "core_size": 51},
            (30, 50),
            "core_size=51",
        ),  # ... either orientation
        (
            {"rank": 5, "sketch_size": 10, "core_size": 51, "algorithm": LOW_SPACE},
            (50, 30),
            None,
        ),  # fine for Low-Space
        (
            {"rank": 5, "sketch_size": 10, "core_size": 9, "algorithm": LOW_SPACE},
            (50, 30),
            "core_size=9",
        ),
        ({"padded": True}, (50, 30), "padded"),  # padded with spectral
    ],
)
def test_plan_validation_names_parameter_and_value(
    kw: dict, shape: tuple[int, int], needle: str | None
) -> None:
    if needle is None:
        plan = plan_lrf(_params(**kw), shape)
        assert (plan.t, plan.v) == (kw["sketch_size"], kw["core_size"])
        return
    with pytest.raises(InvalidParameterError) as info:
        plan_lrf(_params(**kw), shape)
    assert needle in str(info.value)
    name = needle.split("=")[0]
    assert str(info.value).startswith(name) or f"{name}=" in str(info.value)


def test_bad_shape_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="n_cols=0"):
        plan_lrf(_params(), (10, 0))


def test_private_plan_needs_budget() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon and delta"):
        plan_lrf(LrfParams(algorithm=SPECTRAL, rank=2, private=True), (50, 30))
    with pytest.raises(PrivacyConfigError, match=r"epsilon=-1\.0"):
        plan_lrf(_params(private=True, epsilon=-1.0), (50, 30))
    with pytest.raises(PrivacyConfigError, match=r"delta=1\.0"):
        plan_lrf(_params(private=True, delta=1.0), (50, 30))


# --------------------------------------------------------------- default sizes


def test_default_sketch_sizes_follow_spec() -> None:
    """DP t = max(4k, k+20), v = 4t (spec 2.3); non-private t = max(3k, k+20), v = 6t+1
    (spec 2.3 corrected by its addendum and by measurement, see default_sketch_sizes)."""
    for k in (1, 5, 10, 20, 37):
        t, v = default_sketch_sizes(k, private=True)
        assert (t, v) == (max(4 * k, k + 20), 4 * max(4 * k, k + 20))
        t, v = default_sketch_sizes(k, private=False)
        assert (t, v) == (max(3 * k, k + 20), 6 * max(3 * k, k + 20) + 1)


@pytest.mark.parametrize("algorithm", [SPECTRAL, LOW_SPACE])
def test_private_sketch_size_alone_keeps_room_for_the_core(algorithm: Algorithm) -> None:
    """A private ``sketch_size`` without ``core_size`` plans (it used to be refused with
    a message about a core size nobody gave when t reached the model's v = 2 t_model):
    v = 2 * max(t, t_model), the model's rule."""
    shape = (200000, 1000)
    t_model, v_model = lrf_model.default_sizes(plan_lrf(_params(private=True, algorithm=algorithm, rank=10), shape))
    for t in (30, t_model, v_model, 3 * t_model, 999):
        plan = plan_lrf(_params(private=True, algorithm=algorithm, rank=10, sketch_size=t), shape)
        assert (plan.t, plan.v) == (t, max(v_model, 2 * t))
    # a given core size is kept, and refused when it leaves no room (negative control)
    plan = plan_lrf(_params(private=True, algorithm=algorithm, rank=10, sketch_size=300, core_size=301), shape)
    assert (plan.t, plan.v) == (300, 301)
    with pytest.raises(InvalidParameterError, match="core_size must be in"):
        plan_lrf(_params(private=True, algorithm=algorithm, rank=10, sketch_size=300, core_size=300), shape)


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("algorithm", [SPECTRAL, LOW_SPACE])
@pytest.mark.parametrize(
    ("shape", "rank"),
    [
        ((30, 12), 3),
        ((12, 30), 3),
        ((12, 12), 3),
        ((15, 15), 10),
        ((4, 4), 2),
        ((500, 300), 2),
    ],
)
def test_defaults_clamp_to_a_small_matrix(
    private: bool, algorithm: Algorithm, shape: tuple[int, int], rank: int
) -> None:
    plan = plan_lrf(_params(algorithm=algorithm, rank=rank, private=private), shape)
    M, N = plan.oriented_shape
    assert rank < plan.t <= min(M, N)
    assert plan.t < plan.v
    if algorithm is SPECTRAL:
        assert plan.v <= M
    if private and plan.range_clip is not None:  # a clipped Y: t = 2k, the non-private v
        t0, v0 = lrf_model.clipped_range_sizes(rank)
        assert plan.range_clip == lrf_model.range_clip_factor(plan.t)
    elif private:  # one-shot private sizes come from the error model
        assert plan.calibration is not None
        t0 = lrf_model.range_size(rank, plan.calibration.beta)
        v0 = 2 * t0
    else:
        t0, v0 = default_sketch_sizes(rank, private=private)
    assert plan.t <= t0
    assert plan.v <= v0
    if min(shape) > t0:
        assert plan.t == t0  # the clamp only acts when needed
    if algorithm is LOW_SPACE:
        # Low-Space's v x v core is not bounded by the shape
        assert plan.v == (2 * plan.t if private else v0)


def test_square_spectral_rank_without_room_is_refused() -> None:
    """Spectral needs k < t < v <= n: impossible for k = n - 1 on an n x n matrix."""
    with pytest.raises(InvalidParameterError, match="rank=2"):
        plan_lrf(_params(rank=2), (3, 3))


def test_orientation() -> None:
    # Spectral and unpadded Low-Space: the t-sized sketch on the longer side
    assert not plan_lrf(_params(), (50, 30)).transpose
    assert plan_lrf(_params(), (30, 50)).transpose
    assert plan_lrf(_params(algorithm=LOW_SPACE), (30, 50)).transpose
    # padded Low-Space follows the paper's m <= n
    assert not plan_lrf(_params(algorithm=LOW_SPACE, padded=True), (30, 50)).transpose
    assert plan_lrf(_params(algorithm=LOW_SPACE, padded=True), (50, 30)).transpose
    plan = plan_lrf(_params(), (30, 50))
    assert plan.shape == (30, 50)
    assert plan.oriented_shape == (50, 30)


# ----------------------------------------------------------------- calibration


def _worked(algorithm: Algorithm, **kw) -> object:  # type: ignore[no-untyped-def]
    # spec 4.4 worked example: eps = 1, delta = 1e-6, Delta_F = 1, t = 40, v = 160,
    # Gaussian S, the tail bound on Phi (no sketch-space clipping) and the paper's
    # even split of the budget
    kw.setdefault("operator", "gaussian")
    kw.setdefault("range_clip", False)
    kw.setdefault("range_weight", 0.5 if algorithm is SPECTRAL else 2.0 / 3.0)
    return plan_lrf(
        _params(
            algorithm=algorithm,
            rank=10,
            sketch_size=40,
            core_size=160,
            private=True,
            epsilon=1.0,
            delta=1e-6,
            clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
            **kw,
        ),
        (500, 300) if algorithm is SPECTRAL else (300, 500),
    )


def test_plan_reproduces_spectral_worked_example() -> None:
    plan = _worked(SPECTRAL)
    cal = plan.calibration
    assert cal is not None
    _assert_printed(cal.noise_multiplier, 4.365, 3)
    _assert_printed(plan.sigma("Y"), 10.68, 2)
    _assert_printed(plan.sigma("Z"), 8.30, 2)
    sk = {s.name: s for s in cal.sketches}
    _assert_printed(sk["Y"].jl_factor, 1.730, 3)
    _assert_printed(sk["Z"].jl_factor, 1.344, 3)
    assert sk["Y"].shape == (500, 40)
    assert sk["Z"].shape == (160, 300)
    assert cal.n_sketch_matrices == 2
    np.testing.assert_allclose(cal.beta, 2.5e-7, rtol=1e-12, atol=0)


def test_plan_reproduces_low_space_worked_example() -> None:
    plan = _worked(LOW_SPACE)
    _assert_printed(plan.sigma("Yc"), 13.22, 2)
    _assert_printed(plan.sigma("Yr"), 13.22, 2)
    _assert_printed(plan.sigma("Z"), 13.83, 2)
    _assert_printed(math.sqrt(plan.t) * plan.sigma("Yc"), 83.6, 1)  # sigma_min
    assert plan.calibration is not None
    assert plan.calibration.n_sketch_matrices == 4


def test_sigma_scales_with_clip_norm_and_neighbouring() -> None:
    base = _worked(SPECTRAL)
    wide = plan_lrf(
        dataclasses.replace(
            base.params, clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=3.0)
        ),
        base.shape,
    )
    repl = plan_lrf(
        dataclasses.replace(base.params, neighboring=Neighboring.REPLACE), base.shape
    )
    for name in ("Y", "Z"):
        # sigma_i = Delta_F Delta_i s sqrt(L / w_i): linear in Delta_F (spec 2.2)
        np.testing.assert_allclose(
            wide.sigma(name), 3.0 * base.sigma(name), rtol=1e-12, atol=0
        )
        np.testing.assert_allclose(
            repl.sigma(name), 2.0 * base.sigma(name), rtol=1e-12, atol=0
        )


def test_non_private_plan_has_no_noise() -> None:
    plan = plan_lrf(_params(), (50, 30))
    assert plan.calibration is None
    assert plan.sigma("Y") == 0.0


def test_auto_with_padded_is_low_space_the_only_padded_algorithm() -> None:
    """``padded=True`` under ``algorithm="auto"`` plans Low-Space-LRF (it used to pick
    Spectral-LRF, which then refused the padding); an explicit Spectral is still refused."""
    p = LrfParams.of(3, epsilon=1.0, delta=1e-6, padded=True)
    assert p.algorithm is LOW_SPACE
    assert plan_lrf(p, (300, 100)).params.padded
    with pytest.raises(InvalidParameterError, match="padded=True applies to algorithm='low-space'"):
        plan_lrf(LrfParams.of(3, epsilon=1.0, delta=1e-6, padded=True, algorithm="spectral"), (300, 100))
