"""Faults during a private PCA (spec power-pca 4.9, 5.2 P7).

* A worker SIGKILLed in the middle of a power-iteration pass: the scheduler
  recomputes the lost band partials (pure tasks, no randomness in tasks), the
  client sees only the completed sum, and the release is bit for bit the
  undisturbed one, charged once.
* The client dies between releases (injected in process at chosen points, and a
  real ``dplr pca`` process SIGKILLed): a rerun of the same job resumes from the
  release journal -- journaled releases are neither redrawn, nor recharged, nor
  recomputed by a pass -- and publishes bit for bit the release of an
  uninterrupted run; the journal, which holds the noise key, is removed.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from dist_util import seeded_matrix, write_matrix
from distributed import Client, LocalCluster
from test_fault_tolerance import SlowStore

import pipeline.api
import pipeline.jobs.pca
from pipeline.api import pca
from pipeline.execution.pca import DaskRowSource
from pipeline.io import FileJournal, default_journal_path, read_group
from pipeline.mechanisms.noise import NoiseKey

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 12, 3
NOISE_SEED = 99
PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "clip_radius": 0.02}
BUDGET = (10.0, 1e-4)


def _labels(T: int) -> list[str]:
    """Release order of a power run: M, then H_t and Z_t per iteration."""
    return ["M", *(f"{x}{t}" for t in range(T) for x in "HZ")]


def _journal_labels(journal: Path) -> list[str]:
    return sorted(f[:-4] for f in os.listdir(journal) if f.endswith(".npy"))


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


def _assert_trusted_zone_modes(journal: Path) -> None:
    """The journal holds the noise key: directory 0700, every file 0600."""
    assert stat.S_IMODE(os.stat(journal).st_mode) == 0o700
    for f in os.listdir(journal):
        try:
            mode = stat.S_IMODE(os.stat(journal / f).st_mode)
        except FileNotFoundError:  # a temporary file renamed meanwhile
            continue
        assert mode == 0o600, f


def _assert_same_release(out: Path, ref: Path) -> None:
    names = ("components", "eigenvalues")
    (a, _), (b, _) = read_group(out, names), read_group(ref, names)
    for name in names:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# ---------------------------------------------------------------------------
# (1) a worker killed in the middle of a power-iteration pass
# ---------------------------------------------------------------------------
ROWS_PER_CHUNK = 10  # 40 chunks, one row band each
N_CHUNKS = M // ROWS_PER_CHUNK
READ_DELAY = 0.1  # seconds per chunk read (SlowStore): a pass of ~2 s on 2 workers
KILL_AFTER = 10  # chunk reads into the first power-iteration pass before the kill
T_KILL = 2


class _StepLog(io.TextIOBase):
    """A progress stream that notes how many chunks had been read at each message."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self.lock:
            self.events.append((s, len(os.listdir(self.marks))))
        return len(s)

    def reads_at(self, text: str) -> int | None:
        with self.lock:
            return next((n for s, n in self.events if text in s), None)


@pytest.fixture
def _one_chunk_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """One store chunk per pass task (no banding): the kill is placed by counting
    the chunks the power pass has read."""
    import pipeline.execution.pca as module

    monkeypatch.setattr(module, "BAND_BYTES", 1)


@pytest.mark.usefixtures("_one_chunk_per_task")
@pytest.mark.timeout(240)
def test_worker_killed_mid_power_pass_gives_the_undisturbed_release(
    client: Client, tmp_path: Path, global_seed: int
) -> None:
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (ROWS_PER_CHUNK, N)
    )
    # the out-of-core path: every power pass reads the store (with the cache,
    # test_cache.py, the power passes read no chunk for the kill to follow)
    kw = {**PRIVACY, "iterations": T_KILL, "insecure_noise_seed": NOISE_SEED,
          "cache": "never"}  # fmt: skip

    def bands(store: SlowStore) -> da.Array:
        return da.from_zarr(
            zarr.open_array(store=store, mode="r"), chunks=(ROWS_PER_CHUNK, N)
        )

    calm = pca(bands(SlowStore(path)), RANK, **kw, out=tmp_path / "calm.zarr")
    assert calm.report["cluster"]["n_row_bands"] == N_CHUNKS

    marks = tmp_path / "marks"
    marks.mkdir()
    log = _StepLog(marks)
    ledger = tmp_path / "ledger.json"
    pids = client.run(os.getpid)
    victim = min(pids)
    killed: dict[str, Any] = {}

    def kill_mid_power_pass() -> None:
        deadline = time.monotonic() + 90
        start = None
        while start is None and time.monotonic() < deadline:
            start = log.reads_at(f"power iteration 1/{T_KILL}")
            time.sleep(0.01)
        if start is None:
            return
        while len(os.listdir(marks)) < start + KILL_AFTER:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        killed["pass_start"] = start
        killed["reads_before"] = len(os.listdir(marks))
        killed["next_step_seen"] = log.reads_at(f"power iteration 2/{T_KILL}")
        os.kill(pids[victim], signal.SIGKILL)  # a hard crash, like the OOM killer

    killer = threading.Thread(target=kill_mid_power_pass, daemon=True)
    killer.start()
    hit = pca(
        bands(SlowStore(path, delay=READ_DELAY, marks=str(marks))),
        RANK,
        **kw,
        out=tmp_path / "hit.zarr",
        ledger=ledger,
        budget=BUDGET,
        progress=log,
    )
    killer.join(timeout=60)

    # the kill landed inside the first power-iteration pass (after the Gram pass)
    assert "reads_before" in killed, "the worker was never killed"
    assert killed["pass_start"] == N_CHUNKS  # the Gram pass read every chunk once
    assert KILL_AFTER <= killed["reads_before"] - killed["pass_start"] < N_CHUNKS
    assert killed["next_step_seen"] is None
    assert len(os.listdir(marks)) >= (1 + T_KILL) * N_CHUNKS
    # the Nanny restarted the worker: a new process
    client.wait_for_workers(2, timeout=60)
    assert pids[victim] not in client.run(os.getpid).values()

    # retries are not passes, and nothing was drawn twice: bit-for-bit the same
    assert hit.report["n_passes"] == calm.report["n_passes"] == 1 + T_KILL
    assert hit.report["resumed_releases"] == []
    _assert_same_release(tmp_path / "hit.zarr", tmp_path / "calm.zarr")
    np.testing.assert_array_equal(hit.components, calm.components)
    (record,) = _records(ledger)
    assert record["release_id"] == hit.report["release_id"]
    assert hit.report["ledger"]["n_releases"] == 1
    assert not os.path.lexists(default_journal_path(tmp_path / "hit.zarr"))


# ---------------------------------------------------------------------------
# (2a) the client dies at chosen points (injected in process)
# ---------------------------------------------------------------------------
T_RESUME = 3
STORE_CHUNKS = (50, N)


class SimulatedCrash(Exception):
    """Stands for the client process dying at the injection point."""


# name -> (route, injection point, number of releases journaled before the crash
# (a prefix of M, H0, Z0, H1, ...), passes of the rerun)
# Passes on resume (spec 4.7): one per Z still to release, one per H still to
# release on the two-pass route; on the Gram route one Gram pass rebuilds A^T A
# (kept in client memory only) when, and only when, some H is still to release.
CRASHES: dict[str, tuple[str, tuple[str, Any], int, int]] = {
    "gram, dies in the Z1 pass": ("gram", ("power_step", 2), 4, 3),
    "gram, dies in the last Z pass": ("gram", ("power_step", 3), 6, 1),
    # the noise of Z1 was drawn, but the release never reached the journal: the
    # rerun draws it again from the same keyed stream, bit for bit the same value
    "gram, Z1 drawn but not journaled": ("gram", ("before", "Z1"), 4, 3),
    "gram, dies right after Z1 is journaled": ("gram", ("after", "Z1"), 5, 2),
    "two-pass, dies in the H1 pass": ("two-pass", ("products", 2), 3, 4),
}
_CLEAN: dict[tuple[int, str], tuple[Path, dict[str, Any]]] = {}


def _install_crash(mp: pytest.MonkeyPatch, point: tuple[str, Any]) -> None:
    kind, arg = point
    if kind in ("power_step", "products"):
        original = getattr(DaskRowSource, kind)
        calls = [0]

        def counted(self: DaskRowSource, *a: Any) -> Any:
            calls[0] += 1
            value = original(self, *a)  # the pass runs, the client dies before using it
            if calls[0] == arg:
                raise SimulatedCrash(f"{kind} #{arg}")
            return value

        mp.setattr(DaskRowSource, kind, counted)
    else:
        record = FileJournal.record

        def crashing(self: FileJournal, label: str, value: np.ndarray) -> None:
            if kind == "before" and label == arg:
                raise SimulatedCrash(f"before recording {label}")
            record(self, label, value)
            if kind == "after" and label == arg:
                raise SimulatedCrash(f"after recording {label}")

        mp.setattr(FileJournal, "record", crashing)


def _clean_run(
    path: str, route: str, seed: int, tmp: Path
) -> tuple[Path, dict[str, Any]]:
    """An uninterrupted run of the same job (cached per data seed and route)."""
    if (seed, route) not in _CLEAN:
        out, ledger = tmp / f"clean-{route}.zarr", tmp / f"clean-{route}.json"
        pca(
            path, RANK, **PRIVACY, iterations=T_RESUME, route=route,
            insecure_noise_seed=NOISE_SEED, out=out, ledger=ledger, budget=BUDGET,
        )  # fmt: skip
        (record,) = _records(ledger)
        _CLEAN[(seed, route)] = (out, record)
    return _CLEAN[(seed, route)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CRASHES))
def test_rerun_after_a_client_crash_resumes_from_the_journal(
    client: Client,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    global_seed: int,
    case: str,
) -> None:
    route, point, n_journaled, resume_passes = CRASHES[case]
    journaled = _labels(T_RESUME)[:n_journaled]
    # bands of one store chunk: 8 bands per pass instead of one 64 MiB band
    monkeypatch.setattr(pipeline.jobs.pca, "PCA_BAND_BYTES", STORE_CHUNKS[0] * N * 8)
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), STORE_CHUNKS
    )
    clean_out, clean_record = _clean_run(
        path, route, global_seed, tmp_path_factory.mktemp("clean")
    )
    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    journal = Path(default_journal_path(out))
    kw = {
        **PRIVACY, "iterations": T_RESUME, "route": route, "out": out,
        "insecure_noise_seed": NOISE_SEED, "ledger": ledger, "budget": BUDGET,
    }  # fmt: skip

    with monkeypatch.context() as mp:
        _install_crash(mp, point)
        with pytest.raises(SimulatedCrash):
            pca(path, RANK, **kw)
    # the crash left: no release, the journal (trusted zone), one charge
    assert not os.path.lexists(out)
    assert _journal_labels(journal) == sorted(journaled)
    _assert_trusted_zone_modes(journal)
    (charged,) = _records(ledger)

    progress = io.StringIO()
    rel = pca(path, RANK, **kw, progress=progress)
    rep = rel.report
    assert rep["resumed_releases"] == journaled
    assert rep["releases"] == _labels(T_RESUME)
    assert rep["n_passes"] == resume_passes
    assert rep["n_passes_planned"] == (
        1 + T_RESUME if route == "gram" else 1 + 2 * T_RESUME
    )
    missing = _labels(T_RESUME)[len(journaled) :]
    gram_redone = route == "gram" and any(x.startswith("H") for x in missing)
    assert ("Gram pass" in progress.getvalue()) is gram_redone
    # bit for bit the uninterrupted run: no release was drawn twice with new noise
    _assert_same_release(out, clean_out)
    # charged once, for the job, exactly as the clean run was
    (record,) = _records(ledger)
    assert record == charged
    assert record["release_id"] == rep["release_id"]
    for k in ("epsilon", "delta", "noise_multiplier_total", "algorithm"):
        assert record[k] == clean_record[k], k
    assert not os.path.lexists(journal)


# ---------------------------------------------------------------------------
# (2b) a real `dplr pca` process SIGKILLed mid-run, then rerun
# ---------------------------------------------------------------------------
T_CLI = 6  # the run still has >= 5 passes to go when Z0 is journaled


def _dplr_pca(
    path: str, out: Path, ledger: Path, scheduler: str, *extra: str
) -> list[str]:
    return [
        sys.executable, "-m", "pipeline", "pca", path, "--rank", str(RANK),
        "--epsilon", "1", "--delta", "1e-6", "--clip-radius", "0.02",
        "--insecure-noise-seed", str(NOISE_SEED), "--out", str(out),
        "--ledger", str(ledger), "--budget-epsilon", str(BUDGET[0]),
        "--budget-delta", str(BUDGET[1]), "--scheduler", scheduler, *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, check=False, capture_output=True, text=True, timeout=150, env=_env()
    )


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.cli
@pytest.mark.timeout(300)
def test_cli_killed_mid_run_resumes_on_rerun(
    cluster: LocalCluster, tmp_path: Path, global_seed: int
) -> None:
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), STORE_CHUNKS
    )
    sched = cluster.scheduler_address
    iters = ("--iterations", str(T_CLI))

    ref_out = tmp_path / "uninterrupted.zarr"
    ref = _run(
        _dplr_pca(path, ref_out, tmp_path / "ref-ledger.json", sched, *iters, "--quiet")
    )
    assert ref.returncode == 0, ref.stderr
    _, ref_rep = read_group(ref_out, ("components",))
    assert ref_rep["n_passes"] == 1 + T_CLI

    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    journal = Path(default_journal_path(out))
    job = _dplr_pca(path, out, ledger, sched, *iters)
    proc = subprocess.Popen(
        [*job, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
    )
    try:
        while proc.poll() is None and not (journal / "Z0.npy").exists():
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before Z0 was journaled"
        # while the job runs, the journal is private to its owner
        _assert_trusted_zone_modes(journal)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    order = _labels(T_CLI)
    recorded = [x for x in order if x in _journal_labels(journal)]
    # write-ahead order: the journal holds a prefix of the releases, and not all
    assert recorded == order[: len(recorded)]
    assert {"M", "H0", "Z0"} <= set(recorded)
    assert len(recorded) < len(order), "the kill landed after the last release"
    assert not os.path.lexists(out)
    # charged once by the kill (that the charge precedes the first noise draw is
    # tests/unit/test_release_order.py's)
    (charged,) = _records(ledger)
    _assert_trusted_zone_modes(journal)

    # a different job on the same OUT is refused, naming the journal; nothing changes
    before_journal, before_ledger = _snapshot(journal), ledger.read_bytes()
    other = _run(
        _dplr_pca(path, out, ledger, sched, "--iterations", str(T_CLI + 1), "--quiet")
    )
    assert other.returncode == 2, (other.returncode, other.stderr)
    assert "Traceback" not in other.stderr
    line = other.stderr.strip()
    assert line.startswith("dplr: error: ")
    assert "\n" not in line
    assert str(journal) in line
    assert "different parameters" in line
    assert _snapshot(journal) == before_journal
    assert ledger.read_bytes() == before_ledger
    assert not os.path.lexists(out)

    # the same command resumes: journaled releases are reused, not redrawn or recharged
    again = _run(job)
    assert again.returncode == 0, again.stderr
    assert "resumed journaled release(s) of an interrupted run" in again.stdout
    _, rep = read_group(out, ("components",))
    assert rep["resumed_releases"] == recorded
    missing = order[len(recorded) :]
    n_z = sum(x.startswith("Z") for x in missing)
    gram_redone = any(x.startswith("H") for x in missing)
    assert rep["n_passes"] == n_z + gram_redone < ref_rep["n_passes"]
    assert ("Gram pass" in again.stderr) is gram_redone
    _assert_same_release(out, ref_out)
    (record,) = _records(ledger)
    assert record == charged
    assert record["release_id"] == rep["release_id"]
    assert not os.path.lexists(journal)
    # the key derived from the public seed reaches neither the release nor the terminal
    key = NoiseKey.insecure_from_seed(NOISE_SEED).secret.hex()
    for text in (json.dumps(rep), again.stdout, again.stderr):
        assert key not in text
