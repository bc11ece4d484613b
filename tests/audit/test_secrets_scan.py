"""Secrets scan of full private runs on a real distributed cluster.

A private ``factorize`` and a private ``pca`` (power method, T = 2) run on a
two-process ``LocalCluster`` over small Zarr stores in which a few distinctive
values are planted, each twice: with test keys (a known sketch seed, an insecure
noise key) and with fresh secrets (a secret sketch seed and a fresh noise key,
the production path; the test learns them from the job and checks them against
the journal's ``header.json`` while the job is paused at its charge).
Everything that leaves the trusted computation is captured and scanned:

* the Dask task keys of every graph the client submitted (names the scheduler,
  the dashboard and the logs show);
* the serialized graphs themselves (task arguments as the scheduler receives them);
* DEBUG logging of dask, distributed and pipeline in the client process and on
  the workers (their loggers set to DEBUG for the scanned runs, their records
  forwarded to the client: the test checks that worker DEBUG records arrived),
  and the scheduler's and workers' log buffers;
* the progress output, the release report (JSON), the published Zarr group
  (attributes and every file), the ledger file;
* the text of the exceptions of deliberately failing runs (over budget, bad
  parameters, a truncated chunk), and the progress of a run whose input holds a
  NaN (read as a zero row, silently).

Secrets: the release noise key and every sub-key the run derives (hex and raw
bytes), the sketch seed (decimal, hex, and the little-endian bytes pickle uses);
data: the planted values as ``repr``, ``%.6g`` and raw float64 bytes.

Negative controls show the scanner finds each kind of secret when it is planted,
and that worker DEBUG records are captured only with the workers' loggers at DEBUG.
The journal of a PCA run is checked while the run is in progress (0700 / 0600)
and is gone afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import stat
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster
from distributed.protocol import serialize, to_serialize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from dist_util import start_cluster, write_matrix

from pipeline.api import factorize, pca
from pipeline.errors import BudgetExceededError, PipelineError
from pipeline.io import default_journal_path
from pipeline.jobs.engine import ReleaseJob
from pipeline.mechanisms.noise import NoiseCode, NoiseKey

pytestmark = [pytest.mark.audit, pytest.mark.distributed]

SKETCH_SEED = 0x5EC2E75EED0123456789ABCDEF  # long, so its decimal form is distinctive
NOISE_SEED_LRF = 424242
NOISE_SEED_PCA = 737373
PLANTED = (0.123456789, -0.987654321, 0.314159265358979)
BUDGET = (50.0, 1e-4)
PCA_LABELS = ("M", "H0", "Z0", "H1", "Z1")


# ---------------------------------------------------------------------------
# the scanner
# ---------------------------------------------------------------------------
def _key_patterns(name: str, key: NoiseKey) -> dict[str, bytes]:
    return {
        f"{name} (hex)": key.secret.hex().encode(),
        f"{name} (HEX)": key.secret.hex().upper().encode(),
        f"{name} (raw)": key.secret,
    }


def lrf_secrets() -> dict[str, bytes]:
    key = NoiseKey.insecure_from_seed(NOISE_SEED_LRF)
    pats = _key_patterns("factorize release key", key)
    for code in NoiseCode:
        pats |= _key_patterns(f"factorize sub-key {code.name}", key.derive(int(code)))
    return pats | _seed_patterns("sketch seed", SKETCH_SEED)


def _seed_patterns(name: str, seed: int) -> dict[str, bytes]:
    nbytes = (seed.bit_length() + 8) // 8
    return {
        f"{name} (decimal)": str(seed).encode(),
        f"{name} (hex)": format(seed, "x").encode(),
        f"{name} (raw, pickled long)": seed.to_bytes(nbytes, "little"),
    }


def pca_secrets() -> dict[str, bytes]:
    key = NoiseKey.insecure_from_seed(NOISE_SEED_PCA)
    pats = _key_patterns("pca release key", key)
    for label in PCA_LABELS:
        pats |= _key_patterns(f"pca sub-key {label}", key.derive("pca", label))
    return pats


def data_patterns() -> dict[str, bytes]:
    pats: dict[str, bytes] = {}
    for v in PLANTED:
        pats[f"data {v!r} (repr)"] = repr(v).encode()
        pats[f"data {v!r} (%.6g)"] = (f"{v:.6g}").encode()
        pats[f"data {v!r} (float64)"] = struct.pack("<d", v)
    return pats


def scan(blob: str | bytes, patterns: dict[str, bytes]) -> list[str]:
    """Names of the patterns found in ``blob`` (text is scanned as UTF-8)."""
    data = blob.encode("utf-8", "backslashreplace") if isinstance(blob, str) else blob
    return [name for name, pat in patterns.items() if pat in data]


def _text_only(patterns: dict[str, bytes]) -> dict[str, bytes]:
    """The printable patterns (for text, where raw bytes cannot occur)."""
    return {n: p for n, p in patterns.items() if "raw" not in n and "float64" not in n}


# ---------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------
class GraphRecorder:
    """Records every graph the client sends to the scheduler.

    Wraps ``Client._graph_to_futures``, the single path of ``compute``,
    ``persist`` and ``submit``: the task keys, and the serialized expression
    (the bytes the scheduler receives), plus a pickle of each materialised task.
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.blobs: list[bytes] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = Client._graph_to_futures

        def recording(client: Client, expr: Any, keys: Any, *a: Any, **kw: Any) -> Any:
            self.keys.extend(str(k) for k in keys)
            header, frames = serialize(to_serialize(expr), on_error="raise")
            self.blobs.append(pickle.dumps(header) + b"".join(map(bytes, frames)))
            try:
                graph = dict(expr.__dask_graph__())
            except Exception:  # noqa: BLE001 - expression kinds without a graph
                graph = {}
            for k, task in graph.items():
                self.keys.append(str(k))
                try:
                    self.blobs.append(pickle.dumps(task))
                except Exception:  # noqa: BLE001 - not picklable by pickle
                    import cloudpickle

                    self.blobs.append(cloudpickle.dumps(task))
            return original(client, expr, keys, *a, **kw)

        monkeypatch.setattr(Client, "_graph_to_futures", recording)


class ListHandler(logging.Handler):
    """Every record, formatted; counts the DEBUG records forwarded from workers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.worker_debug = 0

    def reset(self) -> None:
        self.lines.clear()
        self.worker_debug = 0

    def emit(self, record: logging.LogRecord) -> None:
        # a record forwarded from a worker carries the worker's address
        if getattr(record, "worker", None) and record.levelno == logging.DEBUG:
            self.worker_debug += 1
        try:
            self.lines.append(self.format(record))
        except Exception as e:  # noqa: BLE001 - a broken log call is itself a finding
            self.lines.append(f"<unformattable log record: {e!r}>")


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with start_cluster(2) as cluster, Client(cluster) as c:
        assert isinstance(cluster, LocalCluster)
        c.wait_for_workers(2, timeout=60)
        yield c


def _cluster_logs(client: Client) -> str:
    parts = [repr(client.get_scheduler_logs(n=100_000))]
    parts += [repr(v) for v in client.get_worker_logs(n=100_000).values()]
    return "\n".join(parts)


def _tree_bytes(path: Path) -> bytes:
    out = []
    for root, _, files in os.walk(path):
        for f in sorted(files):
            out.append(Path(root, f).read_bytes())
    return b"\n".join(out)


def _planted_matrix(m: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, n)) / np.sqrt(n)
    for i, v in enumerate(PLANTED):
        A[7 + 31 * i, i] = v
    return A


def _surfaces(
    rec: GraphRecorder,
    logs: ListHandler,
    client: Client,
    progress: str,
    report: dict[str, Any],
    out: Path,
    ledger: Path,
    errors: list[str],
) -> dict[str, bytes]:
    group = zarr.open_group(os.fspath(out), mode="r")
    return {
        "dask task keys": "\n".join(rec.keys).encode(),
        "serialized task graphs": b"\n".join(rec.blobs),
        "logs (client DEBUG + forwarded workers)": "\n".join(logs.lines).encode(),
        "scheduler/worker log buffers": _cluster_logs(client).encode(),
        "progress output": progress.encode(),
        "report (json)": json.dumps(report, default=str).encode(),
        "published group attrs": json.dumps(dict(group.attrs), default=str).encode(),
        "published group files": _tree_bytes(out),
        "ledger file": ledger.read_bytes(),
        "exception texts": "\n".join(errors).encode(),
    }


def _findings(
    surfaces: dict[str, bytes], patterns: dict[str, bytes]
) -> dict[str, list[str]]:
    return {
        where: hit for where, blob in surfaces.items() if (hit := scan(blob, patterns))
    }


# The serialized graphs are scanned separately from the other surfaces: workers
# regenerate the sketch tiles and the tall sketch's noise, so their tasks refer to
# the sketch seed and the Y noise sub-key -- by sealed token only.
GRAPH = "serialized task graphs"


# ---------------------------------------------------------------------------
# negative controls
# ---------------------------------------------------------------------------
def test_scanner_finds_planted_secrets() -> None:
    key = NoiseKey.insecure_from_seed(NOISE_SEED_PCA)
    sub = key.derive("pca", "Z1")
    assert scan(f"error: key={key.secret.hex()}", pca_secrets()) == [
        "pca release key (hex)"
    ]
    assert "pca sub-key Z1 (raw)" in scan(
        pickle.dumps({"x": sub.secret}), pca_secrets()
    )
    assert "sketch seed (decimal)" in scan(f"seed {SKETCH_SEED}", lrf_secrets())
    assert "sketch seed (raw, pickled long)" in scan(
        pickle.dumps(("op", SKETCH_SEED)), lrf_secrets()
    )
    assert "data 0.123456789 (%.6g)" in scan("value 0.123457 found", data_patterns())
    assert "data -0.987654321 (float64)" in scan(
        pickle.dumps(np.array([1.0, -0.987654321])), data_patterns()
    )
    assert (
        scan(
            "nothing to see: 0.5 1e-06 shape (400, 12)",
            {**pca_secrets(), **lrf_secrets(), **data_patterns()},
        )
        == []
    )


def test_scanner_finds_a_key_planted_in_a_submitted_graph(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dask

    rec = GraphRecorder()
    rec.install(monkeypatch)
    sub = NoiseKey.insecure_from_seed(NOISE_SEED_LRF).derive(int(NoiseCode.Z))
    secret = sub.secret

    @dask.delayed(pure=True)
    def touch(b: bytes) -> int:
        return len(b)

    assert client.compute(touch(secret), sync=True) == 32
    found = _findings({GRAPH: b"\n".join(rec.blobs)}, lrf_secrets())
    assert "factorize sub-key Z (raw)" in found[GRAPH]


def test_worker_debug_records_are_captured_only_when_workers_log_at_debug(
    client: Client,
) -> None:
    """Forwarding alone captures no worker DEBUG record (the workers' loggers stay
    at INFO, and ``distributed`` does not propagate to the root logger): the
    setting the scans use is what makes their worker DEBUG logs non-empty."""
    import dask

    def work() -> None:
        client.compute(dask.delayed(sum)(list(range(100))), sync=True)

    handler = ListHandler()
    logging.getLogger().addHandler(handler)
    client.forward_logging(level=logging.DEBUG)
    try:
        work()
        time.sleep(0.5)  # forwarded records arrive as events
    finally:
        client.unforward_logging()
        logging.getLogger().removeHandler(handler)
    assert handler.worker_debug == 0
    with debug_logging(client) as logs:
        work()
        time.sleep(0.5)
        assert logs.worker_debug > 0


def test_dplr_modules_log_nothing() -> None:
    """No module of the package imports ``logging`` or writes to a logger, so the
    DEBUG logs scanned here are dask's and distributed's alone. Negative control:
    the same check finds the import in this test module."""
    import ast

    import pipeline

    def logs(path: Path) -> bool:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom)
                else []
            )  # fmt: skip
            if any(n.split(".")[0] == "logging" for n in names):
                return True
        return False

    root = Path(pipeline.__file__).parent
    assert [str(p) for p in sorted(root.rglob("*.py")) if logs(p)] == []
    assert logs(Path(__file__))


# ---------------------------------------------------------------------------
# the scans
# ---------------------------------------------------------------------------
class JournalWatch(io.StringIO):
    """A progress stream that checks the journal's modes whenever it is written to."""

    def __init__(self, journal: Path) -> None:
        super().__init__()
        self.journal = journal
        self.seen = 0
        self.bad: list[str] = []

    def write(self, s: str) -> int:
        if self.journal.is_dir():
            self.seen += 1
            mode = stat.S_IMODE(os.stat(self.journal).st_mode)
            if mode != 0o700:
                self.bad.append(f"directory {oct(mode)}")
            for f in os.listdir(self.journal):
                try:
                    fm = stat.S_IMODE(os.stat(self.journal / f).st_mode)
                except FileNotFoundError:  # a temporary file renamed meanwhile
                    continue
                if fm != 0o600:
                    self.bad.append(f"{f} {oct(fm)}")
        return super().write(s)


class KeyCapture:
    """The secrets each fresh-key job drew, from the job and from its journal.

    Wraps the release job's start (every job's noise key and sketch seed, kept
    as the job holds them) and its charge (the journal on disk is read there,
    while the job is paused between its durable steps: its ``header.json``
    holds the key and the seed the release goes on to use).
    """

    def __init__(self) -> None:
        self.jobs: list[tuple[NoiseKey | None, int | None]] = []
        self.journaled: list[tuple[str, str | None]] = []

    def install(self, mp: pytest.MonkeyPatch) -> None:
        start, charge = ReleaseJob._resume_or_start, ReleaseJob.charge

        def starting(job: ReleaseJob) -> None:
            start(job)
            self.jobs.append((job.noise_key, job.sketch_seed))

        def charging(job: ReleaseJob, **kw: Any) -> None:
            charge(job, **kw)
            if job.journal is not None:
                head = json.loads(Path(job.journal.path, "header.json").read_text())
                self.journaled.append((head["noise_key"], head.get("sketch_seed")))

        mp.setattr(ReleaseJob, "_resume_or_start", starting)
        mp.setattr(ReleaseJob, "charge", charging)

    def patterns(self, kind: str) -> dict[str, bytes]:
        """Every key, sub-key and sketch seed the captured jobs drew."""
        pats: dict[str, bytes] = {}
        for i, (key, seed) in enumerate(self.jobs):
            assert key is not None
            assert not key.insecure
            pats |= _key_patterns(f"fresh key {i}", key)
            subs = [key.derive(int(c)) for c in NoiseCode] if kind == "lrf" else [
                key.derive("pca", label) for label in PCA_LABELS
            ]  # fmt: skip
            for j, sub in enumerate(subs):
                pats |= _key_patterns(f"fresh key {i} sub-key {j}", sub)
            if seed is not None:
                pats |= _seed_patterns(f"secret sketch seed {i}", seed)
        return pats


def _worker_logging(level: int | None) -> dict[str, int]:
    """On a worker: set the dask/distributed loggers' level; return the old ones."""
    names = ("distributed", "dask", "pipeline")
    old = {n: logging.getLogger(n).level for n in names}
    if level is not None:
        for n in names:
            logging.getLogger(n).setLevel(level)
    return old


@contextlib.contextmanager
def debug_logging(client: Client) -> Iterator[ListHandler]:
    """DEBUG logging in the client and on every worker, all captured in the client.

    ``distributed`` does not propagate to the root logger, so the handler is
    attached to it too, and the workers forward both loggers' records.
    """
    handler = ListHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    names = ("", "dask", "distributed", "pipeline")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.DEBUG)
    for n in ("", "distributed"):
        logging.getLogger(n).addHandler(handler)
    worker_levels = client.run(_worker_logging, logging.DEBUG)
    client.forward_logging(level=logging.DEBUG)
    client.forward_logging("distributed", level=logging.DEBUG)
    try:
        yield handler
    finally:
        client.unforward_logging()
        client.unforward_logging("distributed")
        for addr, old in worker_levels.items():
            client.run(_restore_levels, old, workers=[addr])
        for n in ("", "distributed"):
            logging.getLogger(n).removeHandler(handler)
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)


def _restore_levels(old: dict[str, int]) -> None:
    for n, lvl in old.items():
        logging.getLogger(n).setLevel(lvl)


def _lrf_run(
    tmp: Path, name: str, client: Client, logs: ListHandler, *, fresh: bool,
    algorithm: str = "auto",
) -> dict[str, Any]:
    """A private factorize and three failing ones, everything they emitted."""
    mp = pytest.MonkeyPatch()
    rec, keys = GraphRecorder(), KeyCapture()
    rec.install(mp)
    keys.install(mp)
    logs.reset()
    kw: dict[str, Any] = {} if fresh else {
        "seed": SKETCH_SEED, "insecure_noise_seed": NOISE_SEED_LRF
    }  # fmt: skip
    kw["algorithm"] = algorithm
    try:
        a = write_matrix(tmp / f"{name}.zarr", _planted_matrix(300, 40, 1), (100, 40))
        prog = io.StringIO()
        out = tmp / f"{name}-out.zarr"
        f = factorize(a, 2, epsilon=1.0, delta=1e-6, out=out, budget=BUDGET,
                      progress=prog, **kw)  # fmt: skip
        errors: list[str] = []
        with pytest.raises(BudgetExceededError) as e1:
            factorize(a, 2, epsilon=1000.0, delta=1e-6, progress=prog, **kw)
        errors.append(f"{e1.value!r} {e1.value}")
        with pytest.raises(PipelineError) as e2:
            factorize(a, 40, epsilon=1.0, delta=1e-6, progress=prog, **kw)
        errors.append(f"{e2.value!r} {e2.value}")
        bad = _planted_matrix(300, 40, 2)
        bad[150, 3] = np.nan  # a zero row, silently: its progress is scanned too
        a_bad = write_matrix(tmp / f"{name}-nan.zarr", bad, (100, 40))
        factorize(a_bad, 2, epsilon=1.0, delta=1e-6, budget=BUDGET, progress=prog, **kw)
        # a failure during the pass: a truncated chunk
        a_cut = write_matrix(tmp / f"{name}-cut.zarr", bad, (100, 40))
        chunk = Path(a_cut) / "c" / "1" / "0"
        chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
        try:
            factorize(
                a_cut, 2, epsilon=1.0, delta=1e-6, budget=BUDGET, progress=prog, **kw
            )
            errors.append("<the truncated run released>")
        except Exception as e3:  # noqa: BLE001 - its text is what is scanned
            errors.append(f"{type(e3).__name__}: {e3!r} {e3}")
    finally:
        mp.undo()
    return {
        "surfaces": _surfaces(
            rec,
            logs,
            client,
            prog.getvalue(),
            f.report,
            out,
            Path(a + ".dplr-ledger.json"),
            errors,
        ),
        "errors": errors,
        "keys": keys,
        "worker_debug": logs.worker_debug,
    }


def _pca_run(
    tmp: Path, name: str, client: Client, logs: ListHandler, *, fresh: bool
) -> dict[str, Any]:
    """A private PCA (power method, T = 2) and two failing ones."""
    mp = pytest.MonkeyPatch()
    rec, keys = GraphRecorder(), KeyCapture()
    rec.install(mp)
    keys.install(mp)
    logs.reset()
    kw: dict[str, Any] = {} if fresh else {"insecure_noise_seed": NOISE_SEED_PCA}
    common = {"delta": 1e-6, "iterations": 2, "clip_radius": 0.05, **kw}
    try:
        a = write_matrix(tmp / f"{name}.zarr", _planted_matrix(400, 12, 3), (100, 12))
        out = tmp / f"{name}-out.zarr"
        watch = JournalWatch(Path(default_journal_path(out)))
        p = pca(a, 3, epsilon=1.0, method="power", out=out, budget=BUDGET,
                progress=watch, **common)  # fmt: skip
        errors = []
        with pytest.raises(BudgetExceededError) as e4:
            pca(a, 3, epsilon=1000.0, progress=watch, **common)
        errors.append(f"{e4.value!r} {e4.value}")
        with pytest.raises(PipelineError) as e5:  # k > d (k = d is a valid PCA)
            pca(a, 13, epsilon=1.0, progress=watch, **common)
        errors.append(f"{e5.value!r} {e5.value}")
    finally:
        mp.undo()
    return {
        "surfaces": _surfaces(
            rec,
            logs,
            client,
            watch.getvalue(),
            p.report,
            out,
            Path(a + ".dplr-ledger.json"),
            errors,
        ),
        "errors": errors,
        "keys": keys,
        "journal": (watch.journal, watch.seen, watch.bad),
        "worker_debug": logs.worker_debug,
    }


#: The factorize runs: test keys, fresh keys (default algorithm), fresh keys (one pass).
LRF_RUNS = ("lrf", "lrf-fresh", "lrf-spectral-fresh")


@pytest.fixture(scope="module")
def runs(client: Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The five full runs (test keys and fresh secret keys; factorize's default and
    one-pass algorithms) and the failing runs,
    each with everything it emitted, under DEBUG logging everywhere."""
    tmp = tmp_path_factory.mktemp("secrets")
    with debug_logging(client) as logs:
        return {
            "lrf": _lrf_run(tmp, "lrf", client, logs, fresh=False),
            "lrf-fresh": _lrf_run(tmp, "lrf-fresh", client, logs, fresh=True),
            # one pass: the tall noise is drawn on the workers, from the release key
            "lrf-spectral-fresh": _lrf_run(
                tmp, "lrf-spectral-fresh", client, logs, fresh=True, algorithm="spectral"
            ),
            "pca": _pca_run(tmp, "pca", client, logs, fresh=False),
            "pca-fresh": _pca_run(tmp, "pca-fresh", client, logs, fresh=True),
        }


def _print_findings(name: str, found: dict[str, list[str]]) -> None:
    for where, hit in found.items():
        print(f"[{name}] {where}: {hit}")


def _patterns(runs: dict[str, Any], run: str) -> dict[str, bytes]:
    """The secrets of ``run``: its test key and given seed, or the fresh ones it drew."""
    if run.endswith("-fresh"):
        pats = runs[run]["keys"].patterns("pca" if run.startswith("pca") else "lrf")
    else:
        pats = lrf_secrets() if run == "lrf" else pca_secrets()
    return pats | data_patterns()


@pytest.mark.parametrize("run", LRF_RUNS)
def test_factorize_leaks_nothing_outside_the_task_graph(
    runs: dict[str, Any], run: str
) -> None:
    surfaces = {k: v for k, v in runs[run]["surfaces"].items() if k != GRAPH}
    found = _findings(surfaces, _patterns(runs, run))
    _print_findings(run, found)
    assert found == {}
    assert len(runs[run]["errors"]) == 3
    assert all(runs[run]["errors"])


@pytest.mark.parametrize("run", ["pca", "pca-fresh"])
def test_pca_leaks_nothing_outside_the_task_graph(
    runs: dict[str, Any], run: str
) -> None:
    surfaces = {k: v for k, v in runs[run]["surfaces"].items() if k != GRAPH}
    found = _findings(surfaces, _patterns(runs, run))
    _print_findings(run, found)
    assert found == {}


def test_fresh_runs_scanned_the_keys_their_journals_held(runs: dict[str, Any]) -> None:
    """The fresh-key runs used secret keys (and factorize a secret sketch seed),
    and the scanned values are those their journals held while they ran."""
    for run in ("lrf-fresh", "lrf-spectral-fresh", "pca-fresh"):
        keys = runs[run]["keys"]
        # the full run, the over-budget run, and (factorize) the NaN run (a release)
        # and the truncated-chunk run drew keys
        assert len(keys.jobs) == (4 if run.startswith("lrf") else 2), run
        assert len({k.secret for k, _ in keys.jobs}) == len(keys.jobs), run
        # read from header.json at each charge: the full run (and the NaN run's)
        assert len(keys.journaled) == (2 if run.startswith("lrf") else 1), run
        key_hex, seed_hex = keys.journaled[0]
        key, seed = keys.jobs[0]
        assert key_hex == key.secret.hex(), run
        if run.startswith("lrf"):
            assert seed is not None
            assert seed.bit_length() > 64
            assert seed_hex == format(seed, "x")
        report = json.loads(runs[run]["surfaces"]["report (json)"])
        assert report["private"] is True, run
        assert report["insecure_noise_seed"] is False, run


def test_task_graphs_hold_no_data_and_no_release_key(runs: dict[str, Any]) -> None:
    """The graphs never carry data values, the release keys, or any PCA sub-key."""
    lrf_key = _key_patterns(
        "factorize release key", NoiseKey.insecure_from_seed(NOISE_SEED_LRF)
    )
    def fresh_keys(run: str) -> dict[str, bytes]:
        return {
            n: p
            for i, (key, _) in enumerate(runs[run]["keys"].jobs)
            for n, p in _key_patterns(f"fresh key {i}", key).items()
        }

    for run, pats in (
        ("lrf", {**lrf_key, **data_patterns()}),
        ("lrf-fresh", {**fresh_keys("lrf-fresh"), **data_patterns()}),
        ("lrf-spectral-fresh", {**fresh_keys("lrf-spectral-fresh"), **data_patterns()}),
        ("pca", _patterns(runs, "pca")),
        ("pca-fresh", _patterns(runs, "pca-fresh")),
    ):
        found = _findings({GRAPH: runs[run]["surfaces"][GRAPH]}, pats)
        _print_findings(run, found)
        assert found == {}, run


@pytest.mark.parametrize("run", LRF_RUNS)
def test_factorize_task_graphs_hold_no_secret(runs: dict[str, Any], run: str) -> None:
    """Tasks carry sealed references; the seed and the tall noise key reach the
    workers in a worker plugin (pipeline.execution.secrets), not in the graph."""
    found = _findings({GRAPH: runs[run]["surfaces"][GRAPH]}, _patterns(runs, run))
    _print_findings(run, found)
    assert found == {}


@pytest.mark.parametrize("run", ["pca", "pca-fresh"])
def test_pca_journal_is_private_while_running_and_gone_after(
    runs: dict[str, Any], run: str
) -> None:
    journal, seen, bad = runs[run]["journal"]
    assert seen > 0, "the journal was never observed during the run"
    assert bad == []
    assert not os.path.lexists(journal)


def test_every_surface_was_captured(runs: dict[str, Any]) -> None:
    """The scan is not vacuous: every surface holds what it should, and the
    workers' DEBUG records were captured during every run."""
    for run in ("lrf", *LRF_RUNS[1:], "pca", "pca-fresh"):
        s = runs[run]["surfaces"]
        for where, blob in s.items():
            print(f"[{run}] {where}: {len(blob)} bytes")
        print(
            f"[{run}] DEBUG records forwarded from workers: {runs[run]['worker_debug']}"
        )
        assert runs[run]["worker_debug"] > 0, run
        assert b"dplr-" in s["dask task keys"]
        assert len(s[GRAPH]) > 10_000
        logs = s["logs (client DEBUG + forwarded workers)"]
        assert b"distributed.worker" in logs  # the workers' own records
        assert b" DEBUG " in logs
        assert s["progress output"]
        assert s["published group attrs"] != b"{}"
        assert b"release_id" in s["report (json)"]
        assert b"releases" in s["ledger file"]
        assert b"BudgetExceededError" in s["exception texts"]
    assert b"cannot be read at rows" in runs["lrf"]["surfaces"]["exception texts"]
    assert b"cannot be read at rows" in runs["lrf-fresh"]["surfaces"]["exception texts"]
    # the runs are the algorithms they stand for: two-pass by default, one pass asked for
    algorithms = {
        run: json.loads(runs[run]["surfaces"]["report (json)"])["algorithm"] for run in LRF_RUNS
    }
    assert algorithms == {"lrf": "two-pass", "lrf-fresh": "two-pass", "lrf-spectral-fresh": "spectral"}


def test_reports_state_idealized_numerics_and_not_private(runs: dict[str, Any]) -> None:
    """Every report carries the floating-point caveat; the test-key runs say NOT PRIVATE."""
    for run in (*LRF_RUNS, "pca", "pca-fresh"):
        report = json.loads(runs[run]["surfaces"]["report (json)"])
        assert '"idealized_numerics": true' in json.dumps(report), run
        assert report["private"] is run.endswith("-fresh"), run
