"""Secrets scan of a private stream and a nightly run on a real two-process cluster.

The stream is created with a known sketch seed and an insecure test noise key;
batches with planted values are ingested and released with their epochs sketched
on the cluster (``stream_release`` with a client, and ``run_nightly`` whose job
names the cluster's scheduler). Scanned for the sketch seed, the stream's noise key and every tree-node
sub-key the releases use, and for the planted values: the task keys and the
serialized graphs the clients submitted (here the sketch seed must be absent too:
it reaches the workers in a worker plugin, not in task arguments), DEBUG logs of
client, scheduler and workers, the printed progress, the release reports and
files, the ledger, and the texts of failing runs.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distributed import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from dist_util import start_cluster
from test_secrets_scan import (
    GRAPH,
    GraphRecorder,
    ListHandler,
    _cluster_logs,
    _findings,
    _key_patterns,
    _print_findings,
    _tree_bytes,
    scan,
)

from pipeline.algorithms.continual import tree_nodes
from pipeline.errors import PipelineError
from pipeline.io.batches import write_batch
from pipeline.jobs.nightly import run_nightly
from pipeline.jobs.stream import stream_ingest, stream_init, stream_release
from pipeline.mechanisms.noise import NoiseCode, NoiseKey

pytestmark = [pytest.mark.audit, pytest.mark.distributed]

SKETCH_SEED = 0x57E4A55EED0FEDCBA987654321  # distinctive in decimal and hex
NOISE_SEED = 515151
PLANTED = (0.0123456789, -0.0987654321)  # small: inside the clip norm, so they survive clipping
SHAPE = (3000, 160)  # several operator tiles of rows: the batch is split across workers
EPOCHS = 3


def stream_secrets() -> dict[str, bytes]:
    key = NoiseKey.insecure_from_seed(NOISE_SEED)
    pats = _key_patterns("stream noise key", key)
    for tau in range(1, EPOCHS + 1):
        for level, node in tree_nodes(tau):
            for code in (NoiseCode.Y, NoiseCode.Z):
                sub = key.derive("tree", int(code), level, node)
                pats |= _key_patterns(f"node key {code.name}/{level}/{node}", sub)
        for code in (NoiseCode.Y, NoiseCode.Z):  # a factorization's noise of epoch tau
            sub = key.derive("epoch", int(code), tau)
            pats |= _key_patterns(f"epoch key {code.name}/{tau}", sub)
    nbytes = (SKETCH_SEED.bit_length() + 8) // 8
    return pats | {
        "sketch seed (decimal)": str(SKETCH_SEED).encode(),
        "sketch seed (hex)": format(SKETCH_SEED, "x").encode(),
        "sketch seed (raw, pickled long)": SKETCH_SEED.to_bytes(nbytes, "little"),
    }


def planted_patterns() -> dict[str, bytes]:
    import struct

    pats: dict[str, bytes] = {}
    for v in PLANTED:
        pats[f"data {v!r} (repr)"] = repr(v).encode()
        pats[f"data {v!r} (%.6g)"] = f"{v:.6g}".encode()
        pats[f"data {v!r} (float64)"] = struct.pack("<d", v)
    return pats


def _batch(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, SHAPE[0], 600)
    s = rng.normal(size=600) * 0.01
    s[:2] = PLANTED
    write_batch(path, {"entity": i, "i": i, "j": rng.integers(0, SHAPE[1], 600), "s": s})


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with start_cluster(2) as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


@pytest.fixture(scope="module")
def run(client: Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("stream-secrets")
    mp = pytest.MonkeyPatch()
    rec = GraphRecorder()
    rec.install(mp)
    handler = ListHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    names = ("", "dask", "distributed", "pipeline")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    client.forward_logging(level=logging.DEBUG)
    printed: list[str] = []
    errors: list[str] = []
    try:
        state = tmp / "s.stream"
        stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=3, horizon=8, epsilon=1.0,
                    delta=1e-6, unit="row", seed=SKETCH_SEED, insecure_noise_seed=NOISE_SEED,
                    ledger=tmp / "population.dplr-ledger.json", budget=(1.0, 1e-6))
        _batch(tmp / "b1.parquet", 1)
        printed.append(json.dumps(stream_ingest(state, tmp / "b1.parquet", epoch=1)))
        # closing the epoch sketches its cells on the workers
        f1, _ = stream_release(state, epoch=1, out=tmp / "r1.zarr", client=client)
        # the nightly job sketches on the same cluster through its scheduler address
        for k, day in enumerate(("2027-01-02", "2027-01-03")):
            (tmp / "inbox" / day).mkdir(parents=True)
            _batch(tmp / "inbox" / day / "b.parquet", 10 + k)
        (tmp / "job.toml").write_text(
            f'[stream]\nstate = "s.stream"\nstart_date = 2027-01-01\n[input]\ninbox = "inbox/{{date}}"\n'
            f'[output]\nreleases = "releases"\n[cluster]\nscheduler = "{client.scheduler.address}"\n'
        )
        run_nightly(tmp / "job.toml", __import__("datetime").date(2027, 1, 3), say=printed.append)
        # failing runs: a bad batch holding the planted values, an epoch beyond the horizon
        bad = tmp / "bad.npz"
        write_batch(bad, {"entity": np.array([1, 2]), "i": np.array([1, SHAPE[0]]), "j": np.array([0, 1]),
                          "s": np.array(PLANTED)})
        for call in (
            lambda: stream_ingest(state, bad, epoch=4),
            lambda: stream_ingest(state, tmp / "b1.parquet", epoch=9),
            lambda: stream_release(state, epoch=2, out=tmp / "again.zarr"),
        ):
            with pytest.raises(PipelineError) as exc:
                call()
            errors.append(f"{exc.value!r} {exc.value}")
        reports = [f1.report]
        from pipeline.io.release import read_release

        reports += [read_release(tmp / "releases" / f"2027-01-0{d}.zarr").report for d in (2, 3)]
        surfaces = {
            "dask task keys": "\n".join(rec.keys).encode(),
            GRAPH: b"\n".join(rec.blobs),
            "logs (client DEBUG + forwarded workers)": "\n".join(handler.lines).encode(),
            "scheduler/worker log buffers": _cluster_logs(client).encode(),
            "printed output": "\n".join(printed).encode(),
            "release reports": json.dumps(reports, default=str).encode(),
            "published groups": _tree_bytes(tmp / "r1.zarr") + _tree_bytes(tmp / "releases"),
            "ledger file": (tmp / "population.dplr-ledger.json").read_bytes(),
            "exception texts": "\n".join(errors).encode(),
        }
        surfaces["_n_graphs"] = str(len(rec.blobs)).encode()
        surfaces["_n_keys"] = str(len(rec.keys)).encode()
        return surfaces
    finally:
        mp.undo()
        client.unforward_logging()
        logging.getLogger().removeHandler(handler)
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)


def test_stream_run_leaks_no_secret_and_no_data_anywhere(run: dict[str, Any]) -> None:
    surfaces = {k: v for k, v in run.items() if not k.startswith("_")}
    found = _findings(surfaces, {**stream_secrets(), **planted_patterns()})
    _print_findings("stream", found)
    assert found == {}


def test_the_scan_saw_the_cluster_work(run: dict[str, Any]) -> None:
    """Negative control of coverage: tasks were submitted, logs and outputs captured."""
    assert int(run["_n_graphs"]) >= 2
    assert int(run["_n_keys"]) >= 2
    assert b"epoch 3/8" in run["printed output"]
    assert run["published groups"]
    assert run["exception texts"].count(b"Error") >= 3
    # the scanner finds the seed when it is there: the state's secrets file has it
    assert scan(format(SKETCH_SEED, "x").encode() + b" " + str(SKETCH_SEED).encode(), stream_secrets())
