"""A worker process killed in the middle of the pass (ecosystem.md section 4).

The Nanny restarts the worker, the scheduler recomputes the lost tasks from the
lineage, and because every random block (sketch operator, noise tile) is a pure
function of its key and the reduction trees have a fixed shape, the release is
bit-for-bit the undisturbed one. The ledger is charged once per completed
release, never per attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr
from dist_util import seeded_matrix, write_matrix
from distributed import Client
from zarr.storage import LocalStore

from pipeline.api import factorize
from pipeline.io import read_release

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
ROWS_PER_CHUNK = 10  # 40 chunks
N_CHUNKS = M // ROWS_PER_CHUNK
READ_DELAY = 0.1  # seconds per chunk read (SlowStore): a pass of ~2 s on 2 workers
KILL_AFTER = 10  # chunk reads completed before the kill (of N_CHUNKS)


class SlowStore(LocalStore):
    """A LocalStore whose chunk reads are slow and leave one marker file each.

    The marker directory is a counter shared by the test process and the worker
    processes. Pickled by reference into the task graph: the Nanny-spawned workers
    inherit this directory on ``sys.path``.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        delay: float = 0.0,
        marks: str = "",
        read_only: bool = True,
    ) -> None:
        super().__init__(root, read_only=read_only)
        self.delay = delay
        self.marks = marks

    def with_read_only(self, read_only: bool = False) -> SlowStore:
        return type(self)(
            self.root, delay=self.delay, marks=self.marks, read_only=read_only
        )

    async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def]
        value = await super().get(key, prototype, byte_range)
        if key.startswith("c/"):
            await asyncio.sleep(self.delay)
            if self.marks:
                Path(self.marks, f"{key.replace('/', '_')}-{uuid.uuid4().hex}").touch()
        return value


def _n_reads(marks: Path) -> int:
    return len(os.listdir(marks))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("algorithm", ["spectral", "low-space"])
def test_worker_killed_mid_pass_gives_the_undisturbed_release(
    client: Client, tmp_path: Path, global_seed: int, algorithm: str
) -> None:
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (ROWS_PER_CHUNK, N)
    )
    ledger = tmp_path / "A.dplr-ledger.json"
    common = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "algorithm": algorithm,
        "seed": 1234,
        "insecure_noise_seed": 99,
        "ledger": ledger,
        "budget": (10.0, 1e-4),
    }

    quiet = zarr.open_array(store=SlowStore(path), mode="r")
    calm = factorize(quiet, RANK, out=tmp_path / "calm.zarr", **common)
    assert calm.report["input"]["n_chunks"] == [N_CHUNKS, 1]

    marks = tmp_path / "marks"
    marks.mkdir()
    slow = zarr.open_array(
        store=SlowStore(path, delay=READ_DELAY, marks=str(marks)), mode="r"
    )
    pids = client.run(os.getpid)
    victim = min(pids)
    killed: dict[str, int] = {}

    def kill_mid_pass() -> None:
        deadline = time.monotonic() + 60
        while _n_reads(marks) < KILL_AFTER and time.monotonic() < deadline:
            time.sleep(0.01)
        killed["reads_before"] = _n_reads(marks)
        os.kill(pids[victim], signal.SIGKILL)  # a hard crash, like the OOM killer
        killed["reads_after"] = _n_reads(marks)

    killer = threading.Thread(target=kill_mid_pass, daemon=True)
    killer.start()
    hit = factorize(slow, RANK, out=tmp_path / "hit.zarr", **common)
    killer.join(timeout=60)

    # the kill landed inside the pass: some, not all, chunks had been read
    assert "reads_before" in killed, "the worker was never killed"
    assert KILL_AFTER <= killed["reads_before"] < N_CHUNKS
    assert killed["reads_after"] < N_CHUNKS
    assert _n_reads(marks) >= N_CHUNKS
    # the Nanny restarted the worker: a new process under a new address
    client.wait_for_workers(2, timeout=60)
    assert pids[victim] not in client.run(os.getpid).values()

    a, b = read_release(tmp_path / "calm.zarr"), read_release(tmp_path / "hit.zarr")
    assert b.report["release_id"] == hit.report["release_id"]
    assert b.report["n_passes"] == a.report["n_passes"] == 1  # retries are not passes
    np.testing.assert_array_equal(b.S, a.S)
    np.testing.assert_array_equal(b.U, a.U)
    np.testing.assert_array_equal(b.V, a.V)

    records = json.loads(ledger.read_text())["releases"]
    assert [r["release_id"] for r in records] == [
        a.report["release_id"],
        b.report["release_id"],
    ]
    assert b.report["ledger"]["n_releases"] == 2
