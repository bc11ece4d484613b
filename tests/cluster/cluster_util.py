"""Helpers of the cluster/ tests: the shipped files, the dplr command, and real
``dask scheduler`` / ``dask worker`` processes on loopback (imported by module
name: pytest puts this directory on ``sys.path``; the SSH server is in
loopback_ssh)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / "cluster"
DATA_DIR = ROOT / "data"
#: cluster/ files that are not cluster configurations (dask.yaml is a Dask
#: config for DASK_CONFIG; docker-compose.yml is for docker compose).
NOT_CONFIGS = ("dask.yaml", "docker-compose.yml")


def shipped_configs() -> list[Path]:
    """Every cluster configuration file in cluster/."""
    return sorted(p for p in CLUSTER_DIR.glob("*.yaml") if p.name not in NOT_CONFIGS)


def read_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def clean_env() -> dict[str, str]:
    """This environment without DASK_SCHEDULER_ADDRESS (it would pick a cluster)."""
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def run_dplr(*args: str | os.PathLike[str], timeout: float = 150) -> Any:
    """``python -m pipeline ARGS`` as a subprocess, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(os.fspath, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=clean_env(),
    )


def copy_sample(name: str, dest: Path) -> Path:
    """A private copy of data/NAME, so no ledger is ever written beside data/."""
    target = dest / name
    shutil.copytree(DATA_DIR / name, target)
    return target


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Terminate the processes this test started (each leads its own session,
    so its group holds its nanny-spawned worker too), then kill what is left."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def _popen(
    args: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env() | (env or {}),
            start_new_session=True,
        )


@contextlib.contextmanager
def dask_processes(
    tmp: Path,
    n_workers: int = 2,
    *,
    preload: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """``dask scheduler`` and ``n_workers`` ``dask worker`` processes on loopback,
    on free ports, as cluster/processes.yaml documents; yields the scheduler's
    address, its dashboard link and the scheduler file. All stopped on exit.

    ``preload`` is passed to the workers as ``--preload``, ``env`` added to
    their environment (fault-injection tests)."""
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    sfile = tmp / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_popen([
            dask, "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sfile),
        ], tmp / "scheduler.log"))  # fmt: skip
        _wait_for(lambda: sfile.exists() and sfile.stat().st_size > 0, procs, 60)
        extra = ["--preload", str(preload)] if preload is not None else []
        for i in range(n_workers):
            procs.append(_popen([
                dask, "worker", "--scheduler-file", str(sfile), "--name", f"w{i}",
                "--host", "127.0.0.1", "--nthreads", "1", "--memory-limit", "1GiB",
                "--no-dashboard", "--local-directory", str(tmp / f"w{i}"), *extra,
            ], tmp / f"worker{i}.log", env))  # fmt: skip
        info = json.loads(sfile.read_text())
        port = info["services"].get("dashboard")
        yield {
            "address": info["address"],
            "dashboard": f"http://127.0.0.1:{port}/status" if port else "",
            "scheduler_file": str(sfile),
        }
    finally:
        _stop(procs)


def _wait_for(
    ready: Any, procs: Sequence[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [p.args for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"cluster processes did not start: {dead or 'timeout'}")
        time.sleep(0.1)
