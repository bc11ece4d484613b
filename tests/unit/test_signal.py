"""Signal against noise in every release (post-processing of released values only)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import zarr

import pipeline
from pipeline.algorithms.lrf import noise_level
from pipeline.estimators import DPPCA
from pipeline.io.batches import write_batch
from pipeline.io.release import read_release
from pipeline.io.synthetic import generate_store
from pipeline.jobs import stream
from pipeline.jobs.pca import pca_signal
from pipeline.jobs.reports import (
    CentredPcaReport,
    FactorizeReport,
    PcaReport,
    load_report,
)
from pipeline.mechanisms.signal import Signal, signal_of
from pipeline.params import Algorithm

#: the in-memory releases here charge an accountant of their own, not the process's
#: shared one (their epsilon = 1000 would dominate what other tests compose)
OWN = "signal-tests"
KEYS = ["noise_level", "confidence", "above", "of", "advice"]


def _generated(tmp_path: Path, seed: int) -> np.ndarray:
    """A generated store (rows of norm <= 1, fast-decaying spectrum), read into memory."""
    path = tmp_path / "a.zarr"
    generate_store(path, 2000, 50, decay=0.5, chunks=(500, -1), seed=seed)
    return np.asarray(zarr.open_array(str(path), mode="r")[:], dtype=np.float64)


@pytest.mark.parametrize("algorithm", ["two-pass", "spectral", "low-space"])
def test_a_noise_release_is_flagged_and_a_strong_one_is_not(
    tmp_path: Path, global_seed: int, algorithm: str
) -> None:
    A = _generated(tmp_path, global_seed)
    weak = pipeline.factorize(
        A, 2, epsilon=0.05, delta=1e-6, dataset=OWN, algorithm=algorithm,
        insecure_noise_seed=global_seed, seed=global_seed,
    )  # fmt: skip
    sig = weak.report["signal"]
    assert list(sig) == KEYS
    assert (sig["above"], sig["of"], sig["confidence"]) == (0, 2, 0.95)
    assert "larger epsilon" in sig["advice"]
    # negative control: the same store at a large epsilon stands above the noise
    strong = pipeline.factorize(
        A, 2, epsilon=1000.0, delta=1e-6, dataset=OWN, algorithm=algorithm,
        insecure_noise_seed=global_seed, seed=global_seed,
    )  # fmt: skip
    assert strong.report["signal"]["above"] == 2
    assert strong.report["signal"]["advice"] == ""
    assert strong.report["signal"]["noise_level"] < sig["noise_level"]


def test_pca_signal_flags_noise_and_not_signal(
    tmp_path: Path, global_seed: int
) -> None:
    A = _generated(tmp_path, global_seed)
    kw = {"method": "analyze-gauss", "insecure_noise_seed": global_seed}
    weak = pipeline.pca(A, 2, epsilon=0.05, delta=1e-6, dataset=OWN, **kw)
    assert weak.report["signal"]["above"] == 0
    assert weak.report["signal"]["advice"]
    strong = pipeline.pca(
        A, 2, epsilon=1000.0, delta=1e-6, dataset=OWN, **kw
    )  # negative control
    assert strong.report["signal"]["above"] == 2
    assert strong.report["signal"]["of"] == 2  # k components (eigenvalues has k + 1)


def test_the_flag_reads_released_values_and_public_parameters_only(
    global_seed: int,
) -> None:
    """Two different inputs whose released values are identical get the same signal."""
    rng = np.random.default_rng(global_seed)
    A = rng.normal(size=(300, 40))
    A /= np.linalg.norm(A, axis=1, keepdims=True).max()
    B = A[::-1] * 0.5  # other data, the same public shape and parameters
    kw = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "dataset": OWN,
        "insecure_noise_seed": global_seed,
        "seed": 1,
    }
    fa, fb = pipeline.factorize(A, 3, **kw), pipeline.factorize(B, 3, **kw)
    assert not np.array_equal(fa.S, fb.S)
    # the report's flag is a function of (released S, public law) alone:
    for f in (fa, fb):
        sy = next(s["sigma"] for s in f.report["sketches"] if s["name"] == "Y")
        level = noise_level(Algorithm.TWO_PASS, (300, 40), 3, {"Y": sy})
        assert f.report["signal"] == signal_of(f.S, level).to_dict()
    # so B's public law with A's released values gives A's flag exactly
    sy_b = next(s["sigma"] for s in fb.report["sketches"] if s["name"] == "Y")
    level_b = noise_level(Algorithm.TWO_PASS, (300, 40), 3, {"Y": sy_b})
    assert signal_of(fa.S, level_b).to_dict() == fa.report["signal"]
    # and no function of the flag takes the data
    for fn in (signal_of, noise_level, pca_signal):
        assert not {"source", "data", "A", "X"} & set(inspect.signature(fn).parameters)


def test_few_components_above_advise_a_smaller_k() -> None:
    sig = signal_of([10.0, 6.0, 2.0, 1.0], 5.0)
    assert (sig.above, sig.of) == (2, 4)
    assert "smaller k (2)" in sig.advice
    assert sig.line() == "2 of 4 components above the noise (level 5 at 95%)"
    assert Signal.from_dict(sig.to_dict()) == sig


def test_typed_reports_read_back_to_the_same_dict(global_seed: int) -> None:
    """``from_dict`` inverts ``to_dict``: the on-disk report round-trips exactly."""
    rng = np.random.default_rng(global_seed)
    A = rng.normal(size=(200, 30)) / 10.0
    for kw in ({"epsilon": 1.0, "delta": 1e-6, "dataset": OWN}, {"private": False}):
        rep = pipeline.factorize(A, 2, insecure_noise_seed=None, **kw).report
        typed = load_report(rep)
        assert isinstance(typed, FactorizeReport)
        assert typed.to_dict() == rep
        assert list(typed.to_dict()) == list(rep)
    rep = pipeline.pca(
        A, 2, epsilon=1.0, delta=1e-6, method="analyze-gauss", dataset=OWN
    ).report
    typed = load_report(rep)
    assert isinstance(typed, PcaReport)
    assert typed.to_dict() == rep
    assert typed.signal == Signal.from_dict(rep["signal"])
    # a centred PCA's report is a type of its own, private or not
    for kw in ({"epsilon": 1.0, "delta": 1e-6, "dataset": OWN}, {"private": False}):
        rep = DPPCA(2, method="analyze-gauss", centre=True, **kw).fit(A).privacy_report_
        typed = load_report(rep)
        assert isinstance(typed, CentredPcaReport)
        assert typed.to_dict() == rep
        assert list(typed.to_dict()) == list(rep)


def test_every_stream_epoch_reports_its_signal(tmp_path: Path) -> None:
    """A stream's epoch release carries ``signal``, from that epoch's noise stds."""
    state = tmp_path / "s.stream"
    stream.stream_init(state, n_rows=30, n_cols=20, rank=2, horizon=2, epsilon=1.0,
                       delta=1e-6, unit="row", ledger=tmp_path / "d.dplr-ledger.json",
                       budget=(2.0, 1e-5))  # fmt: skip
    batch = {"entity": np.array([1]), "i": np.array([1]), "j": np.array([2]),
             "s": np.array([0.5])}  # fmt: skip
    write_batch(tmp_path / "b.npz", batch)
    stream.stream_ingest(state, tmp_path / "b.npz", epoch=1)
    for epoch in (1, 2):
        rel, _ = stream.stream_release(
            state, epoch=epoch, out=tmp_path / f"e{epoch}.zarr"
        )
        sig = rel.report["signal"]
        assert list(sig) == KEYS
        assert sig["of"] == 2
        assert sig["above"] == 0  # one update of 0.5 is far below any noise here
        assert sig["advice"]
        # a function of the released S and the epoch's public noise stds only
        manifest = stream.open_stream(state).manifest
        plan, mech = stream.plan_of(manifest), stream.mechanism_of(manifest)
        # the mechanism's (BLT's) std: ||L[epoch, :]|| times the calibrated sigma
        stds = {n: math.sqrt(mech.variance_factor(epoch)) * plan.lrf.sigma(n)
                for n in plan.names}  # fmt: skip
        level = noise_level(
            plan.lrf.params.algorithm, plan.lrf.oriented_shape, plan.lrf.t, stds
        )  # fmt: skip
        assert sig == signal_of(rel.S, level).to_dict()
        assert read_release(tmp_path / f"e{epoch}.zarr").report["signal"] == sig
