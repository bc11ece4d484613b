"""Helpers of the hostile input suite (imported by module name, like cli_util)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# the CLI helpers live beside the CLI tests (no package, no second conftest.py)
sys.path.insert(0, os.fspath(Path(__file__).resolve().parents[1] / "cli"))
from cli_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    run_dplr,
)

__all__ = [
    "assert_nothing_at",
    "assert_one_line_error",
    "file_state",
    "run_dplr",
    "run_in_process",
]


def run_in_process(
    capsys: pytest.CaptureFixture[str], *args: Any
) -> subprocess.CompletedProcess[str]:
    """``dplr ARGS`` through :func:`pipeline.cli.main` in this process.

    The same argument parsing, exit codes and stderr line as the subprocess, without
    an interpreter start (seconds each on a loaded machine); used for refusals that
    happen before any cluster starts, once the same kind of case has run as a
    subprocess. A traceback here would be an exception that fails the test.
    """
    from pipeline.cli import main

    argv = [
        f"{a!r}"
        if isinstance(a, float)
        else os.fspath(a)
        if isinstance(a, os.PathLike)
        else str(a)
        for a in args
    ]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)
