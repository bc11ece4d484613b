"""Nightly runs: idempotent, resumable after a SIGKILL at any step, serialised by a lock.

Each scenario copies one prepared stream (same stream id, same public seeds, noise
from a public seed so that releases can be compared byte for byte), kills
``dplr nightly`` with SIGKILL at a step boundary (``DPLR_CRASH_AT``), reruns it,
and compares every release with an undisturbed run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cli_util
import numpy as np
import pytest
import zarr
from cli_util import assert_one_line_error, run_dplr

from pipeline.io.batches import write_batch
from pipeline.io.stream_state import StreamStore

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("cli_cluster")

SHAPE = (200, 120)
DATES = ("2027-01-01", "2027-01-02", "2027-01-03")
JOB = """[stream]
state = "s.stream"
start_date = 2027-01-01
[input]
inbox = "inbox/{date}"
pattern = "*.parquet"
[output]
releases = "releases"
"""


def _nightly(root: Path, date: str, crash: str | None = None, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DASK_SCHEDULER_ADDRESS", "DPLR_CRASH_AT")}
    if cli_util.SHARED_SCHEDULER is not None:  # the session's cluster (tests/conftest.py)
        env["DASK_SCHEDULER_ADDRESS"] = cli_util.SHARED_SCHEDULER
    if crash:
        env["DPLR_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "nightly", "--config", str(root / "job.toml"), "--date", date, *extra],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nightly") / "job"
    root.mkdir()
    proc = run_dplr("stream", "init", root / "s.stream", "--rows", SHAPE[0], "--cols", SHAPE[1], "--rank", 3,
                    "--horizon", 8, "--epsilon", "1", "--delta", "1e-6", "--unit", "row",
                    "--ledger", root / "population.dplr-ledger.json", "--budget-epsilon", "1",
                    "--budget-delta", "1e-6", "--seed", 99, "--insecure-noise-seed", 7)
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(0)
    for d in DATES:
        (root / "inbox" / d).mkdir(parents=True)
        for k in range(2):
            i = rng.integers(0, SHAPE[0], 400)
            write_batch(root / "inbox" / d / f"b{k}.parquet",
                        {"entity": i, "i": i, "j": rng.integers(0, SHAPE[1], 400), "s": rng.normal(size=400) * 0.05})
    (root / "job.toml").write_text(JOB)
    return root


def _copy(prepared: Path, dest: Path) -> Path:
    # the manifest records the ledger's absolute path: keep the copy at the same
    # depth is not needed, releases only report it
    shutil.copytree(prepared, dest, symlinks=True)
    return dest


def _releases(root: Path) -> dict[str, dict[str, bytes]]:
    out = {}
    for d in DATES:
        g = zarr.open_group(str(root / "releases" / f"{d}.zarr"), mode="r")
        out[d] = {name: np.asarray(g[name][...]).tobytes() for name in ("U", "S", "V")}
        # "created" is the time the epoch was closed: the same for a crashed run and
        # its rerun, but not for an independent reference run
        out[d]["report"] = repr(sorted((k, v) for k, v in g.attrs["report"].items() if k != "created")).encode()
    return out


@pytest.fixture(scope="module")
def reference(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    root = _copy(prepared, tmp_path_factory.mktemp("ref") / "job")
    proc = _nightly(root, DATES[-1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("released ->") == 3
    return _releases(root)


def _ledger_records(prepared: Path) -> int:
    import json

    return len(json.loads((prepared / "population.dplr-ledger.json").read_text())["releases"])


@pytest.mark.parametrize(
    "crash",
    ["after-ingest", "after-ingest#3", "after-close", "after-noise#2", "during-write", "after-write",
     "after-record", "after-latest#2"],
)
def test_crash_at_each_step_then_rerun_gives_identical_releases(prepared, reference, tmp_path, crash):
    root = _copy(prepared, tmp_path / "job")
    proc = _nightly(root, DATES[-1], crash=crash)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    proc = _nightly(root, DATES[-1])
    assert proc.returncode == 0, proc.stderr
    assert _releases(root) == reference
    assert os.readlink(root / "releases" / "latest") == f"{DATES[-1]}.zarr"
    # the stream was charged once, at creation; no run charges anything
    assert _ledger_records(prepared) == 1
    state = StreamStore.open(root / "s.stream").manifest
    assert len(state["batches"]) == 2 * len(DATES)  # every batch applied exactly once
    # a publication killed half-way leaves nothing behind once the rerun is done
    assert [p.name for p in (root / "releases").iterdir() if p.name.startswith(".")] == []


def test_same_date_twice_changes_nothing(prepared, tmp_path):
    root = _copy(prepared, tmp_path / "job")
    assert _nightly(root, DATES[0]).returncode == 0
    before = {p: p.read_bytes() for p in sorted((root / "s.stream").rglob("*")) if p.is_file() and p.name != ".lock"}
    releases = _releases_for(root, DATES[0])
    proc = _nightly(root, DATES[0])
    assert proc.returncode == 0
    assert "already released" in proc.stdout
    after = {p: p.read_bytes() for p in sorted((root / "s.stream").rglob("*")) if p.is_file() and p.name != ".lock"}
    assert after == before
    assert _releases_for(root, DATES[0]) == releases


def _releases_for(root: Path, d: str) -> dict[str, bytes]:
    g = zarr.open_group(str(root / "releases" / f"{d}.zarr"), mode="r")
    return {name: np.asarray(g[name][...]).tobytes() for name in ("U", "S", "V")}


def test_a_second_concurrent_run_does_not_proceed(prepared, tmp_path):
    root = _copy(prepared, tmp_path / "job")
    store = StreamStore.open(root / "s.stream")
    with store.lock():  # another run holds the stream
        proc = _nightly(root, DATES[0])
    line = assert_one_line_error(proc, 75, "dplr: busy:")
    assert "lock" in line
    assert not (root / "releases" / f"{DATES[0]}.zarr").exists()
    # two runs started together: exactly one does the work, the other is refused or finds it done
    env = {k: v for k, v in os.environ.items() if k != "DPLR_CRASH_AT"}
    cmd = [sys.executable, "-m", "pipeline", "nightly", "--config", str(root / "job.toml"), "--date", DATES[1]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes in ([0, 0], [0, 75]), results
    assert sum("released ->" in r[1] for r in results) == 1, results
    assert len(StreamStore.open(root / "s.stream").manifest["batches"]) == 4


def test_dry_run_reads_and_writes_nothing(prepared, tmp_path):
    root = _copy(prepared, tmp_path / "job")
    before = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    proc = _nightly(root, DATES[1], extra=("--dry-run",))
    assert proc.returncode == 0, proc.stderr
    assert "2027-01-01 epoch 1/8: to release, 2 batch file(s)" in proc.stdout
    assert "2027-01-02 epoch 2/8" in proc.stdout
    after = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    assert after == before
    assert not (root / "releases").exists()


def test_exit_codes_of_bad_jobs(prepared, tmp_path):
    root = _copy(prepared, tmp_path / "job")
    assert_one_line_error(_nightly(root, "2027-01-10"), 3, "dplr: refused:")  # beyond the horizon
    assert_one_line_error(_nightly(root, "2026-12-31"), 2, "dplr: error:")  # before the start
    assert_one_line_error(_nightly(root, "2027-13-01"), 2, "dplr: error:")  # not a date
    shutil.rmtree(root / "inbox" / DATES[0])
    line = assert_one_line_error(_nightly(root, DATES[0]), 2, "dplr: error:")
    assert "inbox" in line
    assert not (root / "releases" / f"{DATES[0]}.zarr").exists()
    (root / "job.toml").write_text(JOB + "[extra]\nkey = 1\n")
    assert "unknown section" in assert_one_line_error(_nightly(root, DATES[0]), 2, "dplr: error:")
