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

The secret is leased: it leaves the cluster without its client. The client
renews the lease (a counter it advances under :data:`LEASE_KEY` in the
scheduler's metadata) :data:`RENEWALS_PER_LEASE` times per lease, from a
thread of its own, for as long as the job holds the secret. Each worker asks
the scheduler for that counter :data:`CHECKS_PER_LEASE` times per lease and
times it on its own clock: once a whole lease has passed without a change,
and the scheduler has answered :data:`CHECKS_PER_LEASE` times in a row
without one (the client was killed, hangs or lost the scheduler), or the job
has marked the lease released, the worker forgets the secret (and what was
derived from it) and unregisters the plugin from the scheduler, which removes
it from every other worker and from its registry, so a worker that joins later
does not receive it. Only answers count: a scheduler that stalls (taking a
large graph) or a worker whose event loop was blocked by a task decides
nothing until it hears from the scheduler again, so neither costs a live job
its secret; a worker cut off from its scheduler keeps the secret until it
hears from it again or its process ends. The lease is
:data:`DEFAULT_LEASE_S` seconds, or ``DPLR_SECRET_LEASE`` (:data:`LEASE_ENV`)
as read by the client when it installs the secret; the workers need no setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
import uuid
from typing import Any

from distributed import Client, WorkerPlugin

from pipeline import _sealed
from pipeline.errors import InvalidParameterError

__all__ = [
    "CHECKS_PER_LEASE",
    "DEFAULT_LEASE_S",
    "LEASE_ENV",
    "LEASE_KEY",
    "REGISTER_ATTEMPTS",
    "RENEWALS_PER_LEASE",
    "install_secret",
    "lease_seconds",
    "remove_secret",
]

#: Registrations of a job's secret tried before a lost worker fails the job.
REGISTER_ATTEMPTS = 4
#: Pause before the first retry (doubled after each), so that the scheduler
#: has dropped the dead worker instead of trying to connect to it again.
_RETRY_PAUSE_S = 0.2

#: Environment variable: the lease of a job's secrets on the workers, in seconds.
LEASE_ENV = "DPLR_SECRET_LEASE"
#: The lease when :data:`LEASE_ENV` is unset: how long a dead client's secret
#: may stay on a worker after the client's last renewal (plus one check).
DEFAULT_LEASE_S = 30.0
#: Scheduler metadata ``[LEASE_KEY, plugin name]``: the lease's renewal counter
#: (``None`` once the job released the secret). Never the secret.
LEASE_KEY = "dplr-secret-lease"
#: Renewals the client sends per lease.
RENEWALS_PER_LEASE = 3
#: Times per lease a worker asks the scheduler for the renewal counter.
CHECKS_PER_LEASE = 6


def lease_seconds() -> float:
    """The lease of the secrets this process installs: ``DPLR_SECRET_LEASE`` or
    :data:`DEFAULT_LEASE_S`.

    Raises
    ------
    InvalidParameterError
        If the variable is not a positive, finite number of seconds.
    """
    raw = os.environ.get(LEASE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_LEASE_S
    try:
        lease = float(raw)
    except ValueError:
        lease = math.nan
    if not (math.isfinite(lease) and lease > 0):
        raise InvalidParameterError(
            f"{LEASE_ENV}={raw!r} is not a positive number of seconds; set it to the "
            f"lease of a job's secrets on the workers (default {DEFAULT_LEASE_S:g}) or unset it."
        )
    return lease


class _SecretPlugin(WorkerPlugin):
    """Installs one sealed secret on each worker for as long as its lease is
    renewed (module docstring); its repr shows no secret."""

    def __init__(
        self, name: str, token: str, value: Any, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        self.name = name
        self.lease_s = lease_s
        self._token = token
        self._value = value
        self._watch: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"_SecretPlugin({self.name!r}, <redacted>)"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_watch": None}

    def setup(self, worker: Any) -> None:
        _sealed.install(self._token, self._value)
        self._watch = asyncio.get_running_loop().create_task(self._keep(worker))

    def teardown(self, worker: Any) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._forget()

    def _forget(self) -> None:
        """Drop the secret, and what was derived from it, from this worker."""
        _sealed.remove(self._token)
        self._value = None

    async def _keep(self, worker: Any) -> None:
        """Keep the secret while its lease is renewed; then drop it here and the
        plugin from the scheduler (and so from every worker, present and future).

        Only answers count: a scheduler that does not answer (busy taking a
        large graph, or gone) decides nothing, so a stall of the scheduler
        never costs a live job its secret.
        """
        seen: Any = None
        unchanged = 0  # answers in a row without a renewal
        renewed_at = time.monotonic()  # this worker's clock: no two clocks compared
        while True:
            await asyncio.sleep(self.lease_s / CHECKS_PER_LEASE)
            try:
                count = await asyncio.wait_for(
                    worker.scheduler.get_metadata(
                        keys=[LEASE_KEY, self.name], default=None
                    ),
                    self.lease_s,
                )
            except Exception:  # noqa: BLE001, S112 - no answer: no decision
                continue
            if count is None:  # released by the job
                break
            now = time.monotonic()
            if count != seen:
                seen, unchanged, renewed_at = count, 0, now
                continue
            unchanged += 1
            if unchanged >= CHECKS_PER_LEASE and now - renewed_at > self.lease_s:
                break
        self._watch = None
        self._forget()
        with contextlib.suppress(Exception):  # another worker may have removed it first
            await asyncio.wait_for(
                worker.scheduler.unregister_worker_plugin(name=self.name), self.lease_s
            )


class _Renewal:
    """Renews one secret's lease from the client, in a daemon thread, until stopped."""

    def __init__(self, client: Any, name: str, lease_s: float) -> None:
        self.client, self.name, self.lease_s = client, name, lease_s
        self.count = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="dplr-secret-lease", daemon=True
        )

    def start(self) -> None:
        """Open the lease (synchronously: the workers find it on their first check) and keep it."""
        _set_lease(self.client, self.name, self.count)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / RENEWALS_PER_LEASE):
            if self.client.status in ("closing", "closed"):
                return
            self.count += 1
            with contextlib.suppress(Exception):  # a lost scheduler: the lease runs out
                _set_lease(self.client, self.name, self.count)

    def stop(self) -> None:
        """No renewal after this returns (unless the scheduler hangs one for 5 s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=min(self.lease_s, 5.0))


def _set_lease(client: Any, name: str, count: int | None) -> None:
    """The renewal counter of the lease ``name`` on the scheduler (``None``: released)."""
    client.set_metadata([LEASE_KEY, name], count)


_RENEWALS: dict[str, _Renewal] = {}
_RENEWALS_LOCK = threading.Lock()


def _stop_renewal(name: str) -> None:
    """Stop renewing the lease of the secret ``name`` (if this process renews it)."""
    with _RENEWALS_LOCK:
        renewal = _RENEWALS.pop(name, None)
    if renewal is not None:
        renewal.stop()


def install_secret(client: Client, value: Any) -> tuple[_sealed.Sealed, str]:
    """Seal ``value`` and install it on every worker of the cluster, present and
    future; returns (sealed, plugin name).

    A worker lost during the registration is survived; the secret is leased,
    and this process renews the lease until :func:`remove_secret` (module docstring).

    Raises
    ------
    InvalidParameterError
        If ``DPLR_SECRET_LEASE`` is set and not a positive number of seconds.
    RuntimeError
        If every one of :data:`REGISTER_ATTEMPTS` registrations lost a worker
        (the plugin is removed again), or the client lost its scheduler.
    """
    lease = lease_seconds()
    sealed = _sealed.seal(value)
    name = f"dplr-secret-{uuid.uuid4().hex}"
    renewal = _Renewal(client, name, lease)
    with _RENEWALS_LOCK:
        _RENEWALS[name] = renewal
    try:
        renewal.start()
    except BaseException:
        _stop_renewal(name)
        raise
    _register(client, _SecretPlugin(name, sealed.token, value, lease), name)
    return sealed, name


def _register(client: Client, plugin: _SecretPlugin, name: str) -> None:
    """``client.register_plugin(plugin)``, sent again while a worker's loss breaks it."""
    pause = _RETRY_PAUSE_S
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        try:
            client.register_plugin(plugin, name=name)
            return
        except (
            OSError
        ) as exc:  # CommClosedError, connect timeouts; they name addresses only
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
    """Remove the plugin ``name`` (and its secret) from the cluster, quietly if
    gone, and release its lease (a worker still holding it drops it at its next check)."""
    _stop_renewal(name)
    with contextlib.suppress(Exception):  # a closed client: the workers are gone too
        client.unregister_worker_plugin(name)
    with contextlib.suppress(Exception):
        _set_lease(client, name, None)
