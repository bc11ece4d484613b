"""The ``dplr nightly`` command (registered by :mod:`pipeline.cli.main`).

Exit codes, as for ``dplr stream``: 0 success, 2 bad input (nothing lost or
changed), 3 exhausted budget or horizon, 75 another run holds the stream's lock
(retry later), 1 any other failure.
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

from pipeline._shipped import shipped_file, shipped_files
from pipeline.cli.common import unless_locked
from pipeline.errors import InvalidParameterError


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
        help="the job's TOML file, or the name of an installed example "
        "(nightly; `dplr cluster list` shows where it is)",
    )
    n.add_argument(
        "--date",
        help="YYYY-MM-DD (default: today's local date, printed; scheduled runs "
        "pass yesterday's date, see workflows/README.md)",
    )
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
    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.nightly import parse_date, run_nightly

    config = job_file(a.config)
    if a.date is None:
        day = datetime.date.today()
        print(
            f"date {day.isoformat()} (today's local date: no --date given)", flush=True
        )
    else:
        day = parse_date(a.date)
    run_nightly(config, day, dry_run=a.dry_run, say=lambda s: print(s, flush=True))
    return 0


def job_file(config: str) -> str:
    """The job file ``--config`` names: an existing file, else the installed
    example of that name (``nightly``)."""
    if os.path.exists(config):
        return config
    found = shipped_file("workflows", config)
    if found is not None:
        return os.fspath(found)
    names = ", ".join(shipped_files("workflows")) or "none"
    raise InvalidParameterError(
        f"job file {config!r} does not exist and is not the name of an installed "
        f"example ({names}; `dplr cluster list` shows where they are)."
    )
