"""One real LocalCluster per test module (style B.10): 2 single-threaded worker
processes behind Nannies on loopback, and a Client registered as the default, so
``factorize`` on a Zarr path or a dask array runs on it (cluster kind "active")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dist_util import start_cluster
from distributed import Client, LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c
