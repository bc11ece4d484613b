"""Delivering sealed secrets to the workers out of band, for the duration of one job.

A :class:`~pipeline._sealed.Sealed` value pickles as a token. Before a job's
graph runs, :func:`install_secret` registers a worker plugin that installs the
value under its token in every worker's registry; the scheduler hands the
plugin to every worker that joins later, so a task retried on a replacement
worker resolves the same secret. The plugin is removed when the job is done.
The scheduler holds the plugin (it is inside the trusted zone, like the
workers); task keys, task arguments and serialized graphs hold only tokens.

A worker lost while the plugin is being registered does not fail the job.
The scheduler stores the plugin before it sends it to the workers it knows,
and answers with the first worker's error: a worker that dies while it
receives the plugin makes the registration raise a communication error
(``CommClosedError``, or a connect timeout) although the scheduler holds the
plugin and the other workers may be installing it still. The registration is
then sent again under the same name (a worker that holds the plugin already
replaces it by the same one), at most :data:`REGISTER_ATTEMPTS` times. One
that succeeds proves that every worker the scheduler knew at that moment set
the plugin up, and a worker that joins later (the Nanny's replacement of the
dead one) gets it from the scheduler when it registers: every live worker
holds the secret.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from distributed import Client, WorkerPlugin

from pipeline import _sealed

__all__ = ["REGISTER_ATTEMPTS", "install_secret", "remove_secret"]

#: Registrations of a job's secret tried before a lost worker fails the job.
REGISTER_ATTEMPTS = 4
#: Pause before the first retry (doubled after each), so that the scheduler
#: has dropped the dead worker instead of trying to connect to it again.
_RETRY_PAUSE_S = 0.2


class _SecretPlugin(WorkerPlugin):
    """Installs one sealed secret on each worker; its repr shows no secret."""

    def __init__(self, name: str, token: str, value: Any) -> None:
        self.name = name
        self._token = token
        self._value = value

    def __repr__(self) -> str:
        return f"_SecretPlugin({self.name!r}, <redacted>)"

    def setup(self, worker: Any) -> None:
        _sealed.install(self._token, self._value)

    def teardown(self, worker: Any) -> None:
        _sealed.remove(self._token)


def install_secret(client: Client, value: Any) -> tuple[_sealed.Sealed, str]:
    """Seal ``value`` and install it on every worker of the cluster, present and
    future; returns (sealed, plugin name).

    A worker lost during the registration is survived (module docstring).

    Raises
    ------
    RuntimeError
        If every one of :data:`REGISTER_ATTEMPTS` registrations lost a worker
        (the plugin is removed again), or the client lost its scheduler.
    """
    sealed = _sealed.seal(value)
    name = f"dplr-secret-{uuid.uuid4().hex}"
    _register(client, _SecretPlugin(name, sealed.token, value), name)
    return sealed, name


def _register(client: Client, plugin: _SecretPlugin, name: str) -> None:
    """``client.register_plugin(plugin)``, sent again while a worker's loss breaks it."""
    pause = _RETRY_PAUSE_S
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        try:
            client.register_plugin(plugin, name=name)
            return
        except OSError as exc:  # CommClosedError, connect timeouts; they name addresses only
            if attempt == REGISTER_ATTEMPTS or client.status != "running":
                remove_secret(client, name)
                raise RuntimeError(
                    f"the job's secret could not be installed on the cluster: workers were lost "
                    f"during {attempt} registration(s) or the scheduler went away "
                    f"({type(exc).__name__}); check the cluster and retry the job."
                ) from exc
        time.sleep(pause)
        pause *= 2


def remove_secret(client: Client, name: str) -> None:
    """Remove the plugin ``name`` (and its secret) from the cluster, quietly if gone."""
    with contextlib.suppress(Exception):  # a closed client: the workers are gone too
        client.unregister_worker_plugin(name)
