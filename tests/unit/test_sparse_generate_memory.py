"""``dplr generate --sparse`` writes out of core: one diagonal block's factors
in memory at a time, never all of them (docs/sparse.md)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from pipeline.io.csr import open_csr
from pipeline.io.synthetic import generate_sparse_store


def test_sparse_generation_holds_one_block_at_a_time(tmp_path: Path) -> None:
    # 16 blocks of 3125 rows x 50 columns, 50 singular values each (800 in all):
    # every block's U_j together is m x 50 float64 = 20 MB, one block 1.25 MB
    m, n, g, rank = 50_000, 800, 16, 800
    all_factors = m * (rank // g) * 8
    tracemalloc.start()
    try:
        meta = generate_sparse_store(
            tmp_path / "s.zarr", m, n, density=1 / g, max_rank=rank,
            chunks=(1000, -1), seed=3,
        )  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta["blocks"] == g
    assert meta["rank"] == rank
    assert open_csr(tmp_path / "s.zarr").nnz == m * n // g  # the whole matrix
    # holding every block's factor needs all_factors bytes; one block at a time
    # (plus a band of 1000 rows and the writer's chunk buffers) stays far below
    assert peak < all_factors / 2, (peak, all_factors)


def test_sparse_generation_is_deterministic(tmp_path: Path) -> None:
    """Two runs with one seed write the same bytes (the blocks are regenerated
    from their seeds, not kept)."""
    kw = {"density": 0.25, "max_rank": 12, "chunks": (7, -1), "seed": 5}
    generate_sparse_store(tmp_path / "a.zarr", 60, 20, **kw)  # type: ignore[arg-type]
    generate_sparse_store(tmp_path / "b.zarr", 60, 20, **kw)  # type: ignore[arg-type]
    a, b = open_csr(tmp_path / "a.zarr"), open_csr(tmp_path / "b.zarr")
    xa, xb = a.band(0, 60), b.band(0, 60)
    assert np.array_equal(xa.indptr, xb.indptr)
    assert np.array_equal(xa.indices, xb.indices)
    assert np.array_equal(xa.data, xb.data)
