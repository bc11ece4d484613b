"""A stream's sparse sign ``S``: one entity moves ``R (Z - Z')`` by exactly its calibrated sensitivity.

Mirrors tests/property/test_sparse_private.py (the batch release's sparse ``S``)
through the real stream path (``stream_init`` / ``stream_ingest`` /
``stream_release`` on Zarr states on disk): an entity that stays in one row of
the sketched matrix (``unit`` row, or ``entry``) and spends its whole clipping
budget at the epoch that maximises ``||R e_s||`` moves the factorization
mechanism's Gaussian release of ``Z = S X``, stacked over every epoch, by
``max_s ||R e_s|| * Delta_F`` -- the calibrated sensitivity, attained. A
calibration that forgets the epoch factor is caught, and an entity spread over a
column (what ``unit`` general allows) would move ``S X`` by ``||S||_2 > 1`` per
unit of norm: why that unit keeps the Gaussian ``S``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.algorithms.continual import operators
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    mechanism_of,
    open_stream,
    plan_of,
    stream_ingest,
    stream_init,
    stream_release,
)
from pipeline.params import OperatorKind

pytestmark = pytest.mark.property

BUDGET = (100.0, 1e-3)
T, SHAPE, C = 6, (40, 12), 1.0


def _pair(tmp: Path, mechanism: str, unit: str, seed: int | None, d: np.ndarray):
    """Two streams that differ in one entity of row 7 (2 C of updates at epoch 1)."""
    kw = {"n_rows": SHAPE[0], "n_cols": SHAPE[1], "rank": 2, "horizon": T, "epsilon": 1.0,
          "delta": 1e-6, "unit": unit, "mechanism": mechanism, "clip_norm": C, "budget": BUDGET,
          "seed": seed, "sketch_size": 6, "core_size": 20}  # fmt: skip
    a, b = tmp / "a.stream", tmp / "b.stream"
    stream_init(a, ledger=tmp / "l.json", **kw)
    shutil.copytree(a, b)  # the same (secret) operators in both
    rng = np.random.default_rng(11)
    m = SHAPE[0]
    back = {"entity": np.arange(1, m + 1), "i": np.arange(m), "j": rng.integers(0, SHAPE[1], m),
            "s": rng.uniform(-0.5, 0.5, m)}  # fmt: skip
    cols = np.flatnonzero(d) if unit == "entry" else np.arange(SHAPE[1])
    extra = {"entity": np.zeros(cols.size, np.int64), "i": np.full(cols.size, 7), "j": cols,
             "s": 2.0 * C * d[cols] / np.linalg.norm(d)}  # fmt: skip
    write_batch(tmp / "back.npz", back)
    write_batch(tmp / "both.npz", {k: np.concatenate([back[k], extra[k]]) for k in back})
    stream_ingest(a, tmp / "back.npz", epoch=1)
    stream_ingest(b, tmp / "both.npz", epoch=1)
    return a, b


@pytest.mark.parametrize(
    ("mechanism", "unit", "seed"),
    [("blt", "row", 5), ("sqrt-factorization", "entry", None), ("blt", "entry", None)],
)
def test_one_entity_moves_the_stream_z_by_the_calibrated_sensitivity(
    tmp_path: Path, mechanism: str, unit: str, seed: int | None
):
    d = np.zeros(SHAPE[1])
    if unit == "entry":
        d[4] = 1.0
    else:
        d[:] = np.random.default_rng(2).standard_normal(SHAPE[1])
    a, b = _pair(tmp_path, mechanism, unit, seed, d)
    plan, mech = plan_of(open_stream(a).manifest), mechanism_of(open_stream(a).manifest)
    assert not plan.lrf.transpose
    assert plan.lrf.operator is OperatorKind.SPARSE_SIGN
    prefix = np.zeros((T, SHAPE[1] * plan.lrf.v))
    for tau in range(1, T + 1):
        for s, sign in ((a, -1.0), (b, 1.0)):
            stream_release(s, epoch=tau, out=tmp_path / f"{s.name}-{tau}.zarr")
            prefix[tau - 1] += sign * open_stream(s).read("running/Z").ravel()
    diffs = np.linalg.solve(np.tril(np.ones((T, T))), prefix)  # Z - Z', epoch by epoch
    _, R = mech.factors()
    moved = float(np.linalg.norm(R @ diffs))  # ||R (Z - Z')||_F over every epoch
    recorded = next(s for s in plan.lrf.calibration.sketches if s.name == "Z")
    assert recorded.jl_factor == 1.0  # exact: a sparse sign's columns have norm 1
    assert recorded.sensitivity == pytest.approx(mech.sensitivity_factor * C, rel=1e-12)
    # the entity is clipped to (1 - 1e-9) C (pipeline.mechanisms.entities' margin);
    # the sketch rows and the dense solve round by a few ulps: 1e-12
    assert moved <= recorded.sensitivity * (1.0 - 1e-9) * (1.0 + 1e-12)
    assert moved >= recorded.sensitivity * (1.0 - 1e-9) * (1.0 - 1e-12)  # attained
    # a mis-calibrated variant -- R's last column, ||R e_T|| = 1, as if the epoch
    # an entity spends its budget in did not matter -- is caught
    assert moved > C * float(np.linalg.norm(R[:, -1])) * 1.01


def test_an_entity_spread_over_a_column_exceeds_the_sparse_bound(tmp_path: Path):
    """Negative control: why ``unit`` general keeps the Gaussian ``S``."""
    stream_init(tmp_path / "s.stream", n_rows=SHAPE[0], n_cols=SHAPE[1], rank=2, horizon=T,
                epsilon=1.0, delta=1e-6, unit="row", seed=5, sketch_size=6, core_size=20,
                ledger=tmp_path / "l.json", budget=BUDGET)  # fmt: skip
    plan = plan_of(open_stream(tmp_path / "s.stream").manifest)
    S = operators(plan, 5)["S"].rows(np.arange(SHAPE[0]))  # (M, v): Z = S^T X
    # a unit-norm column c of X (cells in every row) moves S^T X by ||S^T c||, up to ||S||_2
    assert np.linalg.norm(S, 2) > 1.5
    assert np.allclose(np.linalg.norm(S, axis=1), 1.0, rtol=0, atol=4 * 2.0**-52)
