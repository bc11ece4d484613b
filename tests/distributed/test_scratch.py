"""Tall intermediates in a scratch directory (``factorize(scratch=)``, ``--scratch``).

With a scratch directory, the blocks of the range sketch ``Y`` and of its
orthonormal basis wait on disk between steps instead of in worker memory (so
worker memory does not grow with the number of rows; measured in
``benchmarks/bench_memory.py``). The arithmetic is the same, block for block,
so the release must be the same bit for bit; the job's private subdirectory
must be gone afterwards, on success and on failure -- and, when the client was
killed, once the next job at that location (its rerun) has started.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dist_util import seeded_matrix, write_matrix
from distributed import Client

from pipeline.api import factorize
from pipeline.errors import StoreLayoutError
from pipeline.execution.source import DaskSource
from pipeline.io import read_release
from pipeline.io import release as io_release
from pipeline.io import scratch as _scratch

pytestmark = pytest.mark.distributed


@pytest.fixture(autouse=True)
def _one_chunk_per_task(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One store chunk per pass task (no banding): the layouts here are about
    how many blocks the tall objects and the trees have. Not where the reference
    is compared with a ``dplr`` subprocess, which bands as by default."""
    import pipeline.execution.source as module

    if "sigkilled" not in request.node.name:
        monkeypatch.setattr(module, "BAND_BYTES", 1)

M, N, RANK = 400, 150, 5
SKETCH_SEED, NOISE_SEED = 20240611, 7
# whole-width row bands (the non-private pass starts the TSQR in each chunk) and
# column-split blocks (the pass sums Y over column chunks; TSQR after the pass)
CHUNKS = {"row-bands": (64, N), "blocks": (100, 37)}
MODES = {
    "non-private": {"private": False},
    "spectral": {
        "epsilon": 1.0,
        "delta": 1e-6,
        "insecure_noise_seed": NOISE_SEED,
        "algorithm": "spectral",
    },
    "two-pass": {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE_SEED},
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
    make, run = _scratch.make_scratch, DaskSource._run

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

    monkeypatch.setattr(_scratch, "make_scratch", spy_make)
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
    assert max(spies["files"]) >= n_blocks  # (two-pass: its second pass's Y)
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
    _scratch.remove_tree(os.fspath(job))
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
    """The pass tasks decode chunks into per-thread buffers (pipeline.io.chunkio);
    the job frees them on every worker when it ends."""
    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS["row-bands"])

    def held() -> int:
        from pipeline.io.chunkio import read_buffer_bytes

        return read_buffer_bytes()

    def read_a_chunk(where: str) -> int:
        from pipeline.io import open_input

        _, info = open_input(where, unit=None)
        info.reader.block((0, 64), (0, N))
        return held()

    # control: a direct read does leave a buffer that this check would see
    assert all(v > 0 for v in client.run(read_a_chunk, path).values())
    factorize(path, RANK, private=False, seed=SKETCH_SEED)
    assert client.run(held) == dict.fromkeys(client.run(held), 0)


# ---------------------------------------------------------------------------
# a killed client: its scratch directory is removed by the next job there
# ---------------------------------------------------------------------------
def _gate_spills_on_worker(prefix: str, gate: str) -> None:
    """After writing a block whose file name starts with ``prefix``, a spill
    task waits while the file ``gate`` exists: the job cannot leave that step,
    so a kill lands in it whenever it comes."""
    import time

    from pipeline.execution import source

    real = source.__dict__.get("_ungated_spill", source._spill)
    source._ungated_spill = real  # type: ignore[attr-defined]

    def spill(block, path):  # type: ignore[no-untyped-def]
        token = real(block, path)
        if os.path.basename(path).startswith(prefix):
            waited = 0.0
            while os.path.exists(gate) and waited < 60.0:  # bounded: never hangs CI
                time.sleep(0.01)
                waited += 0.01
        return token

    source._spill = spill


def _ungate_spills_on_worker() -> None:
    from pipeline.execution import source

    real = source.__dict__.get("_ungated_spill")
    if real is not None:
        source._spill = real
        del source._ungated_spill  # type: ignore[attr-defined]


def _dplr(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "pipeline", *map(os.fspath, args)]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def _scratch_dirs(parent: Path, out: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(f".{out.name}.dplr-scratch-"))


def _wait_for_block(
    proc: subprocess.Popen[bytes], parent: Path, out: Path, block: str
) -> tuple[Path, Path]:
    """The job's scratch directory and the first block file named ``block*``
    in it, as soon as both exist (the process must still be running)."""
    for _ in range(12000):  # polls, bounded; the gate holds the job in place
        for d in _scratch_dirs(parent, out):
            found = sorted(d.glob(f"{block}*.npy"))
            if found:
                return d, found[0]
        assert proc.poll() is None, "the job ended before it spilled a block"
        time.sleep(0.01)
    raise AssertionError("no spilled block appeared")


def _lock_is_free(job: Path) -> bool:
    import fcntl

    fd = os.open(job / _scratch.LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


# phase -> (spill file names the kill waits for, journal file present at the kill)
KILLS = {
    # 1/3 of the job: the pass has spilled the exact Y; nothing journaled or charged
    "pass spilled Y": ("dplr-spill-Y-", None),
    # 2/3: journaled and charged, the noisy Y (and its Gram matrix) being made
    "charged, noisy Y spilled": ("dplr-spill-noisy-Y-", "charged.json"),
}


@pytest.mark.cli
@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", list(KILLS))
def test_sigkilled_dplr_factorize_leaves_no_scratch_after_the_rerun(
    cluster: Any,
    client: Client,
    tmp_path: Path,
    global_seed: int,
    phase: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Finding: a SIGKILLed ``dplr factorize`` left its scratch directory (the
    exact m x t range sketch) beside OUT for good. Its liveness lock dies with
    it, so the rerun of the same command removes it before it starts; the
    release is still the undisturbed one, charged once."""
    block, journal_file = KILLS[phase]
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (50, N))
    private = {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE_SEED}
    ref = factorize(
        path, RANK, seed=SKETCH_SEED, **private, algorithm="spectral", out=tmp_path / "ref.zarr",
        ledger=tmp_path / "ref-ledger.json", budget=(10.0, 1e-4),
    )  # fmt: skip
    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    argv = _dplr(
        "factorize", path, "--rank", str(RANK), "--algorithm", "spectral",
        "--epsilon", "1", "--delta", "1e-6",
        "--seed", str(SKETCH_SEED), "--insecure-noise-seed", str(NOISE_SEED),
        "--out", out, "--ledger", ledger, "--budget-epsilon", "10",
        "--budget-delta", "1e-4", "--scheduler", cluster.scheduler_address, "--quiet",
    )  # fmt: skip
    journal = tmp_path / f".{out.name}.dplr-journal"

    gate = tmp_path / "gate"
    gate.touch()
    client.run(_gate_spills_on_worker, block, os.fspath(gate))
    try:
        proc = subprocess.Popen(
            argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            job, first = _wait_for_block(proc, tmp_path, out, block)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        gate.unlink()
        client.run(_ungate_spills_on_worker)

    # the fault landed in the phase named: the directory (never renamed, so never
    # being removed) and the block seen before the kill were there at the kill
    assert _scratch_dirs(tmp_path, out) == [job]
    assert first.exists()
    assert _lock_is_free(job)  # the kernel released the dead client's lock
    assert not out.exists()
    if journal_file is None:
        assert not (journal / "sketches.json").exists()
        assert not ledger.exists()
    else:
        assert (journal / journal_file).exists()
    charged = json.loads(ledger.read_text())["releases"] if ledger.exists() else []

    # the same command again, in this process (an interpreter start saved)
    from pipeline.cli import main

    assert main([os.fspath(a) for a in argv[3:]]) == 0
    assert _scratch_dirs(tmp_path, out) == []  # the dead job's directory is gone
    assert not journal.exists()
    rel = read_release(out)
    for name in ("U", "S", "V"):
        assert getattr(rel, name).tobytes() == getattr(ref, name).tobytes(), name
    (record,) = json.loads(ledger.read_text())["releases"]  # charged once
    assert record["release_id"] == rel.report["release_id"]
    if charged:
        assert [record] == charged
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert "Traceback" not in capsys.readouterr().err


def _temporaries(parent: Path, out: Path) -> list[Path]:
    """Hidden temporary publications of ``out`` (``.OUT.tmp-*``)."""
    return sorted(p for p in parent.iterdir() if p.name.startswith(f".{out.name}.tmp-"))


@pytest.mark.cli
@pytest.mark.timeout(180)
def test_sigkilled_dplr_factorize_while_publishing_leaves_no_temporary_after_the_rerun(
    cluster: Any, client: Client, tmp_path: Path, global_seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Finding: a client killed while it publishes left its hidden temporary
    release (``.OUT.tmp-<id>``) beside ``OUT`` after the rerun had published.
    The kill lands at the job's fault seam inside the publication (the
    temporary group complete, not yet renamed); the rerun resumes from the
    journal, publishes the undisturbed release, and removes the dead
    publication as it removes a dead job's scratch."""
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (50, N))
    ref = factorize(
        path, RANK, seed=SKETCH_SEED, epsilon=1.0, delta=1e-6, insecure_noise_seed=NOISE_SEED,
        algorithm="spectral", out=tmp_path / "ref.zarr", ledger=tmp_path / "ref-ledger.json",
        budget=(10.0, 1e-4),
    )  # fmt: skip
    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    argv = _dplr(
        "factorize", path, "--rank", str(RANK), "--algorithm", "spectral",
        "--epsilon", "1", "--delta", "1e-6",
        "--seed", str(SKETCH_SEED), "--insecure-noise-seed", str(NOISE_SEED),
        "--out", out, "--ledger", ledger, "--budget-epsilon", "10",
        "--budget-delta", "1e-4", "--scheduler", cluster.scheduler_address, "--quiet",
    )  # fmt: skip
    killed = subprocess.run(
        argv, env={**_env(), "DPLR_CRASH_AT": "during-publish"},
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    # the fault landed while publishing (negative control: the leftover is
    # there before the rerun): charged, a complete temporary group, no OUT
    (tmp,) = _temporaries(tmp_path, out)
    assert (tmp / "zarr.json").exists()
    assert (tmp / "U" / "zarr.json").exists()
    assert not os.path.lexists(out)
    (charged,) = json.loads(ledger.read_text())["releases"]
    assert (tmp_path / f".{out.name}.dplr-journal" / "charged.json").exists()

    # the same command again, in this process (an interpreter start saved)
    from pipeline.cli import main

    assert main([os.fspath(a) for a in argv[3:]]) == 0
    assert _temporaries(tmp_path, out) == []  # the dead publication is gone
    rel = read_release(out)
    for name in ("U", "S", "V"):  # the same computation on the same bytes
        assert getattr(rel, name).tobytes() == getattr(ref, name).tobytes(), name
    (record,) = json.loads(ledger.read_text())["releases"]  # charged once
    assert record == charged
    assert record["release_id"] == rel.report["release_id"]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert "Traceback" not in capsys.readouterr().err


def _dead_job(parent: Path, prefix: str) -> Path:
    """The scratch directory of a job SIGKILLed while it ran: created and
    locked by that process, holding one spilled block."""
    script = (
        "import os, signal, sys\n"
        "from pipeline.io.scratch import JobScratch\n"
        "job = JobScratch.create(sys.argv[1], sys.argv[2])\n"
        "open(os.path.join(job.path, 'dplr-spill-Y-0.npy'), 'wb').write(b'block')\n"
        "print(job.path, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, os.fspath(parent), prefix],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    job = Path(proc.stdout.strip())
    assert (job / "dplr-spill-Y-0.npy").exists()
    return job


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["beside OUT", "scratch directory"])
def test_the_next_job_removes_a_dead_jobs_scratch_and_the_old_code_did_not(
    client: Client,
    tmp_path: Path,
    global_seed: int,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """Negative control first: a job that does not look for dead jobs (what
    factorize did before) leaves their directories, however many jobs run on
    the same OUT. Then the next job removes them, even one that is refused."""
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (64, N))
    out = tmp_path / "r.zarr"
    scratch = tmp_path / "scratch" if where == "scratch directory" else None
    if scratch is not None:
        scratch.mkdir()
    parent, prefix = _scratch.scratch_locations(scratch, out)[0]
    dead = _dead_job(Path(parent), prefix)
    kw: dict[str, Any] = {"private": False, "seed": SKETCH_SEED, "scratch": scratch}
    with monkeypatch.context() as mp:
        mp.setattr(_scratch, "remove_dead", lambda *a, **k: [])
        # the publication's own cleanup (of dead temporaries beside OUT) as well
        mp.setattr(io_release, "remove_dead", lambda *a, **k: [])
        factorize(path, RANK, out=out, **kw)
        factorize(path, RANK, out=out, overwrite=True, **kw)
    assert (dead / "dplr-spill-Y-0.npy").exists()  # the old behaviour: it stays

    # a job that is then refused (OUT exists) has removed it already ...
    with pytest.raises(StoreLayoutError, match="already exists"):
        factorize(path, RANK, out=out, **kw)
    assert not os.path.lexists(dead)
    # ... and so does one that runs
    dead = _dead_job(Path(parent), prefix)
    factorize(path, RANK, out=out, overwrite=True, **kw)
    assert not os.path.lexists(dead)
    assert [p.name for p in Path(parent).iterdir() if p.name.startswith(prefix)] == []
