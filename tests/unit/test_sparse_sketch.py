"""Sparse sign operators (spec 5.3, non-private mode; [TYUC19, section 3.3]).

Contract: ``G`` (length, d) has, in every row, ``zeta = min(nnz, d)`` entries
``+-1/sqrt(zeta)`` in distinct columns, uniformly placed, with fair signs; tiles are
keyed like the Gaussian operators, so blocks, rows and products cannot depend on
chunking; ``left``/``right`` equal the dense products; a private plan refuses it.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from scipy import stats

from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import plan_lrf, run_lrf
from pipeline.errors import InvalidParameterError
from pipeline.linalg import compiled
from pipeline.params import Algorithm, LrfParams, OperatorKind
from pipeline.sketches.apply import PassRequest, block_partials
from pipeline.sketches.gaussian import GaussianOperator, OperatorCode
from pipeline.sketches.operators import make_operator
from pipeline.sketches.sparse import SparseSignOperator, sparse_tile

ROOT = 0x51F15EED5EED5EED0123456789ABCDEF

#: sha256 of tile 2 (tile_size 16, dim 9, nnz 4) of code S_SPARSE under root 777,
#: columns then values, recorded with numpy 2.x. A change means numpy's
#: Generator.integers changed: sparse runs with a fixed seed are no longer
#: reproducible across that upgrade (pin numpy, as for the Gaussian tiles).
GOLDEN_DIGEST = "617faa45680fbebfaf7cebd10234659ea8d29a7165f95af045ee20dbcc0664e6"


def _op(length: int = 70, dim: int = 9, nnz: int = 4, tile: int = 16) -> SparseSignOperator:
    return SparseSignOperator(
        root=ROOT, code=OperatorCode.S_SPARSE, length=length, dim=dim, nnz=nnz, tile_size=tile
    )


def _digest(op: SparseSignOperator, tile: int) -> str:
    cols, vals = sparse_tile(op, tile)
    return hashlib.sha256(cols.tobytes() + vals.tobytes()).hexdigest()


@pytest.mark.parametrize(("dim", "nnz"), [(9, 4), (181, 8), (5, 8), (2, 1)])
def test_every_row_has_zeta_distinct_unit_entries(dim: int, nnz: int) -> None:
    op = SparseSignOperator(root=ROOT, code=12, length=3000, dim=dim, nnz=nnz, tile_size=256)
    G = op.dense()
    zeta = min(nnz, dim)
    assert op.zeta == zeta
    np.testing.assert_array_equal((G != 0).sum(axis=1), zeta)
    np.testing.assert_allclose(np.abs(G[G != 0]), 1 / np.sqrt(zeta), rtol=0, atol=0)
    # every row has Euclidean norm 1 (up to one rounding of 1/sqrt(zeta))
    np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1.0, rtol=1e-15)


def test_columns_and_signs_are_uniform() -> None:
    """Chi-square test of column use and a binomial test of signs (level 1e-4 each).

    Negative control: the same tests reject a generator that never uses column 0.
    """
    op = SparseSignOperator(root=ROOT, code=12, length=40000, dim=23, nnz=8, tile_size=1024)
    cols, vals = op.structure(0, op.length)
    counts = np.bincount(cols.ravel(), minlength=op.dim)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert stats.binomtest(int((vals > 0).sum()), vals.size).pvalue > 1e-4
    biased = counts.copy()
    biased[1] += biased[0]
    biased[0] = 0
    assert stats.chisquare(biased).pvalue < 1e-4


def test_distinct_sampling_has_no_pair_bias(rng: np.random.Generator) -> None:
    """Each unordered pair of columns is equally likely (chi-square, dim 6, zeta 2).

    Redrawing a row whose columns repeat is exactly uniform over distinct sets.
    Negative control: the common shortcut "move a collision to the next column"
    doubles the weight of neighbouring pairs, and the same test rejects it.
    """
    d, n = 6, 60000
    op = SparseSignOperator(root=ROOT, code=12, length=n, dim=d, nnz=2, tile_size=1024)
    cols, _ = op.structure(0, op.length)
    pairs = [a * d + b for a in range(d) for b in range(a + 1, d)]

    def pvalue(c: np.ndarray) -> float:
        lo, hi = c.min(axis=1), c.max(axis=1)
        counts = np.bincount(lo * d + hi, minlength=d * d)
        assert counts.sum() == counts[pairs].sum()  # distinct columns only
        return float(stats.chisquare(counts[pairs]).pvalue)

    assert pvalue(cols) > 1e-4
    first, second = rng.integers(0, d, size=n), rng.integers(0, d, size=n)
    second = np.where(second == first, (first + 1) % d, second)
    assert pvalue(np.stack([first, second], axis=1)) < 1e-4


@pytest.mark.parametrize("cuts", [(0, 70), (0, 15, 16, 17, 70), (0, 1, 33, 48, 64, 70)])
def test_blocks_over_any_split_equal_rows_and_dense(cuts: tuple[int, ...]) -> None:
    op = _op()
    G = op.dense()
    parts = [op.block(a, b) for a, b in itertools.pairwise(cuts)]
    np.testing.assert_array_equal(np.vstack(parts), G)
    idx = np.array([69, 3, 3, 16, 0, 47])
    np.testing.assert_array_equal(op.rows(idx), G[idx])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_left_and_right_equal_dense_products(rng: np.random.Generator, dtype: type) -> None:
    op = _op()
    G = op.dense()
    x = rng.normal(size=(40, 7))
    tol = 1e-12 if dtype is np.float64 else 1e-5
    left = op.left(x, 20, 60, dtype)
    right = op.right(x.T, 20, 60, dtype)
    assert left.dtype == dtype
    assert right.dtype == dtype
    np.testing.assert_allclose(left, G[20:60].T @ x, rtol=tol, atol=tol)
    np.testing.assert_allclose(right, x.T @ G[20:60], rtol=tol, atol=tol)
    # a transposed (Fortran-ordered) view, as the kernel passes for A.T
    np.testing.assert_allclose(op.left(np.asfortranarray(x), 20, 60), G[20:60].T @ x, rtol=1e-12)


def test_codes_roots_and_tiles_give_different_operators() -> None:
    a = _op()
    assert _digest(a, 0) != _digest(a, 1)
    b = SparseSignOperator(root=ROOT + 1, code=a.code, length=70, dim=9, nnz=4, tile_size=16)
    assert _digest(a, 0) != _digest(b, 0)
    c = make_operator(OperatorKind.SPARSE_SIGN, root=ROOT, code=OperatorCode.T, length=70, dim=9)
    assert c.code == OperatorCode.T_SPARSE != a.code
    # the Gaussian S and the sparse S never share a stream
    g = make_operator(OperatorKind.GAUSSIAN, root=ROOT, code=OperatorCode.S, length=70, dim=9)
    assert isinstance(g, GaussianOperator)
    assert g.code != a.code
    with pytest.raises(ValueError, match="no sparse sign version"):
        make_operator(OperatorKind.SPARSE_SIGN, root=ROOT, code=OperatorCode.PHI, length=7, dim=3)


def test_golden_tile_digest() -> None:
    op = SparseSignOperator(root=777, code=OperatorCode.S_SPARSE, length=64, dim=9, nnz=4, tile_size=16)
    assert _digest(op, 2) == GOLDEN_DIGEST
    cols, vals = sparse_tile(op, 2)
    np.testing.assert_array_equal(cols[0], [0, 1, 3, 4])
    np.testing.assert_array_equal(vals[0], [-0.5, 0.5, 0.5, -0.5])


@pytest.mark.parametrize(("dim", "nnz"), [(9, 4), (21, 8), (181, 8), (5, 8), (8, 8), (2, 1)])
def test_the_compiled_repeat_check_draws_the_same_tiles(
    dim: int, nnz: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which rows are drawn again decides the stream: the compiled check (taken
    once the process has loaded the compiled loops) and numpy's give the same
    tiles, bit for bit, including dim = zeta (every row a permutation)."""
    op = SparseSignOperator(root=ROOT, code=12, length=4096, dim=dim, nnz=nnz, tile_size=256)
    tiles = {}
    for loaded in (False, True):
        monkeypatch.setattr(compiled, "loaded", lambda loaded=loaded: loaded)
        tiles[loaded] = [sparse_tile(op, g) for g in range(6)]
    for (c0, v0), (c1, v1) in zip(tiles[False], tiles[True], strict=True):
        np.testing.assert_array_equal(c0, c1)
        np.testing.assert_array_equal(v0, v1)


def test_repeated_rows_finds_every_repeat(rng: np.random.Generator) -> None:
    """The compiled check against a set of each row's columns, on random rows
    (a subset of them, in their order); planted repeats at the two ends of a row."""
    dim = 12
    cols = rng.integers(0, dim, size=(400, 8), dtype=np.int64)
    cols[:50] = np.arange(8) + rng.integers(0, dim - 7, size=(50, 1))  # distinct
    cols[10, 7] = cols[10, 0]  # far apart: missed by a neighbours-only check
    rows = np.sort(rng.choice(400, size=300, replace=False)).astype(np.int64)
    rows = np.union1d(rows, [10, 11]).astype(np.int64)
    found = compiled.repeated_rows(cols, rows, dim)
    distinct = np.array([len(set(cols[r])) == cols.shape[1] for r in rows])
    np.testing.assert_array_equal(found, rows[~distinct])
    assert 10 in found
    assert 11 not in found
    # negative control: comparing neighbours without sorting misses row 10
    neighbours = rows[(cols[rows, 1:] == cols[rows, :-1]).any(axis=1)]
    assert 10 not in neighbours


def test_tile_is_reproducible_and_repr_hides_root() -> None:
    op = _op()
    assert _digest(op, 2) == _digest(_op(), 2)
    assert str(ROOT) not in repr(op)
    assert hex(ROOT)[2:] not in repr(op).lower()


def test_block_partials_with_a_sparse_left_operator(rng: np.random.Generator) -> None:
    """The kernel's partials equal the dense products, transposed or not, with two-sided."""
    A = rng.normal(size=(30, 20))
    S = SparseSignOperator(root=ROOT, code=12, length=30, dim=11, nnz=3, tile_size=8)
    Phi = GaussianOperator(root=ROOT, code=1, length=20, dim=4, tile_size=8)
    T = SparseSignOperator(root=ROOT, code=14, length=20, dim=11, nnz=3, tile_size=8)
    req = PassRequest(transpose=False, clip=None, right=(("Y", Phi),), left=(("Z", S),), two_sided=(("W", S, T),))
    y, z, w = block_partials(A[8:20, 5:17], 8, 5, req)
    np.testing.assert_allclose(y, A[8:20, 5:17] @ Phi.dense()[5:17], rtol=1e-12)
    np.testing.assert_allclose(z, S.dense()[8:20].T @ A[8:20, 5:17], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w, S.dense()[8:20].T @ A[8:20, 5:17] @ T.dense()[5:17], rtol=1e-12, atol=1e-14)
    S_t = SparseSignOperator(root=ROOT, code=12, length=20, dim=11, nnz=3, tile_size=8)
    req_t = PassRequest(transpose=True, clip=None, left=(("Z", S_t),))
    (zt,) = block_partials(A[8:20, 5:17], 8, 5, req_t)
    np.testing.assert_allclose(zt, S_t.dense()[5:17].T @ A[8:20, 5:17].T, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_reaches_a_sparse_partial_as_a_zero_row(bad: float) -> None:
    """The one rule for non-finite values (docs/privacy.md): without a unit, the row
    holding one counts as a zero row, silently, in the sparse kernel as in the dense."""
    A = np.ones((16, 5))
    A[11, 3] = bad
    zeroed = np.ones((16, 5))
    zeroed[11] = 0.0
    S = SparseSignOperator(root=ROOT, code=12, length=16, dim=7, nnz=2, tile_size=8)
    req = PassRequest(transpose=False, clip=None, left=(("Z", S),))
    (z,) = block_partials(A, 0, 0, req, where="chunk (1, 0)")
    (z_ref,) = block_partials(zeroed, 0, 0, req, where="chunk (1, 0)")
    np.testing.assert_array_equal(z, z_ref)  # the same kernel on the same bytes
    # negative control: the row does reach the partial when it is finite
    (z_ones,) = block_partials(np.ones((16, 5)), 0, 0, req, where="chunk (1, 0)")
    assert not np.array_equal(z_ones, z_ref)


def test_private_plan_refuses_a_sparse_operator_where_it_is_not_exact() -> None:
    """A wide matrix puts A's rows on X's columns: a sparse S would have no bound there."""
    with pytest.raises(InvalidParameterError, match="operator='sparse-sign' in a private"):
        plan_lrf(
            LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0, delta=1e-6,
                      operator=OperatorKind.SPARSE_SIGN),
            (40, 100),
        )
    wide = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0, delta=1e-6), (40, 100))
    assert wide.operator is OperatorKind.GAUSSIAN
    tall = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0, delta=1e-6), (100, 40))
    assert tall.operator is OperatorKind.SPARSE_SIGN  # exact along X's rows
    np_plan = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, private=False), (100, 40))
    assert np_plan.operator is OperatorKind.SPARSE_SIGN


@pytest.mark.parametrize("alg", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])
def test_rank_k_matrix_is_recovered_exactly_with_either_operator(
    rng: np.random.Generator, alg: Algorithm
) -> None:
    """Non-private, exact rank k: both kinds reconstruct A to round-off.

    With rank(A) = k < t the sketches capture A exactly whatever the operator,
    provided ``S U`` has full column rank, which a sparse sign map with zeta = 8
    and v = 6t + 1 rows has in practice.
    """
    m, n, k = 400, 120, 4
    A = rng.normal(size=(m, k)) @ rng.normal(size=(k, n))
    for kind in OperatorKind:
        plan = plan_lrf(LrfParams(algorithm=alg, rank=k, private=False, operator=kind), (m, n))
        f = run_lrf(ArraySource(A), plan, ReleaseHooks(sketch_seed=5, noise_key=None))
        err = np.linalg.norm(A - (f.U * f.S) @ f.V.T, 2) / np.linalg.norm(A, 2)
        assert err < 1e-10, (kind, err)


@pytest.mark.parametrize("rows", [40, 9])
def test_local_qr_partials(rng: np.random.Generator, rows: int) -> None:
    """``local_qr``: Q_b R_b = Y_b with Q_b orthonormal and the left product G_b^T Q_b;
    a block shorter than t (9 < 12) comes back as Y_b with R_b = Y_b and G_b^T
    zero-padded to t columns."""
    t = 12
    A = rng.normal(size=(rows, 30))
    Phi = GaussianOperator(root=ROOT, code=1, length=30, dim=t, tile_size=8)
    S = SparseSignOperator(root=ROOT, code=12, length=100, dim=25, nnz=4, tile_size=8)
    req = PassRequest(transpose=False, clip=None, right=(("Y", Phi),), left=(("Z", S),), local_qr=(("Y", "Z"),))
    assert req.names == ("Y", "Z", "Y_R", "Y_left")
    q, z, r, left = block_partials(A, 50, 0, req)
    Y = A @ Phi.dense()
    G = S.dense()[50 : 50 + rows]
    np.testing.assert_allclose(z, G.T @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(q @ r if rows >= t else r, Y, rtol=1e-12, atol=1e-12)
    if rows >= t:
        assert r.shape == (t, t)
        np.testing.assert_allclose(q.T @ q, np.eye(t), atol=1e-13)
        np.testing.assert_allclose(left, G.T @ q, rtol=1e-12, atol=1e-12)
    else:
        # returned as is: its own R, the product itself (another BLAS path than
        # A @ Phi here: equal to rounding)
        np.testing.assert_array_equal(q, r)
        np.testing.assert_allclose(q, Y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(left[:, :rows], G.T, rtol=0, atol=0)
        np.testing.assert_array_equal(left[:, rows:], 0.0)


def test_local_qr_is_refused_for_a_clipped_pass() -> None:
    """A private range sketch is noised after the global sum, before any QR."""
    from pipeline.params import ClipSpec, PrivacyUnit

    Phi = GaussianOperator(root=ROOT, code=1, length=30, dim=4)
    S = GaussianOperator(root=ROOT, code=2, length=30, dim=9)
    with pytest.raises(ValueError, match="non-private"):
        PassRequest(
            transpose=False, clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
            right=(("Y", Phi),), left=(("Z", S),), local_qr=(("Y", "Z"),),
        )
    with pytest.raises(ValueError, match="names no right/left sketch"):
        PassRequest(transpose=False, clip=None, right=(("Y", Phi),), local_qr=(("Y", "Z"),))
