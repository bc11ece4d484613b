"""Side-by-side timing and accuracy of dplr's one-pass LRF against dask's svd_compressed.

Usage::

    python benchmarks/bench_lrf.py --rows 200000 --cols 1000 --rank 10 --repeat 3 \
        --out benchmarks/results/lrf.json
    python benchmarks/bench_lrf.py --quick          # 20000 x 1000, chunks of 2000 rows
    python benchmarks/bench_lrf.py --dp-sketch-sizes 30 60   # also the private pass at t = 30, 60

On ONE LocalCluster (2 worker processes x 1 thread) and one synthetic Zarr store
(float32, row chunks x all columns, default zstd codec, generated once into
benchmarks/work/), every repetition runs, in a rotating order:

* ``ours_np``      factorize(path, k, private=False, seed=0)         (Spectral-LRF; its
                   default co-range operator is a sparse sign map)
* ``ours_np_gauss`` the same with operator="gaussian"               (dense Gaussian S)
* ``ours_dp``      factorize(path, k, epsilon=1, delta=1e-6, seed=0) (Spectral-LRF, DP)
* ``ours_np_dp_sizes`` factorize(path, k, private=False, sketch_size=t, core_size=v) with
                   the (t, v) the private plan chose: the same sketch without privacy, so
                   ``ours_dp / ours_np_dp_sizes`` is the cost of privacy itself (clipping,
                   float64 products, the noise and the basis from the noisy sketch) and
                   ``ours_np_dp_sizes / ours_np`` the cost of the larger sketch
* ``ours_dp_t<T>``  for each T of ``--dp-sketch-sizes`` (default: the non-private t,
                   30 at k = 10): the DP Spectral-LRF with sketch_size=T (v as planned).
                   ``ours_dp_t<T> / ours_np`` is the speed side of the trade-off whose
                   utility side ``bench_utility.py --sketch-size T`` measures: a smaller t
                   makes the private pass cheaper and its release noisier
* ``ours_ls_dp``   the same with algorithm="low-space"                (Low-Space-LRF, DP)
* ``ours_dp2``     the same with algorithm="two-pass"                 (two passes, DP)
* ``svdc``         dask.compute(*da.linalg.svd_compressed(da.from_zarr(path), k, n_power_iter=0, seed=0))
* ``svdc_rc``      the same with ``compute=True`` (dask's out-of-core mode: every pass re-reads A)
* ``read``         floor (a): da.from_zarr(path).sum(axis=0).compute()  -- one read pass
* ``gemm``         floor (b): A @ Phi (n x t) and S @ A (v x m) with ours_np's operators
                   (Gaussian Phi, sparse sign S), float32, on an in-memory copy held by
                   one worker (1 BLAS thread), timed inside the worker

floor = (a) + (b)/2 is the headline floor (see README). After the timed
repetitions it records, untimed: the spectral error ||A - U diag(S) V^T||_2 /
sigma_{k+1} of every method (exact, via the n x n Gram of the residual summed over
row chunks on the cluster), a task-stream and statistical profile of one run of
each method, and a per-piece breakdown of our per-chunk kernel on in-memory chunks.

Timings are wall clock in the client, minimum and median over repetitions;
ratios are reported as min/min, median/median and the median of same-repetition
ratios. No timing here is an assertion.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common as C


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows", type=int, default=None, help="m (default 200000; 20000 with --quick)"
    )
    p.add_argument("--cols", type=int, default=1000, help="n (default 1000)")
    p.add_argument("--rank", type=int, default=10)
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="rows per chunk (default 10000; 2000 with --quick)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed repetitions (default 3; 2 with --quick)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON output (default benchmarks/results/lrf[_quick].json)",
    )
    p.add_argument(
        "--workdir", default=C.WORK, help="where stores are generated (git-ignored)"
    )
    p.add_argument(
        "--quick", action="store_true", help="small store, fewer repetitions"
    )
    p.add_argument(
        "--no-profile", action="store_true", help="skip the task-stream/profile round"
    )
    p.add_argument(
        "--dp-sketch-sizes",
        type=int,
        nargs="*",
        default=None,
        help="t of extra DP Spectral-LRF runs, one method ours_dp_t<T> each (default: the "
        "non-private default t; none with an empty list)",
    )
    p.add_argument(
        "--max-foreign",
        type=float,
        default=0.25,
        help="before each repetition wait (up to --max-wait s) until other processes use less "
        "than this share of the CPUs (the machine may be shared)",
    )
    p.add_argument("--max-wait", type=float, default=120.0)
    p.add_argument(
        "--quiet-each",
        action="store_true",
        help="also wait (up to 30 s) for a quiet machine before every single measurement",
    )
    a = p.parse_args(argv)
    a.rows = a.rows or (20_000 if a.quick else 200_000)
    a.chunk_rows = a.chunk_rows or (2_000 if a.quick else 10_000)
    a.repeat = a.repeat or (2 if a.quick else 3)
    a.out = a.out or os.path.join(
        HERE, "results", "lrf_quick.json" if a.quick else "lrf.json"
    )
    return a


class CpuMeter:
    """CPU seconds used by this process tree and by everything else on the machine."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()

    def _tree(self) -> float:
        tot = 0.0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                ct = p.cpu_times()
                tot += ct.user + ct.system
            except self.psutil.Error:
                pass
        return tot

    def _system(self) -> float:
        ct = self.psutil.cpu_times()
        return sum(ct) - ct.idle - getattr(ct, "iowait", 0.0)

    def start(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._tree(), self._system()

    def stop(self, s: tuple[float, float, float]) -> dict[str, float]:
        wall = time.perf_counter() - s[0]
        tree, system = self._tree() - s[1], self._system() - s[2]
        ncpu = os.cpu_count() or 1
        return {
            "wall": wall,
            "own_cpu_s": tree,
            "foreign_cpu_share": max(system - tree, 0.0) / (wall * ncpu),
        }

    def wait_quiet(self, threshold: float, max_wait: float) -> dict[str, float]:
        """Wait until foreign CPU use over a 1 s window is below ``threshold``."""
        t0 = time.perf_counter()
        while True:
            s = self.start()
            time.sleep(1.0)
            share = self.stop(s)["foreign_cpu_share"]
            waited = time.perf_counter() - t0
            if share <= threshold or waited >= max_wait:
                return {"foreign_cpu_share": share, "waited_s": waited}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import dask
    import dask.array as da
    from distributed import get_task_stream

    from pipeline import factorize
    from pipeline.algorithms.lrf import default_sketch_sizes

    m, n, k, cr = args.rows, args.cols, args.rank, args.chunk_rows
    path = C.ensure_store(m, n, cr, workdir=args.workdir)
    sv = C.singular_values(path)
    sigma_k1 = float(sv[k])
    t_np, v_np = default_sketch_sizes(k, private=False)
    dp_ts = [t_np] if args.dp_sketch_sizes is None else args.dp_sketch_sizes
    dp_names = [f"ours_dp_t{T}" for T in dp_ts]
    cluster, client = C.start_cluster(2)
    meter = CpuMeter()
    ledger_dir = tempfile.mkdtemp(prefix="dplr-bench-ledger-")
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    print(f"cluster: {len(workers)} workers x 1 thread; store {path}", flush=True)

    # -- the methods -------------------------------------------------------------------
    # the (t, v) the private Spectral-LRF plan chose, filled in by its first run
    dp_sizes: dict[str, int] = {}

    def ours(
        private: bool, algorithm: str, operator: str = "auto", sizes: Any = "planned"
    ) -> Any:
        """One factorize call; ``sizes``: "planned" (its own plan), "dp" (the t, v of
        the private Spectral-LRF plan) or an int t (v as planned)."""

        def run() -> tuple[Any, ...]:
            kw: dict[str, Any] = {"private": False, "operator": operator}
            if private:
                kw = {
                    "epsilon": 1.0,
                    "delta": 1e-6,
                    "ledger": os.path.join(ledger_dir, "ledger.json"),
                    "budget": (1e6, 0.5),
                }
            if sizes == "dp":
                kw.update(sketch_size=dp_sizes["t"], core_size=dp_sizes["v"])
            elif isinstance(sizes, int):
                kw.update(sketch_size=sizes)
            f = factorize(path, k, algorithm=algorithm, seed=0, **kw)
            rep = f.report
            extra = {
                "timings_seconds": rep["timings_seconds"],
                "n_passes": rep["n_passes"],
                "t": rep["parameters"]["sketch_size"],
                "v": rep["parameters"]["core_size"],
                "operator": rep["parameters"]["operator"],
                "n_graph_tasks_pass": (rep.get("cluster") or {}).get(
                    "n_graph_tasks_pass"
                ),
                "noise_floor_estimate": rep.get("noise_floor_estimate"),
            }
            if private and algorithm == "spectral" and sizes == "planned":
                dp_sizes.update(t=extra["t"], v=extra["v"])
            return f.U, f.S, f.V, extra

        return run

    def svdc() -> tuple[Any, ...]:
        U, s, Vt = da.linalg.svd_compressed(
            da.from_zarr(path), k=k, n_power_iter=0, seed=0
        )
        U, s, Vt = dask.compute(U, s, Vt)
        return U, s, Vt.T, {}

    def svdc_recompute() -> tuple[Any, ...]:
        # compute=True: dask's mode for data larger than memory; each pass re-reads A
        U, s, Vt = da.linalg.svd_compressed(
            da.from_zarr(path), k=k, n_power_iter=0, seed=0, compute=True
        )
        U, s, Vt = dask.compute(U, s, Vt)
        return U, s, Vt.T, {}

    def read() -> tuple[Any, ...]:
        da.from_zarr(path).sum(axis=0).compute()
        return None, None, None, {}

    A_mem: list[Any] = []

    def gemm() -> tuple[Any, ...]:
        if (
            not A_mem
        ):  # one in-memory copy, loaded once onto worker 0 (untimed, see below)
            A_mem.append(
                client.submit(C.load_store, path, workers=[workers[0]], pure=False)
            )
            A_mem[0].result()
        d = client.submit(
            C.gemm_floor, A_mem[0], t_np, v_np, workers=[workers[0]], pure=False
        ).result()
        return None, None, None, {"inner": d}

    methods = {
        "ours_np": ours(False, "spectral"),
        "ours_np_gauss": ours(False, "spectral", "gaussian"),
        "ours_dp": ours(True, "spectral"),
        "ours_np_dp_sizes": ours(False, "spectral", sizes="dp"),
        **{f"ours_dp_t{T}": ours(True, "spectral", sizes=T) for T in dp_ts},
        "ours_ls_dp": ours(True, "low-space"),
        "ours_dp2": ours(True, "two-pass"),
        "svdc": svdc,
        "svdc_rc": svdc_recompute,
        "read": read,
        "gemm": gemm,
    }
    deterministic = {"ours_np", "ours_np_gauss", "ours_np_dp_sizes", "svdc", "svdc_rc"}
    names = list(methods)

    # -- warm-up: imports on the workers, page cache, BLAS init (discarded) --------------
    print("warm-up round ...", flush=True)
    for nm in names:
        methods[nm]()
        C.collect_everywhere(client)

    times: dict[str, list[float]] = {nm: [] for nm in names}
    records: dict[str, list[dict[str, Any]]] = {nm: [] for nm in names}
    errors: dict[str, list[float]] = {
        nm: [] for nm in names if nm not in ("read", "gemm")
    }
    quiet: list[dict[str, float]] = []
    for r in range(args.repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        q = meter.wait_quiet(args.max_foreign, args.max_wait)
        quiet.append(q)
        print(
            f"rep {r}: foreign CPU {100 * q['foreign_cpu_share']:.0f}% after waiting {q['waited_s']:.0f} s",
            flush=True,
        )
        for nm in order:
            C.collect_everywhere(client)
            if args.quiet_each:
                meter.wait_quiet(args.max_foreign, 30.0)
            time.sleep(0.2)
            s = meter.start()
            U, S, V, extra = methods[nm]()
            meas = meter.stop(s)
            t = extra["inner"]["total"] if nm == "gemm" else meas["wall"]
            times[nm].append(t)
            records[nm].append({"rep": r, "time_s": t, **meas, **extra})
            msg = f"rep {r} {nm:>10}: {t:7.3f} s  (foreign CPU {100 * meas['foreign_cpu_share']:.0f}%)"
            if nm in errors and (nm not in deterministic or r == 0):
                e = C.spectral_error(client, path, U, S, V, cr) / sigma_k1
                errors[nm].append(e)
                records[nm][-1]["spectral_error_ratio"] = e
                msg += f"  ||A - USV'||/sigma_k+1 = {e:.4g}"
            print(msg, flush=True)
            del U, S, V

    # -- untimed diagnostics -------------------------------------------------------------------
    kernel = None
    if A_mem:
        print(
            "kernel breakdown on in-memory chunks (worker 0, 1 thread) ...", flush=True
        )
        kernel = client.submit(
            C.kernel_breakdown, A_mem[0], k, cr, workers=[workers[0]], pure=False
        ).result()
        A_mem[0].release()
        A_mem.clear()
    profiles: dict[str, Any] = {}
    if not args.no_profile:
        for nm in ("ours_np", "ours_np_gauss", "ours_dp", "ours_np_dp_sizes", *dp_names, "ours_ls_dp", "ours_dp2", "svdc", "read"):
            C.collect_everywhere(client)
            time.sleep(1.1)
            t_epoch = time.time()
            with get_task_stream(client) as ts:
                t0 = time.perf_counter()
                methods[nm]()
                wall = time.perf_counter() - t0
            time.sleep(1.1)  # let the workers' profiler close its cycle
            prof = client.profile(start=t_epoch, stop=time.time())
            profiles[nm] = {
                **C.task_stream_summary(ts.data, wall, len(workers)),
                "profile_top": C.profile_top(prof, 15),
            }
            print(f"profiled {nm}: {wall:.3f} s, {len(ts.data)} tasks", flush=True)

    client.close()
    cluster.close()

    # -- results --------------------------------------------------------------------------------
    floor_half = [a + b / 2 for a, b in zip(times["read"], times["gemm"], strict=True)]
    floor_full = [a + b for a, b in zip(times["read"], times["gemm"], strict=True)]
    res: dict[str, Any] = {
        "benchmark": "bench_lrf",
        "command": "python benchmarks/bench_lrf.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": C.machine(),
        "versions": C.versions(),
        "store": C.store_info(path),
        "params": {
            "m": m,
            "n": n,
            "rank": k,
            "chunk_rows": cr,
            "repeat": args.repeat,
            "t_np": t_np,
            "v_np": v_np,
            "dp_sketch_sizes": dp_ts,
            "epsilon": 1.0,
            "delta": 1e-6,
            "cluster": "LocalCluster(n_workers=2, threads_per_worker=1, processes=True)",
        },
        "sigma_k": float(sv[k - 1]),
        "sigma_k+1": sigma_k1,
        "sigma_1": float(sv[0]),
        "times": {nm: C.summary(v) for nm, v in times.items()},
        "floor": {
            "a_plus_half_b": C.summary(floor_half),
            "a_plus_b": C.summary(floor_full),
            "used": "a_plus_half_b",
        },
        "errors": {nm: C.summary(v) for nm, v in errors.items() if v},
        "ratios": {
            "ours_np/svdc": C.ratio(times["ours_np"], times["svdc"]),
            "ours_np/svdc_rc": C.ratio(times["ours_np"], times["svdc_rc"]),
            "ours_np_gauss/svdc": C.ratio(times["ours_np_gauss"], times["svdc"]),
            "ours_np/floor(a+b/2)": C.ratio(times["ours_np"], floor_half),
            "ours_np/floor(a+b)": C.ratio(times["ours_np"], floor_full),
            "ours_np/read": C.ratio(times["ours_np"], times["read"]),
            "svdc/read": C.ratio(times["svdc"], times["read"]),
            "ours_dp/ours_np": C.ratio(times["ours_dp"], times["ours_np"]),
            "ours_dp/ours_np_dp_sizes": C.ratio(times["ours_dp"], times["ours_np_dp_sizes"]),
            "ours_np_dp_sizes/ours_np": C.ratio(times["ours_np_dp_sizes"], times["ours_np"]),
            **{f"{nm}/ours_np": C.ratio(times[nm], times["ours_np"]) for nm in dp_names},
            "ours_ls_dp/ours_np": C.ratio(times["ours_ls_dp"], times["ours_np"]),
            "ours_dp/svdc": C.ratio(times["ours_dp"], times["svdc"]),
            "ours_dp2/svdc": C.ratio(times["ours_dp2"], times["svdc"]),
            "ours_dp2/ours_dp": C.ratio(times["ours_dp2"], times["ours_dp"]),
        },
        "targets": {
            "ours_np/svdc": 0.7,
            "ours_np/floor": 1.3,
            "ours_dp/ours_np": 1.5,
            "ours_dp2/svdc": 1.0,
        },
        "quiet_checks": quiet,
        "records": records,
        "kernel_breakdown": kernel,
        "profiles": profiles,
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
    p, T, E, R = res["params"], res["times"], res["errors"], res["ratios"]
    fs = [x["foreign_cpu_share"] for recs in res["records"].values() for x in recs]
    label = {
        "ours_np": "dplr Spectral-LRF, non-private (default: sparse sign S)",
        "ours_np_gauss": "dplr Spectral-LRF, non-private, Gaussian S",
        "ours_dp": "dplr Spectral-LRF, DP (eps=1, delta=1e-6)",
        "ours_np_dp_sizes": "dplr Spectral-LRF, non-private at the DP run's t, v",
        **{
            nm: f"dplr Spectral-LRF, DP at t = {nm.removeprefix('ours_dp_t')}"
            for nm in res["records"]
            if nm.startswith("ours_dp_t")
        },
        "ours_ls_dp": "dplr Low-Space-LRF, DP (eps=1, delta=1e-6)",
        "ours_dp2": "dplr two-pass, DP (eps=1, delta=1e-6)",
        "svdc": "dask svd_compressed (n_power_iter=0)",
        "svdc_rc": "dask svd_compressed (n_power_iter=0, compute=True: re-reads A)",
        "read": "floor (a): one read pass (from_zarr.sum)",
        "gemm": "floor (b): in-memory sketch products of ours_np, 1 thread",
    }
    lines = [
        (
            f"{p['m']}x{p['n']} float32, chunks {p['chunk_rows']} rows, k={p['rank']}, "
            f"{p['repeat']} repetitions, 2 workers x 1 thread; {res['machine']['date']}"
        ),
        "",
        (
            "CPU used by other processes on the machine during the timed runs: median "
            f"{100 * statistics.median(fs):.0f}%, max {100 * max(fs):.0f}% of the {res['machine']['cpus']} cores."
        ),
        "",
        "| method | min s | median s | passes | t, v | S | error / sigma_k+1 (min, median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for nm, lab in label.items():
        recs = res["records"][nm]
        passes = recs[0].get(
            "n_passes", 2 if nm in ("svdc", "svdc_rc") else (1 if nm == "read" else "-")
        )
        tv = (
            f"{recs[0]['t']}, {recs[0]['v']}"
            if "t" in recs[0]
            else ("20 (l)" if nm in ("svdc", "svdc_rc") else "-")
        )
        err = E.get(nm)
        es = "-" if not err else f"{err['min']:.3g}, {err['median']:.3g}"
        lines.append(
            f"| {lab} | {T[nm]['min']:.3f} | {T[nm]['median']:.3f} | {passes} | {tv} | "
            f"{recs[0].get('operator', '-')} | {es} |"
        )
    F = res["floor"]
    lines += [
        f"| floor = (a) + (b)/2 (used) | {F['a_plus_half_b']['min']:.3f} | {F['a_plus_half_b']['median']:.3f} | | | | |",
        f"| floor = (a) + (b) | {F['a_plus_b']['min']:.3f} | {F['a_plus_b']['median']:.3f} | | | | |",
        "",
        "| ratio | of min | of median | median of paired | target |",
        "|---|---|---|---|---|",
    ]
    tg = {
        "ours_np/svdc": "<= 0.7", "ours_np/floor(a+b/2)": "<= 1.3",
        "ours_dp/ours_np": "<= 1.5", "ours_dp2/svdc": "<= 1.0",
    }  # fmt: skip
    for nm, r in R.items():
        lines.append(
            f"| {nm} | {r['of_min']:.2f} | {r['of_median']:.2f} | {r.get('paired_median', float('nan')):.2f} | {tg.get(nm, '')} |"
        )
    kb = res.get("kernel_breakdown")
    if kb:
        lines += [
            "",
            (
                "Per-chunk kernel on in-memory chunks, summed over all chunks, 1 thread (s); "
                f"clip in place: {kb.get('clip_in_place')}; isfinite = full-block check where the kernel still does one:"
            ),
            "",
            "| request | t, v | dtype | block_partials | astype | isfinite | clip | operator gen | GEMM |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for nm, d in kb.items():
            if not isinstance(d, dict):
                continue
            opgen = sum(v for kk, v in d.items() if kk.startswith("opgen"))
            gem = sum(v for kk, v in d.items() if kk.startswith("gemm"))
            lines.append(
                f"| {nm} | {d['t']}, {d['v']} | {d['compute_dtype']} | {d['block_partials_total']:.3f} | "
                f"{d['astype']:.3f} | {d['isfinite']:.3f} | {d['clip']:.3f} | {opgen:.3f} | {gem:.3f} |"
            )
    prof = res.get("profiles")
    if prof:
        lines += [
            "",
            "Task stream of one profiled run (compute seconds summed over both workers):",
            "",
            "| method | wall s | tasks | worker utilisation | top task prefixes (compute s) |",
            "|---|---|---|---|---|",
        ]
        for nm, d in prof.items():
            top = ", ".join(
                f"{x['prefix']} x{x['n']} {x.get('compute', 0):.2f}"
                for x in d["by_prefix"][:4]
            )
            lines.append(
                f"| {nm} | {d['wall_s']:.3f} | {d['n_tasks']} | {100 * d['utilisation']:.0f}% | {top} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
