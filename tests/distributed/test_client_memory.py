"""Nothing of size n_rows on the client (client memory).

* ``factorize(out=...)`` returns U and V backed by the published store, read only
  when asked, and the ``dplr factorize`` command never reads U back;
* the TSQR's per-block R factors are reduced in a tree on the workers when there
  are more than ``TSQR_GATHER_BLOCKS`` row blocks: only the final R (t x t)
  reaches the client, and the release equals the gathered path's at round-off.
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from dist_util import rel_diff, seeded_matrix, write_matrix

import pipeline.algorithms.lrf.kernels as lrf_kernels
import pipeline.execution.source as source_mod
from pipeline import cli
from pipeline.api import factorize
from pipeline.io import read_release
from pipeline.io.release import StoredArray

pytestmark = pytest.mark.distributed

M, N, RANK = 600, 24, 3
SEED, NOISE_SEED = 11, 5
PRIVACY = {"epsilon": 1.0, "delta": 1e-6}
BUDGET = (10.0, 1e-4)
# The tree and the one-shot QR of the stacked R_b factor the same matrix; they
# differ by round-off only: ||dR|| <= c t eps ||R|| per level (Higham, Accuracy
# and Stability, Thm 19.4), a few levels here -> 1e-12 relative is ~100x margin.
RTOL_TREE = 1e-12


def _gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u), u = eps / 2 (unit roundoff of float64)."""
    u = np.finfo(np.float64).eps / 2
    return n * u / (1 - n * u)


@pytest.fixture
def store(tmp_path: Path) -> str:
    # 30-row chunks: 20 row blocks, enough for a tree of fan-in 8 once
    # TSQR_GATHER_BLOCKS is lowered below 20
    return write_matrix(tmp_path / "a.zarr", seeded_matrix(3, M, N), (30, N))


def _reads_of_u(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every read of an array named U made in this (the client) process."""
    seen: list[str] = []
    original = zarr.Array.__getitem__

    def spy(self: zarr.Array, key: object) -> object:
        if self.basename == "U":
            seen.append(self.path)
        return original(self, key)

    monkeypatch.setattr(zarr.Array, "__getitem__", spy)
    return seen


def test_factorize_out_returns_store_backed_u(client, store, tmp_path: Path) -> None:
    out = tmp_path / "r.zarr"
    f = factorize(store, RANK, **PRIVACY, seed=SEED, insecure_noise_seed=NOISE_SEED,
                  out=out, budget=BUDGET)  # fmt: skip
    assert isinstance(f.U, StoredArray)
    assert isinstance(f.V, StoredArray)
    assert f.U.shape == (M, RANK)
    assert f.U.dtype == np.float64
    loaded = read_release(out)  # the default still loads (negative control)
    assert isinstance(loaded.U, np.ndarray)
    np.testing.assert_array_equal(np.asarray(f.U), loaded.U)
    np.testing.assert_array_equal(f.U[5:9, 1], loaded.U[5:9, 1])
    # numpy functions and operators see the loaded values. The product of two
    # separate reads goes through BLAS by another path than a loaded array times
    # its own transpose (gemm and syrk, which numpy picks for the same buffer; the
    # kernels OpenBLAS selects differ in blocking and FMA use), so the two agree to
    # the rounding of float64 dot products of length M, not bit for bit:
    # |fl(U^T U) - U^T U| <= gamma_M |U|^T |U| elementwise for any summation order
    # (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.13).
    got, want = f.U.T @ f.U, loaded.U.T @ loaded.U
    bound = 2 * _gamma(M) * (np.abs(loaded.U).T @ np.abs(loaded.U))
    assert np.all(np.abs(got - want) <= bound)
    # negative control: one entry of U off by 1e-9 moves the product far outside it
    other = loaded.U.copy()
    other[7, 1] += 1e-9
    assert not np.all(np.abs(f.U.T @ other - want) <= bound)
    # one function on the same bytes in the same layout: the same computation
    assert np.linalg.norm(f.U) == np.linalg.norm(loaded.U)


def test_cli_never_reads_u(client, store, tmp_path: Path, monkeypatch) -> None:
    seen = _reads_of_u(monkeypatch)
    out = tmp_path / "cli.zarr"
    rc = cli.main([
        "factorize", store, "--rank", str(RANK), "--epsilon", "1", "--delta", "1e-6",
        "--out", str(out), "--budget-epsilon", "10", "--budget-delta", "1e-4",
        "--scheduler", client.scheduler.address, "--quiet",
    ])  # fmt: skip
    assert rc == 0
    assert seen == []
    # the spy sees a read of U when there is one (negative control)
    read_release(out)
    assert seen == ["U"]


def _gathered_shapes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    original = source_mod.gather_blocks

    def spy(client, arrays, **kw):
        values = original(client, arrays, **kw)
        shapes.extend(v.shape for v in values)
        return values

    monkeypatch.setattr(source_mod, "gather_blocks", spy)
    return shapes


@pytest.mark.parametrize("threshold", [1000, 4])
def test_tsqr_r_factors_reduced_on_workers(client, monkeypatch, threshold) -> None:
    monkeypatch.setattr(source_mod, "TSQR_GATHER_BLOCKS", threshold)
    shapes = _gathered_shapes(monkeypatch)
    t = 6
    Y = np.random.default_rng(0).standard_normal((M, t))
    chunks = ((29,) * 20 + (M - 29 * 20,), (t,))  # 21 blocks, the last shorter than t
    Yd = da.from_array(Y, chunks=chunks)
    src = source_mod.DaskSource(Yd, client)
    Q, R = src.tall_qr(Yd, with_r=True)
    Qd = np.asarray(src.tall_matmul(Q, np.eye(t)).compute())
    # an orthonormal Q and Y = Q R, whichever path (Higham Thm 19.4, as above)
    assert np.abs(Qd.T @ Qd - np.eye(t)).max() < RTOL_TREE
    assert rel_diff(Qd @ R, Y) < RTOL_TREE
    tallest = max(s[0] for s in shapes)
    if threshold < 21:  # tree: only the final R (t x t) came to the client
        assert isinstance(Q.blocks, da.Array)
        assert tallest == t
    else:  # negative control: the gathered path brings the stacked R_b
        assert isinstance(Q.blocks, list)
        assert tallest > t


@pytest.mark.parametrize("private", [True, False])
def test_release_same_with_tree(client, store, tmp_path: Path, monkeypatch, private) -> None:
    def run(name: str):
        out = tmp_path / name
        if private:
            factorize(store, RANK, **PRIVACY, seed=SEED, insecure_noise_seed=NOISE_SEED,
                      out=out, ledger=tmp_path / f"{name}.ledger.json", budget=BUDGET)  # fmt: skip
        else:  # non-private: the pass begins the TSQR per block (finish_local_qr)
            factorize(store, RANK, private=False, seed=SEED, out=out)
        return read_release(out)

    monkeypatch.setattr(source_mod, "BAND_BYTES", 1)  # one chunk per band: 20 row blocks
    # a private release takes its basis from the noisy Y's Gram matrix: refused
    # here, so that the TSQR runs on the noisy Y
    monkeypatch.setattr(lrf_kernels, "GRAM_MIN_RATIO", np.inf)
    ref = run("gathered.zarr")
    monkeypatch.setattr(source_mod, "TSQR_GATHER_BLOCKS", 2)
    tree = run("tree.zarr")
    np.testing.assert_allclose(tree.S, ref.S, rtol=RTOL_TREE)
    got, want = (tree.U * tree.S) @ tree.V.T, (ref.U * ref.S) @ ref.V.T
    # round-off of the two QRs, amplified by 1/gap of the rank-k truncation
    assert rel_diff(got, want) < 1e-10
