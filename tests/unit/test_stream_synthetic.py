"""Synthetic turnstile streams: exact cumulative matrices, exact deletions, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import InvalidParameterError
from pipeline.linalg.stream_synthetic import (
    entity_budget_spent,
    turnstile_matrix,
    turnstile_updates,
)
from pipeline.mechanisms.entities import EntityTable, clip_updates
from pipeline.params import StreamUnit

SHAPE = (40, 25)
KW = {
    "rank": 3,
    "n_epochs": 6,
    "updates_per_epoch": 60,
    "delete_fraction": 0.2,
    "seed": 11,
}


def _summed(updates, shape, epoch):
    A = np.zeros(shape)
    for _, i, j, s in updates[:epoch]:
        np.add.at(A, (i, j), s)
    return A


@pytest.mark.parametrize("epoch", [0, 1, 3, 6])
def test_cumulative_matrix_equals_summed_updates(epoch):
    ups = turnstile_updates(*SHAPE, **KW)
    want = turnstile_matrix(*SHAPE, epoch=epoch, **KW)
    got = _summed(ups, SHAPE, epoch)
    np.testing.assert_array_equal(got != 0, want != 0)  # same live cells
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_deletions_cancel_exactly():
    ups = turnstile_updates(*SHAPE, **KW)
    first = {}  # cell -> value of its insertion
    for tau, (e, i, j, s) in enumerate(ups, start=1):
        n_del = 0 if tau == 1 else int(0.2 * 60)
        assert e.size == 60
        np.testing.assert_array_equal(e, i)
        for a, b, x in zip(
            i[: 60 - n_del].tolist(),
            j[: 60 - n_del].tolist(),
            s[: 60 - n_del].tolist(),
            strict=True,
        ):
            assert (a, b) not in first  # each cell is inserted once
            first[(a, b)] = (x, tau)
        for a, b, x in zip(
            i[60 - n_del :].tolist(),
            j[60 - n_del :].tolist(),
            s[60 - n_del :].tolist(),
            strict=True,
        ):
            value, when = first.pop((a, b))  # withdrawn once, after its insertion
            assert when < tau
            assert x == -value
    # the summed stream is exactly zero (not merely small) on every withdrawn cell
    A = _summed(ups, SHAPE, len(ups))
    live = np.zeros(SHAPE, dtype=bool)
    for a, b in first:
        live[a, b] = True
    assert np.all(A[~live] == 0.0)
    assert np.all(A[live] != 0.0)


def test_seeded_determinism():
    a = turnstile_updates(*SHAPE, **KW)
    b = turnstile_updates(*SHAPE, **KW)
    c = turnstile_updates(*SHAPE, **(KW | {"seed": 12}))
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(x[3], y[3]) for x, y in zip(a, c, strict=True))
    np.testing.assert_array_equal(
        turnstile_matrix(*SHAPE, epoch=4, **KW), turnstile_matrix(*SHAPE, epoch=4, **KW)
    )


def test_dtypes_and_ranges():
    for e, i, j, s in turnstile_updates(*SHAPE, **KW):
        assert e.dtype == i.dtype == j.dtype == np.int64
        assert s.dtype == np.float64
        assert 0 <= i.min() <= i.max() < SHAPE[0]
        assert 0 <= j.min() <= j.max() < SHAPE[1]
        assert np.all(np.isfinite(s))


def test_ground_truth_spectrum_and_row_norm():
    kw = KW | {
        "n_epochs": 5,
        "updates_per_epoch": SHAPE[0] * SHAPE[1] // 5,
        "delete_fraction": 0.0,
    }
    A = turnstile_matrix(*SHAPE, epoch=5, **kw)  # every cell revealed: the ground truth
    s = np.linalg.svd(A, compute_uv=False)
    assert np.isclose(np.linalg.norm(A, axis=1).max(), 1.0)
    np.testing.assert_allclose(s[1:3] / s[0], [0.5, 0.25], rtol=1e-10)
    assert s[3] < 1e-12 * s[0]


def test_budget_spent_matches_clipping():
    ups = turnstile_updates(*SHAPE, **KW)
    spent = entity_budget_spent(ups, SHAPE[0])
    table = EntityTable.empty()
    for e, i, j, s in ups:
        table = clip_updates(
            e, i, j, s, table=table, unit=StreamUnit.ROW, clip_norm=1e9, n_cols=SHAPE[1]
        ).table
    got = np.zeros(SHAPE[0])
    got[table.keys] = table.spent
    np.testing.assert_allclose(got, spent, rtol=1e-12)


def test_too_many_updates_refused():
    with pytest.raises(InvalidParameterError, match="at most n_rows"):
        turnstile_updates(4, 5, rank=1, n_epochs=3, updates_per_epoch=7, seed=0)
