"""cluster/ssh.yaml through a real SSH server on loopback.

The test serves SSH on a free 127.0.0.1 port (loopback_ssh: asyncssh, from the
test extra, so no sshd is needed) with a fresh host key and one authorized
fresh client key, points a copy of cluster/ssh.yaml at it (the scheduler on
the first host, one worker on each of the two others: all 127.0.0.1; the host
key checked against a known_hosts file), and runs ``dplr factorize --cluster``
as a subprocess. distributed's SSHCluster logs in once per host and starts the
scheduler and the workers with the commands it sends over SSH; the server runs
them as this user and records them. Closing the cluster must stop every process
the sessions started, by itself.

A negative control shows the server is no open door: an unknown host key or an
unauthorized client key is refused before any command runs, and ``dplr``
exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cluster_util import (
    CLUSTER_DIR,
    clean_env,
    copy_sample,
    read_yaml,
    run_dplr,
    write_yaml,
)
from loopback_ssh import LoopbackSSH, fresh_key, loopback_ssh_server

from pipeline.api import factorize
from pipeline.io import read_group

pytestmark = pytest.mark.cluster

SEEDS = ("--seed", "3", "--insecure-noise-seed", "5")
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
BUDGET = ("--budget-epsilon", "10", "--budget-delta", "1e-4")
#: hosts of the copy of cluster/ssh.yaml: the scheduler, then two worker hosts
HOSTS = ["127.0.0.1"] * 3
# The cluster and in-memory runs differ only in the order in which per-chunk
# partial sums are added (see test_cluster_processes.RTOL_REFERENCE).
RTOL_REFERENCE = 1e-10


def _config(tmp: Path, connect_options: dict[str, Any], timeout: int = 60) -> Path:
    """cluster/ssh.yaml pointed at the loopback server, shrunk to this machine:
    one single-threaded worker per worker host, everything on 127.0.0.1."""
    config = read_yaml(CLUSTER_DIR / "ssh.yaml")
    config.update(hosts=HOSTS, connect_options=connect_options, timeout=timeout)
    config["worker_options"].update(
        n_workers=1, memory_limit="1GiB", host="127.0.0.1",
        local_directory=str(tmp / "workers"),
    )  # fmt: skip
    config["scheduler_options"] = {
        "host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0",
    }  # fmt: skip
    config["remote_python"] = sys.executable
    return write_yaml(tmp / "ssh-loopback.yaml", config)


def _dplr(tmp: Path, store: Path, config: Path) -> Any:
    return run_dplr(
        "factorize", store, "--rank", "2", *SEEDS, *PRIVACY, *BUDGET,
        "--ledger", tmp / "ledger.json", "--out", tmp / "rel.zarr",
        "--cluster", config,
    )  # fmt: skip


def _spec_commands(ssh: LoopbackSSH, cls: str) -> list[str]:
    """The commands that started a dask_spec process of class ``cls``."""
    return [c for c in ssh.commands if "distributed.cli.dask_spec" in c and cls in c]


@pytest.mark.timeout(180)
def test_ssh_cluster_on_loopback(tmp_path: Path) -> None:
    store = copy_sample("sample.zarr", tmp_path)
    with loopback_ssh_server(tmp_path / "ssh", env=clean_env()) as ssh:
        config = _config(tmp_path, ssh.connect_options)
        proc = _dplr(tmp_path, store, config)
        # closing the cluster stopped the remote scheduler and workers
        still_running = ssh.wait_until_ended(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert still_running == []
    assert ssh.leftovers == []
    # one key login per host, and the commands SSHCluster sends: the remote
    # Python of the file runs one scheduler and one Nanny per worker host
    assert ssh.logins == len(HOSTS)
    assert ssh.commands.count("uname") == len(HOSTS)
    (scheduler,) = _spec_commands(ssh, "distributed.Scheduler")
    workers = _spec_commands(ssh, "distributed.Nanny")
    assert len(workers) == len(HOSTS) - 1
    for command in (scheduler, *workers):
        assert f" {sys.executable} -m distributed.cli.dask_spec " in command
    arrays, report = read_group(tmp_path / "rel.zarr", ("U", "S", "V"))
    assert report["cluster"]["kind"] == "ssh"
    assert report["cluster"]["n_workers"] == 2
    assert f"started the ssh cluster of {config}: dashboard http://" in proc.stderr
    assert "dask cluster: ssh, 2 workers, dashboard http://" in proc.stderr
    A = np.asarray(zarr.open_array(store=store, mode="r")[...])
    ref = factorize(A, 2, epsilon=1.0, delta=1e-6, seed=3, insecure_noise_seed=5)
    np.testing.assert_allclose(
        arrays["S"], ref.S, rtol=RTOL_REFERENCE,
        atol=RTOL_REFERENCE * float(ref.S.max()),
    )  # fmt: skip


@pytest.mark.parametrize("wrong", ["host-key", "client-key"])
@pytest.mark.timeout(120)
def test_ssh_login_checks_both_keys(wrong: str, tmp_path: Path) -> None:
    """Negative control: the server and SSHCluster check the keys, so the
    test above logged in by key and host-key checking was on."""
    store = copy_sample("sample.zarr", tmp_path)
    with loopback_ssh_server(tmp_path / "ssh", env=clean_env()) as ssh:
        options = ssh.connect_options
        if wrong == "host-key":  # known_hosts names another key for the host
            other = fresh_key(tmp_path / "other_host_key")
            bad = tmp_path / "other_known_hosts"
            bad.write_text(f"[127.0.0.1]:{ssh.port} {other}\n")
            options["known_hosts"] = str(bad)
        else:  # a key the server does not authorize
            fresh_key(tmp_path / "other_client_key")
            options["client_keys"] = [str(tmp_path / "other_client_key")]
        config = _config(tmp_path, options, timeout=20)
        proc = _dplr(tmp_path, store, config)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dplr: error: {config}: could not start the ssh cluster")
    assert ssh.logins == 0
    assert ssh.commands == []
    assert not (tmp_path / "rel.zarr").exists()
