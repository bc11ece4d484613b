"""Shared helpers of the benchmark scripts (not part of the package).

Everything that runs on a worker lives here and is shipped *by value*
(``cloudpickle.register_pickle_by_value``), so the workers need not import
``benchmarks/``.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")  # git-ignored


# -- stores --------------------------------------------------------------------------
def store_path(
    m: int,
    n: int,
    chunk_rows: int,
    *,
    workdir: str = WORK,
    seed: int = 0,
    decay: float = 0.9,
) -> str:
    return os.path.join(
        workdir, f"lrf_{m}x{n}_r{chunk_rows}_f32_geo{decay:g}_s{seed}.zarr"
    )


def ensure_store(
    m: int,
    n: int,
    chunk_rows: int,
    *,
    workdir: str = WORK,
    seed: int = 0,
    decay: float = 0.9,
    log: Any = print,
) -> str:
    """Generate the synthetic store once (default zstd codec); reuse it if present."""
    import zarr

    from pipeline.io.synthetic import generate_store

    path = store_path(m, n, chunk_rows, workdir=workdir, seed=seed, decay=decay)
    if os.path.exists(path):
        try:
            z = zarr.open_array(path, mode="r")
            ok = (
                z.shape == (m, n)
                and z.chunks == (min(chunk_rows, m), n)
                and "dplr_synthetic" in z.attrs
            )
        except Exception:  # noqa: BLE001 - any unreadable store is regenerated
            ok = False
        if ok:
            log(f"reusing {path}")
            return path
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    log(f"generating {path} ({m}x{n} float32, chunks ({chunk_rows}, {n})) ...")
    generate_store(
        path,
        m,
        n,
        spectrum="geometric",
        decay=decay,
        chunks=(chunk_rows, -1),
        dtype="float32",
        seed=seed,
        overwrite=True,
    )
    log(f"  generated in {time.perf_counter() - t0:.1f} s")
    return path


def singular_values(path: str) -> np.ndarray:
    import zarr

    z = zarr.open_array(path, mode="r")
    return np.asarray(z.attrs["dplr_synthetic"]["singular_values"], dtype=np.float64)


def store_info(path: str) -> dict[str, Any]:
    import zarr

    z = zarr.open_array(path, mode="r")
    disk = 0
    for root, _, files in os.walk(path):
        disk += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return {
        "path": os.path.relpath(path, os.path.dirname(HERE)),
        "shape": list(z.shape),
        "chunks": list(z.chunks),
        "dtype": str(z.dtype),
        "compressors": [repr(c) for c in (z.compressors or ())],
        "raw_MiB": round(z.nbytes / 2**20, 1),
        "disk_MiB": round(disk / 2**20, 1),
    }


# -- cluster --------------------------------------------------------------------------
def start_cluster(n_workers: int = 2) -> tuple[Any, Any]:
    import _common  # this module, shipped by value to the workers
    import cloudpickle
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(_common)
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=40,
    )
    client = Client(cluster)  # becomes the default client: factorize() uses it
    client.wait_for_workers(n_workers)
    return cluster, client


def worker_gc() -> int:
    gc.collect()
    import contextlib
    import ctypes

    # return freed heap to the OS so that RSS reflects live memory (glibc only)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return 0


def collect_everywhere(client: Any) -> None:
    gc.collect()
    client.run(worker_gc)


def machine() -> dict[str, Any]:
    import psutil

    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "ram_GiB": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict[str, str]:
    from pipeline.api import package_versions

    return package_versions(extra=("numcodecs", "psutil"))


# -- statistics -----------------------------------------------------------------------
def summary(xs: list[float]) -> dict[str, Any]:
    return {
        "min": min(xs),
        "median": statistics.median(xs),
        "max": max(xs),
        "n": len(xs),
        "values": [round(x, 4) for x in xs],
    }


def ratio(a: list[float], b: list[float]) -> dict[str, float]:
    """min/min, median/median and the median of paired (same-repetition) ratios."""
    out = {
        "of_min": min(a) / min(b),
        "of_median": statistics.median(a) / statistics.median(b),
    }
    if len(a) == len(b):
        out["paired_median"] = statistics.median(
            x / y for x, y in zip(a, b, strict=True)
        )
    return out


def dump_json(obj: Any, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=_jsonable)
        f.write("\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


# -- worker-side functions ----------------------------------------------------------------
def load_store(path: str) -> np.ndarray:
    """The whole store as one in-memory numpy array (on a worker)."""
    import zarr

    return np.asarray(zarr.open_array(path, mode="r")[...])


def blas_threads() -> int:
    """Threads of numpy's bundled OpenBLAS in this process (-1 if unknown)."""
    try:
        import ctypes
        import glob

        libs = glob.glob(os.path.dirname(np.__file__) + ".libs/*openblas*")
        return int(ctypes.CDLL(libs[0]).scipy_openblas_get_num_threads64_())
    except (OSError, IndexError, AttributeError):
        return -1


def gemm_floor(
    A: np.ndarray, t: int, v: int, seed: int = 0, operator: str = "sparse-sign"
) -> dict[str, float]:
    """(b): the in-memory sketch products A @ Phi (n x t) and S @ A (v x m), one thread.

    ``Phi`` is Gaussian; ``S`` is Gaussian or a sparse sign map (8 non-zeros per
    row of A, scipy CSC), as the non-private run uses. Operators are generated
    before the clock starts: only the products are timed.
    """
    import scipy.sparse as sp

    from pipeline.sketches.sparse import SparseSignOperator

    m, n = A.shape
    rng = np.random.default_rng(seed)
    Phi = rng.standard_normal((n, t), dtype=A.dtype)
    if operator == "sparse-sign":
        op = SparseSignOperator(root=seed, code=12, length=m, dim=v)
        cols, vals = op.structure(0, m)
        S: Any = sp.csc_array(
            (vals.astype(A.dtype).ravel(), cols.ravel(), np.arange(0, cols.size + 1, op.zeta)),
            shape=(v, m),
        )
    else:
        S = rng.standard_normal((v, m), dtype=A.dtype)
    A @ Phi  # warm the BLAS code path
    t0 = time.perf_counter()
    Y = A @ Phi
    t1 = time.perf_counter()
    Z = S @ A
    t2 = time.perf_counter()
    del Y, Z
    return {
        "A_Phi": t1 - t0,
        "S_A": t2 - t1,
        "total": t2 - t0,
        "operator": operator,
        "blas_threads": blas_threads(),
    }


def kernel_breakdown(
    A: np.ndarray, rank: int, chunk_rows: int, seed: int = 0
) -> dict[str, Any]:
    """Where the per-chunk kernel of our pass spends its time, on in-memory chunks.

    Runs ``pipeline.sketches.apply.block_partials`` over every row chunk exactly as
    the pass does (``block_partials_total``), for the non-private (float32) and the
    DP (float64) spectral requests and the DP low-space request, and times the
    same steps one at a time on the whole chunk: operator generation, the float64
    copy, the finiteness check, clipping, GEMMs. The kernel itself does these
    steps in cache-sized pieces of rows without a float64 copy of the chunk
    (``pipeline/sketches/apply.py``, the dense band kernel), so the parts are a
    reference for what each step costs on its own, and ``sum_of_parts`` is not a
    decomposition of ``block_partials_total``. Single thread (a worker); no I/O.
    """
    import inspect

    from pipeline.algorithms.lrf import pass_request, plan_lrf
    from pipeline.params import Algorithm, LrfParams, OperatorKind, PrivacyUnit
    from pipeline.sketches.apply import block_partials, check_finite_block, clip_block
    from pipeline.sketches.sparse import SparseSignOperator

    # mirror the kernel as it is now: since 2026-11-29 14:41 block_partials clips the
    # float64 copy in place and checks finiteness on the small partials only
    inplace_clip = "inplace" in inspect.signature(clip_block).parameters
    m, n = A.shape
    out: dict[str, Any] = {"clip_in_place": inplace_clip}
    configs = {
        "spectral_nonprivate": LrfParams(
            algorithm=Algorithm.SPECTRAL, rank=rank, private=False
        ),
        "spectral_nonprivate_gaussian": LrfParams(
            algorithm=Algorithm.SPECTRAL, rank=rank, private=False,
            operator=OperatorKind.GAUSSIAN,
        ),
        "spectral_dp": LrfParams(
            algorithm=Algorithm.SPECTRAL, rank=rank, epsilon=1.0, delta=1e-6
        ),
        "lowspace_dp": LrfParams(
            algorithm=Algorithm.LOW_SPACE, rank=rank, epsilon=1.0, delta=1e-6
        ),
    }
    starts = list(range(0, m, chunk_rows))
    for label, params in configs.items():
        plan = plan_lrf(params, (m, n))
        req = pass_request(plan, seed, A.dtype)
        dt = req.compute_dtype
        acc: dict[str, float] = defaultdict(float)
        for r0 in starts:
            blk = A[r0 : r0 + chunk_rows]
            r1 = r0 + blk.shape[0]
            t0 = time.perf_counter()
            block_partials(blk, r0, 0, req)
            acc["block_partials_total"] += time.perf_counter() - t0
            # the same steps, one at a time
            t0 = time.perf_counter()
            a = blk.astype(dt, copy=False)
            t1 = time.perf_counter()
            if not inplace_clip or (
                req.clip is not None and req.clip.unit is PrivacyUnit.ENTRY
            ):
                check_finite_block(a, "x")
            t2 = time.perf_counter()
            if inplace_clip:
                a = clip_block(a, req.clip, inplace=a is not blk)
            else:
                a = clip_block(a, req.clip)
            t3 = time.perf_counter()
            acc["astype"] += t1 - t0
            acc["isfinite"] += t2 - t1
            acc["clip"] += t3 - t2
            for _, op in req.right:
                t0 = time.perf_counter()
                g = op.block(0, n).astype(dt, copy=False)
                t1 = time.perf_counter()
                a @ g
                t2 = time.perf_counter()
                acc["opgen_right"] += t1 - t0
                acc["gemm_right"] += t2 - t1
            for _, op in req.left:
                t0 = time.perf_counter()
                if isinstance(op, SparseSignOperator):
                    gt = op.left_block(r0, r1, dt)
                else:
                    gt = op.block(r0, r1).astype(dt, copy=False).T
                t1 = time.perf_counter()
                gt @ a
                t2 = time.perf_counter()
                acc["opgen_left"] += t1 - t0
                acc["gemm_left"] += t2 - t1
            for _, s_op, t_op in req.two_sided:
                t0 = time.perf_counter()
                sparse = isinstance(s_op, SparseSignOperator)
                # a sparse S is applied as the sparse product, as in block_partials
                sbt = (
                    s_op.left_block(r0, r1, dt)
                    if sparse
                    else s_op.block(r0, r1).astype(dt, copy=False).T
                )
                tb = t_op.block(0, n).astype(dt, copy=False)
                t1 = time.perf_counter()
                # the contraction order of block_partials
                if sparse or a.shape[1] >= a.shape[0]:
                    (sbt @ a) @ tb
                else:
                    sbt @ (a @ tb)
                t2 = time.perf_counter()
                acc["opgen_two_sided"] += t1 - t0
                acc["gemm_two_sided"] += t2 - t1
            del a
        parts = {k: v for k, v in acc.items() if k != "block_partials_total"}
        out[label] = {
            "t": plan.t,
            "v": plan.v,
            "compute_dtype": np.dtype(dt).name,
            "n_chunks": len(starts),
            "block_partials_total": acc["block_partials_total"],
            "sum_of_parts": sum(parts.values()),
            **parts,
        }
    return out


def residual_gram_chunk(
    path: str, r0: int, r1: int, U: np.ndarray, SVt: np.ndarray
) -> np.ndarray:
    """R_c^T R_c for R_c = A[r0:r1] - U_c (S V^T), float64 (on a worker)."""
    import zarr

    a = np.asarray(zarr.open_array(path, mode="r")[r0:r1], dtype=np.float64)
    a -= U @ SVt
    return a.T @ a  # numpy uses SYRK for x.T @ x


def spectral_error(
    client: Any, path: str, U: Any, S: Any, V: Any, chunk_rows: int
) -> float:
    """||A - U diag(S) V^T||_2 exactly, via the n x n Gram of the residual, blockwise."""
    from distributed import as_completed

    U = np.asarray(U, dtype=np.float64)
    SVt = np.ascontiguousarray(
        (np.asarray(V, dtype=np.float64) * np.asarray(S, dtype=np.float64)).T
    )
    m = U.shape[0]
    futs = [
        client.submit(
            residual_gram_chunk,
            path,
            r0,
            min(r0 + chunk_rows, m),
            U[r0 : r0 + chunk_rows],
            SVt,
            pure=False,
        )
        for r0 in range(0, m, chunk_rows)
    ]
    G = None
    for f in as_completed(futs):
        g = f.result()
        G = g if G is None else G + g
        f.release()
    lam = float(np.linalg.eigvalsh(G)[-1])
    return float(np.sqrt(max(lam, 0.0)))


# -- task-stream and profile summaries ------------------------------------------------------
def task_stream_summary(
    records: list[dict[str, Any]], wall: float, n_threads: int
) -> dict[str, Any]:
    from dask.utils import key_split

    by: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    count: dict[str, int] = defaultdict(int)
    busy = 0.0
    for rec in records:
        prefix = key_split(rec["key"])
        count[prefix] += 1
        for ss in rec.get("startstops", ()):
            d = ss["stop"] - ss["start"]
            by[prefix][ss["action"]] += d
            if ss["action"] == "compute":
                busy += d
    rows = sorted(
        ((p, count[p], dict(a)) for p, a in by.items()),
        key=lambda r: -sum(r[2].values()),
    )
    return {
        "wall_s": wall,
        "n_tasks": len(records),
        "worker_compute_s": busy,
        "utilisation": busy / (wall * n_threads) if wall > 0 else None,
        "by_prefix": [
            {"prefix": p, "n": c, **{k: round(v, 4) for k, v in a.items()}}
            for p, c, a in rows
        ],
    }


def profile_top(prof: dict[str, Any], n: int = 15) -> list[dict[str, Any]]:
    """Self time (sample share) per line from a distributed profile tree."""
    tot: dict[str, int] = defaultdict(int)
    total = max(int(prof.get("count", 0)), 1)

    def walk(node: dict[str, Any]) -> None:
        children = node.get("children", {})
        self_count = node.get("count", 0) - sum(
            c.get("count", 0) for c in children.values()
        )
        d = node.get("description", {})
        if self_count > 0 and d:
            fn = d.get("filename", "")
            short = "/".join(fn.split("/")[-2:])
            tot[
                f"{short}:{d.get('line_number', '')} {d.get('name', '')} | {d.get('line', '').strip()[:60]}"
            ] += self_count
        for c in children.values():
            walk(c)

    walk(prof)
    top = sorted(tot.items(), key=lambda kv: -kv[1])[:n]
    return [{"where": k, "share": round(v / total, 4)} for k, v in top]
