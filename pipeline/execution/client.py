"""Finding or starting the Dask cluster a job runs on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass

from distributed import Client, LocalCluster

from pipeline.errors import ClusterMismatchError, SchedulerUnavailableError

#: Packages whose versions must match between this process and every worker:
#: tasks run this package's functions, and results must not depend on where.
MATCHED_PACKAGES = ("dplr", "numpy", "scipy", "dask", "distributed", "zarr")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterInfo:
    """Where a job ran: ``kind`` is ``active``, ``scheduler`` or ``local``."""

    kind: str
    address: str
    n_workers: int
    dashboard: str | None


def _active_client() -> Client | None:
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


@contextlib.contextmanager
def cluster_client(
    scheduler: str | None = None,
    *,
    n_workers: int | None = None,
    timeout: float = 10.0,
) -> Iterator[tuple[Client, ClusterInfo]]:
    """Yield a distributed client, in order of preference.

    1. ``scheduler`` (an address such as ``tcp://host:8786``), else the
       ``DASK_SCHEDULER_ADDRESS`` environment variable;
    2. the active client of this process, if there is one (as dask-ml does);
    3. an embedded ``LocalCluster`` with one single-threaded worker process per
       core (threaded BLAS inside one worker would make results depend on the
       thread count), closed on exit.

    Raises
    ------
    SchedulerUnavailableError
        If the given scheduler cannot be reached within ``timeout`` seconds.
    """
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
    workers = n_workers or max(1, min(os.cpu_count() or 1, 4))
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=50,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client, _info(client, "local")


def _info(client: Client, kind: str) -> ClusterInfo:
    sched = client.scheduler_info(n_workers=-1)
    try:
        dashboard = client.dashboard_link
    except Exception:  # noqa: BLE001 - no bokeh, or no dashboard configured
        dashboard = None
    return ClusterInfo(
        kind=kind,
        address=str(client.scheduler.address),
        n_workers=len(sched.get("workers", {})),
        dashboard=dashboard,
    )


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_worker_versions(client: Client) -> None:
    """Refuse a cluster whose workers lack this package or run other versions.

    Each worker is asked for the versions of :data:`MATCHED_PACKAGES` with a
    standard-library function (so the question itself needs nothing from this
    package on the worker).

    Raises
    ------
    ClusterMismatchError
        Naming the first mismatching worker, package and both versions.
    """
    local = {pkg: _version(pkg) for pkg in MATCHED_PACKAGES}
    for pkg in MATCHED_PACKAGES:
        answers = client.run(importlib.metadata.version, pkg, on_error="return")
        for worker, got in sorted(answers.items()):
            remote = None if isinstance(got, BaseException) else str(got)
            if remote != local[pkg]:
                have = "is not installed" if remote is None else f"is version {remote}"
                raise ClusterMismatchError(
                    f"worker {worker} cannot run this job: {pkg} {have} there but "
                    f"{local[pkg]} here. Install the same dplr (and numpy, scipy, dask, "
                    "distributed, zarr) on every worker, e.g. `pip install dplr=="
                    f"{local['dplr']}` in the workers' environment, and restart them."
                )
