"""An SSH server on loopback for the ``ssh`` cluster tests, served by asyncssh
(in the test extra), so that ``dplr --cluster`` drives distributed's SSHCluster
through a real SSH connection on any machine, without an installed sshd.

It does what sshd does for the commands SSHCluster sends (``uname``, then
``env DASK_INTERNAL_INHERIT_CONFIG=... python -m distributed.cli.dask_spec
...`` for the scheduler and for each worker host): key login only, for one
fresh client key, with a fresh host key that the client checks against a
known_hosts file; each command runs as this user under ``/bin/sh -c`` in a
session of its own, its standard streams carried over the channel, and a
signal the client sends (SSHCluster sends KILL when it closes) is delivered to
that shell, as sshd does. Shells, port forwarding and SFTP are refused.

The server runs on an event loop in a thread of the test process, on a port
the kernel picks. It records every login and every command, and on exit
stops listening and kills whatever its sessions left running, after noting it
in ``leftovers`` (a test asserts that list is empty: closing the cluster must
stop the remote processes by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import pwd
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    # asyncssh still imports cryptography's DSA support, which cryptography
    # deprecates with a warning at import time (an error under this suite's
    # filterwarnings); the tests use ed25519 keys only
    warnings.simplefilter("ignore")
    import asyncssh

__all__ = ["LoopbackSSH", "fresh_key", "group_alive", "loopback_ssh_server"]

#: what sshd runs a command with: this user's login shell, ``-c COMMAND``
SHELL = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"


def fresh_key(path: Path) -> str:
    """Write a new ed25519 private key to ``path``; return its public half as
    an OpenSSH line (``ssh-ed25519 AAAA...``)."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    return key.export_public_key("openssh").decode().strip()


def group_alive(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(entry.name))
    return alive


@dataclass
class LoopbackSSH:
    """What a test needs to point a cluster file at the server, and its record.

    ``connect_options`` are the asyncssh.connect options for it (loopback port,
    this user, the client key, the known_hosts file); ``logins`` counts the
    completed key logins, ``commands`` lists every command run, in order,
    ``sessions`` the process group of each, and ``leftovers`` the processes
    still running when the server stopped (killed then).
    """

    port: int
    client_key: Path
    known_hosts: Path
    username: str
    logins: int = 0
    commands: list[str] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)

    @property
    def connect_options(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "username": self.username,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(self.known_hosts),
        }

    def running(self) -> list[int]:
        """The live processes of every session, whatever their parent now."""
        return [pid for pgid in self.sessions for pid in group_alive(pgid)]

    def wait_until_ended(self, timeout: float) -> list[int]:
        """Wait up to ``timeout`` seconds for every session's processes to
        exit by themselves; return those still running (none are killed)."""
        deadline = time.monotonic() + timeout
        while (alive := self.running()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive


class _Server(asyncssh.SSHServer):
    """Counts completed logins and keeps the open connections; everything else
    is asyncssh's default (public-key authentication against
    ``authorized_client_keys``; no password, no keyboard-interactive)."""

    def __init__(
        self, record: LoopbackSSH, connections: set[asyncssh.SSHServerConnection]
    ) -> None:
        self._record = record
        self._connections = connections
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._connections.discard(self._conn)

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def auth_completed(self) -> None:
        self._record.logins += 1


def _spawn(command: str, env: Mapping[str, str], home: Path) -> subprocess.Popen[bytes]:
    """``SHELL -c COMMAND`` in a session of its own, on pipes (fork and exec:
    nothing here waits for the command)."""
    return subprocess.Popen(
        [SHELL, "-c", command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env), cwd=home, start_new_session=True,
    )  # fmt: skip


async def _session(
    process: asyncssh.SSHServerProcess[bytes],
    record: LoopbackSSH,
    env: Mapping[str, str],
    home: Path,
) -> None:
    """Run the requested command as sshd would without a pseudo-terminal: the
    user's shell with ``-c`` in a new session, its standard streams carried by
    pipes (asyncssh delivers the client's signals to the redirect pid only for
    pipe redirections, not for asyncio streams)."""
    if not process.command:
        process.stderr.write(b"this server runs commands only, no shell\n")
        process.exit(1)
        return
    record.commands.append(process.command)
    proc = _spawn(process.command, env, home)
    record.sessions.append(proc.pid)
    process.set_redirect_pid(proc.pid)
    await process.redirect(stdin=proc.stdin, stdout=proc.stdout, stderr=proc.stderr)
    status = await asyncio.get_running_loop().run_in_executor(None, proc.wait)
    with contextlib.suppress(OSError, asyncssh.Error):
        # a shell killed by a signal exits 128 + its number, as sshd reports
        process.exit(status if status >= 0 else 128 - status)
    await process.wait_closed()  # runs the pipe redirections' clean-up


async def _listen(
    tmp: Path, env: dict[str, str], connections: set[asyncssh.SSHServerConnection]
) -> tuple[asyncssh.SSHAcceptor, LoopbackSSH]:
    """Fresh keys in ``tmp``; listen on 127.0.0.1 on a port the kernel picks;
    write the known_hosts line for that port."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    record = LoopbackSSH(
        port=0, client_key=tmp / "client_key", known_hosts=tmp / "known_hosts",
        username=getpass.getuser(),
    )  # fmt: skip
    authorized = tmp / "authorized_keys"
    authorized.write_text(fresh_key(record.client_key) + "\n")

    async def handler(process: asyncssh.SSHServerProcess[bytes]) -> None:
        await _session(process, record, env, tmp)

    acceptor = await asyncssh.listen(
        "127.0.0.1", 0, server_factory=lambda: _Server(record, connections),
        server_host_keys=[host_key], authorized_client_keys=str(authorized),
        process_factory=handler, encoding=None, allow_pty=False,
        agent_forwarding=False, x11_forwarding=False, sftp_factory=None,
        allow_scp=False,
    )  # fmt: skip
    record.port = acceptor.get_port()
    # the client checks the host key against this line (host and port)
    public = host_key.export_public_key("openssh").decode().strip()
    record.known_hosts.write_text(f"[127.0.0.1]:{record.port} {public}\n")
    return acceptor, record


async def _close(
    acceptor: asyncssh.SSHAcceptor, connections: set[asyncssh.SSHServerConnection]
) -> None:
    """Stop listening and close every open connection."""
    acceptor.close()
    await acceptor.wait_closed()
    for conn in list(connections):
        conn.close()
        await conn.wait_closed()


def _kill_sessions(record: LoopbackSSH, grace: float = 10.0) -> None:
    """End what the sessions left running: TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in record.sessions:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while record.running() and time.monotonic() < deadline:
            time.sleep(0.1)


async def _drain() -> None:
    """Let the session handlers finish (their shells have exited by now)."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if others:
        await asyncio.wait(others, timeout=10)
    await asyncio.get_running_loop().shutdown_default_executor()


@contextlib.contextmanager
def loopback_ssh_server(
    tmp: Path, env: Mapping[str, str] | None = None
) -> Iterator[LoopbackSSH]:
    """Serve SSH on 127.0.0.1 until the block exits.

    Keys and the known_hosts file are written to ``tmp``, which is also the
    working directory of the commands; ``env`` is their environment (default:
    this process's). On exit: ``leftovers`` notes the processes the sessions
    left running, then the server closes its connections, kills them, and stops.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    connections: set[asyncssh.SSHServerConnection] = set()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loopback-ssh")
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)

    try:
        environ = dict(os.environ if env is None else env)
        acceptor, record = call(_listen(tmp, environ, connections))
        try:
            yield record
        finally:
            record.leftovers = record.running()
            call(_close(acceptor, connections))
            _kill_sessions(record)
            call(_drain())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
