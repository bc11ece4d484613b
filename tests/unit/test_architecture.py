"""The layering rules of design.md section 2, checked on the import graph.

* the math core (linalg, sketches, mechanisms, accounting, algorithms) imports no
  dask, distributed or zarr, so every algorithm runs and is tested on numpy;
* only ``pipeline.io`` imports zarr; only ``pipeline.execution``, ``pipeline.io``,
  ``pipeline.api`` and ``pipeline.cli`` import dask or distributed;
* ``execution`` never imports ``mechanisms.noise`` (noise is drawn in the core);
* nothing imports ``pipeline.cli``;
* the import graph of ``pipeline/`` (every import, module level or function-local,
  read from the AST) has no cycle, no import from a layer to a layer above it
  (:data:`LAYERS`), no ``_private`` name taken from another module and no
  function-local import outside the optional/heavy dependencies of
  :data:`BOUNDARY`; what remains of the last three is listed exactly
  (``KNOWN_*``), so it can only shrink. Each checker has a negative control.
"""

from __future__ import annotations

import ast
import dataclasses
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
    return [
        (str(p.relative_to(ROOT).with_suffix("")).replace("/", "."), p)
        for p in ROOT.rglob("*.py")
    ]


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize(("module", "path"), _modules(), ids=lambda x: str(x))
def test_layering(module: str, path: pathlib.Path) -> None:
    imports = _imports(path)
    tops = {_top(n) for n in imports}
    package = module.split(".")[0]
    if package in CORE:
        assert not tops & {"dask", "distributed", "zarr"}, (
            f"{module} imports {tops & {'dask', 'distributed', 'zarr'}}"
        )
    if package != "io":
        assert "zarr" not in tops, f"{module} imports zarr"
    if package not in ("execution", "io", "api", "cli"):
        assert not tops & {"dask", "distributed"}, f"{module} imports dask/distributed"
    if package == "execution":
        assert "pipeline.mechanisms.noise" not in imports
    into_cli = {
        n for n in imports if n == "pipeline.cli" or n.startswith("pipeline.cli.")
    }
    assert not into_cli or package == "cli" or module == "__main__", (
        f"{module} imports {into_cli}"
    )


def test_layering_negative_control() -> None:
    """The checker sees a forbidden import when there is one."""
    assert "dask" in {_top(n) for n in _imports(ROOT / "execution" / "source.py")}


@pytest.mark.parametrize(
    "obj",
    [
        block_partials,
        clip_block,
        check_finite_block,
        scale_factors_from_sumsq,
        clip_entries,
        GaussianNoise,
        plan_lrf,
        run_lrf,
        factorize,
    ],
    ids=lambda o: o.__name__,
)
def test_privacy_paragraph(obj: object) -> None:
    """Every callable that touches raw data or draws noise documents its privacy (style B.5)."""
    doc = inspect.getdoc(obj) or ""
    assert "Privacy." in doc, (
        f"{getattr(obj, '__name__', obj)} lacks a 'Privacy.' paragraph"
    )


# --------------------------------------------------------------------------
# The import graph of pipeline/ (design.md section 2, style.md B.2)
# --------------------------------------------------------------------------
#: The layers, lowest first; a module imports only its own layer and those below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "_types", "_validation", "_sealed", "_durable", "_version", "_shipped"),
    ("params",),
    ("linalg",),
    ("sketches",),
    ("accounting",),
    ("mechanisms",),
    ("algorithms",),
    ("io", "execution"),
    ("jobs",),
    ("api", "estimators"),
    (
        "cli",
        "__main__",
        "__init__",
        "testing",
    ),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
#: Optional or heavy third-party modules: a function-local import of one of them
#: keeps it off the import path of callers that do not need it.
BOUNDARY = frozenset({
    "dask", "distributed", "zarr", "dp_accounting", "s3fs", "matplotlib", "numcodecs",
    "dask_jobqueue", "dask_kubernetes", "kr8s", "httpx", "fsspec",
})  # fmt: skip
#: Imports from a layer to a layer above it that remain (they may only go away).
KNOWN_UPWARD = frozenset({
    ("pipeline.jobs.centred_pca", "pipeline.api"),
    ("pipeline.sketches.apply", "pipeline.mechanisms.clipping"),
})  # fmt: skip
#: ``_private`` names still imported across modules (they may only go away).
KNOWN_PRIVATE = frozenset({
    ("pipeline.accounting.pca", "pipeline.accounting.pca_paper._paper_constants"),
    ("pipeline.accounting.pca_paper", "pipeline.accounting.pca_random_stopping._trial_rho"),
    ("pipeline.execution.pca", "pipeline.execution.source._bands"),
    ("pipeline.execution.pca", "pipeline.execution.source._concat_rows"),
    ("pipeline.execution.pca", "pipeline.execution.source._name"),
    ("pipeline.execution.pca", "pipeline.execution.source._tree"),
})  # fmt: skip
#: Function-local imports outside :data:`BOUNDARY` that remain, as (module, target)
#: pairs: the list may only shrink.
KNOWN_LOCAL = frozenset({
    ("pipeline", "pipeline.accounting.ledger"),
    ("pipeline", "pipeline.algorithms.base"),
    ("pipeline", "pipeline.api"),
    ("pipeline", "pipeline.estimators"),
    ("pipeline", "pipeline.io"),
    ("pipeline.accounting.gaussian", "scipy"),
    ("pipeline.accounting.pca_random_stopping", "scipy"),
    ("pipeline.algorithms.lrf.model", "scipy"),
    ("pipeline.algorithms.pca.selection", "pipeline.mechanisms.noise"),
    ("pipeline.api", "pipeline.algorithms.pca"),
    ("pipeline.api", "pipeline.io"),
    ("pipeline.cli.budget", "pipeline._validation"),
    ("pipeline.cli.budget", "pipeline.accounting.ledger"),
    ("pipeline.cli.budget", "pipeline.jobs.engine"),
    ("pipeline.cli.common", "pipeline.execution.clusters"),
    ("pipeline.cli.common", "pipeline.io.stream_state"),
    ("pipeline.cli.common", "pipeline.jobs.engine"),
    ("pipeline.cli.data", "pipeline.api"),
    ("pipeline.cli.data", "pipeline.io"),
    ("pipeline.cli.factorize", "pipeline.algorithms.lrf"),
    ("pipeline.cli.factorize", "pipeline.api"),
    ("pipeline.cli.nightly", "pipeline.jobs.nightly"),
    ("pipeline.cli.pca", "pipeline.algorithms.pca"),
    ("pipeline.cli.pca", "pipeline.api"),
    ("pipeline.cli.stream", "os"),
    ("pipeline.cli.stream", "pipeline.accounting.ledger"),
    ("pipeline.cli.stream", "pipeline.execution"),
    ("pipeline.cli.stream", "pipeline.jobs.stream"),
    ("pipeline.estimators", "pipeline.io"),
    ("pipeline.execution.client", "importlib"),
    ("pipeline.io", "importlib"),
    ("pipeline.io.journal", "pipeline.io.objectstore"),
    ("pipeline.io.objectstore", "hashlib"),
    ("pipeline.jobs.centred_pca", "pipeline.api"),
    ("pipeline.jobs.centred_pca", "pipeline.execution"),
    ("pipeline.jobs.centred_pca", "pipeline.io"),
    ("pipeline.jobs.engine", "numpy"),
    ("pipeline.jobs.engine", "pipeline.execution"),
    ("pipeline.jobs.engine", "pipeline.io"),
    ("pipeline.jobs.engine", "pipeline.io.journal"),
    ("pipeline.jobs.engine", "pipeline.io.release"),
    ("pipeline.jobs.factorize", "pipeline.execution"),
    ("pipeline.jobs.factorize", "pipeline.execution.source"),
    ("pipeline.jobs.factorize", "pipeline.io"),
    ("pipeline.jobs.nightly", "pipeline.accounting.ledger"),
    ("pipeline.jobs.nightly", "pipeline.execution"),
    ("pipeline.jobs.nightly", "pipeline.jobs.engine"),
    ("pipeline.jobs.nightly", "pipeline.jobs.stream"),
    ("pipeline.jobs.pca", "pipeline.accounting.pca"),
    ("pipeline.jobs.pca", "pipeline.accounting.pca_selection"),
    ("pipeline.jobs.pca", "pipeline.algorithms.pca"),
    ("pipeline.jobs.pca", "pipeline.execution.pca"),
    ("pipeline.jobs.pca", "pipeline.io"),
    ("pipeline.jobs.stream", "glob"),
    ("pipeline.jobs.stream", "pipeline.execution.stream"),
    ("pipeline.jobs.stream", "pipeline.io"),
    ("pipeline.jobs.stream", "pipeline.io.batches"),
    ("pipeline.jobs.stream", "pipeline.io.entity_ids"),
    ("pipeline.jobs.stream", "pipeline.io.release"),
    ("pipeline.jobs.stream", "pipeline.io.stream_state"),
    ("pipeline.jobs.stream", "shutil"),
})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is the pipeline module it resolves to (None
    outside pipeline), ``name`` the name taken from it (None for a module)."""

    module: str
    target: str | None
    name: str | None
    local: bool
    top: str


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[str, bool]]:
    return {
        _module_name(p): (p.read_text(), p.name == "__init__.py")
        for p in ROOT.rglob("*.py")
    }


def _base(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
    pkg = pkg[: len(pkg) - node.level + 1]
    return ".".join(pkg + ([node.module] if node.module else []))


def import_list(sources: dict[str, tuple[str, bool]]) -> list[Import]:
    """Every import of every module (module level, function-local, under
    ``TYPE_CHECKING``), each imported name resolved against ``sources``."""
    mods = set(sources)
    out: list[Import] = []

    def add(module: str, target: str, name: str | None, local: bool) -> None:
        t = target
        while t and t not in mods:
            t = t.rpartition(".")[0]
        out.append(Import(module, t or None, name, local, target.split(".")[0]))

    def visit(module: str, is_pkg: bool, node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(module, a.name, None, inner)
            elif isinstance(child, ast.ImportFrom):
                base = _base(module, is_pkg, child)
                for a in child.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        add(module, full, None, inner)
                    else:
                        add(module, base, a.name, inner)
            visit(module, is_pkg, child, inner)

    for module, (text, is_pkg) in sources.items():
        visit(module, is_pkg, ast.parse(text), False)
    return out


def graph(imports: list[Import]) -> dict[str, set[str]]:
    """Module -> the pipeline modules it imports (a submodule import does not
    count as an import of its parent package)."""
    edges: dict[str, set[str]] = {i.module: set() for i in imports}
    for i in imports:
        if i.target is not None and i.target != i.module:
            edges[i.module].add(i.target)
            edges.setdefault(i.target, set())
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _layer(module: str) -> int:
    parts = module.split(".")
    return RANK["__init__" if len(parts) == 1 else parts[1]]


def upward_imports(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports from a layer to a layer above it, and of ``pipeline.testing``
    from outside it (only tests and data generators may use it)."""
    return {
        (m, t)
        for m, ts in edges.items()
        for t in ts
        if _layer(t) > _layer(m)
        or (t.split(".")[1:2] == ["testing"] and m.split(".")[1:2] != ["testing"])
    }


def private_imports(imports: list[Import]) -> set[tuple[str, str]]:
    """``_private`` names one module takes from another."""
    return {
        (i.module, f"{i.target}.{i.name}")
        for i in imports
        if i.name and i.name.startswith("_") and not i.name.startswith("__")
        and i.target is not None and i.target != i.module
    }  # fmt: skip


def local_imports(imports: list[Import]) -> set[tuple[str, str]]:
    """Function-local imports of anything outside :data:`BOUNDARY`."""
    return {
        (i.module, i.target or i.top)
        for i in imports
        if i.local and i.top not in BOUNDARY
    }


IMPORTS = import_list(_sources())
EDGES = graph(IMPORTS)


def test_no_import_cycle() -> None:
    assert cycles(EDGES) == []


def test_no_import_from_a_layer_above() -> None:
    assert every_module_has_a_layer()
    assert upward_imports(EDGES) <= KNOWN_UPWARD, upward_imports(EDGES) - KNOWN_UPWARD


def every_module_has_a_layer() -> bool:
    return all(_layer(m) >= 0 for m in EDGES)


def test_no_private_name_imported_across_modules() -> None:
    assert private_imports(IMPORTS) <= KNOWN_PRIVATE, (
        private_imports(IMPORTS) - KNOWN_PRIVATE
    )


def test_function_local_imports_only_at_the_dependency_boundary() -> None:
    found = local_imports(IMPORTS)
    assert found <= KNOWN_LOCAL, sorted(found - KNOWN_LOCAL)


def test_the_known_lists_hold_no_fixed_entry() -> None:
    """An entry that no longer occurs leaves its list: the lists only shrink."""
    assert KNOWN_UPWARD <= upward_imports(EDGES)
    assert KNOWN_PRIVATE <= private_imports(IMPORTS)
    assert KNOWN_LOCAL <= local_imports(IMPORTS)


def _synthetic(**modules: str) -> list[Import]:
    return import_list(
        {f"pipeline.{k.replace('__', '.')}": (v, False) for k, v in modules.items()}
    )


def test_negative_control_a_cycle_is_caught() -> None:
    imports = _synthetic(
        algorithms__a="from pipeline.algorithms.b import f\n",
        algorithms__b="def g():\n    from pipeline.algorithms.a import h\n",
    )
    assert cycles(graph(imports)) == [
        ["pipeline.algorithms.a", "pipeline.algorithms.b"]
    ]


def test_negative_control_an_upward_import_is_caught() -> None:
    imports = _synthetic(
        accounting__x="from pipeline.mechanisms.y import Z\n",
        mechanisms__y="Z = 1\n",
        jobs__w="import pipeline.testing.t\n",
        testing__t="",
    )
    assert upward_imports(graph(imports)) == {
        ("pipeline.accounting.x", "pipeline.mechanisms.y"),
        ("pipeline.jobs.w", "pipeline.testing.t"),
    }


def test_negative_control_a_private_import_is_caught() -> None:
    imports = _synthetic(
        jobs__nightly="from pipeline.jobs.stream import _plan_of, plan\n",
        jobs__stream="def _plan_of(): ...\ndef plan(): ...\n",
    )
    assert private_imports(imports) == {
        ("pipeline.jobs.nightly", "pipeline.jobs.stream._plan_of")
    }


def test_negative_control_a_local_import_is_caught() -> None:
    imports = _synthetic(
        jobs__engine=(
            "def header():\n    from pipeline.algorithms.lrf import seed_fingerprint\n"
            "def client():\n    import dask.array\n"
        ),
        algorithms__lrf="",
    )
    assert local_imports(imports) == {
        ("pipeline.jobs.engine", "pipeline.algorithms.lrf")
    }
