"""The partials of a sparse band equal those of the same band densified.

Property tests (hypothesis profile of tests/conftest.py) over random CSR bands,
with empty rows, empty bands (no stored entry) and bands of one row among the
examples: :func:`block_partials` of the CSR band against :func:`block_partials` of
``band.toarray()``, for every privacy unit, both orientations, Gaussian, sparse
sign and dense operators; and the PCA band kernels (:func:`band_pass`) likewise.

Tolerance. Both sides compute the same exact quantity in other summation orders.
A product entry with K terms is within ``gamma_K |G|^T |X|`` of the exact value
[Hig02, eq. (3.5)], so the two differ by ``2 gamma_K |G|^T |X|``; the clip factors
come from sums of squares of at most N terms (``gamma_N`` each) followed by a
square root, a division and two products, so the clipped entries differ by at
most ``gamma_{N+8}`` relatively. Hence the entrywise bound
``3 gamma_{K+N+8} (|G|^T |X_c|)`` (``|S|^T |X_c| |T|`` for two-sided sketches, whose
K is the sum of both inner dimensions), with ``X_c`` the clipped band; at these
sizes (K + N < 200) that is about 7e-14 relative.

References
----------
.. [Hig02] N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
   SIAM 2002.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline.algorithms.pca import band_pass
from pipeline.algorithms.pca.kernels import prep_rows
from pipeline.linalg.clipping import (
    ClipSpec,
    sparse_clip,
    sparse_sumsq,
    sparse_zero_non_finite,
    zero_non_finite,
)
from pipeline.params import PrivacyUnit
from pipeline.sketches import GaussianOperator, OperatorCode, SparseSignOperator
from pipeline.sketches.apply import PassRequest, block_partials, clip_block
from pipeline.sketches.dense import DenseOperator

pytestmark = pytest.mark.property

U = np.finfo(np.float64).eps / 2


def gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)`` [Hig02, Lemma 3.1]."""
    return k * U / (1 - k * U)


def _band(
    seed: int, rows: int, cols: int, density: float, nonfinite: bool
) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    x = sp.random(rows, cols, density=density, format="csr", rng=rng)
    x.data = rng.standard_normal(x.nnz) * rng.choice([0.1, 1.0, 30.0], size=x.nnz)
    if rows > 2:
        x = sp.csr_matrix(x.multiply(np.arange(rows)[:, None] % 3 != 1))  # empty rows
    if nonfinite and x.nnz:
        x.data[rng.integers(0, x.nnz, size=2)] = [np.nan, np.inf]
    return sp.csr_matrix(x)


UNITS = [None, PrivacyUnit.ROW, PrivacyUnit.COLUMN, PrivacyUnit.ENTRY]

band_args = {
    "seed": st.integers(0, 2**16),
    "rows": st.integers(1, 40),
    "cols": st.integers(1, 30),
    "density": st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    "nonfinite": st.booleans(),
}


def _request(unit, transpose, m, n, row0, seed):
    xm, xn = (n, m) if transpose else (m, n)
    clip = None if unit is None else ClipSpec(unit=unit, clip_norm=1.5)
    rng = np.random.default_rng(seed)
    gauss = GaussianOperator(
        root=seed, code=OperatorCode.PHI, length=xn, dim=5, tile_size=16
    )
    dense = DenseOperator(rng.standard_normal((xn, 3)))
    s_sp = SparseSignOperator(
        root=seed, code=OperatorCode.S_SPARSE, length=xm, dim=9, nnz=3, tile_size=16
    )
    s_g = GaussianOperator(
        root=seed, code=OperatorCode.S, length=xm, dim=4, tile_size=16
    )
    t_g = GaussianOperator(
        root=seed, code=OperatorCode.T, length=xn, dim=6, tile_size=16
    )
    return PassRequest(
        transpose=transpose,
        clip=clip,
        right=(("y", gauss), ("v", dense)),
        left=(("z", s_sp), ("zg", s_g)),
        two_sided=(("w", s_sp, t_g), ("wg", s_g, t_g)),
    )


@given(**band_args, unit=st.sampled_from(UNITS), transpose=st.booleans())
@example(
    seed=1,
    rows=1,
    cols=7,
    density=0.3,
    nonfinite=False,
    unit=PrivacyUnit.ROW,
    transpose=False,
)
@example(
    seed=2,
    rows=5,
    cols=4,
    density=0.0,
    nonfinite=False,
    unit=PrivacyUnit.ROW,
    transpose=True,
)
@example(
    seed=3, rows=1, cols=1, density=1.0, nonfinite=True, unit=None, transpose=False
)
def test_sparse_partials_equal_dense(
    seed, rows, cols, density, nonfinite, unit, transpose
):
    m = rows + 17  # the band is rows [row0, row0 + rows) of an m x cols matrix
    row0 = 11
    x = _band(seed, rows, cols, density, nonfinite)
    req = _request(unit, transpose, m, cols, row0, seed)
    # unit column: the factors come from all bands (a pre-pass); given here
    col_scale = (
        np.random.default_rng(seed).uniform(0.0, 1.0, cols)
        if unit is PrivacyUnit.COLUMN
        else None
    )
    got = block_partials(x, row0, 0, req, col_scale=col_scale)
    want = block_partials(x.toarray(), row0, 0, req, col_scale=col_scale)
    # |X_c| of the clipped dense band, oriented as the sketches see it
    xc = np.abs(
        clip_block(zero_non_finite(x.toarray(), unit), req.clip, col_scale=col_scale)
    )
    xc = xc.T if transpose else xc
    xr0, xc0 = (0, row0) if transpose else (row0, 0)
    K = rows + cols + 8
    bounds = []
    for _, op in req.right:
        bounds.append(xc @ np.abs(op.block(xc0, xc0 + xc.shape[1])))
    for _, op in req.left:
        bounds.append(np.abs(op.block(xr0, xr0 + xc.shape[0])).T @ xc)
    for _, s_op, t_op in req.two_sided:
        s = np.abs(s_op.block(xr0, xr0 + xc.shape[0]))
        t = np.abs(t_op.block(xc0, xc0 + xc.shape[1]))
        bounds.append(s.T @ xc @ t)
        K = 2 * (rows + cols) + 8
    assert len(got) == len(want) == len(bounds)
    for name, g, w, b in zip(req.names, got, want, bounds, strict=True):
        assert g.shape == w.shape, name
        assert g.dtype == np.float64
        assert np.all(np.abs(g - w) <= 3 * gamma(K) * b), name


def test_bound_is_tight_enough_to_catch_a_wrong_clip() -> None:
    """Negative control: a band clipped at another norm breaks the bound."""
    x = _band(5, 8, 6, 1.0, False)
    req = _request(PrivacyUnit.ROW, False, 20, 6, 0, 5)
    other = PassRequest(
        transpose=False,
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.5 * (1 + 1e-9)),
        right=req.right,
    )
    got = block_partials(x, 0, 0, other)[0]
    want = block_partials(x.toarray(), 0, 0, req)[0]
    xc = np.abs(clip_block(x.toarray(), req.clip))
    b = xc @ np.abs(req.right[0][1].block(0, 6))
    assert not np.all(np.abs(got - want) <= 3 * gamma(8 + 6 + 8) * b)


@given(**band_args, unit=st.sampled_from(UNITS))
def test_sparse_clip_equals_dense(seed, rows, cols, density, nonfinite, unit):
    """Zeroing and clipping on the stored entries equal the dense block's
    (relative ``gamma_{N+8}``, module docstring), implicit zeros stay zero."""
    x = _band(seed, rows, cols, density, nonfinite)
    clip = None if unit is None else ClipSpec(unit=unit, clip_norm=0.7)
    a = sp.csr_matrix(x, copy=True)
    sparse_zero_non_finite(a, unit)
    sparse_clip(a, clip)
    want = clip_block(zero_non_finite(x.toarray(), unit), clip)
    got = a.toarray()
    np.testing.assert_allclose(got, want, rtol=gamma(max(rows, cols) + 8), atol=0)


@given(**band_args)
def test_sparse_sumsq_equals_dense_rows(seed, rows, cols, density, nonfinite):
    x = _band(seed, rows, cols, density, nonfinite)
    d = x.toarray()
    for axis in (0, 1):
        s = sparse_sumsq(x, axis)
        v = d if axis == 1 else d.T
        finite = np.where(np.isfinite(v), v, 0.0)
        np.testing.assert_allclose(
            s[0], (finite**2).sum(axis=1), rtol=gamma(v.shape[1]), atol=0
        )
        np.testing.assert_array_equal(s[3], (~np.isfinite(v)).sum(axis=1))
        peak = np.abs(finite).max(axis=1, initial=0.0)
        np.testing.assert_array_equal(s[1], np.frexp(peak)[1])


def test_huge_rows_clipped_by_peak_not_zeroed() -> None:
    """Rows whose squares overflow are clipped by their peak, as dense rows are."""
    x = sp.csr_matrix(np.array([[3e300, 0.0, 4e300], [0.0, 1.0, 0.0]]))
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)
    a = sp.csr_matrix(x, copy=True)
    with np.errstate(over="ignore"):
        sparse_clip(a, clip)
        want = clip_block(x.toarray(), clip)
    np.testing.assert_allclose(a.toarray(), want, rtol=4 * U, atol=0)
    # clipped to C (1 - 4 eps) [clip_by_peak], not zeroed
    norm = float(np.linalg.norm(a.toarray()[0]))
    assert 1.0 - 16 * U <= norm <= 1.0


@given(**band_args, bound=st.sampled_from([1.0, 0.05, 1e-200]), clip=st.booleans())
@example(seed=4, rows=1, cols=5, density=0.0, nonfinite=False, bound=1.0, clip=True)
def test_sparse_pca_band_kernels_equal_dense(
    seed, rows, cols, density, nonfinite, bound, clip
):
    """Gram, products and clipped update of a CSR band against the dense band.

    Bound: the prepared rows differ by ``gamma_{N+8}`` relatively (their factors,
    as above), each statistic is a sum of products of at most ``rows`` prepared
    rows with K = rows + cols + k terms; the clip ``Clip_R`` is 1-Lipschitz. So
    ``|diff| <= 4 gamma_{K+N+8} S`` with S the statistic of the absolute values
    (no clip), which bounds every partial sum of the clipped one too.
    """
    x = _band(seed, rows, cols, density, nonfinite)
    rng = np.random.default_rng(seed)
    k = 2
    X = np.linalg.qr(rng.standard_normal((cols, min(k, cols))))[0]
    k = X.shape[1]
    trials = [(np.eye(k), 0.3), (rng.standard_normal((k, k)), np.inf)]
    Xt = np.hstack([X, X])
    b = np.abs(prep_rows(x.toarray(), bound, clip=clip))
    g = gamma(2 * (rows + cols + 2 * k) + 8)
    xb = np.hstack([X @ B for B, _ in trials])
    for kind, payload, ref in (
        ("gram", None, b.T @ b),
        ("products", X, (b @ np.abs(X)).T @ (b @ np.abs(X))),
        ("update", (Xt, trials), b.T @ (b @ np.abs(xb))),
    ):
        with np.errstate(over="ignore", invalid="ignore"):
            got = band_pass(x, kind, payload, bound, clip)
            want = band_pass(x.toarray(), kind, payload, bound, clip)
        assert got.shape == want.shape, kind
        if not clip and not np.isfinite(want).all():
            continue  # unclipped huge values overflow both ways; not compared
        assert np.all(np.abs(got - want) <= 4 * g * ref + 1e-300), kind
