"""Every claim of docs/privacy.md and docs/faults.md names a test, and the test exists.

The two documents state what dplr guarantees and what a crash costs, and each
statement names the test that asserts it (``tests/....py::test_name``, a whole
file, or a parametrised case ``test_name[id]``). This checks, statically, that

* every item of every list in the two documents names at least one test, except
  the lists of :data:`EXEMPT` (the user's obligations, what is not checked, proofs);
* every named file exists;
* every named test is a function defined at the top level of that file (or a
  method of a top-level class), so pytest collects it;
* every named parametrised case is collected by pytest under that exact id;
* every module path the documents cite (``pipeline/....py``) exists.

That each named test really asserts its claim is a matter of review; the
negative controls below run the same extraction and checks on made-up text, so
the checker is seen to find a missing test, case, file and module, and a listed
claim that names no test.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/privacy.md", "docs/faults.md")

#: ``tests/dir/file.py``, ``tests/dir/file.py::test_name``,
#: ``tests/dir/file.py::test_name[case-id]``, or a directory ``tests/dir/``.
TEST_REF = re.compile(r"`(tests/[\w/.-]*?(?:\.py|/))(?:::(\w+)(?:\[([^\]`]+)\])?)?`")
MODULE_REF = re.compile(r"`(pipeline/[\w/]+\.py)`")


def references(text: str) -> list[tuple[str, str | None, str | None]]:
    """The (path, test name, case id) triples named in ``text``."""
    return [(m.group(1), m.group(2), m.group(3)) for m in TEST_REF.finditer(text)]


@functools.cache
def _test_names(path: Path) -> frozenset[str]:
    """Test functions pytest would collect from ``path``: top level or in a class."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                n.name
                for n in node.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(n for n in names if n.startswith("test"))


@functools.cache
def _collected(path: str) -> frozenset[str]:
    """The node ids pytest collects from ``path`` (relative to the repository)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", path],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return frozenset(
        line.strip() for line in out.stdout.splitlines() if line.startswith(path + "::")
    )


def problems(text: str) -> list[str]:
    """What in ``text`` points at nothing (empty: every reference resolves)."""
    found: list[str] = []
    for path, name, case in references(text):
        target = ROOT / path
        if not target.exists():
            found.append(f"{path}: no such file or directory")
            continue
        if name is None:
            continue
        if name not in _test_names(target):
            found.append(f"{path}::{name}: no such test")
        elif case is not None and f"{path}::{name}[{case}]" not in _collected(path):
            found.append(f"{path}::{name}[{case}]: no such case")
    for path in MODULE_REF.findall(text):
        if not (ROOT / path).exists():
            found.append(f"{path}: no such module")
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_named_test_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    refs = references(text)
    # the extraction sees every test path the document mentions, in backquotes
    assert len(refs) == text.count("`tests/"), doc
    assert refs, doc
    assert problems(text) == []


#: Lists whose items are not claims a test could check, with the reason; keyed by
#: (document, the heading the list is under, or the line that introduces it).
EXEMPT = {
    ("docs/privacy.md", "## 6."): "the user's obligations",
    ("docs/privacy.md", "## 8."): "what no test checks",
    ("docs/privacy.md", "Why each holds:"): "proofs; the list after them checks them",
    (
        "docs/faults.md",
        "The durable steps of a run, in order:",
    ): "the table's test follows",
    ("docs/faults.md", "says what removing it costs:"): "the test follows the list",
}


def claim_items(doc: str, text: str) -> list[str]:
    """The bullet and numbered items of ``text`` outside the :data:`EXEMPT` lists."""
    items: list[str] = []
    heading = intro = ""
    in_list, keep = False, False
    for line in text.splitlines():
        if line.startswith("#"):
            heading, in_list = line, False
        elif line.startswith("* ") or re.match(r"\d+\. ", line):
            in_list = True
            keep = not any(
                d == doc and (heading.startswith(key) or intro.endswith(key))
                for d, key in EXEMPT
            )
            if keep:
                items.append(line)
        elif line.startswith("  ") and in_list:
            if keep:
                items[-1] += "\n" + line
        elif line.strip():
            intro, in_list = line.strip(), False
    return items


@pytest.mark.parametrize("doc", DOCS)
def test_every_listed_claim_names_a_test(doc: str) -> None:
    """Each item of every list in the two documents names the test that asserts it
    (or a test file), except the lists of :data:`EXEMPT`."""
    items = claim_items(doc, (ROOT / doc).read_text())
    assert len(items) >= 5  # the lists were found
    assert [item for item in items if not references(item)] == []


def test_checker_finds_what_is_missing() -> None:
    """Negative controls: a missing test, case, file and module are each reported."""
    here = "tests/unit/test_docs_claims.py"
    audit = "tests/audit/test_audit_mechanisms.py"
    good = (
        f"`{here}::test_checker_finds_what_is_missing`, `{here}`, `tests/unit/`, "
        f"`{audit}::test_audit[42-continual-correct-eps1]`, `pipeline/jobs/engine.py`"
    )
    assert problems(good) == []
    bad = (
        f"`{here}::test_that_was_renamed`, `tests/unit/test_gone.py::test_x`, "
        f"`{audit}::test_audit[42-no-such-case-eps1]`, `pipeline/gone.py`"
    )
    assert problems(bad) == [
        f"{here}::test_that_was_renamed: no such test",
        "tests/unit/test_gone.py: no such file or directory",
        f"{audit}::test_audit[42-no-such-case-eps1]: no such case",
        "pipeline/gone.py: no such module",
    ]
    # a helper that is not a test is not a test
    assert problems(f"`{here}::problems`") == [f"{here}::problems: no such test"]
    # a listed claim without a test is found; an exempt list is not checked
    listed = (
        f"## 1. Claims\n\n* a claim\n  with no test.\n* a claim: `{here}`.\n\n"
        "## 8. Not yet checked\n\n* not checked.\n"
    )
    items = claim_items("docs/privacy.md", listed)
    assert [references(item) == [] for item in items] == [True, False]
