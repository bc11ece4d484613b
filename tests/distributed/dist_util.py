"""Helpers shared by the distributed tests (imported by module name: pytest puts
this directory on ``sys.path``, and the Nanny-spawned workers inherit it)."""

from __future__ import annotations

import logging
import os

import numpy as np
import zarr
from distributed import LocalCluster


def start_cluster(n_workers: int) -> LocalCluster:
    """``n_workers`` single-threaded worker processes (Nanny-managed) on 127.0.0.1.

    The Nannies export OMP/MKL/OPENBLAS_NUM_THREADS=1 to the workers
    (``distributed.nanny.pre-spawn-environ``), so BLAS is pinned to one thread in
    every worker of every cluster, as bitwise comparisons need (style B.3.5).
    """
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )


def write_matrix(
    path: str | os.PathLike[str], A: np.ndarray, chunks: tuple[int, int]
) -> str:
    """Write ``A`` exactly (no generator in between) to a new Zarr v3 array."""
    z = zarr.create_array(
        store=os.fspath(path), shape=A.shape, chunks=chunks, dtype=A.dtype
    )
    z[...] = A
    return os.fspath(path)


def seeded_matrix(seed: int, m: int, n: int) -> np.ndarray:
    """Gaussian rows with norms spread over about [0.2, 2]: clipping at C=1 is active
    for some rows and not for others, so the clipping path is part of every check."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, n)) / np.sqrt(n)
    return A * rng.uniform(0.2, 2.0, size=(m, 1))


def low_rank_product(U: np.ndarray, S: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``U diag(S) V^T``: invariant to the sign/rotation ambiguity of U and V."""
    return (U * S) @ V.T


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """``||a - b||_F / ||b||_F``."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
