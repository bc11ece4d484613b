"""Secrets scan of full private runs on a real distributed cluster.

A private ``factorize`` (known sketch seed, insecure test noise key) and a private
``pca`` (power method, T = 2, insecure test noise key) run on a two-process
``LocalCluster`` over small Zarr stores in which a few distinctive values are
planted. Everything that leaves the trusted computation is captured and scanned:

* the Dask task keys of every graph the client submitted (names the scheduler,
  the dashboard and the logs show);
* the serialized graphs themselves (task arguments as the scheduler receives them);
* DEBUG logging of dask, distributed and pipeline in the client process, the
  worker logs forwarded to the client, and the scheduler's and workers' log buffers;
* the progress output, the release report (JSON), the published Zarr group
  (attributes and every file), the ledger file;
* the text of the exceptions of deliberately failing runs (over budget, bad
  parameters, non-finite input).

Secrets: the release noise key and every sub-key the run derives (hex and raw
bytes), the sketch seed (decimal, hex, and the little-endian bytes pickle uses);
data: the planted values as ``repr``, ``%.6g`` and raw float64 bytes.

Negative controls show the scanner finds each kind of secret when it is planted.
The journal of a PCA run is checked while the run is in progress (0700 / 0600)
and is gone afterwards.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import stat
import struct
import sys
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
    nbytes = (SKETCH_SEED.bit_length() + 8) // 8
    pats |= {
        "sketch seed (decimal)": str(SKETCH_SEED).encode(),
        "sketch seed (hex)": format(SKETCH_SEED, "x").encode(),
        "sketch seed (raw, pickled long)": SKETCH_SEED.to_bytes(nbytes, "little"),
    }
    return pats


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
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
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


@pytest.fixture(scope="module")
def runs(client: Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both full runs and the failing runs, each with everything it emitted."""
    tmp = tmp_path_factory.mktemp("secrets")
    mp = pytest.MonkeyPatch()
    handler = ListHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    names = ("", "dask", "distributed", "pipeline")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    client.forward_logging(level=logging.DEBUG)
    results: dict[str, Any] = {}
    try:
        # --- factorize ---------------------------------------------------
        rec = GraphRecorder()
        rec.install(mp)
        a_lrf = write_matrix(tmp / "lrf.zarr", _planted_matrix(300, 40, 1), (100, 40))
        prog = io.StringIO()
        f = factorize(
            a_lrf, 2, epsilon=1.0, delta=1e-6, seed=SKETCH_SEED,
            insecure_noise_seed=NOISE_SEED_LRF, out=tmp / "lrf-out.zarr",
            budget=BUDGET, progress=prog,
        )  # fmt: skip
        errors: list[str] = []
        with pytest.raises(BudgetExceededError) as e1:
            factorize(a_lrf, 2, epsilon=1000.0, delta=1e-6, seed=SKETCH_SEED,
                      insecure_noise_seed=NOISE_SEED_LRF, progress=prog)  # fmt: skip
        errors.append(f"{e1.value!r} {e1.value}")
        with pytest.raises(PipelineError) as e2:
            factorize(a_lrf, 40, epsilon=1.0, delta=1e-6, seed=SKETCH_SEED,
                      insecure_noise_seed=NOISE_SEED_LRF, progress=prog)  # fmt: skip
        errors.append(f"{e2.value!r} {e2.value}")
        bad = _planted_matrix(300, 40, 2)
        bad[150, 3] = np.nan
        a_bad = write_matrix(tmp / "nan.zarr", bad, (100, 40))
        try:
            factorize(a_bad, 2, epsilon=1.0, delta=1e-6, seed=SKETCH_SEED,
                      insecure_noise_seed=NOISE_SEED_LRF, budget=BUDGET, progress=prog)  # fmt: skip
            errors.append("<the NaN run released>")
        except Exception as e3:  # noqa: BLE001 - its text is what is scanned
            errors.append(f"{type(e3).__name__}: {e3!r} {e3}")
        results["lrf"] = _surfaces(
            rec, handler, client, prog.getvalue(), f.report, tmp / "lrf-out.zarr",
            Path(a_lrf + ".dplr-ledger.json"), errors,
        )  # fmt: skip
        results["lrf_errors"] = errors

        # --- pca -----------------------------------------------------------
        handler.lines.clear()
        mp.undo()
        rec = GraphRecorder()
        rec.install(mp)
        a_pca = write_matrix(tmp / "pca.zarr", _planted_matrix(400, 12, 3), (100, 12))
        out = tmp / "pca-out.zarr"
        journal = Path(default_journal_path(out))
        watch = JournalWatch(journal)
        p = pca(
            a_pca, 3, epsilon=1.0, delta=1e-6, method="power", iterations=2,
            clip_radius=0.05, insecure_noise_seed=NOISE_SEED_PCA, out=out,
            budget=BUDGET, progress=watch,
        )  # fmt: skip
        errors = []
        with pytest.raises(BudgetExceededError) as e4:
            pca(a_pca, 3, epsilon=1000.0, delta=1e-6, iterations=2, clip_radius=0.05,
                insecure_noise_seed=NOISE_SEED_PCA, progress=watch)  # fmt: skip
        errors.append(f"{e4.value!r} {e4.value}")
        with pytest.raises(PipelineError) as e5:
            pca(a_pca, 12, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.05,
                insecure_noise_seed=NOISE_SEED_PCA, progress=watch)  # fmt: skip
        errors.append(f"{e5.value!r} {e5.value}")
        results["pca"] = _surfaces(
            rec, handler, client, watch.getvalue(), p.report, out,
            Path(a_pca + ".dplr-ledger.json"), errors,
        )  # fmt: skip
        results["pca_journal"] = (journal, watch.seen, watch.bad)
    finally:
        mp.undo()
        client.unforward_logging()
        logging.getLogger().removeHandler(handler)
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)
    return results


def _print_findings(name: str, found: dict[str, list[str]]) -> None:
    for where, hit in found.items():
        print(f"[{name}] {where}: {hit}")


def test_factorize_leaks_nothing_outside_the_task_graph(runs: dict[str, Any]) -> None:
    surfaces = {k: v for k, v in runs["lrf"].items() if k != GRAPH}
    found = _findings(surfaces, {**lrf_secrets(), **data_patterns()})
    _print_findings("factorize", found)
    assert found == {}
    assert len(runs["lrf_errors"]) == 3
    assert all(runs["lrf_errors"])


def test_pca_leaks_nothing_outside_the_task_graph(runs: dict[str, Any]) -> None:
    surfaces = {k: v for k, v in runs["pca"].items() if k != GRAPH}
    found = _findings(surfaces, {**pca_secrets(), **data_patterns()})
    _print_findings("pca", found)
    assert found == {}


def test_task_graphs_hold_no_data_and_no_release_key(runs: dict[str, Any]) -> None:
    """The graphs never carry data values, the release keys, or any PCA sub-key."""
    lrf_key = _key_patterns(
        "factorize release key", NoiseKey.insecure_from_seed(NOISE_SEED_LRF)
    )
    for run, pats in (
        ("lrf", {**lrf_key, **data_patterns()}),
        ("pca", {**pca_secrets(), **data_patterns()}),
    ):
        found = _findings({GRAPH: runs[run][GRAPH]}, pats)
        _print_findings(run, found)
        assert found == {}, run


def test_factorize_task_graphs_hold_no_secret(runs: dict[str, Any]) -> None:
    """Tasks carry sealed references; the seed and the tall noise key reach the
    workers in a worker plugin (pipeline.execution.secrets), not in the graph."""
    found = _findings({GRAPH: runs["lrf"][GRAPH]}, lrf_secrets())
    _print_findings("factorize", found)
    assert found == {}


def test_pca_journal_is_private_while_running_and_gone_after(
    runs: dict[str, Any],
) -> None:
    journal, seen, bad = runs["pca_journal"]
    assert seen > 0, "the journal was never observed during the run"
    assert bad == []
    assert not os.path.lexists(journal)


def test_every_surface_was_captured(runs: dict[str, Any]) -> None:
    """The scan is not vacuous: every surface holds what it should."""
    for run in ("lrf", "pca"):
        for where, blob in runs[run].items():
            print(f"[{run}] {where}: {len(blob)} bytes")
        s = runs[run]
        assert b"dplr-" in s["dask task keys"]
        assert len(s[GRAPH]) > 10_000
        assert b"DEBUG" in s["logs (client DEBUG + forwarded workers)"]
        assert s["progress output"]
        assert s["published group attrs"] != b"{}"
        assert b"release_id" in s["report (json)"]
        assert b"releases" in s["ledger file"]
        assert b"BudgetExceededError" in s["exception texts"]
    assert b"NonFiniteInputError" in runs["lrf"]["exception texts"]


def test_reports_state_idealized_numerics_and_not_private(runs: dict[str, Any]) -> None:
    """Both reports carry the floating-point caveat and the insecure-key stamp."""
    for run in ("lrf", "pca"):
        report = json.loads(runs[run]["report (json)"])
        assert '"idealized_numerics": true' in json.dumps(report), run
        assert report["private"] is False, run
