"""Delivering sealed secrets to the workers out of band, for the duration of one job.

A :class:`~pipeline._sealed.Sealed` value pickles as a token. Before a job's
graph runs, :func:`install_secret` registers a worker plugin that installs the
value under its token in every worker's registry; the scheduler hands the
plugin to every worker that joins later, so a task retried on a replacement
worker resolves the same secret. The plugin is removed when the job is done.
The scheduler holds the plugin (it is inside the trusted zone, like the
workers); task keys, task arguments and serialized graphs hold only tokens.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from distributed import Client, WorkerPlugin

from pipeline import _sealed

__all__ = ["install_secret", "remove_secret"]


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
    """Seal ``value`` and install it on the cluster; returns (sealed, plugin name)."""
    sealed = _sealed.seal(value)
    name = f"dplr-secret-{uuid.uuid4().hex}"
    client.register_plugin(_SecretPlugin(name, sealed.token, value), name=name)
    return sealed, name


def remove_secret(client: Client, name: str) -> None:
    """Remove the plugin ``name`` (and its secret) from the cluster, quietly if gone."""
    with contextlib.suppress(Exception):  # a closed client: the workers are gone too
        client.unregister_worker_plugin(name)
