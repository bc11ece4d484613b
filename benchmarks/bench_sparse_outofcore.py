"""Out of core, sparse: a CSR store larger than the workers' memory, factorized
privately and PCA'd by 2 workers with 1 GiB each.

Usage::

    nice -n 10 python benchmarks/bench_sparse_outofcore.py --workdir SCRATCH_DIR --cleanup
    python benchmarks/bench_sparse_outofcore.py --rows 200000 --memory-limit 512MiB  # quick

What it does, in one process (the sampling machinery of ``bench_outofcore.py``):

1. ``dplr generate STORE --sparse DENSITY`` (float64, default 16 000 000 x 2 000 at
   1%: 3.2e8 stored entries, about 2.6 GB on disk) as a subprocess whose peak RSS is
   sampled: the generator holds one diagonal block and one band, not the matrix.
2. ONE ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
   memory_limit="1GiB")`` with distributed's default memory thresholds, and on it
   a private two-pass ``factorize`` (rank ``--rank``, eps 1, delta 1e-6, the tall
   sketches in a scratch directory under the workdir, ``U`` written to a Zarr
   store there) and a private ``pca`` of the same store, each sampled for the RSS
   of every worker (psutil, every ``--interval`` s) and for restarts.
3. The band bound: what one pass task holds for the largest band of the store
   (:func:`band_bound`), against the measured peak RSS per worker and its
   increment over the worker's RSS before the run.

The store's own number of entries is printed: it is synthetic test data. The
results go to ``results/sparse_outofcore.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _common as C
from bench_outofcore import (
    MEMORY_THRESHOLDS,
    Monitor,
    disk_bytes,
    dplr_exe,
    worker_spill_state,
)

MiB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16_000_000)
    p.add_argument("--cols", type=int, default=2_000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--memory-limit", default="1GiB")
    p.add_argument("--n-workers", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument(
        "--workdir", default=os.path.join(tempfile.gettempdir(), "dplr-bench-sparse")
    )
    p.add_argument("--cleanup", action="store_true", help="delete the store at the end")
    p.add_argument(
        "--out", default=os.path.join(HERE, "results", "sparse_outofcore.json")
    )
    a = p.parse_args(argv)
    a.workdir = os.path.abspath(a.workdir)
    if os.path.commonpath([a.workdir, REPO]) == REPO:
        p.error(f"--workdir must be outside the repository ({REPO})")
    return a


def generate(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``dplr generate --sparse`` unless the store is there; its peak RSS."""
    import psutil

    if os.path.exists(path):
        print(f"reusing {path}", flush=True)
        return {"generated": False}
    cmd = [
        *dplr_exe(), "generate", path, "--rows", str(args.rows), "--cols",
        str(args.cols), "--sparse", str(args.density), "--dtype", "float64",
        "--chunks", "10000,-1", "--seed", "0",
    ]  # fmt: skip
    print("generating:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, ps.memory_info().rss)
        time.sleep(args.interval)
    if proc.returncode != 0:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"dplr generate failed:\n{err[-2000:]}")
    wall = time.perf_counter() - t0
    print(f"  generated in {wall:.0f} s, peak RSS {peak / MiB:.0f} MiB", flush=True)
    return {"generated": True, "wall_s": round(wall, 1), "peak_rss_MiB": peak / MiB}


def band_bound(path: str, t: int, v: int) -> dict[str, Any]:
    """Bytes one pass task holds for the largest band of the store.

    The band as read (values and indices) and its float64 copy; its row
    pointers; the sparse sign operator's rows (columns and values, zeta = 8)
    and the product ``S X`` (v x n, as scipy's sparse result and dense); the
    tall partial ``X V_k`` (rows x t). The PCA's Gram (n x n, sparse result
    and dense) is listed apart.
    """
    import numpy as np

    from pipeline.io.csr import open_csr
    from pipeline.io.inputs import csr_band_rows

    r = open_csr(path, validate=False)
    m, n = r.shape
    rows = min(m, csr_band_rows(n))
    ptr = np.asarray(r.indptr[::rows])
    ptr = np.append(ptr, r.nnz)
    z = int(np.diff(ptr).max())
    ib, vb = r.indices.dtype.itemsize, r.dtype.itemsize
    band = z * (ib + vb) + z * (ib + 8) + 2 * 8 * (rows + 1)
    sketch = rows * 8 * 16 + v * n * (12 + 8) + rows * t * 8
    return {
        "band_rows": rows,
        "band_max_entries": z,
        "band_MiB": band / MiB,
        "sketch_MiB": sketch / MiB,
        "pass_task_MiB": (band + sketch) / MiB,
        "pca_gram_MiB": n * n * (12 + 8) / MiB,
    }


def run(label: str, fn: Any, client: Any, args: argparse.Namespace) -> dict[str, Any]:
    from bench_lrf import CpuMeter

    C.collect_everywhere(client)
    before = client.run(worker_spill_state)
    procs = {s["pid"] for s in before.values()}
    import psutil

    idle = {pid: psutil.Process(pid).memory_info().rss / MiB for pid in procs}
    restarts0 = len(client.get_events("worker-restart-memory"))
    meter = CpuMeter()
    s0 = meter.start()
    with Monitor(client, args.interval, 1.0) as mon:
        try:
            info = fn()
        except Exception as exc:  # noqa: BLE001 - recorded with the memory data
            info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    cpu = meter.stop(s0)
    after = client.run(worker_spill_state)
    rec = {
        "label": label,
        "wall_s": round(cpu["wall"], 1),
        "own_cpu_s": round(cpu["own_cpu_s"], 1),
        "foreign_cpu_share": round(cpu["foreign_cpu_share"], 2),
        "peak_rss_MiB": {str(p): round(mon.peak.get(p, 0) / MiB) for p in procs},
        "idle_rss_MiB": {str(p): round(v) for p, v in idle.items()},
        "restarts": len(client.get_events("worker-restart-memory"))
        - restarts0
        + int({s["pid"] for s in after.values()} != procs),
        "spilled_MiB": round(
            sum(s["disk-write-bytes"] for s in after.values())
            - sum(s["disk-write-bytes"] for s in before.values())
        )
        / MiB,
        **info,
    }
    print(f"{time.strftime('%H:%M:%S')} {rec}", flush=True)
    return rec


def _public_args(args: list[str]) -> list[str]:
    """The command's arguments as recorded: the scratch directory, a path of
    this machine, as ``SCRATCH_DIR``."""
    out = list(args)
    for i, a in enumerate(args):
        if a == "--workdir" and i + 1 < len(args):
            out[i + 1] = "SCRATCH_DIR"
        elif a.startswith("--workdir="):
            out[i] = "--workdir=SCRATCH_DIR"
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import cloudpickle
    import dask
    import numpy as np
    from distributed import Client, LocalCluster

    import pipeline
    from pipeline.io.csr import open_csr

    cloudpickle.register_pickle_by_value(C)
    os.makedirs(args.workdir, exist_ok=True)
    m, n = args.rows, args.cols
    store = os.path.join(args.workdir, f"csr_{m}x{n}_d{args.density:g}.zarr")
    gen = generate(store, args)
    nnz = int(open_csr(store, validate=False).nnz)
    disk = disk_bytes(store)
    print(f"store {m} x {n}, {nnz} entries, {disk / 1e9:.2f} GB", flush=True)
    scratch = os.path.join(args.workdir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    privacy = {"epsilon": 1.0, "delta": 1e-6, "budget": (1e6, 0.5)}
    ledger = os.path.join(args.workdir, "ledger.json")
    runs = []
    with dask.config.set(MEMORY_THRESHOLDS):
        cluster = LocalCluster(
            n_workers=args.n_workers, threads_per_worker=1, processes=True,
            memory_limit=args.memory_limit, dashboard_address=None,
            local_directory=os.path.join(args.workdir, "dask-scratch"),
            silence_logs=logging.ERROR,
        )  # fmt: skip
        client = Client(cluster)
        try:

            def fact() -> dict[str, Any]:
                out = os.path.join(args.workdir, "U.zarr")
                f = pipeline.factorize(
                    store, args.rank, algorithm="two-pass", seed=0, out=out,
                    overwrite=True, ledger=ledger, scratch=scratch, **privacy,
                )  # fmt: skip
                assert np.all(np.isfinite(f.S))
                par = f.report.get("parameters") or {}
                return {
                    "t_v": [par.get("sketch_size"), par.get("core_size")],
                    "timings_s": f.report.get("timings_seconds"),
                }

            def pca() -> dict[str, Any]:
                p = pipeline.pca(store, args.rank, ledger=ledger, **privacy)
                assert np.all(np.isfinite(p.components))
                return {"method": p.report.get("method"),
                        "timings_s": p.report.get("timings_seconds")}  # fmt: skip

            runs.append(run("factorize two-pass", fact, client, args))
            runs.append(run("pca", pca, client, args))
        finally:
            client.close()
            cluster.close()
    t, v = runs[0].get("t_v") or (4 * args.rank, 16 * args.rank)
    bound = band_bound(store, int(t), int(v))
    res = {
        "benchmark": "bench_sparse_outofcore",
        "command": "python benchmarks/bench_sparse_outofcore.py "
        + " ".join(_public_args(sys.argv[1:] if argv is None else argv)),
        "machine": C.machine(),
        "versions": C.versions(),
        "store": {
            "shape": [m, n],
            "density": args.density,
            "entries": nnz,
            "disk_GB": round(disk / 1e9, 2),
            **gen,
        },
        "memory_limit": args.memory_limit,
        "band_bound": bound,
        "runs": runs,
    }
    C.dump_json(res, args.out)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as fh:
        fh.write(markdown(res))
    print(markdown(res))
    if args.cleanup:
        for p in (store, scratch, os.path.join(args.workdir, "U.zarr")):
            shutil.rmtree(p, ignore_errors=True)
        print(f"deleted {store}")
    return 0


def markdown(res: dict[str, Any]) -> str:
    s, b = res["store"], res["band_bound"]
    lines = [
        (
            f"CSR store {s['shape'][0]} x {s['shape'][1]}, {s['entries']:.3g} entries, "
            f"{s['disk_GB']} GB on disk; {res['memory_limit']} per worker. Band: "
            f"{b['band_rows']} rows, at most {b['band_max_entries']} entries; a pass "
            f"task's bound {b['pass_task_MiB']:.0f} MiB (band {b['band_MiB']:.0f}, "
            f"sketches {b['sketch_MiB']:.0f}), PCA Gram {b['pca_gram_MiB']:.0f} MiB."
        ),
        "",
        (
            "| run | wall s | CPU s | foreign CPU | peak RSS per worker MiB "
            "| idle RSS MiB | restarts | spilled MiB |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        lines.append(
            f"| {r['label']}{' FAILED' if 'error' in r else ''} | {r['wall_s']} | "
            f"{r['own_cpu_s']} | {100 * r['foreign_cpu_share']:.0f}% | "
            f"{' / '.join(str(x) for x in r['peak_rss_MiB'].values())} | "
            f"{' / '.join(str(x) for x in r['idle_rss_MiB'].values())} | "
            f"{r['restarts']} | {r['spilled_MiB']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
