"""A job's sealed secret is leased: it leaves a long-lived cluster when its client dies.

A real ``dask scheduler`` and two ``dask worker`` processes on loopback (chunk
reads of ``*slow.zarr`` stores slowed by the ``slow_reads.py`` preload, so that
a pass is in progress long enough to be interrupted).

* A ``dplr factorize`` client is SIGKILLed in the middle of its pass, while the
  workers hold its sketch seed: after the lease (``DPLR_SECRET_LEASE``), no
  worker holds the secret and the scheduler no longer registers its plugin, so a
  worker that joins later never receives it. With a lease longer than the test
  (the negative control) the secret stays where the dead client left it.
* A live job renews its lease: a secret installed from this process stays on
  every worker across many lease periods, and is dropped by the workers when
  the renewals stop (the negative control: the same span is longer than one lease).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cluster_util import clean_env, dask_processes
from distributed import Client

from pipeline import _sealed
from pipeline.execution import secrets

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
N_CHUNKS = 200  # 0.1 s each, two one-thread workers: a pass far longer than the kill takes to land
KILL_AFTER = 4  # chunk reads seen before the kill
#: The lease of the killed client: long enough that the check made right after the
#: kill sees the secret still in place (its last renewal was at most a third of it before).
KILL_LEASE_S = 3.0
#: The lease of the live job (renewed three times per lease).
LIVE_LEASE_S = 1.5
#: Lease periods the live job spans (counted in its renewals, never timed).
LIVE_PERIODS = 4
#: Upper bound on the wait for an expiry to show: a failure bound, not a measurement.
EXPIRY_DEADLINE_S = 60.0
SECRET = 771177117711  # a stand-in secret value
LEASE_ENV = "DPLR_SECRET_LEASE"  # the lease, in seconds, of the secrets a client installs
LEASE_KEY = "dplr-secret-lease"  # the scheduler metadata under which a client renews them


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("lease-dask")
    marks = tmp / "marks"
    marks.mkdir()
    # PYTHONPATH: the workers import this module's helpers by reference
    env = {"DPLR_SLOW_READ_MARKS": str(marks), "PYTHONPATH": os.pathsep.join(sys.path)}
    with dask_processes(tmp, n_workers=2, preload=HERE / "slow_reads.py", env=env) as info:
        yield info | {"marks": str(marks)}


@pytest.fixture
def client(cluster: dict[str, str]) -> Iterator[Client]:
    with Client(cluster["address"], timeout=30) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def secrets_held() -> int:
    """Run on a worker: the number of sealed secrets this process resolves."""
    return len(_sealed._REGISTRY)


def resolves(sealed: Any) -> bool:
    """Run on a worker: this process resolves ``sealed`` (a token when it arrives)."""
    try:
        return sealed.get() == SECRET
    except RuntimeError:
        return False


def _held(client: Client) -> int:
    return sum(client.run(secrets_held).values())


def _registered(client: Client) -> list[str]:
    """The names of the secret plugins the scheduler would give a joining worker."""
    names = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))
    return sorted(n for n in names if n.startswith("dplr-secret-"))


def _wait_until(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + EXPIRY_DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {EXPIRY_DEADLINE_S} s"
        time.sleep(0.1)


def _store(path: Path) -> Path:
    rng = np.random.default_rng(23)
    A = rng.standard_normal((N_CHUNKS * 10, 30)) / np.sqrt(30)
    z = zarr.create_array(str(path), shape=A.shape, chunks=(10, 30), dtype="f8")
    z[...] = A
    return path


def _factorize(cluster: dict[str, str], tmp: Path, lease: float) -> subprocess.Popen[str]:
    """``dplr factorize`` (one pass over a slow store) against the cluster, with
    lease ``lease``, started once no marks and no secrets are left by another test."""
    marks = Path(cluster["marks"])
    for m in os.listdir(marks):
        os.unlink(marks / m)
    store = _store(tmp / "slow.zarr")
    cmd = [sys.executable, "-m", "pipeline", "factorize", str(store), "--rank", "2", "--seed", "3",
           "--algorithm", "spectral", "--epsilon", "1", "--delta", "1e-6", "--budget-epsilon", "10",
           "--budget-delta", "1e-4", "--ledger", str(tmp / "ledger.json"), "--out", str(tmp / "out.zarr"),
           "--scheduler", cluster["address"], "--insecure-noise-seed", "5"]  # fmt: skip
    env = clean_env() | {LEASE_ENV: str(lease)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _kill_mid_pass(cluster: dict[str, str], client: Client, tmp: Path, lease: float) -> list[str]:
    """Runs :func:`_factorize` and SIGKILLs it while its pass reads the store and
    the workers hold its sketch seed; returns the secret plugins the scheduler
    registers right after the kill."""
    assert _held(client) == 0  # nothing left by an earlier test
    assert _registered(client) == []
    marks = Path(cluster["marks"])
    proc = _factorize(cluster, tmp, lease)
    deadline = time.monotonic() + 120
    while len(os.listdir(marks)) < KILL_AFTER or _held(client) == 0:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    registered_before = _registered(client)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # the kill landed in the pass, while the secret was installed: the workers held
    # it, the pass had not read every chunk, and the scheduler still holds the plugin
    assert len(registered_before) == 1
    assert len(os.listdir(marks)) < N_CHUNKS
    assert not (tmp / "out.zarr").exists()
    after = _registered(client)
    assert after == registered_before
    assert _held(client) >= 1
    return after


@pytest.mark.timeout(300)
def test_a_killed_clients_secret_leaves_every_worker_after_its_lease(
    cluster: dict[str, str], client: Client, tmp_path: Path
) -> None:
    names = _kill_mid_pass(cluster, client, tmp_path, KILL_LEASE_S)
    try:
        _wait_until(lambda: _held(client) == 0, "every worker dropped the dead job's secret")
        _wait_until(lambda: _registered(client) == [], "the scheduler dropped the dead job's plugin")
        assert _held(client) == 0  # and no worker got it back from the scheduler
    finally:
        for name in _registered(client):  # left only by a failure: later tests start clean
            client.unregister_worker_plugin(name)
    assert names[0].startswith("dplr-secret-")


@pytest.mark.timeout(300)
def test_negative_control_a_lease_longer_than_the_wait_keeps_the_secret(
    cluster: dict[str, str], client: Client, tmp_path: Path
) -> None:
    """Nothing but the lease removes a killed client's secret: with a lease of an hour
    it is still on the workers and the scheduler after several short leases."""
    names = _kill_mid_pass(cluster, client, tmp_path, 3600.0)
    try:
        time.sleep(3 * KILL_LEASE_S)  # a span in which the short lease expired the secret
        assert _registered(client) == names
        assert _held(client) >= 1
    finally:
        client.unregister_worker_plugin(names[0])
    assert _held(client) == 0


@pytest.mark.timeout(300)
def test_a_dplr_job_many_leases_long_keeps_its_secret(
    cluster: dict[str, str], client: Client, tmp_path: Path
) -> None:
    """A real pass that outlives its lease many times over needs its sketch seed on
    the workers to its last chunk: it completes, and leaves no secret behind."""
    assert _held(client) == 0
    proc = _factorize(cluster, tmp_path, LIVE_LEASE_S)
    _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    # every chunk was read, each after a 0.1 s pause, by two one-thread workers:
    # the pass lasted N_CHUNKS * 0.1 / 2 s at least, over six leases
    assert len(os.listdir(cluster["marks"])) >= N_CHUNKS
    assert N_CHUNKS * 0.1 / 2 > 6 * LIVE_LEASE_S
    assert (tmp_path / "out.zarr").is_dir()
    assert _held(client) == 0
    assert _registered(client) == []


def _renewals(client: Client, name: str) -> Any:
    return client.get_metadata([LEASE_KEY, name], None)


@pytest.mark.timeout(300)
def test_a_live_job_keeps_its_secret_across_many_leases(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_ENV, str(LIVE_LEASE_S))
    assert _held(client) == 0
    assert _registered(client) == []
    sealed, name = secrets.install_secret(client, SECRET)
    try:
        first = _renewals(client, name)
        assert isinstance(first, int)
        checks = 0
        # the job runs until LIVE_PERIODS leases' worth of renewals were made (each
        # after a third of a lease): it outlives the lease several times over
        while _renewals(client, name) < first + 3 * LIVE_PERIODS:
            assert set(client.run(resolves, sealed).values()) == {True}
            assert _registered(client) == [name]
            checks += 1
            time.sleep(LIVE_LEASE_S / 5)
        assert checks >= LIVE_PERIODS
        assert set(client.run(resolves, sealed).values()) == {True}
    finally:
        secrets.remove_secret(client, name)
    assert _held(client) == 0
    assert _registered(client) == []


@pytest.mark.timeout(300)
def test_negative_control_a_job_that_stops_renewing_loses_its_secret(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The span of the live test is longer than one lease: without renewals the
    workers drop the secret and the scheduler its plugin."""
    monkeypatch.setenv(LEASE_ENV, str(LIVE_LEASE_S))
    sealed, name = secrets.install_secret(client, SECRET)
    try:
        assert set(client.run(resolves, sealed).values()) == {True}
        secrets._stop_renewal(name)  # as if this client had hung
        _wait_until(lambda: not any(client.run(resolves, sealed).values()), "the workers dropped the secret")
        _wait_until(lambda: _registered(client) == [], "the scheduler dropped the plugin")
    finally:
        secrets.remove_secret(client, name)
    assert _held(client) == 0
