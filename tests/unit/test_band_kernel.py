"""The dense band kernel: a band prepared and multiplied one piece of rows at a time.

:func:`pipeline.sketches.apply.block_partials` casts, clears, clips and multiplies
a dense band in pieces of :func:`~pipeline.sketches.apply.piece_rows` rows. These
tests compare it with the plain whole-band numpy computation within the rounding
bound of a sum (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
eq. 3.4-3.5: a computed inner product of K terms is off by at most
``gamma_K sum_i |a_i b_i|``, ``gamma_K = K u / (1 - K u)``), check that the pieces
see exactly the bytes the whole band would (bitwise where the computation is the
same), and that no band-sized temporary is formed.
"""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from pipeline.mechanisms.clipping import clip_by_peak, scale_factors_from_sumsq
from pipeline.params import ClipSpec, PrivacyUnit
from pipeline.sketches import apply
from pipeline.sketches.apply import PassRequest, block_partials
from pipeline.sketches.dense import DenseOperator
from pipeline.sketches.gaussian import GaussianOperator, OperatorCode
from pipeline.sketches.sparse import SparseSignOperator

ROOT = 20261206
U = np.finfo(np.float64).eps / 2  # unit roundoff of float64


def gamma(k: int) -> float:
    """Higham's ``gamma_K``: the relative error bound of a K-term sum."""
    return k * U / (1 - k * U)


def _request(m: int, n: int, clip: ClipSpec | None) -> PassRequest:
    """Every kind of product: a Gaussian right sketch, a sparse and a Gaussian
    left sketch, a two-sided sketch of each contraction order."""
    phi = GaussianOperator(root=ROOT, code=OperatorCode.PHI, length=n, dim=4)
    s = SparseSignOperator(root=ROOT, code=OperatorCode.S_SPARSE, length=m, dim=9)
    psi = GaussianOperator(root=ROOT, code=OperatorCode.PSI, length=m, dim=3)
    t = GaussianOperator(root=ROOT, code=OperatorCode.T, length=n, dim=5)
    v = DenseOperator(np.linspace(-1.0, 1.0, n * 2).reshape(n, 2))
    return PassRequest(
        transpose=False,
        clip=clip,
        right=(("Y", phi), ("XV", v)),
        left=(("Z", s), ("W", psi)),
        two_sided=(("C", s, t), ("D", psi, t)),
    )


def _band(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    """float32 rows of very different norms (some clipped, some not, one zero)."""
    a = rng.standard_normal((m, n)) * rng.choice([1e-3, 0.05, 1.0, 30.0], size=(m, 1))
    a[5] = 0.0
    return a.astype(np.float32)


def _plain(band: np.ndarray, req: PassRequest) -> tuple[dict, dict]:
    """Whole-band numpy: float64 rows clipped by their norms, then the dense
    products; with the same products of |X| and |G| (the rounding bounds).

    Each term of a K-term sum carries one product rounding and one rounding of
    a clip factor (applied to the row here, to the operator entry or the
    product in the kernel): each side is within gamma_{K+1} sum |terms| of the
    exact sum of the clipped rows' products (Higham, Lemma 3.1 and eq. 3.5), so
    the two differ by at most 2 gamma_{K+1} |G|^T |X| (K + 2 for the two-sided
    product, whose terms have one more factor)."""
    x = band.astype(np.float64)
    if req.clip is not None:
        x = x * scale_factors_from_sumsq(np.einsum("ij,ij->i", x, x), 1.0)[:, None]
    ops = {name: op.dense() for name, op in (*req.right, *req.left)}
    want, bound = {}, {}
    m, n = x.shape
    for name, _ in req.right:
        want[name] = x @ ops[name]
        bound[name] = 2 * gamma(n + 1) * (np.abs(x) @ np.abs(ops[name]))
    for name, _ in req.left:
        want[name] = ops[name].T @ x
        bound[name] = 2 * gamma(m + 1) * (np.abs(ops[name]).T @ np.abs(x))
    for name, s, t in req.two_sided:
        sd, td = s.dense(), t.dense()
        want[name] = sd.T @ x @ td
        bound[name] = 2 * gamma(m + n + 2) * (np.abs(sd).T @ np.abs(x) @ np.abs(td))
    return want, bound


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pieces of 16 rows for 40 columns: a 150-row band spans 10 pieces, the
    last one short."""
    monkeypatch.setattr(apply, "PIECE_BYTES", 16 * 8 * 40, raising=False)
    return 16


def test_piece_rows_from_the_shape_alone() -> None:
    assert apply.piece_rows(1000) == apply.PIECE_BYTES // 8000
    assert apply.piece_rows(10**9) == 16  # at least 16 rows per piece


@pytest.mark.parametrize("clip", [None, ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)])
def test_pieces_equal_the_whole_band_products_within_gamma(
    rng: np.random.Generator, small_pieces: int, clip: ClipSpec | None
) -> None:
    """Every partial is within 2 gamma_{K+1} |G|^T |X| of the whole-band product
    (:func:`_plain`; K is the length of the sums: m rows, n columns, m + n for
    the two-sided product)."""
    m, n = 150, 40
    band = _band(rng, m, n)
    req = _request(m, n, clip)
    got = dict(zip(req.names, block_partials(band, 0, 0, req), strict=True))
    want, bound = _plain(band, req)
    for name in req.names:
        assert got[name].dtype == np.float64
        err = np.abs(got[name] - want[name])
        assert (err <= bound[name]).all(), name
    # negative controls: the bound is tight enough to catch a dropped piece and
    # a skipped clip (the clipped rows change the products by far more)
    last = band.copy()
    last[-(m % small_pieces) :] = 0.0
    dropped, _ = _plain(last, req)
    assert not (np.abs(got["Z"] - dropped["Z"]) <= bound["Z"]).all()
    if clip is not None:
        unclipped, _ = _plain(band, _request(m, n, None))
        assert not (np.abs(got["Z"] - unclipped["Z"]) <= bound["Z"]).all()


def test_pieces_see_the_bytes_of_the_band(
    rng: np.random.Generator, small_pieces: int
) -> None:
    """A float32 band gives bit for bit the partials of its float64 copy (the cast
    of a piece is the cast of the band), and a non-finite row in a later piece is
    a zero row there, bit for bit; the input is never written (a band held in
    worker memory serves every pass)."""
    m, n = 150, 40
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)
    req = _request(m, n, clip)
    band = _band(rng, m, n)
    band.setflags(write=False)
    before = band.copy()
    got = block_partials(band, 0, 0, req)
    for g, w in zip(
        got, block_partials(band.astype(np.float64), 0, 0, req), strict=True
    ):
        np.testing.assert_array_equal(g, w)
    bad = band.copy()
    bad[70, 3] = np.nan  # piece 4 of 10
    bad[149, 0] = np.inf  # the short last piece
    bad.setflags(write=False)
    zeroed = band.copy()
    zeroed[[70, 149]] = 0.0
    for g, w in zip(
        block_partials(bad, 0, 0, req), block_partials(zeroed, 0, 0, req), strict=True
    ):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(band, before)
    # negative control: the NaN row's other entries would have moved the sketch
    assert not np.array_equal(got[2], block_partials(zeroed, 0, 0, req)[2])


@pytest.mark.parametrize("unit", [PrivacyUnit.ENTRY, PrivacyUnit.ROW])
def test_pieces_take_the_row_factors_of_a_split_row(
    rng: np.random.Generator, small_pieces: int, unit: PrivacyUnit
) -> None:
    """Precomputed row factors (a row split over column chunks) and entry clipping
    apply piece by piece as on the whole band: the same as the band clipped
    first, within the rounding bound."""
    m, n = 150, 40
    band = _band(rng, m, n)
    x = band.astype(np.float64)
    scale = None
    if unit is PrivacyUnit.ROW:
        scale = np.linspace(0.1, 1.0, m)
        clipped = x * scale[:, None]
    else:
        clipped = np.clip(x, -0.5, 0.5)
    req = _request(m, n, ClipSpec(unit=unit, clip_norm=0.5))
    got = block_partials(band, 0, 0, req, row_scale=scale)
    want, bound = _plain(clipped.astype(np.float64), _request(m, n, None))
    for name, g in zip(req.names, got, strict=True):
        assert (np.abs(g - want[name]) <= bound[name]).all(), name


def test_a_band_has_no_band_sized_temporary(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float64 rows exist one piece at a time: the kernel's peak allocation
    on a float32 band stays far below the band's float64 size (a whole-band
    cast would allocate it at least once). Pieces of 64 KiB: 40 rows here."""
    monkeypatch.setattr(apply, "PIECE_BYTES", 2**16, raising=False)
    m, n = 4000, 200
    band = _band(rng, m, n)
    s = SparseSignOperator(root=ROOT, code=OperatorCode.S_SPARSE, length=m, dim=20)
    v = DenseOperator(np.eye(n)[:, :4])
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)
    for req in (
        PassRequest(transpose=False, clip=clip, left=(("Z", s),)),
        PassRequest(transpose=False, clip=clip, right=(("Y", v),)),
    ):
        block_partials(band, 0, 0, req)  # warm: operator caches, imports
        tracemalloc.start()
        try:
            block_partials(band, 0, 0, req)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        band64 = m * n * 8
        # outputs (Z: 20 x 200, Y: 4000 x 4) and the operator's structure
        # (m x zeta) are small; one piece is at most PIECE_BYTES
        assert peak < band64 / 2, (req.names, peak, band64)


def test_a_row_whose_squares_overflow_is_clipped_by_its_peak(
    rng: np.random.Generator, small_pieces: int
) -> None:
    """A row of entries near 1e300 (its squared norm is inf in float64) is clipped
    by its peak (clip_by_peak), and every other row of its piece gets the factor
    it gets without it: the partials equal, bit for bit, those of the band with
    that row already clipped (which no later step changes: its norm is below C)."""
    m, n = 150, 40
    req = _request(m, n, ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0))
    band = _band(rng, m, n).astype(np.float64)
    band[37] = np.linspace(1e300, -3e300, n)
    done = band.copy()
    done[37] = clip_by_peak(band[37:38], 1.0)[0]
    got = block_partials(band, 0, 0, req)
    for g, w in zip(got, block_partials(done, 0, 0, req), strict=True):
        np.testing.assert_array_equal(g, w)
        assert np.isfinite(g).all()
    # negative control: the row is in the sketch (zeroing it moves Z)
    zero = done.copy()
    zero[37] = 0.0
    assert not np.array_equal(got[2], block_partials(zero, 0, 0, req)[2])


def test_split_row_factors_apply_before_the_products(rng: np.random.Generator) -> None:
    """Rows split over column chunks get their factors (from the norm pre-pass)
    applied to their entries before any product: a row of entries near 1e308,
    whose unclipped product with V would overflow, gives finite partials within
    the rounding bound of the clipped band's."""
    m, n = 150, 40
    band = _band(rng, m, n).astype(np.float64)
    band[37] = 1e308
    scale = np.ones(m)
    scale[37] = 0.5 / np.sqrt(n) / 1e308  # a factor the pre-pass would give
    req = _request(m, n, ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0))
    got = block_partials(band, 0, 0, req, row_scale=scale)
    want, bound = _plain(band * scale[:, None], _request(m, n, None))
    for name, g in zip(req.names, got, strict=True):
        assert np.isfinite(g).all(), name
        assert (np.abs(g - want[name]) <= bound[name]).all(), name


# -- the compiled loops: the numpy path's bits --------------------------------


def _hostile_band(rng: np.random.Generator, m: int, n: int, dtype: type) -> np.ndarray:
    """:func:`_band` with a NaN row, an Inf row and, in float64, a row whose
    squares overflow."""
    band = _band(rng, m, n).astype(dtype)
    band[70, 3] = np.nan
    band[149, 0] = -np.inf
    if dtype == np.float64:
        band[37] = np.linspace(1e300, -3e300, n)
    return band


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sketches", ["all", "left", "right", "non-private float32"])
def test_compiled_loops_give_the_numpy_bits(
    rng: np.random.Generator,
    small_pieces: int,
    monkeypatch: pytest.MonkeyPatch,
    dtype: type,
    sketches: str,
) -> None:
    """The compiled norms, clip factors and sparse sign products (the norms and
    product fused in one loop for a pass whose only product is ``S X``) give
    the partials of the numpy path bit for bit, rows to clear, to clip by peak
    and to clip by factor included: which one runs depends on the band's size
    alone and never changes a release."""
    m, n = 150, 43  # 43 columns: five lanes of 8 and a tail of 3
    full = _request(m, n, ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0))
    req = {
        "all": full,
        "left": PassRequest(transpose=False, clip=full.clip, left=full.left[:1]),
        "right": PassRequest(transpose=False, clip=full.clip, right=full.right),
        # products in float32, as a non-private pass of float32 data computes them
        "non-private float32": PassRequest(
            transpose=False, clip=None, right=full.right, left=full.left,
            two_sided=full.two_sided, compute_dtype=np.float32,
        ),
    }[sketches]  # fmt: skip
    if req.compute_dtype == np.float32 and dtype == np.float64:
        pytest.skip("a non-private pass computes in float32 for float32 data only")
    band = _hostile_band(rng, m, n, dtype)
    want = block_partials(band, 0, 0, req)
    monkeypatch.setattr(apply, "COMPILED_ENTRIES", 0)
    got = block_partials(band, 0, 0, req)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    if req.clip is None:
        # negative control: the same products in float64 move the partials
        wide = dataclasses.replace(req, compute_dtype=np.float64)
        other = block_partials(band, 0, 0, wide)
        assert any(not np.array_equal(o, w) for o, w in zip(other, want, strict=True))
        return
    # negative control: norms summed in another order (einsum's) move some clip
    # factor by an ulp, and the comparison sees it
    monkeypatch.setattr(
        apply,
        "dense_row_sumsq",
        lambda x, fast=False, into=None: (
            np.copyto(into, x) if into is not None else None,
            np.einsum("ij,ij->i", x, x, dtype=np.float64),
        )[1],
    )
    monkeypatch.setattr(apply, "COMPILED_ENTRIES", 10**12)
    other = block_partials(band, 0, 0, req)
    assert any(not np.array_equal(o, w) for o, w in zip(other, want, strict=True))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 43, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_norms_one_order_compiled_or_not(
    rng: np.random.Generator, n: int, dtype: type
) -> None:
    """dense_row_sumsq's compiled loop and numpy path: the same bits (NaN and Inf
    rows too), the copy they make is the rows' float64 values, and the sums are
    within gamma_n of the exact ones (Higham, eq. 3.5; exact: math.fsum)."""
    import math

    from pipeline.linalg.clipping import dense_row_sumsq

    x = (rng.standard_normal((40, n)) * rng.choice([1e-20, 1.0, 1e20], (40, 1))).astype(
        dtype
    )
    x[3, 0], x[5, -1] = np.nan, np.inf
    into_a, into_b = np.empty((40, n)), np.empty((40, n))
    a = dense_row_sumsq(x, into=into_a)
    b = dense_row_sumsq(x, fast=True, into=into_b)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(into_b, x.astype(np.float64))
    np.testing.assert_array_equal(into_a, into_b)
    np.testing.assert_array_equal(dense_row_sumsq(x, fast=True), b)
    x64 = x.astype(np.float64)
    for i in range(40):
        if np.isfinite(x64[i]).all():
            exact = math.fsum(v * v for v in x64[i].tolist())
            assert abs(b[i] - exact) <= gamma(n + 1) * exact, i
    assert np.isnan(b[3])
    assert np.isposinf(b[5])


def test_a_non_finite_row_stops_the_fused_loop_before_it_adds(
    rng: np.random.Generator,
) -> None:
    """The fused norms-and-product loop stops at a row whose squares are not
    finite and leaves the output as it was; without such a row it adds the
    product of the clipped rows (within the rounding bound of the plain
    computation)."""
    from pipeline.linalg.clipping import CLIP_SHRINK
    from pipeline.linalg.compiled import sign_dense_into

    m, n, d = 60, 33, 7
    x = _band(rng, m, n)
    cols = np.stack([rng.choice(d, 3, replace=False) for _ in range(m)])
    weights = rng.choice([-1.0, 1.0], (m, 3)) / np.sqrt(3)
    out = rng.standard_normal((d, n))
    before = out.copy()
    assert sign_dense_into(out, x, cols, weights, np.empty(m), clip=(1.0, CLIP_SHRINK))
    g = np.zeros((d, m))
    for i in range(m):
        g[cols[i], i] = weights[i]
    x64 = x.astype(np.float64)
    clipped = (
        x64 * scale_factors_from_sumsq(np.einsum("ij,ij->i", x64, x64), 1.0)[:, None]
    )
    err = np.abs(out - before - g @ clipped)
    assert (
        err <= 2 * gamma(m + 2) * (np.abs(g) @ np.abs(clipped) + np.abs(before))
    ).all()
    bad = x.copy()
    bad[40, 2] = np.nan
    kept = out.copy()
    assert not sign_dense_into(
        out, bad, cols, weights, np.empty(m), clip=(1.0, CLIP_SHRINK)
    )
    np.testing.assert_array_equal(out, kept)
    # negative control: the product without the clip is outside the bound
    err = np.abs(out - before - g @ x64)
    assert not (err <= 2 * gamma(m + 2) * (np.abs(g) @ np.abs(clipped))).all()
