"""Utility of the private factorizations against the full-matrix Gaussian mechanism.

Usage::

    python benchmarks/bench_utility.py            # default grid, about 5 min (1 BLAS thread)
    python benchmarks/bench_utility.py --quick    # tiny grid, a few seconds (a test runs it)

Results: ``benchmarks/results/utility.{md,json,png}`` (``utility_quick.*`` with
``--quick``; ``--results DIR`` and ``--name STEM`` write elsewhere).

**What is measured** [spec private-lrf-2, "Full GM"]. For one in-memory matrix A
(m x n, float64) and rank k, the additive spectral error of an estimate
``A_k_hat = U diag(S) V^T`` is

    err = ||A - A_k_hat||_2 - ||A - A_k||_2 = ||A - A_k_hat||_2 - sigma_{k+1},

computed exactly (``sqrt(lambda_max(R^T R))`` for the residual R; sigma from the
SVD of A). The yardstick is the full-matrix Gaussian mechanism ("full GM"):
release ``A + N`` with ``N_ij ~ N(0, (s(eps, delta) Delta_F)^2)``, ``s`` from
``pipeline.accounting.gaussian.gaussian_noise_multiplier`` (the analytic
calibration the package uses), ``Delta_F = C`` (add/remove) or ``2C`` (replace),
then the truncated rank-k SVD of the noisy matrix. Each algorithm runs through
the public API, ``pipeline.api.factorize(A, k, epsilon, delta, unit, algorithm)``
on the numpy array, with its default sizes and a fresh secret sketch seed per
call (a given seed would be public and calibrated for the worst case, which is
not the default path). Its noise comes from the secret CSPRNG unless
``--noise-seed B`` is given (then draw j uses ``insecure_noise_seed=B + j``; the
sketch operators stay secret, so results are reproducible only in distribution).
The matrices and the full GM's noise come from numpy's ``default_rng``, keyed by
``--seed`` and the cell (spectrum, unit; and epsilon for the noise), so a cell's
matrix and GM draws do not depend on the rest of the grid.

For each cell (spectrum, unit, eps) there are ``--draws`` (>= 3) independent
draws of every method on the SAME matrix. The reported ratio is
``median(err_alg) / median(err_GM)`` (the per-draw errors, the median of the
draw-by-draw ratios and their range are in the JSON). ``err_GM / sigma_1`` says
whether the cell is in the regime where the comparison means something
(``err_GM < sigma_1``); outside it, all estimates are mostly noise, and an
estimate that shrinks towards 0 (error ``sigma_1 - sigma_{k+1}``) can beat the
full GM for that reason alone.

**Matrices** (``make_matrix``): ``A = c * U diag(sigma) V^T`` with ``U`` a random
+-1/sqrt(m) sign matrix (so every row of ``U diag(sigma) V^T`` has exactly the
same norm when V is orthonormal: the row unit's signal is as large as clipping
allows) and ``V`` orthonormal (Haar) or, for the low-rank signal, +-1/sqrt(n)
signs (so the entry unit's signal is as large as |a_ij| <= C allows). Spectra:

* ``decaying``: ``sigma_i = 0.8^i``, i = 0..n-1; k = 8.
* ``flat-tail``: k strong values (1 down to 0.5) then a flat tail at 0.1; k = 8.
* ``low-rank``: a rank-5 signal (1, 0.8, 0.65, 0.5, 0.4) plus Gaussian noise of
  spectral norm about 5% of its sigma_5; k = 5.

``c`` makes clipping inactive and tight: the largest row norm is exactly C (row
unit) or the largest |a_ij| is exactly C (entry unit), C = ``--clip-norm`` = 1.
The sigma above are those of ``U diag(sigma) V^T`` before scaling (U is only
nearly orthonormal); the exact sigma_1 and sigma_{k+1} of A are reported.

**Row unit at C = 1.** Rows of norm <= 1 give sigma_1 <= sqrt(m), while the full GM's
error is about s(eps, delta) * sqrt(m) (the noise along the top-k right singular
directions). So ``err_GM < sigma_1`` needs ``s < 1``, i.e. eps above about 5 at
delta = 1e-6 (s(4, 1e-6) = 1.19, s(8, 1e-6) = 0.65): no row-unit cell of the
default grid is in that regime, whatever m and n. ``--epsilons`` extends the grid.

**Real matrices** (``--real source_bow digits``; ``k = --rank`` or 8): the matrices
of the private PCA benchmark, built from data installed on the machine
(``pca_real_data.py``: a bag of words of the installed Python sources,
115650 x 128, and scikit-learn's digits, 1797 x 64; columns centred, rows of
norm <= 1), scaled as above so that clipping is tight but inactive. Their rows
have norm about 1, so the full GM's error is about ``s (sqrt(m) + sqrt(k))``
against sigma_1 of 111 and 16: their cells reach the regime at larger epsilon
(``--epsilons 8 16 32 64``).

**A sparse real matrix** (``--real tfidf_docs``): TF-IDF of the text files
installed here (``sparse_real_data.py``: the .py/.rst/.md/.txt files of
site-packages in 200-line blocks, a 1000-term vocabulary; rows of norm 1; not
centred, which would densify it), kept as a scipy CSR matrix: the algorithms run
on it sparse (in memory, O(non-zeros) kernels), the yardstick and the exact
errors use it as it is (``A^T A``, ``A^T U``) and the full GM adds its noise to a
dense copy (the full GM is O(mn) by nature).

Algorithms not available in this version of the package (``Algorithm(name)``
raises) are skipped with a note. Nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common as C
import numpy as np
from scipy import sparse

DELTA = 1e-6
EPSILONS = (0.5, 1.0, 2.0, 4.0)
UNITS = ("row", "entry")
SPECTRA = ("decaying", "flat-tail", "low-rank")
ALGORITHMS = ("spectral", "low-space", "two-pass")
#: Real matrices (``--real``): their preparation is in ``pca_real_data.py`` and, for
#: the sparse one, ``sparse_real_data.py``.
REAL = ("source_bow", "digits", "tfidf_docs")
SPARSE_REAL = ("tfidf_docs",)
REAL_RANK = 8
#: Default rank per spectrum (--rank overrides all).
DEFAULT_RANK = {"decaying": 8, "flat-tail": 8, "low-rank": 5}
LOW_RANK_SIGMA = (1.0, 0.8, 0.65, 0.5, 0.4)
QUICK = {
    "rows": 2000,
    "cols": 100,
    "epsilons": (1.0, 4.0),
    "spectra": ("decaying", "low-rank"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows", type=int, default=None, help="m (default 20000; 2000 with --quick)"
    )
    p.add_argument(
        "--cols", type=int, default=None, help="n (default 600; 100 with --quick)"
    )
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="k for every spectrum (default per spectrum: 8, 8, 5)",
    )
    p.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=None,
        help="default 0.5 1 2 4 (1 4 with --quick)",
    )
    p.add_argument("--delta", type=float, default=DELTA)
    p.add_argument("--units", nargs="+", choices=UNITS, default=list(UNITS))
    p.add_argument("--spectra", nargs="+", choices=SPECTRA, default=None)
    p.add_argument(
        "--real",
        nargs="+",
        choices=REAL,
        default=None,
        help="real matrices from data installed here (pca_real_data.py) instead of the "
        "synthetic spectra (add --spectra to run both); k = --rank or 8",
    )
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    p.add_argument(
        "--draws", type=int, default=3, help="noise draws per method and cell (>= 3)"
    )
    p.add_argument("--clip-norm", type=float, default=1.0, help="C (default 1)")
    p.add_argument(
        "--neighboring", choices=("add-remove", "replace"), default="add-remove"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds the matrices and the full GM's noise"
    )
    p.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        help="insecure_noise_seed base for the algorithms (default: secret CSPRNG noise)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny grid (2000 x 100, eps 1 and 4, 2 spectra)",
    )
    p.add_argument(
        "--results", default=os.path.join(HERE, "results"), help="output directory"
    )
    p.add_argument(
        "--name",
        default=None,
        help="file stem (default utility; utility_quick with --quick)",
    )
    p.add_argument(
        "--sketch-size",
        type=int,
        default=None,
        help="t for the one-pass algorithms instead of their planned size (the speed/utility "
        "trade-off: a smaller t makes the pass cheaper and the release noisier)",
    )
    p.add_argument(
        "--core-size",
        type=int,
        default=None,
        help="v (the co-range sketch's rows) of every algorithm instead of its planned size",
    )
    p.add_argument(
        "--workdir",
        default=C.WORK,
        help="where the real matrices are cached (git-ignored; default benchmarks/work)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads (threadpoolctl; default 1: threaded BLAS thrashes on a shared machine)",
    )
    a = p.parse_args(argv)
    if a.draws < 3:
        p.error(
            "--draws must be at least 3 (the ratio is a median over draws); pass 3 or more."
        )
    a.rows = a.rows or (QUICK["rows"] if a.quick else 20000)
    a.cols = a.cols or (QUICK["cols"] if a.quick else 600)
    a.epsilons = tuple(a.epsilons or (QUICK["epsilons"] if a.quick else EPSILONS))
    a.real = tuple(a.real or ())
    if a.spectra is None:
        a.spectra = () if a.real else (QUICK["spectra"] if a.quick else SPECTRA)
    a.spectra = tuple(a.spectra)
    if a.rows < 2 * a.cols:
        p.error("--rows must be at least twice --cols (tall matrices); raise --rows.")
    return a


# -- matrices -------------------------------------------------------------------------
def _signs(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(0, 2, size=shape).astype(np.float64) * 2.0 - 1.0


def _haar(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    q, rr = np.linalg.qr(rng.standard_normal((n, r)))
    return q * np.sign(np.diag(rr))


def spectrum_sigma(spectrum: str, n: int, k: int) -> np.ndarray:
    """The designed singular values (before scaling) of a spectrum."""
    if spectrum == "decaying":
        return 0.8 ** np.arange(n, dtype=np.float64)
    if spectrum == "flat-tail":
        return np.concatenate([np.linspace(1.0, 0.5, k), np.full(n - k, 0.1)])
    if spectrum == "low-rank":
        return np.asarray(LOW_RANK_SIGMA)
    raise ValueError(
        f"unknown spectrum {spectrum!r}; choose one of {', '.join(SPECTRA)}."
    )


def make_matrix(
    spectrum: str,
    unit: str,
    m: int,
    n: int,
    k: int,
    clip: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """``c U diag(sigma) V^T`` (+ small noise for low-rank), scaled so clipping is tight but inactive."""
    sigma = spectrum_sigma(spectrum, n, k)
    r = sigma.size
    U = _signs(rng, (m, r)) / math.sqrt(m)
    if spectrum == "low-rank":
        V = _signs(rng, (n, r)) / math.sqrt(n)
        A = (U * sigma) @ V.T
        # spectral norm of an m x n standard Gaussian matrix ~ sqrt(m) + sqrt(n)
        tau = 0.05 * sigma[-1] / (math.sqrt(m) + math.sqrt(n))
        A += tau * rng.standard_normal((m, n))
    else:
        A = (U * sigma) @ _haar(rng, n, r).T
    if unit == "row":
        scale = float(np.sqrt(np.einsum("ij,ij->i", A, A)).max())
    else:
        scale = float(np.abs(A).max())
    A *= clip / scale
    return A


# -- errors and the yardstick ----------------------------------------------------------
class Residual:
    """``||A - U diag(S) V^T||_2`` exactly, for many estimates of one matrix.

    With ``G = A^T A`` computed once, ``R^T R = G - W - W^T + V S (U^T U) S V^T``
    for ``W = (A^T U) S V^T`` costs O(mnk + n^2 k) per estimate instead of O(mn^2);
    ``||R||_2 = sqrt(lambda_max(R^T R))``. No assumption on U (``U^T U`` is used
    as it is). Rounding: about 1e-16 * n * sigma_1^2 on the eigenvalue, far below
    every error measured here.
    """

    def __init__(self, A: Any) -> None:
        self.A = A
        G = A.T @ A
        self.G = G.toarray() if sparse.issparse(G) else G

    def __call__(self, U: Any, S: Any, V: Any) -> float:
        U, S, V = (np.asarray(x, dtype=np.float64) for x in (U, S, V))
        W = ((self.A.T @ U) * S) @ V.T
        VS = V * S
        M = self.G - W - W.T + VS @ (U.T @ U) @ VS.T
        lam = float(np.linalg.eigvalsh(M)[-1])
        return math.sqrt(max(lam, 0.0))


def full_gm(
    A: np.ndarray, k: int, noise_std: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k SVD of ``X = A + N``, ``N_ij ~ N(0, noise_std^2)``: the full-matrix Gaussian mechanism.

    Computed from the n x n Gram ``X^T X`` (its top-k eigenpairs give ``S`` and
    ``V``, then ``U = X V / S``), several times faster than an SVD of X for
    m >> n; the top k singular values here are far above ``eps_mach * sigma_1``,
    so squaring loses nothing that matters.
    """
    X = rng.standard_normal(A.shape)
    X *= noise_std
    if sparse.issparse(A):  # canonical CSR: one stored entry per cell
        coo = A.tocoo()
        X[coo.row, coo.col] += coo.data
    else:
        X += A
    lam, W = np.linalg.eigh(X.T @ X)
    lam, V = lam[::-1][:k], W[:, ::-1][:, :k]
    S = np.sqrt(np.maximum(lam, 0.0))
    return (X @ V) / S, S, V


def gm_noise_std(epsilon: float, delta: float, clip: float, neighboring: str) -> float:
    from pipeline.accounting.gaussian import gaussian_noise_multiplier

    delta_f = clip if neighboring == "add-remove" else 2.0 * clip
    return gaussian_noise_multiplier(epsilon, delta) * delta_f


def available_algorithms(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The names ``pipeline.algorithms.lrf.Algorithm`` knows, and a note for each other one."""
    from pipeline.params import Algorithm

    ok, skipped = [], {}
    for nm in names:
        try:
            Algorithm(nm)
        except ValueError:
            skipped[nm] = (
                "not in pipeline.algorithms.lrf.Algorithm in this version: skipped"
            )
        else:
            ok.append(nm)
    return ok, skipped


def run_algorithm(
    A: np.ndarray,
    k: int,
    eps: float,
    args: argparse.Namespace,
    unit: str,
    alg: str,
    j: int,
) -> tuple[Any, float]:
    from pipeline.api import factorize

    sizes = {"core_size": args.core_size}
    if alg != "two-pass":  # its range side is X V_k: t is k, not a size to choose
        sizes["sketch_size"] = args.sketch_size
    t0 = time.perf_counter()
    f = factorize(
        A,
        k,
        epsilon=eps,
        delta=args.delta,
        unit=unit,
        algorithm=alg,
        clip_norm=args.clip_norm,
        neighboring=args.neighboring,
        insecure_noise_seed=None if args.noise_seed is None else args.noise_seed + j,
        **sizes,
    )
    return f, time.perf_counter() - t0


# -- the grid ----------------------------------------------------------------------------
def run_cell(
    resid: Residual,
    sigma: np.ndarray,
    k: int,
    eps: float,
    unit: str,
    algs: list[str],
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Every method ``args.draws`` times on one matrix at one epsilon."""
    A, tail = resid.A, float(sigma[k])
    std = gm_noise_std(eps, args.delta, args.clip_norm, args.neighboring)
    gm = [resid(*full_gm(A, k, std, rng)) - tail for _ in range(args.draws)]
    gm_med = statistics.median(gm)
    cell: dict[str, Any] = {
        "epsilon": eps,
        "gm_noise_std": std,
        "gm": {"errors": gm, "median": gm_med},
        "gm_over_sigma1": gm_med / float(sigma[0]),
        "in_regime": gm_med < float(sigma[0]),
        "algorithms": {},
    }
    for alg in algs:
        errs, secs, meta = [], [], {}
        for j in range(args.draws):
            f, dt = run_algorithm(A, k, eps, args, unit, alg, j)
            errs.append(resid(f.U, f.S, f.V) - tail)
            secs.append(dt)
            meta = _release_meta(f.report)
        paired = [e / g for e, g in zip(errs, gm, strict=True)]
        cell["algorithms"][alg] = {
            "errors": errs,
            "median": statistics.median(errs),
            "ratio": statistics.median(errs) / gm_med,
            "paired_ratio": {
                "median": statistics.median(paired),
                "min": min(paired),
                "max": max(paired),
            },
            "seconds_median": statistics.median(secs),
            **meta,
        }
    return cell


def _release_meta(report: dict[str, Any]) -> dict[str, Any]:
    """Public parameters of one release, from its report (sizes, passes, budget split)."""
    par = report.get("parameters", {})
    cal = report.get("calibration", {})
    return {
        "t": par.get("sketch_size"),
        "v": par.get("core_size"),
        "operator": par.get("operator"),
        "n_passes": report.get("n_passes"),
        "sensitivity": report.get("sensitivity"),
        "weights": {s["name"]: s.get("weight") for s in cal.get("sketches", [])},
        "noise_floor_estimate": report.get("noise_floor_estimate"),
    }


def matrix_key(seed: int, spectrum: str, unit: str) -> list[int]:
    """Seed of one cell's matrix (its GM noise adds epsilon): keyed by the cell,
    not by the grid, so a cell is the same whatever else the run covers."""
    if spectrum.startswith("real:"):
        return [seed, 100 + REAL.index(spectrum[5:]), UNITS.index(unit)]
    return [seed, SPECTRA.index(spectrum), UNITS.index(unit)]


def real_matrix(name: str, unit: str, clip: float, workdir: str = C.WORK) -> Any:
    """A real matrix as ``pca_real_data.load_real`` prepares it (columns centred,
    rows of norm <= 1), or the sparse one of ``sparse_real_data`` (scipy CSR), scaled
    as :func:`make_matrix` scales: the largest row norm (row unit) or |a_ij| (entry
    unit) is exactly C, so clipping is tight but inactive."""
    if name in SPARSE_REAL:
        import sparse_real_data

        A = sparse_real_data.load_sparse_real(name, cache_dir=workdir)["A"]
    else:
        import pca_real_data

        A = pca_real_data.load_real(name, cache_dir=workdir)["A"]
    scale = max_row_norm(A) if unit == "row" else max_abs_entry(A)
    return A * (clip / scale)


def max_row_norm(A: Any) -> float:
    if sparse.issparse(A):
        return float(np.sqrt(np.asarray(A.multiply(A).sum(axis=1))).max())
    return float(np.sqrt(np.einsum("ij,ij->i", A, A)).max())


def max_abs_entry(A: Any) -> float:
    return float(abs(A).max())


def singular_values(A: Any) -> np.ndarray:
    """All singular values of A, non-increasing (a sparse A: from its n x n Gram)."""
    if not sparse.issparse(A):
        return np.linalg.svd(A, compute_uv=False)
    lam = np.linalg.eigvalsh((A.T @ A).toarray())[::-1]
    return np.sqrt(np.maximum(lam, 0.0))


def matrices(args: argparse.Namespace) -> Any:
    """``(label, k, unit, key, A)`` of every matrix of the grid, built one at a time."""
    for spectrum in args.spectra:
        k = args.rank or DEFAULT_RANK[spectrum]
        for unit in args.units:
            key = matrix_key(args.seed, spectrum, unit)
            rng = np.random.default_rng(key)
            A = make_matrix(spectrum, unit, args.rows, args.cols, k, args.clip_norm, rng)
            yield spectrum, k, unit, key, A
    for name in args.real:
        for unit in args.units:
            label = f"real:{name}"
            A = real_matrix(name, unit, args.clip_norm, args.workdir)
            yield label, args.rank or REAL_RANK, unit, matrix_key(args.seed, label, unit), A


def run_grid(
    args: argparse.Namespace, algs: list[str], log: Any = print
) -> list[dict[str, Any]]:
    cells = []
    for spectrum, k, unit, key, A in matrices(args):
        m, n = A.shape
        sigma = singular_values(A)
        resid = Residual(A)
        for eps in args.epsilons:
            t0 = time.perf_counter()
            gm_rng = np.random.default_rng([*key, round(1e6 * eps)])
            cell = run_cell(resid, sigma, k, eps, unit, algs, args, gm_rng)
            cell = {
                "spectrum": spectrum,
                "unit": unit,
                "m": m,
                "n": n,
                "rank": k,
                "sigma_1": float(sigma[0]),
                "sigma_k": float(sigma[k - 1]),
                "sigma_k+1": float(sigma[k]),
                "max_row_norm": max_row_norm(A),
                "max_abs_entry": max_abs_entry(A),
                "sparse_density": (
                    A.nnz / (m * n) if sparse.issparse(A) else None
                ),
                **cell,
            }
            cells.append(cell)
            rs = ", ".join(
                f"{a} {c['ratio']:.2f}" for a, c in cell["algorithms"].items()
            )
            log(
                f"{spectrum:9s} {m}x{n} {unit:5s} eps={eps:<4g} GM err/sigma_1 "
                f"{cell['gm_over_sigma1']:.2f}  ratios: {rs}  ({time.perf_counter() - t0:.1f} s)"
            )
    return cells


# -- output ------------------------------------------------------------------------------
def markdown(res: dict[str, Any]) -> str:
    p, algs = res["params"], res["algorithms"]
    lines = [
        f"`{res['command']}`",
        "",
        (
            f"{res['machine']['date']}; {res['machine']['cpus']} CPUs ({res['machine']['processor']}), "
            f"Python {res['versions']['python']}, numpy {res['versions']['numpy']}, dplr "
            f"{res['versions'].get('dplr', '?')}; {_matrices_text(res)} float64 in memory, "
            f"delta = {p['delta']:g}, C = {p['clip_norm']:g}, {p['neighboring']}, "
            f"{p['draws']} draws per method and cell; noise: {p['noise']}; wall {res['wall_s']:.0f} s."
        ),
        "",
        (
            "Ratio = median additive spectral error of the algorithm / that of the full GM "
            "(release A + N, then its truncated rank-k SVD). `err_GM/sigma_1` >= 1: outside "
            "the regime where the comparison means something (marked `*`)."
        ),
        "",
        "| spectrum | unit | k | eps | sigma_1 | sigma_k+1 | err_GM | err_GM/sigma_1 | "
        + " | ".join(algs)
        + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(algs),
    ]
    for c in res["cells"]:
        mark = "" if c["in_regime"] else " *"
        ratios = [f"{c['algorithms'][a]['ratio']:.2f}" for a in algs]
        label = c["spectrum"]
        if label.startswith("real:"):
            label = f"{label} ({c['m']} x {c['n']})"
        lines.append(
            f"| {label} | {c['unit']} | {c['rank']} | {c['epsilon']:g} | {c['sigma_1']:.4g} | "
            f"{c['sigma_k+1']:.3g} | {c['gm']['median']:.4g} | {c['gm_over_sigma1']:.2f}{mark} | "
            + " | ".join(ratios)
            + " |"
        )
    lines += _relative_table(res)
    lines += ["", "Sizes chosen by each algorithm (from its release report):", ""]
    seen = {}
    for c in res["cells"]:
        for a in algs:
            r = c["algorithms"][a]
            seen.setdefault(
                (a, c["unit"], c["rank"]),
                (r["t"], r["v"], r.get("operator"), r["n_passes"], r["weights"]),
            )
    lines += [
        "| algorithm | unit | k | t | v | S | passes | budget weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (a, u, k), (t, v, op, npass, w) in seen.items():
        ws = ", ".join(f"{nm} {x:.2f}" for nm, x in w.items() if x is not None) or "-"
        lines.append(f"| {a} | {u} | {k} | {t} | {v} | {op} | {npass} | {ws} |")
    for a, why in res["skipped"].items():
        lines += ["", f"`{a}`: {why}."]
    return "\n".join(lines) + "\n"


def _relative_table(res: dict[str, Any]) -> list[str]:
    """The real matrices' errors relative to the best rank-k approximation.

    Their tails are heavy (sigma_{k+1} is half of sigma_1 or more), so where the
    noise is small the additive error of every method is second order in it
    (the error adds to sigma_{k+1} in quadrature) and the ratio to the full GM's
    becomes a ratio of two small numbers; ``err / sigma_{k+1}`` says how far each
    release is from the best rank-k approximation.
    """
    algs = res["algorithms"]
    real = [c for c in res["cells"] if c["spectrum"].startswith("real:")]
    if not real:
        return []
    lines = [
        "",
        ("Real matrices: additive error over sigma_k+1, i.e. ||A - A_hat||_2 / sigma_k+1 - 1 "
        "(medians of the draws):"),
        "",
        "| matrix | unit | eps | full GM | " + " | ".join(algs) + " |",
        "|---|---|---|---|" + "---|" * len(algs),
    ]
    for c in real:
        tail = c["sigma_k+1"]
        rel = [f"{c['algorithms'][a]['median'] / tail:.3f}" for a in algs]
        lines.append(
            f"| {c['spectrum'][5:]} | {c['unit']} | {c['epsilon']:g} | "
            f"{c['gm']['median'] / tail:.3f} | " + " | ".join(rel) + " |"
        )
    return lines


def _matrices_text(res: dict[str, Any]) -> str:
    """The header's words for the matrices of a run (synthetic, real or both)."""
    p = res["params"]
    parts = [f"synthetic {p['m']} x {p['n']}"] if p["spectra"] else []
    shapes = {c["spectrum"]: (c["m"], c["n"]) for c in res["cells"]}
    parts += [
        f"{name} {shapes[f'real:{name}'][0]} x {shapes[f'real:{name}'][1]} (real, "
        f"{'sparse CSR, see sparse_real_data.py' if name in SPARSE_REAL else 'see pca_real_data.py'})"
        for name in p.get("real", [])
        if f"real:{name}" in shapes
    ]
    return ", ".join(parts)


def plot(path: str, res: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spectra = list(dict.fromkeys(c["spectrum"] for c in res["cells"]))
    units = list(dict.fromkeys(c["unit"] for c in res["cells"]))
    fig, axes = plt.subplots(
        len(spectra),
        len(units),
        figsize=(4.2 * len(units), 3.2 * len(spectra)),
        squeeze=False,
        sharex=True,
    )
    for i, sp in enumerate(spectra):
        for j, un in enumerate(units):
            ax = axes[i][j]
            cs = [c for c in res["cells"] if c["spectrum"] == sp and c["unit"] == un]
            eps = [c["epsilon"] for c in cs]
            out = [c for c in cs if not c["in_regime"]]
            for a in res["algorithms"]:
                (line,) = ax.plot(
                    eps, [c["algorithms"][a]["ratio"] for c in cs], marker="o", label=a
                )
                ax.plot(  # hollow markers: outside the regime err_GM < sigma_1
                    [c["epsilon"] for c in out],
                    [c["algorithms"][a]["ratio"] for c in out],
                    ls="none", marker="o", mfc="white", color=line.get_color(),
                )  # fmt: skip
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(eps, [f"{e:g}" for e in eps])
            shape = f"{cs[0]['m']} x {cs[0]['n']}, " if sp.startswith("real:") else ""
            ax.set_title(f"{sp}, {un} unit ({shape}k = {cs[0]['rank']})", fontsize=10)
            ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel("err / err(full GM)")
            if i == len(spectra) - 1:
                ax.set_xlabel("epsilon")
    axes[0][0].legend(fontsize=8, title="hollow: err_GM >= sigma_1", title_fontsize=7)
    p = res["params"]
    synthetic = f", synthetic {p['m']} x {p['n']}" if p["spectra"] else ""
    fig.suptitle(
        f"Additive spectral error vs the full GM{synthetic}, delta = {p['delta']:g}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    algs, skipped = available_algorithms(args.algorithms)
    for a, why in skipped.items():
        print(f"{a}: {why}")
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    with threadpool_limits(args.blas_threads):
        cells = run_grid(args, algs)
    name = args.name or ("utility_quick" if args.quick else "utility")
    stem = os.path.join(args.results, name)
    res: dict[str, Any] = {
        "benchmark": "bench_utility",
        "command": " ".join(
            [
                "python benchmarks/bench_utility.py",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "machine": C.machine(),
        "versions": C.versions(),
        "params": {
            "m": args.rows,
            "n": args.cols,
            "epsilons": list(args.epsilons),
            "delta": args.delta,
            "units": list(args.units),
            "spectra": list(args.spectra),
            "real": list(args.real),
            "draws": args.draws,
            "clip_norm": args.clip_norm,
            "neighboring": args.neighboring,
            "seed": args.seed,
            "blas_threads": args.blas_threads,
            "sketch_size": args.sketch_size or "planned",
            "core_size": args.core_size or "planned",
            "noise": "secret CSPRNG"
            if args.noise_seed is None
            else f"insecure_noise_seed {args.noise_seed} + draw",
            "ratio": "median(err_alg) / median(err_GM) over the draws",
        },
        "algorithms": algs,
        "skipped": skipped,
        "wall_s": time.perf_counter() - t0,
        "cells": cells,
    }
    os.makedirs(args.results, exist_ok=True)
    C.dump_json(res, stem + ".json")
    md = markdown(res)
    with open(stem + ".md", "w") as f:
        f.write(md)
    if not args.no_plot:
        plot(stem + ".png", res)
    print()
    print(md)
    print(f"wrote {stem}.json, .md" + ("" if args.no_plot else ", .png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
