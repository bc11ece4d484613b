"""Scaling measurements: graph sizes, bytes to the client, per-chunk costs.

Usage::

    python benchmarks/bench_scaling.py              # everything (a few minutes on 2 cores)
    python benchmarks/bench_scaling.py --quick      # 10^3 and 10^4 chunks only, no cluster run

Results in ``benchmarks/results/scaling.json|md``; ``docs/scaling.md`` interprets them.

1. **Graphs, without reading data.** The real ``DaskSource.sketch`` (factorize, one pass) and
   ``DaskRowSource._pass`` (PCA, Gram and power passes) are driven with a *recording client*:
   an object with ``persist``/``compute`` that captures the collections and returns
   placeholders of the right shape instead of running anything. The input is ``da.zeros``
   with 10^3, 10^4, 10^5 chunks of 100 x 1000 float32 (one column block), so nothing is read.
   Reported: tasks of the pipeline's own layer and of the whole graph (input layer
   included, which stands for the one-task-per-chunk Zarr read), construction time (the
   ``sketch`` / ``_pass`` call: building the layer dict and the HighLevelGraph), and the pickled
   size of the materialised graph, ``len(pickle.dumps(dict(graph)))`` (stdlib pickle,
   protocol 5) and distributed's ``distributed.protocol.pickle.dumps`` (what the client
   uses to ship a graph to the scheduler).
2. **Bytes.** Sizes of the objects gathered to the client per pass and of each task result
   travelling up the reduction trees, from the captured graph's chunk metadata.
3. **Per-chunk costs** with single-threaded BLAS (a worker thread): ``block_partials`` on a
   10000 x 1000 float32 chunk (k = 10, private defaults t = 40, v = 160, row clipping),
   ``band_pass`` on 131072 x 64 and 16000 x 1000 float32 bands, zstd decode of one stored
   chunk (MB/s of decoded data), and the same chunk read through zarr.
4. **Scheduler overhead** (not with ``--quick``): a real 2-worker LocalCluster runs the
   PCA Gram pass over ``--scheduler-chunks`` tiny ``da.zeros`` chunks (twice, after a
   warm-up); wall time / tasks is the per-task cost of scheduling on this machine. At about
   3 ms per task on 2 cores the default 10^4 chunks takes minutes; the recorded run used
   ``--scheduler-chunks 2000``.

Nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

RESULTS = os.path.join(_common.HERE, "results")


# -- a client that records instead of computing -------------------------------------------
class _Placeholder:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def result(self) -> np.ndarray:
        return np.zeros(self.shape)


class RecordingClient:
    """Stands in for ``distributed.Client``: captures collections, computes nothing."""

    def __init__(self) -> None:
        self.persisted: list[Any] = []
        self.computed: list[Any] = []

    def persist(self, collections: Any) -> Any:
        many = isinstance(collections, list)
        items = collections if many else [collections]
        self.persisted.extend(items)
        # a real client returns arrays backed by one future per output chunk, which
        # futures_of() (the progress hook) scans cheaply; placeholders keep that cost
        # out of the construction time (they hold no futures: no progress bar)
        out = [_Placeholder(c.shape) for c in items]
        return out if many else out[0]

    def compute(self, collections: Any, sync: bool = False) -> Any:
        many = isinstance(collections, list)
        items = collections if many else [collections]
        self.computed.extend(items)
        out = [np.zeros(c.shape) if sync else _Placeholder(c.shape) for c in items]
        return out if many else out[0]


def _graph_stats(collections: list[Any], own_prefixes: tuple[str, ...]) -> dict[str, Any]:
    from distributed.protocol.pickle import dumps as dist_dumps

    graph: dict[Any, Any] = {}
    for c in collections:
        graph.update(dict(c.__dask_graph__()))
    own = {
        k: v
        for k, v in graph.items()
        if (k[0] if isinstance(k, tuple) else k).startswith(own_prefixes)
    }
    t0 = time.perf_counter()
    pk = pickle.dumps(graph, protocol=5)
    t_pickle = time.perf_counter() - t0
    own_pk = pickle.dumps(own, protocol=5)
    t0 = time.perf_counter()
    try:
        dk = len(dist_dumps(graph))
    except Exception as e:  # noqa: BLE001 - report, do not fail the run
        dk = f"failed: {type(e).__name__}"
    t_dist = time.perf_counter() - t0
    return {
        "tasks_total": len(graph),
        "tasks_pipeline": len(own),
        "pickle_bytes_total": len(pk),
        "pickle_bytes_pipeline": len(own_pk),
        "pickle_bytes_per_pipeline_task": len(own_pk) / max(len(own), 1),
        "pickle_seconds": t_pickle,
        "distributed_pickle_bytes_total": dk,
        "distributed_pickle_seconds": t_dist,
    }


def _gather_placeholders(client: Any, arrays: Any, persisted: bool = False) -> list[np.ndarray]:
    """Stands in for ``gather_blocks`` with a recording client: zeros of each shape."""
    return [np.zeros(a.shape) for a in arrays]


def factorize_graph(
    n_chunks: int, rows: int = 100, cols: int = 1000, k: int = 10, *, zarr_path: bool = False
) -> dict[str, Any]:
    """``zarr_path``: as ``dplr factorize STORE --out OUT`` runs it -- the pass tasks
    read their chunks themselves (a stand-in reader: nothing is read) and write Y
    to a scratch directory (none is touched while the graph is only built)."""
    import dask.array as da

    import pipeline.execution.source as source_module

    source_module.gather_blocks = _gather_placeholders  # nothing runs: nothing to gather

    from pipeline.algorithms.lrf import pass_request, plan_lrf
    from pipeline.execution.source import DaskSource
    from pipeline.params import Algorithm, LrfParams

    m = n_chunks * rows
    A = da.zeros((m, cols), chunks=(rows, cols), dtype=np.float32)
    plan = plan_lrf(
        LrfParams(algorithm=Algorithm.SPECTRAL, rank=k, epsilon=1.0, delta=1e-7), (m, cols)
    )
    request = pass_request(plan, root=12345, input_dtype=np.float32)
    client = RecordingClient()
    if zarr_path:
        src = DaskSource(A, client, reader=object(), scratch=tempfile.gettempdir())
    else:
        src = DaskSource(A, client)
    t0 = time.perf_counter()
    result = src.sketch(request)
    t_build = time.perf_counter() - t0
    stats = _graph_stats(client.persisted, ("dplr-",))
    if zarr_path:  # no input layer: the pass tasks read the store
        stats["tasks_total"] = stats["tasks_pipeline"]
    # bytes: what each task result weighs, and what is gathered
    Y = result["Y"] if zarr_path else client.persisted[[n for n, _ in request.right].index("Y")]
    Z_shape = result["Z"].shape
    y_leaf = rows * plan.t * 8
    z_leaf = plan.v * cols * 8
    return {
        "chunks": n_chunks,
        "chunk_shape": [rows, cols],
        "zarr_path_with_scratch": zarr_path,
        "shape": [m, cols],
        "t": plan.t,
        "v": plan.v,
        "construction_seconds": t_build,
        "sketch_n_tasks_counter": src.n_tasks,
        **stats,
        "gathered_to_client": {"Z": {"shape": list(Z_shape), "bytes": int(np.prod(Z_shape)) * 8}},
        "kept_distributed": {
            "Y": {"shape": list(Y.shape), "bytes": int(np.prod(Y.shape)) * 8, "blocks": Y.numblocks[0]}
        },
        "partial_bytes_per_leaf": {"Y_part": y_leaf, "Z_part": z_leaf, "tuple": y_leaf + z_leaf},
        "Z_tree_leaves_bytes": n_chunks * (y_leaf + z_leaf),
    }


def pca_graph(n_chunks: int, rows: int = 100, d: int = 1000, k: int = 10) -> dict[str, Any]:
    import dask.array as da

    from pipeline.execution.pca import DaskRowSource

    A = da.zeros((n_chunks * rows, d), chunks=(rows, d), dtype=np.float32)
    out: dict[str, Any] = {"chunks": n_chunks, "chunk_shape": [rows, d], "k": k}
    X = np.linalg.qr(np.random.default_rng(0).standard_normal((d, k)))[0]
    for kind in ("gram", "update"):
        client = RecordingClient()
        src = DaskRowSource(A, client)
        t0 = time.perf_counter()
        if kind == "gram":
            src.gram()
            shape = (d, d)
        else:
            src.power_step(X, [(np.eye(k), 0.05)])
            shape = (d, k)
        t_build = time.perf_counter() - t0
        stats = _graph_stats(client.computed, ("dplr-",))
        out[kind] = {
            "construction_seconds": t_build,
            **stats,
            "to_client_bytes": shape[0] * shape[1] * 8,
            "partial_bytes_per_leaf": shape[0] * shape[1] * 8,
            "tree_leaves_bytes": n_chunks * shape[0] * shape[1] * 8,
        }
    return out


# -- per-chunk costs ------------------------------------------------------------------------
def _best(fn: Any, reps: int) -> list[float]:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def chunk_costs(reps: int) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from pipeline.algorithms.lrf import pass_request, plan_lrf
    from pipeline.algorithms.pca import band_pass
    from pipeline.params import Algorithm, LrfParams
    from pipeline.sketches.apply import block_partials

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    with threadpool_limits(1):
        m, n, k = 10_000_000, 1000, 10  # the chunk's position in a tall matrix
        plan = plan_lrf(
            LrfParams(algorithm=Algorithm.SPECTRAL, rank=k, epsilon=1.0, delta=1e-7), (m, n)
        )
        req = pass_request(plan, root=12345, input_dtype=np.float32)
        blk = (rng.standard_normal((10_000, n)) / np.sqrt(n)).astype(np.float32)
        ts = _best(lambda: block_partials(blk, 5_000_000, 0, req, where="chunk"), reps)
        out["block_partials_10000x1000_f32"] = {
            "t": plan.t,
            "v": plan.v,
            "seconds": _common.summary(ts),
            "MB_per_s": blk.nbytes / 1e6 / min(ts),
        }
        X = np.linalg.qr(rng.standard_normal((64, 2)))[0]
        for r, d, kk in ((131072, 64, 2), (16000, 1000, 10)):
            band = (rng.standard_normal((r, d)) / np.sqrt(d)).astype(np.float32)
            X = np.linalg.qr(rng.standard_normal((d, kk)))[0]
            res: dict[str, Any] = {}
            for kind, payload in (("gram", None), ("update", (X, [(np.eye(kk), 0.05)]))):
                ts = _best(lambda kind=kind, payload=payload, band=band: band_pass(band, kind, payload, 1.0, True), reps)
                res[kind] = {"seconds": _common.summary(ts), "MB_per_s": band.nbytes / 1e6 / min(ts)}
            out[f"band_pass_{r}x{d}_f32_k{kk}"] = res
    return out


def zstd_costs(reps: int) -> dict[str, Any]:
    import zarr
    from numcodecs import Zstd

    path = _common.store_path(200_000, 1000, 10_000)
    made = None
    if not os.path.exists(path):  # write a small store of the same chunking
        made = tempfile.TemporaryDirectory()
        path = os.path.join(made.name, "s.zarr")
        z = zarr.create_array(path, shape=(20_000, 1000), chunks=(10_000, 1000), dtype="float32")
        z[:] = (np.random.default_rng(0).standard_normal((20_000, 1000)) / 30).astype(np.float32)
    z = zarr.open_array(path, mode="r")
    meta = z.metadata.to_dict()
    level = next((c["configuration"].get("level") for c in meta["codecs"] if c["name"] == "zstd"), None)
    raw_file = os.path.join(path, "c", "0", "0")
    with open(raw_file, "rb") as f:
        comp = f.read()
    codec = Zstd(level=level or 0)
    dec = codec.decode(comp)
    n_dec = len(dec)
    ts = _best(lambda: codec.decode(comp), reps)
    tz = _best(lambda: np.asarray(z[0 : z.chunks[0], :]), reps)
    out = {
        "store_chunk": list(z.chunks),
        "zstd_level": level,
        "compressed_bytes": len(comp),
        "decoded_bytes": n_dec,
        "ratio": n_dec / len(comp),
        "decode_seconds": _common.summary(ts),
        "decode_MB_per_s": n_dec / 1e6 / min(ts),
        "zarr_read_seconds": _common.summary(tz),
        "zarr_read_MB_per_s": n_dec / 1e6 / min(tz),
        "source": "existing benchmark store" if made is None else "temporary store",
    }
    if made is not None:
        made.cleanup()
    return out


def scheduler_overhead(n_chunks: int) -> dict[str, Any]:
    import dask.array as da

    from pipeline.execution.pca import DaskRowSource

    cluster, client = _common.start_cluster(2)
    try:
        A = da.zeros((n_chunks * 10, 64), chunks=(10, 64), dtype=np.float32)
        src = DaskRowSource(A, client)
        src.gram()  # warm-up
        ts = []
        for _ in range(2):
            before = src.n_tasks
            t0 = time.perf_counter()
            src.gram()
            ts.append(time.perf_counter() - t0)
            tasks = src.n_tasks - before + n_chunks  # + the input layer's tasks
        return {
            "chunks": n_chunks,
            "tasks": tasks,
            "seconds": _common.summary(ts),
            "us_per_task": min(ts) / tasks * 1e6,
            "cluster": "LocalCluster, 2 worker processes x 1 thread",
        }
    finally:
        client.close()
        cluster.close()


def _tiny_store(path: str, n_chunks: int, rows: int, cols: int) -> str:
    """A Zarr array of ``n_chunks`` row chunks of rows x cols float32 (reused)."""
    import dask.array as da
    import zarr

    if os.path.exists(path):
        z = zarr.open_array(path, mode="r")
        if z.shape == (n_chunks * rows, cols) and z.chunks == (rows, cols):
            return path
    rng = da.random.default_rng(0)
    A = rng.standard_normal((n_chunks * rows, cols), chunks=(rows * 1000, cols))
    z = zarr.create_array(store=path, shape=A.shape, chunks=(rows, cols), dtype="float32",
                          overwrite=True)  # fmt: skip
    (A / np.sqrt(cols)).astype(np.float32).store(z, lock=False)
    return path


def versus_dask(
    n_chunks: int, rows: int, cols: int, workdir: str, reps: int = 2, warmup: bool = True
) -> dict[str, Any]:
    """Wall time of one pass, dplr vs dask's ``svd_compressed``, on one Zarr store.

    A 2-worker LocalCluster (1 thread each). dplr: one factorize pass
    (``DaskSource.sketch`` with the store's reader, private defaults at k = 10)
    and one PCA Gram pass (``DaskRowSource.gram`` over ``open_input``'s bands).
    dask: ``svd_compressed(da.from_zarr(path), k=10)`` computed once, divided by
    its 2 passes over A. Best of ``reps`` (after a warm-up unless ``--no-warmup``);
    per chunk = wall / chunks.
    """
    import dask
    import dask.array as da

    from pipeline.algorithms.lrf import pass_request, plan_lrf
    from pipeline.api import PCA_BAND_BYTES
    from pipeline.execution.pca import DaskRowSource
    from pipeline.execution.source import DaskSource
    from pipeline.io import open_input
    from pipeline.params import Algorithm, LrfParams

    path = _tiny_store(os.path.join(workdir, f"tiny_{n_chunks}x{rows}x{cols}.zarr"),
                       n_chunks, rows, cols)  # fmt: skip
    m = n_chunks * rows
    plan = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=10, epsilon=1.0,
                              delta=1e-7), (m, cols))  # fmt: skip
    request = pass_request(plan, root=12345, input_dtype=np.float32)
    cluster, client = _common.start_cluster(2)
    out: dict[str, Any] = {"chunks": n_chunks, "chunk_shape": [rows, cols]}
    try:
        def ours_lrf() -> int:
            A, info = open_input(path, unit="row")
            src = DaskSource(A, client, reader=info.reader)
            src.sketch(request)
            src.close()
            return src.n_tasks

        def ours_pca() -> int:
            A, _info = open_input(path, unit=None, band_bytes=PCA_BAND_BYTES)
            src = DaskRowSource(A, client)
            src.gram()
            return src.n_tasks + A.numblocks[0]  # + the band reads

        def svdc() -> int:
            A = da.from_zarr(path)
            u, s_, v = da.linalg.svd_compressed(A, k=10, seed=0)
            dask.compute(u, s_, v)
            graph: dict[Any, Any] = {}
            for x in (u, s_, v):
                graph.update(dict(x.__dask_graph__()))
            return len(graph)

        for name, fn, passes in (("dplr_factorize", ours_lrf, 1), ("dplr_pca_gram", ours_pca, 1),
                                 ("dask_svd_compressed", svdc, 2)):  # fmt: skip
            if warmup:
                fn()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                tasks = fn()
                ts.append(time.perf_counter() - t0)
            out[name] = {"seconds": _common.summary(ts), "passes": passes, "tasks": tasks,
                         "tasks_per_chunk": tasks / n_chunks,
                         "ms_per_chunk_per_pass": min(ts) / passes / n_chunks * 1e3}  # fmt: skip
            print(f"  {name}: {min(ts):.2f} s, {tasks} tasks", flush=True)
        ref = out["dask_svd_compressed"]["ms_per_chunk_per_pass"]
        for name in ("dplr_factorize", "dplr_pca_gram"):
            out[name]["ratio_to_dask_pass"] = out[name]["ms_per_chunk_per_pass"] / ref
    finally:
        client.close()
        cluster.close()
    return out


# -- report --------------------------------------------------------------------------------
def _mb(x: float) -> str:
    return f"{x / 1e6:,.2f}"


def versus_markdown(rows: list[dict[str, Any]]) -> list[str]:
    L = ["", "## One pass against dask's svd_compressed (LocalCluster, 2 workers x 1 thread)", "",
         "| chunks | chunk | method | tasks | tasks/chunk | best wall s | passes | ms per chunk per pass | ratio to dask |",
         "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for v in rows:
        for name in ("dplr_factorize", "dplr_pca_gram", "dask_svd_compressed"):
            r = v[name]
            L.append(f"| {v['chunks']:,} | {v['chunk_shape'][0]} x {v['chunk_shape'][1]} | {name} | "
                     f"{r['tasks']:,} | {r['tasks_per_chunk']:.3f} | {r['seconds']['min']:.2f} | {r['passes']} | "
                     f"{r['ms_per_chunk_per_pass']:.3f} | {r.get('ratio_to_dask_pass', 1.0):.3f} |")
    return L


def markdown(res: dict[str, Any]) -> str:
    L = ["# Scaling measurements", "", f"Command: `{res['command']}`", ""]
    mc = res["machine"]
    L += [f"Machine: {mc['cpus']} CPUs ({mc['processor']}), {mc['ram_GiB']} GiB RAM, Python {mc['python']}; "
          + ", ".join(f"{k} {v}" for k, v in res["versions"].items()), ""]
    L += ["## Graph of one pass (built, not run; input `da.zeros`, chunks of 100 x 1000)", "",
          "| pass | chunks | tasks (pipeline) | tasks (with input layer) | tasks per chunk | construction s | pickle MB (stdlib, whole graph) | pickle MB (pipeline layer) | B/task | distributed.protocol.pickle MB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in res["factorize_graph"]:
        what = ("factorize, Zarr + scratch, " + "x".join(map(str, g["chunk_shape"]))
                if g.get("zarr_path_with_scratch") else "factorize (Y, Z)")
        L.append(f"| {what} | {g['chunks']:,} | {g['tasks_pipeline']:,} | {g['tasks_total']:,} | {g['tasks_total'] / g['chunks']:.3f} | "
                 f"{g['construction_seconds']:.3f} | {_mb(g['pickle_bytes_total'])} | {_mb(g['pickle_bytes_pipeline'])} | "
                 f"{g['pickle_bytes_per_pipeline_task']:.0f} | {_mb(g['distributed_pickle_bytes_total']) if isinstance(g['distributed_pickle_bytes_total'], int) else g['distributed_pickle_bytes_total']} |")
    for g in res["pca_graph"]:
        for kind in ("gram", "update"):
            s = g[kind]
            L.append(f"| PCA {kind} | {g['chunks']:,} | {s['tasks_pipeline']:,} | {s['tasks_total']:,} | {s['tasks_total'] / g['chunks']:.3f} | "
                     f"{s['construction_seconds']:.3f} | {_mb(s['pickle_bytes_total'])} | {_mb(s['pickle_bytes_pipeline'])} | "
                     f"{s['pickle_bytes_per_pipeline_task']:.0f} | {_mb(s['distributed_pickle_bytes_total']) if isinstance(s['distributed_pickle_bytes_total'], int) else s['distributed_pickle_bytes_total']} |")
    g = [g for g in res["factorize_graph"] if not g.get("zarr_path_with_scratch")][-1]
    L += ["", "## Bytes per pass", "",
          f"Factorize (t = {g['t']}, v = {g['v']}, chunk {g['chunk_shape'][0]} x {g['chunk_shape'][1]}, {g['chunks']:,} chunks):", "",
          f"- gathered to the client: Z {g['gathered_to_client']['Z']['shape']} float64 = {_mb(g['gathered_to_client']['Z']['bytes'])} MB",
          f"- kept distributed (persisted): Y {g['kept_distributed']['Y']['shape']} float64 = {_mb(g['kept_distributed']['Y']['bytes'])} MB in {g['kept_distributed']['Y']['blocks']:,} blocks",
          (f"- one chunk's task result (Y part + Z part): {g['partial_bytes_per_leaf']['Y_part']:,} + {g['partial_bytes_per_leaf']['Z_part']:,} B; "
          f"the Z tree depends on whole results, so at most {_mb(g['Z_tree_leaves_bytes'])} MB move into its first level"), ""]
    g = res["pca_graph"][-1]
    L += [(f"PCA (d = 1000, k = {g['k']}, {g['chunks']:,} bands): Gram {_mb(g['gram']['to_client_bytes'])} MB to the client, "
          f"{_mb(g['gram']['tree_leaves_bytes'])} MB of leaf results; power step {_mb(g['update']['to_client_bytes'])} MB, "
          f"{_mb(g['update']['tree_leaves_bytes'])} MB of leaf results."), ""]
    c = res["chunk_costs"]
    L += ["## Per-chunk costs (one thread)", "", "| kernel | median s | min s | MB/s of float32 input |", "|---|---:|---:|---:|"]
    b = c["block_partials_10000x1000_f32"]
    L.append(f"| block_partials 10000 x 1000, t = {b['t']}, v = {b['v']} | {b['seconds']['median']:.3f} | {b['seconds']['min']:.3f} | {b['MB_per_s']:.0f} |")
    for key, val in c.items():
        if key.startswith("band_pass"):
            for kind, r in val.items():
                L.append(f"| {key} {kind} | {r['seconds']['median']:.3f} | {r['seconds']['min']:.3f} | {r['MB_per_s']:.0f} |")
    z = res["zstd"]
    L.append(f"| zstd decode (level {z['zstd_level']}, chunk {z['store_chunk']}, ratio {z['ratio']:.3f}) | "
             f"{z['decode_seconds']['median']:.3f} | {z['decode_seconds']['min']:.3f} | {z['decode_MB_per_s']:.0f} |")
    L.append(f"| zarr read of that chunk (file + decode) | {z['zarr_read_seconds']['median']:.3f} | {z['zarr_read_seconds']['min']:.3f} | {z['zarr_read_MB_per_s']:.0f} |")
    if res.get("versus_dask"):
        L += versus_markdown(res["versus_dask"])
    if res.get("scheduler"):
        s = res["scheduler"]
        L += ["", "## Scheduler overhead", "",
              (f"{s['cluster']}: PCA Gram pass over {s['chunks']:,} tiny chunks = {s['tasks']:,} tasks, "
              f"median {s['seconds']['median']:.2f} s, min {s['seconds']['min']:.2f} s: {s['us_per_task']:.0f} us per task.")]
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scheduler-chunks", type=int, default=10**4,
                    help="chunks of the scheduler-overhead run (0: skip it)")
    ap.add_argument("--versus-dask", type=int, nargs="*", default=[],
                    help="chunk counts of the one-pass comparison with svd_compressed (e.g. 1000 10000)")
    ap.add_argument("--tiny-chunk", type=int, nargs=2, default=[10, 64], metavar=("ROWS", "COLS"))
    ap.add_argument("--workdir", default=_common.WORK)
    ap.add_argument("--reps", type=int, default=2, help="timed runs per method (versus dask)")
    ap.add_argument("--no-warmup", action="store_true", help="no warm-up run (versus dask)")
    ap.add_argument("--only-versus-dask", action="store_true",
                    help="skip the graph, per-chunk and scheduler sections")
    args = ap.parse_args()
    sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5]
    res: dict[str, Any] = {
        "command": " ".join(["python benchmarks/bench_scaling.py", *sys.argv[1:]]),
        "machine": _common.machine(),
        "versions": _common.versions(),
    }
    res["factorize_graph"] = []
    res["pca_graph"] = []
    res["versus_dask"] = []
    os.makedirs(args.workdir, exist_ok=True)
    for n in args.versus_dask:
        print(f"versus dask: {n} chunks", flush=True)
        res["versus_dask"].append(
            versus_dask(n, *args.tiny_chunk, args.workdir, args.reps, not args.no_warmup)
        )
    if args.only_versus_dask:
        sizes = []
    for n in sizes:
        print(f"graphs: {n} chunks", flush=True)
        res["factorize_graph"].append(factorize_graph(n))
        res["pca_graph"].append(pca_graph(n))
    for n in sizes:  # chunks of 40 MB float32: one chunk per band
        res["factorize_graph"].append(factorize_graph(n, rows=10000, zarr_path=True))
    if args.only_versus_dask:
        md = "\n".join([f"Command: `{res['command']}`", *versus_markdown(res["versus_dask"])])
        _common.dump_json(res, os.path.join(RESULTS, "scaling_versus_dask.json"))
        with open(os.path.join(RESULTS, "scaling_versus_dask.md"), "w") as f:
            f.write(md + "\n")
        print(md)
        return
    print("per-chunk costs", flush=True)
    res["chunk_costs"] = chunk_costs(3 if args.quick else 5)
    res["zstd"] = zstd_costs(3 if args.quick else 5)
    if not args.quick and args.scheduler_chunks:
        print("scheduler overhead", flush=True)
        res["scheduler"] = scheduler_overhead(args.scheduler_chunks)
    suffix = "_quick" if args.quick else ""
    _common.dump_json(res, os.path.join(RESULTS, f"scaling{suffix}.json"))
    md = markdown(res)
    with open(os.path.join(RESULTS, f"scaling{suffix}.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
