"""The ``dplr nightly`` command (registered by :mod:`pipeline.cli.main`).

Exit codes, as for ``dplr stream``: 0 success, 2 bad input (nothing lost or
changed), 3 exhausted budget or horizon, 75 another run holds the stream's lock
(retry later), 1 any other failure.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.common import unless_locked


def add_parser(sub: Any) -> None:
    """Add ``nightly`` to ``sub``; it dispatches to :func:`run`."""
    n = sub.add_parser(
        "nightly",
        help="scheduled run of a stream job: ingest the date's batches, release, update latest",
        description=(
            "Ingest the batches that arrived for DATE (and any missed earlier dates), "
            "release, and point <releases>/latest at the new release. Idempotent, "
            "resumable after a crash, serialised by a lock."
        ),
    )
    n.add_argument(
        "--config",
        required=True,
        help="the job's TOML file (see workflows/nightly.toml)",
    )
    n.add_argument("--date", required=True, help="YYYY-MM-DD")
    n.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, plan and check the horizon and ledger; read and write nothing",
    )
    n.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``dplr nightly``: one scheduled run of a stream job; errors propagate to main()."""
    return unless_locked(_nightly, args)


def _nightly(a: argparse.Namespace) -> int:
    from pipeline.jobs.nightly import parse_date, run_nightly

    run_nightly(
        a.config,
        parse_date(a.date),
        dry_run=a.dry_run,
        say=lambda s: print(s, flush=True),
    )
    return 0
