"""Progress bars under a distributed client (ecosystem.md section 5: dask's local
ProgressBar prints nothing there, so the pipeline draws its own, on a stream)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_util import seeded_matrix, write_matrix
from distributed import Client, LocalCluster

from pipeline.api import factorize

pytestmark = pytest.mark.distributed

M, N, CHUNKS = 400, 150, (50, 150)


def _assert_pass_bar(text: str) -> None:
    assert "[####" in text
    assert "100%" in text
    assert "pass over the input: 8 chunks" in text


@pytest.mark.timeout(120)
def test_progress_to_a_stream_on_the_active_client(
    client: Client, tmp_path: Path, global_seed: int
) -> None:
    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, CHUNKS)
    stream = io.StringIO()
    f = factorize(
        path, 5, epsilon=1.0, delta=1e-6, seed=3, budget=(10.0, 1e-4), progress=stream
    )
    text = stream.getvalue()
    _assert_pass_bar(text)
    assert "adding noise to the range sketch" in text
    assert f.report["cluster"]["kind"] == "active"
    # the bar shows counts and time only: no singular value, exact or released (a
    # component released as 0, below the noise, is not one: "0.0" is in any timing)
    exact = np.linalg.svd(A, compute_uv=False)[:5]
    for s in [*exact, *(s for s in f.S if s != 0.0)]:
        assert repr(float(s)) not in text


@pytest.mark.timeout(120)
def test_no_progress_output_without_a_stream(
    client: Client, tmp_path: Path, global_seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), CHUNKS)
    factorize(path, 5, epsilon=1.0, delta=1e-6, seed=3, budget=(10.0, 1e-4))
    captured = capsys.readouterr()
    assert "pass over the input" not in captured.out + captured.err


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_cli_progress_on_stderr_against_a_running_scheduler(
    cluster: LocalCluster, tmp_path: Path, global_seed: int
) -> None:
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), CHUNKS)
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "factorize",
            path,
            "--rank",
            "5",
            "--out",
            str(tmp_path / "out.zarr"),
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--budget-epsilon",
            "10",
            "--budget-delta",
            "1e-4",
            "--scheduler",
            cluster.scheduler_address,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    _assert_pass_bar(proc.stderr)
    # bars go to stderr, the summary to stdout
    assert "pass over the input" not in proc.stdout
    assert "released rank-5 factorization" in proc.stdout
