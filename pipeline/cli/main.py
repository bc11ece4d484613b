"""The ``dplr`` command line: the parser and :func:`main`.

Exit codes (workflows rely on them): 0 success; 2 bad input or configuration
(one line on stderr, nothing written or charged); 3 privacy budget exceeded
(refused before any data is read); 1 anything else (with a traceback).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from pipeline._version import __version__
from pipeline.cli import budget, cluster, data, factorize, nightly, pca, show, stream
from pipeline.cli.common import (
    EXIT_BUDGET,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    cli_words,
    option_strings,
)
from pipeline.errors import BudgetExceededError, PipelineError
from pipeline.jobs.locations import redact

__all__ = ["EXIT_BUDGET", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dplr",
        description="Differentially private low-rank factorization of Zarr matrices on Dask.",
    )
    ap.add_argument("--version", action="version", version=f"dplr {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order ``dplr --help`` lists them
    factorize.add_parser(sub)
    pca.add_parser(sub)
    data.add_parser(sub)
    budget.add_parser(sub)
    stream.add_parser(sub)
    nightly.add_parser(sub)
    show.add_parser(sub)
    cluster.add_parser(sub)
    return ap


def _version() -> str:
    return __version__


def _said(exc: PipelineError) -> str:
    """The error as the command line states it (flags, not Python calls)."""
    return str(exc) if exc.cli is None else exc.cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dplr``; returns the exit code."""
    parser = _parser()
    words = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(words)
    # each verb's add_parser set its handler
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BudgetExceededError as exc:
        text = cli_words(_said(exc), option_strings(parser, words))
        print(f"dplr: refused: {redact(text)}", file=sys.stderr)
        return EXIT_BUDGET
    except PipelineError as exc:
        text = cli_words(_said(exc), option_strings(parser, words))
        print(f"dplr: error: {redact(text)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dplr: interrupted; nothing was published.", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - any other failure: its traceback, URLs redacted
        print(redact(traceback.format_exc()), end="", file=sys.stderr)
        return EXIT_FAILURE
