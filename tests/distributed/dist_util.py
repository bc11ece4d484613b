"""Helpers shared by the distributed tests (imported by module name: pytest puts
this directory on ``sys.path``, and the Nanny-spawned workers inherit it)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import time
from typing import Any

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


def arm_self_kill(module: str, attr: str, record: str, phase: str) -> int:
    """Run on one worker (``client.run``): the next call of ``module.attr`` in this
    worker process writes ``record`` (``phase``, pid, the sealed secrets held)
    and SIGKILLs the process, so the fault lands exactly where that function is
    called. Returns the worker's pid. :func:`disarm_self_kill` undoes it."""
    from pipeline import _sealed

    mod = importlib.import_module(module)
    original = getattr(mod, attr)

    def kill_here(*args: Any, **kwargs: Any) -> Any:
        tmp = f"{record}.tmp"
        with open(tmp, "w") as f:
            json.dump({"phase": phase, "pid": os.getpid(), "secrets_held": len(_sealed._REGISTRY)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record)
        os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)  # not reached

    kill_here.original = original  # type: ignore[attr-defined]
    setattr(mod, attr, kill_here)
    return os.getpid()


def disarm_self_kill(module: str, attr: str) -> None:
    """Run on a worker: undo :func:`arm_self_kill` if the hook never fired."""
    mod = importlib.import_module(module)
    setattr(mod, attr, getattr(getattr(mod, attr), "original", getattr(mod, attr)))


def process_is_dead(pid: int, timeout: float = 30.0) -> bool:
    """``pid`` has exited (gone, or a zombie its parent has not reaped yet), waiting
    up to ``timeout`` s: a SIGKILLed process closes its sockets before it is a zombie."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def holds_secret(token: str) -> bool:
    """Run on a worker: this process resolves the sealed token ``token``."""
    from pipeline import _sealed

    return token in _sealed._REGISTRY


def wait_for_replacement(client: Any, dead_pid: int, n_workers: int, timeout: float = 120.0) -> dict[str, int]:
    """The live workers' pids, once ``n_workers`` answer and none is ``dead_pid``."""
    deadline = time.monotonic() + timeout
    while True:
        pids = client.run(os.getpid, on_error="ignore")
        if len(pids) == n_workers and dead_pid not in pids.values():
            return dict(pids)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no replacement for worker pid {dead_pid} within {timeout} s")
        time.sleep(0.1)
