"""``dplr generate --kind pca-coherent``: PCA test data with known coherence and gap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from cli_util import assert_nothing_at, assert_one_line_error, run_dplr

from pipeline.linalg.metrics import sin_theta

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

ROWS, COLS, RANK, SUPPORT = 2048, 16, 2, 256
TOP, BOTTOM = 60.0, 15.0
PCA = ("--kind", "pca-coherent", "--rank", RANK, "--support", SUPPORT)
SPECTRUM = ("--top", TOP, "--bottom", BOTTOM)


def _generate(out: Path, *extra: str | float, dtype: str = "float32") -> None:
    proc = run_dplr(
        "generate", out, "--rows", ROWS, "--cols", COLS, *PCA,
        "--dtype", dtype, *(str(x) for x in (*SPECTRUM, *extra)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {ROWS} x {COLS} {dtype} matrix to {out}" in proc.stdout
    assert f"pca-coherent, rank {RANK}, support {SUPPORT}" in proc.stdout


@pytest.mark.timeout(60)
def test_generate_pca_coherent_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "pca.zarr"
    _generate(out, "--chunks", "512,8", "--seed", "11")
    z = zarr.open_array(store=out, mode="r")
    assert z.shape == (ROWS, COLS)
    assert z.chunks == (512, 8)
    assert z.dtype == np.float32
    truth = z.attrs["dplr_synthetic"]
    assert truth["kind"] == "pca-coherent"
    assert (truth["rank"], truth["support"], truth["seed"]) == (RANK, SUPPORT, 11)
    assert truth["coherence"] == 1 / 16
    assert truth["gap_k"] == TOP - BOTTOM
    assert truth["kappa_k"] == pytest.approx(1 - BOTTOM / TOP, rel=1e-15)

    A = z[...].astype(np.float64)
    assert np.linalg.norm(A, axis=1).max() <= 1.0
    sigma = np.array(truth["singular_values"])
    np.testing.assert_allclose(sigma**2, [1.2 * TOP, TOP] + [BOTTOM] * (COLS - RANK))
    # float32 storage: ||A32 - A||_2 <~ 1e-7 ||A||_F, so the singular values move by
    # ~1e-7 sigma_1 and the subspace by ~1e-7 ||A||_F sigma_1 / gap_k [Wedin]; the
    # tolerances below are 10x those.
    _, s, Vt = np.linalg.svd(A, full_matrices=False)
    np.testing.assert_allclose(s, sigma, rtol=1e-5)
    Vk = np.array(truth["top_right_singular_vectors"])
    assert Vk.shape == (COLS, RANK)
    assert sin_theta(Vt[:RANK].T, Vk) < 1e-5


@pytest.mark.timeout(60)
def test_generate_pca_coherent_is_reproducible(tmp_path: Path) -> None:
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    _generate(a, "--seed", "3")
    _generate(b, "--seed", "3", dtype="float64")
    za, zb = zarr.open_array(store=a, mode="r"), zarr.open_array(store=b, mode="r")
    np.testing.assert_array_equal(za[...], zb[...].astype(np.float32))
    ta, tb = za.attrs["dplr_synthetic"], zb.attrs["dplr_synthetic"]
    assert ta["top_right_singular_vectors"] == tb["top_right_singular_vectors"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "prefix", "phrase"),
    [
        (("--kind", "pca-coherent", "--rank", "2"), "dplr: error:", "got no --support"),
        (
            ("--rank", "2", "--top", "1"),
            "dplr: error:",
            "--rank, --top apply only to --kind pca-coherent",
        ),
        ((*PCA, "--top", "80", "--bottom", "80"), "dplr: error:", "bottom must be in"),
        (
            ("--kind", "pca-coherent", "--rank", "2", "--support", "100", *SPECTRUM),
            "dplr: error:",
            "support must be a power of two",
        ),
        (
            ("--kind", "pca-coherent", "--rank", "2", "--support", "64", *SPECTRUM),
            "dplr: error:",
            "lower top to <=",
        ),
    ],
    ids=["missing", "lowrank-with-pca-options", "no-gap", "support", "row-norm"],
)
def test_generate_pca_coherent_refuses_bad_parameters(
    tmp_path: Path, args: tuple[str, ...], prefix: str, phrase: str
) -> None:
    out = tmp_path / "bad.zarr"
    proc = run_dplr(
        "generate", out, "--rows", ROWS, "--cols", COLS, *(str(a) for a in args)
    )
    line = assert_one_line_error(proc, 2, prefix)
    assert phrase in line
    assert_nothing_at(out)
