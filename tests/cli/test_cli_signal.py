"""``dplr factorize`` and ``dplr pca`` say how many components stand above the noise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.cli_util import run_dplr

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

LINE = "components above the noise (level "


def _ledger(tmp_path: Path) -> tuple[str | Path, ...]:
    """A ledger of this test's own (each test passes alone and in any order)."""
    return ("--ledger", tmp_path / "ledger.json", "--budget-epsilon", "200",
            "--budget-delta", "1e-3")  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incoherent rank-2 data (sigma_1, sigma_2 = 43.8, 40 at 4096 rows), row norms <= 1."""
    path = tmp_path_factory.mktemp("signal") / "A.zarr"
    proc = run_dplr(
        "generate", path, "--kind", "pca-coherent", "--rows", 4096, "--cols", 32,
        "--rank", 2, "--support", 4096, "--top", 1600, "--bottom", 4,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return path


def _factorize(store: Path, out: Path, epsilon: str) -> tuple[str, str]:
    proc = run_dplr(
        "factorize", store, "--rank", 2, "--epsilon", epsilon, "--delta", "1e-6",
        "--out", out, "--quiet", "--insecure-noise-seed", 7, "--seed", 3,
        *_ledger(out.parent),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_a_noise_release_warns_in_one_line(store: Path, tmp_path: Path) -> None:
    out, err = _factorize(store, tmp_path / "weak.zarr", "0.05")
    assert "  0 of 2 " + LINE in out
    assert "at 95%)" in out
    warnings = [ln for ln in err.splitlines() if ln.startswith("dplr: warning:")]
    assert len(warnings) == 1
    assert "larger epsilon" in warnings[0]


def test_a_strong_release_does_not_warn(store: Path, tmp_path: Path) -> None:
    """Negative control: the same store at a large epsilon."""
    out, err = _factorize(store, tmp_path / "strong.zarr", "50")
    assert "  2 of 2 " + LINE in out
    assert "warning" not in err


def test_plan_shows_the_noise_level_before_anything_is_read(store: Path) -> None:
    proc = run_dplr(
        "factorize", store, "--rank", 2, "--epsilon", "1", "--delta", "1e-6", "--plan"
    )
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if "passes=" in ln]
    assert len(rows) == 3
    assert all("noise level " in ln and "at 95%" in ln for ln in rows)


def test_pca_summary_has_the_signal_line(store: Path, tmp_path: Path) -> None:
    proc = run_dplr(
        "pca", store, "--rank", 2, "--method", "analyze-gauss", "--epsilon", "50",
        "--delta", "1e-6", "--out", tmp_path / "pca.zarr", "--quiet", *_ledger(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "  2 of 2 " + LINE in proc.stdout
