"""What a new user meets first: ``dplr demo``'s output and its files, summaries
without ``nan`` and without jargon, a command that makes a stream batch, errors
that name flags on the command line and parameters in Python, and the documented
length of a PCA's ``eigenvalues``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_util import run_in_process

from pipeline.cli.common import factorize_summary
from pipeline.errors import InvalidParameterError

pytestmark = pytest.mark.cli

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_demo_prints_its_summary_and_removes_its_directory(
    tmp_path: Path, cli_cluster: str
) -> None:
    """Without --dir the demo works in a temporary directory, prints a short
    summary (no JSON report) and removes the directory, saying so."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "DASK_SCHEDULER_ADDRESS": cli_cluster}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--rows", "2000", "--cols", "200"],
        capture_output=True, text=True, timeout=220, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "{" not in proc.stdout  # the report is behind --json
    assert len(proc.stdout.splitlines()) <= 20
    assert "released rank-2 factorization" in proc.stdout
    assert "removed" in proc.stdout
    assert list(tmp.iterdir()) == []  # nothing left behind
    # negative control: the demo did write there (its summary names the directory)
    assert str(tmp) in proc.stdout


def _pca_report(**changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "rank": 2, "epsilon": None, "resumed_releases": [], "selection": None,
        "n_passes": 1, "timings_seconds": {},
        "parameters": {"method": "analyze-gauss", "clip_radius": None,
                       "iterations": 0, "route": "gram"},
    }  # fmt: skip
    report.update(changes)
    return report


def test_summaries_show_no_nan_time() -> None:
    """A report without a total time (a selection withholds it) shows no time,
    never ``time=nans``; a report with one shows it."""
    from pipeline.cli.pca import _summary

    lrf = {
        "rank": 2, "epsilon": None, "algorithm": "spectral", "n_passes": 1,
        "timings_seconds": {},
        "parameters": {"sketch_size": 22, "core_size": 133},
    }  # fmt: skip
    for text in (factorize_summary(lrf, "o.zarr"), _summary(_pca_report(), "o.zarr")):
        assert "nan" not in text
        assert "time=" not in text
    timed = _summary(_pca_report(timings_seconds={"total": 1.5}), "o.zarr")
    assert "time=1.50s" in timed  # negative control


def test_a_failed_warm_start_is_said_in_plain_words() -> None:
    from pipeline.cli.pca import _summary

    sel = {
        "selected_clip_radius": 0.1, "selected_iterations": 3, "score_gap": -1.0,
        "warm_start_gap_test_passed": False, "withheld": "passes",
    }  # fmt: skip
    text = _summary(_pca_report(selection=sel), "o.zarr")
    assert "gap test" not in text
    assert "Analyze Gauss" in text
    assert "eigengap" in text
    selection = (REPO / "pipeline/algorithms/pca/selection.py").read_text()
    assert 'say("warm-start gap test failed' not in selection


def test_docs_say_why_eigenvalues_has_k_plus_1_entries() -> None:
    for doc in ("docs/pca.md", "README.md"):
        text = (REPO / doc).read_text()
        assert "k + 1" in text, doc
        assert "eigengap" in text, doc
    pca_doc = (REPO / "docs/pca.md").read_text()
    assert "`eigenvalues`" in pca_doc


def test_generate_stream_batch_writes_a_batch_that_ingests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.io.batches import read_batch

    batch = tmp_path / "batch.parquet"
    proc = run_in_process(
        capsys, "generate", batch, "--kind", "stream-batch", "--rows", 100,
        "--cols", 50, "--updates", 300, "--seed", 3,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(batch) in proc.stdout
    got = read_batch(batch, shape=(100, 50))
    assert len(got) == 300
    assert np.array_equal(got.entity, got.i)  # unit row: an entity is a row
    init = run_in_process(
        capsys, "stream", "init", tmp_path / "s.stream", "--rows", 100, "--cols", 50,
        "--rank", 2, "--horizon", 4, "--epsilon", 1.0, "--delta", 1e-6, "--unit", "row",
        "--ledger", tmp_path / "l.json", "--budget-epsilon", 1.0, "--budget-delta", 1e-6,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    ingest = run_in_process(
        capsys, "stream", "ingest", tmp_path / "s.stream", batch, "--epoch", 1
    )
    assert ingest.returncode == 0, ingest.stderr
    again = run_in_process(
        capsys, "generate", batch, "--kind", "stream-batch", "--rows", 100,
        "--cols", 50,
    )  # fmt: skip
    assert again.returncode == 2
    assert "--overwrite" in again.stderr


def test_cli_errors_name_flags_and_python_errors_name_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "a.zarr"
    made = run_in_process(capsys, "generate", store, "--rows", 64, "--cols", 8)
    assert made.returncode == 0, made.stderr
    nodp = run_in_process(
        capsys, "factorize", store, "--rank", 2, "--out", tmp_path / "o"
    )
    assert nodp.returncode == 2
    assert "--non-private" in nodp.stderr
    assert "private=False" not in nodp.stderr
    grid = run_in_process(
        capsys, "pca", store, "--rank", 2, "--epsilon", 1.0, "--delta", 1e-6,
        "--radius-grid", "0.1", "--out", tmp_path / "o",
    )  # fmt: skip
    assert grid.returncode == 2
    assert "--radius-grid" in grid.stderr
    assert "--select" in grid.stderr
    assert "select=True" not in grid.stderr
    assert "radius_grid" not in grid.stderr
    (tmp_path / "taken.zarr").mkdir()
    exists = run_in_process(
        capsys, "factorize", store, "--rank", 2, "--non-private",
        "--out", tmp_path / "taken.zarr",
    )  # fmt: skip
    assert exists.returncode == 2
    assert "--overwrite" in exists.stderr
    assert "overwrite=True" not in exists.stderr
    # the Python API keeps its own words
    from pipeline.api import make_params

    with pytest.raises(InvalidParameterError, match=r"private=False"):
        make_params(2, epsilon=None, delta=None)
