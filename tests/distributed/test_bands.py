"""About one task per chunk: a pass task reads a row band of several
chunks and returns one summed partial; the trees scale with bands, not chunks.

Banding changes only the order in which the per-chunk contributions are summed,
so a banded release equals the one-chunk-per-task release at round-off, and the
graph of a pass has at most 1.2 tasks per input chunk (the reads included).
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from dist_util import rel_diff, seeded_matrix, write_matrix

import pipeline.execution.pca as pca_mod
import pipeline.execution.source as source_mod
from pipeline.api import factorize, pca

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 30, 3
CHUNK_ROWS = 10  # 40 row chunks, all in one band by default
N_CHUNKS = M // CHUNK_ROWS
SEED, NOISE_SEED = 20240611, 7
PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE_SEED}
# as tests/distributed/test_chunking_invariance.py: two blockings differ in the
# summation order of the partial sketches only (n_blocks * 2.2e-16 relative),
# amplified by the QR/core solve and 1/gap of the truncation; measured there at
# <= 7e-14, while a chunk-dependent operator or noise moves the release at O(1)
RTOL_CHUNKING = 1e-10
# the target: graph tasks per input chunk of one pass
MAX_TASKS_PER_CHUNK = 1.2


@pytest.fixture
def data(tmp_path: Path) -> tuple[np.ndarray, str]:
    A = seeded_matrix(5, M, N)
    return A, write_matrix(tmp_path / "a.zarr", A, (CHUNK_ROWS, N))


def _factorize(source, tmp: Path, name: str, algorithm: str):
    return factorize(source, RANK, **PRIVACY, seed=SEED, out=tmp / name, algorithm=algorithm,
                     ledger=tmp / f"{name}.ledger.json", budget=(10.0, 1e-4))  # fmt: skip


@pytest.mark.parametrize("algorithm", ["spectral", "two-pass"])
@pytest.mark.parametrize("kind", ["zarr", "dask"])
def test_banded_factorize_equals_one_chunk_per_task(
    client, data, tmp_path: Path, monkeypatch, kind, algorithm
) -> None:
    A, path = data
    source = path if kind == "zarr" else da.from_array(A, chunks=(CHUNK_ROWS, N))
    banded = _factorize(source, tmp_path, "banded.zarr", algorithm)
    with monkeypatch.context() as mp:
        mp.setattr(source_mod, "BAND_BYTES", 1)  # the old graph: one task per chunk
        plain = _factorize(source, tmp_path, "plain.zarr", algorithm)
    np.testing.assert_allclose(banded.S, plain.S, rtol=RTOL_CHUNKING)
    got = (np.asarray(banded.U) * banded.S) @ np.asarray(banded.V).T
    want = (np.asarray(plain.U) * plain.S) @ np.asarray(plain.V).T
    assert rel_diff(got, want) < RTOL_CHUNKING
    # tasks per input chunk of one pass (the report counts every pass of the job);
    # a dask input adds its own read per chunk and pass
    passes = banded.report["n_passes"]
    reads = 0 if kind == "zarr" else N_CHUNKS * passes
    per_chunk = (banded.report["cluster"]["n_graph_tasks_pass"] + reads) / N_CHUNKS / passes
    old = (plain.report["cluster"]["n_graph_tasks_pass"] + reads) / N_CHUNKS / passes
    assert per_chunk <= MAX_TASKS_PER_CHUNK
    # negative control: one pass task per chunk, plus its tree entries (and, for a
    # dask input, its read): the count would show it
    assert old > per_chunk
    if algorithm == "two-pass":
        return  # its first pass has no tall Y: per chunk, one task and its tree share
    assert old > 1 + 1 / source_mod.SPLIT_EVERY
    if kind == "dask":
        assert old > MAX_TASKS_PER_CHUNK
    else:  # the pass tasks write Y to the scratch themselves: no task per Y block
        assert old <= MAX_TASKS_PER_CHUNK


def test_banded_pca_pass_equals_one_chunk_per_task(client, data, monkeypatch) -> None:
    A, _ = data
    source = da.from_array(A, chunks=(CHUNK_ROWS, N))
    kw = {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE_SEED,
          "method": "analyze-gauss"}  # one pass  # fmt: skip
    banded = pca(source, RANK, **kw)
    with monkeypatch.context() as mp:
        mp.setattr(pca_mod, "BAND_BYTES", 1)
        plain = pca(source, RANK, **kw)
    assert banded.report["cluster"]["n_row_bands"] == 1
    assert plain.report["cluster"]["n_row_bands"] == N_CHUNKS
    scale = float(np.abs(plain.eigenvalues).max())
    np.testing.assert_allclose(banded.eigenvalues, plain.eigenvalues, rtol=RTOL_CHUNKING,
                               atol=RTOL_CHUNKING * scale)  # fmt: skip
    per_chunk = (banded.report["cluster"]["n_graph_tasks"] + N_CHUNKS) / N_CHUNKS
    assert per_chunk <= MAX_TASKS_PER_CHUNK
    assert (plain.report["cluster"]["n_graph_tasks"] + N_CHUNKS) / N_CHUNKS > 2


@pytest.mark.parametrize("kind", ["zarr", "dask"])
def test_nan_in_a_band_is_a_zero_row(client, tmp_path: Path, kind) -> None:
    """docs/privacy.md, "Non-finite values": a row holding NaN inside a band of
    several chunks is a zero row (rows without a unit in a non-private run); the
    same bytes reach the kernels as with the row zeroed, so the releases are
    equal bit for bit."""
    A = seeded_matrix(5, M, N)
    Z = A.copy()
    Z[7 * CHUNK_ROWS + 3] = 0.0
    A[7 * CHUNK_ROWS + 3, 4] = np.nan  # chunk (7, 0), inside the one band
    got = []
    for name, matrix in (("nan", A), ("zeroed", Z)):
        source = (
            write_matrix(tmp_path / f"{name}.zarr", matrix, (CHUNK_ROWS, N))
            if kind == "zarr"
            else da.from_array(matrix, chunks=(CHUNK_ROWS, N))
        )
        got.append(factorize(source, RANK, private=False, seed=SEED))
    for x, y in ((got[0].U, got[1].U), (got[0].S, got[1].S), (got[0].V, got[1].V)):
        assert np.isfinite(np.asarray(x)).all()
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
