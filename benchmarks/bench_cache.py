"""Passes from memory: the private two-pass release with the row bands held between
its passes (``cache="auto"``) against the same release reading the store twice
(``cache="never"``), a plain read pass and dask's ``svd_compressed``, side by side
in one run; and the out-of-core case, where the bands do not fit.

Usage::

    python benchmarks/bench_cache.py --repeat 3 --out benchmarks/results/cache.json
    python benchmarks/bench_cache.py --memory-limit 512MiB --repeat 1 \
        --out benchmarks/results/cache_512MiB.json

Timing mode (default): ONE ``LocalCluster(n_workers=2, threads_per_worker=1,
processes=True)`` with dask's default memory limits (the machine's memory split
over the workers); a warm-up round, then ``--repeat`` rounds of every method in
rotating order:

* ``read``        ``da.from_zarr(path).sum(axis=0).compute()``: one plain read pass
* ``dp2_never``   ``factorize(path, 10, epsilon=1, delta=1e-6, algorithm="two-pass",
  seed=0, cache="never")``: the store read by each of the two passes
* ``dp2_auto``    the same with ``cache="auto"`` (the default): the bands the first pass
  reads stay in worker memory for the second
* ``svdc``        ``dask.compute(*da.linalg.svd_compressed(da.from_zarr(path), k=10,
  n_power_iter=0, seed=0))`` (its two passes are one graph: each chunk read once)
* ``pca_never``, ``pca_auto`` (with ``--methods``): the power method, T = 3, R = 0.05

Beside the wall time, each run records the CPU seconds (user + system) the two
worker processes and the client process spent (psutil): on a machine shared with
other jobs, time-slicing stretches wall times but not CPU time.

The private runs use ``insecure_noise_seed`` so that the script can check that
``dp2_auto`` released exactly what ``dp2_never`` released (the timing is that of the
private path: the noise is drawn by the same generator either way).

Out-of-core mode (``--memory-limit``): a fresh cluster of 2 workers with that memory
limit for every run of ``dp2_never`` and ``dp2_auto``; the report's cache decision, the
wall time and the peak RSS of each worker (sampled every 50 ms, as bench_memory.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C
from bench_memory import RssSampler

MiB = 2**20
K = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--chunk-rows", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--methods", nargs="+", default=["read", "dp2_never", "dp2_auto", "svdc"]
    )
    p.add_argument(
        "--memory-limit",
        default=None,
        help="out-of-core mode: each worker's memory limit (e.g. 512MiB)",
    )
    p.add_argument("--workdir", default=C.WORK)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def methods(path: str, ledger: str) -> dict[str, Any]:
    """name -> a function running it once, returning (released values, report)."""
    import dask
    import dask.array as da

    from pipeline import factorize, pca

    private = {"epsilon": 1.0, "delta": 1e-6, "ledger": ledger, "budget": (1e9, 0.5),
               "insecure_noise_seed": 1}  # fmt: skip

    def dp2(cache: str) -> Any:
        def run() -> Any:
            f = factorize(path, K, algorithm="two-pass", seed=0, cache=cache, **private)
            return f.S, f.report

        return run

    def power(cache: str) -> Any:
        def run() -> Any:
            r = pca(path, 5, method="power", iterations=3, clip_radius=0.05,
                    cache=cache, **private)  # fmt: skip
            return r.eigenvalues, r.report

        return run

    def read() -> Any:
        da.from_zarr(path).sum(axis=0).compute()
        return None, None

    def svdc() -> Any:
        U, s, Vt = da.linalg.svd_compressed(
            da.from_zarr(path), k=K, n_power_iter=0, seed=0
        )
        return dask.compute(U, s, Vt)[1], None

    return {"read": read, "dp2_never": dp2("never"), "dp2_auto": dp2("auto"),
            "svdc": svdc, "pca_never": power("never"), "pca_auto": power("auto")}  # fmt: skip


def cpu_seconds(procs: list[Any]) -> float:
    """User + system CPU seconds spent so far by ``procs`` (psutil processes)."""
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def timing(args: argparse.Namespace, path: str, ledger: str) -> dict[str, Any]:
    import numpy as np
    import psutil

    cluster, client = C.start_cluster(2)
    limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
    me = psutil.Process()
    run = methods(path, ledger)
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    cpu: dict[str, list[float]] = {m: [] for m in args.methods}
    client_cpu: dict[str, list[float]] = {m: [] for m in args.methods}
    released: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    try:
        for rep in range(-1, args.repeat):  # -1: the warm-up round, discarded
            order = args.methods[rep % len(args.methods) :] + args.methods[
                : rep % len(args.methods)
            ]
            for m in order:
                c0, m0 = cpu_seconds(workers), cpu_seconds([me])
                t0 = time.perf_counter()
                values, report = run[m]()
                wall = time.perf_counter() - t0
                c1, m1 = cpu_seconds(workers), cpu_seconds([me])
                if report is not None:
                    plans[m] = report["cluster"]["cache"]
                    released.setdefault(m, values)
                    assert np.array_equal(values, released[m]), m
                if rep >= 0:
                    times[m].append(wall)
                    cpu[m].append(c1 - c0)
                    client_cpu[m].append(m1 - m0)
                print(f"rep {rep} {m:>10}: {wall:6.2f} s, workers' CPU {c1 - c0:6.2f} s, "
                      f"client CPU {m1 - m0:5.2f} s", flush=True)  # fmt: skip
    finally:
        client.close()
        cluster.close()
    for a, b in (("dp2_auto", "dp2_never"), ("pca_auto", "pca_never")):
        if a in released and b in released:
            assert np.array_equal(released[a], released[b]), (a, b)
    ratios, cpu_ratios = {}, {}
    for a, b in (("dp2_never", "read"), ("dp2_auto", "read"), ("dp2_never", "svdc"),
                 ("dp2_auto", "svdc"), ("dp2_auto", "dp2_never"), ("svdc", "read"),
                 ("pca_auto", "pca_never"), ("pca_auto", "read")):  # fmt: skip
        if times.get(a) and times.get(b):
            ratios[f"{a}/{b}"] = C.ratio(times[a], times[b])
            cpu_ratios[f"{a}/{b}"] = C.ratio(cpu[a], cpu[b])
    return {
        "memory_limits_MiB": [round(x / MiB) for x in limits],
        "times_s": {m: C.summary(v) for m, v in times.items()},
        "worker_cpu_s": {m: C.summary(v) for m, v in cpu.items()},
        "client_cpu_s": {m: C.summary(v) for m, v in client_cpu.items()},
        "ratios": ratios,
        "worker_cpu_ratios": cpu_ratios,
        "cache_plans": plans,
        "same_release": {"dp2_auto == dp2_never": "dp2_auto" in released},
    }


def out_of_core(args: argparse.Namespace, path: str, ledger: str) -> dict[str, Any]:
    """A fresh 2-worker cluster with ``--memory-limit`` per run; peak RSS sampled."""
    from distributed import Client, LocalCluster

    runs = []
    for rep in range(args.repeat):
        for m in ("dp2_never", "dp2_auto") if rep % 2 == 0 else ("dp2_auto", "dp2_never"):
            cluster = LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True,
                memory_limit=args.memory_limit, dashboard_address=None, silence_logs=40,
            )  # fmt: skip
            client = Client(cluster)
            try:
                client.wait_for_workers(2)
                pids = client.run(os.getpid)
                t0 = time.perf_counter()
                with RssSampler(pids, 0.05) as smp:
                    _, report = methods(path, ledger)[m]()
                wall = time.perf_counter() - t0
                restarted = set(client.run(os.getpid).values()) != set(pids.values())
            finally:
                client.close()
                cluster.close()
            rec = {
                "method": m, "rep": rep, "wall_s": round(wall, 3),
                "peak_MiB": {w: round(x / MiB, 1) for w, x in smp.peak.items()},
                "worst_peak_MiB": round(max(smp.peak.values()) / MiB, 1),
                "workers_restarted": restarted, "cache": report["cluster"]["cache"],
            }  # fmt: skip
            runs.append(rec)
            print(f"rep {rep} {m:>10}: {wall:6.2f} s, peak {rec['worst_peak_MiB']} MiB, "
                  f"cache used: {rec['cache']['used']}", flush=True)  # fmt: skip
    return {"memory_limit": args.memory_limit, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = C.ensure_store(args.rows, args.cols, args.chunk_rows, workdir=args.workdir)
    ledger = os.path.join(tempfile.mkdtemp(prefix="dplr-bench-cache-"), "ledger.json")
    result: dict[str, Any] = {
        "store": C.store_info(path), "machine": C.machine(), "versions": C.versions(),
    }  # fmt: skip
    if args.memory_limit:
        result["out_of_core"] = out_of_core(args, path, ledger)
    else:
        result["timing"] = timing(args, path, ledger)
        for kind in ("ratios", "worker_cpu_ratios"):
            print(kind)
            for name, r in result["timing"][kind].items():
                print(f"{name:>22}: paired median {r.get('paired_median', float('nan')):.3f}"
                      f" (of medians {r['of_median']:.3f}, of min {r['of_min']:.3f})")  # fmt: skip
    if args.out:
        C.dump_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
