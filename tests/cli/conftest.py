"""One real cluster for the ``dplr`` subprocesses of this directory.

Each run of the command on its embedded LocalCluster starts two worker
processes that import dask, zarr and this package before the first task: some
seconds per run, most of this directory's time. So the runs connect instead,
through ``DASK_SCHEDULER_ADDRESS`` (which the command honours), to one
LocalCluster with two single-threaded worker processes on loopback, started
once per session. A run that tests the embedded default itself passes
``embedded=True`` to :func:`cli_util.run_dplr`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import cli_util
import pytest
from distributed import LocalCluster


@pytest.fixture(scope="session", autouse=True)
def shared_scheduler() -> Iterator[str]:
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster:
        cli_util.SHARED_SCHEDULER = cluster.scheduler_address
        try:
            yield cluster.scheduler_address
        finally:
            cli_util.SHARED_SCHEDULER = None
