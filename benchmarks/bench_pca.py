"""Private PCA: utility (power method vs Analyze Gauss vs diffprivlib) and the cost of one iteration on Dask.

Usage::

    python benchmarks/bench_pca.py                    # all parts: sb, eps, diffprivlib, perf (in this order)
    python benchmarks/bench_pca.py --part sb          # or eps, diffprivlib, perf, real; repeatable
    python benchmarks/bench_pca.py --quick            # small sizes, one seed: a smoke run

Parts (spec power-pca 5.4 and 6; results in benchmarks/results/pca_<part>[_quick].json|md):

* ``sb``  S-B data (n = 2^19, d = 64, k = 2, sigma_k^2 = s = 1000, sigma_{k+1}^2 = b = 250,
  T = 3, epsilon = 1, delta = 1e-6), incoherent (support n) and coherent (support 4096):
  Analyze Gauss, the power method at R = 2 rho_U and R = rho_U (GDP calibration), and the
  power method with [P]'s literal constants (``accounting="paper"``). Medians of 3 noise seeds.
* ``eps`` the same data, epsilon in {0.25, 0.5, 1, 2, 4}: AG, PM(2 rho_U), PM(rho_U); a table,
  log-log slopes and the plot ``pca_error_vs_epsilon.png``.
* ``diffprivlib`` ours against ``diffprivlib.models.PCA`` on the same rows at the same
  epsilon (n in {1e4, 1e5, 1e6}, d = 64, k = 2). The rows have mean exactly zero (each row
  is stored with its negative), so the centred and the uncentred top-k subspaces coincide
  and one ground truth serves both. See the Markdown output for the details of the
  comparison and for what we found in diffprivlib's Bingham sampler.
* ``real`` real matrices installed on this machine (scikit-learn's digits, a 10-pixel crop,
  breast cancer, wine; a bag of words of the installed Python source): the default
  ``DPPCA`` (method auto), Analyze Gauss, the power method at the auto rule's (T, R),
  ``select=True`` and diffprivlib (d <= 10), epsilon in {0.5, 1, 2}; table, JSON and the plot
  ``pca_real.png`` (``pca_real_part.py``). Default 5 seeds.
* ``perf`` one power iteration against one plain read pass of a 1,000,000 x 64 float32
  Zarr store on a 2-worker LocalCluster, measured side by side in one run: the read pass
  (a 1x1 statistic per row band, and ``A.sum(axis=0)``), the bare Gram and power-iteration
  passes (``DaskRowSource``), and ``pca`` with T = 0 (Analyze Gauss), 1 and 3; one
  iteration = (t(T=3) - t(T=1)) / 2. Then, untimed, the per-band kernels on one worker.

The in-memory parts run with single-threaded BLAS (threadpoolctl): their timings are not
the point, and threaded BLAS thrashes on a shared 2-core machine. Errors are
``sin theta_max(X, V_k)`` against the exact ``V_k``. Nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common as C
import numpy as np
from bingham import corrected_bingham

PARTS = ("sb", "eps", "diffprivlib", "real", "perf")
DELTA = 1e-6
RANK = 2
N_COLS = 64

#: Spec 5.4 reference table (numpy reference implementation, medians of 3 runs).
SPEC_SB = {
    "inc": {
        "ag": "0.062",
        "pm_2rho": "0.031-0.033",
        "pm_rho": "0.015",
        "pm_paper": "~1.0",
    },
    "coh": {
        "ag": "0.065",
        "pm_2rho": "0.33-0.35",
        "pm_rho": "0.17-0.18",
        "pm_paper": "~1.0",
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="which part to run (repeatable; default: all, perf last)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, one seed")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="noise seeds per configuration (default 3; 1 with --quick)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="perf: timed repetitions (default 3; 2 with --quick)",
    )
    p.add_argument(
        "--workdir",
        default=C.WORK,
        help="where the perf store is generated (git-ignored)",
    )
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        help="diffprivlib: seconds to let the shipped sampler run before giving up (default 60; 15 with --quick)",
    )
    a = p.parse_args(argv)
    a.part = [x for x in PARTS if x in (a.part or PARTS)]  # perf always last
    a.seeds_given = a.seeds is not None
    a.seeds = a.seeds or (1 if a.quick else 3)
    a.repeat = a.repeat or (2 if a.quick else 3)
    a.hang_timeout = a.hang_timeout or (15.0 if a.quick else 60.0)
    return a


def out_path(args: argparse.Namespace, stem: str, ext: str) -> str:
    return os.path.join(
        args.results, f"pca_{stem}{'_quick' if args.quick else ''}.{ext}"
    )


def load_info() -> dict[str, Any]:
    return {
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "uptime": _uptime(),
    }


def _uptime() -> str:
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def med(xs: list[float]) -> float:
    return float(statistics.median(xs))


def fmt(x: float) -> str:
    return f"{x:.3g}" if x < 0.0995 else f"{x:.2f}"


def fmt_range(xs: list[float]) -> str:
    """Median, with min-max when there is more than one value."""
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(med(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def write(args: argparse.Namespace, stem: str, res: dict[str, Any], md: str) -> None:
    C.dump_json(res, out_path(args, stem, "json"))
    with open(out_path(args, stem, "md"), "w") as f:
        f.write(md)
    print(md, flush=True)
    print(f"wrote {out_path(args, stem, 'json')} and .md", flush=True)


# -- S-B data and in-memory runs ----------------------------------------------------------
class Bench:
    """Synthetic data sets and memoised in-memory runs shared by the parts sb and eps."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        q = args.quick
        #: S-B (spec 5.4); --quick: 2^16 rows with the same spectrum.
        self.n = 2**16 if q else 2**19
        self.top, self.bottom, self.T = 1000.0, 250.0, 3
        self.supports = {"inc": self.n, "coh": 4096}
        self.seeds = list(range(args.seeds))
        self._data: dict[str, Any] = {}
        self._runs: dict[tuple[Any, ...], dict[str, Any]] = {}

    def data(self, name: str) -> Any:
        from pipeline.linalg.synthetic import coherent_matrix

        if name not in self._data:
            t0 = time.perf_counter()
            self._data[name] = coherent_matrix(
                self.n,
                N_COLS,
                RANK,
                support=self.supports[name],
                top=self.top,
                bottom=self.bottom,
                rng=0,
            )
            print(
                f"generated S-B {name} ({self.n} x {N_COLS}) in {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
        return self._data[name]

    def data_facts(self) -> dict[str, Any]:
        out = {}
        for name in self.supports:
            d = self.data(name)
            out[name] = {
                "n_rows": self.n,
                "n_cols": N_COLS,
                "rank": RANK,
                "support": d.support,
                "top_sigma_k2": self.top,
                "bottom_sigma_k1_2": self.bottom,
                "coherence": d.coherence,
                "row_coherence_rho_U": d.row_coherence,
                "gap_k": d.gap_k,
                "kappa_k": d.kappa_k,
                "max_row_norm": d.max_row_norm,
            }
        return out

    def run(
        self,
        name: str,
        method: str,
        epsilon: float,
        seed: int,
        *,
        radius_factor: float | None = None,
        accounting: str = "gdp",
    ) -> dict[str, Any]:
        from pipeline.api import pca
        from pipeline.linalg.metrics import sin_theta

        key = (name, method, epsilon, seed, radius_factor, accounting)
        if key not in self._runs:
            d = self.data(name)
            kw: dict[str, Any] = {}
            if method == "power":
                kw = {
                    "iterations": self.T,
                    "clip_radius": radius_factor * d.row_coherence,
                }
            t0 = time.perf_counter()
            with single_threaded_blas():
                rel = pca(
                    d.A,
                    RANK,
                    epsilon=epsilon,
                    delta=DELTA,
                    method=method,
                    accounting=accounting,
                    insecure_noise_seed=seed,
                    **kw,
                )
            par = rel.report["parameters"]
            self._runs[key] = {
                "data": name,
                "method": method,
                "epsilon": epsilon,
                "seed": seed,
                "radius_factor": radius_factor,
                "accounting": accounting,
                "error": sin_theta(rel.components, d.Vk),
                "time_s": round(time.perf_counter() - t0, 3),
                "clip_radius_used": par["clip_radius"],
                "gamma": par["gamma"],
                "realised_epsilon": rel.report.get("realised_epsilon"),
                "n_passes": rel.report["n_passes"],
            }
        return self._runs[key]

    def errors(self, name: str, method: str, epsilon: float, **kw: Any) -> list[float]:
        return [self.run(name, method, epsilon, s, **kw)["error"] for s in self.seeds]


#: (label, method, radius_factor, accounting) of the configurations in the sb part.
SB_CONFIGS = [
    ("ag", "analyze-gauss", None, "gdp"),
    ("pm_2rho", "power", 2.0, "gdp"),
    ("pm_rho", "power", 1.0, "gdp"),
    ("pm_paper", "power", 2.0, "paper"),
]


def part_real(args: argparse.Namespace) -> None:
    import pca_real_part as real

    seeds = list(range(args.seeds if args.seeds_given else 5))
    t0 = time.perf_counter()
    cache = os.path.join(args.workdir, "pca_real")
    os.makedirs(cache, exist_ok=True)
    try:
        dpl = import_diffprivlib()
    except ImportError as exc:  # reported, not fatal: the other columns still run
        print(f"diffprivlib unavailable: {exc}", flush=True)
        dpl = None
    with single_threaded_blas():
        res = real.run(seeds, cache, dpl)
    res.update(
        {
            "part": "real",
            "seeds": seeds,
            "machine": C.machine(),
            "load": load_info(),
            "versions": C.versions(),
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    )
    command = "python benchmarks/bench_pca.py --part real" + (
        f" --seeds {args.seeds}" if args.seeds_given else ""
    )
    md = real.markdown(res, command)
    real.plot(res, os.path.join(args.results, "pca_real.png"))
    write(args, "real", res, md)


def part_sb(args: argparse.Namespace, bench: Bench) -> None:
    eps = 1.0
    t0 = time.perf_counter()
    table: dict[str, dict[str, list[float]]] = {}
    for name in bench.supports:
        table[name] = {}
        for label, method, rf, acc in SB_CONFIGS:
            table[name][label] = bench.errors(
                name, method, eps, radius_factor=rf, accounting=acc
            )
            print(f"sb {name} {label}: {fmt_range(table[name][label])}", flush=True)
    ratio = {n: med(table[n]["pm_2rho"]) / med(table[n]["ag"]) for n in table}
    res = {
        "part": "sb",
        "machine": C.machine(),
        "load": load_info(),
        "versions": C.versions(),
        "config": {
            "epsilon": eps,
            "delta": DELTA,
            "iterations": bench.T,
            "seeds": bench.seeds,
            "accounting_baseline": "gdp",
            "sensitivity": "tight",
            "neighboring": "add-remove",
            "quick": args.quick,
        },
        "data": bench.data_facts(),
        "runs": [
            r
            for k, r in bench._runs.items()
            if k[2] == eps
            and (k[1], k[4], k[5]) in {(m, rf, a) for _, m, rf, a in SB_CONFIGS}
        ],
        "medians": {n: {lab: med(v) for lab, v in t.items()} for n, t in table.items()},
        "ratio_pm_2rho_over_ag": ratio,
        "ratio_of_ratios_inc_over_coh": ratio["inc"] / ratio["coh"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write(args, "sb", res, md_sb(res, table, bench))


def md_sb(
    res: dict[str, Any], table: dict[str, dict[str, list[float]]], bench: Bench
) -> str:
    c, dat = res["config"], res["data"]
    lines = [
        (
            f"## S-B: n = {bench.n}, d = {N_COLS}, k = {RANK}, s = {bench.top:g}, b = {bench.bottom:g}, "
            f"T = {c['iterations']}, epsilon = {c['epsilon']:g}, delta = {DELTA:g}"
        ),
        "",
        (
            f"Errors sin theta_max(X, V_k): median (min-max) over noise seeds {c['seeds']}; in memory. "
            "AG = Analyze Gauss with the whole budget; PM = clipped preconditioned power method "
            "(Analyze Gauss start with half the budget, then T iterations), GDP calibration unless "
            'marked "paper" ([P]\'s literal constants). R is a multiple of the oracle '
            "rho_U = max_i ||e_i^T U_k||."
        ),
        "",
        "| data | rho_U | AG | PM, R = 2 rho_U | PM, R = rho_U | PM, paper calibration (R = 2 rho_U) | PM(2 rho_U) / AG |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("inc", f"incoherent (support {dat['inc']['support']})"),
        ("coh", f"coherent (support {dat['coh']['support']})"),
    ):
        t = table[name]
        lines.append(
            f"| {label} | {dat[name]['row_coherence_rho_U']:.3g} | {fmt_range(t['ag'])} | {fmt_range(t['pm_2rho'])} "
            f"| {fmt_range(t['pm_rho'])} | {fmt_range(t['pm_paper'])} | {res['ratio_pm_2rho_over_ag'][name]:.2f} |"
        )
    if not c["quick"]:
        lines += [
            "",
            "Spec 5.4 reference (S-B):",
            "",
            "| data | AG | PM, R = 2 rho_U | PM, R = rho_U | PM, paper |",
            "|---|---|---|---|---|",
        ]
        for name, label in (("inc", "incoherent"), ("coh", "coherent")):
            s = SPEC_SB[name]
            lines.append(
                f"| {label} | {s['ag']} | {s['pm_2rho']} | {s['pm_rho']} | {s['pm_paper']} |"
            )
    lines += [
        "",
        (
            f"Ratio of ratios (PM/AG incoherent) / (PM/AG coherent) = {res['ratio_of_ratios_inc_over_coh']:.3f} "
            "(S1 asks < 1/3)."
        ),
        "",
        f"Machine load during the part: {res['load']['uptime']}. Wall time {res['wall_s']} s.",
        "",
    ]
    return "\n".join(lines)


EPS_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)
EPS_CURVES = [
    ("ag", "analyze-gauss", None),
    ("pm_2rho", "power", 2.0),
    ("pm_rho", "power", 1.0),
]


def loglog_slope(
    eps: list[float], err: list[float], below: float = 0.3
) -> float | None:
    pts = [
        (math.log(e), math.log(x)) for e, x in zip(eps, err, strict=True) if x < below
    ]
    if len(pts) < 2:
        return None
    xs, ys = zip(*pts, strict=True)
    return float(np.polyfit(xs, ys, 1)[0])


def part_eps(args: argparse.Namespace, bench: Bench) -> None:
    t0 = time.perf_counter()
    curves: dict[str, dict[str, list[list[float]]]] = {}
    for name in bench.supports:
        curves[name] = {}
        for label, method, rf in EPS_CURVES:
            curves[name][label] = [
                bench.errors(name, method, e, radius_factor=rf) for e in EPS_GRID
            ]
            print(
                f"eps {name} {label}: "
                + ", ".join(fmt(med(v)) for v in curves[name][label]),
                flush=True,
            )
    medians = {
        n: {lab: [med(v) for v in vs] for lab, vs in c.items()}
        for n, c in curves.items()
    }
    slopes = {
        n: {lab: loglog_slope(list(EPS_GRID), m) for lab, m in c.items()}
        for n, c in medians.items()
    }
    png = out_path(args, "error_vs_epsilon", "png")
    plot_eps(png, curves, bench)
    res = {
        "part": "eps",
        "machine": C.machine(),
        "load": load_info(),
        "versions": C.versions(),
        "config": {
            "epsilons": list(EPS_GRID),
            "delta": DELTA,
            "iterations": bench.T,
            "seeds": bench.seeds,
            "quick": args.quick,
        },
        "data": bench.data_facts(),
        "medians": medians,
        "loglog_slopes_where_error_below_0.3": slopes,
        "runs": [
            r for k, r in bench._runs.items() if k[5] == "gdp" and k[2] in EPS_GRID
        ],
        "plot": os.path.basename(png),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write(args, "eps", res, md_eps(res, medians, slopes, bench))


def plot_eps(
    path: str, curves: dict[str, dict[str, list[list[float]]]], bench: Bench
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    style = {
        "ag": ("Analyze Gauss", "k", "o"),
        "pm_2rho": ("PM, R = 2 rho_U", "tab:blue", "s"),
        "pm_rho": ("PM, R = rho_U", "tab:orange", "^"),
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, (name, title) in zip(
        axes,
        (
            ("inc", "incoherent (support n)"),
            ("coh", f"coherent (support {bench.supports['coh']})"),
        ),
        strict=True,
    ):
        for label, vs in curves[name].items():
            m = np.array([med(v) for v in vs])
            lo = m - np.array([min(v) for v in vs])
            hi = np.array([max(v) for v in vs]) - m
            lab, col, mk = style[label]
            ax.errorbar(
                EPS_GRID, m, yerr=[lo, hi], label=lab, color=col, marker=mk, capsize=3
            )
        ref = med(curves[name]["ag"][2])
        ax.plot(
            EPS_GRID,
            [ref / e for e in EPS_GRID],
            ls=":",
            color="grey",
            label="slope -1",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(EPS_GRID, [f"{e:g}" for e in EPS_GRID])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("epsilon (delta = 1e-6)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("sin theta_max(X, V_k)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"S-B: n = {bench.n}, d = {N_COLS}, k = {RANK}, s = {bench.top:g}, b = {bench.bottom:g}, "
        f"T = {bench.T}; median and range of {len(bench.seeds)} noise seeds",
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def md_eps(
    res: dict[str, Any],
    medians: dict[str, dict[str, list[float]]],
    slopes: dict[str, dict[str, float | None]],
    bench: Bench,
) -> str:
    lines = [
        f"## Error against epsilon, S-B (n = {bench.n}, T = {bench.T}, delta = {DELTA:g})",
        "",
        f"Median sin theta_max over noise seeds {res['config']['seeds']}. Plot: `{res['plot']}`.",
        "",
        "| epsilon | inc AG | inc PM 2 rho_U | inc PM rho_U | inc PM(2 rho_U)/AG | coh AG | coh PM 2 rho_U | coh PM rho_U | coh PM(2 rho_U)/AG |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, e in enumerate(EPS_GRID):
        row = [f"{e:g}"]
        for n in ("inc", "coh"):
            m = medians[n]
            row += [
                fmt(m["ag"][i]),
                fmt(m["pm_2rho"][i]),
                fmt(m["pm_rho"][i]),
                f"{m['pm_2rho'][i] / m['ag'][i]:.2f}",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        (
            "Log-log slope of error against epsilon, fitted over the points with error < 0.3 "
            "(spec S4: about -1):"
        ),
        "",
        "| data | AG | PM 2 rho_U | PM rho_U |",
        "|---|---|---|---|",
    ]
    for n in ("inc", "coh"):
        s = slopes[n]
        lines.append(
            f"| {n} | "
            + " | ".join(
                "-" if s[k] is None else f"{s[k]:.2f}"
                for k in ("ag", "pm_2rho", "pm_rho")
            )
            + " |"
        )
    lines += [
        "",
        f"Machine load: {res['load']['uptime']}. Wall time {res['wall_s']} s.",
        "",
    ]
    return "\n".join(lines)


# -- diffprivlib ---------------------------------------------------------------------------
def import_diffprivlib() -> types.ModuleType:
    """Import diffprivlib; stand in for its random-forest module if scikit-learn lacks ``DOUBLE``.

    diffprivlib 0.6.6's ``models/__init__`` imports ``models/forest.py``, which imports
    ``sklearn.tree._tree.DOUBLE`` (gone in scikit-learn 1.9). PCA does not use the forest,
    so an empty module is registered in its place; nothing else changes.
    """
    from sklearn.tree import _tree

    if not hasattr(_tree, "DOUBLE") and "diffprivlib.models.forest" not in sys.modules:
        stub = types.ModuleType("diffprivlib.models.forest")
        stub.RandomForestClassifier = stub.DecisionTreeClassifier = None  # type: ignore[attr-defined]
        sys.modules["diffprivlib.models.forest"] = stub
    import diffprivlib

    return diffprivlib


def bingham_distribution_check(n_samples: int, seed: int = 1) -> dict[str, Any]:
    """E[x_1^2] under the shipped and the corrected sampler against the exact Bingham value.

    Target density on S^{q-1}: proportional to exp(-x^T A x), A = diag(0, a, ..., a),
    i.e. exp(a x_1^2); E[x_1^2] by quadrature of the marginal (1 - t^2)^((q-3)/2) e^(a t^2).
    """
    from diffprivlib.mechanisms import Bingham
    from scipy import integrate

    out = []
    for q, a in ((2, 2.0), (3, 2.0), (3, 5.0)):
        C_ = np.zeros((q, q))
        C_[0, 0] = (
            4.0 * a
        )  # value_translated = epsilon (c I - C) / 4 / sensitivity = diag(0, a, ...)
        row: dict[str, Any] = {"q": q, "a": a}
        for label, ctx in (
            ("shipped", contextlib.nullcontext()),
            ("corrected", corrected_bingham()),
        ):
            with ctx:
                m = Bingham(epsilon=1.0, sensitivity=1.0, random_state=seed)
                xs = np.array([m.randomise(C_) for _ in range(n_samples)])
            x1 = xs[:, 0] ** 2
            row[label] = {
                "mean_x1_sq": float(x1.mean()),
                "stderr": float(x1.std() / math.sqrt(len(x1))),
            }

        def w(t: float, q: int = q, a: float = a) -> float:
            return math.exp(a * t * t) * (1 - t * t) ** ((q - 3) / 2)

        num = integrate.quad(lambda t: t * t * w(t), -1, 1)[0]
        den = integrate.quad(w, -1, 1)[0]
        row["exact"] = num / den
        out.append(row)
    return {"n_samples": n_samples, "rows": out}


_HANG_SCRIPT = textwrap.dedent(
    """
    import sys, types, time
    import numpy as np
    from sklearn.tree import _tree
    if not hasattr(_tree, "DOUBLE"):
        stub = types.ModuleType("diffprivlib.models.forest")
        stub.RandomForestClassifier = stub.DecisionTreeClassifier = None
        sys.modules["diffprivlib.models.forest"] = stub
    from diffprivlib.models import PCA
    A = np.load(sys.argv[1])
    t0 = time.perf_counter()
    PCA(n_components=2, epsilon=1.0, data_norm=1.0, centered=True, random_state=0).fit(A)
    print(f"finished in {time.perf_counter() - t0:.1f} s")
    """
)


def shipped_sampler_run(A: np.ndarray, timeout: float) -> dict[str, Any]:
    """Fit diffprivlib's PCA with its shipped sampler in a subprocess, with a timeout."""
    with tempfile.TemporaryDirectory(prefix="dplr-bench-") as tmp:
        f = os.path.join(tmp, "A.npy")
        np.save(f, A)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, "-c", _HANG_SCRIPT, f],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            return {
                "finished": p.returncode == 0,
                "wall_s": round(time.perf_counter() - t0, 1),
                "stdout": p.stdout.strip()[-300:],
                "stderr": p.stderr.strip()[-300:],
            }
        except subprocess.TimeoutExpired:
            return {
                "finished": False,
                "wall_s": round(time.perf_counter() - t0, 1),
                "note": f"no result after {timeout:g} s (killed)",
            }


def zero_mean_rows(n: int, seed: int) -> dict[str, Any]:
    """n rows with mean exactly zero: n/2 clipped Gaussian rows and their negatives.

    Half-rows ``z diag(sqrt(lam)) Q^T`` with ``lam = (0.12, 0.10, 0.005 x 62)``, ``Q`` Haar,
    rows of norm > 1 scaled to norm 1. The exact ``V_k`` is the top-k eigenvectors of
    ``A^T A``, which here is also n times the (centred) covariance.
    """
    rng = np.random.default_rng([seed, n])
    h = n // 2
    lam = np.array([0.12, 0.10] + [0.005] * (N_COLS - 2))
    Q = np.linalg.qr(rng.standard_normal((N_COLS, N_COLS)))[0]
    half = (rng.standard_normal((h, N_COLS)) * np.sqrt(lam)) @ Q.T
    norms = np.linalg.norm(half, axis=1)
    clipped = float(np.mean(norms > 1.0))
    half /= np.maximum(norms, 1.0)[:, None]
    A = np.vstack([half, -half])
    w, V = np.linalg.eigh(A.T @ A)
    w, V = w[::-1], V[:, ::-1]
    Vk = V[:, :RANK]
    Uk = (A @ Vk) / np.sqrt(w[:RANK])
    return {
        "A": A,
        "Vk": Vk,
        "facts": {
            "n_rows": 2 * h,
            "fraction_of_rows_clipped": clipped,
            "max_abs_column_mean": float(np.abs(A.mean(axis=0)).max()),
            "top_eigenvalues_AtA": [float(x) for x in w[: RANK + 2]],
            "gap_k": float(w[RANK - 1] - w[RANK]),
            "row_coherence_rho_U": float(np.linalg.norm(Uk, axis=1).max()),
            "public_radius_guess": 2 * math.sqrt(RANK * math.log(2 * h) / (2 * h)),
        },
    }


def part_diffprivlib(args: argparse.Namespace) -> None:
    from pipeline.api import pca
    from pipeline.linalg.metrics import sin_theta

    dpl = import_diffprivlib()
    from diffprivlib.models import PCA as DplPCA

    eps = 1.0
    t0 = time.perf_counter()
    ns = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    methods = ("ours_ag", "ours_pm", "dpl_centered", "dpl_mean")
    runs: list[dict[str, Any]] = []
    facts: dict[int, Any] = {}
    hang: dict[str, Any] = {}
    for n in ns:
        d = zero_mean_rows(n, seed=0)
        A, Vk = d["A"], d["Vk"]
        facts[n] = d["facts"]
        R = d["facts"]["public_radius_guess"]
        for s in range(args.seeds):  # in memory, n = 1e6 is fast enough for every seed
            for m in methods:
                t1 = time.perf_counter()
                with single_threaded_blas():
                    if m == "ours_ag":
                        X = pca(
                            A,
                            RANK,
                            epsilon=eps,
                            delta=DELTA,
                            method="analyze-gauss",
                            insecure_noise_seed=s,
                        ).components
                    elif m == "ours_pm":
                        X = pca(
                            A,
                            RANK,
                            epsilon=eps,
                            delta=DELTA,
                            iterations=3,
                            clip_radius=R,
                            insecure_noise_seed=s,
                        ).components
                    else:
                        kw: dict[str, Any] = (
                            {"centered": True}
                            if m == "dpl_centered"
                            else {"centered": False, "bounds": (-1.0, 1.0)}
                        )
                        with corrected_bingham():
                            est = DplPCA(
                                n_components=RANK,
                                epsilon=eps,
                                data_norm=1.0,
                                random_state=s,
                                **kw,
                            ).fit(A.copy())
                        X = np.linalg.qr(est.components_.T)[0]
                err = sin_theta(X, Vk)
                runs.append(
                    {
                        "n": n,
                        "method": m,
                        "seed": s,
                        "error": err,
                        "time_s": round(time.perf_counter() - t1, 3),
                    }
                )
                print(
                    f"diffprivlib n={n} {m} seed={s}: {err:.4g} ({runs[-1]['time_s']} s)",
                    flush=True,
                )
        if n == ns[0]:
            print(
                f"shipped diffprivlib sampler on n = {n} (timeout {args.hang_timeout:g} s) ...",
                flush=True,
            )
            hang = {"n": n, **shipped_sampler_run(A, args.hang_timeout)}
            print(hang, flush=True)
    check = bingham_distribution_check(500 if args.quick else 2000)
    table = {
        n: {
            m: [r["error"] for r in runs if r["n"] == n and r["method"] == m]
            for m in methods
        }
        for n in ns
    }
    res = {
        "part": "diffprivlib",
        "machine": C.machine(),
        "load": load_info(),
        "versions": {
            **C.versions(),
            "diffprivlib": dpl.__version__,
            "scikit-learn": __import__("sklearn").__version__,
        },
        "config": {
            "epsilon": eps,
            "delta_ours": DELTA,
            "rank": RANK,
            "n_cols": N_COLS,
            "iterations_pm": 3,
            "seeds": list(range(args.seeds)),
            "quick": args.quick,
        },
        "data": {str(n): f for n, f in facts.items()},
        "runs": runs,
        "medians": {
            str(n): {m: med(v) for m, v in t.items()} for n, t in table.items()
        },
        "shipped_sampler_run": hang,
        "bingham_distribution_check": check,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write(args, "diffprivlib", res, md_diffprivlib(res, table, ns))


def md_diffprivlib(
    res: dict[str, Any], table: dict[int, dict[str, list[float]]], ns: tuple[int, ...]
) -> str:
    v = res["versions"]
    lines = [
        (
            f"## Against diffprivlib {v['diffprivlib']} `models.PCA`, epsilon = {res['config']['epsilon']:g}, "
            f"d = {N_COLS}, k = {RANK}"
        ),
        "",
        "sin theta_max(X, V_k), median (min-max) over seeds "
        + str(res["config"]["seeds"])
        + ".",
        "",
        "| n | ours, Analyze Gauss | ours, power method T = 3 | diffprivlib, centered=True | diffprivlib, centered=False |",
        "|---|---|---|---|---|",
    ]
    for n in ns:
        t = table[n]
        lines.append(
            f"| {n:,} | {fmt_range(t['ours_ag'])} | {fmt_range(t['ours_pm'])} | "
            f"{fmt_range(t['dpl_centered'])} | {fmt_range(t['dpl_mean'])} |"
        )
    d0 = res["data"][str(ns[0])]
    hang = res["shipped_sampler_run"]
    chk = res["bingham_distribution_check"]
    lines += [
        "",
        "**How the comparison is made fair.**",
        "",
        (
            "* *Same rows, same estimand.* diffprivlib's PCA is a centred PCA (it subtracts a mean);"
            " ours is uncentred (top-k eigenvectors of A^T A). The rows are built with mean exactly zero"
            f" (n/2 Gaussian rows with covariance eigenvalues (0.12, 0.10, 0.005 x {N_COLS - 2}) under a"
            " Haar rotation, rows of norm > 1 scaled to 1, each row stored with its negative; largest"
            f" |column mean| {d0['max_abs_column_mean']:.1e}), so both estimands are the top-2 eigenvectors of"
            " A^T A, the single ground truth used for every method."
        ),
        (
            "* *Same privacy unit and row bound.* Replacement of one row, rows of norm <= 1 (`data_norm=1`"
            " for diffprivlib; ours clips to 1, a no-op here). Nothing is read from the data to set a bound."
        ),
        (
            "* *Same epsilon.* Ours is (epsilon, delta = 1e-6)-DP (Gaussian noise, GDP accounting);"
            " diffprivlib is pure epsilon-DP (Laplace eigenvalues and Bingham eigenvector samples,"
            " Amin et al. 2019, epsilon/(k+1) per sample). The two guarantees are not identical: a pure"
            " epsilon-DP method pays for delta = 0."
        ),
        (
            "* `centered=True` tells diffprivlib the data are already centred: it then spends the whole"
            " epsilon on the covariance. That is correct here because the mean is exactly zero by construction"
            " (for uncentred data it would silently compute an uncentred PCA). `centered=False` with public"
            " `bounds=(-1, 1)` spends epsilon/2 on a DP mean first, then centres and re-clips; shown for"
            " completeness against the same ground truth."
        ),
        (
            "* Ours: Analyze Gauss with the whole budget, and the power method (T = 3) with the public radius"
            f" guess R = 2 sqrt(k log(n) / n) (API docstring; {d0['public_radius_guess']:.3g} at n = {ns[0]:,}),"
            " not the oracle rho_U. 'ours' runs in memory, like diffprivlib."
        ),
        "",
        "**diffprivlib's Bingham sampler, as shipped, cannot be used here.** With d = 64 a single"
        f" `PCA.fit` at n = {hang.get('n', ns[0]):,} "
        + (
            "did not return within " + f"{hang.get('wall_s')} s"
            if not hang.get("finished")
            else f"returned: {hang.get('stdout')}"
        )
        + " (it rejects nearly every proposal). The reason is in `diffprivlib/mechanisms/bingham.py`,"
        " `Bingham.randomise`: the acceptance probability of Kent et al.'s rejection sampler is"
        " exp(-x^T A x) (x^T Omega x)^(+q/2) / M for a proposal from the angular central Gaussian with"
        " density (x^T Omega x)^(-q/2); the code divides by (x^T Omega x)^(q/2) instead. The acceptance"
        " rate is then about 1/M (M ~ e^100 at q = 64 and this concentration), and the samples that are"
        " accepted do not follow the Bingham density the privacy proof assumes (they are more"
        " concentrated, i.e. less noisy). Evidence, E[x_1^2] for the target exp(a x_1^2) on S^(q-1),"
        f" {chk['n_samples']} samples each:",
        "",
        "| q | a | shipped sampler | corrected sampler | exact |",
        "|---|---|---|---|---|",
    ]
    for r in chk["rows"]:
        lines.append(
            f"| {r['q']} | {r['a']:g} | {r['shipped']['mean_x1_sq']:.3f} +- {r['shipped']['stderr']:.3f} | "
            f"{r['corrected']['mean_x1_sq']:.3f} +- {r['corrected']['stderr']:.3f} | {r['exact']:.3f} |"
        )
    lines += [
        "",
        (
            "The diffprivlib columns above therefore use diffprivlib's own code with that one exponent"
            " corrected (`bingham_randomise_corrected` in `bingham.py`: same envelope, same b, same random"
            " stream, log-space arithmetic). They measure the algorithm diffprivlib implements, not the"
            " shipped binary, which does not finish."
        ),
        "",
        f"Machine load: {res['load']['uptime']}. Wall time {res['wall_s']} s.",
        "",
    ]
    return "\n".join(lines)


# -- performance ---------------------------------------------------------------------------
def perf_store(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    import zarr

    from pipeline.io import generate_pca_store

    n = 200_000 if args.quick else 1_000_000
    chunk = 65_536
    path = os.path.join(args.workdir, f"pca_{n}x{N_COLS}_r{chunk}_f32_s0.zarr")
    if os.path.exists(path):
        try:
            z = zarr.open_array(path, mode="r")
            if (
                z.shape == (n, N_COLS)
                and z.chunks == (chunk, N_COLS)
                and "dplr_synthetic" in z.attrs
            ):
                print(f"reusing {path}", flush=True)
                return path, dict(z.attrs["dplr_synthetic"])
        except Exception as exc:  # noqa: BLE001 - any unreadable store is regenerated
            print(f"regenerating {path}: {exc!r}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.perf_counter()
    print(f"generating {path} ...", flush=True)
    meta = generate_pca_store(
        path,
        n,
        N_COLS,
        RANK,
        support=2**17 if args.quick else 2**19,
        top=1000.0,
        bottom=250.0,
        chunks=(chunk, -1),
        dtype="float32",
        seed=0,
        overwrite=True,
    )
    print(f"  generated in {time.perf_counter() - t0:.1f} s", flush=True)
    return path, meta


def _rows_in_band(block: np.ndarray) -> np.ndarray:
    """A tiny statistic of a band: the work of a read pass is the read itself."""
    return np.array([[block.shape[0]]], dtype=np.int64)


def kernel_breakdown(path: str, band_rows: int, radius: float) -> dict[str, float]:
    """Seconds per piece of the per-band PCA kernels, summed over all bands (on a worker).

    Single thread, bands read one after the other: the zarr read (decode to
    float32); ``band_pass`` itself, the pass tasks' kernel (sub-blocks cast into one
    reused buffer), for "update" and "gram"; and, on whole bands in fresh arrays,
    its pieces ``prep_factors`` (float64 copy, row norms, per-row clip factors
    ``f``), ``band_gram(a, f)``, ``band_update(a, X, trials, f)`` for one trial,
    also split into ``(a X) f``, ``Clip_R((a X f) B) f`` and ``a^T W``.
    """
    import zarr

    from pipeline.algorithms.pca import (
        band_gram,
        band_pass,
        band_update,
        clip_rows,
        prep_factors,
    )

    z = zarr.open_array(path, mode="r")
    n, d = z.shape
    X = np.linalg.qr(np.random.default_rng(0).standard_normal((d, RANK)))[0]
    B = np.eye(RANK)
    acc = dict.fromkeys(
        (
            "read", "prep_factors", "band_gram", "band_update", "aX", "clip", "aT_W",
            "band_pass_update", "band_pass_gram",
        ),
        0.0,
    )
    for r0 in range(0, n, band_rows):
        t = time.perf_counter()
        blk = z[r0 : r0 + band_rows]
        acc["read"] += time.perf_counter() - t
        t = time.perf_counter()
        band_pass(blk, "update", (X, [(B, radius)]), 1.0, True)
        acc["band_pass_update"] += time.perf_counter() - t
        t = time.perf_counter()
        band_pass(blk, "gram", None, 1.0, True)
        acc["band_pass_gram"] += time.perf_counter() - t
        t = time.perf_counter()
        a, f = prep_factors(blk)
        acc["prep_factors"] += time.perf_counter() - t
        t = time.perf_counter()
        band_gram(a, f)
        acc["band_gram"] += time.perf_counter() - t
        t = time.perf_counter()
        band_update(a, X, [(B, radius)], f)
        acc["band_update"] += time.perf_counter() - t
        t = time.perf_counter()
        P = a @ X
        P *= f[:, None]
        acc["aX"] += time.perf_counter() - t
        t = time.perf_counter()
        W = clip_rows(P @ B, radius)
        W *= f[:, None]
        acc["clip"] += time.perf_counter() - t
        t = time.perf_counter()
        a.T @ W
        acc["aT_W"] += time.perf_counter() - t
    return {k: round(v, 4) for k, v in acc.items()}


def part_perf(args: argparse.Namespace) -> None:
    from bench_lrf import CpuMeter

    from pipeline.api import PCA_BAND_BYTES, pca
    from pipeline.execution.pca import DaskRowSource
    from pipeline.io import open_input

    path, meta = perf_store(args)
    info_store = C.store_info(path)
    R = 2.0 * float(meta["row_coherence"])
    load_before = load_info()
    cluster, client = C.start_cluster(2)
    meter = CpuMeter()
    ledger_dir = tempfile.mkdtemp(prefix="dplr-bench-ledger-")
    ledger = os.path.join(ledger_dir, "ledger.json")
    arr, _info = open_input(path, unit=None, band_bytes=PCA_BAND_BYTES)
    bands = [int(c) for c in arr.chunks[0]]
    blas = sorted(set(client.run(C.blas_threads).values()))
    print(
        f"cluster: 2 workers x 1 thread (BLAS threads {blas}); {len(bands)} row bands of "
        f"{bands[0]} rows; store {path}",
        flush=True,
    )
    reports: dict[str, dict[str, Any]] = {}

    def ours(method: str, T: int | None) -> Callable[[], None]:
        def run() -> None:
            kw: dict[str, Any] = (
                {} if method == "analyze-gauss" else {"iterations": T, "clip_radius": R}
            )
            rel = pca(
                path,
                RANK,
                epsilon=1.0,
                delta=DELTA,
                method=method,
                ledger=ledger,
                budget=(1e6, 0.5),
                insecure_noise_seed=0,
                **kw,
            )
            rep = rel.report
            reports[f"{method}:{T}"] = {
                "n_passes": rep["n_passes"],
                "n_passes_planned": rep["n_passes_planned"],
                "timings_seconds": rep["timings_seconds"],
                "cluster": rep["cluster"],
                "n_row_bands": rep["input"]["n_row_bands"],
            }

        return run

    # one bare data pass of each kind, as the core issues it (no planning, no release)
    src = DaskRowSource(arr, client)
    X = np.linalg.qr(np.random.default_rng(0).standard_normal((N_COLS, RANK)))[0]
    methods: dict[str, Callable[[], Any]] = {
        "read_min": lambda: (
            arr.map_blocks(_rows_in_band, chunks=(1, 1), dtype=np.int64).sum().compute()
        ),
        "read_sum": lambda: arr.sum(axis=0).compute(),
        "pass_gram": src.gram,
        "pass_update": lambda: src.power_step(X, [(np.eye(RANK), R)]),
        "pca_ag": ours("analyze-gauss", None),
        "pca_T1": ours("power", 1),
        "pca_T3": ours("power", 3),
    }
    names = list(methods)
    print("warm-up round ...", flush=True)
    for nm in names:
        methods[nm]()
    times: dict[str, list[float]] = {nm: [] for nm in names}
    foreign: dict[str, list[float]] = {nm: [] for nm in names}
    waits = []
    for r in range(args.repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        waits.append(meter.wait_quiet(0.25, 60.0))
        for nm in order:
            s = meter.start()
            methods[nm]()
            m = meter.stop(s)
            times[nm].append(m["wall"])
            foreign[nm].append(round(m["foreign_cpu_share"], 3))
            print(
                f"rep {r + 1} {nm}: {m['wall']:.3f} s (foreign CPU {m['foreign_cpu_share']:.0%})",
                flush=True,
            )
    load_after = load_info()
    kernel = [
        client.submit(kernel_breakdown, path, bands[0], R, pure=False).result()
        for _ in range(2)
    ]
    print(f"kernel breakdown (one worker, 1 thread, all bands): {kernel}", flush=True)
    client.close()
    cluster.close()
    it = [(b - a) / 2 for a, b in zip(times["pca_T1"], times["pca_T3"], strict=True)]
    gram_est = [t1 - i for t1, i in zip(times["pca_T1"], it, strict=True)]
    derived = {
        "per_iteration_s": C.summary(it),
        "gram_pass_from_T1_s": C.summary(gram_est),
        "per_iteration_over_read_min": C.ratio(it, times["read_min"]),
        "per_iteration_over_read_sum": C.ratio(it, times["read_sum"]),
        "gram_over_read_min": C.ratio(gram_est, times["read_min"]),
        "analyze_gauss_over_read_min": C.ratio(times["pca_ag"], times["read_min"]),
        "update_pass_over_read_min": C.ratio(times["pass_update"], times["read_min"]),
        "update_pass_over_read_sum": C.ratio(times["pass_update"], times["read_sum"]),
        "gram_pass_over_read_min": C.ratio(times["pass_gram"], times["read_min"]),
    }
    res = {
        "part": "perf",
        "machine": C.machine(),
        "versions": C.versions(),
        "load_before": load_before,
        "load_after": load_after,
        "quiet_waits": waits,
        "store": info_store,
        "store_meta": {
            k: meta[k] for k in ("support", "top", "bottom", "row_coherence")
        },
        "config": {
            "epsilon": 1.0,
            "delta": DELTA,
            "clip_radius": R,
            "repeat": args.repeat,
            "n_workers": 2,
            "threads_per_worker": 1,
            "worker_blas_threads": blas,
            "row_bands": bands,
            "band_bytes_float64": PCA_BAND_BYTES,
            "quick": args.quick,
        },
        "times_s": {nm: C.summary(v) for nm, v in times.items()},
        "foreign_cpu_share": foreign,
        "derived": derived,
        "reports": reports,
        "kernel_breakdown_s": kernel,
    }
    write(args, "perf", res, md_perf(res))


def md_perf(res: dict[str, Any]) -> str:
    c, t, d = res["config"], res["times_s"], res["derived"]
    st = res["store"]
    rep = res["reports"]
    desc = {
        "read_min": "plain read pass: every band read, a 1x1 statistic per band (map_blocks), summed",
        "read_sum": "plain read pass with a reduction: `A.sum(axis=0)` over the same bands",
        "pass_gram": "bare Gram pass: `DaskRowSource.gram()` (the pass `pca` issues first)",
        "pass_update": "bare power-iteration pass: `DaskRowSource.power_step(X, [(B, R)])`",
        "pca_ag": '`pca(path, method="analyze-gauss")`: 1 pass (Gram), client eigh',
        "pca_T1": '`pca(path, method="power", iterations=1)`: Gram pass + 1 iteration',
        "pca_T3": '`pca(path, method="power", iterations=3)`: Gram pass + 3 iterations',
    }
    lines = [
        (
            f"## One power iteration against one read pass: {st['shape'][0]:,} x {st['shape'][1]} float32 Zarr, "
            f"chunks {st['chunks'][0]} x {st['chunks'][1]}"
        ),
        "",
        (
            f"2-worker LocalCluster (1 thread each, worker BLAS threads {c['worker_blas_threads']}); PCA reads"
            f" {len(c['row_bands'])} full-width row bands of {c['row_bands'][0]} rows (two store chunks each,"
            f" about {c['band_bytes_float64'] // 2**20} MiB in float64), and so do the read passes. Store:"
            f" {st['raw_MiB']} MiB raw, {st['disk_MiB']} MiB on disk ({', '.join(st['compressors'])})."
        ),
        (
            f" epsilon = 1, delta = 1e-6, R = 2 rho_U = {c['clip_radius']:.3g}. One warm-up round, then"
            f" {c['repeat']} repetitions in rotating order; wall clock in the client."
        ),
        "",
        "| measurement | what | min s | median s | max s | foreign CPU share |",
        "|---|---|---|---|---|---|",
    ]
    for nm, s in t.items():
        lines.append(
            f"| `{nm}` | {desc[nm]} | {s['min']:.3f} | {s['median']:.3f} | {s['max']:.3f} | "
            f"{', '.join(f'{x:.0%}' for x in res['foreign_cpu_share'][nm])} |"
        )
    it, g = d["per_iteration_s"], d["gram_pass_from_T1_s"]
    lines += [
        "",
        "| derived | min | median | max |",
        "|---|---|---|---|",
        f"| one iteration = (t(T=3) - t(T=1)) / 2, per repetition | {it['min']:.3f} s | {it['median']:.3f} s | {it['max']:.3f} s |",
        f"| Gram pass = t(T=1) - one iteration | {g['min']:.3f} s | {g['median']:.3f} s | {g['max']:.3f} s |",
        "",
        "| ratio | of min | of median | median of paired | target |",
        "|---|---|---|---|---|",
    ]
    for key, label, target in (
        (
            "per_iteration_over_read_min",
            "one iteration / read pass (map_blocks)",
            "<= 1.3",
        ),
        ("per_iteration_over_read_sum", "one iteration / read pass (sum)", "<= 1.3"),
        ("gram_over_read_min", "Gram pass (from T = 1) / read pass (map_blocks)", ""),
        (
            "update_pass_over_read_min",
            "bare power-iteration pass / read pass (map_blocks)",
            "<= 1.3",
        ),
        (
            "update_pass_over_read_sum",
            "bare power-iteration pass / read pass (sum)",
            "<= 1.3",
        ),
        ("gram_pass_over_read_min", "bare Gram pass / read pass (map_blocks)", ""),
        (
            "analyze_gauss_over_read_min",
            "whole Analyze Gauss run / read pass (map_blocks)",
            "",
        ),
    ):
        r = d[key]
        lines.append(
            f"| {label} | {r['of_min']:.2f} | {r['of_median']:.2f} | {r.get('paired_median', float('nan')):.2f} | {target} |"
        )
    v = {nm: x["values"] for nm, x in t.items()}
    fs = res["foreign_cpu_share"]
    lines += [
        "",
        (
            "Per repetition (other processes' CPU share varies a lot on this shared machine;"
            " the repetitions where it is low are the ones to trust):"
        ),
        "",
        (
            "| repetition | largest foreign CPU share | one iteration / read (map_blocks) |"
            " bare iteration pass / read (map_blocks) | bare Gram pass / read (map_blocks) |"
        ),
        "|---|---|---|---|---|",
    ]
    for r in range(len(v["read_min"])):
        one_it = (v["pca_T3"][r] - v["pca_T1"][r]) / 2
        lines.append(
            f"| {r + 1} | {max(fs[nm][r] for nm in fs):.0%} |"
            f" {one_it / v['read_min'][r]:.2f} |"
            f" {v['pass_update'][r] / v['read_min'][r]:.2f} |"
            f" {v['pass_gram'][r] / v['read_min'][r]:.2f} |"
        )
    kb = min(res["kernel_breakdown_s"], key=lambda x: x["read"] + x["prep_factors"])
    one_pass = kb["read"] + kb.get("band_pass_update", kb["prep_factors"] + kb["band_update"])
    lines += [
        "",
        (
            "Where a pass goes (untimed diagnostic after the repetitions): the per-band kernels"
            " on one worker, one thread, all bands in sequence, seconds summed over the bands"
            " (the faster of two rounds). `band_pass` is the pass tasks' kernel; the columns"
            " after it time its pieces on whole bands in fresh arrays, which the kernel avoids:"
        ),
        "",
        (
            "| read (zarr decode) | band_pass update | band_pass gram | prep_factors | band_gram"
            " | band_update | of which (a X) f | clip | a^T W | read + band_pass update |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
        (
            f"| {kb['read']:.3f} | {kb.get('band_pass_update', float('nan')):.3f} |"
            f" {kb.get('band_pass_gram', float('nan')):.3f} |"
            f" {kb['prep_factors']:.3f} | {kb['band_gram']:.3f} |"
            f" {kb['band_update']:.3f} | {kb['aX']:.3f} | {kb['clip']:.3f} | {kb['aT_W']:.3f}"
            f" | {one_pass:.3f} ({one_pass / kb['read']:.2f} x the read) |"
        ),
    ]
    lines += [
        "",
        "Passes recorded in the release reports (`n_passes`, planned): "
        + "; ".join(
            f"{k.split(':')[0]} T={k.split(':')[1]}: {v['n_passes']} ({v['n_passes_planned']})"
            for k, v in rep.items()
        )
        + " -- i.e. 1 + T.",
        "",
        f"Machine load before: {res['load_before']['uptime']}; after: {res['load_after']['uptime']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    t0 = time.perf_counter()
    for part in args.part:
        print(f"== part {part} == ({load_info()['uptime']})", flush=True)
        if part == "sb":
            part_sb(args, bench)
        elif part == "eps":
            part_eps(args, bench)
        elif part == "diffprivlib":
            bench._data.clear()  # free the S-B matrices
            part_diffprivlib(args)
        elif part == "real":
            bench._data.clear()
            part_real(args)
        else:
            part_perf(args)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
