"""The ``dplr`` command line: the parser and :func:`main`.

Exit codes (workflows rely on them): 0 success; 2 bad input or configuration
(one line on stderr, nothing written or charged); 3 privacy budget exceeded
(refused before any data is read); 1 anything else (with a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from pipeline._version import __version__
from pipeline.cli import data as cli_data
from pipeline.cli import pca as cli_pca
from pipeline.cli import stream as cli_stream
from pipeline.cli.common import (
    EXIT_BUDGET,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    add_cluster,
    add_privacy,
    factorize_summary,
    options_of,
    runtime_of,
)
from pipeline.errors import BudgetExceededError, InvalidParameterError, PipelineError
from pipeline.io.objectstore import local_path, redact

__all__ = ["EXIT_BUDGET", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "main"]


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
        "spectral (one pass) when --sketch-size or --operator gaussian asks for one "
        "pass, or with --non-private; low-space with --padded",
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
        help="co-range/core sketch size v (default: one pass, the planned v, see --plan, "
        "or 2t for a larger --sketch-size; two-pass, max(10k, 100); 6t+1 with --non-private)",
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
    add_cluster(f)
    f.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    f.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_privacy(f)


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
    _add_factorize_parser(sub)
    cli_pca.add_parser(sub)
    cli_data.add_parsers(sub)
    _add_budget_parser(sub)
    cli_stream.add_parsers(sub)
    return ap


def _version() -> str:
    return __version__


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
        args.input, _lrf_params_of(args), options_of(args), runtime_of(args),
        seed=args.seed,
    )  # fmt: skip
    print(
        json.dumps(result.report, indent=2)
        if args.json
        else factorize_summary(result.report, args.out)
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


def _budget(args: argparse.Namespace) -> int:
    from pipeline.accounting.ledger import Ledger
    from pipeline.jobs.engine import default_ledger_of

    # beside a local store; an object-store dataset must name its ledger
    path = (
        local_path(args.ledger, "ledger", "--ledger")
        if args.ledger
        else default_ledger_of(args.dataset)
    )
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dplr``; returns the exit code."""
    args = _parser().parse_args(argv)
    handlers = {
        "factorize": _factorize,
        "pca": cli_pca.run,
        "generate": cli_data.run_generate,
        "demo": cli_data.run_demo,
        "budget": _budget,
        "stream": cli_stream.run,
        "nightly": cli_stream.run,
    }
    try:
        return handlers[args.command](args)
    except BudgetExceededError as exc:
        print(f"dplr: refused: {redact(str(exc))}", file=sys.stderr)
        return EXIT_BUDGET
    except PipelineError as exc:
        print(f"dplr: error: {redact(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dplr: interrupted; nothing was published.", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - any other failure: its traceback, URLs redacted
        print(redact(traceback.format_exc()), end="", file=sys.stderr)
        return EXIT_FAILURE
