"""The ``dplr factorize`` command (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.cli.common import (
    EXIT_OK,
    add_cluster,
    add_params,
    add_privacy,
    factorize_summary,
    options_of,
    params_of,
    runtime_of,
    warn_signal,
)
from pipeline.errors import InvalidParameterError
from pipeline.params import LrfParams, Runtime


def add_parser(sub: Any) -> None:
    """Add ``factorize`` to ``sub``; it dispatches to :func:`run`."""
    f = sub.add_parser(
        "factorize",
        help="DP factorization U, S, V of a Zarr matrix",
        description="Factorize a Zarr matrix A ~ U diag(S) V^T with (epsilon, delta)-DP, reading it "
        "twice (the default two-pass release) or once (--algorithm spectral|low-space).",
    )
    f.add_argument("input", metavar="INPUT", help="path of a 2-D Zarr array")
    add_params(f, LrfParams, "target")
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
    add_params(f, LrfParams, "method")
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
    add_cluster(f)
    add_params(f, Runtime, "runtime")
    f.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    f.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_privacy(f, LrfParams)
    f.set_defaults(handler=run)


def _lrf_params_of(args: argparse.Namespace) -> LrfParams:
    """The parameters of ``dplr factorize`` (what is released), validated."""
    return params_of(LrfParams, args)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    """``dplr factorize``: a private (or non-private) factorization of a Zarr matrix."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import release_factorization

    if args.plan:
        return _plan(args)
    if args.out is None:
        raise InvalidParameterError(
            "dplr factorize needs --out (the Zarr group to publish to), or --plan to "
            "only print the predicted error."
        )

    result = release_factorization(
        args.input, _lrf_params_of(args), options_of(args), runtime_of(args),
        seed=args.seed,
    )  # fmt: skip
    print(
        json.dumps(result.report, indent=2)
        if args.json
        else factorize_summary(result.report, args.out)
    )
    warn_signal(result.report)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    """``dplr factorize --plan``: the error model's table, from metadata alone."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import plan_factorization

    rows = plan_factorization(args.input, _lrf_params_of(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    lines = [
        (
            "predicted additive spectral error (public error model; nothing read) and the "
            "noise level released singular values must exceed to stand above the noise:"
        )
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"  {r['algorithm']:<10} not possible: {r['refused']}")
            continue
        lines.append(
            f"  {r['algorithm']:<10} passes={r['passes']} t={r['sketch_size']} "
            f"v={r['core_size']} range_weight={r['range_weight']:.3g} "
            f"error~{r['predicted_error']:.4g} ({r['ratio_to_full_gm']:.2f}x the "
            f"full-matrix Gaussian mechanism's {r['full_gm_error']:.4g}); noise "
            f"level {r['noise_level']:.4g} at 95%"
        )
    print("\n".join(lines))
    return EXIT_OK
