"""Chunking and worker-count invariance of a release (style B.3.5, B.10).

For fixed sketch and noise seeds, the release must not depend on how the Zarr
store is chunked (``allclose`` at round-off: only the summation order of the
per-block partials changes) nor, for one chunking, on how many workers run it
(bit for bit: the reduction trees have a fixed shape and BLAS is pinned to one
thread per worker).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dist_util import (
    low_rank_product,
    rel_diff,
    seeded_matrix,
    start_cluster,
    write_matrix,
)
from distributed import Client, LocalCluster

import pipeline.io.inputs
from pipeline.api import factorize
from pipeline.io import read_release

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
SKETCH_SEED, NOISE_SEED = 20240611, 7
PRIVACY = {"epsilon": 1.0, "delta": 1e-6}
BUDGET = (10.0, 1e-4)
# float64 round-off: two chunkings differ only in the order in which the per-block
# partial sketches are summed (relative error ~ n_blocks * 2.2e-16, style B.3.5),
# then amplified by the conditioning of the QR/core solve and by 1/gap of the rank-k
# truncation. Measured <= 7e-14 here (seeds 0, 1, 2, 42, both algorithms), so 1e-10
# leaves a wide margin, while real chunk-dependence (noise or operators drawn per
# chunk) shows up at O(1) (see the negative control below).
RTOL_CHUNKING = 1e-10

# name -> (store chunks, force the column-split layout, expected dask n_chunks, n_passes)
LAYOUTS = {
    # one chunk: rows are whole, clipped inside the single task
    "whole": ((M, N), False, [1, 1], 1),
    # full-width row bands: each row is clipped inside its band's task
    "row-bands": ((64, N), False, [7, 1], 1),
    # column-split blocks, but a full-width band is small (< ROW_BAND_LIMIT): the
    # input is read as row bands, so no norm pre-pass (pipeline/io/inputs.py)
    "blocks": ((100, 37), False, [4, 1], 1),
    # the same store with re-banding disabled: the store's (100, 37) chunks are kept
    # and row clipping needs the norm pre-pass -> 2 passes
    "blocks-prepass": ((100, 37), True, [4, 5], 2),
}


def _run(source, algorithm: str, tmp: Path, name: str, **kw):
    out = tmp / f"release-{name}.zarr"
    f = factorize(
        source,
        RANK,
        **PRIVACY,
        algorithm=algorithm,
        seed=SKETCH_SEED,
        insecure_noise_seed=NOISE_SEED,
        out=out,
        budget=BUDGET,
        **kw,
    )
    released = read_release(out)
    # what was returned is what was published
    np.testing.assert_array_equal(released.S, f.S)
    return released


@pytest.fixture
def stores(tmp_path: Path, global_seed: int) -> tuple[np.ndarray, dict[str, str]]:
    A = seeded_matrix(global_seed, M, N)
    paths = {}
    for chunks in {c for c, *_ in LAYOUTS.values()}:
        paths[chunks] = write_matrix(
            tmp_path / f"A-{chunks[0]}x{chunks[1]}.zarr", A, chunks
        )
    return A, paths


@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", ["spectral", "low-space"])
def test_same_release_for_every_chunking_and_in_memory(
    client: Client,
    stores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
) -> None:
    A, paths = stores
    reference = factorize(
        A,
        RANK,
        **PRIVACY,
        algorithm=algorithm,
        seed=SKETCH_SEED,
        insecure_noise_seed=NOISE_SEED,
    )
    assert reference.report["n_passes"] == 1
    # an insecure noise seed is stamped NOT PRIVATE
    assert reference.report["private"] is False
    ref_L = low_rank_product(reference.U, reference.S, reference.V)

    for name, (chunks, force_split, n_chunks, n_passes) in LAYOUTS.items():
        with monkeypatch.context() as mp:
            if force_split:
                mp.setattr(pipeline.io.inputs, "ROW_BAND_LIMIT", 0)
            rel = _run(paths[chunks], algorithm, tmp_path, name)
        rep = rel.report
        assert rep["input"]["store_chunks"] == list(chunks), name
        assert rep["input"]["n_chunks"] == n_chunks, name
        assert rep["n_passes"] == n_passes, name
        assert rep["cluster"]["kind"] == "active", name
        assert rep["cluster"]["n_workers"] == 2, name
        assert rel.U.shape == (M, RANK)
        assert rel.S.shape == (RANK,)
        assert rel.V.shape == (N, RANK)
        L = low_rank_product(rel.U, rel.S, rel.V)
        assert rel_diff(L, ref_L) < RTOL_CHUNKING, name
        np.testing.assert_allclose(
            rel.S, reference.S, rtol=RTOL_CHUNKING, atol=0.0, err_msg=name
        )


@pytest.mark.timeout(60)
def test_chunking_check_detects_a_different_noise_seed(
    client: Client, stores, tmp_path: Path
) -> None:
    """Negative control: the tolerance above is far below a genuine difference."""
    A, paths = stores
    a = _run(paths[(64, N)], "spectral", tmp_path, "a")
    b = factorize(
        A, RANK, **PRIVACY, seed=SKETCH_SEED, insecure_noise_seed=NOISE_SEED + 1
    )
    assert (
        rel_diff(low_rank_product(a.U, a.S, a.V), low_rank_product(b.U, b.S, b.V))
        > 1e-3
    )


@pytest.fixture(scope="module")
def one_worker_cluster() -> Iterator[LocalCluster]:
    with start_cluster(1) as c:
        yield c


@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", ["spectral", "low-space"])
@pytest.mark.parametrize("layout", ["row-bands", "blocks-prepass"])
def test_bitwise_identical_on_one_and_two_workers(
    client: Client,
    one_worker_cluster: LocalCluster,
    stores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
    layout: str,
) -> None:
    _, paths = stores
    chunks, force_split, n_chunks, n_passes = LAYOUTS[layout]
    if force_split:
        monkeypatch.setattr(pipeline.io.inputs, "ROW_BAND_LIMIT", 0)
    two = _run(paths[chunks], algorithm, tmp_path, "two")
    one = _run(
        paths[chunks],
        algorithm,
        tmp_path,
        "one",
        scheduler=one_worker_cluster.scheduler_address,
    )
    assert two.report["cluster"]["n_workers"] == 2
    assert one.report["cluster"]["n_workers"] == 1
    assert one.report["cluster"]["kind"] == "scheduler"
    for rep in (one.report, two.report):
        assert rep["input"]["n_chunks"] == n_chunks
        assert rep["n_passes"] == n_passes
    np.testing.assert_array_equal(one.S, two.S)
    np.testing.assert_array_equal(one.U, two.U)
    np.testing.assert_array_equal(one.V, two.V)


@pytest.mark.timeout(60)
def test_workers_run_single_threaded_blas(
    client: Client, one_worker_cluster: LocalCluster
) -> None:
    """Precondition of the bitwise test: BLAS threads pinned equal on every worker."""

    def blas_env() -> tuple[str | None, ...]:
        return tuple(
            os.environ.get(v)
            for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        )

    with Client(one_worker_cluster, set_as_default=False) as other:
        for c in (client, other):
            assert set(c.run(blas_env).values()) == {("1", "1", "1")}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("operator", "gather_bytes"),
    [("sparse-sign", None), ("gaussian", None), ("sparse-sign", 0)],
    ids=["sparse-sign", "gaussian", "sparse-sign-combined-on-workers"],
)
def test_non_private_release_same_with_and_without_the_local_qr(
    client: Client,
    stores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    operator: str,
    gather_bytes: int | None,
) -> None:
    """A non-private pass over whole row bands starts the TSQR in each chunk's task
    (``PassRequest.local_qr``); column-split chunks and in-memory input take the
    plain TSQR after the pass. Both give the same factorization at round-off
    (RTOL_CHUNKING), and the spy shows which path each layout took. With
    ``gather_bytes=0`` the per-block ``S_b^T Q_b`` stay on the workers and are
    combined there (the path of a tall matrix with many chunks)."""
    import pipeline.execution.source as source_module
    from pipeline.execution.source import DaskSource

    if gather_bytes is not None:
        monkeypatch.setattr(source_module, "LOCAL_QR_GATHER_BYTES", gather_bytes)
    # one store chunk per pass task (no banding), so that row-bands has 7 row blocks
    monkeypatch.setattr(source_module, "BAND_BYTES", 1)
    A, paths = stores
    reference = factorize(A, RANK, private=False, seed=SKETCH_SEED, operator=operator)
    assert reference.report["parameters"]["operator"] == operator
    ref_L = low_rank_product(reference.U, reference.S, reference.V)
    calls: list[int] = []
    real = DaskSource.finish_local_qr

    def spy(self, Q, R, left):  # type: ignore[no-untyped-def]
        calls.append(Q.numblocks[0])
        assert isinstance(left, np.ndarray) is (gather_bytes is None)
        return real(self, Q, R, left)

    monkeypatch.setattr(DaskSource, "finish_local_qr", spy)
    # row-bands: 6 bands of 64 rows and one of 16 < t = 25, which is its own R;
    # without clipping nothing needs whole rows, so "blocks" keeps its column split
    expected = {"whole": [1], "row-bands": [7], "blocks": [], "blocks-prepass": []}
    for name, (chunks, force_split, _n_chunks, _passes) in LAYOUTS.items():
        calls.clear()
        with monkeypatch.context() as mp:
            if force_split:
                mp.setattr(pipeline.io.inputs, "ROW_BAND_LIMIT", 0)
            f = factorize(paths[chunks], RANK, private=False, seed=SKETCH_SEED, operator=operator)
        assert calls == expected[name], name
        assert f.report["n_passes"] == 1, name
        L = low_rank_product(np.asarray(f.U), f.S, f.V)
        assert rel_diff(L, ref_L) < RTOL_CHUNKING, name
        np.testing.assert_allclose(f.S, reference.S, rtol=RTOL_CHUNKING, atol=0.0, err_msg=name)
        U = np.asarray(f.U)
        np.testing.assert_allclose(U.T @ U, np.eye(RANK), atol=1e-12, err_msg=name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["memory", "scratch"])
def test_noise_gram_step_is_the_numpy_one(
    client: Client, tmp_path: Path, global_seed: int, where: str
) -> None:
    """``DaskSource.tall_noise_gram``: every noisy block is exactly the noise map
    of that block (the key of the map sealed for the tasks), and the summed Gram
    matrix and ``S^T Y'`` are the in-memory ones up to the summation order."""
    import dask.array as da

    from pipeline.algorithms.base import ArraySource
    from pipeline.execution import DaskSource
    from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
    from pipeline.sketches.sparse import SparseSignOperator

    rng = np.random.default_rng(global_seed)
    Y = rng.standard_normal((M, 9))
    noise = GaussianNoise(key=NoiseKey.insecure_from_seed(3), sigma=2.0, length=M, dim=9, tile_size=32)
    op = SparseSignOperator(root=5, code=2, length=M, dim=17, tile_size=32)
    ref_Y, ref_G, ref_L = ArraySource(np.zeros((1, 1))).tall_noise_gram(Y, noise.add_to_block, op)

    scratch = tmp_path / "scratch" if where == "scratch" else None
    if scratch is not None:
        scratch.mkdir()
    src = DaskSource(da.zeros((M, N), chunks=(64, N)), client, scratch=scratch)
    try:
        fn = dataclasses.replace(noise, key=src.seal(noise.key)).add_to_block
        Yd = da.from_array(Y, chunks=(64, 9))  # 7 row blocks, the last one short
        noisy, G, L = src.tall_noise_gram(Yd, fn, op)
        np.testing.assert_array_equal(np.asarray(noisy.compute()), ref_Y)
        # 7 blocks summed in a tree instead of one product: float64 round-off
        np.testing.assert_allclose(G, ref_G, rtol=1e-12, atol=1e-12 * np.abs(ref_G).max())
        np.testing.assert_allclose(L, ref_L, rtol=1e-12, atol=1e-12 * np.abs(ref_L).max())
        _, G2, L2 = src.tall_noise_gram(Yd, fn, None)
        assert L2 is None
        np.testing.assert_array_equal(G2, G)  # fixed tree: the same sums again
        # negative control: the noise-free Y is far from what the step returns
        assert np.abs(np.asarray(noisy.compute()) - Y).max() > 1.0
        if scratch is not None:
            assert any(p.suffix == ".npy" for p in scratch.iterdir())  # kept on disk
    finally:
        src.close()


@pytest.mark.timeout(180)
def test_sketch_space_clip_is_chunk_invariant_where_it_binds(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row-unit Spectral-LRF release clips the rows of ``Y = X Phi`` to ``rho C`` after
    the global sum (column-split chunks add their partial rows first). With a third of the
    rows along the top singular direction of the public ``Phi``, the clip binds on each of
    them (checked on the exact sketch: the fault lands where it says), and the release is
    still the same for the in-memory array, row bands and column-split blocks."""
    from pipeline.algorithms.base import ArraySource
    from pipeline.algorithms.lrf import pass_request, plan_lrf
    from pipeline.params import LrfParams

    plan = plan_lrf(
        LrfParams.of(RANK, **PRIVACY, algorithm="spectral"), (M, N), public_seed=SKETCH_SEED
    )
    assert plan.range_clip_bound is not None
    phi = pass_request(plan, SKETCH_SEED).right[0][1].dense()  # N x t
    u = np.linalg.svd(phi, full_matrices=False)[0][:, 0]
    rng = np.random.default_rng(3)
    A = rng.standard_normal((M, N))
    A *= (0.5 / np.linalg.norm(A, axis=1))[:, None]  # inside the clip norm C = 1
    hot = np.arange(0, M, 3)
    A[hot] = 10.0 * rng.choice([-1.0, 1.0], size=(hot.size, 1)) * u  # clipped to C first
    y = ArraySource(A).sketch(pass_request(plan, SKETCH_SEED))["Y"]
    norms = np.linalg.norm(y, axis=1)
    assert np.all(norms[hot] > 2.0 * plan.range_clip_bound)  # the clip binds on every hot row
    cold = np.setdiff1d(np.arange(M), hot)
    assert np.all(norms[cold] < plan.range_clip_bound)

    reference = factorize(
        A, RANK, **PRIVACY, algorithm="spectral", seed=SKETCH_SEED, insecure_noise_seed=NOISE_SEED
    )
    assert reference.report["parameters"]["range_clip"] == plan.range_clip
    ref_L = low_rank_product(reference.U, reference.S, reference.V)
    for name in ("row-bands", "blocks", "blocks-prepass"):
        chunks, force_split, _, _ = LAYOUTS[name]
        path = write_matrix(tmp_path / f"hot-{name}.zarr", A, chunks)
        with monkeypatch.context() as mp:
            if force_split:
                mp.setattr(pipeline.io.inputs, "ROW_BAND_LIMIT", 0)
            rel = _run(path, "spectral", tmp_path, f"hot-{name}")
        assert rel_diff(low_rank_product(rel.U, rel.S, rel.V), ref_L) < RTOL_CHUNKING, name
        np.testing.assert_allclose(rel.S, reference.S, rtol=RTOL_CHUNKING, atol=0.0, err_msg=name)
