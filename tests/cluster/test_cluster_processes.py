"""The ``processes`` configuration, for real: a ``dask scheduler`` and two
``dask worker`` processes on loopback (free ports), started as
cluster/processes.yaml documents, and ``dplr factorize`` / ``dplr pca`` run
against them through ``--cluster`` (cluster/processes.yaml pointed at the
scheduler) and through ``--scheduler``.

The releases must be bit-for-bit the same both ways (one cluster, the same
sketch seed and insecure noise seed), equal to the in-memory reference up to
summation order, and their reports must say where they ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cluster_util import (
    CLUSTER_DIR,
    copy_sample,
    dask_processes,
    read_yaml,
    run_dplr,
    write_yaml,
)

from pipeline.api import factorize, pca
from pipeline.io import read_group

pytestmark = pytest.mark.cluster

SEEDS = ("--seed", "3", "--insecure-noise-seed", "5")
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
BUDGET = ("--budget-epsilon", "10", "--budget-delta", "1e-4")
PCA = ("--rank", "2", "--iterations", "2", "--clip-radius", "0.17")
# The cluster and in-memory runs differ only in the order in which per-chunk
# partial sums are added (relative error about n_chunks * 2.2e-16), carried
# through the small dense post-processing; spec power-pca 5.3 A10 sets 1e-10
# relative, which a different noise draw (entries moved by O(sigma)) exceeds
# by orders of magnitude.
RTOL_REFERENCE = 1e-10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with dask_processes(tmp_path_factory.mktemp("dask"), n_workers=2) as info:
        yield info


def _config(tmp: Path, address: str) -> Path:
    """cluster/processes.yaml with the address of the running scheduler."""
    config = read_yaml(CLUSTER_DIR / "processes.yaml")
    config["address"] = address
    config["wait_for_workers"] = 2
    config["timeout"] = 60
    return write_yaml(tmp / "processes.yaml", config)


def _run(tmp: Path, tag: str, *args: Any) -> tuple[Path, Any]:
    out = tmp / f"{tag}.zarr"
    proc = run_dplr(
        *args, *PRIVACY, *BUDGET, "--ledger", tmp / f"{tag}.ledger.json",
        "--out", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


def _assert_ran_on(report: dict[str, Any], proc: Any, dashboard: str) -> None:
    assert report["cluster"]["kind"] == "scheduler"
    assert report["cluster"]["n_workers"] == 2
    assert report["private"] is False  # the insecure noise seed says so
    assert f"dask cluster: scheduler, 2 workers, dashboard {dashboard}" in proc.stderr


def _close(actual: np.ndarray, desired: np.ndarray) -> None:
    np.testing.assert_allclose(
        actual,
        desired,
        rtol=RTOL_REFERENCE,
        atol=RTOL_REFERENCE * float(np.abs(desired).max()),
    )


@pytest.mark.timeout(240)
def test_factorize_on_dask_processes(cluster: dict[str, str], tmp_path: Path) -> None:
    store = copy_sample("sample.zarr", tmp_path)
    config = _config(tmp_path, cluster["address"])
    base = ("factorize", store, "--rank", "2", *SEEDS, "--json")
    via_config, p1 = _run(tmp_path, "cfg", *base, "--cluster", config)
    via_address, p2 = _run(tmp_path, "addr", *base, "--scheduler", cluster["address"])
    names = ("U", "S", "V")
    one, rep1 = read_group(via_config, names)
    two, rep2 = read_group(via_address, names)
    _assert_ran_on(rep1, p1, cluster["dashboard"])
    _assert_ran_on(rep2, p2, cluster["dashboard"])
    for name in names:
        np.testing.assert_array_equal(one[name], two[name], err_msg=name)
    A = np.asarray(zarr.open_array(store=store, mode="r")[...])
    ref = factorize(
        A, 2, epsilon=1.0, delta=1e-6, seed=3, insecure_noise_seed=5
    )  # in memory: no cluster, no ledger
    _close(one["S"], ref.S)
    _close((one["U"] * one["S"]) @ one["V"].T, (ref.U * ref.S) @ ref.V.T)


@pytest.mark.timeout(240)
def test_pca_on_dask_processes(cluster: dict[str, str], tmp_path: Path) -> None:
    store = copy_sample("pca_sample.zarr", tmp_path)
    config = _config(tmp_path, cluster["address"])
    base = ("pca", store, *PCA, "--insecure-noise-seed", "5", "--json")
    via_config, p1 = _run(tmp_path, "cfg", *base, "--cluster", config)
    via_address, p2 = _run(tmp_path, "addr", *base, "--scheduler", cluster["address"])
    names = ("components", "eigenvalues")
    one, rep1 = read_group(via_config, names)
    two, rep2 = read_group(via_address, names)
    _assert_ran_on(rep1, p1, cluster["dashboard"])
    _assert_ran_on(rep2, p2, cluster["dashboard"])
    for name in names:
        np.testing.assert_array_equal(one[name], two[name], err_msg=name)
    A = np.asarray(zarr.open_array(store=store, mode="r")[...])
    ref = pca(
        A, 2, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.17,
        insecure_noise_seed=5,
    )  # fmt: skip
    _close(one["components"], ref.components)
    _close(one["eigenvalues"], ref.eigenvalues)


@pytest.mark.timeout(120)
def test_scheduler_file_and_unreachable_scheduler(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """``scheduler_file`` connects too; an unreachable address exits 2 quickly."""
    from pipeline.execution.client import cluster_client

    cfg = write_yaml(
        tmp_path / "sf.yaml",
        {"kind": "scheduler", "scheduler_file": cluster["scheduler_file"]},
    )
    with cluster_client(cluster_config=cfg) as (_client, info):
        assert info.kind == "scheduler"
        assert info.address == cluster["address"]
        assert info.n_workers >= 1
    gone = write_yaml(
        tmp_path / "gone.yaml",
        {"kind": "scheduler", "address": "tcp://127.0.0.1:9", "timeout": 2},
    )
    proc = run_dplr(
        "factorize", copy_sample("sample.zarr", tmp_path), "--rank", "2",
        "--non-private", "--out", tmp_path / "o.zarr", "--cluster", gone,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"dplr: error: {gone}: cannot reach the Dask")
    assert not (tmp_path / "o.zarr").exists()


def test_config_kinds_run_the_version_check(
    cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configured (non-embedded) cluster is refused when its workers do not
    match (the mismatch itself is tested in tests/distributed)."""
    import pipeline.execution.client as client_module
    from pipeline.errors import ClusterMismatchError

    seen: list[int] = []

    def refuse(client: Any) -> None:
        seen.append(len(client.scheduler_info(n_workers=-1)["workers"]))
        raise ClusterMismatchError("worker w0 cannot run this job: (test)")

    monkeypatch.setattr(client_module, "check_worker_versions", refuse)
    with (
        pytest.raises(ClusterMismatchError, match="w0"),
        client_module.cluster_client(
            cluster_config=_config(tmp_path, cluster["address"])
        ),
    ):
        pass
    assert seen == [2]  # after waiting for wait_for_workers=2
