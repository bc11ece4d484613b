"""Hostile matrices through the Python API, in memory (no cluster).

Cases 1-4 of the hostile input suite (see docs/privacy.md, "Hostile inputs"):
units far above the clip norm, values at the float limits, NaN and Inf, and
degenerate shapes and ranks. Each case ends in either a checked release (finite
factors, orthonormal columns, exactly one new ledger record) or a refusal with a
``PipelineError`` that shows no data value and leaves the ledger byte-identical.

Privacy is checked on the exact pre-noise sketches (``pass_request`` over an
``ArraySource``, as in tests/property/test_sensitivity.py): a hostile unit moves
every sketch by at most its declared sensitivity, and the hostile unit is
*clipped* (its sketches equal those of the unit rescaled to norm C), not zeroed
or passed through.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.accounting.ledger import Ledger
from pipeline.algorithms.base import ArraySource
from pipeline.algorithms.lrf import pass_request, plan_lrf
from pipeline.algorithms.pca import ArrayRowSource
from pipeline.api import factorize, make_params, pca
from pipeline.errors import InvalidParameterError

M, N, C = 60, 20, 0.5
FMAX = float(np.finfo(np.float64).max)  # 1.797e308
F32MAX = float(np.finfo(np.float32).max)
TINY = 5e-324  # the smallest subnormal float64
#: magnitude of the hostile unit's largest entry
MAGNITUDES = {
    "1e6 C": 1e6 * C,
    "1e300": 1e300,
    "+1.7e308": 1.7e308,
    "-1.7e308": -1.7e308,
}
PCA_KW: dict[str, Any] = {"iterations": 2, "clip_radius": 0.5}


def _matrix(seed: int = 7) -> np.ndarray:
    """Rows of norm about 0.2-1: clipping at C = 0.5 is active for some."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, N)) / np.sqrt(N) * rng.uniform(0.4, 2.0, (M, 1))


def _direction(n: int, seed: int = 11) -> np.ndarray:
    """A fixed direction with largest entry 1 (so ``mag * d`` stays finite)."""
    d = np.random.default_rng(seed).standard_normal(n)
    return d / np.abs(d).max()


def _with_unit(A: np.ndarray, unit: str, value: float | np.ndarray) -> np.ndarray:
    """A copy of ``A`` whose unit (row 5, column 3 or cell (5, 3)) is ``value``."""
    B = A.copy()
    if unit == "row":
        B[5] = value
    elif unit == "column":
        B[:, 3] = value
    else:
        B[5, 3] = value
    return B


def _hostile(A: np.ndarray, unit: str, mag: float) -> tuple[np.ndarray, np.ndarray]:
    """(hostile matrix, the same matrix with the hostile unit clipped by hand to C)."""
    if unit == "entry":
        return _with_unit(A, unit, mag), _with_unit(A, unit, np.sign(mag) * C)
    d = _direction(M if unit == "column" else N)
    return (
        _with_unit(A, unit, mag * d),
        _with_unit(A, unit, np.sign(mag) * C * d / np.linalg.norm(d)),
    )


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


@pytest.fixture
def ledger(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A ledger whose individuals are the test's ``unit`` (row when it has none):
    a column release is refused on a row ledger (no conversion between the two)."""
    path = tmp_path / "ledger.json"
    params = getattr(request.node, "callspec", None)
    unit = params.params.get("unit", "row") if params is not None else "row"
    Ledger.create(path, dataset="hostile", epsilon=100.0, delta=1e-3, unit=unit)
    return path


def assert_release(U: np.ndarray, V: np.ndarray | None, S: np.ndarray | None) -> None:
    """Finite factors with orthonormal columns (round-off of a QR/SVD of size <= 60)."""
    for X in (U, V):
        if X is None:
            continue
        assert np.isfinite(X).all()
        np.testing.assert_allclose(X.T @ X, np.eye(X.shape[1]), rtol=0, atol=1e-12)
    if S is not None:  # singular values; PCA passes its (noisy, signed) eigenvalues
        assert np.isfinite(S).all()
        assert V is None or (S >= 0).all()


def _charged_once(f: Any, ledger: Path, before: int) -> None:
    assert len(_records(ledger)) == before + 1
    assert f.report["ledger"]["n_releases"] == before + 1
    assert f.report["epsilon"] == 1.0  # seeded noise
    assert f.report["private"] is False


# -- case 1: units far above the clip norm ------------------------------------------
@pytest.mark.parametrize("mag", list(MAGNITUDES.values()), ids=list(MAGNITUDES))
@pytest.mark.parametrize("unit", ["row", "column", "entry"])
def test_far_above_clip_norm_is_clipped_within_sensitivity(
    unit: str, mag: float
) -> None:
    """Pre-noise: ||f(A') - f(A0)||_F <= sensitivity (A0: unit zeroed, add-remove),
    and f(A') == f(A clipped by hand): the unit is clipped to C, not zeroed.

    The sensitivity bound holds except with probability delta_JL (<= 1e-6) for a
    pair fixed before the sketch seed (spec 4.2); the equality is up to the
    (1 - 4 eps) margin of the clip factor and the peak scaling of rows whose
    squares overflow: a relative 1e-14, checked at 1e-9.
    """
    A = _matrix()
    hostile, by_hand = _hostile(A, unit, mag)
    zeroed = _with_unit(A, unit, 0.0)
    for alg in ("spectral", "low-space"):
        params = make_params(
            3, epsilon=1.0, delta=1e-6, algorithm=alg, clip_norm=C, unit=unit
        )
        plan = plan_lrf(params, (M, N))
        assert plan.calibration is not None
        request = pass_request(plan, 2024)
        f_h = ArraySource(hostile).sketch(request)
        f_0 = ArraySource(zeroed).sketch(request)
        f_c = ArraySource(by_hand).sketch(request)
        for s in plan.calibration.sketches:
            diff = float(np.linalg.norm(f_h[s.name] - f_0[s.name]))
            assert 0 < diff <= s.sensitivity, (alg, s.name, diff, s.sensitivity)
            np.testing.assert_allclose(f_h[s.name], f_c[s.name], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("unit", ["row", "column", "entry"])
def test_far_above_clip_norm_release_equals_the_clipped_release(
    unit: str, ledger: Path
) -> None:
    """End to end with seeded noise: the hostile matrix releases what the matrix with
    the unit clipped by hand releases (same sketch seed and noise seed), charged once
    each."""
    A = _matrix()
    hostile, by_hand = _hostile(A, unit, -1.7e308)
    kw: dict[str, Any] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "clip_norm": C,
        "unit": unit,
        "seed": 5,
        "insecure_noise_seed": 9,
        "ledger": ledger,
    }
    f = factorize(hostile, 3, **kw)
    _charged_once(f, ledger, 0)
    g = factorize(by_hand, 3, **kw)
    _charged_once(g, ledger, 1)
    assert_release(f.U, f.V, f.S)
    np.testing.assert_allclose(f.S, g.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(f.U, g.U, rtol=0, atol=1e-9)
    np.testing.assert_allclose(f.V, g.V, rtol=0, atol=1e-9)


@pytest.mark.parametrize("mag", list(MAGNITUDES.values()), ids=list(MAGNITUDES))
def test_pca_row_far_above_the_bound(mag: float, ledger: Path) -> None:
    """PCA divides rows by the public bound and clips them to norm 1: the pre-noise
    Gram moves by <= 2 (the declared 'paper' sensitivity, sqrt 2 exactly), and the
    release equals that of the row rescaled to norm 1 by hand."""
    A = _matrix()
    d = _direction(N)
    hostile = _with_unit(A, "row", mag * d)
    by_hand = _with_unit(A, "row", np.sign(mag) * d / np.linalg.norm(d))
    g_h = ArrayRowSource(hostile).gram().value
    g_a = ArrayRowSource(A).gram().value
    assert np.linalg.norm(g_h - g_a) <= np.sqrt(2)
    kw: dict[str, Any] = dict(
        epsilon=1.0, delta=1e-6, insecure_noise_seed=3, ledger=ledger, **PCA_KW
    )
    r = pca(hostile, 2, **kw)
    _charged_once(r, ledger, 0)
    s = pca(by_hand, 2, **kw)
    assert_release(r.components, None, r.eigenvalues)
    np.testing.assert_allclose(r.components, s.components, rtol=0, atol=1e-9)


# -- case 2: float limits, subnormals, negative zero --------------------------------
def _limits_matrix(dtype: type) -> np.ndarray:
    A = _matrix().astype(dtype)
    big = FMAX if dtype is np.float64 else F32MAX
    A[0] = big
    A[1] = -big
    A[2, ::2], A[2, 1::2] = big, -big
    A[3] = TINY if dtype is np.float64 else np.finfo(np.float32).smallest_subnormal
    A[4] = -0.0
    A[:, 7] = big  # a column at the float limit too (for --unit column)
    return A


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("unit", ["row", "column", "entry"])
def test_float_limits_subnormals_and_negative_zero(
    unit: str, dtype: type, ledger: Path
) -> None:
    A = _limits_matrix(dtype)
    for before, alg in enumerate(("spectral", "low-space", "two-pass")):
        f = factorize(
            A,
            3,
            epsilon=1.0,
            delta=1e-6,
            algorithm=alg,
            clip_norm=C,
            unit=unit,
            insecure_noise_seed=1,
            ledger=ledger,
        )
        _charged_once(f, ledger, before)
        assert_release(f.U, f.V, f.S)
    # pre-noise: every unit is within C, so any unit zeroed moves a sketch by <= sensitivity
    params = make_params(
        3, epsilon=1.0, delta=1e-6, clip_norm=C, unit=unit, algorithm="spectral"
    )
    plan = plan_lrf(params, (M, N))
    assert plan.calibration is not None
    request = pass_request(plan, 99)
    f_a = ArraySource(A).sketch(request)
    f_0 = ArraySource(_with_unit(A.astype(np.float64), unit, 0.0)).sketch(request)
    for s in plan.calibration.sketches:
        assert np.isfinite(f_a[s.name]).all()
        assert float(np.linalg.norm(f_a[s.name] - f_0[s.name])) <= s.sensitivity


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pca_float_limits(dtype: type, ledger: Path) -> None:
    r = pca(_limits_matrix(dtype), 2, epsilon=1.0, delta=1e-6, ledger=ledger, **PCA_KW)
    assert_release(r.components, None, r.eigenvalues)
    assert len(_records(ledger)) == 1


def test_subnormal_and_negative_zero_rows_release_like_zero_rows() -> None:
    """5e-324 and -0.0 rows are (nearly) zero rows: same release as exact zeros."""
    A = _matrix()
    odd = A.copy()
    odd[3], odd[4] = TINY, -0.0
    zero = A.copy()
    zero[3], zero[4] = 0.0, 0.0
    kw: dict[str, Any] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "seed": 3,
        "insecure_noise_seed": 4,
    }
    f, g = factorize(odd, 3, **kw), factorize(zero, 3, **kw)
    np.testing.assert_allclose(f.U, g.U, rtol=0, atol=1e-12)
    np.testing.assert_allclose(f.S, g.S, rtol=1e-12, atol=0)


# -- case 3: NaN and Inf ------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("unit", ["row", "column", "entry"])
def test_factorize_treats_a_non_finite_unit_as_zero(
    unit: str, bad: float, ledger: Path
) -> None:
    """docs/privacy.md, "Non-finite values": the unit holding NaN/Inf is a zero
    unit, silently, for every algorithm (the default two-pass one in
    tests/hostile/test_non_finite_everywhere.py); the zeroed unit reaches the
    kernels as the same bytes, so the releases are equal bit for bit."""
    A = _matrix()
    A[6, 3] = 123456.789  # clipped like any value
    Z = _with_unit(A, unit, 0.0)
    A[5, 3] = bad
    for k, alg in enumerate(("spectral", "low-space")):
        kw: dict[str, Any] = {
            "epsilon": 1.0, "delta": 1e-6, "algorithm": alg, "unit": unit,
            "clip_norm": C, "seed": 3, "insecure_noise_seed": 8, "ledger": ledger,
        }
        f = factorize(A, 3, **kw)
        _charged_once(f, ledger, 2 * k)
        g = factorize(Z, 3, **kw)
        assert_release(f.U, f.V, f.S)
        for x, y in ((f.U, g.U), (f.S, g.S), (f.V, g.V)):
            np.testing.assert_array_equal(x, y)
        assert "123456" not in json.dumps(f.report)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
def test_pca_treats_a_non_finite_row_as_zero(bad: float, ledger: Path) -> None:
    """docs/privacy.md: a PCA row with NaN or Inf is a zero row, silently."""
    A = _matrix()
    A[5, 3] = bad
    Z = A.copy()
    Z[5] = 0.0
    kw: dict[str, Any] = dict(
        epsilon=1.0, delta=1e-6, insecure_noise_seed=8, ledger=ledger, **PCA_KW
    )
    r = pca(A, 2, **kw)
    _charged_once(r, ledger, 0)
    s = pca(Z, 2, **kw)
    assert_release(r.components, None, r.eigenvalues)
    np.testing.assert_array_equal(r.components, s.components)
    assert "nan" not in json.dumps(r.report).lower().replace("nanny", "")


# -- case 4: degenerate shapes and ranks --------------------------------------------
@pytest.mark.parametrize("alg", ["spectral", "low-space"])
def test_all_zero_matrix(alg: str, ledger: Path) -> None:
    Z = np.zeros((M, N))
    f = factorize(Z, 3, epsilon=1.0, delta=1e-6, algorithm=alg, ledger=ledger)
    _charged_once_private(f, ledger)
    assert_release(f.U, f.V, f.S)
    r = pca(Z, 3, epsilon=1.0, delta=1e-6, ledger=ledger, **PCA_KW)
    assert_release(r.components, None, r.eigenvalues)
    assert len(_records(ledger)) == 2


def _charged_once_private(f: Any, ledger: Path) -> None:
    assert len(_records(ledger)) == 1
    assert f.report["private"] is True
    assert f.report["ledger"]["n_releases"] == 1


@pytest.mark.parametrize(
    ("alg", "shape", "rank"),
    [
        ("spectral", (M, N), 1),
        ("spectral", (M, N), N - 1),  # k = min(m, n) - 1
        ("low-space", (M, N), 1),
        ("low-space", (M, N), N - 1),
        ("spectral", (N, M), N - 1),  # wide
        ("spectral", (N, N), N - 2),  # square Spectral: k <= min - 2 (_resolve_sizes)
        ("low-space", (N, N), N - 1),
    ],
)
def test_extreme_valid_ranks_release(
    alg: str, shape: tuple[int, int], rank: int
) -> None:
    A = np.random.default_rng(3).standard_normal(shape) / 5
    f = factorize(A, rank, epsilon=1.0, delta=1e-6, algorithm=alg)
    assert f.U.shape == (shape[0], rank)
    assert f.V.shape == (shape[1], rank)
    assert_release(f.U, f.V, f.S)


@pytest.mark.parametrize(
    ("alg", "shape", "rank", "phrase"),
    [
        ("spectral", (M, N), 0, "rank must be >= 1"),
        ("spectral", (M, N), -1, "rank must be >= 1"),
        ("low-space", (M, N), N, "got rank=20"),  # k = min(m, n)
        ("spectral", (M, N), 2.5, "rank must be an integer"),
        ("spectral", (M, N), "3", "rank must be an integer"),
        ("spectral", (N, N), N - 1, "min(n_rows, n_cols) - 2"),
        ("spectral", (1, N), 1, "[1, 0]"),  # a single row: no rank fits
        ("low-space", (M, 1), 1, "[1, 0]"),  # a single column
    ],
)
def test_invalid_ranks_and_shapes_are_refused(
    alg: str, shape: tuple[int, int], rank: Any, phrase: str, ledger: Path
) -> None:
    A = np.full(shape, 123456.789)
    before = ledger.read_bytes()
    with pytest.raises(InvalidParameterError) as info:
        factorize(A, rank, epsilon=1.0, delta=1e-6, algorithm=alg, ledger=ledger)
    assert phrase in str(info.value)
    assert "123456" not in str(info.value)
    assert ledger.read_bytes() == before


def test_pca_single_row_single_column_and_ranks(ledger: Path) -> None:
    """PCA needs 1 <= k <= d only: one row is a valid (if useless) input; one column is not."""
    r = pca(np.full((1, N), 3.0), 1, epsilon=1.0, delta=1e-6, ledger=ledger, **PCA_KW)
    assert_release(r.components, None, r.eigenvalues)
    r = pca(_matrix(), N - 1, epsilon=1.0, delta=1e-6, ledger=ledger, **PCA_KW)
    assert r.components.shape == (N, N - 1)
    assert_release(r.components, None, r.eigenvalues)
    assert len(_records(ledger)) == 2
    before = ledger.read_bytes()
    for shape, rank, phrase in [
        ((M, 1), 1, "at least 2 columns"),
        ((M, N), 0, "rank must be in [1, n_features] = [1, 20]"),
        ((M, N), N + 1, "rank must be in [1, n_features] = [1, 20]"),
        ((M, N), -3, "rank must be in [1, n_features] = [1, 20]"),
        ((M, N), 1.5, "rank must be an integer"),
    ]:
        with pytest.raises(InvalidParameterError) as info:
            pca(
                np.full(shape, 123456.789),
                rank,
                epsilon=1.0,
                delta=1e-6,
                ledger=ledger,
                **PCA_KW,
            )
        assert phrase in str(info.value)
        assert "123456" not in str(info.value)
    assert ledger.read_bytes() == before
