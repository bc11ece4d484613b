"""``dplr stream`` as a subprocess: the happy path, linearity against ``dplr factorize``, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from cli_util import assert_one_line_error, run_dplr, run_in_process

from pipeline.io.batches import write_batch
from pipeline.io.release import read_release

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("cli_cluster")
from pipeline.jobs.stream import open_stream, stream_init

SHAPE = (240, 160)
SEED = 4242
SENTINEL = 123456.789  # a value planted in bad batches: it must never be echoed


def _batch(path: Path, n: int, seed: int, *, entity=None, **override) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, SHAPE[0], n)
    cols = {"entity": i if entity is None else entity, "i": i, "j": rng.integers(0, SHAPE[1], n),
            "s": rng.normal(size=n) * 0.05}
    cols.update(override)
    write_batch(path, cols)
    return cols


def _state_bytes(state: Path) -> dict[str, bytes]:
    return {str(p.relative_to(state)): p.read_bytes() for p in sorted(state.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    """A new private stream, created through the API (the CLI's init is tested below)."""
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=3, horizon=4, epsilon=1.0,
                delta=1e-6, unit="row", ledger=tmp_path / "population.dplr-ledger.json", budget=(1.0, 1e-6))
    return state


def test_init_ingest_release_status(tmp_path: Path):
    stream = tmp_path / "s.stream"
    ledger_path = tmp_path / "population.dplr-ledger.json"
    proc = run_dplr("stream", "init", stream, "--rows", SHAPE[0], "--cols", SHAPE[1], "--rank", 3,
                    "--horizon", 4, "--epsilon", "1", "--delta", "1e-6", "--unit", "row",
                    "--ledger", ledger_path, "--budget-epsilon", "1", "--budget-delta", "1e-6")
    assert proc.returncode == 0, proc.stderr
    assert f"charged to the ledger {ledger_path}" in proc.stdout
    assert "4 epochs" in proc.stdout
    assert "blt mechanism" in proc.stdout  # the default
    assert oct(stream.stat().st_mode & 0o777) == "0o700"
    assert oct((stream / "secrets.json").stat().st_mode & 0o777) == "0o600"
    _batch(tmp_path / "b1.parquet", 500, 1)
    proc = run_dplr("stream", "ingest", stream, tmp_path / "b1.parquet", "--epoch", 1)
    assert proc.returncode == 0, proc.stderr
    assert "applied b1.parquet to epoch 1" in proc.stdout
    proc = run_dplr("stream", "release", stream, "--epoch", 2, "--out", tmp_path / "r2.zarr")
    assert proc.returncode == 0, proc.stderr
    assert "epoch 2 released" in proc.stdout
    assert "whole stream" in proc.stdout
    rep = read_release(tmp_path / "r2.zarr").report
    assert rep["private"] is True
    assert rep["stream"]["mechanism"] == "blt"
    assert "tree_nodes" not in rep["stream"]
    assert rep["calibration"]["tree_levels"] == 1  # R X is one Gaussian mechanism
    status = json.loads(run_dplr("stream", "status", stream).stdout)
    assert status["mechanism"] == "blt"
    assert status["noise_factor"] == rep["stream"]["noise_factor"]
    assert status["predicted_error"] == rep["stream"]["predicted_error"]
    assert status["predicted_error"] == rep["signal"]["noise_level"]
    assert status["last_closed"] == 2
    assert status["released"] == [2]
    assert status["ledger"] == str(ledger_path)
    assert rep["ledger"]["path"] == str(ledger_path)
    ledger = json.loads(ledger_path.read_text())
    assert len(ledger["releases"]) == 1  # the stream was charged once, at init


def test_init_takes_the_tree_as_a_comparison_mechanism(tmp_path: Path):
    state, ledger_path = tmp_path / "t.stream", tmp_path / "t.dplr-ledger.json"
    proc = run_dplr("stream", "init", state, "--rows", SHAPE[0], "--cols", SHAPE[1], "--rank", 3,
                    "--horizon", 4, "--epsilon", "1", "--delta", "1e-6", "--unit", "row",
                    "--mechanism", "tree", "--ledger", ledger_path, "--budget-epsilon", "1",
                    "--budget-delta", "1e-6")
    assert proc.returncode == 0, proc.stderr
    assert "tree mechanism (3 tree levels)" in proc.stdout
    proc = run_dplr("stream", "release", state, "--epoch", 3, "--out", tmp_path / "r3.zarr")
    assert proc.returncode == 0, proc.stderr
    assert "tree mechanism, noise factor 2.449" in proc.stdout  # sqrt(L popcount(3)) = sqrt(6)
    rep = read_release(tmp_path / "r3.zarr").report
    assert rep["stream"]["tree_nodes"] == [[0, 3], [1, 1]]
    assert rep["calibration"]["tree_levels"] == 3
    status = json.loads(run_dplr("stream", "status", state).stdout)
    assert (status["mechanism"], status["noise_factor"]) == ("tree", rep["stream"]["noise_factor"])


def test_stream_equals_one_shot_factorize_without_noise(tmp_path: Path):
    """Linearity end to end: stream of B1..B3 == dplr factorize --non-private of B1+B2+B3."""
    state = tmp_path / "lin.stream"
    assert run_dplr("stream", "init", state, "--rows", SHAPE[0], "--cols", SHAPE[1], "--rank", 3,
                    "--horizon", 8, "--non-private", "--seed", SEED).returncode == 0
    A = np.zeros(SHAPE)
    for k, epoch in ((0, 1), (1, 1), (2, 3)):
        cols = _batch(tmp_path / f"b{k}.npz", 4000, 10 + k)
        np.add.at(A, (cols["i"], cols["j"]), cols["s"])
        assert run_dplr("stream", "ingest", state, tmp_path / f"b{k}.npz", "--epoch", epoch).returncode == 0
    assert run_dplr("stream", "release", state, "--epoch", 3, "--out", tmp_path / "s.zarr").returncode == 0
    zarr.create_array(str(tmp_path / "A.zarr"), data=A, chunks=(64, SHAPE[1]))
    proc = run_dplr("factorize", tmp_path / "A.zarr", "--rank", 3, "--non-private", "--seed", SEED,
                    "--out", tmp_path / "f.zarr", "--quiet")
    assert proc.returncode == 0, proc.stderr
    s, f = read_release(tmp_path / "s.zarr"), read_release(tmp_path / "f.zarr")
    np.testing.assert_allclose(s.S, f.S, rtol=1e-10)
    np.testing.assert_allclose(s.U, f.U, atol=1e-10)
    np.testing.assert_allclose(s.V, f.V, atol=1e-10)
    assert s.report["note"].endswith("NOT PRIVATE")


@pytest.mark.parametrize(
    ("case", "override", "message"),
    [
        ("row out of range", {"i": np.array([0, SHAPE[0]])}, "column 'i' must lie in"),
        ("negative column", {"j": np.array([-1, 3])}, "column 'j' must lie in"),
    ],
)
def test_bad_batches_change_nothing(stream: Path, tmp_path: Path, capsys, case, override, message):
    cols = {"entity": np.array([1, 2]), "i": np.array([1, 2]), "j": np.array([3, 4]), "s": np.array([SENTINEL, 0.5])}
    cols.update(override)
    write_batch(tmp_path / "bad.npz", cols)
    before = _state_bytes(stream)
    # the first case as the command a user types, the others in process (same
    # parsing, exit code and stderr line; no interpreter start)
    run = run_dplr if case == "row out of range" else (lambda *a: run_in_process(capsys, *a))
    proc = run("stream", "ingest", stream, tmp_path / "bad.npz", "--epoch", 1)
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert message in line, case
    assert "123456" not in line, case
    assert _state_bytes(stream) == before


def test_missing_parquet_and_csv_columns(stream: Path, tmp_path: Path, capsys):
    (tmp_path / "bad.csv").write_text("entity,i,s\n1,2,123456.789\n")
    proc = run_dplr("stream", "ingest", stream, tmp_path / "bad.csv", "--epoch", 1)
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert "'j'" in line
    assert "123456" not in line
    write_batch(tmp_path / "bad.parquet", {"entity": np.array([1]), "i": np.array([1]), "s": np.array([SENTINEL])})
    line = assert_one_line_error(run_in_process(capsys, "stream", "ingest", stream, tmp_path / "bad.parquet", "--epoch", 1), 2, "dplr: error:")
    assert "'j'" in line
    assert "123456" not in line


def test_epoch_rules_and_duplicates(stream: Path, tmp_path: Path, capsys):
    def in_process(*args):  # a refusal of a kind already run as a subprocess
        return run_in_process(capsys, *args)

    _batch(tmp_path / "b.parquet", 50, 3)
    assert run_dplr("stream", "ingest", stream, tmp_path / "b.parquet", "--epoch", 1).returncode == 0
    # the same content again (even in another format) is a replay: refused
    _batch(tmp_path / "same.npz", 50, 3)
    line = assert_one_line_error(run_dplr("stream", "ingest", stream, tmp_path / "same.npz", "--epoch", 2), 2, "dplr: error:")
    assert "already ingested into epoch 1" in line
    assert run_dplr("stream", "release", stream, "--epoch", 1, "--out", tmp_path / "r1.zarr").returncode == 0
    _batch(tmp_path / "late.parquet", 50, 4)
    line = assert_one_line_error(in_process("stream", "ingest", stream, tmp_path / "late.parquet", "--epoch", 1), 2, "dplr: error:")
    assert "already closed" in line
    line = assert_one_line_error(run_dplr("stream", "ingest", stream, tmp_path / "late.parquet", "--epoch", 5), 3, "dplr: refused:")
    assert "horizon of 4" in line
    line = assert_one_line_error(in_process("stream", "release", stream, "--epoch", 5, "--out", tmp_path / "r5.zarr"), 3, "dplr: refused:")
    # a release of an epoch already published elsewhere is refused; the same OUT is a no-op
    line = assert_one_line_error(in_process("stream", "release", stream, "--epoch", 1, "--out", tmp_path / "x.zarr"), 2, "dplr: error:")
    assert "already released" in line
    proc = run_dplr("stream", "release", stream, "--epoch", 1, "--out", tmp_path / "r1.zarr")
    assert proc.returncode == 0
    assert "already released" in proc.stdout


def test_unit_violation_and_entity_kind(stream: Path, tmp_path: Path, capsys):
    _batch(tmp_path / "two_rows.npz", 2, 5, entity=np.array([7, 7]), i=np.array([0, 1]))
    line = assert_one_line_error(run_dplr("stream", "ingest", stream, tmp_path / "two_rows.npz", "--epoch", 1), 2, "dplr: error:")
    assert "privacy unit 'row'" in line
    _batch(tmp_path / "ints.npz", 2, 6, entity=np.array([1, 2]), i=np.array([1, 2]))
    assert run_dplr("stream", "ingest", stream, tmp_path / "ints.npz", "--epoch", 1).returncode == 0
    (tmp_path / "strs.csv").write_text("entity,i,j,s\nalice,3,4,0.1\n")
    line = assert_one_line_error(run_in_process(capsys, "stream", "ingest", stream, tmp_path / "strs.csv", "--epoch", 1), 2, "dplr: error:")
    assert "kind" in line


def test_state_of_another_version_and_not_a_state(stream: Path, tmp_path: Path, capsys):
    meta = stream / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["dplr_stream"]["format"] = "dplr-stream/0"
    meta.write_text(json.dumps(doc))
    line = assert_one_line_error(run_dplr("stream", "status", stream), 2, "dplr: error:")
    assert "dplr-stream/0" in line
    assert "'dplr-stream/1' and 'dplr-stream/2'" in line  # the formats this version reads
    line = assert_one_line_error(run_in_process(capsys, "stream", "status", tmp_path), 2, "dplr: error:")
    assert "not a dplr stream state" in line


def test_a_format_1_state_with_string_ids_refuses_more_in_one_line(stream: Path, tmp_path: Path, capsys):
    """States of the earlier format hashed string ids (two could share a key): no more of them."""
    st = open_stream(stream)
    with st.lock():
        st.commit(changes={"format": "dplr-stream/1", "entity_kind": "str"})
    before = _state_bytes(stream)
    (tmp_path / "strs.csv").write_text("entity,i,j,s\nalice,3,4,0.1\n")
    line = assert_one_line_error(run_in_process(capsys, "stream", "ingest", stream, tmp_path / "strs.csv", "--epoch", 1), 2, "dplr: error:")
    assert "create a new stream" in line
    assert "alice" not in line
    assert _state_bytes(stream) == before
    assert run_in_process(capsys, "stream", "status", stream).returncode == 0  # it still opens


def test_init_refuses_existing_state_and_bad_parameters(stream: Path, tmp_path: Path, capsys):
    line = assert_one_line_error(
        run_dplr("stream", "init", stream, "--rows", 10, "--cols", 10, "--rank", 2, "--horizon", 4,
                 "--epsilon", "1", "--delta", "1e-6"), 2, "dplr: error:")
    assert "already exists" in line
    for args, text in (
        (("--horizon", 0, "--epsilon", "1", "--delta", "1e-6"), "horizon"),
        (("--horizon", 4, "--epsilon", "-1", "--delta", "1e-6"), "epsilon"),
        (("--horizon", 4), "epsilon"),
    ):
        proc = run_in_process(capsys, "stream", "init", tmp_path / "new.stream", "--rows", 50, "--cols", 40, "--rank", 2, *args)
        assert text in assert_one_line_error(proc, 2, "dplr: error:")
        assert not os.path.exists(tmp_path / "new.stream")
