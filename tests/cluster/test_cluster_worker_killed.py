"""A ``dask worker`` process SIGKILLed in the middle of a pass of ``dplr factorize`` (one
pass, and the second pass of ``--algorithm two-pass``) and
``dplr pca`` run with ``--scheduler`` against a real ``dask scheduler`` and two
``dask worker`` processes on loopback.

The workers preload ``slow_reads.py``: chunk reads of ``*slow.zarr`` stores take
0.1 s and leave a marker, so the test sees the pass in progress and kills a worker
after a quarter of its chunk reads. The worker's Nanny restarts it, the scheduler
recomputes the lost tasks, and the release must equal the undisturbed release of
the same command (same sketch seed, same insecure noise seed) bit for bit, with one
ledger record each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from cluster_util import clean_env, dask_processes
from distributed import Client

from pipeline.io import read_group

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
N_CHUNKS = 40
KILL_AFTER = 10  # chunk reads seen before the kill


@pytest.fixture(scope="module")
def slow_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("slow-dask")
    marks, noise_marks = tmp / "marks", tmp / "noise-marks"
    marks.mkdir()
    noise_marks.mkdir()
    env = {"DPLR_SLOW_READ_MARKS": str(marks), "DPLR_SLOW_NOISE_MARKS": str(noise_marks),
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    with dask_processes(tmp, n_workers=2, preload=HERE / "slow_reads.py", env=env) as info:
        yield info | {"marks": str(marks), "noise_marks": str(noise_marks)}


def _store(path: Path, kind: str) -> Path:
    rng = np.random.default_rng(17)
    n = 16 if kind == "pca" else 60
    A = rng.standard_normal((N_CHUNKS * 10, n)) / np.sqrt(n)
    A /= np.maximum(1.0, np.linalg.norm(A, axis=1, keepdims=True))  # rows of norm <= 1
    z = zarr.create_array(str(path), shape=A.shape, chunks=(10, n), dtype="f8")
    z[...] = A
    return path


def _command(kind: str, store: Path, out: Path, ledger: Path, address: str) -> list[str]:
    common = ["--epsilon", "1", "--delta", "1e-6", "--budget-epsilon", "10", "--budget-delta", "1e-4",
              "--ledger", str(ledger), "--out", str(out), "--scheduler", address, "--insecure-noise-seed", "5"]
    if kind in ("factorize", "two-pass"):
        # "factorize": the one-pass path (Spectral-LRF, sparse S); the default
        # private algorithm is two-pass, which its own case runs
        algorithm = ["--algorithm", "two-pass" if kind == "two-pass" else "spectral"]
        if kind == "two-pass":
            # the kill follows the second pass's reads of the store: without the
            # cache (tests/distributed/test_cache.py kills a worker holding bands)
            algorithm += ["--cache", "never"]
        return [sys.executable, "-m", "pipeline", "factorize", str(store), "--rank", "3", "--seed", "3",
                *algorithm, *common]
    return [sys.executable, "-m", "pipeline", "pca", str(store), "--rank", "2", "--iterations", "2",
            "--clip-radius", "0.3", *common]


def _names(kind: str) -> tuple[str, ...]:
    return ("components", "eigenvalues") if kind == "pca" else ("U", "S", "V")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["factorize", "two-pass", "pca"])
def test_worker_sigkilled_mid_pass_gives_the_undisturbed_release(
    slow_cluster: dict[str, str], tmp_path: Path, kind: str
) -> None:
    store = _store(tmp_path / "slow.zarr", kind)
    marks = Path(slow_cluster["marks"])
    address = slow_cluster["address"]
    ref = subprocess.run(_command(kind, store, tmp_path / "ref.zarr", tmp_path / "ref.json", address),
                         capture_output=True, text=True, env=clean_env(), timeout=240, check=False)
    assert ref.returncode == 0, ref.stderr
    assert len(os.listdir(marks)) >= N_CHUNKS  # the preload is active: reads were slow
    for m in os.listdir(marks):
        os.unlink(marks / m)
    with Client(address, timeout=30) as client:
        pids = client.run(os.getpid)
        proc = subprocess.Popen(_command(kind, store, tmp_path / "killed.zarr", tmp_path / "killed.json", address),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        deadline = time.monotonic() + 120
        # two-pass: the kill lands in the second pass (the first read every chunk once)
        skip = N_CHUNKS if kind == "two-pass" else 0
        while len(os.listdir(marks)) < skip + KILL_AFTER:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        victim = min(pids.values())
        reads_at_kill, running_at_kill = len(os.listdir(marks)), proc.poll() is None
        os.kill(victim, signal.SIGKILL)  # the worker, not its Nanny: the Nanny restarts it
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        # the kill landed inside the (first or second) pass: the command was running
        # and had read some, not all, of the chunks that pass reads once each
        assert running_at_kill
        assert skip + KILL_AFTER <= reads_at_kill < skip + N_CHUNKS, reads_at_kill
        assert len(os.listdir(marks)) >= skip + N_CHUNKS  # and the pass was finished after it
        client.wait_for_workers(2, timeout=60)
        assert victim not in client.run(os.getpid).values()  # a new worker process took over
    one, _ = read_group(tmp_path / "ref.zarr", _names(kind))
    two, report = read_group(tmp_path / "killed.zarr", _names(kind))
    for name in _names(kind):
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    for ledger in ("ref.json", "killed.json"):
        assert len(json.loads((tmp_path / ledger).read_text())["releases"]) == 1
    assert report["private"] is False  # the insecure noise seed says so


@pytest.mark.timeout(300)
def test_worker_sigkilled_while_it_adds_the_noise_gives_the_undisturbed_release(
    slow_cluster: dict[str, str], tmp_path: Path
) -> None:
    """After the charge, the task that adds the range sketch's noise (and forms its
    Gram matrix) is killed with its worker. The scheduler runs it again elsewhere:
    the noise comes from the same key, so the release is the undisturbed one bit
    for bit, charged once."""
    store = _store(tmp_path / "slow.zarr", "factorize")
    noise_marks = Path(slow_cluster["noise_marks"])
    address = slow_cluster["address"]
    for m in os.listdir(noise_marks):
        os.unlink(noise_marks / m)
    ref = subprocess.run(_command("factorize", store, tmp_path / "ref.zarr", tmp_path / "ref.json", address),
                         capture_output=True, text=True, env=clean_env(), timeout=240, check=False)
    assert ref.returncode == 0, ref.stderr
    n_tasks = len(os.listdir(noise_marks))
    assert n_tasks >= 1  # the preload is active: the noise step was slowed and seen
    for m in os.listdir(noise_marks):
        os.unlink(noise_marks / m)
    with Client(address, timeout=30) as client:
        pids = set(client.run(os.getpid).values())
        proc = subprocess.Popen(_command("factorize", store, tmp_path / "killed.zarr", tmp_path / "killed.json", address),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        deadline = time.monotonic() + 120
        while not os.listdir(noise_marks):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (first,) = os.listdir(noise_marks)[:1]
        victim = int(first.split("-")[0])
        # the fault lands where it says: in a worker, inside the noise step, after the
        # charge (the ledger already holds the release) and before publication
        assert victim in pids
        assert proc.poll() is None
        assert len(json.loads((tmp_path / "killed.json").read_text())["releases"]) == 1
        assert not (tmp_path / "killed.zarr").exists()
        os.kill(victim, signal.SIGKILL)
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        # the killed task ran again: more noise tasks started than the step has
        assert len(os.listdir(noise_marks)) > n_tasks
        client.wait_for_workers(2, timeout=60)
        assert victim not in client.run(os.getpid).values()
    one, _ = read_group(tmp_path / "ref.zarr", _names("factorize"))
    two, _ = read_group(tmp_path / "killed.zarr", _names("factorize"))
    for name in _names("factorize"):
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    assert len(json.loads((tmp_path / "killed.json").read_text())["releases"]) == 1
