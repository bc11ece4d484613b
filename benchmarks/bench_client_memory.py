"""Peak RSS of the ``dplr factorize`` process (the client) as the rows grow.

Usage::

    python benchmarks/bench_client_memory.py                       # m = 2^18 .. 2^22
    python benchmarks/bench_client_memory.py --rows-log2 18 20 --repeat 1

For each m (n = 64 columns, chunks of 16384 rows x all columns, float32, the
same chunk shape for every m) it runs ``dplr factorize STORE --rank 10
--epsilon 1 --delta 1e-6 --out OUT`` as a subprocess connected to a 2-worker
LocalCluster that this script starts (``--scheduler``), so that the measured
process is the client alone: the workers are not its children. The peak RSS is
the kernel's high-water mark ``VmHWM`` of that process (``/proc/PID/status``),
polled every 20 ms until it exits; the release ``OUT`` is written every time.

Criterion (client memory independent of m): the peak at the largest m
is less than 1.10x the peak at the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C

MiB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows-log2", type=int, nargs="+", default=[18, 19, 20, 21, 22])
    p.add_argument("--cols", type=int, default=64)
    p.add_argument("--chunk-rows", type=int, default=16384)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", default=C.WORK)
    p.add_argument("--out", default=os.path.join(HERE, "results", "client_memory.json"))
    return p.parse_args(argv)


def _hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_client(store: str, out: str, rank: int, scheduler: str) -> dict[str, float]:
    """One ``dplr factorize`` run; its peak RSS (MiB) and wall time."""
    ledger = out + ".ledger.json"
    for stale in (out, ledger, ledger + ".lock"):
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.remove(stale)
    cmd = [
        sys.executable, "-m", "pipeline.cli", "factorize", store, "--rank", str(rank),
        "--epsilon", "1", "--delta", "1e-6", "--out", out, "--ledger", ledger,
        "--budget-epsilon", "10", "--budget-delta", "1e-4", "--scheduler", scheduler,
        "--quiet",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        hwm = _hwm_kib(proc.pid)
        if hwm is not None:
            peak = max(peak, hwm)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"dplr factorize failed: {proc.stderr.read().decode()[-2000:]}")
    if not os.path.isdir(out):
        raise RuntimeError("OUT was not written")
    return {"peak_rss_MiB": round(peak * 1024 / MiB, 1), "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster, client = C.start_cluster(2)
    rows = []
    try:
        for e in args.rows_log2:
            m = 2**e
            store = C.ensure_store(m, args.cols, args.chunk_rows, workdir=args.workdir)
            out = os.path.join(args.workdir, f"client_memory_release_{e}.zarr")
            runs = [
                run_client(store, out, args.rank, cluster.scheduler_address)
                for _ in range(args.repeat)
            ]
            peak = min(r["peak_rss_MiB"] for r in runs)
            u_mib = m * args.rank * 8 / MiB
            rows.append({"m": m, "log2_m": e, "peak_rss_MiB": peak, "U_MiB": round(u_mib, 1),
                         "runs": runs, "chunks": -(-m // args.chunk_rows)})  # fmt: skip
            print(f"m=2^{e}: client peak RSS {peak:.1f} MiB (U would be {u_mib:.1f} MiB)")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        client.close()
        cluster.close()
    growth = rows[-1]["peak_rss_MiB"] / rows[0]["peak_rss_MiB"] - 1
    result = {
        "machine": C.machine(), "versions": C.versions(), "n": args.cols,
        "chunk_rows": args.chunk_rows, "rank": args.rank, "rows": rows,
        "growth_first_to_last": round(growth, 4), "criterion": "< 0.10",
    }  # fmt: skip
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    lines = ["| m | chunks | client peak RSS (MiB) | U if loaded (MiB) | wall (s) |",
             "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| 2^{r['log2_m']} | {r['chunks']} | {r['peak_rss_MiB']:.1f} | "
                     f"{r['U_MiB']:.1f} | {r['runs'][0]['wall_s']:.1f} |")  # fmt: skip
    lines.append(f"\ngrowth of the peak, first to last m: {100 * growth:+.1f} %")
    with open(os.path.splitext(args.out)[0] + ".md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
