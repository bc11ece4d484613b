"""A stream's continual-release mechanism, through the real stream path.

``stream_init`` / ``stream_ingest`` / ``stream_release`` on Zarr states on disk:
the default mechanism (BLT) releases noise of the stated per-entry std and
covariance at several epochs; one entity's largest change over all epochs
moves the mechanism's Gaussian release ``R X`` by at most the calibrated
sensitivity, and attains it; a state without the mechanism field (every state
written before it) releases by the tree, bit for bit as a new tree stream.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.algorithms.continual_factorization import continual_mechanism
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    mechanism_of,
    noisy_state_sketches,
    open_stream,
    plan_of,
    stream_ingest,
    stream_init,
    stream_release,
)
from pipeline.sketches.operators import SketchOperator

SEED = 20261206
BUDGET = (100.0, 1e-3)


def _init(tmp: Path, name: str, **kw) -> Path:
    state = tmp / name
    args = {"n_rows": 400, "n_cols": 60, "rank": 2, "horizon": 32, "epsilon": 1.0, "delta": 1e-6,
                "unit": "row", "ledger": tmp / f"{name}.json", "budget": BUDGET, "seed": SEED,
                "insecure_noise_seed": SEED}  # fmt: skip
    stream_init(state, **(args | kw))
    return state


def _noise_at(state: Path, tmp: Path, tau: int) -> tuple[dict[str, np.ndarray], dict]:
    """Release ``tau`` of an empty stream; its released sketches are its noise."""
    f, _ = stream_release(state, epoch=tau, out=tmp / f"{state.name}-{tau}.zarr")
    st = open_stream(state)
    with st.lock():
        return noisy_state_sketches(st, tau), f.report


def test_default_mechanism_noise_has_the_stated_std_and_covariance(tmp_path: Path):
    state = _init(tmp_path, "s.stream")
    st = open_stream(state)
    mech, plan = mechanism_of(st.manifest), plan_of(st.manifest)
    assert mech.name == "blt"
    assert mech == continual_mechanism("blt", 32)
    one_shot = {n: plan.lrf.sigma(n) / mech.sensitivity_factor for n in plan.names}
    taus = (1, 3, 8, 32)
    noise, reports = {}, {}
    for tau in taus:
        noise[tau], reports[tau] = _noise_at(state, tmp_path, tau)
    L = mech.factors()[0]  # the decoder: noise(tau) = sigma sum_s L[tau, s] z_s
    for tau in taus:
        rep = reports[tau]["stream"]
        assert rep["mechanism"] == "blt"
        assert rep["noise_factor"] == pytest.approx(mech.noise_factor(tau), rel=1e-12)
        for name, x in noise[tau].items():
            want = mech.noise_factor(tau) * one_shot[name]
            assert rep["noise_std"][name] == pytest.approx(want, rel=1e-12)
            # the sample variance of N iid normals has relative sd sqrt(2 / N): 5 sd
            tol = 5.0 * math.sqrt(2.0 / x.size)
            ratio = float(np.mean(x * x)) / want**2
            assert abs(ratio - 1.0) <= tol, (tau, name, ratio, tol)
            # negative control: the tree's std at tau lies outside the tolerance
            tree = continual_mechanism("tree", 32).noise_factor(tau) * one_shot[name]
            assert abs((tree / want) ** 2 - 1.0) > tol
    # covariance across releases: sigma^2 <L[3], L[8]> per entry; the sample
    # correlation of N pairs has sd <= 1 / sqrt(N): 5 sd
    for name in plan.names:
        a, b = noise[3][name].ravel(), noise[8][name].ravel()
        rho = float(L[2] @ L[7]) / math.sqrt(float(L[2] @ L[2]) * float(L[7] @ L[7]))
        got = float(np.mean(a * b)) / math.sqrt(float(np.mean(a * a) * np.mean(b * b)))
        assert abs(got - rho) <= 5.0 / math.sqrt(a.size), (name, got, rho)
        assert rho > 10.0 / math.sqrt(a.size)  # the control: correlated, not independent


def _top_direction(op: SketchOperator, n: int) -> tuple[np.ndarray, float]:
    """The unit row vector v maximising ||v Phi||, and ||Phi||_2 (public operator)."""
    Phi = op.rows(np.arange(n))
    u, s, _ = np.linalg.svd(Phi, full_matrices=False)
    return u[:, 0], float(s[0])


@pytest.mark.parametrize("mechanism", ["blt", "sqrt-factorization"])
def test_one_entity_moves_the_released_statistic_by_the_calibrated_sensitivity(
    tmp_path: Path, mechanism: str
):
    T, shape, C = 6, (40, 12), 1.0
    kw = {"n_rows": shape[0], "n_cols": shape[1], "rank": 2, "horizon": T, "unit": "row",
              "mechanism": mechanism, "clip_norm": C, "sketch_size": 6, "core_size": 20}  # fmt: skip
    a, b = _init(tmp_path, "a.stream", **kw), _init(tmp_path, "b.stream", **kw)
    plan = plan_of(open_stream(a).manifest)
    mech = mechanism_of(open_stream(a).manifest)
    assert not plan.lrf.transpose  # X = A: Y = A Phi
    from pipeline.algorithms.continual import operators

    v, norm = _top_direction(operators(plan, SEED)["Phi"], shape[1])
    rng = np.random.default_rng(1)
    back = {"entity": np.arange(1, 41), "i": np.arange(40), "j": rng.integers(0, 12, 40),
            "s": rng.uniform(-0.5, 0.5, 40)}  # fmt: skip
    # the entity spends its whole budget at epoch 1 along the operator's top direction
    # (2 C of updates: clipped to C, at the stream's unit)
    extra = {"entity": np.zeros(12, np.int64), "i": np.full(12, 7), "j": np.arange(12),
             "s": 2.0 * C * v}  # fmt: skip
    write_batch(tmp_path / "back.npz", back)
    write_batch(tmp_path / "both.npz", {k: np.concatenate([back[k], extra[k]]) for k in back})
    stream_ingest(a, tmp_path / "back.npz", epoch=1)
    stream_ingest(b, tmp_path / "both.npz", epoch=1)
    prefix = np.zeros((T, shape[0] * plan.lrf.t))
    for tau in range(1, T + 1):
        for s, sign in ((a, -1.0), (b, 1.0)):
            stream_release(s, epoch=tau, out=tmp_path / f"{s.name}-{tau}.zarr")
            prefix[tau - 1] += sign * open_stream(s).read("running/Y").ravel()
    diffs = np.linalg.solve(np.tril(np.ones((T, T))), prefix)  # X - X', epoch by epoch
    _, R = mech.factors()
    moved = float(np.linalg.norm(R @ diffs))  # ||R (X - X')||_F, stacked over epochs
    recorded = next(s for s in plan.lrf.calibration.sketches if s.name == "Y")
    # the public operator's worst-case factor is ||Phi||_2 (attained by v)
    assert recorded.jl_factor == pytest.approx(norm, rel=1e-9)
    assert recorded.sensitivity == pytest.approx(mech.sensitivity_factor * C * norm, rel=1e-12)
    # the entity is clipped to (1 - 1e-9) C (pipeline.mechanisms.entities'
    # margin); the sketch rows and the dense solve round by a few ulps: 1e-12
    assert moved <= recorded.sensitivity * (1.0 - 1e-9) * (1.0 + 1e-12)
    assert moved >= recorded.sensitivity * (1.0 - 1e-9) * (1.0 - 1e-12)  # attained
    # a mis-calibrated variant -- the sensitivity of R's last column, ||R e_T|| = 1,
    # as if the entity's epoch did not matter -- is caught
    assert moved > C * norm * float(np.linalg.norm(R[:, -1])) * 1.01


def test_a_state_without_the_mechanism_field_releases_by_the_tree_bit_for_bit(tmp_path: Path):
    rng = np.random.default_rng(5)
    batch = {"entity": np.arange(400), "i": np.arange(400), "j": rng.integers(0, 60, 400),
             "s": rng.uniform(-1.0, 1.0, 400)}  # fmt: skip
    write_batch(tmp_path / "b.npz", batch)
    new = _init(tmp_path, "new.stream", mechanism="tree")
    old = _init(tmp_path, "old.stream", mechanism="tree")
    st = open_stream(old)
    with st.lock():  # the manifest as dplr wrote it before the field
        params = {k: v for k, v in st.manifest["params"].items() if k != "mechanism"}
        plan = {k: v for k, v in st.manifest["plan"].items() if k != "mechanism"}
        st.commit(changes={"params": params, "plan": plan})
    assert mechanism_of(open_stream(old).manifest).name == "tree"
    out = {}
    for s in (new, old):
        stream_ingest(s, tmp_path / "b.npz", epoch=1)
        f, _ = stream_release(s, epoch=3, out=tmp_path / f"{s.name}.zarr")
        assert open_stream(s).names("tree/")
        assert not open_stream(s).names("running/")
        out[s.name] = (np.asarray(f.U), np.asarray(f.S), np.asarray(f.V))
        assert f.report["stream"]["tree_nodes"] == [[0, 3], [1, 1]]
    for x, y in zip(out["new.stream"], out["old.stream"], strict=True):
        assert x.tobytes() == y.tobytes()
