"""PCA's passes against their floor, in one run on one generated store.

Measured, on a 2-worker, 1-thread LocalCluster (the README's benchmark cluster):

* ``read``        one read pass over the store in the PCA's row bands (each band
                  decoded and reduced to a scalar: the pass's work is the read);
* ``gram_floor``  the float64 Gram products ``X.T @ X`` of bands of the same shape,
                  in memory, on the same workers, one thread each: the slowest
                  worker's median time per band times ``ceil(bands / workers)``;
* ``update_floor`` the same for the power method's skinny products ``a @ Y`` and
                  ``P.T @ a`` (``Y`` of shape (d, k));
* Analyze Gauss (``pipeline.pca(..., method="analyze-gauss")``): the report's
  ``timings_seconds`` and the wall time of its one pass (timed on the client
  around each pass the row source issues);
* the power method (``T`` iterations, clip radius ``R``): the same, its passes
  summed, and its time outside the passes (``total`` minus the passes).

Printed ratios, against the targets:

* Analyze Gauss pass <= 1.3 x (read + gram_floor);
* power passes <= Analyze Gauss pass + 1.5 read passes;
* power time outside its passes <= 1 s.

Benchmarks, not tests: the machine may be shared, so compare runs made back to
back.

    python benchmarks/bench_pca_floor.py                 # 200000 x 1000, chunks of 10000 rows
    python benchmarks/bench_pca_floor.py --rows 40000    # a quick run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

#: Targets of the acceptance (ratios; seconds for the outside time).
AG_OVER_FLOOR = 1.3
POWER_EXTRA_READS = 1.5
POWER_OUTSIDE_S = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--chunk-rows", type=int, default=10_000)
    p.add_argument("--rank", type=int, default=5)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--clip-radius", type=float, default=0.05)
    p.add_argument("--repeat", type=int, default=1, help="runs of each measurement")
    p.add_argument("--workdir", default=C.WORK)
    p.add_argument("--json", default=None, help="write the results here")
    return p.parse_args(argv)


def _band_scalar(block: np.ndarray) -> np.ndarray:
    """A band reduced to one number: the work of a read pass is the read itself."""
    return np.array([[float(block[0, 0]) if block.size else 0.0]])


def _median_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    fn()  # warm the BLAS code path and the allocator
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def worker_floors(rows: int, cols: int, rank: int) -> dict[str, float]:
    """Seconds per band of the in-memory float64 products (one worker, its one thread)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, cols))
    Y = rng.standard_normal((cols, rank))
    P = a @ Y
    return {
        "gram": _median_time(lambda: a.T @ a),
        "update": _median_time(lambda: (a @ Y, P.T @ a)),
    }


class PassClock:
    """Wall time of every pass the Dask row source issues (patched on the client)."""

    def __init__(self) -> None:
        from pipeline.execution.pca import DaskRowSource

        self.cls = DaskRowSource
        self.orig = DaskRowSource._pass
        self.times: list[float] = []
        orig, times = self.orig, self.times

        def timed(src: Any, *args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(src, *args, **kw)
            finally:
                times.append(time.perf_counter() - t0)

        DaskRowSource._pass = timed  # type: ignore[method-assign]

    def take(self) -> list[float]:
        out = list(self.times)
        self.times.clear()
        return out

    def close(self) -> None:
        self.cls._pass = self.orig  # type: ignore[method-assign]


def run_pca(
    path: str, args: argparse.Namespace, method: str, clock: PassClock
) -> dict[str, Any]:
    import pipeline

    kw: dict[str, Any] = {}
    if method == "power":
        kw = {"iterations": args.iterations, "clip_radius": args.clip_radius}
    with tempfile.TemporaryDirectory(prefix="dplr-bench-ledger-") as tmp:
        clock.take()
        t0 = time.perf_counter()
        rel = pipeline.pca(
            path, args.rank, epsilon=1.0, delta=1e-6, method=method,
            ledger=os.path.join(tmp, "ledger.json"), budget=(1e6, 0.5),
            insecure_noise_seed=0, **kw,
        )  # fmt: skip
        wall = time.perf_counter() - t0
    passes = clock.take()
    t = rel.report["timings_seconds"]
    return {
        "wall": wall,
        "timings": t,
        "passes": passes,
        "passes_sum": sum(passes),
        "outside": wall - sum(passes),
        "n_passes": rel.report["n_passes"],
    }


def summary(res: dict[str, Any], per_worker: int) -> list[str]:
    """The measured times (medians over the repeats) and the ratios against the targets."""
    ags, pows, per_band = res["analyze_gauss"], res["power"], res["per_band_s"]
    read = float(np.median(res["read_s"]))
    gram_floor, update_floor = res["gram_floor_s"], res["update_floor_s"]
    ag_pass = float(np.median([r["passes"][0] for r in ags]))
    ag_report_pass = float(np.median([r["timings"]["pass"] for r in ags]))
    ag_outside = float(np.median([r["outside"] for r in ags]))
    pw_passes = float(np.median([r["passes_sum"] for r in pows]))
    pw_outside = float(np.median([r["outside"] for r in pows]))
    upd = pows[0]["passes"][1:]
    per_update = sum(upd) / max(1, len(upd))
    spent = "+".join(f"{p:.2f}" for p in pows[0]["passes"])
    T = res["config"]["iterations"]
    return [
        f"read pass                      {read:8.3f} s",
        f"gram floor (in memory)         {gram_floor:8.3f} s"
        + f" ({per_worker} bands x {per_band['gram']:.3f} s per worker)",
        f"update floor (in memory)       {update_floor:8.3f} s",
        f"analyze-gauss pass             {ag_pass:8.3f} s"
        + f" (report pass {ag_report_pass:.3f} s; outside the pass {ag_outside:.3f} s)",
        f"  / (read + gram floor)        {ag_pass / (read + gram_floor):8.2f}"
        + f"   target <= {AG_OVER_FLOOR}",
        f"power T={T} passes {spent} = {pw_passes:.3f} s"
        + f" (report {pows[0]['timings']})",
        f"  / (AG pass + {POWER_EXTRA_READS} reads)     "
        + f"{pw_passes / (ag_pass + POWER_EXTRA_READS * read):8.2f}   target <= 1",
        f"  update pass / (read + update floor) {per_update / (read + update_floor):.2f}",
        f"power outside its passes       {pw_outside:8.3f} s   target <= {POWER_OUTSIDE_S}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipeline.api import PCA_BAND_BYTES
    from pipeline.io import open_input

    path = C.ensure_store(args.rows, args.cols, args.chunk_rows, workdir=args.workdir)
    cluster, client = C.start_cluster(2)
    clock = PassClock()
    try:
        arr, _ = open_input(path, unit=None, band_bytes=PCA_BAND_BYTES)
        bands = [int(c) for c in arr.chunks[0]]
        n_workers = len(client.scheduler_info()["workers"])
        print(
            f"store {path}: {args.rows} x {args.cols} float32, {len(bands)} row bands of "
            f"{bands[0]} rows; {n_workers} workers x 1 thread "
            f"(BLAS threads {sorted(set(client.run(C.blas_threads).values()))})",
            flush=True,
        )
        reads, ags, pows = [], [], []
        floors = client.run(worker_floors, bands[0], args.cols, args.rank)
        per_band = {k: max(f[k] for f in floors.values()) for k in ("gram", "update")}
        per_worker = math.ceil(len(bands) / n_workers)
        run_pca(path, args, "analyze-gauss", clock)  # warm-up (imports, worker caches)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            arr.map_blocks(
                _band_scalar, chunks=(1, 1), dtype=np.float64
            ).sum().compute()
            reads.append(time.perf_counter() - t0)
            ags.append(run_pca(path, args, "analyze-gauss", clock))
            pows.append(run_pca(path, args, "power", clock))
    finally:
        clock.close()
        client.close()
        cluster.close()
    res = {
        "machine": C.machine(),
        "store": C.store_info(path),
        "config": vars(args) | {"bands": len(bands), "band_rows": bands[0]},
        "read_s": reads,
        "per_band_s": per_band,
        "gram_floor_s": per_worker * per_band["gram"],
        "update_floor_s": per_worker * per_band["update"],
        "analyze_gauss": ags,
        "power": pows,
    }
    print("\n".join(summary(res, per_worker)), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
