"""The ``dplr cluster`` command (registered by :mod:`pipeline.cli.main`): the
configuration files installed with the package, by name.

``dplr cluster list`` shows the cluster configurations (``--cluster NAME``), the
other files of ``cluster/`` and the nightly job example (``dplr nightly --config
NAME``), each with the path it is installed at; ``dplr cluster path NAME`` prints
one path (to copy the file and adapt it).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pipeline._shipped import (
    NOT_CLUSTER_CONFIGS,
    cluster_configs,
    shipped_file,
    shipped_files,
    shipped_folder,
)
from pipeline.cli.common import EXIT_OK
from pipeline.errors import InvalidParameterError


def add_parser(sub: Any) -> None:
    """Add ``cluster`` (``list``, ``path``) to ``sub``."""
    c = sub.add_parser(
        "cluster",
        help="the installed cluster configurations and job examples, by name",
        description="The configuration files installed with dplr: cluster "
        "configurations (--cluster NAME), the Dask configuration, and the "
        "nightly job example (dplr nightly --config NAME). Copy one to adapt it; "
        "a path to your own file works wherever a name does.",
    )
    verbs = c.add_subparsers(dest="cluster_command", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="the installed files: name, what, path")
    ls.set_defaults(handler=run_list)
    p = verbs.add_parser("path", help="the path of one installed file")
    p.add_argument("name", metavar="NAME", help="e.g. local, slurm, dask, nightly")
    p.set_defaults(handler=run_path)


def _rows() -> list[tuple[str, str, str]]:
    """(name, how to use it, path) of every installed file that has a name."""
    rows = [
        (name, f"--cluster {name}", os.fspath(path))
        for name, path in cluster_configs().items()
    ]
    for name, path in shipped_files("cluster").items():
        if name in NOT_CLUSTER_CONFIGS:
            rows.append((name, NOT_CLUSTER_CONFIGS[name], os.fspath(path)))
    for name, path in shipped_files("workflows").items():
        rows.append((name, f"dplr nightly --config {name}", os.fspath(path)))
    return rows


def run_list(args: argparse.Namespace) -> int:
    """``dplr cluster list``: one line per installed file."""
    rows = _rows()
    if not rows:
        raise InvalidParameterError(
            "no configuration files are installed with this dplr (reinstall it)."
        )
    width = max(len(n) for n, _, _ in rows)
    what = max(len(w) for _, w, _ in rows)
    for name, use, path in rows:
        print(f"{name:<{width}}  {use:<{what}}  {path}")
    schedules = shipped_folder("workflows")
    if schedules is not None:
        print(
            f"cron, systemd and Kubernetes schedules of the nightly job: {schedules} "
            "(README.md there)"
        )
    return EXIT_OK


def run_path(args: argparse.Namespace) -> int:
    """``dplr cluster path NAME``: the path of one installed file."""
    for folder in ("cluster", "workflows"):
        found = shipped_file(folder, args.name)
        if found is not None:
            print(found)
            return EXIT_OK
    names = ", ".join(name for name, _, _ in _rows()) or "none"
    raise InvalidParameterError(
        f"no installed file is called {args.name!r}; the names are {names}."
    )
