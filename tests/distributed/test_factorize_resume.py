"""A client crash during ``dplr factorize`` on a cluster, then a rerun.

The exact sketches of the single pass are journaled (the tall range sketch as a
Zarr array written by the workers, chunk by chunk) with the noise key and the
sketch seed before the ledger is charged; the charge comes before any noise. A
rerun of the same job after a crash at any of these step boundaries

* does not read the input store again (chunk reads are counted on the workers),
* draws the same noise (the release is bit for bit the undisturbed one), and
* leaves exactly one ledger record, with the release id of the published report;

the journal (trusted zone: key and exact sketches) is removed once the release
is published. Crashes are injected in process at each boundary, and a real
``dplr factorize`` process is SIGKILLed right after its pass was journaled and
right after its charge.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dist_util import seeded_matrix, write_matrix
from distributed import Client, LocalCluster

import pipeline.io
from pipeline.accounting.ledger import Ledger
from pipeline.api import factorize
from pipeline.errors import StoreLayoutError
from pipeline.execution import DaskSource
from pipeline.io import FileJournal, default_journal_path, read_release

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
STORE_CHUNKS = (50, N)  # 8 chunks, whole rows: one pass
N_CHUNKS = M // STORE_CHUNKS[0]
SKETCH_SEED = 31337
NOISE_SEED = 99
BUDGET = (10.0, 1e-4)


class SimulatedCrash(Exception):
    """Stands for the client process dying at the injection point."""


# ---------------------------------------------------------------------------
# counting chunk reads of the input store on the workers
# ---------------------------------------------------------------------------
def _count_reads_on_worker(root: str, marks: str) -> None:
    """Make every chunk read of the store at ``root`` leave a file in ``marks``
    (through zarr's store, or direct: ``pipeline.io.inputs._chunk_bytes``)."""
    from zarr.storage import LocalStore

    real = LocalStore.__dict__.get("_unpatched_get", LocalStore.get)
    LocalStore._unpatched_get = real  # type: ignore[attr-defined]

    async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def]
        value = await real(self, key, prototype, byte_range)
        if key.startswith("c/") and os.path.abspath(str(self.root)) == root:
            Path(marks, uuid.uuid4().hex).touch()
        return value

    LocalStore.get = get  # type: ignore[method-assign]

    # the pass tasks read the chunks of a plain local store directly
    from pipeline.io import inputs

    direct = getattr(inputs, "_unpatched_chunk_bytes", inputs._chunk_bytes)
    inputs._unpatched_chunk_bytes = direct  # type: ignore[attr-defined]

    def chunk_bytes(store, key):  # type: ignore[no-untyped-def]
        value = direct(store, key)
        if key.startswith("c/") and os.path.abspath(str(store.root)) == root:
            Path(marks, uuid.uuid4().hex).touch()
        return value

    inputs._chunk_bytes = chunk_bytes


def _stop_counting_on_worker() -> None:
    from zarr.storage import LocalStore

    from pipeline.io import inputs

    real = LocalStore.__dict__.get("_unpatched_get")
    if real is not None:
        LocalStore.get = real  # type: ignore[method-assign]
        del LocalStore._unpatched_get  # type: ignore[attr-defined]
    direct = getattr(inputs, "_unpatched_chunk_bytes", None)
    if direct is not None:
        inputs._chunk_bytes = direct
        del inputs._unpatched_chunk_bytes


@contextmanager
def counted_reads(
    client: Client, store: str, marks: Path
) -> Iterator[Callable[[], int]]:
    """Count the chunk reads of ``store`` by every worker while the block runs."""
    marks.mkdir()
    client.run(_count_reads_on_worker, os.path.abspath(store), str(marks))
    try:
        yield lambda: len(os.listdir(marks))
    finally:
        client.run(_stop_counting_on_worker)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


def _assert_private_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for f in files:
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode)
            assert mode == 0o600, os.path.join(dirpath, f)


def _assert_same_release(out: Path, ref: Path) -> None:
    a, b = read_release(out), read_release(ref)
    for name in ("U", "S", "V"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert x.tobytes() == y.tobytes(), name  # bit for bit


def _kw(algorithm: str, private: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"algorithm": algorithm, "seed": SKETCH_SEED}
    if private:
        kw.update(epsilon=1.0, delta=1e-6, insecure_noise_seed=NOISE_SEED)
    else:
        kw["private"] = False
    return kw


_CLEAN: dict[tuple[int, str, bool], Path] = {}


def _clean_release(
    path: str, algorithm: str, private: bool, seed: int, tmp: Path
) -> Path:
    """An uninterrupted run of the same job (cached per data seed and mode)."""
    key = (seed, algorithm, private)
    if key not in _CLEAN:
        out = tmp / f"clean-{algorithm}-{private}.zarr"
        factorize(
            path, RANK, **_kw(algorithm, private), out=out,
            ledger=tmp / "clean-ledger.json", budget=BUDGET,
        )  # fmt: skip
        _CLEAN[key] = out
    return _CLEAN[key]


# ---------------------------------------------------------------------------
# (1) the client dies at each step boundary (injected in process)
# ---------------------------------------------------------------------------
def _after(
    cls: Any, name: str, *, instead: bool = False
) -> Callable[[pytest.MonkeyPatch], None]:
    def install(mp: pytest.MonkeyPatch) -> None:
        real = getattr(cls, name)

        def crashing(self: Any, *a: Any, **kw: Any) -> Any:
            if not instead:
                real(self, *a, **kw)
            raise SimulatedCrash(f"after {name}")

        mp.setattr(cls, name, crashing)

    return install


def _before_publish(mp: pytest.MonkeyPatch) -> None:
    def crashing(*a: Any, **kw: Any) -> None:
        raise SimulatedCrash("before publishing")

    mp.setattr(pipeline.io, "write_release", crashing)


# name -> (algorithm, private, injection, charged at the crash, journaled at the crash)
CRASHES: dict[str, tuple[str, bool, Callable[[pytest.MonkeyPatch], None], bool, bool]] = {
    # negative control of the journal: the pass ended, nothing was journaled
    "spectral, pass done, not journaled": (
        "spectral", True, _after(DaskSource, "sketch"), False, False
    ),
    "spectral, journaled, not charged": (
        "spectral", True, _after(FileJournal, "record_sketches"), False, True
    ),
    "spectral, charged, marker not written": (
        "spectral", True, _after(Ledger, "charge"), True, True
    ),
    "spectral, charge marked, before noise": (
        "spectral", True, _after(FileJournal, "mark_charged"), True, True
    ),
    "spectral, noise drawn, not published": ("spectral", True, _before_publish, True, True),
    "spectral, published, journal left": (
        "spectral", True, _after(FileJournal, "remove", instead=True), True, True
    ),
    "low-space, journaled, not charged": (
        "low-space", True, _after(FileJournal, "record_sketches"), False, True
    ),
    "low-space, noise drawn, not published": ("low-space", True, _before_publish, True, True),
    "non-private, journaled, not published": ("spectral", False, _before_publish, False, True),
}  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CRASHES))
def test_rerun_after_a_client_crash_draws_and_charges_nothing_again(
    client: Client,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    global_seed: int,
    case: str,
) -> None:
    """A rerun resumes from the journal: the same key (so the same noise), no
    second charge, the undisturbed release bit for bit. The journal keeps the
    small exact sketches and names the tall one (m x t) for recomputation, so
    the rerun reads the input once more and checks that the small sketches come
    out the same; a published release is returned without a read."""
    algorithm, private, install, charged, journaled = CRASHES[case]
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), STORE_CHUNKS
    )
    clean = _clean_release(
        path, algorithm, private, global_seed, tmp_path_factory.mktemp("clean")
    )
    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    journal = Path(default_journal_path(out))
    kw = {**_kw(algorithm, private), "out": out, "ledger": ledger, "budget": BUDGET}

    with counted_reads(client, path, tmp_path / "marks") as reads:
        with monkeypatch.context() as mp:
            install(mp)
            with pytest.raises(SimulatedCrash):
                factorize(path, RANK, **kw)
        assert reads() == N_CHUNKS  # the crashed run read each chunk once
        published = case.endswith("published, journal left")
        assert os.path.isdir(out) is published
        if not journaled:
            assert not os.path.lexists(journal)
        else:
            manifest = json.loads((journal / "sketches.json").read_text())["sketches"]
            tall = "Y" if algorithm == "spectral" else "Yc"
            # the tall sketch stayed distributed and was not written: named only
            assert manifest[tall]["kind"] == "recompute"
            assert not list(journal.glob(f"exact-{tall}.*"))
            assert manifest["Z"]["kind"] == "npy"  # the small ones are kept
            _assert_private_tree(journal)
        n_charged = len(_records(ledger)) if ledger.exists() else 0
        assert n_charged == int(charged)

        rel = factorize(path, RANK, **kw)
        # one more read to recompute the tall sketch; none for a published release
        assert reads() - N_CHUNKS == (0 if published else N_CHUNKS)
    _assert_same_release(out, clean)
    rep = rel.report
    if private:
        (record,) = _records(ledger)  # exactly one charge
        assert record["release_id"] == rep["release_id"]
        assert rep["ledger"]["n_releases"] == 1
    else:
        assert not ledger.exists()  # a non-private run is not accounted
    if not published:
        assert rep["resumed_from_journal"] is journaled
        assert rep["n_passes"] == 1
        assert rep["cluster"]["n_graph_tasks_pass"] > 0
    assert not os.path.lexists(journal)


# ---------------------------------------------------------------------------
# (2) a real `dplr factorize` process SIGKILLed, then the same command rerun
# ---------------------------------------------------------------------------
# Runs `dplr factorize ARGV` with one step wrapped so that the process SIGKILLs
# itself right after that step's durable write: the hardest possible crash there.
_KILLED_RUN = """
import os, signal, sys
from pipeline.io import FileJournal
from pipeline.cli import main
step = getattr(FileJournal, sys.argv[1])
def then_die(self, *a, **kw):
    step(self, *a, **kw)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(FileJournal, sys.argv[1], then_die)
sys.exit(main(sys.argv[2:]))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, check=False, capture_output=True, text=True, timeout=120, env=_env()
    )


def _dplr_args(
    path: str, out: Path, ledger: Path, scheduler: str, *extra: str
) -> list[str]:
    return [
        # the one-pass job's durable steps (two-pass: test_two_pass_distributed.py)
        "factorize", path, "--rank", str(RANK), "--algorithm", "spectral",
        "--epsilon", "1", "--delta", "1e-6",
        "--seed", str(SKETCH_SEED), "--insecure-noise-seed", str(NOISE_SEED),
        "--out", str(out), "--ledger", str(ledger), "--budget-epsilon", str(BUDGET[0]),
        "--budget-delta", str(BUDGET[1]), "--scheduler", scheduler, "--quiet", *extra,
    ]  # fmt: skip


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.cli
@pytest.mark.timeout(180)
@pytest.mark.parametrize("step", ["record_sketches", "mark_charged"])
def test_dplr_factorize_sigkilled_after_a_durable_step_resumes_on_rerun(
    cluster: LocalCluster,
    client: Client,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    global_seed: int,
    step: str,
) -> None:
    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), STORE_CHUNKS
    )
    sched = cluster.scheduler_address
    # the undisturbed run of the same job (the command calls exactly this)
    ref_out = _clean_release(
        path, "spectral", True, global_seed, tmp_path_factory.mktemp("clean")
    )

    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    journal = Path(default_journal_path(out))
    argv = _dplr_args(path, out, ledger, sched)
    with counted_reads(client, path, tmp_path / "marks") as reads:
        killed = _run([sys.executable, "-c", _KILLED_RUN, step, *argv])
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert reads() == N_CHUNKS
        assert not os.path.lexists(out)
        assert (journal / "sketches.json").exists()
        assert (journal / "charged.json").exists() is (step == "mark_charged")
        assert any(".dplr-scratch-" in p.name for p in tmp_path.iterdir())  # left
        _assert_private_tree(journal)
        before_ledger = ledger.read_bytes() if ledger.exists() else None
        charged = [] if before_ledger is None else _records(ledger)
        assert len(charged) == (step == "mark_charged")

        # another job on the same OUT is refused (exit 2, one line), nothing changes
        before_journal = _snapshot(journal)
        other = _run([sys.executable, "-m", "pipeline", *argv, "--rank", str(RANK + 1)])
        assert other.returncode == 2, (other.returncode, other.stderr)
        line = other.stderr.strip()
        assert "\n" not in line
        assert "Traceback" not in line
        assert line.startswith("dplr: error: ")
        assert str(journal) in line
        assert "different parameters" in line
        if step == "mark_charged":
            assert "already charged" in line
            assert "charge stays spent" in line
        else:
            assert "costs no privacy budget" in line
        assert _snapshot(journal) == before_journal
        assert (ledger.read_bytes() if ledger.exists() else None) == before_ledger

        # the same command resumes: the same noise, no second charge, one read
        # to recompute the tall exact sketch the journal only named
        again = _run([sys.executable, "-m", "pipeline", *argv])
        assert again.returncode == 0, again.stderr
        assert reads() == 2 * N_CHUNKS
    assert "resumed from the journal of an interrupted run" in again.stdout
    assert "passes=1" in again.stdout
    _assert_same_release(out, ref_out)
    (record,) = _records(ledger)
    assert record["release_id"] == read_release(out).report["release_id"]
    if charged:
        assert record == charged[0]
    assert not os.path.lexists(journal)
    # nor the killed run's scratch directory (its exact Y blocks)
    assert [p.name for p in tmp_path.iterdir() if ".dplr-scratch-" in p.name] == []


# ---------------------------------------------------------------------------
# (3) the budget is checked before the first chunk read
# ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_over_budget_on_a_zarr_store_reads_no_chunk(
    client: Client, tmp_path: Path, global_seed: int
) -> None:
    """Chunk reads are counted on the workers and in this process (the client
    plans and refuses before it submits anything)."""
    from pipeline.errors import BudgetExceededError

    path = write_matrix(
        tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), STORE_CHUNKS
    )
    ledger = tmp_path / "ledger.json"
    Ledger.create(ledger, dataset="A", epsilon=0.5, delta=1e-4)
    before = ledger.read_bytes()
    out = tmp_path / "release.zarr"
    kw = {**_kw("spectral", True), "ledger": ledger}
    marks = tmp_path / "marks"
    with counted_reads(client, path, marks) as reads:
        _count_reads_on_worker(os.path.abspath(path), str(marks))  # the client too
        try:
            with pytest.raises(BudgetExceededError):
                factorize(path, RANK, **kw, out=out)  # epsilon 1 > 0.5
            assert reads() == 0
            assert ledger.read_bytes() == before
            assert not os.path.lexists(out)
            assert not os.path.lexists(default_journal_path(out))
            # negative control: an accepted run on the same ledger reads every chunk
            factorize(path, RANK, **{**kw, "epsilon": 0.25}, out=out)
            assert reads() == N_CHUNKS
        finally:
            _stop_counting_on_worker()


# ---------------------------------------------------------------------------
# (4) the journal's fingerprint of a Zarr store: file names, sizes, mtimes
# ---------------------------------------------------------------------------
def _crash_after_the_journal(path: str, out: Path, ledger: Path) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        _after(FileJournal, "record_sketches")(mp)
        with pytest.raises(SimulatedCrash):
            factorize(path, RANK, **_kw("spectral", True), out=out, ledger=ledger,
                      budget=BUDGET)  # fmt: skip
    journal = Path(default_journal_path(out))
    assert (journal / "sketches.json").exists()
    return journal


@pytest.mark.timeout(120)
def test_a_rewritten_store_and_an_edit_keeping_sizes_and_mtimes_are_refused(
    client: Client, tmp_path: Path, global_seed: int
) -> None:
    """docs/faults.md, Limits: the fingerprint reads no data, so it catches a
    rewritten store but not an edit that keeps every file's size and mtime; the
    resumed pass does: its small sketches differ from the journaled ones."""
    import zarr

    A = seeded_matrix(global_seed, M, N)
    path = os.fspath(tmp_path / "A.zarr")
    # uncompressed, so that an edit of a chunk can keep its size
    z = zarr.create_array(store=path, shape=A.shape, chunks=STORE_CHUNKS,
                          dtype=A.dtype, compressors=None)  # fmt: skip
    z[...] = A
    ledger, out = tmp_path / "ledger.json", tmp_path / "release.zarr"
    journal = _crash_after_the_journal(path, out, ledger)

    # an edit that keeps sizes and mtimes passes the fingerprint, but the pass
    # that recomputes the tall sketch gives another Z: refused, nothing changes
    chunk = Path(path, "c", "1", "0")
    st = chunk.stat()
    original = chunk.read_bytes()
    raw = bytearray(original)
    raw[:8] = np.float64(123.0).tobytes()
    chunk.write_bytes(bytes(raw))
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = _snapshot(journal)
    assert not ledger.exists()  # the crash came before the charge
    with pytest.raises(StoreLayoutError, match="another exact sketch 'Z'"):
        factorize(path, RANK, **_kw("spectral", True), out=out, ledger=ledger,
                  budget=BUDGET)  # fmt: skip
    assert _snapshot(journal) == before
    assert not ledger.exists()  # refused before any charge
    assert not os.path.lexists(out)
    # negative control: with the chunk restored the same rerun resumes
    chunk.write_bytes(original)
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    rel = factorize(path, RANK, **_kw("spectral", True), out=out, ledger=ledger,
                    budget=BUDGET)  # fmt: skip
    assert rel.report["resumed_from_journal"] is True

    # a rewritten store (the same shape and chunks, other values) is refused
    out2 = tmp_path / "release2.zarr"
    journal = _crash_after_the_journal(path, out2, ledger)
    before, ledger_before = _snapshot(journal), ledger.read_bytes()
    z = zarr.open_array(store=path, mode="r+")
    z[...] = A * 2.0
    with pytest.raises(StoreLayoutError, match="input_fingerprint"):
        factorize(path, RANK, **_kw("spectral", True), out=out2, ledger=ledger,
                  budget=BUDGET)  # fmt: skip
    assert _snapshot(journal) == before
    assert ledger.read_bytes() == ledger_before
    assert not os.path.lexists(out2)
