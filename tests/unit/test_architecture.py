"""The layering rules of design.md section 2, checked on the import graph.

* the math core (linalg, sketches, mechanisms, accounting, algorithms) imports no
  dask, distributed or zarr, so every algorithm runs and is tested on numpy;
* only ``pipeline.io`` imports zarr; only ``pipeline.execution``, ``pipeline.io``,
  ``pipeline.api`` and ``pipeline.cli`` import dask or distributed;
* ``execution`` never imports ``mechanisms.noise`` (noise is drawn in the core);
* nothing imports ``pipeline.cli``;
* the import graph of ``pipeline/`` (every import, module level, function-local
  or under ``TYPE_CHECKING``, read from the AST) has no cycle, no import from a
  layer to a layer above it (:data:`LAYERS`) and no ``_private`` name taken from
  another module;
* the faces (``api``, ``estimators``, ``cli``) import only ``params``, ``jobs``,
  the ground layer and each other (:data:`FACE_MAY_IMPORT`);
* a function-local import sits at the dependency boundary: it keeps a heavy or
  optional third-party module (:data:`BOUNDARY`) off its module's import path,
  which the graph of runtime module-level imports decides, and its line says
  why (``# heavy: zarr, ...``). Each checker has a negative control.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import pathlib
import re
import tokenize
from typing import Any

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
#: The dependency boundary: third-party modules (dotted prefixes) that a module
#: may import inside a function, so that callers that never need them do not pay
#: for them, and why. "heavy": import time (``python -X importtime``) on a start-up
#: path that does not need it; "optional": an extra that may not be installed.
BOUNDARY: dict[str, str] = {
    "numpy": "heavy: 0.1 s; `import pipeline` and `dplr --help` import no numpy",
    "scipy": "heavy: 0.2-0.4 s (sparse, linalg) beyond numpy",
    "scipy.optimize": "heavy: 0.27 s beyond scipy.sparse/linalg; calibration only",
    "sklearn": "heavy: 1-2 s; the estimators only",
    "dask": "heavy: dask.array 0.5-1 s",
    "distributed": "heavy: 0.5-1 s",
    "zarr": "heavy: 0.4-0.6 s",
    "numcodecs": "heavy: zarr's codecs",
    "fsspec": "heavy: zarr's storage layer",
    "dp_accounting": "heavy: 2-3 s",
    "numba": "heavy: 0.2 s with its cached loop; large CSR bands and index checks only",
    "matplotlib": "heavy and optional: `dplr show` only",
    "s3fs": "optional: object stores",
    "dask_jobqueue": "optional: batch clusters",
    "dask_kubernetes": "optional: Kubernetes clusters",
    "kr8s": "optional: Kubernetes clusters",
    "httpx": "optional: Kubernetes clusters",
    "hashlib": "heavy: 4 ms (OpenSSL) on `dplr --help`'s path (pipeline.io.objectstore)",
}
#: What importing a boundary module loads with it (read from ``sys.modules``).
LOADS: dict[str, tuple[str, ...]] = {
    "scipy": ("numpy",),
    "scipy.optimize": ("numpy", "scipy"),
    "sklearn": ("numpy", "scipy", "scipy.optimize"),
    "dask": ("numpy", "scipy"),  # dask.array, the part the pipeline uses
    "distributed": ("numpy", "dask"),
    "zarr": ("numpy", "numcodecs", "fsspec"),
    "numcodecs": ("numpy",),
    "dp_accounting": ("numpy", "scipy", "scipy.optimize"),
    "numba": ("numpy",),
    "s3fs": ("fsspec", "httpx"),
    "dask_jobqueue": ("numpy", "dask", "distributed"),
    "dask_kubernetes": ("numpy", "dask", "distributed", "kr8s", "httpx"),
}
#: The one-word kinds a reason comment starts with (``# heavy: zarr, ...``).
REASONS = ("heavy", "optional")


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is the pipeline module it resolves to (None
    outside pipeline), ``name`` the name taken from it (None for a module),
    ``dotted`` the full dotted name imported (``scipy.optimize`` for ``from scipy
    import optimize``); ``runtime`` is False under ``if TYPE_CHECKING:``;
    ``comment`` holds the comments on the statement's lines (or, without one,
    the comment line just above it)."""

    module: str
    target: str | None
    name: str | None
    local: bool
    top: str
    dotted: str = ""
    runtime: bool = True
    comment: str = ""


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


def _comments(text: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def _statement_comment(node: ast.stmt, notes: dict[int, str], text: str) -> str:
    """The comments on a statement's lines, or on the comment line just above it."""
    lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
    found = " ".join(notes[n] for n in lines if n in notes)
    above = text.splitlines()[node.lineno - 2] if node.lineno > 1 else ""
    if not found and above.strip().startswith("#"):
        found = notes.get(node.lineno - 1, "")
    return found


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def lazy_homes(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, str]]:
    """Package -> {name: module} of each package that imports its names on first
    use (``pipeline.io``): its module-level ``_HOME`` dict of name -> submodule."""
    out: dict[str, dict[str, str]] = {}
    for module, (text, is_pkg) in sources.items():
        for node in ast.parse(text).body if is_pkg else ():
            if (
                isinstance(node, ast.Assign)
                and [getattr(n, "id", None) for n in node.targets] == ["_HOME"]
                and isinstance(node.value, ast.Dict)
            ):
                out[module] = {
                    ast.literal_eval(k): f"{module}.{ast.literal_eval(v)}"
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if k is not None
                }
    return out


def import_list(sources: dict[str, tuple[str, bool]]) -> list[Import]:
    """Every import of every module (module level, function-local, under
    ``TYPE_CHECKING``), each imported name resolved against ``sources``; a name
    of a lazy package (:func:`lazy_homes`) resolves to the module that holds it."""
    mods = set(sources)
    homes = lazy_homes(sources)
    out: list[Import] = []

    def add(target: str, name: str | None, **how: Any) -> None:
        t = target
        while t and t not in mods:
            t = t.rpartition(".")[0]
        dotted = target if name is None else f"{target}.{name}"
        out.append(Import(target=t or None, name=name, top=target.split(".")[0],
                          dotted=dotted, **how))  # fmt: skip

    def visit(module: str, is_pkg: bool, node: ast.AST, local: bool, runtime: bool,
              text: str, notes: dict[int, str]) -> None:  # fmt: skip
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                how = {"module": module, "local": inner, "runtime": runtime,
                       "comment": _statement_comment(child, notes, text)}  # fmt: skip
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(a.name, None, **how)
            elif isinstance(child, ast.ImportFrom):
                base = _base(module, is_pkg, child)
                for a in child.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        add(full, None, **how)
                    elif a.name in homes.get(base, {}):
                        add(homes[base][a.name], a.name, **how)
                    else:
                        add(base, a.name, **how)
            visit(module, is_pkg, child, inner, runtime and not _type_checking(child),
                  text, notes)  # fmt: skip

    for module, (text, is_pkg) in sources.items():
        visit(module, is_pkg, ast.parse(text), False, True, text, _comments(text))
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


def _boundary(dotted: str) -> str | None:
    """The :data:`BOUNDARY` entry a third-party name falls under (the longest)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in BOUNDARY:
            return ".".join(parts[:n])
    return None


def _loads(dotted: str) -> frozenset[str]:
    """The :data:`BOUNDARY` entries importing a third-party name loads."""
    entry = _boundary(dotted)
    if entry is None:
        return frozenset()
    return frozenset({entry, *LOADS.get(entry, ())})


def heavy_sets(imports: list[Import]) -> dict[str, frozenset[str]]:
    """Module -> the :data:`BOUNDARY` entries importing it loads: its runtime
    module-level imports and its packages' ``__init__``, followed transitively
    through pipeline modules (and :data:`LOADS`)."""
    direct: dict[str, set[str]] = {i.module: set() for i in imports}
    edges: dict[str, set[str]] = {i.module: set() for i in imports}
    for i in imports:
        if i.local or not i.runtime:
            continue
        if i.target is None:
            direct[i.module] |= _loads(i.dotted)
        elif i.target != i.module:
            edges[i.module].add(i.target)
    for m in direct:  # importing a module runs its packages' __init__ first
        parts = m.split(".")
        edges[m].update(".".join(parts[:n]) for n in range(1, len(parts)))
    out: dict[str, frozenset[str]] = {}
    for m in direct:
        seen, todo, found = {m}, [m], set()
        while todo:
            v = todo.pop()
            found |= direct.get(v, set())
            for w in edges.get(v, ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        out[m] = frozenset(found)
    return out


def _kept_off(i: Import, heavy: dict[str, frozenset[str]]) -> frozenset[str]:
    """What a function-local import keeps off its module's import path: the
    boundary modules it loads that the module does not load already."""
    if i.target is None:
        loads = _loads(i.dotted)
    else:
        loads = heavy.get(i.target, frozenset())
    return loads - heavy.get(i.module, frozenset())


def local_imports(imports: list[Import]) -> set[tuple[str, str]]:
    """Function-local imports outside the dependency boundary: those that keep
    no :data:`BOUNDARY` module off their module's import path (a stdlib module,
    a pipeline module that loads nothing heavy the module does not load already)."""
    heavy = heavy_sets(imports)
    return {
        (i.module, i.target or i.top)
        for i in imports
        if i.local and not _kept_off(i, heavy)
    }


def unexplained_local_imports(imports: list[Import]) -> set[tuple[str, str]]:
    """Function-local imports at the boundary that give no reason: a
    ``# heavy: ...`` or ``# optional: ...`` comment, on the statement or on the
    line above it, naming one of the modules it keeps off the import path."""
    heavy = heavy_sets(imports)
    out = set()
    for i in imports:
        kept = _kept_off(i, heavy)
        if not i.local or not kept:
            continue
        words = set(re.findall(r"[\w.]+", i.comment))
        if not (
            re.match(rf"#\s*({'|'.join(REASONS)}):", i.comment)
            and any(k in words or k.split(".")[0] in words for k in kept)
        ):
            out.add((i.module, i.target or i.top))
    return out


IMPORTS = import_list(_sources())
EDGES = graph(IMPORTS)


def test_no_import_cycle() -> None:
    assert cycles(EDGES) == []


def test_no_import_from_a_layer_above() -> None:
    assert every_module_has_a_layer()
    assert upward_imports(EDGES) == set()


def every_module_has_a_layer() -> bool:
    return all(_layer(m) >= 0 for m in EDGES)


#: The faces: the Python function API, the scikit-learn estimators and the CLI.
FACES = ("api", "estimators", "cli")
#: What a face may import (issue: "the faces import params and jobs only"): the
#: parameters, the release layer, the ground layer (LAYERS[0]) and the other faces
#: -- the CLI calls the Python face (``pipeline.api``) as any user would, and the
#: estimators wrap it; a face never reaches into the core, io or execution.
FACE_MAY_IMPORT = frozenset({"params", "jobs", *LAYERS[0], *FACES})


def face_imports(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports of a face (:data:`FACES`) of anything outside :data:`FACE_MAY_IMPORT`."""
    return {
        (m, t)
        for m, ts in edges.items()
        if m.split(".")[1:2] and m.split(".")[1] in FACES
        for t in ts
        if t.split(".")[1:2] and t.split(".")[1] not in FACE_MAY_IMPORT
    }


def test_faces_import_params_jobs_and_the_ground_only() -> None:
    assert sorted(face_imports(EDGES)) == []


def test_negative_control_a_face_importing_io_is_caught() -> None:
    imports = _synthetic(
        cli__x="def f():\n    from pipeline.io import generate_store  # heavy: zarr\n",
        api="import pipeline.io.objectstore\nfrom pipeline.jobs.data import open_input\n",
        estimators="from pipeline.api import pca\nfrom pipeline.params import PcaParams\n",
        io__objectstore="def redact(): ...\n",
        io="",
        jobs__data="",
        params="",
    )
    assert face_imports(graph(imports)) == {
        ("pipeline.cli.x", "pipeline.io"),
        ("pipeline.api", "pipeline.io.objectstore"),
    }


def test_no_private_name_imported_across_modules() -> None:
    assert private_imports(IMPORTS) == set()


def test_function_local_imports_only_at_the_dependency_boundary() -> None:
    assert sorted(local_imports(IMPORTS)) == []


def test_every_function_local_import_gives_its_reason() -> None:
    assert sorted(unexplained_local_imports(IMPORTS)) == []


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
            "import numpy\n"
            "def header():\n    from pipeline.algorithms.lrf import seed_fingerprint\n"
            "def client():\n    import dask.array  # heavy: dask\n"
            "def store():\n    from pipeline.io.store import open_store  # heavy: zarr\n"
            "def path():\n    import shutil\n"
        ),
        algorithms__lrf="import numpy\n",
        io__store="import zarr\n",
        jobs__stream=(
            "import zarr\n"
            "def store():\n    from pipeline.io.store import open_store  # heavy: zarr\n"
        ),
        jobs__pca=(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import zarr\n"
            "def store():\n    from pipeline.io.store import open_store  # heavy: zarr\n"
        ),
    )
    # the algorithm loads only numpy, which the engine loads already; shutil
    # loads nothing heavy; jobs.stream loads zarr already
    assert local_imports(imports) == {
        ("pipeline.jobs.engine", "pipeline.algorithms.lrf"),
        ("pipeline.jobs.engine", "shutil"),
        ("pipeline.jobs.stream", "pipeline.io.store"),
    }
    assert heavy_sets(imports)["pipeline.jobs.pca"] == frozenset()


def test_negative_control_a_lazy_package_name_resolves_to_its_home() -> None:
    """``from pipeline.io import f`` in a function loads ``pipeline.io.store``."""
    imports = import_list({
        "pipeline.io": ("import importlib\n_HOME = {'f': 'store'}\n", True),
        "pipeline.io.store": ("import zarr\ndef f(): ...\n", False),
        "pipeline.jobs.a": ("def g():\n    from pipeline.io import f  # heavy: zarr\n", False),
        "pipeline.jobs.b": ("def g():\n    from pipeline.io import f\n", False),
    })  # fmt: skip
    assert graph(imports)["pipeline.jobs.a"] == {"pipeline.io.store"}
    assert heavy_sets(imports)["pipeline.io"] == frozenset()
    assert local_imports(imports) == set()
    assert unexplained_local_imports(imports) == {
        ("pipeline.jobs.b", "pipeline.io.store")
    }


def test_negative_control_a_local_import_without_its_reason_is_caught() -> None:
    imports = _synthetic(
        jobs__engine=(
            "import numpy\n"
            "def a():\n    import dask.array  # heavy: dask, one pass only\n"
            "def b():\n    import distributed\n"
            "def c():\n    from pipeline.io.store import (  # heavy: zarr\n        f,\n    )\n"
            "def d():\n    from pipeline.io.other import g  # heavy: numpy\n"
            "def e():\n    import s3fs  # lazy\n"
            "def f():\n    # optional: s3fs, object stores\n    import s3fs\n"
        ),
        jobs__pca="def g():\n    import zarr  # optional: zarr\n    import s3fs\n",
        io__store="import zarr\n",
        io__other="import zarr\n",
    )
    assert unexplained_local_imports(imports) == {
        ("pipeline.jobs.engine", "distributed"),
        ("pipeline.jobs.engine", "pipeline.io.other"),  # names numpy: loaded already
        ("pipeline.jobs.engine", "s3fs"),
        ("pipeline.jobs.pca", "s3fs"),  # the comment above is another import's
    }
