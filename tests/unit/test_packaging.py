"""pyproject.toml ships every package and the top-level configuration folders.

The packages are listed by hand (a folder mapped into the package, such as
``cluster/`` -> ``pipeline.share.cluster``, cannot be found by ``packages.find``),
so a new subpackage must be added there: this test fails until it is.
tests/cli/test_install.py builds and installs the wheel itself.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pipeline

ROOT = Path(pipeline.__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _code_packages() -> set[str]:
    """Every directory under pipeline/ that holds Python modules."""
    pkg = ROOT / "pipeline"
    return {
        ".".join(d.relative_to(ROOT).parts)
        for d in [pkg, *pkg.rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }


def test_every_package_is_listed() -> None:
    listed = set(SETUPTOOLS["packages"])
    code = _code_packages()
    assert code <= listed, f"add to [tool.setuptools] packages: {sorted(code - listed)}"
    assert "pipeline.cli" in code  # negative control: the walk sees packages


def test_the_shipped_folders_are_mapped_and_listed() -> None:
    dirs = SETUPTOOLS["package-dir"]
    assert dirs == {
        "pipeline.share.cluster": "cluster",
        "pipeline.share.workflows": "workflows",
    }
    listed = set(SETUPTOOLS["packages"])
    for package, folder in dirs.items():
        for sub in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            if sub.is_dir():
                rel = sub.relative_to(ROOT / folder).parts
                assert ".".join((package, *rel)) in listed, sub
