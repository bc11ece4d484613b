"""Connecting to a cluster whose workers lack the package or run another version.

The job must fail at once -- before planning, reading or charging anything --
with a message naming the worker, the package and both versions, and the CLI
must exit with code 2 (a configuration the user has to fix).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from dist_util import start_cluster
from distributed import Client, LocalCluster

from pipeline.errors import ClusterMismatchError
from pipeline.execution.client import check_worker_versions, cluster_client

pytestmark = pytest.mark.distributed

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "data", "sample.zarr")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(2) as c:
        yield c


def _pretend(package: str, version: str | None) -> object:
    """A function for ``client.run`` that makes a worker report ``package`` as
    ``version`` (None: not installed); cloudpickled by value, so the worker needs
    nothing from this test module."""

    def patch() -> None:
        real = importlib.metadata.version

        def fake(name: str) -> str:
            if name == package:
                if version is None:
                    raise importlib.metadata.PackageNotFoundError(name)
                return version
            return real(name)

        importlib.metadata.version = fake  # type: ignore[assignment]

    return patch


def _restore() -> None:
    import importlib
    import importlib.metadata as md

    importlib.reload(md)


def test_matching_workers_pass(cluster: LocalCluster) -> None:
    # negative control of the two tests below: the real, matching cluster passes
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        check_worker_versions(client)


@pytest.mark.parametrize(
    ("version", "needle"),
    [("0.0.0-other", "is version 0.0.0-other"), (None, "is not installed")],
)
def test_mismatched_worker_is_refused(
    cluster: LocalCluster, version: str | None, needle: str
) -> None:
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        (one, *_) = sorted(client.scheduler_info()["workers"])
        client.run(_pretend("dplr", version), workers=[one])
        try:
            with (
                pytest.raises(ClusterMismatchError, match=needle) as err,
                cluster_client(cluster.scheduler_address),
            ):
                pass
            assert one in str(err.value)
            assert "dplr" in str(err.value)
        finally:
            client.run(_restore, workers=[one])
        check_worker_versions(client)  # restored: passes again


@pytest.mark.timeout(180)
def test_cli_exits_2_on_a_mismatched_cluster(
    cluster: LocalCluster, tmp_path: object
) -> None:
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        client.run(_pretend("dplr", "0.0.0-other"))
        try:
            out = os.path.join(str(tmp_path), "rel.zarr")
            proc = subprocess.run(
                [
                    sys.executable, "-m", "pipeline", "factorize", SAMPLE, "--rank", "2",
                    "--non-private", "--out", out, "--scheduler", cluster.scheduler_address,
                    "--quiet",
                ],
                capture_output=True, text=True, timeout=150, check=False,
            )  # fmt: skip
        finally:
            client.run(_restore)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("dplr: error: worker ")
    assert "0.0.0-other" in lines[0]
    assert not os.path.exists(out)
