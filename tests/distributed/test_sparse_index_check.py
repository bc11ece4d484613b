"""A job's CSR store has its column indices checked by the workers, before any pass.

The check reads every column index (O(nnz)); the client of a job checks the
metadata and ``indptr`` and leaves ``indices`` to the cluster's workers, one task
per band in parallel (:func:`pipeline.execution.source.check_indices_on_workers`).
A malformed band is refused in one line before any value is read or anything is
charged, and a reader whose indices were not checked reads no band, so an index
out of range never reaches a compiled kernel (which does not check its bounds).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from distributed import Client
from test_sparse_cache import DataReads

import pipeline.io.csr
import pipeline.io.inputs
from pipeline.accounting.ledger import Ledger
from pipeline.api import factorize, pca
from pipeline.errors import StoreLayoutError
from pipeline.io.csr import CsrReader, open_csr, write_csr

pytestmark = pytest.mark.distributed

M, N, RANK = 300, 40, 3
BAND_ROWS = 37
PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": 7}


def _matrix(seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    A = np.where(rng.random((M, N)) < 0.15, rng.standard_normal((M, N)), 0.0)
    return sp.csr_matrix(A)


@pytest.fixture
def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several bands, and the check of these small stores left to the workers
    (a store below DEFER_INDICES_FROM entries is checked by the client)."""
    monkeypatch.setattr(pipeline.io.inputs, "CSR_BAND_CELLS", BAND_ROWS * N)
    monkeypatch.setattr(pipeline.io.csr, "DEFER_INDICES_FROM", 0)


def _client_index_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the column-index reads of this (the client's) process."""
    reads: list[int] = []
    real = CsrReader.read_indices

    def counted(self: CsrReader, p0: int, p1: int) -> Any:
        reads.append(p1 - p0)
        return real(self, p0, p1)

    monkeypatch.setattr(CsrReader, "read_indices", counted)
    return reads


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("small_bands")
def test_the_workers_check_the_indices_and_the_client_reads_none(
    client: Client, tmp_path: Path, global_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "A.zarr"
    X = _matrix(global_seed)
    write_csr(path, X)
    reads = _client_index_reads(monkeypatch)
    kw = {**PRIVACY, "budget": (100.0, 1e-3), "ledger": tmp_path / "l.json"}
    f = factorize(path, RANK, algorithm="two-pass", seed=3, **kw)
    p = pca(path, RANK, method="analyze-gauss", **kw)
    assert reads == []
    # the same release as from the matrix in memory (no store, no check)
    mem = factorize(X, RANK, algorithm="two-pass", seed=3, **kw)
    np.testing.assert_allclose(f.S, mem.S, rtol=1e-10)
    assert p.components.shape == (N, RANK)
    # negative control: a store opened with the check reads every index here
    open_csr(path)
    assert sum(reads) == X.nnz


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("small_bands")
@pytest.mark.parametrize(
    ("fault", "phrase"),
    [("unsorted", "sorted and unique"), ("out of range", "must be in [0, shape[1])")],
)
def test_a_bad_band_is_refused_before_any_value_is_read(
    client: Client, tmp_path: Path, global_seed: int, fault: str, phrase: str
) -> None:
    """One bad row in the last band: the other bands pass their check."""
    X = _matrix(global_seed)
    row = M - 2
    a, b = X.indptr[row], X.indptr[row + 1]
    assert b - a >= 2
    if fault == "unsorted":
        X.indices[a : a + 2] = X.indices[a : a + 2][::-1].copy()
    else:
        X.indices[b - 1] = N + 3
    path = tmp_path / "bad.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=3)
    group.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                        "shape": [M, N]})  # fmt: skip
    for name in ("indptr", "indices", "data"):
        group.create_array(name, data=getattr(X, name), chunks=(97,))
    marks = tmp_path / "marks"
    marks.mkdir()
    ledger = tmp_path / "l.json"
    Ledger.create(ledger, dataset="d", epsilon=10.0, delta=1e-4)
    before = json.loads(ledger.read_text())
    kw = {**PRIVACY, "ledger": ledger}
    for run in (
        lambda g: factorize(g, RANK, algorithm="two-pass", seed=3, **kw),
        lambda g: pca(g, RANK, method="analyze-gauss", **kw),
    ):
        opened = zarr.open_group(store=DataReads(path, marks=str(marks)), mode="r")
        with pytest.raises(StoreLayoutError, match=re.escape(phrase)) as info:
            run(opened)
        assert "\n" not in str(info.value)
        assert os.listdir(marks) == []  # no value read
        assert json.loads(ledger.read_text()) == before  # nothing charged


def test_a_reader_whose_indices_were_not_checked_reads_no_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "A.zarr"
    write_csr(path, _matrix(1))
    # a small store's indices are checked at once: the round trip would cost more
    assert open_csr(path, check_indices=False).indices_checked
    monkeypatch.setattr(pipeline.io.csr, "DEFER_INDICES_FROM", 0)
    reader = open_csr(path, check_indices=False)
    with pytest.raises(
        StoreLayoutError, match="before its column indices were checked"
    ):
        reader.band(0, 5)
    assert reader.index_problem(0, M) is None
    reader.indices_checked = True  # what the workers' check does once it passed
    assert reader.band(0, 5).shape == (5, N)
    assert open_csr(path).band(0, 5).shape == (5, N)  # negative control: checked
