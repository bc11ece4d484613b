"""The ``dplr budget init|show`` command (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline._validation import check_privacy_pair
from pipeline.cli.common import EXIT_OK
from pipeline.jobs.locations import local_path


def add_parser(sub: Any) -> None:
    """Add ``budget`` (init, show) to ``sub``; it dispatches to :func:`run`."""
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
    bs = bsub.add_parser(
        "show",
        help="print the budget, what has been spent and what is left, and each release",
    )
    bs.add_argument("dataset", metavar="DATASET")
    bs.add_argument("--ledger")
    bs.add_argument(
        "--json", action="store_true",
        help="print the ledger's summary as JSON (for scripts) instead of the table",
    )  # fmt: skip
    b.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``dplr budget init|show``: declare or show a dataset's lifetime budget."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.jobs.engine import Ledger, default_ledger_of

    # beside a local store; an object-store dataset must name its ledger
    path = (
        local_path(args.ledger, "ledger", "--ledger")
        if args.ledger
        else default_ledger_of(args.dataset)
    )
    if args.budget_command == "init":
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
    summary = book.remaining_summary()
    if args.json:
        print(
            json.dumps(
                {"path": str(path), **summary, "releases": len(book.releases)},
                indent=2,
            )
        )
        return EXIT_OK
    print(budget_table(str(path), summary, book.releases))
    return EXIT_OK


def budget_table(
    path: str, summary: Mapping[str, Any], releases: Sequence[Mapping[str, Any]]
) -> str:
    """``dplr budget show``: the budget, epsilon spent and left at its delta, each release.

    Privacy. Only public quantities: the declared budget, the releases' own
    ``(epsilon, delta)``, contracts and published times, and epsilon composed
    from them (``Ledger.spent``).
    """
    eps_b, delta_b = summary["budget_epsilon"], summary["budget_delta"]
    spent = summary["epsilon_used"]
    left = max(eps_b - spent, 0.0)
    assumed = " (assumed for a ledger written before contracts)" if summary[
        "contract_assumed"
    ] else ""  # fmt: skip
    who = f"one {summary['unit']} under {summary['neighboring']} neighbours"
    how = (
        f"{len(releases)} release(s) composed exactly at the budget's delta, not "
        "added up: docs/privacy.md section 7"
    )
    lines = [
        f"ledger  {path} (dataset {summary['dataset']})",
        f"budget  epsilon {eps_b:g}, delta {delta_b:g} for {who}{assumed}",
        f"spent   epsilon {_eps(spent)} at delta {delta_b:g} ({how})",
        f"left    epsilon {_eps(left)} at delta {delta_b:g}",
    ]
    if not releases:
        return "\n".join(lines)
    rows = [("date", "kind", "epsilon", "delta", "unit", "relation")]
    for rec in releases:
        contract = rec.get("contract") or {}
        rows.append((
            str(rec["time"])[:10], str(rec["algorithm"]), f"{rec['epsilon']:g}",
            f"{rec['delta']:g}", str(contract.get("unit", "-")),
            str(contract.get("neighboring", "-")),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    if any(r[4] == "-" for r in rows[1:]):
        lines.append(
            "-: recorded before contracts; read as add-remove at the ledger's unit"
        )
    return "\n".join(lines)


def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"
