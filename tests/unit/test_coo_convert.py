"""The COO -> CSR converter reads and writes in bounded pieces (pipeline/io/coo.py).

Its memory bound is ``band_entries`` triples (plus O(m) row counts): the files are
read ``band_entries`` rows at a time (never whole), each band written holds at
most ``band_entries`` triples unless it is one long row, and the peak of the
numpy allocations (traced by tracemalloc) stays a small multiple of the band,
far below the size of the triples themselves, which the negative control (one
band as large as the input) exceeds.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from pipeline.io import coo
from pipeline.io.csr import open_csr

M, N = 20_000, 1_000
COUNT = 400_000
#: 24 bytes per triple (i, j, s): the size of the input held at once
INPUT_BYTES = 24 * COUNT


def _file(tmp_path: Path, rng: np.random.Generator, row_group: int) -> Path:
    path = tmp_path / "batch.parquet"
    cols = {
        "entity": rng.integers(0, 10, COUNT),
        "i": rng.integers(0, M, COUNT),
        "j": rng.integers(0, N, COUNT),
        "s": rng.standard_normal(COUNT),
    }
    pq.write_table(pa.table(cols), path, row_group_size=row_group)
    return path


def test_reads_and_writes_in_bands_of_the_budget(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 4096
    path = _file(tmp_path, rng, row_group=budget)
    pieces: list[int] = []
    bands: list[tuple[int, int]] = []
    real_iter = pq.ParquetFile.iter_batches
    real_write = coo.write_csr

    def iter_batches(self: Any, *args: Any, **kw: Any) -> Any:
        for piece in real_iter(self, *args, **kw):
            pieces.append(piece.num_rows)
            yield piece

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a whole file was read")

    def write_csr(path: Any, gen: Any, **kw: Any) -> Any:
        def seen() -> Any:
            for band in gen:
                bands.append((band.shape[0], band.nnz))
                yield band

        return real_write(path, seen(), **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    monkeypatch.setattr(pq.ParquetFile, "read", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)
    monkeypatch.setattr(coo, "write_csr", write_csr)
    out = tmp_path / "m.zarr"
    coo.coo_to_csr([path], out, shape=(M, N), band_entries=budget, chunk_nnz=budget)
    # two passes, each in pieces of at most the budget
    assert sum(pieces) == 2 * COUNT
    assert max(pieces) <= budget
    # many bands, each within the budget (stored entries <= triples)
    assert len(bands) >= COUNT // budget
    assert all(nnz <= budget for _, nnz in bands)
    assert sum(rows for rows, _ in bands) == M
    monkeypatch.undo()
    t = pq.read_table(path)
    want = sp.coo_matrix(
        (t["s"].to_numpy(), (t["i"].to_numpy(), t["j"].to_numpy())), shape=(M, N)
    ).tocsr()
    got = open_csr(out).band(0, M)
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)  # same sums, same order


def _peak(tmp_path: Path, path: Path, budget: int) -> int:
    tracemalloc.start()
    try:
        coo.coo_to_csr(
            [path], tmp_path / f"m{budget}.zarr", shape=(M, N), band_entries=budget,
            chunk_nnz=budget,
        )  # fmt: skip
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_follows_the_band_not_the_input(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    budget = 8192
    path = _file(tmp_path, rng, row_group=budget)
    small = _peak(tmp_path, path, budget)
    # per piece and per band: ~15 arrays of 8 bytes per triple (columns, band ids,
    # sort order, spilled records, the band's COO and CSR) = 1 MB, plus the row
    # counts (3 arrays of 8 M bytes) and the store's chunk buffers: under 4 MB,
    # against 9.6 MB for the triples alone
    assert small < 4 * 2**20
    assert small < INPUT_BYTES / 2
    # negative control: one piece and one band as large as the input
    large = _peak(tmp_path, path, 2**20)
    assert large > INPUT_BYTES
