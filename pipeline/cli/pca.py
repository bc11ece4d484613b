"""The ``dplr pca`` command (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.cli.common import (
    EXIT_OK,
    add_cluster,
    add_privacy,
    floats,
    ints,
    ledger_lines,
    options_of,
    runtime_of,
    time_field,
)
from pipeline.io.objectstore import redact


def add_parser(sub: Any) -> None:
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
    pc.add_argument(
        "input", metavar="INPUT", help="path of a 2-D Zarr array (rows = individuals)"
    )
    pc.add_argument(
        "--rank",
        "-k",
        type=int,
        required=True,
        help="number of components k (<= columns)",
    )
    pc.add_argument(
        "--out",
        "-o",
        required=True,
        help="Zarr group to publish components and the report to",
    )
    pc.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    pc.add_argument(
        "--method",
        choices=("auto", "power", "analyze-gauss"),
        default="auto",
        help="auto (default): Analyze Gauss, or the power method (T=3, R=sqrt(k/n)) "
        "when n/d exceeds 8 eigenvalue floors, from public quantities only; power: Analyze "
        "Gauss start + T clipped power iterations",
    )
    pc.add_argument(
        "--iterations",
        "-T",
        type=int,
        help="public number of power iterations T (required for power)",
    )
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
        type=floats,
        help="with --select: comma-separated public clip radii (default: the auto rule's "
        "sqrt(k/n); with --expected-trials: powers of 2 from sqrt(k/n) to 1)",
    )
    pc.add_argument(
        "--iterations-grid",
        type=ints,
        help="with --select: comma-separated public iteration counts (default: the auto "
        "rule's 3; with --expected-trials: 1,2,4,8,16)",
    )
    pc.add_argument(
        "--expected-trials",
        type=float,
        help="with --select: random stopping over the grids with this expected number of "
        "trials (default: none; every candidate then runs once)",
    )
    pc.add_argument(
        "--row-norm-bound",
        type=float,
        default=1.0,
        help="public C: rows are divided by C, then clipped to norm 1 (default 1)",
    )
    pc.add_argument(
        "--accounting",
        choices=("gdp", "paper"),
        default="gdp",
        help="gdp: exact Gaussian calibration (default); paper: the paper's constants",
    )
    pc.add_argument(
        "--sensitivity",
        choices=("tight", "paper"),
        default="tight",
        help="tight: exact sensitivities (default); paper: the paper's constants "
        "(Gram 2 instead of sqrt(2) under --neighboring replace)",
    )
    pc.add_argument(
        "--neighboring",
        choices=("add-remove", "replace"),
        default="add-remove",
        help="one row present or a zero row, n public (default, as factorize), "
        "or one row replaced",
    )
    pc.add_argument(
        "--route",
        choices=("auto", "gram", "two-pass"),
        default="auto",
        help="H from the client's Gram matrix (1+T passes) or from the data (1+2T)",
    )
    pc.add_argument(
        "--journal",
        help="release journal for crash recovery (default: .OUT.dplr-journal beside OUT)",
    )
    add_cluster(pc)
    pc.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    pc.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_privacy(pc, lrf=False)
    pc.set_defaults(handler=run)


def _summary(report: dict[str, Any], out: str) -> str:
    p = report["parameters"]
    lines = [
        f"released rank-{report['rank']} PCA subspace ({p['method']}) to {redact(out)}"
    ]
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
        lines.extend(ledger_lines(report))
        if not report["private"]:
            lines.append("  NOT PRIVATE: noise drawn from --insecure-noise-seed")
    if report["resumed_releases"]:
        lines.append("  resumed journaled release(s) of an interrupted run")
    sel = report.get("selection")
    if sel:
        if not sel["warm_start_gap_test_passed"]:
            chosen = (
                "released the Analyze Gauss estimate: the released eigenvalues "
                "show no eigengap above the noise between the k-th and the "
                "(k+1)-th, so the candidates could not be compared"
            )
        elif sel["selected_iterations"] == 0:
            chosen = "selected Analyze Gauss"
        else:
            chosen = f"selected R={sel['selected_clip_radius']:.4g} T={sel['selected_iterations']}"
        # no time: the run's duration would reveal the number of trials
        lines.append("  private selection: " + chosen)
        return "\n".join(lines)
    radius = p["clip_radius"]
    lines.append(
        f"  T={p['iterations']} R={'none' if radius is None else f'{radius:.4g}'} route={p['route']} "
        f"passes={report['n_passes']}" + time_field(report)
    )
    return "\n".join(lines)


def _params_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """The parameters of ``dplr pca`` (what is released), validated; and its selection."""
    from pipeline.algorithms.pca import PcaParams
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


def run(args: argparse.Namespace) -> int:
    """``dplr pca``: one release through :func:`pipeline.api.release_pca`."""
    from pipeline.api import release_pca

    params, selection = _params_of(args)
    result = release_pca(
        args.input, params, options_of(args), runtime_of(args), selection=selection
    )
    print(
        json.dumps(result.report, indent=2)
        if args.json
        else _summary(result.report, args.out)
    )
    return EXIT_OK
