"""The sparse sign kernels of a sparse band against the dense products.

:func:`sign_left` (``G^T X``) and :func:`sign_right` (``X G``) for a sparse sign
block ``G`` and a sparse band ``X`` write the dense result without a sparse
intermediate product; :func:`left_product` and :func:`sparse_right` use them for
sparse sign operators. Each is compared entry by entry with the dense product of
``X.toarray()`` in the same dtype, for CSR and CSC bands, empty rows and an empty
band, sorted and unsorted column indices, float32 and float64.

Tolerance. An entry of either product is a sum of at most K products (K the
inner dimension), formed in another order than the dense BLAS product; both are
within ``gamma_K |G|^T |X|`` of the exact value [Hig02, eq. (3.5)], so they
differ by at most ``2 gamma_K |G|^T |X|`` (u of the dtype). A negative control
(one sign of the operator flipped) breaks that bound.

References
----------
.. [Hig02] N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
   SIAM 2002.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.linalg.clipping import ClipSpec
from pipeline.params import PrivacyUnit
from pipeline.sketches.gaussian import OperatorCode
from pipeline.sketches.sparse import SparseSignOperator
from pipeline.sketches.sparse_band import (
    CHUNK_NNZ,
    default_chunk_nnz,
    left_product,
    sign_left,
    sign_right,
    sparse_right,
)

ROOT = 0x5EED0F5A11CE5EED


def gamma(k: int, dtype: Any) -> float:
    """``gamma_k = k u / (1 - k u)`` [Hig02, Lemma 3.1], u of ``dtype``."""
    u = float(np.finfo(dtype).eps) / 2
    return k * u / (1 - k * u)


def _band(
    seed: int, rows: int, cols: int, density: float, fmt: str, dtype: Any, order: str
) -> Any:
    """A band with every third row empty; ``order="unsorted"`` reverses the
    stored column (CSR) or row (CSC) indices of every line."""
    rng = np.random.default_rng(seed)
    x = sp.random(rows, cols, density=density, format="csr", rng=rng)
    x.data = rng.standard_normal(x.nnz) * rng.choice([0.01, 1.0, 100.0], size=x.nnz)
    x = sp.csr_matrix(x.multiply((np.arange(rows) % 3 != 1)[:, None]))
    x = x.asformat(fmt).astype(dtype)
    if order == "unsorted":
        for a, b in zip(x.indptr[:-1], x.indptr[1:], strict=True):
            x.indices[a:b] = x.indices[a:b][::-1].copy()
            x.data[a:b] = x.data[a:b][::-1].copy()
        x.has_sorted_indices = False
        assert x.nnz == 0 or not x.has_sorted_indices
    return x


def _op(length: int, dim: int, nnz: int) -> SparseSignOperator:
    return SparseSignOperator(
        root=ROOT, code=OperatorCode.S_SPARSE, length=length, dim=dim, nnz=nnz,
        tile_size=32,
    )  # fmt: skip


CASES = [
    # rows, cols, density, dim, nnz
    (70, 45, 0.2, 17, 4),
    (150, 30, 0.05, 19, 8),
    (5, 6, 0.0, 7, 3),  # no stored entry
    (40, 25, 1.0, 2, 8),  # zeta capped at dim
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
@pytest.mark.parametrize(("rows", "cols", "density", "dim", "nnz"), CASES)
def test_sign_left_and_right_equal_the_dense_products(
    rows: int, cols: int, density: float, dim: int, nnz: int, fmt: str, order: str,
    dtype: Any,
) -> None:  # fmt: skip
    x = _band(rows + cols, rows, cols, density, fmt, dtype, order)
    xd = x.toarray()
    start = 13
    left_op, right_op = _op(rows + 40, dim, nnz), _op(cols + 40, dim, nnz)
    g_left = left_op.block(start, start + rows, dtype)  # (rows, dim)
    g_right = right_op.block(start, start + cols, dtype)  # (cols, dim)

    got = sign_left(left_op.left_block(start, start + rows, dtype), x)
    want = g_left.T @ xd
    bound = 2 * gamma(rows, dtype) * (np.abs(g_left).T @ np.abs(xd))
    assert got.shape == want.shape == (dim, cols)
    assert got.dtype == dtype
    assert np.all(np.abs(got - want) <= bound)

    cols_r, vals_r = right_op.structure(start, start + cols)
    got = sign_right(cols_r, vals_r.astype(dtype), x, dim)
    want = xd @ g_right
    bound = 2 * gamma(cols, dtype) * (np.abs(xd) @ np.abs(g_right))
    assert got.shape == want.shape == (rows, dim)
    assert got.dtype == dtype
    assert np.all(np.abs(got - want) <= bound)

    # the operator-level entry points use these kernels: the same bits
    np.testing.assert_array_equal(
        left_product(left_op.left_block(start, start + rows, dtype), x),
        sign_left(left_op.left_block(start, start + rows, dtype), x),
    )
    np.testing.assert_array_equal(
        sparse_right(right_op, x, start, start + cols, dtype),
        sign_right(cols_r, vals_r.astype(dtype), x, dim),
    )


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_any_block_size_gives_the_same_bits(fmt: str) -> None:
    """The kernels fill their output in blocks of rows of at most
    ``block_entries`` expanded entries, and sign_left goes through the band in
    chunks of rows of at most ``chunk_nnz`` stored entries, each added onto the
    running sums: every output entry is summed in the same order, so any block
    and chunk size gives the same bits."""
    x = _band(7, 300, 60, 0.1, fmt, np.float64, "sorted")
    op = _op(300, 23, 8)
    g_t = op.left_block(0, 300)
    whole = sign_left(g_t, x, block_entries=10**9, chunk_nnz=10**9)
    cols, vals = _op(60, 23, 8).structure(0, 60)
    right = sign_right(cols, vals, x, 23, block_entries=10**9)
    for entries in (1, 50, 777):
        np.testing.assert_array_equal(sign_left(g_t, x, block_entries=entries), whole)
        np.testing.assert_array_equal(sign_left(g_t, x, chunk_nnz=entries), whole)
        np.testing.assert_array_equal(
            sign_left(g_t, x, block_entries=entries, chunk_nnz=entries // 3), whole
        )
        np.testing.assert_array_equal(
            sign_right(cols, vals, x, 23, block_entries=entries), right
        )


def test_the_default_chunks_of_a_wide_band_change_no_bit() -> None:
    """A wide output (d N above CHUNK_NNZ) takes one chunk per d N stored entries
    instead of one per CHUNK_NNZ (each later chunk copies the output): the same
    bits as the narrow chunks, and the rule reads the shapes only."""
    assert default_chunk_nnz(4, 10) == CHUNK_NNZ
    assert default_chunk_nnz(100, 20_000) == 2_000_000
    x = _band(11, 400, 3000, 0.3, "csr", np.float64, "sorted")
    op = _op(400, 100, 8)
    g_t = op.left_block(0, 400)
    assert x.nnz > CHUNK_NNZ  # two chunks of CHUNK_NNZ against one of d N
    assert 100 * 3000 > CHUNK_NNZ
    np.testing.assert_array_equal(
        sign_left(g_t, x), sign_left(g_t, x, chunk_nnz=CHUNK_NNZ)
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_the_compiled_loop_gives_the_numpy_paths_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, fmt: str, order: str
) -> None:
    """A product of COMPILED_TERMS terms or more adds them in a compiled loop:
    the same terms, in the same order, as the gather-and-sum path (the same
    bits), for any dtype, format and stored order, duplicates included;
    negative control: another operator's product differs."""
    from pipeline.linalg import compiled as compiled_loops
    from pipeline.sketches import sparse_band

    x = _band(5, 500, 70, 0.15, fmt, dtype, order)
    c = sp.csr_array(x)
    r = int(np.argmax(np.diff(c.indptr) > 0))  # the first stored row
    ptr = c.indptr.copy()
    ptr[r + 1 :] += 1
    dup = sp.csr_array(  # its first entry stored twice (not canonical)
        (np.r_[c.data[:1], c.data], np.r_[c.indices[:1], c.indices], ptr),
        shape=c.shape,
    )
    g_t = _op(500, 29, 8).left_block(0, 500, dtype)
    for band in (x, dup):
        monkeypatch.setattr(sparse_band, "COMPILED_TERMS", 2**62)
        numpy_path = sign_left(g_t, band)
        monkeypatch.setattr(sparse_band, "COMPILED_TERMS", 0)
        # by rows; by targets in one chunk of rows, in many, one row each
        for wide, chunk in ((2**40, 1), (0, 2**40), (0, 7), (0, 1)):
            monkeypatch.setattr(compiled_loops, "TARGETS_FROM_COLUMNS", wide)
            monkeypatch.setattr(compiled_loops, "CHUNK_ENTRIES", chunk)
            compiled = sign_left(g_t, band)
            assert compiled.dtype == numpy_path.dtype
            np.testing.assert_array_equal(compiled, numpy_path)
    other = _op(600, 29, 8).left_block(100, 600, dtype)
    assert not np.array_equal(sign_left(other, x), compiled)


@pytest.mark.parametrize("given", [False, True])
def test_the_compiled_row_clip_gives_the_numpy_paths_bits(
    monkeypatch: pytest.MonkeyPatch, given: bool
) -> None:
    """A float64 band of COMPILED_ENTRIES stored entries or more has its rows
    clipped by compiled loops: the same sums of squares in the same order, the
    same factors and products (the same bits), rows whose squares overflow
    (clipped by their peak) and unsorted rows included; negative control: a
    norm summed in another order differs."""
    from pipeline.linalg import clipping

    x = sp.csr_matrix(_band(9, 400, 90, 0.3, "csr", np.float64, "unsorted"))
    first, second = (int(np.flatnonzero(np.diff(x.indptr) > 1)[k]) for k in (0, 1))
    x.data[x.indptr[first]] = 1e300  # its squares overflow: clipped by its peak
    x.data[x.indptr[second] : x.indptr[second + 1]] *= 1e-3  # under C: kept
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=0.7)
    scale = np.linspace(0.1, 1.0, x.shape[0]) if given else None
    got = {}
    for name, entries in (("numpy", 2**62), ("compiled", 0)):
        monkeypatch.setattr(clipping, "COMPILED_ENTRIES", entries)
        a = sp.csr_matrix(x, copy=True)
        with np.errstate(over="ignore"):
            clipping.sparse_clip(a, clip, row_scale=scale)
        got[name] = a.data
    np.testing.assert_array_equal(got["compiled"], got["numpy"])
    if not given:
        norm = np.linalg.norm(got["compiled"][x.indptr[first] : x.indptr[first + 1]])
        assert 0.7 * (1 - 16 * np.finfo(float).eps) <= norm <= 0.7  # not zeroed
        sums = clipping.row_sumsq(x)
        with np.errstate(over="ignore"):
            flipped = np.array([np.sum(x.data[a:b][::-1] ** 2) for a, b in
                                itertools.pairwise(x.indptr)])  # fmt: skip
        assert not np.array_equal(sums[np.isfinite(sums)], flipped[np.isfinite(sums)])


def test_a_flipped_sign_breaks_the_bound() -> None:
    """Negative control: the kernels of an operator with one sign flipped are
    caught by the entrywise bound of the products of the real operator."""
    x = _band(3, 60, 40, 0.3, "csr", np.float64, "sorted")
    xd = x.toarray()
    op = _op(60, 11, 4)
    g = op.block(0, 60)
    g_t = op.left_block(0, 60)
    row = int(np.argmax(np.diff(x.indptr) > 0))  # a stored row of the band
    g_t.data[g_t.indptr[row]] = -g_t.data[g_t.indptr[row]]
    bound = 2 * gamma(60, np.float64) * (np.abs(g).T @ np.abs(xd))
    assert not np.all(np.abs(sign_left(g_t, x) - g.T @ xd) <= bound)

    cols, vals = _op(40, 11, 4).structure(0, 40)
    g_r = _op(40, 11, 4).block(0, 40)
    vals = vals.copy()
    vals[int(np.argmax(np.abs(xd).sum(axis=0) > 0)), 0] *= -1  # a stored column
    bound = 2 * gamma(40, np.float64) * (np.abs(xd) @ np.abs(g_r))
    assert not np.all(np.abs(sign_right(cols, vals, x, 11) - xd @ g_r) <= bound)


def test_an_operator_of_other_values_goes_the_general_way() -> None:
    """A sparse left block whose values are not all of one magnitude (not a sign
    operator) still gives its product, through the general sparse product."""
    x = _band(5, 50, 20, 0.2, "csr", np.float64, "sorted")
    g_t = _op(50, 6, 3).left_block(0, 50)
    g_t.data = g_t.data * np.linspace(0.5, 2.0, g_t.nnz)
    want = g_t.toarray() @ x.toarray()
    got = left_product(g_t, x)
    bound = 2 * gamma(50, np.float64) * (np.abs(g_t.toarray()) @ np.abs(x.toarray()))
    assert np.all(np.abs(got - want) <= bound)
