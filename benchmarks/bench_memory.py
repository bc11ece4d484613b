"""Peak worker memory (RSS) of dplr's factorize vs the O(chunk + sketch) bound.

Usage::

    python benchmarks/bench_memory.py --rows 50000 200000 --cols 1000 --repeat 2 \
        --out benchmarks/results/memory.json
    python benchmarks/bench_memory.py --quick        # 10000 and 40000 rows, chunks of 2000

For each store size (n=1000 columns, chunks of 10000 rows x all columns) and each
method -- non-private Spectral-LRF, DP Spectral-LRF, DP Low-Space-LRF, DP two-pass
(eps=1, delta=1e-6) and, for reference, one plain read pass (da.from_zarr(path).sum(axis=0))
and dask's svd_compressed -- it

1. starts a fresh LocalCluster (2 worker processes x 1 thread) for every run, so
   every run starts from fresh workers;
2. records the *cold* idle RSS of each worker, then warms it (imports pipeline,
   zarr, dask.array, randomgen, scipy; one small GEMM; gc + malloc_trim) and
   records the *warm* idle RSS -- the baseline;
3. samples the RSS of every worker process with psutil every 50 ms (from the
   benchmark process, which reads /proc; no messages to the workers) while the
   method runs;
4. reports the peak RSS and the increment peak - warm baseline of the worse worker,
   and compares the increment with the bound 2 x (chunk bytes + sketch bytes).

chunk bytes = rows_c x n x 4 (the float32 chunk) for the non-private float32
path, + rows_c x n x 8 (its float64 copy) for the DP paths, which compute in
float64. sketch bytes = the float64 partial sketches of one chunk plus the
operator blocks generated for it (and their float32 copies in the non-private
path), from the plan's (t, v). See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Self

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C

MiB = 2**20
#: The algorithm of each method (the others are Spectral-LRF).
ALGORITHMS = {"ours_ls_dp": "low-space", "ours_dp2": "two-pass"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=None,
        help="m values (default 50000 200000)",
    )
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument(
        "--chunk-rows", type=int, default=None, help="default 10000 (2000 with --quick)"
    )
    p.add_argument(
        "--repeat", type=int, default=None, help="runs per (m, method) (default 2)"
    )
    p.add_argument(
        "--interval", type=float, default=0.05, help="RSS sampling period, s"
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=["read", "ours_np", "ours_dp", "ours_ls_dp", "ours_dp2", "svdc"],
    )
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=C.WORK)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    a.rows = a.rows or ([10_000, 40_000] if a.quick else [50_000, 200_000])
    a.chunk_rows = a.chunk_rows or (2_000 if a.quick else 10_000)
    a.repeat = a.repeat or 2
    a.out = a.out or os.path.join(
        HERE, "results", "memory_quick.json" if a.quick else "memory.json"
    )
    return a


# -- the bound ----------------------------------------------------------------------------
def bound_bytes(method: str, rank: int, m: int, n: int, rows_c: int) -> dict[str, Any]:
    """chunk bytes and sketch bytes of one task of the pass, from the public plan."""
    from pipeline.algorithms.lrf import plan_lrf
    from pipeline.params import DEFAULT_TILE_SIZE as b
    from pipeline.params import Algorithm, LrfParams

    f8, f4 = 8, 4
    if method in ("svdc", "read"):
        return {"chunk": rows_c * n * f4, "sketch": 0, "note": "reference only"}
    private = method != "ours_np"
    alg = Algorithm(ALGORITHMS.get(method, "spectral"))
    kw = {"epsilon": 1.0, "delta": 1e-6} if private else {"private": False}
    plan = plan_lrf(LrfParams(algorithm=alg, rank=rank, **kw), (m, n))
    t, v = plan.t, plan.v
    chunk = rows_c * n * f4 + (rows_c * n * f8 if private else 0)
    # a sparse sign S block: 8 columns and values per row, and its CSC index
    sparse_s = rows_c * 8 * (8 + 8) + (rows_c + 1) * 8
    s_block = sparse_s if plan.operator.value == "sparse-sign" else rows_c * v * f8
    if alg is Algorithm.TWO_PASS:
        # the heavier of the two passes: Z_c (v x n) and S_c, or Y_c (rows_c x k)
        # and V_k (n x k, the public right operator)
        partials = max(v * n * f8 + s_block, (rows_c * t + n * t) * f8)
        ops = 0
        items = {"Z_c": v * n * f8, "S_c": s_block, "Y_c": rows_c * t * f8, "V_k": n * t * f8}
    elif alg is Algorithm.SPECTRAL:
        partials = rows_c * t * f8 + v * n * f8  # Y_c, Z_c
        ops = n * t * f8 + s_block + b * v * f8  # Phi, S_c (+ one tile)
        if not private:
            ops += (n * t + rows_c * v) * f4  # their float32 copies
        items = {
            "Y_c": rows_c * t * f8,
            "Z_c": v * n * f8,
            "Phi": n * t * f8,
            "S_c": s_block,
        }
    else:
        partials = rows_c * t * f8 + t * n * f8 + v * v * f8  # Yc_c, Yr_c, Z_c
        ops = (
            n * t + rows_c * t + rows_c * v + n * v
        ) * f8 + b * v * f8  # PhiC, Psi_c, S_c, T (+ tile)
        ops += rows_c * v * f8  # the x @ T intermediate
        items = {
            "Yc_c": rows_c * t * f8,
            "Yr_c": t * n * f8,
            "Z_c": v * v * f8,
            "ops": (n * t + rows_c * t + rows_c * v + n * v) * f8,
        }
    return {
        "chunk": chunk,
        "sketch": partials + ops,
        "t": t,
        "v": v,
        "items_MiB": {k: round(x / MiB, 2) for k, x in items.items()},
    }


# -- sampling --------------------------------------------------------------------------------
class RssSampler:
    """Samples the RSS of the given pids every ``interval`` seconds in a thread."""

    def __init__(self, pids: dict[str, int], interval: float) -> None:
        import psutil

        self.procs = {w: psutil.Process(pid) for w, pid in pids.items()}
        self._gone = psutil.Error
        self.interval = interval
        self.peak = {w: 0 for w in pids}
        self.n = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for w, p in self.procs.items():
                with contextlib.suppress(self._gone):  # a worker that just exited
                    self.peak[w] = max(self.peak[w], p.memory_info().rss)
            self.n += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(2 * self.interval)
        self._stop.set()
        self._t.join()


def rss_now(
    pids: dict[str, int], samples: int = 5, gap: float = 0.05
) -> dict[str, int]:
    import psutil

    out: dict[str, list[int]] = {w: [] for w in pids}
    for _ in range(samples):
        for w, pid in pids.items():
            out[w].append(psutil.Process(pid).memory_info().rss)
        time.sleep(gap)
    return {w: int(statistics.median(v)) for w, v in out.items()}


def warm_worker() -> int:
    import dask.array  # noqa: F401
    import numpy as np
    import randomgen  # noqa: F401
    import scipy.linalg  # noqa: F401
    import zarr  # noqa: F401

    import pipeline.algorithms.lrf
    import pipeline.execution.source
    import pipeline.mechanisms.noise
    import pipeline.sketches.apply  # noqa: F401

    a = np.ones((256, 256))
    (a @ a).sum()
    (a.astype(np.float32) @ a.astype(np.float32)).sum()
    np.random.Generator(np.random.Philox(1)).standard_normal((64, 8))
    return C.worker_gc()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import dask
    import dask.array as da
    import psutil

    from pipeline import factorize

    k, n, cr = args.rank, args.cols, args.chunk_rows
    paths = {m: C.ensure_store(m, n, cr, workdir=args.workdir) for m in args.rows}
    ledger_dir = tempfile.mkdtemp(prefix="dplr-bench-ledger-")
    me = psutil.Process()

    def run(method: str, path: str) -> None:
        if method == "read":
            da.from_zarr(path).sum(axis=0).compute()
            return
        if method == "svdc":
            U, s, Vt = da.linalg.svd_compressed(
                da.from_zarr(path), k=k, n_power_iter=0, seed=0
            )
            dask.compute(U, s, Vt)
            return
        kw: dict[str, Any] = {"private": False}
        if method != "ours_np":
            kw = {
                "epsilon": 1.0,
                "delta": 1e-6,
                "ledger": os.path.join(ledger_dir, f"{os.path.basename(path)}.json"),
                "budget": (1e6, 0.5),
            }
        # as `dplr factorize` runs it: the release goes to OUT, whose directory
        # also holds the job's scratch (the tall Y and Q blocks between steps)
        out_dir = tempfile.mkdtemp(prefix="dplr-bench-out-", dir=args.workdir)
        try:
            factorize(
                path,
                k,
                algorithm=ALGORITHMS.get(method, "spectral"),
                seed=0,
                out=os.path.join(out_dir, "release.zarr"),
                **kw,
            )
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    runs: list[dict[str, Any]] = []
    configs = [(m, meth) for m in args.rows for meth in args.methods]
    for rep in range(args.repeat):
        order = configs if rep % 2 == 0 else configs[::-1]
        for m, meth in order:
            # a fresh cluster per run: client.restart() hangs intermittently here
            # (distributed 2026.8.0; reproduced with a plain dask read, see README)
            cluster, client = C.start_cluster(2)
            pids = client.run(os.getpid)
            time.sleep(0.5)
            cold = rss_now(pids)
            client.run(warm_worker)
            time.sleep(0.3)
            warm = rss_now(pids)
            client_before = me.memory_info().rss
            t0 = time.perf_counter()
            with RssSampler(pids, args.interval) as smp:
                run(meth, paths[m])
            wall = time.perf_counter() - t0
            client_after = me.memory_info().rss
            inc = {w: smp.peak[w] - warm[w] for w in pids}
            worst = max(inc, key=inc.get)
            rec = {
                "m": m,
                "method": meth,
                "rep": rep,
                "wall_s": round(wall, 3),
                "n_samples": smp.n,
                "cold_idle_MiB": {w: round(x / MiB, 1) for w, x in cold.items()},
                "warm_idle_MiB": {w: round(x / MiB, 1) for w, x in warm.items()},
                "peak_MiB": {w: round(x / MiB, 1) for w, x in smp.peak.items()},
                "increment_MiB": {w: round(x / MiB, 1) for w, x in inc.items()},
                "worst_increment_MiB": round(inc[worst] / MiB, 1),
                "worst_peak_MiB": round(smp.peak[worst] / MiB, 1),
                "client_rss_delta_MiB": round((client_after - client_before) / MiB, 1),
            }
            runs.append(rec)
            print(
                f"rep {rep} m={m:>7} {meth:>10}: peak {rec['worst_peak_MiB']:7.1f} MiB, "
                f"increment {rec['worst_increment_MiB']:7.1f} MiB over warm idle "
                f"{statistics.mean(warm.values()) / MiB:6.1f} MiB ({smp.n} samples, {wall:.1f} s)",
                flush=True,
            )
            client.close()
            cluster.close()

    table = []
    for m in args.rows:
        for meth in args.methods:
            rs = [r for r in runs if r["m"] == m and r["method"] == meth]
            bb = bound_bytes(meth, k, m, n, min(cr, m))
            bound = 2 * (bb["chunk"] + bb["sketch"])
            inc = [r["worst_increment_MiB"] for r in rs]
            table.append(
                {
                    "m": m,
                    "method": meth,
                    **bb,
                    "bound_MiB": round(bound / MiB, 1),
                    "cold_idle_MiB": round(
                        statistics.median(
                            x for r in rs for x in r["cold_idle_MiB"].values()
                        ),
                        1,
                    ),
                    "warm_idle_MiB": round(
                        statistics.median(
                            x for r in rs for x in r["warm_idle_MiB"].values()
                        ),
                        1,
                    ),
                    "peak_MiB_max": max(r["worst_peak_MiB"] for r in rs),
                    "increment_MiB_min": min(inc),
                    "increment_MiB_max": max(inc),
                    "increment/bound": round(max(inc) / (bound / MiB), 3),
                    "within_bound": max(inc) <= bound / MiB,
                }
            )
    growth = {}
    if len(args.rows) >= 2:
        lo, hi = min(args.rows), max(args.rows)
        for meth in args.methods:
            a = next(x for x in table if x["m"] == lo and x["method"] == meth)
            b = next(x for x in table if x["m"] == hi and x["method"] == meth)
            growth[meth] = {
                "rows": [lo, hi],
                "increment_MiB": [a["increment_MiB_max"], b["increment_MiB_max"]],
                "delta_MiB": round(b["increment_MiB_max"] - a["increment_MiB_max"], 1),
                "ratio": round(b["increment_MiB_max"] / a["increment_MiB_max"], 3),
            }
    res = {
        "benchmark": "bench_memory",
        "command": "python benchmarks/bench_memory.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": C.machine(),
        "versions": C.versions(),
        "stores": {str(m): C.store_info(p) for m, p in paths.items()},
        "params": {
            "n": n,
            "rank": k,
            "chunk_rows": cr,
            "repeat": args.repeat,
            "interval_s": args.interval,
            "cluster": "LocalCluster(n_workers=2, threads_per_worker=1, processes=True)",
        },
        "table": table,
        "growth": growth,
        "runs": runs,
    }
    C.dump_json(res, args.out)
    md = markdown(res)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md)
    print()
    print(md)
    print(f"wrote {args.out}")
    return 0


def markdown(res: dict[str, Any]) -> str:
    p = res["params"]
    lines = [
        (
            f"n={p['n']}, chunks {p['chunk_rows']} rows x all columns, k={p['rank']}, {p['repeat']} runs each, "
            f"RSS sampled every {1000 * p['interval_s']:.0f} ms; {res['machine']['date']}"
        ),
        "",
        "| m | method | t, v | cold idle MiB | warm idle MiB | peak MiB | increment MiB (min-max) | chunk MiB | sketch MiB | bound 2(chunk+sketch) MiB | increment / bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["table"]:
        tv = (
            f"{r['t']}, {r['v']}"
            if "t" in r
            else ("20 (l)" if r["method"] == "svdc" else "-")
        )
        lines.append(
            f"| {r['m']} | {r['method']} | {tv} | {r['cold_idle_MiB']:.0f} | {r['warm_idle_MiB']:.0f} | {r['peak_MiB_max']:.0f} | "
            f"{r['increment_MiB_min']:.0f}-{r['increment_MiB_max']:.0f} | {r['chunk'] / MiB:.1f} | {r['sketch'] / MiB:.1f} | "
            f"{r['bound_MiB']:.0f} | {r['increment/bound']:.2f} |"
        )
    if res["growth"]:
        lines += [
            "",
            "| method | increment MiB at m = "
            + " / ".join(str(x) for x in next(iter(res["growth"].values()))["rows"])
            + " | growth MiB | ratio |",
            "|---|---|---|---|",
        ]
        for meth, g in res["growth"].items():
            lines.append(
                f"| {meth} | {g['increment_MiB'][0]:.0f} / {g['increment_MiB'][1]:.0f} | {g['delta_MiB']:+.0f} | {g['ratio']:.2f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
