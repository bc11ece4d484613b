"""cluster/ssh.yaml against a real sshd on loopback.

The test starts its own ``sshd`` on a free 127.0.0.1 port with a fresh host key
and a fresh client key (key login only, host key checked against a
known_hosts file), points a copy of cluster/ssh.yaml at it (the scheduler on
the first host, one worker on each of the two others: all 127.0.0.1), and runs
``dplr factorize --cluster`` through it. It is skipped, with the reason, where
no sshd can be started without changing the machine.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from cluster_util import (
    CLUSTER_DIR,
    copy_sample,
    free_port,
    loopback_sshd,
    read_yaml,
    sshd_unavailable_reason,
    write_yaml,
)

from pipeline.api import factorize

pytestmark = pytest.mark.cluster

PRIVATE = {"epsilon": 1.0, "delta": 1e-6, "seed": 3, "insecure_noise_seed": 5}


def _processes_of(address: str) -> list[int]:
    """Processes whose command line names this (test-only) scheduler address."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if address.encode() in cmd:
                found.append(int(entry.name))
    return found


def _wait_until_gone(addresses: list[str], timeout: float) -> list[int]:
    """Wait for the processes of these schedulers to exit; kill and return any
    still running at the deadline."""
    deadline = time.monotonic() + timeout
    alive = [p for a in addresses for p in _processes_of(a)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for a in addresses for p in _processes_of(a)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


@pytest.mark.timeout(180)
def test_ssh_cluster_on_loopback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reason = sshd_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip(
        "asyncssh", reason="asyncssh is not installed (pip install 'dplr[ssh]')"
    )
    port = free_port()
    with loopback_sshd(tmp_path / "ssh", port) as sshd:
        config = read_yaml(CLUSTER_DIR / "ssh.yaml")
        config["hosts"] = ["127.0.0.1"] * 3
        config["connect_options"] = {
            "port": port,
            "username": getpass.getuser(),
            "client_keys": [sshd["client_key"]],
            "known_hosts": sshd["known_hosts"],
        }
        config["worker_options"].update(n_workers=1, memory_limit="1GiB")
        config["scheduler_options"] = {
            "host": "127.0.0.1",
            "port": 0,
            "dashboard_address": ":0",
        }
        config["remote_python"] = sys.executable
        path = write_yaml(tmp_path / "ssh-loopback.yaml", config)
        store = copy_sample("sample.zarr", tmp_path)
        progress = io.StringIO()
        try:
            result = factorize(
                str(store), 2, **PRIVATE, cluster_config=path, progress=progress,
                out=tmp_path / "rel.zarr", ledger=tmp_path / "ledger.json",
                budget=(10.0, 1e-4),
            )  # fmt: skip
        finally:
            started = re.findall(r"Scheduler at:\s+(tcp://[\d.:]+)", caplog.text)
            # closing the cluster stops the remote scheduler and workers
            leftovers = _wait_until_gone(started, timeout=30)
        # one login per host (scheduler, two worker hosts), all by key
        accepted = Path(sshd["log"]).read_text().count("Accepted publickey")
    assert started
    assert leftovers == []
    assert accepted >= 3
    assert result.report["cluster"]["kind"] == "ssh"
    assert result.report["cluster"]["n_workers"] == 2
    text = progress.getvalue()
    assert f"started the ssh cluster of {path}: dashboard http://" in text
    assert "dask cluster: ssh, 2 workers, dashboard http://" in text
    A = np.asarray(zarr.open_array(store=store, mode="r")[...])
    ref = factorize(A, 2, **PRIVATE)  # in memory
    # summation order only (see test_cluster_processes.RTOL_REFERENCE)
    np.testing.assert_allclose(
        result.S, ref.S, rtol=1e-10, atol=1e-10 * float(ref.S.max())
    )
