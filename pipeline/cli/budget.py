"""The ``dplr budget init|show`` command (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pipeline.cli.common import EXIT_OK
from pipeline.io.objectstore import local_path


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
    bs = bsub.add_parser("show", help="print the budget and what has been spent")
    bs.add_argument("dataset", metavar="DATASET")
    bs.add_argument("--ledger")
    b.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``dplr budget init|show``: declare or show a dataset's lifetime budget."""
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
