"""Running ``python -m pipeline`` (the ``dplr`` command) as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The address of the session's shared cluster, set by the ``cli_cluster`` fixture
#: (tests/conftest.py) for the duration of a test that uses it.
SHARED_SCHEDULER: str | None = None


def run_dplr(
    *args: str | int | os.PathLike[str], timeout: float = 180, embedded: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline ARGS`` with stdout/stderr captured.

    A run without ``--scheduler`` connects to the session's shared cluster
    (through ``DASK_SCHEDULER_ADDRESS``), or with ``embedded=True`` (or when
    there is none) starts the embedded LocalCluster, as a user's run does.
    """
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    if not embedded and SHARED_SCHEDULER is not None:
        env["DASK_SCHEDULER_ADDRESS"] = SHARED_SCHEDULER
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            *(str(a) if isinstance(a, int) else os.fspath(a) for a in args),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


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


def file_state(path: Path) -> bytes | None:
    """The bytes of ``path``, or None if it does not exist."""
    return path.read_bytes() if path.exists() else None


def assert_one_line_error(
    proc: subprocess.CompletedProcess[str], code: int, prefix: str
) -> str:
    """Exit ``code``, exactly one line on stderr starting with ``prefix``, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1, proc.stderr
    assert "\r" not in lines[0], proc.stderr  # no progress bar either
    assert lines[0].startswith(prefix), lines[0]
    assert proc.stdout == ""
    return lines[0]


def assert_nothing_at(out: Path) -> None:
    """No release at ``out`` and no temporary publication left beside it."""
    assert not os.path.lexists(out)
    leftovers = [
        p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")
    ]
    assert leftovers == []


def leading_json(text: str) -> dict[str, Any]:
    """The first JSON object printed in ``text`` (the report of --json or demo)."""
    start = text.index("{\n")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    assert isinstance(obj, dict)
    return obj
