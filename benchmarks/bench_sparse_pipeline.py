"""Sparse inputs end to end: a pass's time against the non-zeros, and a private
factorization of a CSR store against the same matrix stored dense.

At fixed ``m x n`` it writes CSR stores (``write_csr``) of two densities, and the
denser one also as a dense Zarr array (float64, row chunks), then runs on one
LocalCluster (``--workers`` processes, one thread each, BLAS pinned):

* one pass: a non-private Spectral-LRF (a single pass over the input) at each
  density; the ratio of their pass times against the ratio of the non-zeros;
* a private factorization (``--algorithm``, default two-pass) of the CSR store and
  of the dense store of the same matrix, with the same seeds;
* the same private factorization of a CSR store of ``--fixed-rows`` rows (1 000):
  a job's fixed cost (planning, the round trips of its steps, the journal's and
  the ledger's durable writes, the client's SVDs of the v x n and t x t
  statistics), which bounds the dense / CSR ratio at a given size: it is at most
  the dense time over this one.

A measurement, not a test: best of ``--repeat`` runs, wall clock, printed as a
table. The stores go under ``benchmarks/work/`` (git-ignored) and are reused.

    python benchmarks/bench_sparse_pipeline.py --rows 100000 --cols 2000
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr
from distributed import Client, LocalCluster
from zarr.codecs import BloscCodec

import pipeline
from pipeline.io.csr import WRITE_CODEC, write_csr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lrf import CpuMeter

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")
BAND = 10_000
DENSE_CHUNK_ENTRIES = 20_000_000
METER = CpuMeter()
#: CPU seconds of each best run, in the order of the table's rows
CPU: list[float] = []


def _bands(m: int, n: int, density: float, seed: int) -> Any:
    for b, r0 in enumerate(range(0, m, BAND)):
        rng = np.random.default_rng([seed, b])
        rows = min(BAND, m - r0)
        x = sp.random(rows, n, density=density, format="csr", rng=rng)
        x.data = rng.standard_normal(x.nnz)
        yield x


def csr_store(m: int, n: int, density: float) -> str:
    """The CSR store of the matrix, written by ``write_csr`` (again when a
    store kept from an earlier run has another codec than it writes now)."""
    path = os.path.join(WORK, f"sparse_{m}x{n}_d{density:g}.zarr")
    if not os.path.exists(path) or not _current_codec(path):
        write_csr(path, _bands(m, n, density, 0), shape=(m, n), overwrite=True)
    return path


def _current_codec(path: str) -> bool:
    codecs = zarr.open_group(path, mode="r")["indices"].metadata.codecs
    kept, want = codecs[-1], WRITE_CODEC
    return isinstance(kept, BloscCodec) and (
        (kept.cname, kept.clevel, kept.shuffle)
        == (want.cname, want.clevel, want.shuffle)
    )


def dense_chunk_rows(n: int) -> int:
    """Rows of the dense store's chunks: ``BAND``, or fewer for wide matrices so
    that a chunk holds at most :data:`DENSE_CHUNK_ENTRIES` float64 entries (160 MB),
    as a user would chunk a wide store."""
    return max(1, min(BAND, DENSE_CHUNK_ENTRIES // n))


def dense_store(m: int, n: int, density: float) -> str:
    """The same matrix as :func:`csr_store`, densified band by band."""
    path = os.path.join(WORK, f"dense_{m}x{n}_d{density:g}.zarr")
    if not os.path.exists(path):
        z = zarr.create_array(
            store=path + ".tmp", shape=(m, n), chunks=(dense_chunk_rows(n), n),
            dtype="float64",
        )  # fmt: skip
        for b, x in enumerate(_bands(m, n, density, 0)):
            z[b * BAND : b * BAND + x.shape[0]] = x.toarray()
        os.rename(path + ".tmp", path)
    return path


def best(fn: Any, repeat: int) -> tuple[float, Any]:
    """The best wall time of ``repeat`` runs, and the last result; the CPU
    seconds of this process tree (client, scheduler, workers) of that best run
    are kept in :data:`CPU` (less sensitive to other processes than wall time)."""
    ((t, out),) = best_interleaved([fn], repeat)
    return t, out


def best_interleaved(fns: list[Any], repeat: int) -> list[tuple[float, Any]]:
    """:func:`best` of each of ``fns``, their runs taken in turn (A B A B ...),
    so that a slower spell of the machine falls on all of them alike; their
    CPU seconds are appended to :data:`CPU` in the order of ``fns``."""
    times: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    outs: list[Any] = [None for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            s = METER.start()
            outs[i] = fn()
            got = METER.stop(s)
            times[i].append(got["wall"])
            cpus[i].append(got["own_cpu_s"])
    for t, c in zip(times, cpus, strict=True):
        CPU.append(c[int(np.argmin(t))])
    return [(min(t), out) for t, out in zip(times, outs, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cols", type=int, default=2_000)
    ap.add_argument("--low", type=float, default=0.001)
    ap.add_argument("--high", type=float, default=0.01)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--algorithm", default="two-pass")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fixed-rows", type=int, default=1_000)
    ap.add_argument(
        "--name", default=None, help="results file name (default sparse_pipeline_MxN)"
    )
    args = ap.parse_args()
    m, n, k = args.rows, args.cols, args.rank
    os.makedirs(WORK, exist_ok=True)
    low, high = csr_store(m, n, args.low), csr_store(m, n, args.high)
    tiny = csr_store(args.fixed_rows, n, args.high)
    dense = dense_store(m, n, args.high)
    private = {"epsilon": 1.0, "delta": 1e-6, "seed": 1, "insecure_noise_seed": 2}
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True,
            dashboard_address=None,
        ) as cluster,
        Client(cluster),
    ):  # fmt: skip
        rows = []
        for name, path in ((f"CSR {args.low:g}", low), (f"CSR {args.high:g}", high)):
            t, _ = best(
                lambda p=path: pipeline.factorize(
                    p, k, private=False, algorithm="spectral", seed=1
                ),
                args.repeat,
            )
            rows.append((f"one pass (non-private spectral), {name}", t))
        results = {}
        pair = (("CSR", high), ("dense", dense))
        timed = best_interleaved(
            [
                lambda p=path: pipeline.factorize(
                    p, k, algorithm=args.algorithm, budget=(1e6, 0.5), **private
                )
                for _, path in pair
            ],
            args.repeat,
        )
        for (name, _), (t, f) in zip(pair, timed, strict=True):
            results[name] = f
            rows.append((f"private {args.algorithm}, density {args.high:g}, {name}", t))
        t, _ = best(
            lambda: pipeline.factorize(
                tiny, k, algorithm=args.algorithm, budget=(1e6, 0.5), **private
            ),
            args.repeat,
        )
        rows.append((f"private {args.algorithm}, CSR, {args.fixed_rows} rows", t))
    write_report(args, rows, results["CSR"].S, results["dense"].S)


def write_report(
    args: argparse.Namespace, rows: list[tuple[str, float]], s_csr: Any, s_dense: Any
) -> None:
    """Print the table and write it to ``benchmarks/results/`` (``--name``)."""
    m, n, k = args.rows, args.cols, args.rank
    ratio, speedup = rows[1][1] / rows[0][1], rows[3][1] / rows[2][1]
    diff = float(np.max(np.abs(s_csr - s_dense)) / np.max(np.abs(s_dense)))
    pass_ratio = (
        f"pass time ratio {args.high:g} / {args.low:g}: {ratio:.2f} "
        f"(non-zeros ratio {args.high / args.low:g})"
    )
    dense_ratio = (
        f"private factorization, dense / CSR time: {speedup:.1f}x "
        f"(CPU seconds: {CPU[3] / CPU[2]:.1f}x)"
    )
    fixed = (
        f"a job's fixed cost ({args.fixed_rows} rows) {rows[4][1]:.2f} s: "
        f"dense / fixed cost = {rows[3][1] / rows[4][1]:.1f}x bounds the ratio"
    )
    table = [
        f"{name:<58} {t:8.2f} {cpu:8.2f}"
        for (name, t), cpu in zip(rows, CPU, strict=True)
    ]
    lines = [
        f"m x n = {m} x {n}, rank {k}, {args.workers} workers x 1 thread",
        f"{'run':<58} {'seconds':>8} {'CPU s':>8}",
        *table,
        pass_ratio,
        dense_ratio,
        fixed,
        f"released S, CSR vs dense: max relative difference {diff:.2e}",
    ]
    print("\n".join(lines))
    name = args.name or f"sparse_pipeline_{m}x{n}"
    argv = " ".join(sys.argv[1:])
    with open(os.path.join(HERE, "results", f"{name}.md"), "w") as fh:
        fh.write(
            f"`python benchmarks/bench_sparse_pipeline.py {argv}`\n\n"
            f"{datetime.date.today()}; {os.cpu_count()} CPUs; best of {args.repeat} "
            "runs per row (wall seconds, and the CPU seconds of that run's process "
            "tree); the private CSR and dense runs taken in turn.\n\n```\n"
            + "\n".join(lines)
            + "\n```\n"
        )


if __name__ == "__main__":
    main()
