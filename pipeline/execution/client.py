"""Finding or starting the Dask cluster a job runs on."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO, cast

import dask
from distributed import Client, LocalCluster, default_client
from distributed.core import PooledRPCCall, rpc

from pipeline.errors import (
    ClusterMismatchError,
    InvalidParameterError,
    PipelineError,
    SchedulerUnavailableError,
)
from pipeline.execution.clusters import (
    ClusterConfig,
    load_cluster_config,
    local_cluster_kwargs,
    start_from_config,
)

#: Packages whose versions must match between this process and every worker:
#: tasks run this package's functions, and results must not depend on where.
MATCHED_PACKAGES = ("dplr", "numpy", "scipy", "dask", "distributed", "zarr")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterInfo:
    """Where a job ran.

    ``kind`` is ``active``, ``scheduler`` or ``local``, or the kind of the
    cluster configuration file that started it (``ssh``, ``slurm``, ``pbs``,
    ``kubernetes``).
    """

    kind: str
    address: str
    n_workers: int
    dashboard: str | None


def _active_client() -> Client | None:
    try:
        client: Client = default_client()
        return client
    except ValueError:
        return None


@contextlib.contextmanager
def cluster_client(
    scheduler: str | None = None,
    *,
    cluster_config: str | os.PathLike[str] | ClusterConfig | None = None,
    n_workers: int | None = None,
    timeout: float = 10.0,
    progress: TextIO | None = None,
) -> Iterator[tuple[Client, ClusterInfo]]:
    """Yield a distributed client, in order of preference.

    1. ``scheduler`` (an address such as ``tcp://host:8786``) or
       ``cluster_config`` (a ``cluster/*.yaml`` file, or its loaded
       :class:`~pipeline.execution.clusters.ClusterConfig`; the cluster it
       describes is started here and closed on exit), never both; else the
       ``DASK_SCHEDULER_ADDRESS`` environment variable;
    2. the active client of this process, if there is one (as dask-ml does);
    3. an embedded ``LocalCluster`` with one single-threaded worker process per
       core, at most 4 (threaded BLAS inside one worker would make results depend on the
       thread count), closed on exit.

    Every cluster but an embedded local one must pass
    :func:`check_worker_versions` first. ``progress`` receives a line when a
    configured cluster is started (with its dashboard address).

    Raises
    ------
    InvalidParameterError
        Both ``scheduler`` and ``cluster_config``, or an invalid configuration.
    SchedulerUnavailableError
        If the given scheduler cannot be reached within ``timeout`` seconds.
    ClusterMismatchError
        If a worker lacks this package or runs other versions.
    """
    if cluster_config is not None:
        if scheduler:
            raise InvalidParameterError(
                "give either a scheduler address or a cluster configuration "
                f"file, not both; got scheduler={scheduler!r} and "
                f"cluster_config={_config_path(cluster_config)!r}."
            )
        with _configured(cluster_config, progress) as pair:
            yield pair
        return
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if address:
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise SchedulerUnavailableError(
                f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s "
                f"({type(exc).__name__}); check the address, or omit --scheduler to "
                "run on an embedded local cluster."
            ) from None
        try:
            check_worker_versions(client)
            yield client, _info(client, "scheduler")
        finally:
            client.close()
        return
    active = _active_client()
    if active is not None:
        check_worker_versions(active)
        yield active, _info(active, "active")
        return
    check_script_guard()
    with (
        LocalCluster(**local_cluster_kwargs({"n_workers": n_workers})) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client, _info(client, "local")


def _config_path(config: str | os.PathLike[str] | ClusterConfig) -> str:
    return config.path if isinstance(config, ClusterConfig) else os.fspath(config)


@contextlib.contextmanager
def _configured(
    config: str | os.PathLike[str] | ClusterConfig, progress: TextIO | None
) -> Iterator[tuple[Client, ClusterInfo]]:
    """The cluster of a configuration file: validated before anything starts."""
    if not isinstance(config, ClusterConfig):
        config = load_cluster_config(config)
    if config.kind == "local" and config.options.get("processes", True):
        check_script_guard()

    def announce(line: str) -> None:
        if progress is not None:
            print(line, file=progress, flush=True)

    with start_from_config(config, announce=announce) as client:
        if config.kind != "local":
            check_worker_versions(client)
        yield client, _info(client, config.kind)


def check_script_guard() -> None:
    """Refuse to start local worker processes from the unguarded top level of a
    script, in one line that shows the guard.

    Worker processes of a local cluster are started by ``multiprocessing`` with
    the ``spawn`` method (distributed's ``distributed.worker.multiprocessing-
    method``; ``forkserver`` behaves alike). A spawned process first re-imports
    the parent's main script as ``__mp_main__``: a call at the script's top
    level then runs again in every worker, which tries to start a cluster of its
    own during its bootstrap. distributed reports this as one traceback per
    worker ("Nanny failed to start") or hangs. Its documented answer is the
    guard (docs/source/local-cluster.rst: "Within a Python script you need to
    start a local cluster in the ``if __name__ == '__main__'`` block"; issues
    dask/distributed#2422, #4751).

    We keep that answer and make the failure clear rather than hide the
    re-import: suppressing it would mean patching ``multiprocessing``'s global
    state (``__main__.__spec__`` or ``spawn.get_preparation_data``) for every
    thread of the user's process while the job runs, and the user's own Dask or
    multiprocessing code in the same script needs the guard anyway.

    The check mirrors ``multiprocessing.spawn.get_preparation_data``: a main
    module run with ``-m`` whose name is ``__main__`` or ends in ``.__main__``
    (``python -m pipeline``) is not re-imported; a main module with a file is.
    The call is refused when the outermost frame of that file's module code is
    on a line outside an ``if __name__ == "__main__":`` block (read from the
    file's AST). Interactive sessions, notebooks and ``python -c`` have no such
    file and pass; so does the ``fork`` start method.

    Raises
    ------
    PipelineError
        Naming the script and the line, and showing the guard.
    """
    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return
    line = _top_level_line(os.path.realpath(path))
    if line is None:
        return
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return
    if _under_main_guard(tree, line):
        return
    raise PipelineError(
        f"{os.path.basename(path)}, line {line}: a script that starts dplr's local "
        'cluster must do so under `if __name__ == "__main__":` (its worker '
        "processes re-import the script and would run this line again); indent "
        "the call under that line, or pass scheduler= the address of a running "
        "cluster."
    )


def _top_level_line(path: str) -> int | None:
    """The line of the outermost frame running ``path``'s module code, if any."""
    line = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and os.path.realpath(code.co_filename) == path:
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
    ):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _under_main_guard(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in the body of an ``if __name__ == "__main__":``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            first, last = node.body[0].lineno, node.body[-1].end_lineno
            if first <= line <= (last or first):
                return True
    return False


def _info(client: Client, kind: str) -> ClusterInfo:
    sched = client.scheduler_info(n_workers=-1)
    try:
        dashboard = client.dashboard_link
    except Exception:  # noqa: BLE001 - no bokeh, or no dashboard configured
        dashboard = None
    return ClusterInfo(
        kind=kind,
        # typed Optional (None before a client starts); this client is connected
        address=str(cast("rpc | PooledRPCCall", client.scheduler).address),
        n_workers=len(sched.get("workers", {})),
        dashboard=dashboard,
    )


@functools.cache
def _version(pkg: str) -> str | None:
    # this process's own versions: read once (each lookup scans sys.path)
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_worker_versions(client: Client) -> None:
    """Refuse a cluster whose scheduler or workers lack this package or run other versions.

    Each worker and the scheduler are asked for the versions of
    :data:`MATCHED_PACKAGES` in one round trip, by a function that needs only
    the standard library there (so the question itself needs nothing from this
    package on the worker).

    Raises
    ------
    ClusterMismatchError
        Naming the first mismatching worker, package and both versions.
    """

    def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
        # nested, so cloudpickle ships it by value (with importlib.metadata by
        # reference): the worker needs only the standard library to answer
        # (one round trip for all packages)
        found: dict[str, str | None] = {}
        for name in packages:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
        return found

    local = {pkg: _version(pkg) for pkg in MATCHED_PACKAGES}
    answers: dict[str, Any] = client.run(versions, MATCHED_PACKAGES, on_error="return")
    try:  # the scheduler unpickles task graphs that name this package's functions
        answers["the scheduler"] = client.run_on_scheduler(versions, MATCHED_PACKAGES)
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable
        answers["the scheduler"] = exc
    for pkg in MATCHED_PACKAGES:
        for worker, got in sorted(answers.items()):
            remote = None if isinstance(got, BaseException) else got.get(pkg)
            if remote != local[pkg]:
                have = "is not installed" if remote is None else f"is version {remote}"
                raise ClusterMismatchError(
                    f"{'' if worker == 'the scheduler' else 'worker '}{worker} cannot run this job: {pkg} {have} there but "
                    f"{local[pkg]} here. Install the same dplr (and numpy, scipy, dask, "
                    "distributed, zarr) on every worker, e.g. `pip install dplr=="
                    f"{local['dplr']}` in the workers' environment, and restart them."
                )
