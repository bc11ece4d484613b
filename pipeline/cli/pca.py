"""The ``dplr pca`` command (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from pipeline.cli.common import (
    EXIT_OK,
    add_cluster,
    add_params,
    add_privacy,
    floats,
    ints,
    ledger_lines,
    options_of,
    params_of,
    runtime_of,
    signal_lines,
    time_field,
    warn_signal,
)
from pipeline.errors import InvalidParameterError
from pipeline.jobs.locations import redact
from pipeline.params import PcaParams, Runtime

if TYPE_CHECKING:
    from pipeline.jobs.pca import Selection


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
    add_params(pc, PcaParams, "target")
    pc.add_argument(
        "--out",
        "-o",
        help="Zarr group to publish components and the report to (required unless --plan)",
    )
    pc.add_argument(
        "--plan",
        action="store_true",
        help="print the method, the noise and the noise level the released eigenvalues "
        "must exceed (public values only) for this input's shape and these parameters, "
        "and stop: nothing is read, charged or written",
    )
    pc.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    add_params(pc, PcaParams, "method")
    _add_selection(pc)
    add_params(pc, PcaParams, "input")
    add_params(pc, PcaParams, "model")
    pc.add_argument(
        "--journal",
        help="release journal for crash recovery (default: .OUT.dplr-journal beside OUT)",
    )
    add_cluster(pc)
    add_params(pc, Runtime, "runtime")
    pc.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    pc.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_privacy(pc, PcaParams)
    pc.set_defaults(handler=run)


def _add_selection(pc: Any) -> None:
    """The flags of a private selection of ``(R, T)`` (:class:`Selection`)."""
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
        lines.extend(signal_lines(report))
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


def _params_of(args: argparse.Namespace) -> tuple[PcaParams, Selection | None]:
    """The parameters of ``dplr pca`` (what is released), validated; and its selection."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import Selection

    params = params_of(PcaParams, args)
    selection = Selection.of(params, args.select, args.radius_grid,
                             args.iterations_grid, args.expected_trials)  # fmt: skip
    return params, selection


def run(args: argparse.Namespace) -> int:
    """``dplr pca``: one release through :func:`pipeline.api.release_pca`."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import release_pca

    if args.plan:
        return _plan(args)
    if args.out is None:
        raise InvalidParameterError(
            "dplr pca needs --out (the Zarr group to publish to), or --plan to only "
            "print the method and the noise level."
        )
    params, selection = _params_of(args)
    result = release_pca(
        args.input, params, options_of(args), runtime_of(args), selection=selection
    )
    print(
        json.dumps(result.report, indent=2)
        if args.json
        else _summary(result.report, args.out)
    )
    warn_signal(result.report)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    """``dplr pca --plan``: the method, the noise and the noise level, from metadata alone."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import plan_pca_release

    params, selection = _params_of(args)
    plan = plan_pca_release(args.input, params, selection=selection)
    print(json.dumps(plan, indent=2) if args.json else _plan_text(plan))
    return EXIT_OK


def _plan_text(plan: dict[str, Any]) -> str:
    """The human form of :func:`pipeline.api.plan_pca_release`'s plan."""
    n, d = plan["shape"]
    lines = [
        (
            f"plan of a rank-{plan['rank']} PCA of a {n} x {d} matrix at "
            f"({plan['epsilon']:g}, {plan['delta']:g})-DP, one row "
            f"({plan['neighboring']}); public values only: nothing read, charged or written"
        )
    ]
    auto = plan["auto"]
    if plan["method"] is None:
        lines.append(f"  method {plan['method_depends_on']}")
    else:
        why = ""
        if auto and "n_over_d_gamma" in auto:
            op = ">=" if auto["chosen"] == "power" else "<"
            why = (
                f" (auto: n / (d gamma) = {auto['n_over_d_gamma']:.3g} {op} "
                f"margin {auto['margin']:g})"
            )
        radius = plan["clip_radius"]
        lines.append(
            f"  method {plan['method']}{why}: T={plan['iterations']} "
            f"R={'none' if radius is None else f'{radius:.4g}'} route={plan['route']} "
            f"passes={plan['passes']}"
        )
    for m in plan["mechanisms"] or []:
        lines.append(
            f"  release {m['label']:<4} x{m['count']:<3} shape={tuple(m['shape'])} "
            f"sensitivity={m['sensitivity']:.4g} sigma={m['sigma']:.4g}"
        )
    if not plan["mechanisms"]:
        lines.append(f"  release M    noise sigma={plan['noise_init']:.4g}")
    c = plan["row_norm_bound"]
    lines.append(
        f"  noise level {plan['noise_level']:.4g} at {plan['confidence']:.0%} of the "
        "released eigenvalues: one above it stands above the noise"
    )
    lines.append(
        f"  an eigenvalue of A^T A (rows divided by C={c:g}) above "
        f"{plan['true_eigenvalue_above']:.4g} (a singular value of A above "
        f"{c * math.sqrt(plan['true_eigenvalue_above']):.4g}) is released above the "
        "level with the same confidence (Weyl's inequality)"
    )
    return "\n".join(lines)
