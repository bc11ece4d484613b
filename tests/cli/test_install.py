"""A regular (not editable) install works from any directory.

The package is built and installed from a copy of the source into a fresh
virtual environment, as ``pip install .`` does, and ``dplr`` of that environment
then runs in an unrelated directory: ``--cluster local`` names the installed
configuration, and the nightly example job (found with ``dplr cluster path
nightly``, its site paths set as its comments say) ingests a generated batch and
releases. Nothing of the source tree is on that environment's path.

To stay fast and offline, the new environment has no packages of its own: a
``.pth`` file puts this environment's site directories on its path (the
dependencies), and pip builds with this environment's setuptools
(``--no-build-isolation``, ``--no-index``; setuptools >= 77 reads
pyproject.toml's license field, and the test extra installs it).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

REPO = Path(__file__).resolve().parents[2]
#: What an sdist of the project holds (pyproject.toml names the rest).
SOURCE = ("pyproject.toml", "README.md", "pipeline", "cluster", "workflows")


def _setuptools_version() -> tuple[int, ...]:
    import setuptools

    return tuple(int(x) for x in setuptools.__version__.split(".")[:2])


def _dependency_paths() -> list[str]:
    """This interpreter's import path less the source tree (no ``pipeline``)."""
    keep = []
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.is_dir() and not (p / "pipeline" / "__init__.py").exists():
            keep.append(str(p))
    return keep


def _env(venv: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "DASK_SCHEDULER_ADDRESS", "VIRTUAL_ENV")
    }
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    return env


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{argv}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment with the package installed from a copy of
    the source; returns its directory and the environment to run it in."""
    if _setuptools_version() < (77,):
        pytest.skip(
            "building the wheel without isolation needs setuptools >= 77 (the "
            "test extra: pip install -e '.[test]')"
        )
    root = tmp_path_factory.mktemp("install")
    src, venv = root / "src", root / "venv"
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv)})
    Path(purelib, "dplr-test-deps.pth").write_text(
        "\n".join(_dependency_paths()) + "\n"
    )
    env = _env(venv)
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--ignore-installed", str(src)],
        root, env,
    )  # fmt: skip
    shutil.rmtree(src)  # the installed package must not need its source
    return venv, env


def test_the_installed_package_is_the_one_that_runs(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
        tmp_path, env,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(venv))
    listed = _run(["dplr", "cluster", "list"], tmp_path, env).stdout
    for name in ("local", "slurm", "dask", "nightly"):
        path = _run(["dplr", "cluster", "path", name], tmp_path, env).stdout.strip()
        assert path.startswith(str(venv)), path
        assert Path(path).is_file()
        assert path in listed


@pytest.mark.timeout(600)
def test_factorize_with_the_installed_local_cluster(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    _, env = installed
    _run(["dplr", "generate", "a.zarr", "--rows", "400", "--cols", "20",
          "--chunks", "200,-1"], tmp_path, env)  # fmt: skip
    proc = _run(
        ["dplr", "factorize", "a.zarr", "--rank", "2", "--epsilon", "1",
         "--delta", "1e-6", "--budget-epsilon", "2", "--budget-delta", "1e-5",
         "--cluster", "local", "--out", "r.zarr", "--quiet"],
        tmp_path, env,
    )  # fmt: skip
    assert "released rank-2 factorization to r.zarr" in proc.stdout
    assert (tmp_path / "r.zarr" / "zarr.json").is_file()


@pytest.mark.timeout(600)
def test_the_installed_nightly_example_runs(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The shipped job, with its site (``/var/lib/dplr``) moved to a temporary
    directory, run from another directory: stream init as the job file's
    comment says, one generated batch in the inbox, one night released."""
    _, env = installed
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.mkdir()
    elsewhere.mkdir()
    shipped = _run(
        ["dplr", "cluster", "path", "nightly"], elsewhere, env
    ).stdout.strip()
    job = tmp_path / "nightly.toml"
    text = Path(shipped).read_text()
    assert "/var/lib/dplr/" in text
    job.write_text(text.replace("/var/lib/dplr/", f"{site}/"))
    _run(
        ["dplr", "stream", "init", str(site / "ratings.stream"), "--rows", "200",
         "--cols", "50", "--rank", "2", "--horizon", "366", "--epsilon", "1",
         "--delta", "1e-6", "--unit", "row",
         "--ledger", str(site / "ratings.dplr-ledger.json"),
         "--budget-epsilon", "4", "--budget-delta", "1e-5"],
        elsewhere, env,
    )  # fmt: skip
    day = dt.date(2027, 1, 1)
    inbox = site / "inbox" / day.isoformat()
    inbox.mkdir(parents=True)
    _run(["dplr", "generate", str(inbox / "part-0.parquet"), "--kind",
          "stream-batch", "--rows", "200", "--cols", "50", "--updates", "500"],
         elsewhere, env)  # fmt: skip
    night = _run(
        ["dplr", "nightly", "--config", str(job), "--date", day.isoformat()],
        elsewhere, env,
    )  # fmt: skip
    assert (site / "releases" / f"{day.isoformat()}.zarr" / "zarr.json").is_file()
    assert os.path.realpath(site / "releases" / "latest").endswith(f"{day}.zarr")
    assert "1 batch file(s) ingested" in night.stdout
    assert list(elsewhere.iterdir()) == []  # nothing written where it ran
