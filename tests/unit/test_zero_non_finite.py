"""``zero_non_finite``: its one-reduction fast path never hides a non-finite entry.

A NaN or an infinity anywhere makes the block's sum non-finite (NaN and +-Inf
propagate through addition; +Inf + -Inf is NaN), so a finite sum proves the block
finite. A finite block whose sum overflows takes the entry-wise check and comes back
as itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.linalg.clipping import zero_non_finite
from pipeline.params import PrivacyUnit

UNITS = [PrivacyUnit.ROW, PrivacyUnit.COLUMN, PrivacyUnit.ENTRY, None]


def _reference(block: np.ndarray, unit: PrivacyUnit | None) -> np.ndarray:
    """The rule written entry by entry: the unit holding a non-finite value is zero."""
    out = block.copy()
    bad = ~np.isfinite(block)
    for i, j in zip(*np.nonzero(bad), strict=True):
        if unit is PrivacyUnit.ENTRY:
            out[i, j] = 0
        elif unit is PrivacyUnit.COLUMN:
            out[:, j] = 0
        else:
            out[i, :] = 0
    return out


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("unit", UNITS)
def test_zero_non_finite_matches_the_rule_entry_by_entry(seed: int, unit: PrivacyUnit | None) -> None:
    rng = np.random.default_rng(seed)
    block = rng.standard_normal((7, 5)) * 10.0 ** rng.integers(-3, 300)
    for value in rng.choice([np.nan, np.inf, -np.inf, 1e308, -1e308], size=rng.integers(0, 4)):
        block[rng.integers(7), rng.integers(5)] = value
    got = zero_non_finite(block.copy(), unit)
    np.testing.assert_array_equal(got, _reference(block, unit))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_overflowing_sum_of_finite_values_keeps_the_block(dtype: type) -> None:
    big = np.finfo(dtype).max
    block = np.array([[big, big], [1.0, 2.0]], dtype=dtype)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sum(block))  # the fast path cannot decide here
    assert zero_non_finite(block, PrivacyUnit.ROW) is block


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_one_non_finite_entry_among_huge_ones_is_found(value: float) -> None:
    block = np.full((3, 3), 1e300)
    block[1, 2] = value
    got = zero_non_finite(block, PrivacyUnit.ROW)
    assert got is not block
    assert not got[1].any()
    assert np.isfinite(got).all()
    # control: the other rows are untouched
    np.testing.assert_array_equal(got[[0, 2]], block[[0, 2]])
