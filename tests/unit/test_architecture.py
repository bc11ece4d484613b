"""The layering rules of design.md section 2, checked on the import graph.

* the math core (linalg, sketches, mechanisms, accounting, algorithms) imports no
  dask, distributed or zarr, so every algorithm runs and is tested on numpy;
* only ``pipeline.io`` imports zarr; only ``pipeline.execution``, ``pipeline.io``,
  ``pipeline.api`` and ``pipeline.cli`` import dask or distributed;
* ``execution`` never imports ``mechanisms.noise`` (noise is drawn in the core);
* nothing imports ``pipeline.cli``.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import pipeline
from pipeline.algorithms.lrf import plan_lrf, run_lrf
from pipeline.api import factorize
from pipeline.mechanisms.clipping import clip_entries, scale_factors_from_sumsq
from pipeline.mechanisms.noise import GaussianNoise
from pipeline.sketches.apply import block_partials, check_finite_block, clip_block

ROOT = pathlib.Path(pipeline.__file__).parent
CORE = ("linalg", "sketches", "mechanisms", "accounting", "algorithms")


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _modules() -> list[tuple[str, pathlib.Path]]:
    return [(str(p.relative_to(ROOT).with_suffix("")).replace("/", "."), p) for p in ROOT.rglob("*.py")]


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize(("module", "path"), _modules(), ids=lambda x: str(x))
def test_layering(module: str, path: pathlib.Path) -> None:
    imports = _imports(path)
    tops = {_top(n) for n in imports}
    package = module.split(".")[0]
    if package in CORE:
        assert not tops & {"dask", "distributed", "zarr"}, f"{module} imports {tops & {'dask', 'distributed', 'zarr'}}"
    if package != "io":
        assert "zarr" not in tops, f"{module} imports zarr"
    if package not in ("execution", "io", "api", "cli"):
        assert not tops & {"dask", "distributed"}, f"{module} imports dask/distributed"
    if package == "execution":
        assert "pipeline.mechanisms.noise" not in imports
    assert "pipeline.cli" not in imports or module == "__main__", f"{module} imports pipeline.cli"


def test_layering_negative_control() -> None:
    """The checker sees a forbidden import when there is one."""
    assert "dask" in {_top(n) for n in _imports(ROOT / "execution" / "source.py")}


@pytest.mark.parametrize(
    "obj",
    [block_partials, clip_block, check_finite_block, scale_factors_from_sumsq, clip_entries,
     GaussianNoise, plan_lrf, run_lrf, factorize],
    ids=lambda o: o.__name__,
)
def test_privacy_paragraph(obj: object) -> None:
    """Every callable that touches raw data or draws noise documents its privacy (style B.5)."""
    doc = inspect.getdoc(obj) or ""
    assert "Privacy." in doc, f"{getattr(obj, '__name__', obj)} lacks a 'Privacy.' paragraph"
