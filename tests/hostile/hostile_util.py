"""Helpers of the hostile input suite (imported by module name, like cli_util)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the CLI helpers live beside the CLI tests (no package, no second conftest.py)
sys.path.insert(0, os.fspath(Path(__file__).resolve().parents[1] / "cli"))
from cli_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    run_dplr,
    run_in_process,
)

__all__ = [
    "assert_nothing_at",
    "assert_one_line_error",
    "file_state",
    "run_dplr",
    "run_in_process",
]
