"""``benchmarks/bench_utility.py``: its quick run, its yardstick, and the floor on its ratios.

The benchmark compares each private factorization's additive spectral error with
that of the full-matrix Gaussian mechanism (full GM). Where the comparison means
something (``err_GM < sigma_1``) a ratio far below 1 would mean a bug, because:

* to first order in the noise, the full GM's error is the norm of its noise
  along the top-k right singular directions, ``||N V_k||``, an m x k Gaussian
  matrix of norm about ``s Delta_F (sqrt(m) + sqrt(k))`` (Gordon's bound;
  checked below within 20%, which also catches a mis-scaled yardstick);
* every algorithm releases its left factor through a sketch of the range with
  noise of standard deviation ``Delta_i s / sqrt(w_i) >= Delta_F s`` (each sketch
  gets a share ``w_i <= 1`` of the budget, at a sensitivity ``Delta_i >= Delta_F``),
  so its error carries the same term, less what post-processing with public
  values can remove: the two-pass release subtracts the noise's known energy
  ``m sigma_Y^2`` from its squared singular values, which the full GM does not.

The best case of that argument is an oracle that knows ``V_k`` exactly, spends
the whole budget on ``A V_k + N`` (m x k) and releases the same debiased singular
values (``pipeline.algorithms.lrf.two_pass.debiased_singular_values``): it scores
0.62-0.86 of the full GM on the quick grid's in-regime cells (0.83-0.95 without
the debiasing; ``test_exact_vk_oracle_clears_the_floor``). ``RATIO_FLOOR = 0.5``
sits below it, with room for the spread of a median of 3 draws; a release without
noise scores far below it (0.06, ``test_floor_catches_a_release_without_noise``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.accounting.gaussian import gaussian_noise_multiplier
from pipeline.algorithms.lrf.two_pass import debiased_singular_values

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_utility.py"
RATIO_FLOOR = 0.5
#: first-order model of the full GM's error (module docstring), relative band
GM_MODEL_BAND = (0.8, 1.2)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_utility", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("utility")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--results", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads((out / "utility_quick.json").read_text())


def test_quick_run_writes_table_json_and_plot(quick):
    out, res = quick
    assert res["benchmark"] == "bench_utility"
    assert {"machine", "versions", "params", "command", "cells"} <= set(res)
    p = res["params"]
    assert p["draws"] >= 3
    algs = res["algorithms"]
    assert {"spectral", "low-space"} <= set(algs)
    assert set(algs) | set(res["skipped"]) == {"spectral", "low-space", "two-pass"}
    n_cells = len(p["spectra"]) * len(p["units"]) * len(p["epsilons"])
    assert len(res["cells"]) == n_cells
    for c in res["cells"]:
        assert len(c["gm"]["errors"]) == p["draws"]
        assert set(c["algorithms"]) == set(algs)
        for a in algs:
            r = c["algorithms"][a]
            assert len(r["errors"]) == p["draws"]
            assert r["ratio"] == pytest.approx(r["median"] / c["gm"]["median"])
        # clipping inactive (and tight): the comparison measures noise, not clipping
        bound = c["max_row_norm"] if c["unit"] == "row" else c["max_abs_entry"]
        assert bound == pytest.approx(p["clip_norm"], rel=1e-12)
    md = (out / "utility_quick.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith(("| decaying", "| low-rank"))]
    assert len(rows) == n_cells
    header = next(ln for ln in md.splitlines() if ln.startswith("| spectrum"))
    assert all(f" {a} |" in header for a in algs)
    assert (out / "utility_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_ratios_above_the_floor_in_the_regime(quick):
    _, res = quick
    inside = [c for c in res["cells"] if c["in_regime"]]
    assert inside, "the quick grid must contain cells with err_GM < sigma_1"
    for c in inside:
        for a, r in c["algorithms"].items():
            assert r["ratio"] >= RATIO_FLOOR, (
                c["spectrum"],
                c["unit"],
                c["epsilon"],
                a,
            )


def test_full_gm_error_matches_its_first_order_model(quick):
    _, res = quick
    p = res["params"]
    for c in (c for c in res["cells"] if c["in_regime"]):
        s = gaussian_noise_multiplier(c["epsilon"], p["delta"])
        model = s * p["clip_norm"] * (math.sqrt(c["m"]) + math.sqrt(c["rank"]))
        assert GM_MODEL_BAND[0] <= c["gm"]["median"] / model <= GM_MODEL_BAND[1]


def test_exact_vk_oracle_clears_the_floor(quick):
    """The floor does not reject the best case of its own argument (module docstring)."""
    B = _bench()
    _, res = quick
    p = res["params"]
    for c in (c for c in res["cells"] if c["in_regime"]):
        m, n, k = c["m"], c["n"], c["rank"]
        key = B.matrix_key(p["seed"], c["spectrum"], c["unit"])
        A = B.make_matrix(
            c["spectrum"],
            c["unit"],
            m,
            n,
            k,
            p["clip_norm"],
            np.random.default_rng(key),
        )
        _, sig, Vt = np.linalg.svd(A, full_matrices=False)
        Vk, resid, rng = Vt[:k].T, B.Residual(A), np.random.default_rng(7)
        errs = []
        for _ in range(p["draws"]):
            Y = A @ Vk + c["gm_noise_std"] * rng.standard_normal((m, k))
            Uy, Sy, Wt = np.linalg.svd(Y, full_matrices=False)
            Sd = debiased_singular_values(Sy, m, c["gm_noise_std"])
            errs.append(resid(Uy, Sd, Vk @ Wt.T) - sig[k])
        oracle = float(np.median(errs)) / c["gm"]["median"]
        assert RATIO_FLOOR < oracle < 1.0, (c["spectrum"], c["unit"], c["epsilon"])


def test_residual_and_full_gm_are_exact():
    """The Gram shortcuts equal the direct computations (rounding only)."""
    B = _bench()
    rng = np.random.default_rng(0)
    A = rng.standard_normal((300, 40))
    U = rng.standard_normal((300, 4))  # not orthonormal on purpose
    S, V = rng.random(4) + 0.5, rng.standard_normal((40, 4))
    direct = np.linalg.norm(A - (U * S) @ V.T, 2)
    assert B.Residual(A)(U, S, V) == pytest.approx(direct, rel=1e-10)
    Ug, Sg, Vg = B.full_gm(A, 4, 0.3, np.random.default_rng(5))
    X = A + 0.3 * np.random.default_rng(5).standard_normal(A.shape)
    Ux, Sx, Vtx = np.linalg.svd(X, full_matrices=False)
    np.testing.assert_allclose(Sg, Sx[:4], rtol=1e-10)
    np.testing.assert_allclose(
        (Ug * Sg) @ Vg.T, (Ux[:, :4] * Sx[:4]) @ Vtx[:4], atol=1e-9
    )


def test_floor_catches_a_release_without_noise(monkeypatch):
    """Negative controls: a noise-free release falls below the floor, and a full GM
    with twice the noise leaves the band of its first-order model."""
    from pipeline.api import factorize

    B = _bench()
    args = B.parse_args(["--quick"])
    m, n, k, eps = args.rows, args.cols, 5, 4.0
    A = B.make_matrix("low-rank", "entry", m, n, k, 1.0, np.random.default_rng(1))
    sigma = np.linalg.svd(A, compute_uv=False)

    def no_noise(A, k, eps, args, unit, alg, j):
        return factorize(A, k, private=False, algorithm=alg), 0.0

    monkeypatch.setattr(B, "run_algorithm", no_noise)
    cell = B.run_cell(
        B.Residual(A),
        sigma,
        k,
        eps,
        "entry",
        ["spectral"],
        args,
        np.random.default_rng(2),
    )
    assert cell["in_regime"]
    assert cell["algorithms"]["spectral"]["ratio"] < RATIO_FLOOR

    s = gaussian_noise_multiplier(eps, args.delta)
    model = s * (math.sqrt(m) + math.sqrt(k))
    U, S, V = B.full_gm(A, k, 2 * s, np.random.default_rng(3))
    assert (B.Residual(A)(U, S, V) - sigma[k]) / model > GM_MODEL_BAND[1]


def test_sketch_size_option_reaches_the_one_pass_releases_only(tmp_path):
    """``--sketch-size`` (the speed/utility trade-off) sets t of the one-pass releases,
    ``--core-size`` v of every release, as their reports say; two-pass keeps t = k."""
    proc = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--quick", "--results", str(tmp_path),
            "--name", "sized", "--units", "entry", "--epsilons", "4",
            "--spectra", "low-rank", "--algorithms", "spectral", "two-pass",
            "--sketch-size", "20", "--core-size", "50", "--no-plot",
        ],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "sized.json").read_text())
    assert res["params"]["sketch_size"] == 20
    assert res["params"]["core_size"] == 50
    (cell,) = res["cells"]
    spectral, two_pass = cell["algorithms"]["spectral"], cell["algorithms"]["two-pass"]
    assert (spectral["t"], spectral["v"]) == (20, 50)
    # negative control: --sketch-size is not applied everywhere (two-pass: t = k)
    assert (two_pass["t"], two_pass["v"]) == (cell["rank"], 50)
    assert cell["rank"] != 20


def test_real_matrices_come_from_the_installed_data_with_tight_clipping(tmp_path):
    """``--real digits``: scikit-learn's digits as ``pca_real_data`` prepares them,
    scaled so that the largest row norm (row unit) is exactly C; the relative-error
    table of the real matrices is written."""
    proc = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--real", "digits", "--units", "row",
            "--epsilons", "16", "--algorithms", "two-pass", "--results", str(tmp_path),
            "--name", "real", "--no-plot", "--clip-norm", "2",
            "--workdir", str(tmp_path / "work"),  # not there yet, as on a clean checkout
        ],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "real.json").read_text())
    (cell,) = res["cells"]
    assert (cell["spectrum"], cell["m"], cell["n"]) == ("real:digits", 1797, 64)
    assert cell["max_row_norm"] == pytest.approx(2.0, rel=1e-12)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import pca_real_data
    finally:
        sys.path.remove(str(SCRIPT.parent))
    A = pca_real_data.load_real("digits")["A"]
    sigma_1 = float(np.linalg.svd(A, compute_uv=False)[0])
    # the same matrix, times C / (its largest row norm, 1): not a synthetic one
    assert cell["sigma_1"] == pytest.approx(2.0 * sigma_1, rel=1e-9)
    assert "Real matrices: additive error over sigma_k+1" in (tmp_path / "real.md").read_text()
    assert (tmp_path / "work" / "pca_real_digits.npy").exists()  # the cache was made
