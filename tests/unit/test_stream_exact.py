"""Streams plan with the batch one-pass release's exact machinery where their unit allows.

A stream whose entities each stay in one row of the sketched matrix (``unit``
row on a tall matrix, or ``entry`` with a secret sketch seed) gets the sparse
sign ``S`` (exact sensitivity), the error model's sizes and budget split and the
denoised range basis -- at horizon 1, the very plan of the batch one-pass
release of the same matrix. ``unit`` general keeps the Gaussian ``S`` with its
tail bound and says why. A state written before (no plan version in its
manifest) re-plans with the operators, sizes and split it was created with; a
manifest whose recorded plan this version would not derive is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.algorithms.continual import (
    LEGACY_PLAN_VERSION,
    ONE_SHOT_SPLIT_PLAN_VERSION,
    PLAN_VERSION,
    plan_stream,
)
from pipeline.algorithms.lrf import plan_lrf
from pipeline.algorithms.lrf.model import predict, weight_of
from pipeline.errors import StoreLayoutError
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    mechanism_of,
    open_stream,
    plan_of,
    stream_ingest,
    stream_init,
    stream_release,
    stream_status,
)
from pipeline.params import (
    Algorithm,
    ClipSpec,
    LrfParams,
    OperatorKind,
    PrivacyUnit,
    StreamUnit,
)

SEED = 20261207
BUDGET = (100.0, 1e-3)
SHAPE = (3000, 200)


def _batch_plan(unit: PrivacyUnit):
    # the batch release of the same matrix; a stream cannot clip its range sketch
    # (a running sum over epochs), so the batch row-unit plan to match is unclipped
    p = LrfParams(algorithm=Algorithm.SPECTRAL, rank=5, epsilon=2.0, delta=1e-6,
                  clip=ClipSpec(unit=unit, clip_norm=1.0), range_clip=False)  # fmt: skip
    return plan_lrf(p, SHAPE)


@pytest.mark.parametrize(("unit", "mechanism"),
                         [("entry", "sqrt-factorization"), ("row", "sqrt-factorization"),
                          ("entry", "blt"), ("row", "tree")])  # fmt: skip
def test_a_horizon_one_stream_is_planned_as_the_batch_one_pass_release(
    tmp_path: Path, unit: str, mechanism: str
):
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=5, horizon=1, epsilon=2.0,
                delta=1e-6, unit=unit, mechanism=mechanism,
                ledger=tmp_path / "l.json", budget=BUDGET)  # fmt: skip
    got = plan_of(open_stream(state).manifest).lrf
    want = _batch_plan(PrivacyUnit(unit))
    assert got.operator is want.operator is OperatorKind.SPARSE_SIGN
    assert (got.t, got.v, got.transpose, got.basis_rank) == (want.t, want.v, want.transpose, 5)
    assert got.range_weight == want.range_weight
    assert got.predicted_error == want.predicted_error
    # T = 1: max_s ||R e_s|| = c_0 = 1 (summed in floating point: within 8 ulps),
    # and every sensitivity and sigma is the batch release's times it
    # (the tree at T = 1: one level, calibrated as the one-shot release)
    sf = plan_of(open_stream(state).manifest).sensitivity_factor or 1.0
    assert abs(sf - 1.0) <= 8 * 2.0**-52
    for g, w in zip(got.calibration.sketches, want.calibration.sketches, strict=True):
        assert (g.name, g.shape, g.jl_factor, g.weight) == (w.name, w.shape, w.jl_factor, w.weight)
        assert (g.sigma, g.sensitivity) == (w.sigma * sf, w.sensitivity * sf)
    assert got.calibration.delta_jl == want.calibration.delta_jl
    m = open_stream(state).manifest
    assert (m["params"]["plan_version"], m["params"]["operator"]) == (PLAN_VERSION, "sparse-sign")


def test_the_general_unit_keeps_the_gaussian_s_and_says_why(tmp_path: Path):
    state = tmp_path / "g.stream"
    stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=5, horizon=8, epsilon=2.0,
                delta=1e-6, unit="general", ledger=tmp_path / "l.json", budget=BUDGET)  # fmt: skip
    plan = plan_of(open_stream(state).manifest)
    assert plan.lrf.operator is OperatorKind.GAUSSIAN
    assert all(s.jl_factor > 1.0 for s in plan.lrf.calibration.sketches)  # both tail bounds
    # still the error model's sizes and split, not the spec's t = max(4k, k + 20)
    assert plan.lrf.t > 25
    assert plan.lrf.range_weight != 0.5
    why = stream_status(state).operators
    assert "span rows" in why["co_range"]
    assert "Gaussian" in why["co_range"]
    assert "tail bound" in why["range"]


def _legacy_manifest(state: Path) -> None:
    """Rewrite a new state's manifest as a dplr version before the plan version wrote it."""
    st = open_stream(state)
    with st.lock():
        m = st.manifest
        params = {k: v for k, v in m["params"].items() if k != "plan_version"}
        params["operator"] = "gaussian"
        p = m["params"]
        old = plan_stream(
            LrfParams(algorithm=Algorithm.SPECTRAL, rank=p["rank"], epsilon=p["epsilon"],
                      delta=p["delta"], clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
                      operator=OperatorKind.GAUSSIAN),
            (p["n_rows"], p["n_cols"]), p["horizon"], version=LEGACY_PLAN_VERSION,
            sensitivity_factor=m["plan"]["mechanism"]["sensitivity_factor"],
        )  # fmt: skip
        plan = dict(m["plan"], sketch_size=old.lrf.t, core_size=old.lrf.v,
                    calibration=old.lrf.calibration.to_dict())  # fmt: skip
        st.commit(changes={"params": params, "plan": plan})


def _old_state_twice_and_a_new_one(tmp_path: Path, horizon: int, rewrite, seed: int):
    """A batch of 400 cells, two new states, one rewritten by ``rewrite`` as an older
    version wrote it and copied (``old-a``, ``old-b``: the same state twice), and ``new``."""
    rng = np.random.default_rng(seed)
    n = 400
    batch = {"entity": np.arange(n), "i": np.arange(n), "j": rng.integers(0, 60, n),
             "s": rng.uniform(-1.0, 1.0, n)}  # fmt: skip
    write_batch(tmp_path / "b.npz", batch)
    kw = {"n_rows": 400, "n_cols": 60, "rank": 2, "horizon": horizon, "epsilon": 1.0,
          "delta": 1e-6, "unit": "entry", "budget": BUDGET, "insecure_noise_seed": SEED}  # fmt: skip
    states = {name: tmp_path / f"{name}.stream" for name in ("old-a", "old-b", "new")}
    for name in ("old-a", "new"):
        stream_init(states[name], ledger=tmp_path / f"{name}.json", **kw)
    rewrite(states["old-a"])
    shutil.copytree(states["old-a"], states["old-b"])  # the same state, twice
    return states


def test_a_state_of_the_current_format_releases_with_its_own_operators(tmp_path: Path):
    states = _old_state_twice_and_a_new_one(tmp_path, 16, _legacy_manifest, seed=3)
    old = plan_of(open_stream(states["old-a"]).manifest)
    new = plan_of(open_stream(states["new"]).manifest)
    # the spec's sizes, the even split and the Gaussian S with its tail bound
    assert (old.lrf.t, old.lrf.v, old.lrf.range_weight) == (22, 88, 0.5)
    assert old.lrf.operator is OperatorKind.GAUSSIAN
    assert new.lrf.operator is OperatorKind.SPARSE_SIGN
    assert new.lrf.t != 22
    out = {}
    for name, s in states.items():
        stream_ingest(s, tmp_path / "b.npz", epoch=1)
        f, _ = stream_release(s, epoch=3, out=tmp_path / f"{name}.zarr")
        out[name] = (np.asarray(f.U), np.asarray(f.S), np.asarray(f.V))
        assert f.report["stream"]["noise_std"]["Z"] == pytest.approx(
            f.report["stream"]["noise_factor"] * plan_of(open_stream(s).manifest).lrf.sigma("Z")
            / f.report["stream"]["sensitivity_factor"], rel=1e-12)  # fmt: skip
    assert out["old-a"][1].shape == (2,)
    for x, y in zip(out["old-a"], out["old-b"], strict=True):  # the same state, the same bytes
        assert x.tobytes() == y.tobytes()
    assert out["old-a"][0].tobytes() != out["new"][0].tobytes()  # control: other operators


def test_a_manifest_whose_plan_this_version_would_not_derive_is_refused(tmp_path: Path):
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=400, n_cols=60, rank=2, horizon=4, epsilon=1.0, delta=1e-6,
                unit="entry", ledger=tmp_path / "l.json", budget=BUDGET)  # fmt: skip
    st = open_stream(state)
    with st.lock():
        m = st.manifest
        cal = dict(m["plan"]["calibration"])
        cal["sketches"] = [dict(s, sigma=s["sigma"] * 0.5) for s in cal["sketches"]]
        st.commit(changes={"plan": dict(m["plan"], calibration=cal)})
    with pytest.raises(StoreLayoutError, match="does not match"):
        plan_of(open_stream(state).manifest)


def test_plan_stream_defaults_to_the_general_unit_and_the_current_version():
    p = LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0, delta=1e-6)
    plan = plan_stream(p, (500, 300), 8)
    assert (plan.version, plan.unit) == (PLAN_VERSION, StreamUnit.GENERAL)
    assert plan.lrf.operator is OperatorKind.GAUSSIAN
    entry = plan_stream(p, (500, 300), 8, unit=StreamUnit.ENTRY)
    assert entry.lrf.operator is OperatorKind.SPARSE_SIGN
    # a public seed with the entry unit is calibrated for any difference, as in a batch release
    assert plan_stream(p, (500, 300), 8, unit=StreamUnit.ENTRY, public_seed=4).lrf.operator \
        is OperatorKind.GAUSSIAN  # fmt: skip


def test_a_long_stream_splits_its_budget_for_its_noise(tmp_path: Path):
    # version 3: the error model's split at the root mean square of the noise factor
    # over the horizon (model.py, "Noise above the one-shot release's"); the sizes,
    # operators and basis stay the batch release's
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=5, horizon=366, epsilon=2.0,
                delta=1e-6, unit="entry", ledger=tmp_path / "l.json", budget=BUDGET)  # fmt: skip
    manifest = open_stream(state).manifest
    got = plan_of(manifest).lrf
    batch = _batch_plan(PrivacyUnit.ENTRY)
    f = mechanism_of(manifest).rms_noise_factor
    assert 2.5 < f < 3.0  # BLT at T = 366 (continual_factorization: about 2.75)
    assert got.range_weight == weight_of(batch, noise_factor=f)
    assert got.range_weight < batch.range_weight - 0.05  # control: not the one-shot split
    assert (got.t, got.v, got.operator) == (batch.t, batch.v, batch.operator)
    by_name = {s.name: s.weight for s in got.calibration.sketches}
    assert by_name["Y"] == pytest.approx(got.range_weight, rel=1e-12)
    # the model's prediction at the worst epoch: above the one-shot, below linear scaling
    status = stream_status(state)
    one = predict(got).ratio
    worst = predict(got, noise_factor=mechanism_of(manifest).noise_factor(366)).ratio
    assert one < worst < mechanism_of(manifest).noise_factor(366) * one
    assert status.unit == "entry"
    assert "split at the stream's noise" in status.operators["sizes"]


def _one_shot_split_manifest(state: Path) -> None:
    """Rewrite a new state's manifest as the version that planned the one-shot split wrote it."""
    st = open_stream(state)
    with st.lock():
        m = st.manifest
        params = dict(m["params"], plan_version=ONE_SHOT_SPLIT_PLAN_VERSION)
        mech = mechanism_of(m)
        old = plan_stream(
            LrfParams(algorithm=Algorithm.SPECTRAL, rank=params["rank"],
                      epsilon=params["epsilon"], delta=params["delta"],
                      clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)),
            (params["n_rows"], params["n_cols"]), params["horizon"], unit=StreamUnit.ENTRY,
            sensitivity_factor=mech.sensitivity_factor, version=ONE_SHOT_SPLIT_PLAN_VERSION,
        )  # fmt: skip
        plan = dict(m["plan"], calibration=old.lrf.calibration.to_dict())
        st.commit(changes={"params": params, "plan": plan})


def test_a_state_planned_with_the_one_shot_split_keeps_it(tmp_path: Path):
    states = _old_state_twice_and_a_new_one(tmp_path, 64, _one_shot_split_manifest, seed=5)
    v2 = plan_of(open_stream(states["old-a"]).manifest)
    new = plan_of(open_stream(states["new"]).manifest)
    batch_plan = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0,
                                    delta=1e-6, clip=ClipSpec(unit=PrivacyUnit.ENTRY,
                                                              clip_norm=1.0)), (400, 60))  # fmt: skip
    assert v2.version == ONE_SHOT_SPLIT_PLAN_VERSION
    assert v2.lrf.range_weight == batch_plan.range_weight  # its split, not re-planned
    assert "one release's budget split" in stream_status(states["old-a"]).operators["sizes"]
    assert new.lrf.range_weight < v2.lrf.range_weight
    out = {}
    for name, s in states.items():
        stream_ingest(s, tmp_path / "b.npz", epoch=1)
        f, _ = stream_release(s, epoch=3, out=tmp_path / f"{name}.zarr")
        out[name] = np.asarray(f.U)
    assert out["old-a"].tobytes() == out["old-b"].tobytes()  # the same state, the same bytes
    assert out["old-a"].tobytes() != out["new"].tobytes()  # control: another split
