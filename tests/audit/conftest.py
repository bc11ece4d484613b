"""Collects the audit results and prints them as a table at the end of the run."""

from __future__ import annotations

from typing import Any

import pytest
from audit_cases import table_rows

from pipeline.testing.audit import markdown_table

_ROWS = pytest.StashKey[list[dict[str, Any]]]()


@pytest.fixture(scope="session")
def audit_rows(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Result rows of this session's audits (appended by the tests)."""
    return request.config.stash.setdefault(_ROWS, [])


def pytest_terminal_summary(
    terminalreporter: Any, exitstatus: int, config: pytest.Config
) -> None:
    rows = config.stash.get(_ROWS, [])
    if rows:
        terminalreporter.section("privacy audit: eps lower bounds")
        terminalreporter.write_line(markdown_table(table_rows(rows)))
