"""The sparse sign co-range sketch in private releases (spec private-lrf-2 section 2).

A sparse sign ``S`` has columns of norm exactly 1 for every draw, so the
co-range sketch ``Z = S X`` of two neighbours whose difference lies in one row of
``X`` differs by exactly ``||d|| <= Delta_F``: no tail bound, no delta share.
These tests check that property through the real pass (clipping, operators,
chunked partials), the plans that use it, and what a ledger may do with it.
Runs under the ``ci`` hypothesis profile of tests/conftest.py (derandomized).
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.accounting.calibration import SketchRequest, calibrate_release
from pipeline.accounting.contract import PrivacyContract, gdp_scale
from pipeline.accounting.gaussian import gaussian_noise_multiplier
from pipeline.algorithms.base import ArraySource
from pipeline.algorithms.lrf import pass_request, plan_lrf
from pipeline.errors import InvalidParameterError
from pipeline.params import LrfParams, Neighboring, OperatorKind, PrivacyUnit
from pipeline.sketches.gaussian import OperatorCode
from pipeline.sketches.operators import make_operator

pytestmark = pytest.mark.property

#: Float64 rounding of a sum of at most a few hundred products of entries of
#: size <= 1e3: far below 1e-9 relative (a wrong normalisation is >= 2x off).
RTOL = 1e-9

ENTRIES = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=64)


@given(
    root=st.integers(0, 2**128 - 1),
    length=st.integers(1, 3000),
    dim=st.integers(2, 300),
    tile=st.sampled_from([7, 64, 1024]),
)
def test_every_column_of_a_sparse_sign_s_has_norm_exactly_one(
    root: int, length: int, dim: int, tile: int
) -> None:
    """``||S[:, i]|| = 1`` for every i of every draw: the whole calibration rests on it."""
    op = make_operator(
        OperatorKind.SPARSE_SIGN, root=root, code=OperatorCode.S, length=length,
        dim=dim, tile_size=tile,
    )  # fmt: skip
    norms = np.linalg.norm(op.dense(), axis=1)  # rows of G = columns of S
    np.testing.assert_allclose(norms, 1.0, rtol=RTOL, atol=0)


@st.composite
def row_neighbours(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, str, int]:
    """(A, A' differing in one row or one entry, row index, unit, sketch seed); tall A."""
    n = draw(st.integers(4, 20))
    m = draw(st.integers(n + 30, n + 120))
    A = draw(hnp.arrays(np.float64, (m, n), elements=ENTRIES))
    unit = draw(st.sampled_from(["row", "entry"]))
    i = draw(st.integers(0, m - 1))
    A2 = A.copy()
    if unit == "row":
        A2[i] = draw(hnp.arrays(np.float64, (n,), elements=ENTRIES))
    else:
        A2[i, draw(st.integers(0, n - 1))] = draw(ENTRIES)
    return A, A2, i, unit, draw(st.integers(0, 2**128 - 1))


def _z_difference(A: np.ndarray, A2: np.ndarray, unit: str, seed: int) -> tuple[float, float]:
    """(||Z(A) - Z(A')||_F, Delta_F) through the real pass of a default private plan."""
    params = LrfParams.of(
        2, epsilon=1.0, delta=1e-6, unit=unit, clip_norm=1.0,
        neighboring=Neighboring.REPLACE, sketch_size=4, core_size=20,
    )  # fmt: skip
    plan = plan_lrf(params, A.shape)
    assert plan.operator is OperatorKind.SPARSE_SIGN
    assert not plan.transpose
    request = pass_request(plan, seed)
    z, z2 = ArraySource(A).sketch(request)["Z"], ArraySource(A2).sketch(request)["Z"]
    bound = params.neighboring.frobenius_bound(params.clip.clip_norm)
    return float(np.linalg.norm(z - z2)), bound


@given(row_neighbours())
def test_z_moves_by_at_most_delta_f_for_every_draw(pair: tuple) -> None:  # type: ignore[type-arg]
    """Row and entry units: ``||dZ||_F = ||clip(a_i) - clip(a'_i)|| <= Delta_F`` [spec 2]."""
    A, A2, _i, unit, seed = pair
    diff, bound = _z_difference(A, A2, unit, seed)
    assert diff <= bound * (1 + RTOL)


def test_the_bound_is_attained() -> None:
    """Opposite clipped rows differ by exactly ``2C = Delta_F`` (replace-one), and so does Z."""
    rng = np.random.default_rng(3)
    A = rng.uniform(-0.01, 0.01, size=(80, 6))
    A2 = A.copy()
    A[5], A2[5] = 10.0, -10.0  # both clipped to norm C = 1, opposite directions
    diff, bound = _z_difference(A, A2, "row", seed=11)
    assert diff == pytest.approx(bound, rel=RTOL)


def test_negative_control_a_gaussian_s_exceeds_delta_f() -> None:
    """The same check fails for a Gaussian S: its column norms scatter around 1.

    A row direction along the largest column of S (found by looking at S: the
    tail bound of a secret Gaussian S covers pairs fixed in advance only) moves
    Z by ``max_i ||S[:, i]|| Delta_F > Delta_F``.
    """
    op = make_operator(OperatorKind.GAUSSIAN, root=11, code=OperatorCode.S, length=80, dim=20)
    norms = np.linalg.norm(op.dense(), axis=1)
    assert norms.max() > 1.2  # chi_20 / sqrt(20): max of 80 draws, P(<= 1.2) < 1e-4
    i = int(norms.argmax())
    d = np.zeros((80, 6))
    d[i] = 2.0 / math.sqrt(6)  # a row difference of norm 2 = Delta_F (replace-one, C = 1)
    dz = op.dense().T @ d
    assert np.linalg.norm(dz) > 1.2 * 2.0


# ------------------------------------------------------------------ the plans


def _plan(unit: str, shape: tuple[int, int], **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("algorithm", "spectral")  # one pass (two-pass: tests/unit/test_two_pass.py)
    return plan_lrf(LrfParams.of(3, epsilon=1.0, delta=1e-6, unit=unit, **kw), shape)


@pytest.mark.parametrize(
    ("unit", "shape", "algorithm", "kind", "n_gaussian"),
    [
        # a row of X per individual: Y clipped in sketch space, no Gaussian bound left
        ("row", (400, 60), "spectral", OperatorKind.SPARSE_SIGN, 0),
        ("row", (60, 400), "spectral", OperatorKind.GAUSSIAN, 2),  # rows of A are columns of X
        ("column", (60, 400), "spectral", OperatorKind.SPARSE_SIGN, 0),
        ("entry", (60, 400), "spectral", OperatorKind.SPARSE_SIGN, 1),
        ("row", (400, 60), "low-space", OperatorKind.SPARSE_SIGN, 3),  # Phi_c, Psi, T
        ("row", (60, 400), "low-space", OperatorKind.GAUSSIAN, 4),
    ],
)
def test_private_default_operator_is_sparse_exactly_where_it_is_exact(
    unit: str, shape: tuple[int, int], algorithm: str, kind: OperatorKind, n_gaussian: int
) -> None:
    plan = _plan(unit, shape, algorithm=algorithm)
    assert plan.operator is kind
    cal = plan.calibration
    assert cal is not None
    assert cal.n_sketch_matrices == n_gaussian
    z = next(sk for sk in cal.sketches if sk.name == "Z")
    if kind is OperatorKind.SPARSE_SIGN and algorithm == "spectral":
        assert z.jl_factor == 1.0  # exact: Delta_F itself
    cal.check()


def test_a_sparse_s_where_it_is_not_exact_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="operator='sparse-sign' in a private"):
        _plan("row", (60, 400), operator="sparse-sign")
    with pytest.raises(InvalidParameterError, match="operator='sparse-sign' in a private"):
        plan_lrf(
            LrfParams.of(3, epsilon=1.0, delta=1e-6, unit="entry", operator="sparse-sign",
                         algorithm="spectral"),
            (400, 60), public_seed=5,
        )  # fmt: skip


def test_a_public_seed_with_the_entry_unit_keeps_the_gaussian_s() -> None:
    one_pass = LrfParams.of(3, epsilon=1.0, delta=1e-6, unit="entry", algorithm="spectral")
    plan = plan_lrf(one_pass, (400, 60), public_seed=5)
    assert plan.operator is OperatorKind.GAUSSIAN


def test_exact_sketches_spend_no_delta_and_use_the_plain_gaussian_constant() -> None:
    """J = 0: ``sigma_i = Delta_F s(eps, delta) / sqrt(w_i)`` with the whole delta."""
    cal = calibrate_release(
        [SketchRequest(name="Z", shape=(10, 5), jl_dims=(), weight=0.2),
         SketchRequest(name="Y", shape=(50, 3), jl_dims=(), weight=0.8)],
        epsilon=1.0, delta=1e-6, frobenius_bound=2.0, n_sketch_matrices=0,
    )  # fmt: skip
    s = gaussian_noise_multiplier(1.0, 1e-6)
    assert cal.delta_jl == 0.0
    assert cal.delta_mechanism == 1e-6
    assert cal.sensitivity == "exact"
    for sk, w in zip(cal.sketches, (0.2, 0.8), strict=True):
        assert sk.sigma == pytest.approx(2.0 * s / math.sqrt(w), rel=1e-12)
    cal.check()


# ------------------------------------------------------------------ the ledger


def test_an_entry_release_with_a_sparse_s_is_read_on_its_exact_axis_only() -> None:
    """Tall A: S runs along A's rows, so the release converts to the row unit only."""
    plan = _plan("entry", (400, 60))
    assert plan.entry_reads == ("row",)
    wide = _plan("entry", (60, 400))
    assert wide.entry_reads == ("column",)
    c = PrivacyContract(
        unit="entry", neighboring="add-remove", clip_norm=1.0, epsilon=1.0, delta=1e-6,
        accountant="analytic-gaussian", shape=(400, 60), entry_reads=plan.entry_reads,
    )  # fmt: skip
    assert gdp_scale(c, PrivacyUnit.ROW, Neighboring.ADD_REMOVE) == pytest.approx(math.sqrt(60))
    assert gdp_scale(c, PrivacyUnit.COLUMN, Neighboring.ADD_REMOVE) is None
    # a Gaussian-S entry release (and every record written before the field) reads both
    old = c.to_dict()
    del old["entry_reads"]
    both = PrivacyContract.from_dict(old)
    assert both.entry_reads == ("row", "column")
    assert gdp_scale(both, PrivacyUnit.COLUMN, Neighboring.ADD_REMOVE) == pytest.approx(20.0)
    assert PrivacyContract.from_dict(c.to_dict()) == c
