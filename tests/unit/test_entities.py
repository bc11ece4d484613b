"""Per-entity clipping of turnstile updates (spec sketch-lrf 1.3 rules 2-4, 1.4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import PrivacyUnitError
from pipeline.mechanisms.entities import EntityTable, clip_updates, coalesce
from pipeline.params import StreamUnit

# clip target is (1 - 1e-9) C; rounding of the norms adds a few ulps
_MARGIN = 1.0 - 1e-9
_ULPS = 1e-12


def _clip(e, i, j, s, *, table=None, unit=StreamUnit.GENERAL, C=1.0, n_cols=10):
    return clip_updates(
        np.asarray(e), np.asarray(i), np.asarray(j), np.asarray(s, dtype=float),
        table=table or EntityTable.empty(), unit=unit, clip_norm=C, n_cols=n_cols,
    )


def _dense(out, shape=(10, 10)):
    A = np.zeros(shape)
    np.add.at(A, (out.rows, out.cols), out.vals)
    return A


def test_net_contribution_is_clipped_not_each_update():
    # +5 then -5 on one cell is a net zero: nothing to clip, nothing spent
    out = _clip([1, 1], [0, 0], [0, 0], [5.0, -5.0])
    assert np.all(out.vals == 0.0)
    assert out.table.spent.tolist() == [0.0]
    # 100 updates of 0.1 on one cell: net 10, clipped to 1 (per-update clipping would not bind)
    out = _clip([2] * 100, [0] * 100, [0] * 100, [0.1] * 100)
    assert _dense(out)[0, 0] == pytest.approx(_MARGIN, rel=_ULPS)


def test_within_budget_is_unchanged_and_direction_is_kept():
    out = _clip([7, 7], [0, 0], [0, 1], [0.3, 0.4])
    np.testing.assert_allclose(_dense(out)[0, :2], [0.3, 0.4], rtol=0, atol=0)
    out = _clip([7, 7], [0, 0], [0, 1], [3.0, 4.0])
    np.testing.assert_allclose(_dense(out)[0, :2], np.array([0.6, 0.8]) * _MARGIN, rtol=1e-14)


def test_budget_spans_batches_and_deletions_spend_it():
    first = _clip([3], [1], [1], [0.75])
    assert first.table.spent[0] == pytest.approx(0.75)
    # a deletion of the same amount spends budget too: only 0.25 (minus margin) is left
    second = _clip([3], [1], [1], [-0.75], table=first.table)
    assert _dense(second)[1, 1] == pytest.approx(-(_MARGIN - 0.75), rel=1e-9)
    third = _clip([3], [1], [1], [1.0], table=second.table)
    assert np.all(third.vals == 0.0)  # budget exhausted
    assert third.table.spent[0] == pytest.approx(_MARGIN, rel=_ULPS)


def test_entities_do_not_affect_each_other():
    alone = _clip([1, 1], [0, 0], [0, 1], [0.2, 0.9])
    both = _clip([1, 1, 2, 2, 2], [0, 0, 0, 5, 5], [0, 1, 0, 3, 4], [0.2, 0.9, 50.0, 7.0, -1.0])
    other = _clip([2, 2, 2], [0, 5, 5], [0, 3, 4], [50.0, 7.0, -1.0])
    np.testing.assert_allclose(_dense(both), _dense(alone) + _dense(other), rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    ("unit", "i", "j"),
    [(StreamUnit.ROW, [0, 1], [0, 0]), (StreamUnit.COLUMN, [0, 0], [0, 1]), (StreamUnit.ENTRY, [0, 0], [0, 1])],
)
def test_unit_violations_within_a_batch_are_refused(unit, i, j):
    with pytest.raises(PrivacyUnitError, match=f"privacy unit '{unit.value}'") as exc:
        _clip([9, 9], i, j, [123456.789, 1.0], unit=unit)
    assert "123456" not in str(exc.value)
    assert "9" not in str(exc.value).replace("dplr", "")


def test_unit_violation_across_batches_is_refused_and_units_hold_otherwise():
    first = _clip([4, 4], [2, 2], [0, 3], [0.1, 0.1], unit=StreamUnit.ROW)
    _clip([4], [2], [7], [0.1], table=first.table, unit=StreamUnit.ROW)  # same row: fine
    with pytest.raises(PrivacyUnitError, match="earlier batches"):
        _clip([4], [3], [0], [0.1], table=first.table, unit=StreamUnit.ROW)
    # negative control: the general unit accepts the same updates
    _clip([4], [3], [0], [0.1], table=first.table, unit=StreamUnit.GENERAL)


@pytest.mark.parametrize(
    ("unit", "cells"),
    [(StreamUnit.ROW, ([1, 1], [0, 5])), (StreamUnit.COLUMN, ([0, 5], [2, 2])),
     (StreamUnit.ENTRY, ([3, 3], [4, 4]))],
)  # fmt: skip
def test_exclusive_refuses_two_entities_on_one_row_column_or_cell(unit, cells):
    i, j = cells
    kw = {"unit": unit, "exclusive": True}
    with pytest.raises(PrivacyUnitError, match="two entities touch one") as exc:
        clip_updates(np.array([7, 8]), np.array(i), np.array(j), np.array([0.25, 0.5]),
                     table=EntityTable.empty(), clip_norm=1.0, n_cols=10, **kw)  # fmt: skip
    assert not {"7", "8", "0.25", "0.5"} & set(str(exc.value).split())
    # across batches: a new entity on a held row (column, cell) is refused, the
    # entity that holds it may come back
    first = clip_updates(np.array([7]), np.array(i[:1]), np.array(j[:1]), np.array([0.25]),
                         table=EntityTable.empty(), clip_norm=1.0, n_cols=10, **kw)  # fmt: skip
    again = (np.array(i[:1]), np.array(j[:1]), np.array([0.25]))
    clip_updates(np.array([7]), *again, table=first.table, clip_norm=1.0, n_cols=10, **kw)
    with pytest.raises(PrivacyUnitError, match="earlier batch"):
        clip_updates(np.array([8]), np.array(i[1:]), np.array(j[1:]), np.array([0.5]),
                     table=first.table, clip_norm=1.0, n_cols=10, **kw)  # fmt: skip
    # negative control: without exclusive, both batches are fine
    out = _clip([7, 8], i, j, [0.25, 0.5], unit=unit)
    assert len(out.table) == 2


def test_float_limits_subnormals_and_negative_zero():
    big = np.finfo(float).max
    out = _clip([1, 1, 1], [0, 0, 0], [0, 0, 1], [big, big, big])  # duplicate sum overflows naively
    assert np.all(np.isfinite(out.vals))
    v = _dense(out)[0, :2]
    np.testing.assert_allclose(v, np.array([2, 1]) / np.sqrt(5) * _MARGIN, rtol=1e-12)
    tiny = 5e-324
    out = _clip([2, 2], [0, 0], [0, 1], [tiny, -tiny])
    np.testing.assert_array_equal(_dense(out)[0, :2], [tiny, -tiny])
    out = _clip([3], [0], [0], [-0.0])
    assert out.vals.tolist() == [0.0]
    assert out.table.spent.tolist() == [0.0]


def test_empty_batch_and_coalesce():
    out = _clip([], [], [], [])
    assert out.rows.size == 0
    assert len(out.table) == 0
    r, c, v = coalesce(np.array([2, 0, 2, 2]), np.array([1, 5, 1, 0]), np.array([1.0, 2.0, 3.0, 4.0]), 6)
    assert (r.tolist(), c.tolist(), v.tolist()) == ([0, 2, 2], [5, 0, 1], [2.0, 4.0, 4.0])


def test_private_objects_have_redacted_reprs():
    out = _clip([1], [0], [0], [123456.789])
    assert "123456" not in repr(out)
    assert "123456" not in repr(out.table)


batches = st.lists(
    st.lists(
        st.tuples(
            st.integers(0, 4), st.integers(0, 3), st.integers(0, 3),
            st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
        ),
        max_size=25,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_every_entity_total_stays_within_the_clip_norm(stream):
    """Rules 2-4 [spec 1.3]: sum over batches of ||D_e,batch||_F <= C for every entity."""
    C = 1.5
    table = EntityTable.empty()
    totals: dict[int, float] = {}
    for batch in stream:
        e, i, j, s = (np.array(x) for x in zip(*batch, strict=True)) if batch else ([], [], [], [])
        e = np.asarray(e, dtype=np.int64)
        # measure each entity's applied contribution by clipping it alone (independence)
        for ent in np.unique(e):
            sel = e == ent
            alone = clip_updates(e[sel], np.asarray(i)[sel], np.asarray(j)[sel], np.asarray(s, float)[sel],
                                 table=table, unit=StreamUnit.GENERAL, clip_norm=C, n_cols=4)
            A = np.zeros((4, 4))
            np.add.at(A, (alone.rows, alone.cols), alone.vals)
            totals[int(ent)] = totals.get(int(ent), 0.0) + float(np.linalg.norm(A))
        table = clip_updates(e, np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64), np.asarray(s, float),
                             table=table, unit=StreamUnit.GENERAL, clip_norm=C, n_cols=4).table
    for total in totals.values():
        assert total <= C * (1 + _ULPS)
    assert np.all(table.spent <= C * _MARGIN * (1 + _ULPS))


def test_negative_control_per_update_clipping_breaks_the_bound():
    """Clipping each update to C (not the net contribution) lets an entity exceed C."""
    s = np.full(50, 1.0)
    per_update = np.clip(s, -1.0, 1.0).sum()  # the broken rule: each update within C
    assert per_update > 1.0
    out = _clip(np.zeros(50, dtype=int), np.zeros(50, dtype=int), np.zeros(50, dtype=int), s)
    assert np.linalg.norm(out.vals) <= 1.0
