"""Shared fixtures: seeds, hypothesis profiles, tolerances."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None)
settings.register_profile("nightly", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Round-off tolerances by dtype (float32 looser), for results that are exact in
#: exact arithmetic; anything else states its own source.
RTOL = {np.dtype("float64"): 1e-10, np.dtype("float32"): 1e-5}

_SEEDS = list(range(100)) if os.environ.get("PIPELINE_TEST_SEEDS") == "all" else [42]


@pytest.fixture(params=_SEEDS)
def global_seed(request: pytest.FixtureRequest) -> int:
    """42 by default; ``PIPELINE_TEST_SEEDS=all`` runs 0..99 (tests must pass for all)."""
    return int(request.param)


@pytest.fixture
def rng(global_seed: int) -> np.random.Generator:
    return np.random.default_rng(global_seed)


# -- privacy audit table (tests/audit) ----------------------------------------
# Kept here rather than in tests/audit/conftest.py: with --doctest-modules every
# conftest.py is also imported as a module named "conftest", and two of them
# with that basename collide.
_AUDIT_ROWS = pytest.StashKey[list[dict[str, Any]]]()


@pytest.fixture(scope="session")
def audit_rows(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Result rows of this session's privacy audits (appended by the tests)."""
    return request.config.stash.setdefault(_AUDIT_ROWS, [])


@pytest.fixture(scope="session")
def shared_scheduler() -> Iterator[str]:
    """One real cluster for the ``dplr`` subprocesses of tests/cli.

    A run on the embedded LocalCluster starts two worker processes that import
    dask, zarr and this package before the first task: seconds per run, most of
    that directory's time. So its runs connect instead (see :func:`cli_cluster`)
    to this LocalCluster of two single-threaded worker processes on loopback,
    started once per session.
    """
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def cli_cluster(shared_scheduler: str) -> Iterator[str]:
    """During one test, ``cli_util.run_dplr`` runs without ``--scheduler`` connect
    to the shared cluster through ``DASK_SCHEDULER_ADDRESS`` (which the command
    honours); a run that tests the embedded default passes ``embedded=True``."""
    import cli_util  # on sys.path once a module of tests/cli is collected

    cli_util.SHARED_SCHEDULER = shared_scheduler
    try:
        yield shared_scheduler
    finally:
        cli_util.SHARED_SCHEDULER = None


def pytest_terminal_summary(
    terminalreporter: Any, exitstatus: int, config: pytest.Config
) -> None:
    rows = config.stash.get(_AUDIT_ROWS, [])
    if rows:
        from audit_cases import table_rows  # on sys.path once tests/audit ran

        from pipeline.testing.audit import markdown_table

        terminalreporter.section("privacy audit: eps lower bounds")
        terminalreporter.write_line(markdown_table(table_rows(rows)))
