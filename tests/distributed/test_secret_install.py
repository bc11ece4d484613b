"""A worker lost while a job installs its secret does not fail the job.

:func:`pipeline.execution.secrets.install_secret` registers a worker plugin; the
scheduler sends it to every worker and answers with the first worker's error.
Here one worker process SIGKILLs itself inside the plugin's setup (a hook put
in place of ``pipeline._sealed.install`` on that worker only), so the fault
lands exactly while the secret is being registered: the registration raises,
is sent again, and the job gives the undisturbed result. The single-shot
registration of before fails under the same fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dist_util import (
    arm_self_kill,
    disarm_self_kill,
    holds_secret,
    process_is_dead,
    wait_for_replacement,
)
from distributed import Client
from distributed.comm import CommClosedError

from pipeline.algorithms.continual import partition_cells, plan_stream, sum_deltas
from pipeline.execution import secrets
from pipeline.execution import stream as exec_stream
from pipeline.execution.stream import sketch_partitions
from pipeline.params import Algorithm, LrfParams

pytestmark = pytest.mark.distributed

SHAPE = (5000, 300)
SEED = 4242
SECRET = 918273645546372819  # a value the error messages are searched for


@pytest.fixture
def install_kill(client: Client, tmp_path: Path) -> Any:
    """Arms one worker to SIGKILL itself when it next installs a secret; yields
    (its pid, the record its hook writes); afterwards the cluster has two live
    workers again, the armed one replaced (or disarmed if the hook never fired)."""
    addr = min(client.run(os.getpid))  # a worker that answers, not one the scheduler still lists
    record = tmp_path / "kill.json"
    pid = client.run(arm_self_kill, "pipeline._sealed", "install", str(record), "install", workers=[addr])[addr]
    yield pid, record
    if record.exists():
        wait_for_replacement(client, pid, 2)
    else:
        client.run(disarm_self_kill, "pipeline._sealed", "install", workers=[addr])


class _RegistrationSpy:
    """Wraps ``client.register_plugin`` and records how each call ended."""

    def __init__(self, client: Client) -> None:
        self.register = client.register_plugin
        self.outcomes: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self.register(*args, **kwargs)
        except Exception as exc:
            self.outcomes.append(type(exc).__name__)
            raise
        self.outcomes.append("ok")
        return result


def _assert_killed_while_registering(record: Path, pid: int) -> None:
    """The armed worker wrote its record from inside the plugin's setup, and is dead."""
    assert record.exists(), "the kill did not happen while the secret was registered"
    landed = json.loads(record.read_text())
    assert landed["phase"] == "install"
    assert landed["pid"] == pid
    assert process_is_dead(pid)


def test_a_worker_killed_while_the_secret_is_registered_gets_retried(
    client: Client, install_kill: Any, monkeypatch: pytest.MonkeyPatch
):
    pid, record = install_kill
    spy = _RegistrationSpy(client)
    monkeypatch.setattr(client, "register_plugin", spy)
    sealed, name = secrets.install_secret(client, SECRET)
    try:
        # the fault landed in the registration, before install_secret returned
        _assert_killed_while_registering(record, pid)
        assert spy.outcomes[0] == "CommClosedError"
        assert spy.outcomes[-1] == "ok"
        assert 2 <= len(spy.outcomes) <= secrets.REGISTER_ATTEMPTS
        # every live worker holds the secret, the Nanny's replacement included
        pids = wait_for_replacement(client, pid, 2)
        assert set(client.run(holds_secret, sealed.token, workers=list(pids)).values()) == {True}
    finally:
        secrets.remove_secret(client, name)
    assert set(client.run(holds_secret, sealed.token).values()) == {False}


def test_a_worker_killed_while_an_ingest_installs_its_seed_changes_nothing(
    client: Client, install_kill: Any, monkeypatch: pytest.MonkeyPatch
):
    """The job (the sketch of a stream batch on the cluster) equals its undisturbed run bit for bit."""
    pid, record = install_kill
    plan = plan_stream(LrfParams(algorithm=Algorithm.SPECTRAL, rank=3, epsilon=1.0, delta=1e-6), SHAPE, 8)
    rng = np.random.default_rng(5)
    r = np.sort(rng.integers(0, SHAPE[0], 20000))
    parts = partition_cells(r, rng.integers(0, SHAPE[1], r.size), rng.normal(size=r.size), 4, plan.lrf.params.tile_size)
    assert len(parts) >= 2
    killed_before_return: list[bool] = []

    def install_and_check(*args: Any) -> Any:
        out = secrets.install_secret(*args)
        killed_before_return.append(record.exists())
        return out

    monkeypatch.setattr(exec_stream, "install_secret", install_and_check)
    disturbed = sketch_partitions(plan, SEED, parts, client)
    assert killed_before_return == [True]
    _assert_killed_while_registering(record, pid)
    wait_for_replacement(client, pid, 2)
    monkeypatch.undo()
    undisturbed = sum_deltas(plan, sketch_partitions(plan, SEED, parts, client))
    disturbed_sum = sum_deltas(plan, disturbed)
    assert disturbed_sum.keys() == undisturbed.keys()
    for name in undisturbed:  # each part is one task on a one-thread worker: bit for bit
        np.testing.assert_array_equal(disturbed_sum[name], undisturbed[name])


def test_negative_control_a_single_registration_fails_under_the_same_fault(client: Client, install_kill: Any):
    """The registration as it was (one call, no retry) raises when the worker dies in it."""
    pid, record = install_kill
    sealed = secrets._sealed.seal(SECRET)
    name = "dplr-secret-single-shot"
    try:
        with pytest.raises(CommClosedError):
            client.register_plugin(secrets._SecretPlugin(name, sealed.token, SECRET), name=name)
        _assert_killed_while_registering(record, pid)
    finally:
        secrets.remove_secret(client, name)


class _FakeClient:
    """A client whose every registration fails with ``exc``; records removals."""

    def __init__(self, exc: Exception, status: str = "running") -> None:
        self.exc, self.status = exc, status
        self.calls = 0
        self.removed: list[str] = []

    def register_plugin(self, plugin: Any, name: str) -> None:
        self.calls += 1
        raise self.exc

    def unregister_worker_plugin(self, name: str) -> None:
        self.removed.append(name)

    def set_metadata(self, keys: list[str], value: Any) -> None:
        """The lease's renewals (a fake scheduler's metadata: ignored)."""


def test_registration_gives_up_after_its_attempts_and_removes_the_plugin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(secrets, "_RETRY_PAUSE_S", 0.0)
    fake = _FakeClient(CommClosedError("in <TCP (closed) Scheduler Broadcast>: Stream is closed"))
    with pytest.raises(RuntimeError, match="could not be installed") as err:
        secrets.install_secret(fake, SECRET)  # type: ignore[arg-type]
    assert secrets.REGISTER_ATTEMPTS == 4  # as docs/faults.md says
    assert fake.calls == secrets.REGISTER_ATTEMPTS
    assert len(fake.removed) == 1
    assert fake.removed[0].startswith("dplr-secret-")
    assert str(SECRET) not in str(err.value)
    assert str(SECRET) not in repr(err.value.__cause__)


@pytest.mark.parametrize(
    ("exc", "status"),
    [(ValueError("plugin setup failed"), "running"), (CommClosedError("scheduler gone"), "closed")],
    ids=["not-a-lost-worker", "client-closed"],
)
def test_registration_is_not_retried_for_other_failures(exc: Exception, status: str):
    fake = _FakeClient(exc, status)
    with pytest.raises((ValueError, RuntimeError)):
        secrets.install_secret(fake, SECRET)  # type: ignore[arg-type]
    assert fake.calls == 1
