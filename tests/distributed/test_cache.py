"""The row bands held in worker memory between passes (``cache=``), on a real
LocalCluster of worker processes.

Every chunk read of the store leaves a marker file (``SlowStore``), so the
tests count what each release read: with the cache the store is read once,
without it once per pass. The release is bit for bit the same either way (the
passes run the same computation on the same bytes); a worker killed while it
holds bands costs their re-read from the store (dask's lineage) and changes
nothing in the release; when the job ends no band is left on the cluster.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dist_util import seeded_matrix, wait_for_replacement, write_matrix
from distributed import Client, LocalCluster, futures_of
from test_fault_tolerance import SlowStore

import pipeline.execution.pca as pca_module
import pipeline.execution.source as source_module
from pipeline.api import factorize, pca
from pipeline.errors import InvalidParameterError
from pipeline.execution import DaskSource

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
ROWS_PER_CHUNK = 10
N_CHUNKS = M // ROWS_PER_CHUNK  # 40
SKETCH_SEED, NOISE_SEED = 20240611, 7
BUDGET = (10.0, 1e-4)
LRF = {"epsilon": 1.0, "delta": 1e-6, "algorithm": "two-pass", "seed": SKETCH_SEED,
       "insecure_noise_seed": NOISE_SEED, "budget": BUDGET}  # fmt: skip
T = 3
PCA = {"epsilon": 1.0, "delta": 1e-6, "method": "power", "iterations": T,
       "clip_radius": 0.05, "insecure_noise_seed": NOISE_SEED, "budget": BUDGET}  # fmt: skip
#: Every graph layer of a job is named ``dplr-<label>-<hex>``; its input's
#: chunks ``zarr-<token>`` (a Zarr input) or ``from-zarr-<token>`` (a dask one).
JOB_KEYS = ("dplr-", "zarr-")


@pytest.fixture
def one_chunk_per_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """One store chunk per band: each band held is a copy of the chunk the
    direct read decoded into the thread's buffer (which the next read reuses)."""
    monkeypatch.setattr(source_module, "BAND_BYTES", 1)


def _store(tmp_path: Path, name: str, seed: int) -> tuple[str, Path]:
    path = write_matrix(
        tmp_path / f"{name}.zarr", seeded_matrix(seed, M, N), (ROWS_PER_CHUNK, N)
    )
    marks = tmp_path / f"{name}-marks"
    marks.mkdir()
    return path, marks


def _counted(path: str, marks: Path) -> zarr.Array:
    """The store opened so that every chunk read leaves a marker in ``marks``."""
    return zarr.open_array(store=SlowStore(path, marks=str(marks)), mode="r")


def _reads(marks: Path) -> int:
    n = len(os.listdir(marks))
    for f in os.listdir(marks):
        os.remove(marks / f)
    return n


def _job_keys(address: str) -> list[str]:
    """Keys of a job (held bands among them) that the scheduler still knows or
    a worker still holds, seen from a second client (not the job's)."""
    with Client(address, set_as_default=False) as other:
        on_scheduler = other.run_on_scheduler(
            lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks]
        )
        on_workers = other.run(lambda dask_worker: [str(k) for k in dask_worker.data])
    keys = [*on_scheduler, *(k for ks in on_workers.values() for k in ks)]
    return [k for k in keys if any(p in k for p in JOB_KEYS)]


def _nothing_left(address: str, timeout: float = 20.0) -> list[str]:
    """Wait until no key of a job is left on the cluster (releases are
    asynchronous); the keys still there after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (left := _job_keys(address)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


@pytest.mark.usefixtures("one_chunk_per_band")
@pytest.mark.timeout(180)
def test_two_pass_release_reads_once_and_is_the_same_with_the_cache(
    client: Client, cluster: LocalCluster, tmp_path: Path, global_seed: int
) -> None:
    path, marks = _store(tmp_path, "A", global_seed)
    ledger = tmp_path / "ledger.json"
    runs = {}
    for mode in ("never", "always", "auto"):
        f = factorize(
            _counted(path, marks), RANK, out=tmp_path / f"{mode}.zarr",
            ledger=ledger, cache=mode, **LRF,
        )  # fmt: skip
        runs[mode] = (f, _reads(marks))
        assert f.report["n_passes"] == 2  # a pass from memory is still a pass
        assert _nothing_left(cluster.scheduler_address) == []
    never, always, auto = (runs[m][0] for m in ("never", "always", "auto"))
    # the store read once per pass without the cache, once with it
    assert runs["never"][1] == 2 * N_CHUNKS
    assert runs["always"][1] == runs["auto"][1] == N_CHUNKS
    assert never.report["cluster"]["cache"]["used"] is False
    plan = always.report["cluster"]["cache"]
    assert plan["used"] is True
    assert plan["n_bands"] == N_CHUNKS
    assert plan["band_bytes"] == M * N * 8  # float64 store: shape x item size
    assert auto.report["cluster"]["cache"]["used"] is True  # 480 kB fit
    for f in (always, auto):
        np.testing.assert_array_equal(np.asarray(f.S), np.asarray(never.S))
        np.testing.assert_array_equal(np.asarray(f.U), np.asarray(never.U))
        np.testing.assert_array_equal(np.asarray(f.V), np.asarray(never.V))
    assert len(_records(ledger)) == 3


@pytest.mark.timeout(180)
def test_power_pca_reads_once_and_is_the_same_with_the_cache(
    client: Client,
    cluster: LocalCluster,
    tmp_path: Path,
    global_seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dask array of the store's chunks, one band per chunk."""
    monkeypatch.setattr(pca_module, "BAND_BYTES", 1)
    path, marks = _store(tmp_path, "A", global_seed)
    ledger = tmp_path / "ledger.json"
    runs = {}
    for mode in ("never", "always"):
        A = da.from_zarr(_counted(path, marks), chunks=(ROWS_PER_CHUNK, N))
        r = pca(A, RANK, ledger=ledger, cache=mode, **PCA)
        runs[mode] = (r, _reads(marks))
        assert r.report["n_passes"] == 1 + T
        assert _nothing_left(cluster.scheduler_address) == []
    (never, n_never), (always, n_always) = runs["never"], runs["always"]
    assert n_never == (1 + T) * N_CHUNKS
    assert n_always == N_CHUNKS
    assert never.report["cluster"]["cache"]["used"] is False
    assert always.report["cluster"]["cache"]["used"] is True
    assert always.report["cluster"]["n_row_bands"] == N_CHUNKS
    np.testing.assert_array_equal(always.components, never.components)
    np.testing.assert_array_equal(always.eigenvalues, never.eigenvalues)


@pytest.mark.usefixtures("one_chunk_per_band")
@pytest.mark.timeout(240)
def test_worker_killed_while_holding_bands_gives_the_same_release_charged_once(
    client: Client,
    cluster: LocalCluster,
    tmp_path: Path,
    global_seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, marks = _store(tmp_path, "A", global_seed)
    calm = factorize(_counted(path, marks), RANK, out=tmp_path / "calm.zarr",
                     ledger=tmp_path / "calm.json", cache="never", **LRF)  # fmt: skip
    assert _reads(marks) == 2 * N_CHUNKS

    sketch = DaskSource.sketch
    killed: dict[str, Any] = {}

    def kill_before_pass_2(src: DaskSource, request: Any) -> Any:
        if src.n_passes == 1:  # pass 1 is done: its bands are held
            assert src._held is not None
            where = client.who_has(futures_of(src._held))
            holders = {w for ws in where.values() for w in ws}
            pids = client.run(os.getpid)
            victim = min(holders)
            killed["bands"] = sum(victim in ws for ws in where.values())
            killed["reads_before"] = len(os.listdir(marks))
            # negative control of the check below: the held bands are seen
            seen = _job_keys(cluster.scheduler_address)
            killed["seen"] = len({k for k in seen if k.startswith("('dplr-band-")})
            os.kill(pids[victim], signal.SIGKILL)  # a hard crash, like the OOM killer
            killed["pid"] = pids[victim]
            wait_for_replacement(client, pids[victim], 2)
        return sketch(src, request)

    monkeypatch.setattr(DaskSource, "sketch", kill_before_pass_2)
    ledger = tmp_path / "hit.json"
    hit = factorize(_counted(path, marks), RANK, out=tmp_path / "hit.zarr",
                    ledger=ledger, cache="always", **LRF)  # fmt: skip
    reads = _reads(marks)

    # the kill landed between the passes, on a worker holding bands; the
    # bands it held were read again from the store, the others were not
    assert killed["reads_before"] == N_CHUNKS
    assert killed["seen"] == N_CHUNKS
    assert 1 <= killed["bands"] < N_CHUNKS
    assert N_CHUNKS < reads < 2 * N_CHUNKS
    assert killed["pid"] not in client.run(os.getpid).values()
    # bit for bit the undisturbed release, charged once
    assert hit.report["n_passes"] == calm.report["n_passes"] == 2
    np.testing.assert_array_equal(np.asarray(hit.S), np.asarray(calm.S))
    np.testing.assert_array_equal(np.asarray(hit.U), np.asarray(calm.U))
    np.testing.assert_array_equal(np.asarray(hit.V), np.asarray(calm.V))
    (record,) = _records(ledger)
    assert record["release_id"] == hit.report["release_id"]
    # the job ended: no band (no key of the job) is left on the scheduler or
    # any worker
    assert _nothing_left(cluster.scheduler_address) == []


@pytest.mark.timeout(180)
def test_bands_that_cannot_fit_are_refused_before_any_read_or_read_per_pass(
    tmp_path: Path, global_seed: int
) -> None:
    """Workers stating a 512 KiB memory limit (their memory manager off, so the
    limit is a stated number only): the 480 kB band does not fit in half of it."""
    path, marks = _store(tmp_path, "A", global_seed)
    ledger = tmp_path / "ledger.json"
    off = {f"distributed.worker.memory.{k}": False
           for k in ("target", "spill", "pause", "terminate")}  # fmt: skip
    with (
        dask.config.set(off),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, memory_limit="512KiB",
            dashboard_address=":0", silence_logs=logging.ERROR,
        ) as small,
    ):  # fmt: skip
        where = {"scheduler": small.scheduler_address, "ledger": ledger}
        with pytest.raises(InvalidParameterError, match="cache='always' cannot hold"):
            factorize(_counted(path, marks), RANK, cache="always", **where, **LRF)
        assert _reads(marks) == 0
        assert not ledger.exists() or _records(ledger) == []
        # auto: the out-of-core path, every pass reads the store
        f = factorize(_counted(path, marks), RANK, cache="auto", **where, **LRF)
        assert _reads(marks) == 2 * N_CHUNKS
        plan = f.report["cluster"]["cache"]
        assert plan["used"] is False
        assert plan["budget_bytes"] == 2**18
        assert "above 0.5 of the smallest worker memory limit" in plan["reason"]
