"""The ``dplr`` command line.

Exit codes (workflows rely on them): 0 success; 2 bad input or configuration
(one line on stderr, nothing written or charged); 3 privacy budget exceeded
(refused before any data is read); 1 anything else (with a traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from pipeline.errors import BudgetExceededError, InvalidParameterError, PipelineError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3


def _pair(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ROWS,COLS (e.g. 10000,-1), got {text!r}"
        ) from None
    return a, b


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _add_privacy(p: argparse.ArgumentParser, *, lrf: bool = True) -> None:
    g = p.add_argument_group("privacy")
    g.add_argument("--epsilon", type=float, help="epsilon of this release (> 0)")
    g.add_argument("--delta", type=float, help="delta of this release, in (0, 1)")
    g.add_argument(
        "--non-private",
        action="store_true",
        help="no clipping, no noise, no ledger: NOT PRIVATE (for comparison)",
    )
    if lrf:
        _add_lrf_privacy(g)
    _add_ledger(g)


def _add_lrf_privacy(g: Any) -> None:
    g.add_argument(
        "--clip-norm",
        type=float,
        default=1.0,
        help="C: each individual's contribution is clipped to norm <= C (default 1)",
    )
    g.add_argument(
        "--unit",
        choices=("row", "column", "entry"),
        default="row",
        help="who one individual is (default: row)",
    )
    g.add_argument(
        "--neighboring",
        choices=("add-remove", "replace"),
        default="add-remove",
        help="Delta_F = C (add-remove) or 2C (replace)",
    )


def _add_ledger(g: Any) -> None:
    g.add_argument(
        "--ledger",
        help="the dataset's privacy ledger (default: <INPUT>.dplr-ledger.json beside the store)",
    )
    g.add_argument(
        "--budget-epsilon",
        type=float,
        help="lifetime epsilon declared when the ledger is created",
    )
    g.add_argument(
        "--budget-delta",
        type=float,
        help="lifetime delta declared when the ledger is created",
    )
    g.add_argument(
        "--insecure-noise-seed",
        type=int,
        help="TESTS ONLY: reproducible noise; the report says private: false",
    )


def _add_cluster(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--scheduler",
        help="Dask scheduler address (default: DASK_SCHEDULER_ADDRESS, else an embedded LocalCluster)",
    )
    g.add_argument(
        "--cluster",
        metavar="FILE",
        help="cluster configuration to start or connect to (cluster/*.yaml: "
        "local, scheduler, ssh, slurm, pbs or a Kubernetes DaskCluster)",
    )


def _cluster_of(args: argparse.Namespace) -> Any:
    """The validated --cluster file, or None: checked before anything starts."""
    if args.cluster is None:
        return None
    from pipeline.execution.clusters import load_cluster_config

    return load_cluster_config(args.cluster)


def _add_factorize_parser(sub: Any) -> None:
    """``dplr factorize``: a private (or non-private) factorization of a Zarr matrix."""
    f = sub.add_parser(
        "factorize",
        help="DP factorization U, S, V of a Zarr matrix",
        description="Factorize a Zarr matrix A ~ U diag(S) V^T with (epsilon, delta)-DP, reading it "
        "twice (the default two-pass release) or once (--algorithm spectral|low-space).",
    )
    f.add_argument("input", metavar="INPUT", help="path of a 2-D Zarr array")
    f.add_argument("--rank", "-k", type=int, required=True, help="target rank k")
    f.add_argument(
        "--out",
        "-o",
        help="Zarr group to publish U, S, V and the report to (required unless --plan)",
    )
    f.add_argument(
        "--plan",
        action="store_true",
        help="print each algorithm's sizes and predicted error (public error model) "
        "for this input's shape and these parameters, and stop: nothing is read, "
        "charged or written",
    )
    f.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    f.add_argument(
        "--algorithm",
        choices=("auto", "spectral", "low-space", "two-pass"),
        default="auto",
        help="default auto: two-pass for a private release (reads the store twice, "
        "exact sensitivities, both charged once before any noise; the most accurate), "
        "spectral (one pass) when --sketch-size, --padded or --operator gaussian asks "
        "for one pass, or with --non-private",
    )
    f.add_argument(
        "--padded",
        action="store_true",
        help="low-space only: the paper's padded construction (comparison)",
    )
    f.add_argument(
        "--operator",
        choices=("auto", "gaussian", "sparse-sign"),
        default="auto",
        help="distribution of the co-range sketch S (default auto: sparse-sign, 8 "
        "non-zeros per row, wherever its sensitivity is exact; gaussian where one "
        "individual spans a column of the sketched matrix)",
    )
    f.add_argument(
        "--sketch-size",
        "-t",
        type=int,
        help="range sketch size t of a one-pass algorithm (default: the error model's, "
        "see --plan, when private; max(3k, k+20) with --non-private)",
    )
    f.add_argument(
        "--core-size",
        "-v",
        type=int,
        help="co-range/core sketch size v (default: 2t one pass, max(10k, 100) two-pass, "
        "6t+1 with --non-private)",
    )
    f.add_argument(
        "--seed",
        type=int,
        help="sketch seed (data-independent; default: fresh secret). Never seeds noise. "
        "A given seed is public: private noise then covers its operators' worst case.",
    )
    f.add_argument(
        "--journal",
        help="crash-recovery journal (default: .OUT.dplr-journal beside OUT); "
        "rerunning the same command after a crash resumes from it",
    )
    f.add_argument(
        "--scratch",
        metavar="DIR",
        help="existing directory, reachable by every worker, for the tall "
        "intermediates (n_rows x t) between steps (default: beside OUT); the job "
        "uses a private subdirectory and removes it",
    )
    _add_cluster(f)
    f.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    f.add_argument("--json", action="store_true", help="print the full report as JSON")
    _add_privacy(f)


def _add_pca_parser(sub: Any) -> None:
    """``dplr pca``: a private top-k principal subspace."""
    pc = sub.add_parser(
        "pca",
        help="DP top-k PCA subspace of a Zarr matrix whose rows are individuals",
        description=(
            "Private top-k principal subspace (uncentred) for one row added or removed "
            "(or replaced): Analyze Gauss (1 pass) or the clipped, preconditioned block "
            "power method (1 + T passes)."
        ),
    )
    pc.add_argument("input", metavar="INPUT", help="path of a 2-D Zarr array (rows = individuals)")
    pc.add_argument("--rank", "-k", type=int, required=True, help="number of components k (<= columns)")
    pc.add_argument("--out", "-o", required=True, help="Zarr group to publish components and the report to")
    pc.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    pc.add_argument(
        "--method",
        choices=("auto", "power", "analyze-gauss"),
        default="auto",
        help="auto (default): Analyze Gauss, or the power method (T=3, R=sqrt(k/n)) "
        "when n/d exceeds 8 eigenvalue floors, from public quantities only; power: Analyze "
        "Gauss start + T clipped power iterations",
    )
    pc.add_argument("--iterations", "-T", type=int, help="public number of power iterations T (required for power)")
    pc.add_argument(
        "--clip-radius",
        "-R",
        type=float,
        help="public clip radius R of the power iterations (required for power; "
        "about 2*sqrt(k*log(n)/n) for incoherent data)",
    )
    pc.add_argument(
        "--select",
        action="store_true",
        help="choose R and T privately over public grids (instead of --iterations/--clip-radius)",
    )
    pc.add_argument(
        "--radius-grid",
        type=_floats,
        help="with --select: comma-separated public clip radii (default: powers of 2 from sqrt(k/n) to 1)",
    )
    pc.add_argument(
        "--iterations-grid",
        type=_ints,
        help="with --select: comma-separated public iteration counts (default: 1,2,4,8,16)",
    )
    pc.add_argument(
        "--expected-trials",
        type=float,
        help="with --select: expected number of random trials (default: 4 x grid size)",
    )
    pc.add_argument(
        "--row-norm-bound",
        type=float,
        default=1.0,
        help="public C: rows are divided by C, then clipped to norm 1 (default 1)",
    )
    pc.add_argument("--accounting", choices=("gdp", "paper"), default="gdp",
                    help="gdp: exact Gaussian calibration (default); paper: the paper's constants")
    pc.add_argument("--sensitivity", choices=("tight", "paper"), default="tight",
                    help="tight: exact sensitivities (default); paper: the paper's constants "
                    "(Gram 2 instead of sqrt(2) under --neighboring replace)")
    pc.add_argument("--neighboring", choices=("add-remove", "replace"), default="add-remove",
                    help="one row added or removed (default, as factorize) or replaced")
    pc.add_argument("--route", choices=("auto", "gram", "two-pass"), default="auto",
                    help="H from the client's Gram matrix (1+T passes) or from the data (1+2T)")
    pc.add_argument("--journal", help="release journal for crash recovery (default: .OUT.dplr-journal beside OUT)")
    _add_cluster(pc)
    pc.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    pc.add_argument("--json", action="store_true", help="print the full report as JSON")
    _add_privacy(pc, lrf=False)


def _add_coherent_options(pca: Any) -> None:
    """The options of ``dplr generate --kind pca-coherent``."""
    pca.add_argument(
        "--rank", type=int, help="target rank k, in [1, min(COLS, SUPPORT) - 1]"
    )
    pca.add_argument(
        "--support",
        type=int,
        help="rows carrying the top-k left singular vectors: a power of two "
        "<= ROWS (ROWS: perfectly incoherent; small: coherent)",
    )
    pca.add_argument(
        "--top", type=float, help="sigma_k^2, the k-th eigenvalue of A^T A"
    )
    pca.add_argument(
        "--bottom",
        type=float,
        help="sigma_{k+1}^2 = ... = sigma_d^2, in [0, TOP); eigengap TOP - BOTTOM",
    )
    pca.add_argument(
        "--head-ratio",
        type=float,
        help="sigma_1^2 = ... = sigma_{k-1}^2 = HEAD_RATIO * TOP (default 1.2)",
    )


def _add_generate_parser(sub: Any) -> None:
    """``dplr generate``: a synthetic Zarr matrix with a known spectrum."""
    g = sub.add_parser(
        "generate",
        help="write a synthetic Zarr matrix with a known spectrum",
        description=(
            "Write a synthetic matrix with a known SVD to a Zarr v3 array. "
            "--kind lowrank: A = c U diag(sigma) V^T with orthonormal U, V; max row "
            "norm = --max-row-norm. --kind pca-coherent: PCA test data whose top "
            "--rank left singular vectors live on --support rows (coherence "
            "1/sqrt(SUPPORT)), with sigma_k^2 = --top and sigma_{k+1}^2 = ... = "
            "--bottom; every row norm <= 1. Private power PCA beats Analyze Gauss "
            "on incoherent data (SUPPORT = ROWS) and loses on coherent data (small "
            "SUPPORT). The exact ground truth is stored in the array attributes."
        ),
    )
    g.add_argument("out", metavar="OUT", help="path of the new Zarr array")
    g.add_argument("--rows", type=int, required=True)
    g.add_argument("--cols", type=int, required=True)
    g.add_argument(
        "--kind",
        choices=("lowrank", "pca-coherent"),
        default="lowrank",
        help="lowrank (default): prescribed decay; pca-coherent: chosen "
        "coherence and eigengap, built in memory (ROWS * COLS <= 2^26)",
    )
    _add_coherent_options(g.add_argument_group("pca-coherent"))
    g.add_argument(
        "--spectrum",
        choices=("geometric", "flat"),
        default="geometric",
        help="decaying (decay^j) or flat tail of ones after a head",
    )
    g.add_argument(
        "--decay", type=float, default=0.9, help="geometric ratio (default 0.9)"
    )
    g.add_argument(
        "--head",
        type=int,
        default=10,
        help="flat: number of large singular values (default 10)",
    )
    g.add_argument(
        "--head-value",
        type=float,
        default=10.0,
        help="flat: their value relative to the tail (default 10)",
    )
    g.add_argument(
        "--max-rank",
        type=int,
        default=1024,
        help="number of non-zero singular values, at most (default 1024)",
    )
    g.add_argument(
        "--max-row-norm",
        type=float,
        default=1.0,
        help="largest row norm after scaling (default 1)",
    )
    g.add_argument(
        "--chunks",
        type=_pair,
        default=(10000, -1),
        help="ROWS,COLS of a chunk; -1 = whole axis (default 10000,-1)",
    )
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--overwrite", action="store_true")


def _add_demo_parser(sub: Any) -> None:
    """``dplr demo``: generate a sample matrix and factorize it."""
    d = sub.add_parser(
        "demo",
        help="generate a sample matrix and factorize it on an embedded cluster",
        description="Generate a 20000 x 2000 sample matrix with entries of order 1 and a rank-2 signal, "
        "declare a lifetime budget, release a (2, 1e-6)-DP rank-2 factorization with "
        "entry-level privacy on an embedded LocalCluster, and print the report.",
    )
    d.add_argument(
        "--dir", help="working directory (default: a new temporary directory)"
    )
    d.add_argument("--rows", type=int, default=20000)
    d.add_argument("--cols", type=int, default=2000)
    d.add_argument("--rank", type=int, default=2)
    d.add_argument("--epsilon", type=float, default=2.0)
    d.add_argument("--delta", type=float, default=1e-6)
    d.add_argument(
        "--scheduler", help="Dask scheduler address (default: an embedded LocalCluster)"
    )


def _add_budget_parser(sub: Any) -> None:
    """``dplr budget init|show``: a dataset's lifetime budget."""
    b = sub.add_parser(
        "budget", help="declare or show a dataset's lifetime privacy budget"
    )
    bsub = b.add_subparsers(dest="budget_command", required=True, metavar="ACTION")
    bi = bsub.add_parser("init", help="create the ledger with a lifetime budget")
    bi.add_argument(
        "dataset", metavar="DATASET", help="path of the dataset's Zarr store"
    )
    bi.add_argument("--epsilon", type=float, required=True)
    bi.add_argument("--delta", type=float, required=True)
    bi.add_argument(
        "--unit", default="row", choices=("row", "column", "entry", "entity"),
        help="who an individual is: the budget holds for one (default row; entity: streams)",
    )  # fmt: skip
    bi.add_argument(
        "--neighboring", default="add-remove", choices=("add-remove", "replace"),
        help="the neighbouring relation the budget holds under (default add-remove)",
    )  # fmt: skip
    bi.add_argument(
        "--ledger", help="ledger path (default: <DATASET>.dplr-ledger.json)"
    )
    bs = bsub.add_parser("show", help="print the budget and what has been spent")
    bs.add_argument("dataset", metavar="DATASET")
    bs.add_argument("--ledger")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dplr",
        description="Differentially private low-rank factorization of Zarr matrices on Dask.",
    )
    ap.add_argument("--version", action="version", version=f"dplr {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_factorize_parser,
        _add_pca_parser,
        _add_generate_parser,
        _add_demo_parser,
        _add_budget_parser,
    ):
        add(sub)
    from pipeline import cli_stream

    cli_stream.add_parsers(sub)
    return ap


def _version() -> str:
    from pipeline import __version__

    return __version__


def _budget_of(args: argparse.Namespace) -> tuple[float, float] | None:
    from pipeline.cli_stream import budget_of

    return budget_of(args)


def _ledger_lines(report: dict[str, Any]) -> list[str]:
    led = report.get("ledger")
    if not led:
        return []
    if led.get("kind") == "in-process":
        return [
            (f"  charged to this process's accountant (no ledger file): {led['n_releases']} "
            f"release(s) compose to epsilon={led['epsilon_used']:.4g} at "
            f"delta={led['delta_used']:.3g}")
        ]
    return [
        (f"  ledger: {led['path']}  lifetime budget (epsilon={led['budget_epsilon']:g}, "
        f"delta={led['budget_delta']:g}) for one {led['unit']} under {led['neighboring']} "
        f"neighbours; {led['n_releases']} release(s) compose to "
        f"epsilon={led['epsilon_used']:.4g} at the budget's delta")
    ]


def _summary(report: dict[str, Any], out: str) -> str:
    lines = [f"released rank-{report['rank']} factorization to {out}"]
    if report.get("epsilon") is None:
        lines.append("  NOT PRIVATE: non-private run (no clipping, no noise)")
    else:
        lines.append(
            f"  privacy: ({report['epsilon']:g}, {report['delta']:g})-DP, unit={report['privacy_unit']}, "
            f"neighboring={report['neighboring']}, clip norm={report['clip_norm']:g}"
        )
        for s in report["sketches"]:
            lines.append(
                f"  sketch {s['name']:<3} shape={tuple(s['shape'])} sensitivity={s['sensitivity']:.4g} sigma={s['sigma']:.4g}"
            )
        lines.extend(_ledger_lines(report))
        if not report["private"]:
            lines.append("  NOT PRIVATE: noise drawn from --insecure-noise-seed")
    p = report["parameters"]
    lines.append(
        f"  algorithm={report['algorithm']} t={p['sketch_size']} v={p['core_size']} passes={report['n_passes']} "
        f"time={report['timings_seconds'].get('total', float('nan')):.2f}s"
    )
    if report.get("resumed_from_journal"):
        lines.append(
            "  resumed from the journal of an interrupted run (same noise, no new charge)"
        )
    return "\n".join(lines)


def _options_of(args: argparse.Namespace) -> Any:
    """Where a release of ``dplr factorize`` or ``dplr pca`` goes and is charged."""
    from pipeline.release import ReleaseOptions

    return ReleaseOptions(
        out=args.out, overwrite=args.overwrite, ledger=args.ledger,
        budget=_budget_of(args), journal=args.journal,
        scratch=getattr(args, "scratch", None),
        insecure_noise_seed=args.insecure_noise_seed,
    )  # fmt: skip


def _runtime_of(args: argparse.Namespace) -> Any:
    from pipeline.release import Runtime

    return Runtime(
        scheduler=args.scheduler, cluster_config=_cluster_of(args),
        progress=None if args.quiet else sys.stderr,
    )  # fmt: skip


def _lrf_params_of(args: argparse.Namespace) -> Any:
    """The parameters of ``dplr factorize`` (what is released), validated."""
    from pipeline.algorithms.lrf import LrfParams

    return LrfParams.of(
        args.rank, epsilon=args.epsilon, delta=args.delta,  # refused with --non-private
        algorithm=args.algorithm, private=not args.non_private,
        sketch_size=args.sketch_size, core_size=args.core_size, clip_norm=args.clip_norm,
        unit=args.unit, neighboring=args.neighboring, padded=args.padded,
        operator=args.operator,
    )  # fmt: skip


def _factorize(args: argparse.Namespace) -> int:
    from pipeline.api import release_factorization

    if args.plan:
        return _factorize_plan(args)
    if args.out is None:
        raise InvalidParameterError(
            "dplr factorize needs --out (the Zarr group to publish to), or --plan to "
            "only print the predicted error."
        )

    result = release_factorization(
        args.input, _lrf_params_of(args), _options_of(args), _runtime_of(args),
        seed=args.seed,
    )  # fmt: skip
    print(
        json.dumps(result.report, indent=2)
        if args.json
        else _summary(result.report, args.out)
    )
    return EXIT_OK


def _factorize_plan(args: argparse.Namespace) -> int:
    """``dplr factorize --plan``: the error model's table, from metadata alone."""
    from pipeline.api import plan_factorization

    rows = plan_factorization(args.input, _lrf_params_of(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    lines = ["predicted additive spectral error (public error model; nothing read):"]
    for r in rows:
        if "refused" in r:
            lines.append(f"  {r['algorithm']:<10} not possible: {r['refused']}")
            continue
        lines.append(
            f"  {r['algorithm']:<10} passes={r['passes']} t={r['sketch_size']} "
            f"v={r['core_size']} range_weight={r['range_weight']:.3g} "
            f"error~{r['predicted_error']:.4g} ({r['ratio_to_full_gm']:.2f}x the "
            f"full-matrix Gaussian mechanism's {r['full_gm_error']:.4g})"
        )
    print("\n".join(lines))
    return EXIT_OK


def _pca_summary(report: dict[str, Any], out: str) -> str:
    p = report["parameters"]
    lines = [f"released rank-{report['rank']} PCA subspace ({p['method']}) to {out}"]
    if report.get("epsilon") is None:
        lines.append("  NOT PRIVATE: non-private run (no clipping, no noise)")
    else:
        lines.append(
            f"  privacy: ({report['epsilon']:g}, {report['delta']:g})-DP, "
            f"{report['parameters']['neighboring']} one row, "
            f"accountant={report['accountant']} (noise used is exactly epsilon={report['realised_epsilon']:.4g})"
        )
        for m in report["mechanisms"]:
            lines.append(
                f"  release {m['label']:<2} x{m['count']:<3} shape={tuple(m['shape'])} "
                f"sensitivity={m['sensitivity']:.4g} sigma={m['sigma']:.4g}"
            )
        lines.extend(_ledger_lines(report))
        if not report["private"]:
            lines.append("  NOT PRIVATE: noise drawn from --insecure-noise-seed")
    if report["resumed_releases"]:
        lines.append("  resumed journaled release(s) of an interrupted run")
    sel = report.get("selection")
    if sel:
        if not sel["warm_start_gap_test_passed"]:
            chosen = "warm-start gap test failed, Analyze Gauss estimate released"
        elif sel["selected_iterations"] == 0:
            chosen = "selected Analyze Gauss"
        else:
            chosen = f"selected R={sel['selected_clip_radius']:.4g} T={sel['selected_iterations']}"
        lines.append("  private selection: " + chosen)
        lines.append(f"  time={report['timings_seconds'].get('total', float('nan')):.2f}s")
        return "\n".join(lines)
    radius = p["clip_radius"]
    lines.append(
        f"  T={p['iterations']} R={'none' if radius is None else f'{radius:.4g}'} route={p['route']} "
        f"passes={report['n_passes']} time={report['timings_seconds'].get('total', float('nan')):.2f}s"
    )
    return "\n".join(lines)


def _pca_params_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """The parameters of ``dplr pca`` (what is released), validated; and its selection."""
    from pipeline.algorithms.power_pca import PcaParams
    from pipeline.api import Selection

    params = PcaParams(
        rank=args.rank, epsilon=args.epsilon, delta=args.delta, method=args.method,
        iterations=args.iterations, clip_radius=args.clip_radius,
        accounting=args.accounting, sensitivity=args.sensitivity,
        neighboring=args.neighboring, row_norm_bound=args.row_norm_bound, route=args.route,
        private=not args.non_private,
    )  # fmt: skip
    selection = Selection.of(params, args.select, args.radius_grid,
                             args.iterations_grid, args.expected_trials)  # fmt: skip
    return params, selection


def _pca(args: argparse.Namespace) -> int:
    from pipeline.api import release_pca

    params, selection = _pca_params_of(args)
    result = release_pca(
        args.input, params, _options_of(args), _runtime_of(args), selection=selection
    )
    print(json.dumps(result.report, indent=2) if args.json else _pca_summary(result.report, args.out))
    return EXIT_OK


def _generate(args: argparse.Namespace) -> int:
    from pipeline.io import generate_store

    def bar(done: int, total: int) -> None:
        sys.stderr.write(
            f"\r[{'#' * (40 * done // total):<40}] {100 * done // total:3d}% | writing row blocks"
        )
        if done == total:
            sys.stderr.write("\n")

    if args.kind == "pca-coherent":
        return _generate_pca(args, bar)
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("rank", "support", "top", "bottom", "head_ratio")
        if getattr(args, name) is not None
    ]
    if given:
        raise InvalidParameterError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only "
            "to --kind pca-coherent, got --kind lowrank."
        )
    meta = generate_store(
        args.out,
        args.rows,
        args.cols,
        spectrum=args.spectrum,
        decay=args.decay,
        head=args.head,
        head_value=args.head_value,
        max_rank=args.max_rank,
        max_row_norm=args.max_row_norm,
        chunks=args.chunks,
        dtype=args.dtype,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=bar,
    )
    print(
        f"wrote {args.rows} x {args.cols} {args.dtype} matrix to {args.out} "
        f"(spectrum {args.spectrum}, rank {meta['rank']}, max row norm {args.max_row_norm:g})"
    )
    return EXIT_OK


def _generate_pca(args: argparse.Namespace, bar: Any) -> int:
    from pipeline.io import generate_pca_store

    missing = [
        f"--{name}"
        for name in ("rank", "support", "top", "bottom")
        if getattr(args, name) is None
    ]
    if missing:
        raise InvalidParameterError(
            "--kind pca-coherent requires --rank, --support, --top and --bottom, "
            f"got no {', '.join(missing)}."
        )
    meta = generate_pca_store(
        args.out,
        args.rows,
        args.cols,
        args.rank,
        support=args.support,
        top=args.top,
        bottom=args.bottom,
        head_ratio=1.2 if args.head_ratio is None else args.head_ratio,
        chunks=args.chunks,
        dtype=args.dtype,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=bar,
    )
    print(
        f"wrote {args.rows} x {args.cols} {args.dtype} matrix to {args.out} "
        f"(pca-coherent, rank {meta['rank']}, support {meta['support']}, "
        f"coherence {meta['coherence']:.4g}, gap_k {meta['gap_k']:g}, "
        f"kappa_k {meta['kappa_k']:.4g}, max row norm {meta['max_row_norm']:.4g})"
    )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from pipeline.api import factorize
    from pipeline.io import generate_store

    work = args.dir or tempfile.mkdtemp(prefix="dplr-demo-")
    os.makedirs(work, exist_ok=True)
    store = os.path.join(work, "sample.zarr")
    out = os.path.join(work, "release.zarr")
    print(
        f"1/3 generating a {args.rows} x {args.cols} matrix with a rank-{args.rank} signal, entries of order 1, at {store}"
    )
    # entry-level privacy: one individual owns one cell (|a_ij| <= C = 1 after clipping);
    # a released U is per-row output, so row-level privacy would drown it in noise
    meta = generate_store(
        store,
        args.rows,
        args.cols,
        spectrum="flat",
        head=args.rank,
        head_value=30.0,
        max_row_norm=0.8 * math.sqrt(args.cols),
        chunks=(2500, -1),
        overwrite=True,
        seed=0,
    )
    ledger = store + ".dplr-ledger.json"
    for stale in (ledger, ledger + ".lock"):
        if os.path.exists(stale):
            os.remove(stale)  # the demo's store is new, so is its budget
    print(f"2/3 declaring a lifetime budget of (epsilon=10, delta=1e-5) in {ledger}")
    print(
        f"3/3 releasing a rank-{args.rank} ({args.epsilon:g}, {args.delta:g})-DP factorization (Spectral-LRF, unit=entry, C=1)"
    )
    result = factorize(
        store,
        args.rank,
        epsilon=args.epsilon,
        delta=args.delta,
        unit="entry",
        clip_norm=1.0,
        out=out,
        overwrite=True,
        budget=(10.0, 1e-5),
        scheduler=args.scheduler,
        progress=sys.stderr,
    )
    print(json.dumps(result.report, indent=2))
    print(_summary(result.report, out))
    true = ", ".join(f"{x:.1f}" for x in meta["singular_values"][: args.rank + 1])
    print(
        f"  released S = [{', '.join(f'{x:.1f}' for x in result.S)}]; the synthetic matrix's true "
        f"singular values are [{true}] (known because the demo generated it)"
    )
    return EXIT_OK


def _budget(args: argparse.Namespace) -> int:
    from pipeline.accounting.ledger import Ledger, default_ledger_path

    path = args.ledger or default_ledger_path(args.dataset)
    if args.budget_command == "init":
        from pipeline._validation import check_privacy_pair

        eps, dlt = check_privacy_pair(args.epsilon, args.delta)
        Ledger.create(
            path,
            dataset=os.path.basename(os.path.normpath(args.dataset)),
            epsilon=eps,
            delta=dlt,
            unit=args.unit,
            neighboring=args.neighboring,
        )
        print(
            f"declared lifetime budget (epsilon={eps:g}, delta={dlt:g}) for one "
            f"{args.unit} under {args.neighboring} neighbours in {path}"
        )
        return EXIT_OK
    book = Ledger.open(path)
    print(
        json.dumps(
            {
                "path": str(path),
                **book.remaining_summary(),
                "releases": len(book.releases),
            },
            indent=2,
        )
    )
    return EXIT_OK


def _stream(args: argparse.Namespace) -> int:
    from pipeline import cli_stream

    return cli_stream.run(args, _cluster_of)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dplr``; returns the exit code."""
    args = _parser().parse_args(argv)
    handlers = {
        "factorize": _factorize,
        "pca": _pca,
        "generate": _generate,
        "demo": _demo,
        "budget": _budget,
        "stream": _stream,
        "nightly": _stream,
    }
    try:
        return handlers[args.command](args)
    except BudgetExceededError as exc:
        print(f"dplr: refused: {exc}", file=sys.stderr)
        return EXIT_BUDGET
    except PipelineError as exc:
        print(f"dplr: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dplr: interrupted; nothing was published.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
