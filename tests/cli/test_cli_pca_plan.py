"""``dplr pca --plan``: the method, the noise and the noise level, before anything is read.

The plan's noise level must be the one a real release records (``signal.noise_level``)
for the same public parameters: both come from the same function of the public
calibration, so they are compared exactly. The plan reads no data (a store whose chunks
are garbage plans as well), charges nothing and writes nothing; the real release does
charge (negative control).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_util import assert_one_line_error, file_state, run_dplr, run_in_process

from pipeline.cli import show

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
#: public (T, R) of a power run: R about 2 sqrt(k log(n) / n) at n = 4096
POWER = ("--method", "power", "--iterations", "2", "--clip-radius", "0.06")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incoherent rank-2 data, 4096 x 32, row norms <= 1."""
    path = tmp_path_factory.mktemp("pcaplan") / "A.zarr"
    proc = run_dplr(
        "generate", path, "--kind", "pca-coherent", "--rows", 4096, "--cols", 32,
        "--rank", 2, "--support", 4096, "--top", 1600, "--bottom", 4,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return path


def _listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _plan(store: Path, *args: Any) -> dict[str, Any]:
    proc = run_dplr("pca", store, "--rank", 2, *PRIVACY, *args, "--plan", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert isinstance(plan, dict)
    return plan


@pytest.mark.parametrize(
    ("method", "chosen"), [(("--method", "auto"), "analyze-gauss"), (POWER, "power")]
)
def test_plan_level_is_the_release_level_and_charges_nothing(
    store: Path, tmp_path: Path, method: tuple[str, ...], chosen: str
) -> None:
    ledger = tmp_path / "ledger.json"
    budget = ("--ledger", ledger, "--budget-epsilon", "10", "--budget-delta", "1e-4")
    before = _listing(store.parent)

    text = run_dplr("pca", store, "--rank", 2, *PRIVACY, *method, *budget, "--plan")
    assert text.returncode == 0, text.stderr
    plan = _plan(store, *method, *budget)
    assert plan["method"] == chosen
    level = plan["noise_level"]
    assert f"noise level {level:.4g} at 95%" in text.stdout
    assert f"method {chosen}" in text.stdout
    # nothing charged or written: no ledger created, no journal beside the store
    assert not ledger.exists()
    assert _listing(store.parent) == before
    assert text.stderr == ""

    out = tmp_path / "pca.zarr"
    proc = run_dplr(
        "pca", store, "--rank", 2, *PRIVACY, *method, *budget, "--out", out,
        "--quiet", "--json", "--insecure-noise-seed", 5,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["parameters"]["method"] == chosen
    # the same function of the same public calibration: equal, not close
    assert report["signal"]["noise_level"] == level
    assert report["signal"]["confidence"] == plan["confidence"] == 0.95
    # negative control: the release did charge the ledger
    charged = file_state(ledger)
    assert charged is not None
    assert len(json.loads(charged)["releases"]) == 1

    again = run_dplr("pca", store, "--rank", 2, *PRIVACY, *method, *budget, "--plan")
    assert again.returncode == 0, again.stderr
    assert file_state(ledger) == charged


def test_plan_reads_no_data(store: Path, tmp_path: Path) -> None:
    """Every chunk replaced by garbage: the plan is the same; a release fails (control)."""
    broken = tmp_path / "broken.zarr"
    shutil.copytree(store, broken)
    chunks = [
        Path(root, f)
        for root, _, files in os.walk(broken)
        for f in files
        if not f.endswith(".json")
    ]
    assert chunks
    for c in chunks:
        c.write_bytes(b"not a chunk")
    assert _plan(broken, *POWER) == _plan(store, *POWER)
    proc = run_dplr(
        "pca", broken, "--rank", 2, *PRIVACY, *POWER, "--out", tmp_path / "o.zarr",
        "--quiet", "--ledger", tmp_path / "l.json", "--budget-epsilon", "10",
        "--budget-delta", "1e-4", "--insecure-noise-seed", 5,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot be read" in proc.stderr


def test_plan_of_a_selection_says_what_the_method_depends_on(store: Path) -> None:
    proc = run_dplr("pca", store, "--rank", 2, *PRIVACY, "--select", "--plan")
    assert proc.returncode == 0, proc.stderr
    assert "chosen privately" in proc.stdout
    assert "noise level " in proc.stdout
    plan = _plan(store, "--select")
    assert plan["method"] is None
    assert plan["noise_level"] > 0


def test_plan_of_a_non_private_run_is_refused(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_in_process(capsys, "pca", store, "--rank", 2, "--non-private", "--plan")
    line = assert_one_line_error(proc, 2, "dplr: ")
    assert "--non-private" in line


def test_a_release_without_out_or_plan_is_refused(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_in_process(capsys, "pca", store, "--rank", 2, *PRIVACY)
    line = assert_one_line_error(proc, 2, "dplr: error: ")
    assert "--out" in line
    assert "--plan" in line


def test_plotted_noise_level_is_on_the_scale_of_the_plotted_eigenvalues(
    store: Path, tmp_path: Path
) -> None:
    """With rows divided by C = 2 (no row is clipped: the store's row norms are <= 1),
    every released eigenvalue lies within the drawn noise level of the drawn true one.

    Weyl: |lambda_i(A^T A + E) - lambda_i(A^T A)| <= ||E||_2 <= noise level, at the
    level's 95% (Davidson-Szarek); the noise is seeded, so the draw is fixed. The
    true eigenvalues unscaled by C^2 (negative control) are not within it.
    """
    out = tmp_path / "pca.zarr"
    proc = run_dplr(
        "pca", store, "--rank", 2, *PRIVACY, "--method", "analyze-gauss",
        "--row-norm-bound", "2", "--out", out, "--quiet", "--insecure-noise-seed", 11,
        "--ledger", tmp_path / "l.json", "--budget-epsilon", "10", "--budget-delta", "1e-4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    chart, notes = show.release_chart(show.load(str(out)))
    assert notes == []
    series = {s.kind: s for s in chart.series}
    released, truth = series["released"].y, series["truth"].y
    (level,) = series["noise"].y
    assert level == show.load(str(out)).report["signal"]["noise_level"]
    assert len(released) == 3  # k + 1
    assert all(abs(r - t) <= level for r, t in zip(released, truth, strict=False))
    assert released[0] > 2 * level  # a signal well above the level, not a trivial pass
    unscaled = [t * 2.0**2 for t in truth]
    assert any(abs(r - t) > level for r, t in zip(released, unscaled, strict=False))
