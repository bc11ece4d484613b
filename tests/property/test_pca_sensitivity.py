"""Sensitivities and row preparation of the private PCA as properties (spec 3.1, 5.2 P2-P3).

Runs under the hypothesis profile of tests/conftest.py (``ci``: derandomized,
50 examples; ``nightly``: 1000). Neighbouring matrices differ in one row; every
row is prepared by :func:`prep_rows` (norm <= 1 - 1e-9) before any statistic
is formed, exactly as the row sources do.

Bounds (spec 3.1, replacement adjacency, rows of norm <= 1):

* Gram ``sum_i a_i a_i^T`` and ``H = sum_i (X^T a_i)(X^T a_i)^T``:
  ``||u u^T - u' u'^T||_F^2 = |u|^4 + |u'|^4 - 2 (u^T u')^2 <= 2``, so the
  change is ``<= sqrt(2)`` (equality for orthogonal unit rows);
* clipped sum ``Z = sum_i a_i Clip_R(a_i^T X B)``: each summand has Frobenius
  norm ``|a_i| |Clip_R(.)| <= R``, so the change is ``<= 2 R``, and the bound is
  approached (not ``R``).

Under add/remove (one row present or a zero row; the default relation) each
change is one summand: Gram and ``H`` 1, ``Z`` ``R``, score ``1/h``, row sum 1,
each attained by a unit row (section "add/remove" below). The declared
sensitivities of every calibration are checked against these values.

No slack is added to these bounds: prep_rows clips to ``1 - 1e-9`` and
clip_rows to ``R (1 - 1e-9)``, so the exact change is below the bound by a
relative ``2e-9``, six orders of magnitude above the float64 rounding of these
small sums (at most 16 rows of entries <= 1: error < 1e-13).
"""

from __future__ import annotations

import math
import warnings

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.accounting.pca_sensitivity import pca_sensitivities
from pipeline.algorithms.pca import (
    Secret,
    band_gram,
    band_products,
    band_update,
    clip_rows,
    eig_floor_inv_sqrt,
    exact_score,
    plan_pca,
    prep_rows,
    score_basis,
    sym,
)
from pipeline.params import PcaParams

pytestmark = pytest.mark.property

SQRT2 = math.sqrt(2.0)
#: Largest finite float64 and the smallest subnormal.
FMAX = float(np.finfo(np.float64).max)
TINY = 5e-324


# ------------------------------------------------------------------ strategies
@st.composite
def rows(draw: st.DrawFn, d: int) -> np.ndarray:
    """One raw row: random, zero, exactly unit norm, a signed basis vector, or huge."""
    kind = draw(st.sampled_from(["random", "zero", "unit", "basis", "huge", "small"]))
    if kind == "zero":
        return np.zeros(d)
    if kind == "basis":
        r = np.zeros(d)
        r[draw(st.integers(0, d - 1))] = draw(st.sampled_from([-1.0, 1.0]))
        return r
    elements = st.floats(-10.0, 10.0, allow_nan=False, width=64)
    r = draw(hnp.arrays(np.float64, (d,), elements=elements))
    if kind == "unit" and np.linalg.norm(r) > 0:
        return r / np.linalg.norm(r)
    if kind == "huge":
        return r * 1e300
    if kind == "small":
        return r * 1e-3
    return r


@st.composite
def neighbours(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(A, A') with one row replaced; sometimes a crafted orthogonal unit pair."""
    d = draw(st.integers(2, 8))
    n = draw(st.integers(1, 16))
    A = np.stack([draw(rows(d)) for _ in range(n)])
    i = draw(st.integers(0, n - 1))
    A2 = A.copy()
    if draw(st.booleans()):
        A2[i] = draw(rows(d))
    else:  # orthogonal unit rows: the extremal pair of the Gram bound
        j, l = draw(
            st.lists(st.integers(0, d - 1), min_size=2, max_size=2, unique=True)
        )
        A[i], A2[i] = 0.0, 0.0
        A[i, j], A2[i, l] = 1.0, 1.0
    return A, A2


def orthonormal(seed: int, d: int, k: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((d, k)))[0]


def preconditioner(seed: int, k: int, log_cond: float, scale: float) -> np.ndarray:
    """A symmetric positive definite ``B`` with condition number ``10^log_cond``,
    made by the implementation from a released ``H`` with that spread."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((k, k)))[0]
    lam = scale * 10.0 ** np.linspace(0.0, 2 * log_cond, k)
    return eig_floor_inv_sqrt(sym((Q * lam) @ Q.T), 1e-300)


# ------------------------------------------------------------------------ P2
@given(neighbours())
def test_gram_change_at_most_sqrt2(pair: tuple[np.ndarray, np.ndarray]) -> None:
    """P2: ``||A^T A - A'^T A'||_F <= sqrt(2)`` after preparation (spec 3.1)."""
    A, A2 = pair
    change = np.linalg.norm(band_gram(prep_rows(A)) - band_gram(prep_rows(A2)))
    assert change <= SQRT2


def test_gram_bound_is_attained_and_declared() -> None:
    """The orthogonal unit pair attains sqrt(2) (to the prep slack 2e-9, relative);
    under replacement the declared sensitivities of M and H (from the calibration)
    are >= sqrt(2) in both modes, and Z declares 2 R for the radius actually used."""
    A, A2 = np.zeros((3, 4)), np.zeros((3, 4))
    A[1, 0], A2[1, 2] = 1.0, 1.0
    change = np.linalg.norm(band_gram(prep_rows(A)) - band_gram(prep_rows(A2)))
    np.testing.assert_allclose(change, SQRT2, rtol=3e-9, atol=0)  # (1 - 1e-9)^2
    for mode in ("paper", "tight"):
        plan = plan_pca(
            PcaParams(
                rank=2,
                epsilon=1.0,
                delta=1e-6,
                iterations=3,
                clip_radius=0.05,
                sensitivity=mode,
                neighboring="replace",
            ),
            (1000, 6),
        )
        declared = {m.label: m.sensitivity for m in plan.calibration.mechanisms}
        assert declared["M"] >= SQRT2
        assert declared["H"] >= SQRT2
        assert declared["Z"] >= 2 * plan.clip_radius
        assert plan.clip_radius <= 0.05


@given(neighbours(), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_h_change_at_most_sqrt2(
    pair: tuple[np.ndarray, np.ndarray], seed: int, k: int
) -> None:
    """P2: ``||X^T (A^T A - A'^T A') X||_F <= sqrt(2)`` for orthonormal X, by both
    routes (two-pass: ``(A X)^T (A X)``; Gram route: ``sym(X^T S X)``)."""
    A, A2 = pair
    d = A.shape[1]
    X = orthonormal(seed, d, min(k, d - 1))
    a, a2 = prep_rows(A), prep_rows(A2)
    assert np.linalg.norm(band_products(a, X) - band_products(a2, X)) <= SQRT2
    h1 = sym(X.T @ sym(band_gram(a)) @ X)
    h2 = sym(X.T @ sym(band_gram(a2)) @ X)
    assert np.linalg.norm(h1 - h2) <= SQRT2


@given(
    neighbours(),
    st.integers(0, 2**32 - 1),
    st.integers(1, 3),
    st.floats(0.0, 6.0),
    st.floats(-4.0, 4.0),
    st.floats(1e-3, 10.0),
)
def test_clipped_sum_change_at_most_2r(
    pair: tuple[np.ndarray, np.ndarray],
    seed: int,
    k: int,
    log_cond: float,
    log_scale: float,
    R: float,
) -> None:
    """P2: ``||Z(A) - Z(A')||_F <= 2 R`` for orthonormal X and any SPD B, including
    B with condition number up to 1e6 and norm from 1e-2 to 1e2 (so that clipping
    ranges from inactive to active on every row)."""
    A, A2 = pair
    d = A.shape[1]
    k = min(k, d - 1)
    X = orthonormal(seed, d, k)
    B = preconditioner(seed + 1, k, log_cond, 10.0**log_scale)
    z1 = band_update(prep_rows(A), X, [(B, R)])
    z2 = band_update(prep_rows(A2), X, [(B, R)])
    assert np.linalg.norm(z1 - z2) <= 2 * R


def _unit(V: np.ndarray) -> np.ndarray:
    return V / np.linalg.norm(V, axis=1, keepdims=True)


def test_clipped_sum_bound_is_nearly_attained(global_seed: int) -> None:
    """Negative control against declaring ``R``: a search finds changes >= 1.9 R.

    ``XB`` is not an isometry, so two nearly equal rows whose projections on
    ``span(X)`` are small and opposite are both clipped to opposite vectors of
    norm R: the change tends to ``2R`` (spec 3.1; the spec's random search reached
    1.99995 R). Here a vectorised local random search (4000 pairs of unit rows,
    60 rounds of shrinking perturbations) maximises the change for a realistic
    ``||B|| = 1 > R = 0.05``, B with condition number 10. The per-row clipped
    products come from the implementation's prep_rows and clip_rows; the change of
    a rank-one replacement is ``||u c^T - u' c'^T||_F^2 = |u|^2 |c|^2 + |u'|^2 |c'|^2
    - 2 (u.u')(c.c')``; the best pair is re-checked with band_update.
    """
    rng = np.random.default_rng(global_seed)
    d, k, R, pop = 6, 2, 0.05, 4000
    X = orthonormal(global_seed, d, k)
    B = preconditioner(global_seed + 1, k, 0.5, 1.0)
    B /= np.linalg.norm(B, 2)

    def change(U: np.ndarray, U2: np.ndarray) -> np.ndarray:
        u, u2 = prep_rows(U), prep_rows(U2)
        c, c2 = clip_rows(u @ X @ B, R), clip_rows(u2 @ X @ B, R)
        sq = (
            (u * u).sum(1) * (c * c).sum(1)
            + (u2 * u2).sum(1) * (c2 * c2).sum(1)
            - 2 * (u * u2).sum(1) * (c * c2).sum(1)
        )
        return np.sqrt(np.maximum(sq, 0.0))

    U, U2 = _unit(rng.standard_normal((pop, d))), _unit(rng.standard_normal((pop, d)))
    best, step = change(U, U2), 0.5
    for _ in range(60):
        V = _unit(U + step * rng.standard_normal((pop, d)))
        V2 = _unit(U2 + step * rng.standard_normal((pop, d)))
        new = change(V, V2)
        up = new > best
        U[up], U2[up], best[up] = V[up], V2[up], new[up]
        step *= 0.9
    i = int(np.argmax(best))
    z1 = band_update(prep_rows(U[i : i + 1]), X, [(B, R)])
    z2 = band_update(prep_rows(U2[i : i + 1]), X, [(B, R)])
    found = float(np.linalg.norm(z1 - z2))
    np.testing.assert_allclose(found, best[i], rtol=1e-12, atol=0)  # same quantity
    assert 1.9 * R <= found <= 2 * R, found / R


# ------------------------------------------------------------------------ P3
ADVERSARIAL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from(
        [
            1e300,
            -1e300,
            1e308,
            -1e308,
            TINY,
            -TINY,
            2.2250738585072014e-308,
            0.0,
            -0.0,
            math.inf,
            -math.inf,
            math.nan,
            1.0,
            -1.0,
        ]
    ),
)


@st.composite
def adversarial_matrices(draw: st.DrawFn) -> np.ndarray:
    """Matrices of adversarial entries whose finite rows have a finite norm.

    A finite row of d entries of magnitude <= 1.79e308 / sqrt(d) has a norm below
    the float64 maximum; rows beyond that are covered by the strict-xfail test
    below, which documents a bug.
    """
    d = draw(st.integers(1, 6))
    n = draw(st.integers(1, 12))
    A = draw(hnp.arrays(np.float64, (n, d), elements=ADVERSARIAL))
    limit = FMAX / math.sqrt(d) / 1.0001
    finite = np.isfinite(A)
    big = finite & (np.abs(A) > limit)
    A[big] = np.sign(A[big]) * limit
    return A


def _prep_no_warning(A: np.ndarray, bound: float = 1.0) -> np.ndarray:
    """prep_rows with every warning turned into an error (as the project's pytest
    configuration does, made explicit here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return prep_rows(A, bound)


def _safe_norms(A: np.ndarray) -> np.ndarray:
    """Row norms of finite rows without overflow (scaled by the row's peak)."""
    peak = np.abs(A).max(axis=1)
    scale = np.where(peak > 0, peak, 1.0)
    return peak * np.linalg.norm(A / scale[:, None], axis=1)


@given(adversarial_matrices(), st.sampled_from([1.0, 1e-3, 7.5, 1e-150, 1e300]))
def test_prep_rows_bounds_every_row(A: np.ndarray, bound: float) -> None:
    """P3: after prep_rows every row has norm <= 1, rows with NaN/Inf are zero,
    other rows keep their direction, and nothing raises or warns (spec 1.4)."""
    out = _prep_no_warning(A, bound)
    assert out.dtype == np.float64
    assert out.shape == A.shape
    assert np.isfinite(out).all()
    assert (np.linalg.norm(out, axis=1) <= 1.0).all()
    bad = ~np.isfinite(A).all(axis=1)
    assert (out[bad] == 0.0).all()
    good = ~bad
    # Direction kept: out_i = c_i a_i with 0 <= c_i <= 1 / bound, entrywise.
    same_sign = (np.sign(out[good]) == np.sign(A[good])) | (out[good] == 0.0)
    assert same_sign.all()
    # Rows inside the ball after the public rescaling are only rescaled, exactly.
    # (The 0.99 margin keeps _safe_norms' own rounding away from the boundary.)
    with np.errstate(over="ignore"):  # norm / 1e-300 may be inf: not inside
        inside = _safe_norms(A[good]) / bound < 0.99
    np.testing.assert_array_equal(out[good][inside], A[good][inside] * (1.0 / bound))


def test_prep_rows_examples() -> None:
    """P3 by hand: huge, subnormal, mixed-sign and non-finite rows."""
    A = np.array(
        [
            [1e300, -1e300, 0.0],
            [1e308, 1e308, -1e308],
            [TINY, -TINY, TINY],
            [3.0, -4.0, 0.0],
            [np.nan, 1.0, 2.0],
            [np.inf, 0.0, 0.0],
            [0.3, -0.4, 0.0],
        ]
    )
    out = _prep_no_warning(A)
    norms = np.linalg.norm(out, axis=1)
    # clipped to norm 1 - 1e-9 (ROW_CLIP), up to rounding
    np.testing.assert_allclose(norms[[0, 1, 3]], 1.0, rtol=0, atol=2e-9)
    np.testing.assert_array_equal(out[2], A[2])  # subnormal: left as is
    np.testing.assert_array_equal(out[4:6], 0.0)
    np.testing.assert_array_equal(out[6], A[6])
    np.testing.assert_allclose(
        out[1], np.array([1, 1, -1]) / math.sqrt(3), rtol=1e-8, atol=0
    )


def test_prep_rows_norm_beyond_float_max() -> None:
    """A finite row whose norm exceeds 1.8e308 (e.g. four entries of 1.7e308) must be
    clipped to norm 1 - 1e-9 without a warning, as prep_rows documents ("huge rows are
    clipped, never zeroed or turned into Inf"); a warning is also a data-dependent side
    channel (spec 1.4, rule 2)."""
    A = np.array([[1.7e308, 1.7e308, -1.7e308, 1.7e308], [0.5, 0.0, 0.0, 0.0]])
    out = _prep_no_warning(A)
    np.testing.assert_allclose(np.linalg.norm(out[0]), 1.0, rtol=0, atol=2e-9)
    np.testing.assert_allclose(out[0], np.array([1, 1, -1, 1]) / 2, rtol=1e-8, atol=0)


@pytest.mark.parametrize(
    ("bound", "row"),
    [
        (1e-300, [1e-299, 0.0, 0.0]),
        (1e-170, [1e-170, 1e-170, 0.0]),
        (1e-160, [3e-160, 4e-160, 0.0]),
    ],
)
def test_prep_rows_tiny_public_bound(bound: float, row: list[float]) -> None:
    """P3 with a tiny public bound C: the rescaled row ``a / C`` has norm 10, sqrt(2)
    and 5 here, so prep_rows must clip it to norm <= 1 (spec 1.4, rule 1); a naive
    sum of squares underflows and returned norms 10, 1.414 and 1.0000056."""
    out = _prep_no_warning(np.array([row]), bound)
    assert _safe_norms(out)[0] <= 1.0


@given(adversarial_matrices(), st.data())
def test_prep_rows_banding_invariance(A: np.ndarray, data: st.DataObject) -> None:
    """P3: preparing row bands separately equals preparing the whole matrix, bit for
    bit (prep_rows is a per-row map; the row sources prepare one band per task)."""
    n = A.shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    bands = np.split(A, cuts)
    banded = np.concatenate([_prep_no_warning(b) for b in bands], axis=0)
    np.testing.assert_array_equal(banded, _prep_no_warning(A))


# ------------------------------------------------------ add/remove (the default)
@st.composite
def add_remove_neighbours(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(A, A') where one row of A is a zero row in A' (present or absent)."""
    d = draw(st.integers(2, 8))
    n = draw(st.integers(1, 16))
    A = np.stack([draw(rows(d)) for _ in range(n)])
    A2 = A.copy()
    A2[draw(st.integers(0, n - 1))] = 0.0
    return A, A2


def _statistics(
    A: np.ndarray, X: np.ndarray, B: np.ndarray, R: float, basis_args: tuple
) -> dict[str, np.ndarray]:
    """Every statistic the PCA releases, from the prepared rows of A."""
    a = prep_rows(A)
    S = sym(band_gram(a))
    lo, h = basis_args
    return {
        "M": S,
        "H": sym(X.T @ S @ X),
        "Z": band_update(a, X, [(B, R)]),
        "score": exact_score(X, score_basis(Secret(S), lo, h)).value,
        "mean": a.sum(axis=0),
    }


def _declared(neighboring: str, R: float, h: float) -> dict[str, float]:
    """The sensitivities the calibration declares (tight mode)."""
    s = pca_sensitivities("tight", neighboring)
    return {"M": s.gram, "H": s.gram, "Z": s.clip * R, "score": s.score(h), "mean": s.mean}


@given(
    st.one_of(add_remove_neighbours().map(lambda p: ("add-remove", p)),
              neighbours().map(lambda p: ("replace", p))),
    st.integers(0, 2**32 - 1),
    st.integers(1, 3),
    st.floats(0.0, 4.0),
    st.floats(1e-3, 2.0),
    st.floats(-1.0, 2.0),
    st.floats(1e-2, 4.0),
)  # fmt: skip
def test_every_statistic_moves_at_most_its_declared_sensitivity(
    case: tuple[str, tuple[np.ndarray, np.ndarray]],
    seed: int,
    k: int,
    log_cond: float,
    R: float,
    lo: float,
    h: float,
) -> None:
    """One row added, removed or replaced moves M, H, Z, the score and the row
    sum by at most the sensitivity the calibration declares for that relation."""
    neighboring, (A, A2) = case
    d = A.shape[1]
    k = min(k, d - 1)
    X = orthonormal(seed, d, k)
    B = preconditioner(seed + 1, k, log_cond, 1.0)
    s1 = _statistics(A, X, B, R, (lo, h))
    s2 = _statistics(A2, X, B, R, (lo, h))
    for name, bound in _declared(neighboring, R, h).items():
        change = float(np.linalg.norm(np.atleast_1d(s1[name] - s2[name])))
        # score: spectral norms and eigh of the 2-row sums, rounding ~1e-15 / h
        slack = 1e-12 / h if name == "score" else 0.0
        assert change <= bound + slack, (name, neighboring, change, bound)


def test_add_remove_bounds_are_attained() -> None:
    """A unit row present or absent attains every add/remove sensitivity (to the
    prep and radius slack 2e-9): Gram and H 1, Z R (its whitened projection is
    clipped), score 1/h (its eigenvalue on the ramp, orthogonal to X), row sum 1."""
    d, R, lo, h = 4, 0.05, 0.5, 3.0
    A = np.zeros((3, d))
    A[0, 0], A[1, 0] = 1.0, 1.0  # S = 2 e1 e1^T; X = e1
    A[2, 1] = 1.0  # the row that is added or removed: e2, orthogonal to X
    A2 = A.copy()
    A2[2] = 0.0
    X = np.eye(d)[:, :1]
    B = np.eye(1)
    # the e2 row projects to 0 on X: use X = (e1 + e2)/sqrt(2) for H and Z
    Xz = np.zeros((d, 1))
    Xz[0, 0] = Xz[1, 0] = 1 / SQRT2
    s1 = _statistics(A, X, B, R, (lo, h))
    s2 = _statistics(A2, X, B, R, (lo, h))
    z1 = _statistics(A, Xz, B, R, (lo, h))
    z2 = _statistics(A2, Xz, B, R, (lo, h))
    got = {
        "M": np.linalg.norm(s1["M"] - s2["M"]),
        "H": np.linalg.norm(z1["H"] - z2["H"]) * 2.0,  # |X^T e2|^2 = 1/2
        "Z": np.linalg.norm(z1["Z"] - z2["Z"]),
        # S has eigenvalue 1 on e2 (f = (1 - 0.5)/3) or 0 (f = 0): s moves by 0.5/h
        "score": abs(float(s1["score"] - s2["score"])) * 2.0,
        "mean": np.linalg.norm(s1["mean"] - s2["mean"]),
    }
    declared = _declared("add-remove", R, h)
    for name in ("M", "Z", "mean"):
        np.testing.assert_allclose(got[name], declared[name], rtol=3e-9, err_msg=name)
    # H: a unit row along X moves H by exactly 1 (here by 1/2 for |X^T e2|^2 = 1/2)
    np.testing.assert_allclose(got["H"], declared["H"], rtol=3e-9)
    # score: the ramp slope 1/h times the eigenvalue change 1 (here 0.5 above a)
    np.testing.assert_allclose(got["score"], declared["score"], rtol=5e-9)


def test_replace_bounds_are_attained_for_the_mean() -> None:
    """Replacement: a unit row replaced by its opposite moves the row sum by 2."""
    A = np.zeros((2, 3))
    A[0, 0] = 1.0
    A2 = A.copy()
    A2[0, 0] = -1.0
    change = np.linalg.norm(prep_rows(A).sum(0) - prep_rows(A2).sum(0))
    np.testing.assert_allclose(change, pca_sensitivities("tight", "replace").mean, rtol=3e-9)


@pytest.mark.parametrize("mode", ["tight", "paper"])
@pytest.mark.parametrize("neighboring", ["add-remove", "replace"])
def test_every_calibration_declares_at_least_the_supremum(
    mode: str, neighboring: str
) -> None:
    """Each plan's mechanisms declare >= the supremum of their relation (and the
    tight mode declares exactly it): a calibration to 1 under replacement would
    be under-noised, the negative control below shows that it is caught."""
    plan = plan_pca(
        PcaParams(rank=2, epsilon=1.0, delta=1e-6, iterations=3, clip_radius=0.05,
                  sensitivity=mode, neighboring=neighboring),
        (1000, 6),
    )  # fmt: skip
    sup = _declared(neighboring, plan.clip_radius, 1.0)
    declared = {m.label: m.sensitivity for m in plan.calibration.mechanisms}
    for label in ("M", "H", "Z"):
        assert declared[label] >= sup[label] * (1 - 1e-12)
        if mode == "tight" or neighboring == "add-remove":
            assert declared[label] == pytest.approx(sup[label], rel=1e-12)
    under = {**sup, "M": 1.0, "H": 1.0}  # add/remove values claimed for replace
    if neighboring == "replace":
        assert any(under[lbl] < sup[lbl] for lbl in ("M", "H"))
