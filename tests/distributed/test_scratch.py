"""Tall intermediates in a scratch directory (``factorize(scratch=)``, ``--scratch``).

With a scratch directory, the blocks of the range sketch ``Y`` and of its
orthonormal basis wait on disk between steps instead of in worker memory (so
worker memory does not grow with the number of rows; measured in
``benchmarks/bench_memory.py``). The arithmetic is the same, block for block,
so the release must be the same bit for bit; the job's private subdirectory
must be gone afterwards, on success and on failure.
"""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from dist_util import seeded_matrix, write_matrix
from distributed import Client

import pipeline.api
from pipeline.api import factorize
from pipeline.execution.source import DaskSource

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
SKETCH_SEED, NOISE_SEED = 20240611, 7
# whole-width row bands (the non-private pass starts the TSQR in each chunk) and
# column-split blocks (the pass sums Y over column chunks; TSQR after the pass)
CHUNKS = {"row-bands": (64, N), "blocks": (100, 37)}
MODES = {
    "non-private": {"private": False},
    "spectral": {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE_SEED},
    "low-space": {
        "epsilon": 1.0,
        "delta": 1e-6,
        "insecure_noise_seed": NOISE_SEED,
        "algorithm": "low-space",
    },
}


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Records the scratch directory of each job and the tall block files present
    after each step of the job."""
    seen: dict[str, list] = {"made": [], "files": []}
    make, run = pipeline.api._make_scratch, DaskSource._run

    def spy_make(scratch, out):  # type: ignore[no-untyped-def]
        d = make(scratch, out)
        seen["made"].append(d)
        if d is not None:
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        return d

    def spy_run(self, tall, small, label):  # type: ignore[no-untyped-def]
        result = run(self, tall, small, label)
        if self.scratch is not None:
            seen["files"].append(len(glob.glob(os.path.join(self.scratch, "*.npy"))))
        return result

    monkeypatch.setattr(pipeline.api, "_make_scratch", spy_make)
    monkeypatch.setattr(DaskSource, "_run", spy_run)
    return seen


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", list(CHUNKS))
@pytest.mark.parametrize("mode", list(MODES))
def test_release_with_scratch_is_the_release_in_worker_memory(
    client: Client,
    tmp_path: Path,
    global_seed: int,
    spies: dict[str, list],
    layout: str,
    mode: str,
) -> None:
    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS[layout])
    kw = dict(MODES[mode], seed=SKETCH_SEED)
    if mode != "non-private":
        kw["budget"] = (10.0, 1e-4)
    in_memory = factorize(path, RANK, **kw)
    assert spies["made"] == [None]  # no out, no scratch: worker memory
    assert spies["files"] == []

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    on_disk = factorize(path, RANK, scratch=scratch, **kw)
    (job,) = spies["made"][1:]
    assert os.path.dirname(job) == os.fspath(scratch)
    # the blocks of Y (and of Q) really went through the directory ...
    n_blocks = -(-M // CHUNKS[layout][0])
    assert spies["files"]
    assert spies["files"][0] >= n_blocks
    # ... which the job removed when done
    assert list(scratch.iterdir()) == []
    for name in ("U", "S", "V"):
        np.testing.assert_array_equal(
            getattr(on_disk, name), getattr(in_memory, name), err_msg=name
        )


@pytest.mark.timeout(120)
def test_scratch_defaults_to_beside_out_and_is_removed_after_a_failure(
    client: Client,
    tmp_path: Path,
    global_seed: int,
    spies: dict[str, list],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS["row-bands"])
    out_dir = tmp_path / "releases"
    out_dir.mkdir()
    factorize(path, RANK, private=False, seed=SKETCH_SEED, out=out_dir / "r.zarr")
    (job,) = spies["made"]
    assert os.path.dirname(job) == os.fspath(out_dir)
    assert os.path.basename(job).startswith(".r.zarr.dplr-scratch-")
    assert sorted(p.name for p in out_dir.iterdir()) == ["r.zarr"]

    # a failure after the pass (here: in the post-processing) still removes it
    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("post-processing failed")

    monkeypatch.setattr(DaskSource, "finish_local_qr", broken)
    with pytest.raises(RuntimeError, match="post-processing failed"):
        factorize(path, RANK, private=False, seed=SKETCH_SEED, out=out_dir / "s.zarr")
    assert spies["files"][-1] > 0  # the pass had spilled its blocks
    # the journal stays for a rerun to resume from; the scratch does not
    assert sorted(p.name for p in out_dir.iterdir()) == [".s.zarr.dplr-journal", "r.zarr"]


def _late_writer(monkeypatch: pytest.MonkeyPatch, job: Path) -> list[str]:
    """Makes a task of a failed step spill a block into ``job`` at the worst
    moment: after the removal has listed the directory, just before it removes
    the directory itself. Returns what the writer saw."""
    from pipeline.execution.source import _spill

    seen: list[str] = []
    rmdir = os.rmdir

    def rmdir_after_a_late_write(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not seen:
            try:
                _spill(np.ones((3, 2)), os.fspath(job / "late.npy"))
                seen.append("written")
            except FileNotFoundError:
                seen.append("refused")
        return rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir_after_a_late_write)
    return seen


def test_scratch_removal_survives_a_task_still_spilling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When one task of a step fails, the others keep running on the workers and
    may spill while the job removes its scratch directory. The directory is
    renamed first, so the late spill fails instead of re-populating it."""
    job = tmp_path / ".r.zarr.dplr-scratch-x"
    job.mkdir()
    (job / "Y-0.npy").write_bytes(b"block")
    seen = _late_writer(monkeypatch, job)
    pipeline.api._remove_scratch(os.fspath(job))
    assert seen == ["refused"]
    assert list(tmp_path.iterdir()) == []


def test_negative_control_plain_removal_loses_the_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same late spill against a plain ``rmtree`` of the directory (what the
    job did before) leaves the directory behind: the race above is real."""
    import shutil

    job = tmp_path / ".r.zarr.dplr-scratch-x"
    job.mkdir()
    (job / "Y-0.npy").write_bytes(b"block")
    seen = _late_writer(monkeypatch, job)
    shutil.rmtree(job, ignore_errors=True)
    assert seen == ["written"]
    assert [p.name for p in tmp_path.iterdir()] == [job.name]


@pytest.mark.timeout(60)
def test_a_scratch_that_is_not_a_directory_is_refused_before_any_read(
    tmp_path: Path, global_seed: int
) -> None:
    from pipeline.errors import StoreLayoutError

    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS["row-bands"])
    afile = tmp_path / "a-file"
    afile.write_text("")
    for bad in (tmp_path / "missing", afile):
        with pytest.raises(StoreLayoutError, match=r"the scratch directory .* does not exist"):
            factorize(path, RANK, private=False, scratch=bad, out=tmp_path / "o.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.zarr", "a-file"]


@pytest.mark.timeout(120)
def test_workers_hold_no_chunk_read_buffers_after_a_job(
    client: Client, tmp_path: Path, global_seed: int
) -> None:
    """The pass tasks decode chunks into per-thread buffers (pipeline.io.inputs);
    the job frees them on every worker when it ends."""
    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS["row-bands"])

    def held() -> int:
        from pipeline.io import inputs

        return sum(len(b) for b in inputs._BUFFERS.values())

    def read_a_chunk(where: str) -> int:
        from pipeline.io import open_input

        _, info = open_input(where, unit=None)
        info.reader.block((0, 64), (0, N))
        return held()

    # control: a direct read does leave a buffer that this check would see
    assert all(v > 0 for v in client.run(read_a_chunk, path).values())
    factorize(path, RANK, private=False, seed=SKETCH_SEED)
    assert client.run(held) == dict.fromkeys(client.run(held), 0)
