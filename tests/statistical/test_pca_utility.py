"""Utility of private PCA on data with controlled coherence (spec power-pca 5.4: S1, S2, S5, S7).

The data are the spec's S-A matrices (Appendix B generator,
:func:`pipeline.linalg.synthetic.coherent_matrix`): ``n = 2^16``, ``d = 64``,
``k = 2``, ``sigma_k^2 = s = 400``, ``sigma_{k+1}^2 = ... = b = 100``, with ``U_k``
spread over all rows (incoherent) or over 2048 rows (coherent). Errors are
``sin theta_max(X, V_k)`` against the exact ``V_k``. ``R`` is a multiple of the
oracle ``rho_U = max_i ||e_i^T U_k||`` (public here: the data are synthetic).

Everything is seeded: the data from ``global_seed``, the noise from insecure
keys derived from it (S7's end-to-end runs use fixed keys, see there), so every
check is deterministic for a given seed. The thresholds are not p-values: each
assertion compares medians over 3 noise draws with a bound taken from the spec
(section 5.4 and its reference table) or from a theorem, and each docstring
states the range measured over a sweep of seeds 0-19 (every measured value
is at least 10% inside its bound). Runs are in memory (numpy sources) with
single-threaded BLAS (spec 4.8; it also keeps a shared 2-core machine from
thrashing). About 20 s on 2 quiet cores.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from pipeline.accounting.pca import calibrate_selection
from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import (
    ArrayRowSource,
    MemoryJournal,
    plan_pca,
    prep_rows,
    qr_pos,
    run_pca,
    run_selection,
    sym,
    topk_eig,
)
from pipeline.algorithms.pca import selection as pca_select_run
from pipeline.api import pca
from pipeline.linalg.metrics import sin_theta
from pipeline.linalg.synthetic import CoherentMatrix, coherent_matrix
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
from pipeline.params import PcaParams

pytestmark = pytest.mark.statistical

N_ROWS, N_COLS, RANK = 2**16, 64, 2
DELTA = 1e-6
#: S-A (spec 5.4): s = 400, b = 100, coherent support 2048.
TOP, BOTTOM, COHERENT_SUPPORT = 400.0, 100.0, 2048
N_NOISE_DRAWS = 3


@pytest.fixture(autouse=True, scope="module")
def _single_threaded_blas() -> Iterator[None]:
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@functools.lru_cache(maxsize=4)
def sa_data(
    seed: int, support: int, top: float = TOP, bottom: float = BOTTOM
) -> CoherentMatrix:
    """An S-A matrix; the same seed gives the same matrix (cached across tests)."""
    return coherent_matrix(
        N_ROWS,
        N_COLS,
        RANK,
        support=support,
        top=top,
        bottom=bottom,
        rng=[seed, support, int(top), int(bottom)],
    )


def noise_seeds(seed: int) -> list[int]:
    return [1000 * seed + j for j in range(N_NOISE_DRAWS)]


_RUNS: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}


DataKey = tuple[int, int, float, float]


def sa_key(
    seed: int, support: int, top: float = TOP, bottom: float = BOTTOM
) -> DataKey:
    return (seed, support, top, bottom)


def run_error(
    data_key: DataKey,
    noise_seed: int,
    *,
    method: str,
    epsilon: float,
    accounting: str = "gdp",
    radius_factor: float = 2.0,
    iterations: int = 3,
) -> tuple[float, dict[str, Any]]:
    """``sin theta`` of one in-memory release and its report (memoised per module)."""
    data = sa_data(*data_key)
    key = (
        data_key,
        noise_seed,
        method,
        epsilon,
        accounting,
        radius_factor if method == "power" else None,
        iterations if method == "power" else None,
    )
    if key not in _RUNS:
        kw: dict[str, Any] = {}
        if method == "power":
            kw = {
                "iterations": iterations,
                "clip_radius": radius_factor * data.row_coherence,
            }
        rel = pca(
            data.A,
            RANK,
            epsilon=epsilon,
            delta=DELTA,
            method=method,
            accounting=accounting,
            insecure_noise_seed=noise_seed,
            **kw,
        )
        _RUNS[key] = (sin_theta(rel.components, data.Vk), rel.report)
    return _RUNS[key]


def median_error(data_key: DataKey, seed: int, **kw: Any) -> float:
    return float(
        np.median([run_error(data_key, s, **kw)[0] for s in noise_seeds(seed)])
    )


def ratios(seed: int, epsilon: float, accounting: str) -> dict[str, float]:
    """Medians of err_PM (R = 2 rho_U, T = 3) and err_AG on both data sets, and their ratios."""
    out: dict[str, float] = {}
    for name, support in (("inc", N_ROWS), ("coh", COHERENT_SUPPORT)):
        data = sa_key(seed, support)
        # the baseline is always Analyze Gauss with the exact (GDP) calibration
        ag = median_error(data, seed, method="analyze-gauss", epsilon=epsilon)
        pm = median_error(
            data, seed, method="power", epsilon=epsilon, accounting=accounting
        )
        out |= {f"ag_{name}": ag, f"pm_{name}": pm, f"r_{name}": pm / ag}
    return out


# ------------------------------------------------------------------ S1, S2
def test_s1_power_method_gains_only_on_incoherent_data(global_seed: int) -> None:
    """S1, the paper's central claim in relative form, on S-A at epsilon = 4, T = 3, R = 2 rho_U.

    ``(err_PM / err_AG)|incoherent < (1/3) (err_PM / err_AG)|coherent``. Spec table:
    0.038-0.041 / 0.043 against 0.21-0.22 / 0.048, ratio of ratios 0.2; measured
    here (seeds 0-19): 0.15-0.20. Analyze Gauss adds isotropic noise, so its
    error does not depend on the coherence (spec table 0.043 vs 0.048; measured
    ratio coherent/incoherent 0.86-1.12): the contrast is the power method's,
    asserted with the margin [2/3, 3/2].
    """
    r = ratios(global_seed, 4.0, "gdp")
    assert r["r_inc"] < r["r_coh"] / 3, r
    assert 2 / 3 < r["ag_coh"] / r["ag_inc"] < 3 / 2, r


def test_s2_the_check_fails_with_the_papers_calibration(global_seed: int) -> None:
    """S2, the negative control of S1: the same check fails with ``accounting="paper"``.

    [P]'s constants put ~30x more noise on every iteration (spec 3.4), so the
    power method returns noise (sin theta ~ 1) on both data sets and the ratio of
    ratios is ~1 instead of < 1/3. The paper calibration needs ``epsilon/2 <= 1``
    (classical Gaussian mechanism), so both calibrations run at epsilon = 2;
    the GDP run passes the S1 check there too (measured ratio of ratios
    0.18-0.24 over seeds 0-19; threshold 1/3), so only the calibration differs
    between pass and fail; with the paper calibration it is 0.86-1.10. PM
    errors with the paper calibration: 0.99-1.00 measured, asserted > 0.9
    (spec table: "~1.0 (fails)").
    """
    gdp = ratios(global_seed, 2.0, "gdp")
    paper = ratios(global_seed, 2.0, "paper")
    assert gdp["r_inc"] < gdp["r_coh"] / 3, gdp
    assert paper["r_inc"] > paper["r_coh"] / 3, paper
    assert min(paper["pm_inc"], paper["pm_coh"]) > 0.9, paper


# ------------------------------------------------------------------ S5
def test_s5_noise_free_rate_is_sigma_ratio_independent_of_coherence(
    global_seed: int,
) -> None:
    """S5 without noise: ``tan theta`` shrinks by exactly ``b / s`` per iteration.

    Lemma 19 without noise: ``E_{t+1} = Sigma_{>k}^2 E_t Sigma_k^{-2}``. With
    ``sigma_1 = sigma_2`` (``head_ratio = 1``) and a flat tail this is
    ``E_{t+1} = (b/s) E_t``, so ``tan theta_t = ||E_t||`` decays at exactly
    ``b/s = 0.25`` per step, whatever the coherence (``rtol = 1e-6``: round-off on
    ``tan theta >= 1e-6``). The start is the top-k eigenvectors of ``A^T A + W``
    (``||W||`` about a quarter of the gap), recorded as the released ``M`` in a
    journal: without noise ``X0`` would already be ``V_k``. n = 2^15 keeps the
    S-A spectrum with row norms <= 1.
    """
    n, T = 2**15, 8
    rate = BOTTOM / TOP
    rng = np.random.default_rng([global_seed, 5])
    G = rng.standard_normal((N_COLS, N_COLS))
    plan = plan_pca(PcaParams(rank=RANK, iterations=T, private=False), (n, N_COLS))
    for support in (n, COHERENT_SUPPORT):
        data = coherent_matrix(
            n,
            N_COLS,
            RANK,
            support=support,
            top=TOP,
            bottom=BOTTOM,
            head_ratio=1.0,
            rng=[global_seed, support],
        )
        # ||sym(G)|| ~ sqrt(2d) = 11.3, so ||W|| ~ 0.25 (s - b)
        W = 0.25 * (TOP - BOTTOM) / math.sqrt(2 * N_COLS) * sym(G)
        journal = MemoryJournal()
        journal.record("M", sym(data.A.T @ data.A) + W)
        res = run_pca(
            ArrayRowSource(data.A, clip=False),
            plan,
            ReleaseHooks(noise_key=None, journal=journal),
        )
        s = np.array([sin_theta(X, data.Vk) for X in res.history])
        tan = s / np.sqrt(1.0 - s**2)
        assert s[0] > 0.02, s  # a real warm start (measured 0.11-0.15)
        np.testing.assert_allclose(tan[1:] / tan[:-1], rate, rtol=1e-6, atol=0)


def test_s5_noise_floor_scales_with_radius_and_noise(global_seed: int) -> None:
    """S5 with noise: after the warm start has decayed, the error is a floor ~ Delta_Z R.

    Incoherent S-A, epsilon = 4. (a) Doubling ``R`` from 2 to 4 rho_U (T = 3)
    doubles the error: measured ratio 1.975-2.025 (seeds 0-19), asserted in
    [1.7, 2.3]. (b) ``T = 8`` instead of 3 at ``R = 2 rho_U`` raises the
    per-iteration ``Delta_Z`` by sqrt(8/3) (GDP budget split evenly over
    iterations) and the error by the same factor: measured error ratio / noise
    ratio 0.89-1.12, asserted in [0.75, 1.33] (which excludes both "no change",
    0.61, and "error linear in T", 1.63). After T = 3 iterations the
    warm-start error (~0.04) has shrunk by (b/s)^3 = 1/64, so the floor
    dominates.
    """
    data = sa_key(global_seed, N_ROWS)
    e2 = median_error(data, global_seed, method="power", epsilon=4.0)
    e4 = median_error(data, global_seed, method="power", epsilon=4.0, radius_factor=4.0)
    e8 = median_error(data, global_seed, method="power", epsilon=4.0, iterations=8)
    assert 1.7 < e4 / e2 < 2.3, (e2, e4)

    def sigma_z(T: int) -> float:
        rep = run_error(
            data, noise_seeds(global_seed)[0], method="power", epsilon=4.0, iterations=T
        )[1]
        (z,) = [m for m in rep["mechanisms"] if m["label"] == "Z"]
        return float(z["sigma"])

    noise_ratio = sigma_z(8) / sigma_z(3)
    np.testing.assert_allclose(noise_ratio, math.sqrt(8 / 3), rtol=1e-6, atol=0)
    assert 0.75 < (e8 / e2) / noise_ratio < 1.33, (e2, e8, noise_ratio)


# ------------------------------------------------------------------ S7
#: S7 data: incoherent S-A shape with a gap large enough for the warm-start test
#: (h > 0) under the selection's noise at epsilon = 4.
S7_TOP, S7_BOTTOM, S7_EPS = 3000.0, 300.0, 4.0
S7_RADIUS_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
S7_ITERATIONS = (1, 2, 4, 8)
#: E[N] = 2m for the m = 24 grid points (the API default is 4m; [P]'s 8m/beta).
S7_EXPECTED_TRIALS = 48.0
#: Fixed noise keys of the end-to-end runs (see the test's docstring).
S7_KEYS = (1, 2, 3, 4, 5)


def s7_grids() -> tuple[tuple[float, ...], tuple[int, ...]]:
    rho = math.sqrt(RANK / N_ROWS)  # rho_U of every incoherent S-A matrix
    return tuple(f * rho for f in S7_RADIUS_FACTORS), S7_ITERATIONS


@functools.lru_cache(maxsize=1)
def s7_calibration(epsilon: float) -> Any:
    """The selection's calibration, exactly as ``pca(select=True, ...)`` computes it."""
    radii, grid = s7_grids()
    return calibrate_selection(
        PcaParams(rank=RANK, epsilon=epsilon, delta=DELTA),
        n_rows=N_ROWS,
        n_features=N_COLS,
        radii=radii,
        iteration_grid=grid,
        expected_trials=S7_EXPECTED_TRIALS,
    )


def grid_errors(
    data: CoherentMatrix, cal: Any, noise_seed: int
) -> tuple[np.ndarray, float]:
    """Error of one trial at every grid point, with the selection's own noise.

    Runs the selection with its trial draw replaced by "every grid point once",
    from the shared warm start, and reads each trial's last released ``Z`` from
    the journal (the trusted zone; a test may look). Returns the errors, shape
    (radii, iterations), and the error of the trial the noisy scores selected.
    """
    radii, grid = cal.radii, cal.iteration_grid
    points = [(j, ell) for ell in range(len(grid)) for j in range(len(radii))]
    journal = MemoryJournal()
    # the selection run lives in pipeline.algorithms.pca.selection
    with mock.patch.object(pca_select_run, "_draw_trials", return_value=list(points)):
        res = run_selection(
            ArrayRowSource(data.A),
            cal,
            ReleaseHooks(noise_key=NoiseKey.insecure_from_seed(noise_seed), journal=journal),
        )
    assert res.iterations > 0  # the warm-start test passed, trials ran
    errs = np.empty((len(radii), len(grid)))
    for i, (j, ell) in enumerate(points):
        Z = journal.load(f"Z{i}_{grid[ell] - 1}")
        assert Z is not None
        errs[j, ell] = sin_theta(qr_pos(Z), data.Vk)
    return errs, sin_theta(res.components, data.Vk)


def test_s7_selection_is_within_2x_of_the_best_grid_point(global_seed: int) -> None:
    """S7: private selection of (R, T) lands within 2x of the best grid point in >= 80% of runs.

    Incoherent data, s = 3000, b = 300 (score gap h ~ 2300 > 0), epsilon = 4,
    grids R in rho_U x {1/4, ..., 8}, T in {1, 2, 4, 8}, E[N] = 48 trials.

    *Best grid point*: one trial at every grid point (same calibration, an
    independent noise draw), smallest error. It is T = 1 with R <= rho_U in
    every seed of the sweep (0-19): the selection's noise grows like sqrt(T).
    (a) With every grid point present, the noisy scores select a trial within
    2x of the best (measured ratio 1.0-1.44).
    (b) End to end (:func:`run_selection`, random stopping) with 5 noise keys:
    within 2x in >= 4 of 5 (measured: 5 of 5 in every seed, ratios 0.93-1.52).
    A run fails mainly when none of its N trials hits the ~1/4 of the grid
    that is within 2x, with probability
    ``E[(3/4)^N] = theta (3/4) / (1 - (1 - theta) (3/4)) = 5.9%`` at
    ``theta = 1/48``. With 40 random keys on one data set, 3 of 40 runs were
    above 2x; at E[N] = 16 (probability 16%) 11 of 40 were, so the spec's 80%
    needs E[N] of about 2m. The trial draw comes from the key alone, before
    any data is read (spec 4.6), so the keys are fixed (1-5, not chosen by
    result) rather than derived from ``global_seed``: the data-independent
    lottery is the same for every seed and the sweep varies the data. One
    calibration is shared; the API
    path is exercised by the h <= 0 test below.
    """
    data = sa_data(global_seed, N_ROWS, S7_TOP, S7_BOTTOM)
    cal = s7_calibration(S7_EPS)
    errs, full_grid_winner = grid_errors(data, cal, 1000 * global_seed + 9)
    best = float(errs.min())
    assert full_grid_winner <= 2.0 * best, (full_grid_winner, errs)
    rows = []
    for key in S7_KEYS:
        res = run_selection(
            ArrayRowSource(data.A),
            cal,
            ReleaseHooks(noise_key=NoiseKey.insecure_from_seed(key)),
        )
        assert res.iterations in cal.iteration_grid
        assert res.gap > 0
        selected = sin_theta(res.components, data.Vk)
        rows.append((selected, selected / best))
    good = sum(ratio <= 2.0 for _, ratio in rows)
    assert good >= math.ceil(0.8 * len(S7_KEYS)), (best, rows)


def test_s7_small_gap_returns_the_analyze_gauss_estimate(global_seed: int) -> None:
    """S7, h <= 0: the selection stops after the warm start and returns X0.

    S-A (gap s - b = 300) at epsilon = 2 with the S7 grids: the selection's
    ``noise_init`` (~15) makes ``eps_w = noise_init (2 sqrt(d) + ...) ~ 290``, so
    ``h = lam_k - lam_{k+1} - 2 eps_w`` is far below 0 (measured -470 to -510).
    Checked through :func:`pipeline.api.pca`: the public report says the test
    failed and T = 0, and the components are exactly the top-k eigenvectors of
    the released ``M`` (rebuilt here from the documented keyed noise stream).
    """
    data = sa_data(global_seed, N_ROWS)
    radii, grid = s7_grids()
    seed = noise_seeds(global_seed)[0]
    rel = pca(
        data.A,
        RANK,
        epsilon=2.0,
        delta=DELTA,
        select=True,
        radius_grid=radii,
        iterations_grid=grid,
        expected_trials=S7_EXPECTED_TRIALS,
        insecure_noise_seed=seed,
    )
    sel = rel.report["selection"]
    assert sel["warm_start_gap_test_passed"] is False, sel
    assert sel["selected_iterations"] == 0, sel
    assert sel["score_gap"] <= 0, sel
    assert rel.report["parameters"]["iterations"] == 0
    # X0 = top-k eigenvectors of M = A^T A + noise_init sym(G_M) (spec 2.1, 4.8)
    key = NoiseKey.insecure_from_seed(seed).derive("pca", "M")
    G = GaussianNoise(key=key, sigma=1.0, length=N_COLS, dim=N_COLS).dense()
    a = prep_rows(data.A)
    M = sym(a.T @ a) + rel.report["calibration"]["noise_init"] * sym(G)
    X0 = topk_eig(M, RANK)[0]
    np.testing.assert_allclose(
        np.linalg.norm(X0 - rel.components @ (rel.components.T @ X0), 2),
        0.0,
        rtol=0,
        atol=1e-8,  # same sums up to round-off; the eigengap of M is ~1e2
    )
