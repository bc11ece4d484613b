"""PCA test data with controlled coherence and eigengap [spec power-pca, App. B].

The generator builds an exact SVD, so every fact it reports (spectrum, top
subspace, coherence, row norms) is checked against an independent dense SVD of
the matrix it returns. Tolerances: the matrix is formed in float64 from
orthonormal factors, so its singular values and singular subspaces agree with the
construction to a few ulps times ``sigma_1 / gap_k`` (here < 1e-12); 1e-10
leaves a wide margin.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import zarr

from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.io import generate_pca_store
from pipeline.linalg.metrics import sin_theta
from pipeline.linalg.synthetic import (
    CoherentMatrix,
    coherent_matrix,
    coherent_spectrum,
    walsh_columns,
)

N_ROWS, N_COLS = 1024, 16
TOP, BOTTOM = 40.0, 8.0
SUPPORTS = (1024, 256)  # perfectly incoherent, coherent
DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data"


def _make(rank: int, support: int, seed: int) -> CoherentMatrix:
    return coherent_matrix(
        N_ROWS, N_COLS, rank, support=support, top=TOP, bottom=BOTTOM, rng=seed
    )


@pytest.fixture(params=[(2, 1024), (2, 256), (3, 256), (1, 128)], ids=str)
def data(request: pytest.FixtureRequest, global_seed: int) -> CoherentMatrix:
    rank, support = request.param
    return _make(rank, support, global_seed)


def test_shapes_and_dtypes(data: CoherentMatrix) -> None:
    k = data.Vk.shape[1]
    assert data.A.shape == (N_ROWS, N_COLS)
    assert data.Uk.shape == (N_ROWS, k)
    assert data.Vk.shape == (N_COLS, k)
    assert data.singular_values.shape == (N_COLS,)
    for arr in (data.A, data.Uk, data.Vk, data.singular_values):
        assert arr.dtype == np.float64
        assert not arr.flags.writeable


def test_spectrum_is_exact(data: CoherentMatrix) -> None:
    k = data.Vk.shape[1]
    expected = np.sqrt(coherent_spectrum(N_COLS, k, top=TOP, bottom=BOTTOM))
    np.testing.assert_array_equal(data.singular_values, expected)
    assert np.all(np.diff(expected) <= 0)
    np.testing.assert_allclose(
        np.linalg.svd(data.A, compute_uv=False), expected, rtol=1e-10, atol=0
    )
    assert data.gap_k == TOP - BOTTOM
    assert data.kappa_k == pytest.approx(1 - BOTTOM / TOP, rel=1e-15)


def test_vk_is_the_top_right_singular_subspace(data: CoherentMatrix) -> None:
    k = data.Vk.shape[1]
    np.testing.assert_allclose(data.Vk.T @ data.Vk, np.eye(k), atol=1e-13)
    Vt = np.linalg.svd(data.A, full_matrices=False)[2]
    assert sin_theta(Vt[:k].T, data.Vk) < 1e-10
    assert sin_theta(data.Vk, Vt[:k].T) < 1e-10


def test_uk_is_the_top_left_singular_subspace(data: CoherentMatrix) -> None:
    k = data.Vk.shape[1]
    sigma_k = data.singular_values[:k]
    np.testing.assert_allclose(data.A @ data.Vk / sigma_k, data.Uk, atol=1e-12)
    np.testing.assert_allclose(data.Uk.T @ data.Uk, np.eye(k), atol=1e-13)


def test_coherence_is_exactly_one_over_sqrt_support(data: CoherentMatrix) -> None:
    m, k = data.support, data.Vk.shape[1]
    on_support = np.any(data.Uk != 0, axis=1)
    assert on_support.sum() == m
    # Walsh entries are +-1, so every non-zero entry is exactly +-1/sqrt(m)
    assert np.all(np.abs(data.Uk[on_support]) == 1.0 / math.sqrt(m))
    assert np.abs(data.Uk).max() == data.coherence == 1.0 / math.sqrt(m)
    row_norms = np.linalg.norm(data.Uk[on_support], axis=1)
    np.testing.assert_allclose(row_norms, math.sqrt(k / m), rtol=1e-15)
    assert data.row_coherence == math.sqrt(k / m)


def test_rows_have_norm_at_most_one(data: CoherentMatrix) -> None:
    norms = np.linalg.norm(data.A, axis=1)
    assert norms.max() <= 1.0
    assert data.max_row_norm == pytest.approx(norms.max(), rel=1e-14)


def test_same_seed_same_matrix_other_seed_other_matrix(global_seed: int) -> None:
    a = _make(2, 256, global_seed)
    b = coherent_matrix(
        N_ROWS,
        N_COLS,
        2,
        support=256,
        top=TOP,
        bottom=BOTTOM,
        rng=np.random.default_rng(global_seed),
    )
    np.testing.assert_array_equal(a.A, b.A)
    np.testing.assert_array_equal(a.Vk, b.Vk)
    c = _make(2, 256, global_seed + 1)
    assert not np.array_equal(a.A, c.A)


def test_walsh_columns_are_orthogonal() -> None:
    W = walsh_columns(64, np.arange(64))
    assert set(np.unique(W)) == {-1.0, 1.0}
    np.testing.assert_array_equal(W.T @ W, 64 * np.eye(64))


def test_head_energy_above_support_names_top_and_support() -> None:
    # (1.2 * 1 + 1) * top / support = 2.2 * 40 / 64 > 1
    with pytest.raises(
        InvalidParameterError, match=r"lower top to <= 29\.09.* or raise support"
    ):
        coherent_matrix(N_ROWS, N_COLS, 2, support=64, top=TOP, bottom=1.0, rng=0)


def test_tail_energy_above_one_names_bottom_with_an_exact_bound() -> None:
    with pytest.raises(InvalidParameterError, match="lower bottom to <= ") as info:
        coherent_matrix(N_ROWS, N_COLS, 2, support=N_ROWS, top=TOP, bottom=39.0, rng=7)
    bound = float(str(info.value).split("lower bottom to <= ")[1].split(" ")[0])
    assert 0 < bound < 39.0
    # the bound is exact for this rng: the draws do not depend on bottom
    ok = coherent_matrix(
        N_ROWS, N_COLS, 2, support=N_ROWS, top=TOP, bottom=0.999 * bound, rng=7
    )
    assert ok.max_row_norm <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"support": 100}, r"support must be a power of two.*support=100"),
        ({"support": 2048}, r"support must be in \[2, n_rows\]"),
        ({"rank": 16}, r"rank must be in \[1, min\(n_cols, support\) - 1\]"),
        ({"rank": 4, "support": 4}, r"rank must be in .* = \[1, 3\], got rank=4"),
        ({"bottom": TOP}, r"bottom must be in \[0, 40\), got bottom=40.0"),
        ({"bottom": -1.0}, r"bottom must be in \[0, 40\)"),
        ({"top": 0.0}, r"top must be in \(0, inf\)"),
        ({"head_ratio": 0.5}, r"head_ratio must be in \[1, inf\)"),
        ({"n_cols": N_ROWS + 1}, r"n_cols must be in \[2, n_rows\]"),
    ],
)
def test_invalid_parameters_are_named(kwargs: dict[str, float], match: str) -> None:
    args = {"n_cols": N_COLS, "rank": 2, "support": 256, "top": TOP, "bottom": BOTTOM}
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        coherent_matrix(N_ROWS, args.pop("n_cols"), args.pop("rank"), **args, rng=0)


def test_sin_theta_matches_principal_angles() -> None:
    rng = np.random.default_rng(0)
    X = np.linalg.qr(rng.standard_normal((20, 3)))[0]
    Y = np.linalg.qr(rng.standard_normal((20, 3)))[0]
    cosines = np.linalg.svd(X.T @ Y, compute_uv=False)
    assert sin_theta(X, Y) == pytest.approx(
        math.sqrt(1 - cosines.min() ** 2), rel=1e-12
    )
    # basis-independent, and zero on the same subspace
    R = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    assert sin_theta(X @ R, Y) == pytest.approx(sin_theta(X, Y), rel=1e-12)
    assert sin_theta(X @ R, X) < 1e-14


def test_pca_store_records_the_ground_truth(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "pca.zarr"
    meta = generate_pca_store(
        out, N_ROWS, N_COLS, 2, support=256, top=TOP, bottom=BOTTOM,
        chunks=(300, 8), dtype="float64", seed=5,
    )  # fmt: skip
    data = _make(2, 256, 5)
    z = zarr.open_array(store=out, mode="r")
    assert z.shape == (N_ROWS, N_COLS)
    assert z.chunks == (300, 8)
    assert z.dtype == np.float64
    np.testing.assert_array_equal(z[...], data.A)
    truth = z.attrs["dplr_synthetic"]
    assert truth == meta
    assert truth["kind"] == "pca-coherent"
    np.testing.assert_array_equal(
        np.array(truth["top_right_singular_vectors"]), data.Vk
    )
    np.testing.assert_array_equal(
        np.array(truth["singular_values"]), data.singular_values
    )
    assert truth["coherence"] == 1 / 16
    assert truth["gap_k"] == TOP - BOTTOM
    assert [p.name for p in tmp_path.iterdir()] == ["pca.zarr"]  # no temporary left
    with pytest.raises(StoreLayoutError, match="already exists"):
        generate_pca_store(out, N_ROWS, N_COLS, 2, support=256, top=TOP, bottom=BOTTOM)


def test_pca_store_refuses_a_matrix_too_large_for_memory(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(
        InvalidParameterError, match=r"n_rows \* n_cols must be <= 2\^26"
    ):
        generate_pca_store(
            tmp_path / "big.zarr", 2**21, 64, 2, support=2**21, top=1.0, bottom=0.5
        )
    assert list(tmp_path.iterdir()) == []


def test_committed_pca_sample_is_reproducible(tmp_path: pathlib.Path) -> None:
    """``data/pca_sample.zarr`` is what ``data/generate_sample.py`` writes."""
    committed = zarr.open_array(store=DATA_DIR / "pca_sample.zarr", mode="r")
    truth = committed.attrs["dplr_synthetic"]
    fresh = generate_pca_store(
        tmp_path / "again.zarr", *committed.shape, truth["rank"],
        support=truth["support"], top=truth["top"], bottom=truth["bottom"],
        head_ratio=truth["head_ratio"], chunks=committed.chunks,
        dtype=str(committed.dtype), seed=truth["seed"],
    )  # fmt: skip
    assert fresh == truth
    again = zarr.open_array(store=tmp_path / "again.zarr", mode="r")
    np.testing.assert_array_equal(again[...], committed[...])
    assert committed.shape == (2048, 16)
    assert np.linalg.norm(committed[...].astype(np.float64), axis=1).max() <= 1.0
