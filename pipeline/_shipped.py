"""Where the configuration files that ship with the package are.

The repository keeps them in two top-level folders, ``cluster/`` (Dask cluster
configurations) and ``workflows/`` (the nightly job and its schedules). A wheel
installs the same files as package data under ``pipeline/share/cluster`` and
``pipeline/share/workflows`` (``pyproject.toml`` maps the two folders there, so
there is one copy of each file). This module finds them in either layout, so
``--cluster local`` and ``dplr nightly --config nightly`` work from a source
checkout, an editable install and a regular install alike.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "FOLDERS",
    "NOT_CLUSTER_CONFIGS",
    "cluster_configs",
    "shipped_file",
    "shipped_files",
    "shipped_folder",
]

#: The shipped folders: name -> the suffixes of the files addressable by name.
FOLDERS = {"cluster": (".yaml", ".yml"), "workflows": (".toml",)}

#: Files of the shipped ``cluster/`` folder that are not cluster configurations
#: (``--cluster`` refuses them): name -> what it is.
NOT_CLUSTER_CONFIGS = {
    "dask": "Dask configuration: DASK_CONFIG=<its directory>",
    "docker-compose": "docker compose -f <it> up: a scheduler and workers",
}

_PACKAGE = Path(__file__).resolve().parent


def shipped_folder(folder: str) -> Path | None:
    """The directory of a shipped folder (``cluster`` or ``workflows``), or None.

    Installed: ``<package>/share/<folder>``. In a source checkout (or an
    editable install) the package directory sits beside ``pyproject.toml`` and
    the folder is the repository's own.
    """
    installed = _PACKAGE / "share" / folder
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / folder).is_dir():
        return checkout / folder
    return None


def shipped_files(folder: str) -> dict[str, Path]:
    """Name (the file name without its suffix) -> path, for the files of a
    shipped folder that can be named (:data:`FOLDERS`), sorted by name."""
    where = shipped_folder(folder)
    if where is None:
        return {}
    suffixes = FOLDERS[folder]
    return {
        p.stem: p
        for p in sorted(where.iterdir())
        if p.is_file() and p.suffix in suffixes
    }


def shipped_file(folder: str, name: str) -> Path | None:
    """The shipped file called ``name`` (with or without its suffix), or None."""
    files = shipped_files(folder)
    stem = Path(name).stem if Path(name).suffix in FOLDERS[folder] else name
    if "/" in name or "\\" in name:
        return None
    return files.get(stem)


def cluster_configs() -> dict[str, Path]:
    """The cluster configurations installed with the package: name -> path
    (``local``, ``processes``, ``ssh``, ``slurm``, ``pbs``, ``kubernetes``)."""
    return {
        name: path
        for name, path in shipped_files("cluster").items()
        if name not in NOT_CLUSTER_CONFIGS
    }
