"""Sensitivity, clipping and parameter validation as hypothesis properties (spec 1.3, 4.2; style B.10).

Runs under the ``ci`` hypothesis profile of tests/conftest.py (derandomized, 50
examples), so the drawn examples are fixed in CI.
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.algorithms.base import ArraySource
from pipeline.algorithms.lrf import pass_request, plan_lrf
from pipeline.api import make_params
from pipeline.errors import InvalidParameterError
from pipeline.params import Algorithm, ClipSpec, PrivacyUnit
from pipeline.sketches.apply import clip_block

pytestmark = pytest.mark.property

FINITE = st.floats(
    min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=64
)


@st.composite
def neighbouring_pairs(
    draw: st.DrawFn,
) -> tuple[np.ndarray, np.ndarray, float, str, int, int, int, int]:
    """(A, A' with one row replaced, C, algorithm, rank, t, v, sketch seed)."""
    m = draw(st.integers(8, 40))
    n = draw(st.integers(8, 40))
    A = draw(hnp.arrays(np.float64, (m, n), elements=FINITE))
    row = draw(st.integers(0, m - 1))
    new_row = draw(hnp.arrays(np.float64, (n,), elements=FINITE))
    A2 = A.copy()
    A2[row] = new_row
    C = draw(st.floats(min_value=1e-3, max_value=1e3))
    alg = draw(st.sampled_from(["spectral", "low-space"]))
    k = draw(st.integers(1, 3))
    small = min(m, n)
    t = draw(st.integers(k + 1, min(small, k + 6)))
    v_hi = max(m, n) if alg == "spectral" else 4 * t + 10
    v = draw(st.integers(t + 1, v_hi))
    seed = draw(st.integers(0, 2**128 - 1))
    return A, A2, C, alg, k, t, v, seed


@given(neighbouring_pairs())
def test_sketch_difference_is_within_declared_sensitivity(pair: tuple) -> None:  # type: ignore[type-arg]
    """||f(A) - f(A')||_F <= Delta_F * Delta_i for every pre-noise sketch f = Y, Z, ... .

    A and A' differ in one (arbitrary) row; the pipeline clips every row to norm C,
    so the clipped matrices differ by ``||E||_F <= 2C`` (replace-one, Delta_F = 2C).
    The Lemma of spec 4.2 bounds ``||f(E)||_F`` by ``Delta_F Delta_JL(d, beta)`` (two
    factors for S A T) except with probability beta per matrix, for E fixed before
    the sketch is drawn. Here beta = delta_JL / J = 5e-7 / J <= 2.5e-7: the chance
    that any of 50 examples violates it is < 1e-4, so a violation means a bug (a
    mis-normalised operator, a missing clip, or an under-declared sensitivity).
    """
    A, A2, C, alg, k, t, v, seed = pair
    params = make_params(
        k,
        epsilon=1.0,
        delta=1e-6,
        algorithm=alg,
        sketch_size=t,
        core_size=v,
        clip_norm=C,
        unit="row",
        neighboring="replace",
    )
    plan = plan_lrf(params, A.shape)
    assert plan.calibration is not None
    declared = {s.name: s.sensitivity for s in plan.calibration.sketches}
    np.testing.assert_allclose(
        plan.calibration.frobenius_bound, 2 * C, rtol=1e-15, atol=0
    )
    request = pass_request(plan, seed)
    f, g = ArraySource(A).sketch(request), ArraySource(A2).sketch(request)
    assert set(f) == set(declared)
    for name, bound in declared.items():
        diff = float(np.linalg.norm(f[name] - g[name]))
        # float slack: the sketches are sums of <= 40 products of O(C) terms
        assert diff <= bound * (1 + 1e-9), (
            f"{name}: ||f(A) - f(A')||_F = {diff!r} > {bound!r}"
        )


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12),
        elements=st.floats(
            min_value=-1e200,
            max_value=1e200,
            allow_nan=False,
            allow_infinity=False,
            width=64,
        ),
    ),
    st.floats(min_value=1e-6, max_value=1e6),
    st.sampled_from(list(PrivacyUnit)),
)
def test_clip_block_bounds_every_unit(
    block: np.ndarray, C: float, unit: PrivacyUnit
) -> None:
    """After clipping, every row (column, entry) has norm <= C (1 + 1e-12) (T7), for any finite input."""
    out = clip_block(block, ClipSpec(unit=unit, clip_norm=C))
    assert out.shape == block.shape
    assert np.isfinite(out).all()
    if unit is PrivacyUnit.ROW:
        norms = np.array([math.hypot(*r) if r.size else 0.0 for r in out])
    elif unit is PrivacyUnit.COLUMN:
        norms = np.array([math.hypot(*c) for c in out.T])
    else:
        norms = np.abs(out).ravel()
    # math.hypot is overflow-safe, so huge inputs are measured correctly
    assert (norms <= C * (1 + 1e-12)).all(), f"max norm {norms.max()!r} > C = {C!r}"


def test_sensitivity_check_can_fail(rng: np.random.Generator) -> None:
    """Negative control: declaring add/remove (Delta_F = C) for a replace-one pair fails.

    Replacing the row C u by -C u moves A by ||E||_F = 2C, and ||E Phi||_F = 2C
    sqrt(chi2_t / t) exceeds C Delta_JL(100, 2.5e-7) = 1.44 C unless
    chi2_100 < 52 (probability ~1e-7), so the property above would catch an
    under-declared sensitivity.
    """
    A = rng.standard_normal((150, 120))
    A[7] = rng.standard_normal(120)
    A2 = A.copy()
    A2[7] = -A[7]
    params = make_params(
        3,
        epsilon=1.0,
        delta=1e-6,
        sketch_size=100,
        core_size=140,
        clip_norm=0.5,
        neighboring="add-remove",
    )
    plan = plan_lrf(params, A.shape)
    assert plan.calibration is not None
    bound = {s.name: s.sensitivity for s in plan.calibration.sketches}["Y"]
    request = pass_request(plan, 12345)
    diff = float(
        np.linalg.norm(
            ArraySource(A).sketch(request)["Y"] - ArraySource(A2).sketch(request)["Y"]
        )
    )
    assert diff > bound


# ------------------------------------------------------------------ validation

BAD_EPSILON = st.one_of(
    st.floats(max_value=0.0),
    st.just(math.inf),
    st.just(math.nan),
    st.just(-math.inf),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)
BAD_DELTA = st.one_of(
    st.floats(max_value=0.0),
    st.floats(min_value=1.0),
    st.just(math.nan),
    st.text(max_size=3),
    st.none(),
)
BAD_RANK = st.one_of(
    st.integers(max_value=0),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=2),
    st.none(),
)


def _assert_names(err: InvalidParameterError, name: str) -> None:
    assert f"{name}=" in str(err), str(err)


@given(BAD_EPSILON)
def test_bad_epsilon_is_refused(eps: object) -> None:
    with pytest.raises(InvalidParameterError) as info:
        make_params(3, epsilon=eps, delta=1e-6)  # type: ignore[arg-type]
    _assert_names(info.value, "epsilon")


@given(BAD_DELTA)
def test_bad_delta_is_refused(delta: object) -> None:
    with pytest.raises(InvalidParameterError) as info:
        make_params(3, epsilon=1.0, delta=delta)  # type: ignore[arg-type]
    _assert_names(info.value, "delta")


@given(BAD_RANK)
def test_bad_rank_is_refused(rank: object) -> None:
    with pytest.raises(InvalidParameterError) as info:
        make_params(rank, epsilon=1.0, delta=1e-6)  # type: ignore[arg-type]
    _assert_names(info.value, "rank")


@st.composite
def rank_and_too_small_shape(draw: st.DrawFn) -> tuple[int, int, int]:
    m, n = draw(st.integers(1, 60)), draw(st.integers(1, 60))
    return draw(st.integers(min(m, n), 80)), m, n


@given(rank_and_too_small_shape())
def test_rank_too_large_for_shape_is_refused(case: tuple[int, int, int]) -> None:
    """A rank that make_params accepts but the shape cannot hold fails at planning."""
    rank, m, n = case
    params = make_params(rank, epsilon=1.0, delta=1e-6)
    with pytest.raises(InvalidParameterError) as info:
        plan_lrf(params, (m, n))
    _assert_names(info.value, "rank")


@given(st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf)))
def test_bad_clip_norm_is_refused(c: float) -> None:
    with pytest.raises(InvalidParameterError) as info:
        make_params(3, epsilon=1.0, delta=1e-6, clip_norm=c)
    _assert_names(info.value, "clip_norm")


@given(
    st.text(min_size=1, max_size=8).filter(lambda s: s not in {"spectral", "low-space"})
)
def test_bad_algorithm_is_refused(name: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        make_params(3, epsilon=1.0, delta=1e-6, algorithm=name)
    _assert_names(info.value, "algorithm")


def test_valid_parameters_pass_through() -> None:
    p = make_params(
        3, epsilon=0.5, delta=1e-8, algorithm="low-space", clip_norm=2.0, unit="column"
    )
    assert p.algorithm is Algorithm.LOW_SPACE
    assert p.epsilon == 0.5
    assert p.clip.clip_norm == 2.0
