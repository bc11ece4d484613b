"""A sparse input gives the release of the same matrix stored dense (docs/sparse.md).

On one real LocalCluster with two worker processes, the same matrix is stored
dense (a Zarr array) and sparse (a CSR group in AnnData's layout whose arrays are
chunked in 7 entries, read in row bands of 37 rows: band boundaries split
``indptr``, ``indices`` and ``data`` chunks anywhere), and released with the same
sketch and noise seeds by every algorithm: factorize two-pass, Spectral-LRF,
Low-Space-LRF (units row, column and entry), PCA power, Analyze Gauss and the
private selection. In-memory ``scipy.sparse`` matrices and arrays (CSR, CSC,
COO) and dask arrays of sparse chunks give the in-memory dense release.

Tolerance: a sparse and a dense pass sum the same terms in other orders (the
chunking-invariance argument of tests/distributed/test_chunking_invariance.py:
relative error ~ n_terms * 2.2e-16, amplified by the conditioning of the
post-processing), so the releases agree to rtol 1e-10 (RTOL_CHUNKING there), while
another noise seed moves them at O(1e-2) (negative control below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from dist_util import low_rank_product, rel_diff, write_matrix
from distributed import Client

import pipeline.execution.pca
import pipeline.io.inputs
from pipeline.api import factorize, pca
from pipeline.errors import InvalidParameterError
from pipeline.estimators import DPPCA, DPLowRank
from pipeline.io.csr import write_csr

pytestmark = pytest.mark.distributed

M, N, RANK = 300, 40, 4
SKETCH_SEED, NOISE_SEED = 20240611, 7
PRIVACY = {"epsilon": 1.0, "delta": 1e-6}
BUDGET = (100.0, 1e-3)
#: chunking-invariance bound (module docstring)
RTOL = 1e-10
#: rows per band of the CSR store: not a divisor of M, nor aligned with anything
BAND_ROWS = 37
#: entries per chunk of the CSR store's arrays (write_csr chunk_nnz)
CHUNK_NNZ = 7


def _sparse_matrix(seed: int) -> np.ndarray:
    """About 15% non-zeros, some empty rows and columns, row norms in ~[0, 2]:
    clipping at C = 1 is active for some rows and not for others."""
    rng = np.random.default_rng(seed)
    mask = rng.random((M, N)) < 0.15
    mask[rng.choice(M, 20, replace=False)] = False
    mask[:, rng.choice(N, 3, replace=False)] = False
    A = np.where(mask, rng.standard_normal((M, N)), 0.0) / np.sqrt(0.15 * N)
    return A * rng.uniform(0.2, 2.0, size=(M, 1))


def _assert_close(actual: Any, desired: Any, what: str) -> None:
    a, d = np.asarray(actual), np.asarray(desired)
    np.testing.assert_allclose(
        a, d, rtol=RTOL, atol=RTOL * float(np.abs(d).max()), err_msg=what
    )


@pytest.fixture
def stores(tmp_path: Path, global_seed: int) -> tuple[np.ndarray, str, str]:
    A = _sparse_matrix(global_seed)
    dense = write_matrix(tmp_path / "dense.zarr", A, (64, N))
    sparse = tmp_path / "sparse.zarr"
    write_csr(sparse, sp.csr_matrix(A), chunk_nnz=CHUNK_NNZ)
    return A, dense, str(sparse)


@pytest.fixture
def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """CSR bands of BAND_ROWS rows (public shape only) and one per PCA task."""
    monkeypatch.setattr(pipeline.io.inputs, "CSR_BAND_CELLS", BAND_ROWS * N)
    monkeypatch.setattr(pipeline.execution.pca, "BAND_BYTES", 1)


FACTORIZE_CASES = [
    ("two-pass", "row"),
    ("spectral", "row"),
    ("low-space", "row"),
    ("spectral", "column"),
    ("low-space", "entry"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("algorithm", "unit"), FACTORIZE_CASES)
def test_factorize_sparse_store_equals_dense_store(
    client: Client,
    stores: tuple[np.ndarray, str, str],
    small_bands: None,
    tmp_path: Path,
    algorithm: str,
    unit: str,
) -> None:
    _, dense, sparse = stores
    kw = {
        **PRIVACY, "algorithm": algorithm, "unit": unit, "seed": SKETCH_SEED,
        "insecure_noise_seed": NOISE_SEED, "budget": BUDGET,
    }  # fmt: skip
    ref = factorize(dense, RANK, **kw)
    rel = factorize(sparse, RANK, **kw)
    assert rel.report["cluster"]["kind"] == "active"
    assert rel.report["input"]["n_chunks"] == [-(-M // BAND_ROWS), 1]
    _assert_close(rel.S, ref.S, "S")
    _assert_close(
        low_rank_product(np.asarray(rel.U), rel.S, np.asarray(rel.V)),
        low_rank_product(np.asarray(ref.U), ref.S, np.asarray(ref.V)),
        "U S V^T",
    )


PCA_CASES = {
    "power": {"method": "power", "iterations": 3, "clip_radius": 0.05},
    "analyze-gauss": {"method": "analyze-gauss"},
    "select": {"select": True},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(PCA_CASES))
def test_pca_sparse_store_equals_dense_store(
    client: Client,
    stores: tuple[np.ndarray, str, str],
    small_bands: None,
    case: str,
) -> None:
    _, dense, sparse = stores
    kw = {**PRIVACY, **PCA_CASES[case], "insecure_noise_seed": NOISE_SEED}
    ref = pca(dense, RANK, **kw, budget=BUDGET)
    rel = pca(sparse, RANK, **kw, budget=BUDGET)
    assert rel.report["cluster"]["n_row_bands"] == -(-M // BAND_ROWS)
    assert rel.report["releases"] == ref.report["releases"]
    _assert_close(rel.components, ref.components, "components")
    _assert_close(rel.eigenvalues, ref.eigenvalues, "eigenvalues")


def _in_memory_forms(A: np.ndarray) -> dict[str, Any]:
    return {
        "csr_matrix": sp.csr_matrix(A),
        "csc_matrix": sp.csc_matrix(A),
        "coo_matrix": sp.coo_matrix(A),
        "csr_array": sp.csr_array(A),
        "coo_array": sp.coo_array(A),
    }


@pytest.mark.timeout(120)
def test_in_memory_sparse_equals_in_memory_dense(global_seed: int) -> None:
    A = _sparse_matrix(global_seed)
    for algorithm in ("two-pass", "spectral"):
        kw = {**PRIVACY, "algorithm": algorithm, "seed": SKETCH_SEED,
              "insecure_noise_seed": NOISE_SEED}  # fmt: skip
        ref = factorize(A, RANK, **kw)
        for name, X in _in_memory_forms(A).items():
            rel = factorize(X, RANK, **kw)
            assert "cluster" not in rel.report or rel.report["cluster"] is None
            _assert_close(rel.S, ref.S, f"{algorithm} {name} S")
            _assert_close(
                low_rank_product(rel.U, rel.S, rel.V),
                low_rank_product(ref.U, ref.S, ref.V),
                f"{algorithm} {name}",
            )
    kw = {**PRIVACY, "method": "power", "iterations": 2, "clip_radius": 0.05,
          "insecure_noise_seed": NOISE_SEED}  # fmt: skip
    ref_p = pca(A, RANK, **kw)
    rel_p = pca(sp.csc_matrix(A), RANK, **kw)
    _assert_close(rel_p.components, ref_p.components, "pca csc components")
    # negative control: another noise seed is far outside the bound
    other = factorize(A, RANK, **{**PRIVACY, "algorithm": "spectral",
                                  "seed": SKETCH_SEED,
                                  "insecure_noise_seed": NOISE_SEED + 1})  # fmt: skip
    ref = factorize(A, RANK, **{**PRIVACY, "algorithm": "spectral",
                                "seed": SKETCH_SEED, "insecure_noise_seed": NOISE_SEED})  # fmt: skip
    assert rel_diff(other.S, ref.S) > 1e3 * RTOL


@pytest.mark.timeout(240)
def test_dask_array_of_sparse_chunks_equals_dense(
    client: Client, global_seed: int
) -> None:
    A = _sparse_matrix(global_seed)
    # row chunks of 37 (several per band) and column chunks of 16 (a norm pre-pass)
    X = da.from_array(A, chunks=(BAND_ROWS, 16)).map_blocks(
        sp.csr_matrix, meta=sp.csr_matrix((0, 0))
    )
    for unit in ("row", "column"):
        kw = {**PRIVACY, "algorithm": "spectral", "unit": unit, "seed": SKETCH_SEED,
              "insecure_noise_seed": NOISE_SEED}  # fmt: skip
        ref = factorize(da.from_array(A, chunks=(BAND_ROWS, 16)), RANK, **kw)
        rel = factorize(X, RANK, **kw)
        _assert_close(rel.S, ref.S, f"{unit} S")
    kw = {**PRIVACY, "method": "power", "iterations": 2, "clip_radius": 0.05,
          "insecure_noise_seed": NOISE_SEED}  # fmt: skip
    ref_p = pca(A, RANK, **kw)
    rel_p = pca(X, RANK, **kw)
    _assert_close(rel_p.components, ref_p.components, "pca components")


@pytest.mark.timeout(120)
def test_estimators_take_scipy_sparse(global_seed: int) -> None:
    A = _sparse_matrix(global_seed)
    X = sp.csr_matrix(A)
    kw = {"epsilon": 1.0, "random_state": 3, "insecure_noise": True}
    dense = DPLowRank(RANK, algorithm="spectral", **kw).fit(A)
    sparse = DPLowRank(RANK, algorithm="spectral", **kw).fit(sp.coo_matrix(A))
    _assert_close(sparse.S_, dense.S_, "DPLowRank S_")
    _assert_close(sparse.transform(X), dense.transform(A), "DPLowRank transform")
    p_dense = DPPCA(RANK, method="analyze-gauss", **kw).fit(A)
    p_sparse = DPPCA(RANK, method="analyze-gauss", **kw).fit(sp.csc_array(A))
    _assert_close(p_sparse.components_, p_dense.components_, "DPPCA components_")
    _assert_close(p_sparse.transform(X), p_dense.transform(A), "DPPCA transform")
    # a centred fit would densify: refused before anything is read or charged
    with pytest.raises(InvalidParameterError, match="centre=True takes a dense input"):
        DPPCA(RANK, centre=True, **kw).fit(X)


@pytest.mark.timeout(120)
def test_a_store_is_validated_once_per_fit(
    client: Client,
    stores: tuple[np.ndarray, str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The streamed check reads all of ``indptr`` and ``indices``: once per job.
    A fit without ``n_components`` needs only the shape first (metadata)."""
    _, _, sparse = stores
    checked: list[bool] = []
    real = pipeline.io.inputs.open_csr

    def counting(source: Any, *, validate: bool = True, **kw: Any) -> Any:
        checked.append(validate)
        return real(source, validate=validate, **kw)

    monkeypatch.setattr(pipeline.io.inputs, "open_csr", counting)
    kw = {**PRIVACY, "method": "analyze-gauss", "budget": BUDGET,
          "ledger": tmp_path / "ledger.json"}  # fmt: skip
    DPPCA(None, **kw).fit(sparse)
    assert checked.count(True) == 1, checked
    checked.clear()
    DPPCA(2, **kw).fit(sparse)  # negative control: the fit itself checks the store
    assert checked == [True]
