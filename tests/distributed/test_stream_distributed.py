"""Stream batches sketched on a real two-worker cluster agree with the in-process sketch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from dist_util import (
    arm_self_kill,
    disarm_self_kill,
    process_is_dead,
    wait_for_replacement,
)
from distributed import Client

from pipeline.algorithms.continual import (
    operators,
    partition_cells,
    plan_stream,
    sketch_cells,
    sum_deltas,
)
from pipeline.execution.stream import sketch_partitions
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    epoch_sketch,
    open_stream,
    plan_of,
    stream_ingest,
    stream_init,
    stream_release,
)
from pipeline.params import Algorithm, LrfParams

pytestmark = pytest.mark.distributed

SHAPE = (5000, 300)  # several operator tiles of rows, so batches are split across workers
SEED = 31337
# The parts' column blocks are summed in another grouping than one in-process
# product: a few ulps of the largest entry (the acceptance bound is 1e-10).
SUM_ORDER_RTOL = 1e-12


def _cells(n: int, seed: int):
    rng = np.random.default_rng(seed)
    r = np.sort(rng.integers(0, SHAPE[0], n))
    return r, rng.integers(0, SHAPE[1], n), rng.normal(size=n)


@pytest.mark.parametrize("alg", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])  # streams: one pass
def test_partitions_on_workers_equal_the_local_sketch(client: Client, alg: Algorithm):
    plan = plan_stream(LrfParams(algorithm=alg, rank=3, epsilon=1.0, delta=1e-6), SHAPE, 8)
    r, c, v = _cells(20000, 1)
    if plan.lrf.transpose:
        r, c = c, r
        o = np.argsort(r, kind="stable")
        r, c, v = r[o], c[o], v[o]
    parts = partition_cells(r, c, v, 4, plan.lrf.params.tile_size)
    assert len(parts) >= 2
    remote = sum_deltas(plan, sketch_partitions(plan, SEED, parts, client))
    local = sum_deltas(plan, [sketch_cells(plan, operators(plan, SEED), r, c, v)])
    for name in local:
        scale = np.abs(local[name]).max()
        np.testing.assert_allclose(remote[name], local[name], rtol=0, atol=SUM_ORDER_RTOL * scale)
    # the plugin that carried the seed is gone from the workers afterwards
    def held() -> int:
        from pipeline import _sealed

        return len(_sealed._REGISTRY)

    assert set(client.run(held).values()) == {0}


def test_closing_an_epoch_on_the_cluster_equals_closing_it_in_process(client: Client, tmp_path: Path):
    rng = np.random.default_rng(2)
    for k in range(2):  # two batches: the epoch's cells are sketched together
        i = rng.integers(0, SHAPE[0], 15000)
        write_batch(tmp_path / f"b{k}.npz", {"entity": i, "i": i, "j": rng.integers(0, SHAPE[1], 15000),
                                             "s": rng.normal(size=15000) * 0.01})
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=3, horizon=4, epsilon=1.0, delta=1e-6,
                unit="row", seed=SEED, insecure_noise_seed=5,
                ledger=tmp_path / "population.dplr-ledger.json", budget=(1.0, 1e-6))
    for k in range(2):
        stream_ingest(state, tmp_path / f"b{k}.npz", epoch=1)
    store = open_stream(state)
    plan = plan_of(store.manifest)
    local, remote = epoch_sketch(store, plan, 1), epoch_sketch(store, plan, 1, client)
    for name in local:
        scale = np.abs(local[name]).max()
        np.testing.assert_allclose(remote[name], local[name], rtol=0, atol=SUM_ORDER_RTOL * scale)
    copy = tmp_path / "copy.stream"
    import shutil

    shutil.copytree(state, copy)
    fa, _ = stream_release(state, epoch=1, out=tmp_path / "a.zarr")
    fb, _ = stream_release(copy, epoch=1, out=tmp_path / "b.zarr", client=client)
    np.testing.assert_allclose(fa.S, fb.S, rtol=1e-9)


def test_a_worker_killed_during_an_ingest_changes_nothing(client: Client, tmp_path: Path):
    """Parts lost with their worker are scattered and run again on a live worker.

    One worker SIGKILLs itself when it starts sketching a part (a hook in place
    of the kernel, on that worker only), after the seed was installed and the
    cells scattered: the kill lands in the sketch phase, which the record proves.
    """
    plan = plan_stream(LrfParams(algorithm=Algorithm.SPECTRAL, rank=3, epsilon=1.0, delta=1e-6), SHAPE, 8)
    r, c, v = _cells(20000, 3)
    parts = partition_cells(r, c, v, 4, plan.lrf.params.tile_size)
    assert len(parts) >= 2  # scattered round-robin: each of the 2 workers holds a part
    local = sum_deltas(plan, [sketch_cells(plan, operators(plan, SEED), *p) for p in parts])
    addr = min(client.run(os.getpid))  # a worker that answers
    record = tmp_path / "kill.json"
    hook = ("pipeline.execution.stream", "sketch_cells")
    pid = client.run(arm_self_kill, *hook, str(record), "sketch", workers=[addr])[addr]
    try:
        remote = sum_deltas(plan, sketch_partitions(plan, SEED, parts, client))
    finally:
        if not record.exists():
            client.run(disarm_self_kill, *hook, workers=[addr])
    # the kill happened, in the sketch of a part, with the seed installed
    assert record.exists(), "no worker was killed while it sketched a part"
    landed = json.loads(record.read_text())
    assert landed["phase"] == "sketch"
    assert landed["pid"] == pid
    assert landed["secrets_held"] >= 1
    assert process_is_dead(pid)
    wait_for_replacement(client, pid, 2)
    for name in local:
        scale = np.abs(local[name]).max()
        np.testing.assert_allclose(remote[name], local[name], rtol=0, atol=SUM_ORDER_RTOL * scale)
