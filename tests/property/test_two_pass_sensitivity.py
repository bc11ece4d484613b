"""Exact sensitivity of both sketches of the two-pass factorization (private-lrf-2, 6).

For neighbours that differ in one individual's clipped contribution (a row of
``A`` for the row unit, one entry for the entry unit), the exact sketches
``Z = S X`` (sparse sign ``S``, every column of norm 1) and ``Y = X V`` (``V``
with orthonormal columns) move by at most ``Delta_F`` in Frobenius norm, for
EVERY draw of ``S`` and every such ``V``. The sketches are computed by the
production pass (``ArraySource.sketch``: clipping, then the block kernel).

Runs under the ``ci`` hypothesis profile of tests/conftest.py (derandomized).
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.algorithms.base import ArraySource
from pipeline.algorithms.lrf.two_pass import co_range_operator, plan_two_pass
from pipeline.params import LrfParams
from pipeline.sketches.apply import PassRequest
from pipeline.sketches.dense import DenseOperator

pytestmark = pytest.mark.property

FINITE = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=64)
# float64 round-off of sums of at most a few hundred products, relative to Delta_F
RTOL = 1e-9


@st.composite
def neighbours(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, LrfParams, int, int]:
    """(A, A' one individual apart, params, sketch seed, seed of V)."""
    unit = draw(st.sampled_from(["row", "entry"]))
    relation = draw(st.sampled_from(["add-remove", "replace"]))
    m, n = draw(st.integers(6, 30)), draw(st.integers(6, 30))
    A = draw(hnp.arrays(np.float64, (m, n), elements=FINITE))
    A2 = A.copy()
    i, j = draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))
    if unit == "row":
        new = np.zeros(n) if relation == "add-remove" else draw(hnp.arrays(np.float64, (n,), elements=FINITE))
        A2[i] = new
    else:
        A2[i, j] = 0.0 if relation == "add-remove" else draw(FINITE)
    k = draw(st.integers(1, min(m, n) - 1))
    params = LrfParams.of(
        k, epsilon=1.0, delta=1e-6, algorithm="two-pass", unit=unit, neighboring=relation,
        clip_norm=draw(st.floats(min_value=1e-2, max_value=1e2)),
        core_size=draw(st.integers(max(3, k + 1), max(3, k + 1, m if unit == "row" else max(m, n)))),
    )  # fmt: skip
    return A, A2, params, draw(st.integers(0, 2**128 - 1)), draw(st.integers(0, 2**32 - 1))


def _sketch(A: np.ndarray, plan: object, **ops: object) -> np.ndarray:
    req = PassRequest(transpose=plan.transpose, clip=plan.params.clip, **ops)  # type: ignore[attr-defined]
    (out,) = ArraySource(A).sketch(req).values()
    return np.asarray(out)


def _orthonormal(n: int, k: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, k)))
    return q


@given(neighbours())
def test_both_sketches_move_by_at_most_delta_f(case: tuple[np.ndarray, np.ndarray, LrfParams, int, int]) -> None:
    A, A2, params, seed, vseed = case
    try:
        plan = plan_two_pass(params, A.shape)
    except Exception:  # noqa: BLE001 - a core size above the oriented rows: refused, nothing to check
        return
    delta_f = params.neighboring.frobenius_bound(params.clip.clip_norm)
    assert plan.calibration is not None
    assert all(sk.sensitivity == delta_f for sk in plan.calibration.sketches)
    S = co_range_operator(plan, seed)
    dz = _sketch(A, plan, left=(("Z", S),)) - _sketch(A2, plan, left=(("Z", S),))
    assert np.linalg.norm(dz) <= delta_f * (1 + RTOL)
    _, N = plan.oriented_shape
    V = DenseOperator(_orthonormal(N, plan.t, vseed))
    dy = _sketch(A, plan, right=(("Y", V),)) - _sketch(A2, plan, right=(("Y", V),))
    assert np.linalg.norm(dy) <= delta_f * (1 + RTOL)


def test_every_column_of_s_has_norm_exactly_one() -> None:
    """Spec private-lrf-2, section 2: for every draw, not on average."""
    plan = plan_two_pass(LrfParams.of(3, epsilon=1.0, delta=1e-6, algorithm="two-pass"), (3000, 50))
    for seed in (0, 1, 2**127 + 5):
        G = co_range_operator(plan, seed).dense()  # S^T: rows are the columns of S
        np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1.0, rtol=1e-15)


def test_an_unnormalised_s_breaks_the_bound_negative_control() -> None:
    """The same check on ``S`` with +-1 entries (columns of norm sqrt(zeta)) fails."""
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, size=(40, 12))
    A2 = A.copy()
    A2[7] = 0.0  # add/remove: one row removed
    params = LrfParams.of(2, epsilon=1.0, delta=1e-6, algorithm="two-pass", unit="row", core_size=20)
    plan = plan_two_pass(params, A.shape)
    good = co_range_operator(plan, 11)
    bad = DenseOperator(good.dense() * np.sqrt(good.zeta))  # type: ignore[union-attr]
    delta_f = params.clip.clip_norm
    for op, within in ((good, True), (bad, False)):
        dz = _sketch(A, plan, left=(("Z", op),)) - _sketch(A2, plan, left=(("Z", op),))
        assert bool(np.linalg.norm(dz) <= delta_f * (1 + RTOL)) is within
    # and a V without orthonormal columns breaks the bound of Y
    V = DenseOperator(2.0 * _orthonormal(12, 11, 1))
    dy = _sketch(A, plan, right=(("Y", V),)) - _sketch(A2, plan, right=(("Y", V),))
    assert np.linalg.norm(dy) > delta_f * (1 + RTOL)
