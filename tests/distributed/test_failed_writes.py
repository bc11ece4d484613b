"""A distributed write that fails leaves nothing behind (``pipeline.io._store``).

A release and a journal entry are written under a temporary name that is
removed when the write fails. When one chunk write fails, the others may still
be running on the workers; a write that lands after the removal recreates the
chunk's directories. The writer must wait for every chunk write to settle.
"""

from __future__ import annotations

import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from distributed import Client

import pipeline.io.release
from pipeline.io.release import write_group

pytestmark = pytest.mark.distributed

ROWS, COLS, BLOCK = 400, 5, 100
LATE = 1.5  # s


def _failing_then_slow(block: np.ndarray, block_info=None) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Block 0 fails at once; the others are still computing when it does.

    With 2 workers, one of them starts another block at the same time as block 0;
    its write lands ``LATE`` seconds later, far longer than the failure takes to
    reach the client and the temporary group to be removed.
    """
    if block_info[0]["chunk-location"][0] == 0:
        raise OSError("no space left on device")
    time.sleep(LATE)
    return block


def _n_executing(dask_worker) -> int:  # type: ignore[no-untyped-def]
    return len(dask_worker.state.executing)


def _settle(client: Client) -> None:
    """Wait (a bounded time) until no task of the write still runs anywhere."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(client.run(_n_executing).values()) == 0:
            time.sleep(0.2)  # a task between two states is not "executing"
            if sum(client.run(_n_executing).values()) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the cluster did not become idle")


def _write(client: Client, tmp_path: Path) -> Path:
    x = da.from_array(np.ones((ROWS, COLS)), chunks=(BLOCK, COLS)).map_blocks(
        _failing_then_slow, dtype=np.float64
    )
    out_dir = tmp_path / "releases"
    out_dir.mkdir()
    with pytest.raises(OSError, match="no space left on device"):
        write_group(out_dir / "r.zarr", {"U": x}, {"k": 1}, overwrite=False, client=client)
    _settle(client)
    return out_dir


@pytest.mark.timeout(120)
def test_a_failed_write_leaves_nothing_once_the_workers_are_idle(
    client: Client, tmp_path: Path
) -> None:
    out_dir = _write(client, tmp_path)
    assert list(out_dir.iterdir()) == []


@pytest.mark.timeout(120)
def test_negative_control_store_that_returns_at_the_first_failure(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dask's own store on the client (what the writers did before) returns
    while the other chunk writes go on, and they recreate the temporary group."""

    def dask_store(x, z, client):  # type: ignore[no-untyped-def]
        client.compute(da.store(x, z, lock=False, compute=False), sync=True)

    monkeypatch.setattr(pipeline.io.release, "store_array", dask_store)
    out_dir = _write(client, tmp_path)
    leftovers = [p.name for p in out_dir.iterdir()]
    assert len(leftovers) == 1, leftovers
    assert leftovers[0].startswith(".r.zarr.tmp-"), leftovers
