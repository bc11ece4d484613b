"""Out of core: 2 workers with 1 GiB each factorize an 8 GiB float32 Zarr store.

Usage::

    python benchmarks/bench_outofcore.py --workdir SCRATCH_DIR --cleanup  # ~16 GB free, outside the repository
    python benchmarks/bench_outofcore.py --quick      # 1 GiB store, 512 MiB workers

What it does, in one process:

1. Generates (or reuses, if present and complete) a synthetic float32 store of
   ``--rows`` x ``--cols`` (default 2,097,152 x 1024 = 8 GiB raw) with row-band
   chunks of ``--chunk-rows`` x all columns (default 16384 rows = 64 MiB) under
   ``--workdir`` (default: a directory under the system temp dir, never inside
   the repository), with ``dplr generate`` (``--kind lowrank``: largest row norm 1;
   the generator writes one row band at a time, so its memory is bounded; its
   peak RSS is recorded). A second store with 1/``--small-fraction`` of the rows
   and the same columns and chunking is generated the same way.
2. Starts ONE ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
   memory_limit="1GiB")`` with the memory thresholds set explicitly to
   distributed's defaults (target 0.60, spill 0.70, pause 0.80, terminate 0.95)
   and worker spill files under the workdir, plus a ``Client`` (``factorize``
   picks it up as the active client).
3. Runs the private ``pipeline.api.factorize(path, rank=10, epsilon=1,
   delta=1e-6, seed=0, out=<workdir>/...zarr)`` (Spectral-LRF; ``--algorithms
   spectral low-space`` adds Low-Space-LRF): first on the small store (a warm-up,
   discarded, then ``--small-repeat`` measured runs), then on the big store, then
   once more on the small store. While each run goes it samples, from this
   process with psutil, the RSS of every worker process (and of this client
   process) every ``--interval`` s, and, every ``--spill-interval`` s through
   ``client.run``, each worker's ``data.spilled_total`` (bytes currently spilled
   to disk), managed memory and status (running/paused). After each run it reads
   the cumulative spill counters ``data.cumulative_metrics[("disk-write",
   "bytes")]`` (and disk-read), the scheduler's ``worker-restart-memory`` events
   (the nanny's "exceeded 95% memory budget. Restarting..."), the worker pids
   (a changed pid is a restarted worker) and the WARNING lines of the worker logs.
4. Runs the same factorize on the small matrix held in memory as a numpy array
   (``ArraySource``, in this process: no Dask, no Zarr reads; numpy's own BLAS
   threads), after closing the cluster.
5. Scales the small runs' wall time linearly in the number of rows to the big
   size and writes ``results/outofcore.json`` and ``results/outofcore.md``: size,
   wall time, GB/s (raw input bytes / wall), peak RSS per worker against the
   limit, spilled bytes, restarts, and big / scaled-small time ratios.

``--cleanup`` deletes both stores at the end (otherwise they are kept and reused).
Timings are single runs on a shared 2-core machine; each run records the CPU
share used by other processes (``foreign_cpu_share``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Self

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _common as C

MiB = 2**20
GiB = 2**30

#: distributed's defaults (distributed/distributed.yaml), set explicitly so the
#: run does not depend on a user's ~/.config/dask.
MEMORY_THRESHOLDS = {
    "distributed.worker.memory.target": 0.60,
    "distributed.worker.memory.spill": 0.70,
    "distributed.worker.memory.pause": 0.80,
    "distributed.worker.memory.terminate": 0.95,
    "distributed.worker.memory.max-spill": False,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows", type=int, default=None, help="default 2097152 (8 GiB at 1024 columns)"
    )
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument(
        "--chunk-rows", type=int, default=None, help="default 16384 (64 MiB chunks)"
    )
    p.add_argument(
        "--small-fraction", type=int, default=16, help="small store = rows / this"
    )
    p.add_argument(
        "--small-repeat",
        type=int,
        default=2,
        help="measured small runs before the big one",
    )
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument(
        "--algorithms",
        nargs="+",
        default=["spectral"],
        choices=["spectral", "low-space"],
    )
    p.add_argument("--n-workers", type=int, default=2)
    p.add_argument("--memory-limit", default=None, help='per worker (default "1GiB")')
    p.add_argument(
        "--max-rank",
        type=int,
        default=128,
        help="non-zero singular values of the synthetic matrix (dplr generate --max-rank); "
        "128 keeps generation to minutes (decay 0.9: sigma_128/sigma_1 = 1.4e-6)",
    )
    p.add_argument(
        "--interval", type=float, default=0.05, help="RSS sampling period, s"
    )
    p.add_argument(
        "--spill-interval",
        type=float,
        default=0.5,
        help="spill-state sampling period, s",
    )
    p.add_argument(
        "--workdir", default=os.path.join(tempfile.gettempdir(), "dplr-bench-outofcore")
    )
    p.add_argument(
        "--cleanup", action="store_true", help="delete both stores at the end"
    )
    p.add_argument(
        "--no-numpy", action="store_true", help="skip the in-memory numpy reference"
    )
    p.add_argument(
        "--max-foreign",
        type=float,
        default=0.25,
        help="wait before each run until other processes use less than this CPU share",
    )
    p.add_argument(
        "--max-wait",
        type=float,
        default=120.0,
        help="... for at most this many seconds",
    )
    p.add_argument("--out", default=None)
    p.add_argument(
        "--render",
        metavar="JSON",
        default=None,
        help="only rewrite the Markdown table of an existing result JSON",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 GiB store, chunks of 4096 rows, 512 MiB workers",
    )
    a = p.parse_args(argv)
    a.rows = a.rows or (262_144 if a.quick else 2_097_152)
    a.chunk_rows = a.chunk_rows or (4_096 if a.quick else 16_384)
    a.memory_limit = a.memory_limit or ("512MiB" if a.quick else "1GiB")
    a.out = a.out or os.path.join(
        HERE, "results", "outofcore_quick.json" if a.quick else "outofcore.json"
    )
    a.workdir = os.path.abspath(a.workdir)
    if os.path.commonpath([a.workdir, REPO]) == REPO:
        p.error(f"--workdir must be outside the repository ({REPO}), got {a.workdir}")
    if a.rows % a.small_fraction:
        p.error("--rows must be a multiple of --small-fraction")
    return a


# -- stores --------------------------------------------------------------------------------
def store_path(workdir: str, m: int, n: int, cr: int, max_rank: int, seed: int) -> str:
    return os.path.join(workdir, f"ooc_{m}x{n}_r{cr}_f32_rank{max_rank}_s{seed}.zarr")


def store_ok(path: str, m: int, n: int, cr: int, max_rank: int, seed: int) -> bool:
    """Complete and as requested: shape, chunks, dtype, generator attrs, every chunk file."""
    import zarr

    try:
        z = zarr.open_array(path, mode="r")
        meta = z.attrs["dplr_synthetic"]
        ok = (
            z.shape == (m, n)
            and z.chunks == (min(cr, m), n)
            and str(z.dtype) == "float32"
            and int(meta["seed"]) == seed
            and int(meta["rank"]) == min(m, n, max_rank)
            and float(meta["max_row_norm"]) == 1.0
        )
    except Exception:  # noqa: BLE001 - anything unreadable is regenerated
        return False
    n_files = sum(len(files) for _, _, files in os.walk(os.path.join(path, "c")))
    return ok and n_files == -(-m // cr)


def dplr_exe() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "dplr")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("dplr")
    if found:
        return [found]
    return [sys.executable, "-m", "pipeline.cli"]


def ensure_store(
    path: str, m: int, n: int, cr: int, max_rank: int, seed: int, interval: float
) -> dict[str, Any]:
    """Reuse the store if complete; otherwise run ``dplr generate`` and sample its RSS."""
    import psutil

    if store_ok(path, m, n, cr, max_rank, seed):
        print(f"reusing {path}", flush=True)
        return {"generated": False, "path": path}
    need = m * n * 4 * 1.1 + 2 * GiB
    free = shutil.disk_usage(os.path.dirname(path)).free
    if free < need:
        raise SystemExit(
            f"not enough disk under {os.path.dirname(path)}: {free / GiB:.1f} GiB free, need {need / GiB:.1f}"
        )
    cmd = [
        *dplr_exe(),
        "generate",
        "--rows", str(m),
        "--cols", str(n),
        "--kind", "lowrank",
        "--max-rank", str(max_rank),
        "--chunks", f"{cr},-1",
        "--dtype", "float32",
        "--seed", str(seed),
        "--overwrite",
        path,
    ]  # fmt: skip
    print("generating:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, ps.memory_info().rss)
        time.sleep(interval)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"dplr generate failed ({proc.returncode}):\n{err[-2000:]}")
    wall = time.perf_counter() - t0
    if not store_ok(path, m, n, cr, max_rank, seed):
        raise SystemExit(f"{path} is incomplete after generation")
    print(
        f"  generated in {wall:.0f} s, generator peak RSS {peak / MiB:.0f} MiB",
        flush=True,
    )
    return {
        "generated": True,
        "path": path,
        "command": " ".join(cmd[1:] if cmd[0].endswith("dplr") else cmd),
        "wall_s": round(wall, 1),
        "generator_peak_rss_MiB": round(peak / MiB, 1),
    }


def disk_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs
    )


# -- worker-side (shipped by value: this is __main__) -----------------------------------------
def worker_spill_state(dask_worker: Any) -> dict[str, Any]:
    """Spill state of one worker: current spilled bytes, managed memory, cumulative counters."""
    import os as _os

    data = dask_worker.data
    out: dict[str, Any] = {"pid": _os.getpid(), "status": dask_worker.status.name}
    st = getattr(data, "spilled_total", None)
    out["spilled_memory"] = int(st.memory) if st is not None else 0
    out["spilled_disk"] = int(st.disk) if st is not None else 0
    fast = getattr(data, "fast", None)
    out["managed_in_memory"] = int(getattr(fast, "total_weight", 0) or 0)
    cm = getattr(data, "cumulative_metrics", {})
    for label in ("disk-write", "disk-read"):
        out[f"{label}-bytes"] = float(cm.get((label, "bytes"), 0.0))
        out[f"{label}-count"] = float(cm.get((label, "count"), 0.0))
    return out


# -- sampling --------------------------------------------------------------------------------
def worker_processes() -> dict[int, Any]:
    """Worker processes of the LocalCluster: spawned children of this process."""
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "spawn_main" in " ".join(p.cmdline()):
                out[p.pid] = p
    return out


class Monitor:
    """RSS of every worker process (psutil) and of this process, plus worker spill state."""

    def __init__(
        self, client: Any | None, interval: float, spill_interval: float
    ) -> None:
        import psutil

        self.psutil = psutil
        self.client = client
        self.interval = interval
        self.spill_interval = spill_interval
        self.me = psutil.Process()
        self.peak: dict[int, int] = {}
        self.client_peak = 0
        self.n = 0
        self.spill_peak: dict[int, dict[str, int]] = {}
        self.paused_samples: dict[int, int] = {}
        self.n_spill = 0
        self.t0 = time.perf_counter()
        self.rss_timeline: list[list[Any]] = []  # [t, {pid: MiB}] every 10 RSS samples
        self.spill_timeline: list[
            list[Any]
        ] = []  # [t, {pid: [spilled MiB, managed MiB, status]}]
        self.spill_errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss, daemon=True)]
        if client is not None:
            self._threads.append(threading.Thread(target=self._spill, daemon=True))

    def _rss(self) -> None:
        procs = worker_processes()
        tick = 0
        while not self._stop.is_set():
            if tick % 20 == 0:  # pick up a restarted worker
                procs = worker_processes()
            for pid, p in list(procs.items()):
                try:
                    self.peak[pid] = max(self.peak.get(pid, 0), p.memory_info().rss)
                except self.psutil.Error:
                    procs.pop(pid, None)
            with contextlib.suppress(self.psutil.Error):
                self.client_peak = max(self.client_peak, self.me.memory_info().rss)
            if tick % 10 == 0:
                now = {}
                for pid, p in procs.items():
                    with contextlib.suppress(self.psutil.Error):
                        now[pid] = round(p.memory_info().rss / MiB)
                self.rss_timeline.append([round(time.perf_counter() - self.t0, 2), now])
            self.n += 1
            tick += 1
            self._stop.wait(self.interval)

    def _spill(self) -> None:
        while not self._stop.is_set():
            try:
                states = self.client.run(worker_spill_state)
            except Exception:  # noqa: BLE001 - a worker that is restarting
                self.spill_errors += 1
            else:
                for s in states.values():
                    pk = self.spill_peak.setdefault(
                        s["pid"],
                        {
                            "spilled_disk": 0,
                            "spilled_memory": 0,
                            "managed_in_memory": 0,
                        },
                    )
                    for key in pk:
                        pk[key] = max(pk[key], s[key])
                    if s["status"] == "paused":
                        self.paused_samples[s["pid"]] = (
                            self.paused_samples.get(s["pid"], 0) + 1
                        )
                self.n_spill += 1
                self.spill_timeline.append(
                    [
                        round(time.perf_counter() - self.t0, 2),
                        {
                            s["pid"]: [
                                round(s["spilled_disk"] / MiB),
                                round(s["managed_in_memory"] / MiB),
                                s["status"],
                            ]
                            for s in states.values()
                        },
                    ]
                )
            self._stop.wait(self.spill_interval)

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(2 * self.interval)
        self._stop.set()
        for t in self._threads:
            t.join()


# -- one run ----------------------------------------------------------------------------------
def run_factorize(
    source: Any, algorithm: str, args: argparse.Namespace, tag: str
) -> dict[str, Any]:
    from pipeline import factorize

    out = os.path.join(args.workdir, f"out-{tag}-{uuid.uuid4().hex[:8]}.zarr")
    ledger = os.path.join(args.workdir, f"ledger-{uuid.uuid4().hex[:8]}.json")
    try:
        f = factorize(
            source,
            args.rank,
            epsilon=args.epsilon,
            delta=args.delta,
            algorithm=algorithm,
            seed=0,
            out=out,
            overwrite=True,
            ledger=ledger,
            budget=(1e6, 0.5),
        )
        import numpy as np

        assert f.U.shape == (f.report["shape"][0], args.rank)
        assert np.all(np.isfinite(f.S))
        assert np.all(np.isfinite(f.U))
        rep = f.report
        return {
            "timings_s": rep.get("timings_seconds"),
            "t_v": [
                (rep.get("parameters") or {}).get(k)
                for k in ("sketch_size", "core_size")
            ],
            "n_passes": rep.get("n_passes"),
            "n_graph_tasks_pass": (rep.get("cluster") or {}).get("n_graph_tasks_pass"),
            "U_shape": list(f.U.shape),
            "out_disk_MiB": round(disk_bytes(out) / MiB, 1),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)
        for f_ in (ledger, ledger + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f_)


def measured_run(
    label: str,
    source: Any,
    m: int,
    n: int,
    algorithm: str,
    args: argparse.Namespace,
    client: Any | None,
    meter: Any,
) -> dict[str, Any]:
    quiet = meter.wait_quiet(args.max_foreign, args.max_wait)
    restarts0 = (
        len(client.get_events("worker-restart-memory")) if client is not None else 0
    )
    before = client.run(worker_spill_state) if client is not None else {}
    pids0 = sorted(s["pid"] for s in before.values())
    s0 = meter.start()
    with Monitor(client, args.interval, args.spill_interval) as mon:
        try:
            info = run_factorize(source, algorithm, args, label)
        except Exception as exc:  # noqa: BLE001 - record the failure (e.g. KilledWorker) with the memory data
            info = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    cpu = meter.stop(s0)
    wall = cpu["wall"]
    rec: dict[str, Any] = {
        "label": label,
        "algorithm": algorithm,
        "rows": m,
        "cols": n,
        "raw_GiB": round(m * n * 4 / GiB, 3),
        "wall_s": round(wall, 3),
        "GB_per_s": round(m * n * 4 / 1e9 / wall, 4),
        "foreign_cpu_share": round(cpu["foreign_cpu_share"], 3),
        "foreign_cpu_share_before": round(quiet["foreign_cpu_share"], 3),
        "waited_for_quiet_s": round(quiet["waited_s"], 1),
        "own_cpu_s": round(cpu["own_cpu_s"], 1),
        "client_peak_rss_MiB": round(mon.client_peak / MiB, 1),
        "n_rss_samples": mon.n,
        **info,
    }
    if client is not None:
        after = client.run(worker_spill_state)
        pids1 = sorted(s["pid"] for s in after.values())
        by_pid0 = {s["pid"]: s for s in before.values()}
        workers = []
        for addr, s in sorted(after.items()):
            b = by_pid0.get(s["pid"], {})
            sp = mon.spill_peak.get(s["pid"], {})
            workers.append(
                {
                    "worker": addr,
                    "pid": s["pid"],
                    "peak_rss_MiB": round(mon.peak.get(s["pid"], 0) / MiB, 1),
                    "spilled_written_MiB": round(
                        (s["disk-write-bytes"] - b.get("disk-write-bytes", 0.0)) / MiB,
                        1,
                    ),
                    "spill_writes": int(
                        s["disk-write-count"] - b.get("disk-write-count", 0.0)
                    ),
                    "unspilled_read_MiB": round(
                        (s["disk-read-bytes"] - b.get("disk-read-bytes", 0.0)) / MiB, 1
                    ),
                    "peak_spilled_on_disk_MiB": round(
                        sp.get("spilled_disk", 0) / MiB, 1
                    ),
                    "peak_managed_in_memory_MiB": round(
                        sp.get("managed_in_memory", 0) / MiB, 1
                    ),
                    "paused_samples": mon.paused_samples.get(s["pid"], 0),
                }
            )
        gone = [
            p for p in mon.peak if p not in pids1
        ]  # processes seen that are no longer workers
        restart_events = client.get_events("worker-restart-memory")[restarts0:]
        rec.update(
            {
                "workers": workers,
                "peak_rss_MiB_max": max(w["peak_rss_MiB"] for w in workers),
                "peak_rss_MiB_other_pids": {
                    str(p): round(mon.peak[p] / MiB, 1) for p in gone
                },
                "spilled_written_MiB_total": round(
                    sum(w["spilled_written_MiB"] for w in workers), 1
                ),
                "peak_spilled_on_disk_MiB_total": round(
                    sum(w["peak_spilled_on_disk_MiB"] for w in workers), 1
                ),
                "restart_memory_events": len(restart_events),
                "restart_event_details": [e[1] for e in restart_events],
                "worker_pids_changed": pids0 != pids1,
                "n_workers_after": len(after),
                "n_spill_samples": mon.n_spill,
                "rss_timeline_MiB": mon.rss_timeline,
                "spill_timeline_MiB": mon.spill_timeline,
                "peak_rss_MiB_by_phase": phase_peaks(
                    mon.rss_timeline, info.get("timings_s") or {}
                ),
                "spill_sample_errors": mon.spill_errors,
            }
        )
    return rec


def phase_peaks(
    timeline: list[list[Any]], timings: dict[str, float]
) -> dict[str, float]:
    """Largest sampled worker RSS (0.5 s timeline) during the pass and during post-processing."""
    t_pass = timings.get("plan", 0.0) + timings.get("pass", 0.0)
    out: dict[str, float] = {}
    for t, rss in timeline:
        phase = "pass" if t <= t_pass else "post_and_write"
        out[phase] = max(out.get(phase, 0), max(rss.values(), default=0))
    return out


def log_line(rec: dict[str, Any], limit: int | None) -> str:
    s = f"{rec['label']:>14} {rec['algorithm']:>9}: {rec['wall_s']:8.2f} s  {rec['GB_per_s']:.3f} GB/s"
    if "error" in rec:
        s += f"  FAILED: {rec['error'][:200]}"
    if "workers" in rec:
        rss = " / ".join(f"{w['peak_rss_MiB']:.0f}" for w in rec["workers"])
        s += (
            f"  peak RSS {rss} MiB (limit {limit / MiB:.0f})"
            f"  spilled {rec['spilled_written_MiB_total']:.0f} MiB"
            f"  restarts {rec['restart_memory_events']}"
        )
    else:
        s += f"  client peak RSS {rec['client_peak_rss_MiB']:.0f} MiB"
    return s + f"  (foreign CPU {100 * rec['foreign_cpu_share']:.0f}%)"


def worker_warnings(client: Any) -> list[str]:
    lines = []
    with contextlib.suppress(Exception):
        for addr, logs in client.get_worker_logs(n=200).items():
            for level, msg in logs:
                if level in ("WARNING", "ERROR", "CRITICAL"):
                    lines.append(f"{addr} {level}: {msg[:300]}")
    return lines


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        import json

        with open(args.render) as f:
            res = json.load(f)
        with open(os.path.splitext(args.render)[0] + ".md", "w") as f:
            f.write(markdown(res))
        return 0
    import cloudpickle
    import dask
    import numpy as np
    import zarr
    from bench_lrf import CpuMeter
    from dask.utils import parse_bytes
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(C)  # worker_gc runs on the workers
    os.makedirs(args.workdir, exist_ok=True)
    m, n, cr = args.rows, args.cols, args.chunk_rows
    ms = m // args.small_fraction
    limit = parse_bytes(args.memory_limit)
    print(
        f"{time.strftime('%H:%M:%S')} df {args.workdir}: {shutil.disk_usage(args.workdir).free / GiB:.1f} GiB free",
        flush=True,
    )
    big = store_path(args.workdir, m, n, cr, args.max_rank, 0)
    small = store_path(args.workdir, ms, n, cr, args.max_rank, 1)
    gen = {
        "big": ensure_store(big, m, n, cr, args.max_rank, 0, args.interval),
        "small": ensure_store(small, ms, n, cr, args.max_rank, 1, args.interval),
    }
    for key, path in (("big", big), ("small", small)):
        gen[key].update(
            {
                "shape": [m if key == "big" else ms, n],
                "chunks": list(zarr.open_array(path, mode="r").chunks),
                "raw_GiB": round((m if key == "big" else ms) * n * 4 / GiB, 3),
                "disk_GiB": round(disk_bytes(path) / GiB, 3),
                "compressors": [
                    repr(c) for c in (zarr.open_array(path, mode="r").compressors or ())
                ],
            }
        )
    meter = CpuMeter()
    runs: list[dict[str, Any]] = []
    warnings: list[str] = []
    spill_dir = os.path.join(args.workdir, "dask-scratch")
    t_start = time.perf_counter()
    with dask.config.set(MEMORY_THRESHOLDS):
        cluster = LocalCluster(
            n_workers=args.n_workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=args.memory_limit,
            local_directory=spill_dir,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)  # the default client: factorize() uses it
        client.wait_for_workers(args.n_workers)
        try:
            eff = client.run(
                lambda dask_worker: {
                    "memory_limit": dask_worker.memory_manager.memory_limit,
                    "target": dask_worker.memory_manager.memory_target_fraction,
                    "spill": dask_worker.memory_manager.memory_spill_fraction,
                    "pause": dask_worker.memory_manager.memory_pause_fraction,
                    "nthreads": dask_worker.state.nthreads,
                }
            )
            print("workers:", eff, flush=True)
            for alg in args.algorithms:
                print(
                    f"{time.strftime('%H:%M:%S')} warm-up ({alg}, small store, discarded)",
                    flush=True,
                )
                run_factorize(small, alg, args, "warmup")
                order = [("small_zarr", small, ms)] * args.small_repeat + [
                    ("big_zarr", big, m),
                    ("small_zarr", small, ms),
                ]
                for label, path, rows in order:
                    C.collect_everywhere(client)
                    rec = measured_run(label, path, rows, n, alg, args, client, meter)
                    runs.append(rec)
                    print(
                        f"{time.strftime('%H:%M:%S')} " + log_line(rec, limit),
                        flush=True,
                    )
            warnings = worker_warnings(client)
        finally:
            client.close()
            cluster.close()
    if not args.no_numpy:
        A = np.asarray(zarr.open_array(small, mode="r")[...])
        for alg in args.algorithms:
            run_factorize(A, alg, args, "warmup-np")
            rec = measured_run("small_numpy", A, ms, n, alg, args, None, meter)
            runs.append(rec)
            print(f"{time.strftime('%H:%M:%S')} " + log_line(rec, limit), flush=True)
        del A
    total_wall = time.perf_counter() - t_start

    summary = summarise(runs, args, m, ms, limit)
    res = {
        "benchmark": "bench_outofcore",
        "command": "python benchmarks/bench_outofcore.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": C.machine(),
        "versions": C.versions(),
        "params": {
            "rows": m,
            "small_rows": ms,
            "cols": n,
            "chunk_rows": cr,
            "chunk_MiB": round(cr * n * 4 / MiB, 1),
            "rank": args.rank,
            "epsilon": args.epsilon,
            "delta": args.delta,
            "algorithms": args.algorithms,
            "cluster": f"LocalCluster(n_workers={args.n_workers}, threads_per_worker=1, processes=True, "
            f'memory_limit="{args.memory_limit}")',
            "memory_limit_bytes": limit,
            "memory_thresholds": {
                k.rsplit(".", 1)[1]: v for k, v in MEMORY_THRESHOLDS.items()
            },
            "rss_interval_s": args.interval,
            "spill_interval_s": args.spill_interval,
            "max_rank": args.max_rank,
            "workdir": args.workdir,
        },
        "stores": gen,
        "summary": summary,
        "runs": runs,
        "worker_log_warnings": warnings[-100:],
        "total_wall_s": round(total_wall, 1),
    }
    C.dump_json(res, args.out)
    md = markdown(res)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md)
    print()
    print(md)
    print(f"wrote {args.out}")
    if args.cleanup:
        for path in (big, small):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(spill_dir, ignore_errors=True)
        print(f"deleted {big} and {small}")
    return 0


def summarise(
    runs: list[dict[str, Any]], args: argparse.Namespace, m: int, ms: int, limit: int
) -> list[dict[str, Any]]:
    scale = m / ms
    out = []
    for alg in args.algorithms:
        bigs = [r for r in runs if r["algorithm"] == alg and r["label"] == "big_zarr"]
        szc = [
            r["own_cpu_s"]
            for r in runs
            if r["algorithm"] == alg and r["label"] == "small_zarr"
        ]
        sz = [
            r["wall_s"]
            for r in runs
            if r["algorithm"] == alg and r["label"] == "small_zarr"
        ]
        snp = [
            r["wall_s"]
            for r in runs
            if r["algorithm"] == alg and r["label"] == "small_numpy"
        ]
        if not bigs:
            continue
        b = bigs[0]
        row: dict[str, Any] = {
            "algorithm": alg,
            "big_wall_s": b["wall_s"],
            "big_GB_per_s": b["GB_per_s"],
            "big_peak_rss_MiB": [w["peak_rss_MiB"] for w in b["workers"]],
            "big_peak_rss_over_limit": round(b["peak_rss_MiB_max"] * MiB / limit, 3),
            "big_under_limit": b["peak_rss_MiB_max"] * MiB < limit,
            "big_spilled_written_MiB": b["spilled_written_MiB_total"],
            "big_restarts": b["restart_memory_events"] + int(b["worker_pids_changed"]),
            "small_zarr_wall_s_median": statistics.median(sz) if sz else None,
            "small_zarr_wall_s_all": sz,
            "scale": scale,
        }
        if sz:
            row["small_zarr_scaled_s"] = round(scale * statistics.median(sz), 3)
            row["ratio_big_over_scaled_small_zarr"] = round(
                b["wall_s"] / row["small_zarr_scaled_s"], 3
            )
            # CPU seconds of this process tree (client, scheduler, workers): less
            # sensitive than wall time to other processes on a shared machine
            row["cpu_ratio_big_over_scaled_small_zarr"] = round(
                b["own_cpu_s"] / (scale * statistics.median(szc)), 3
            )
        if snp:
            row["small_numpy_wall_s"] = statistics.median(snp)
            row["small_numpy_scaled_s"] = round(scale * statistics.median(snp), 3)
            row["ratio_big_over_scaled_small_numpy"] = round(
                b["wall_s"] / row["small_numpy_scaled_s"], 3
            )
        out.append(row)
    return out


def markdown(res: dict[str, Any]) -> str:
    p = res["params"]
    lim = p["memory_limit_bytes"] / MiB
    scale = p["rows"] / p["small_rows"]
    big, small = res["stores"]["big"], res["stores"]["small"]
    lines = [
        (
            f"{p['cluster']}, thresholds {p['memory_thresholds']}; k={p['rank']}, eps={p['epsilon']:g}, "
            f"delta={p['delta']:g}; chunks {p['chunk_rows']} x {p['cols']} float32 ({p['chunk_MiB']:g} MiB); "
            f"RSS sampled every {1000 * p['rss_interval_s']:.0f} ms; {res['machine']['date']}"
        ),
        "",
        (
            "Other processes used a median "
            f"{100 * statistics.median(r['foreign_cpu_share'] for r in res['runs']):.0f}% of the CPUs during "
            "the runs (column foreign CPU): compare CPU seconds (own CPU s: client, scheduler and "
            "workers) rather than wall times when that share is high."
        ),
        "",
        (
            f"Stores: big {big['shape'][0]} x {big['shape'][1]} ({big['raw_GiB']:g} GiB raw, {big['disk_GiB']:g} GiB on disk); "
            f"small {small['shape'][0]} x {small['shape'][1]} ({small['raw_GiB']:g} GiB raw, {small['disk_GiB']:g} GiB on disk)."
        ),
        "",
        (
            "| run | algorithm | rows | raw GiB | wall s | GB/s | pass / post s | peak RSS per worker MiB (limit "
            f"{lim:.0f}) | spilled MiB (written / peak on disk) | restarts | own CPU s | foreign CPU | wall / (scaled small) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summ = {s["algorithm"]: s for s in res["summary"]}
    for r in res["runs"]:
        ts = r.get("timings_s") or {}
        pp = f"{ts.get('pass', float('nan')):.1f} / {ts.get('post', float('nan')):.1f}"
        if "workers" in r:
            rss = " / ".join(f"{w['peak_rss_MiB']:.0f}" for w in r["workers"])
            spill = f"{r['spilled_written_MiB_total']:.0f} / {r['peak_spilled_on_disk_MiB_total']:.0f}"
            rst = str(r["restart_memory_events"] + int(r["worker_pids_changed"]))
        else:
            rss = f"(in-process; client {r['client_peak_rss_MiB']:.0f})"
            spill, rst = "-", "-"
        ratio = "-"
        s = summ.get(r["algorithm"], {})
        if r["label"] == "big_zarr":
            parts = []
            if "ratio_big_over_scaled_small_zarr" in s:
                parts.append(f"{s['ratio_big_over_scaled_small_zarr']:.2f} (zarr)")
            if "ratio_big_over_scaled_small_numpy" in s:
                parts.append(f"{s['ratio_big_over_scaled_small_numpy']:.2f} (numpy)")
            ratio = ", ".join(parts) or "-"
        lines.append(
            f"| {r['label']}{' FAILED' if 'error' in r else ''} | {r['algorithm']} | {r['rows']} | {r['raw_GiB']:g} | {r['wall_s']:.2f} | {r['GB_per_s']:.3f} | {pp} | "
            f"{rss} | {spill} | {rst} | {r['own_cpu_s']:.0f} | {100 * r['foreign_cpu_share']:.0f}% | {ratio} |"
        )
    lines += [
        "",
        (
            f"| algorithm | big wall s | small (Zarr, cluster) median s x {scale:g} | ratio | small (numpy, in memory) s x {scale:g} | ratio | "
            "CPU-s ratio (zarr) | big peak RSS / limit | big spilled MiB | restarts |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in res["summary"]:
        lines.append(
            f"| {s['algorithm']} | {s['big_wall_s']:.1f} | {s.get('small_zarr_scaled_s', float('nan')):.1f} | "
            f"{s.get('ratio_big_over_scaled_small_zarr', float('nan')):.2f} | {s.get('small_numpy_scaled_s', float('nan')):.1f} | "
            f"{s.get('ratio_big_over_scaled_small_numpy', float('nan')):.2f} | "
            f"{s.get('cpu_ratio_big_over_scaled_small_zarr', float('nan')):.2f} | {s['big_peak_rss_over_limit']:.2f} | "
            f"{s['big_spilled_written_MiB']:.0f} | {s['big_restarts']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
