"""Installed configurations by name: ``--cluster NAME``, ``dplr nightly --config
NAME`` and ``dplr cluster list``/``path``.

These run the command line in this process (the refusals happen before any
cluster starts); tests/cli/test_install.py runs the same names from a wheel
installed into a fresh virtual environment.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cli_util import run_in_process

from pipeline.execution.clusters import load_cluster_config

pytestmark = pytest.mark.cli

REPO = Path(__file__).resolve().parents[2]
#: The files of cluster/ that --cluster accepts by name.
CONFIG_NAMES = ("kubernetes", "local", "pbs", "processes", "slurm", "ssh")


def test_cluster_list_names_every_installed_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = run_in_process(capsys, "cluster", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    named = {line.split()[0]: line.split()[-1] for line in lines[:-1]}
    assert set(named) == {*CONFIG_NAMES, "dask", "docker-compose", "nightly"}
    for name, path in named.items():
        assert Path(path).is_file(), (name, path)
    assert (
        Path(named["local"]).read_bytes() == (REPO / "cluster/local.yaml").read_bytes()
    )
    assert named["nightly"].endswith("nightly.toml")
    assert "--cluster slurm" in proc.stdout
    assert "dplr nightly --config nightly" in proc.stdout


def test_cluster_path_prints_one_path(capsys: pytest.CaptureFixture[str]) -> None:
    proc = run_in_process(capsys, "cluster", "path", "slurm")
    assert proc.returncode == 0, proc.stderr
    assert (
        Path(proc.stdout.strip()).read_text()
        == (REPO / "cluster/slurm.yaml").read_text()
    )
    bad = run_in_process(capsys, "cluster", "path", "slurmm")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "'slurmm'" in bad.stderr
    assert "slurm" in bad.stderr


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_a_name_loads_the_installed_configuration(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no cluster/ folder here: the name is looked up
    by_name = load_cluster_config(name, require_extras=False)
    by_path = load_cluster_config(
        REPO / "cluster" / f"{name}.yaml", require_extras=False
    )
    assert by_name.kind == by_path.kind
    assert by_name.options == by_path.options


def test_a_path_still_wins_over_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").write_text("kind: local\nn_workers: 1\n")
    assert load_cluster_config("local").options["n_workers"] == 1
    assert load_cluster_config("local.yaml").options["n_workers"] is None


def test_an_unknown_name_lists_the_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    proc = run_in_process(
        capsys, "pca", tmp_path / "absent.zarr", "--rank", "2", "--non-private",
        "--out", tmp_path / "o.zarr", "--cluster", "slurmm",
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "'slurmm' does not exist" in proc.stderr
    for name in CONFIG_NAMES:
        assert name in proc.stderr
    assert "dask" not in proc.stderr.replace("does not", "")  # not a --cluster file


def test_nightly_config_by_name_and_the_default_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config nightly`` is the installed example (its stream lives under
    /var/lib/dplr, absent here, so the run stops there); without ``--date`` the
    run uses today's local date and says so."""
    monkeypatch.chdir(tmp_path)
    named = run_in_process(
        capsys, "nightly", "--config", "nightly", "--date", "2027-01-02", "--dry-run"
    )
    assert named.returncode == 2
    assert "/var/lib/dplr/ratings.stream" in named.stderr  # the installed job was read
    unknown = run_in_process(capsys, "nightly", "--config", "nightlyy", "--dry-run")
    assert unknown.returncode == 2
    assert "'nightlyy' does not exist" in unknown.stderr
    assert "nightly" in unknown.stderr

    today = dt.date.today()
    init = run_in_process(
        capsys, "stream", "init", tmp_path / "s.stream", "--rows", 50, "--cols", 20,
        "--rank", 2, "--horizon", 8, "--epsilon", 1.0, "--delta", 1e-6, "--unit", "row",
        "--ledger", tmp_path / "l.json", "--budget-epsilon", 1.0, "--budget-delta", 1e-6,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    job = tmp_path / "job.toml"
    job.write_text(
        f'[stream]\nstate = "s.stream"\nstart_date = "{today - dt.timedelta(days=1)}"\n'
        '[input]\ninbox = "inbox/{date}"\npattern = "*.parquet"\nmissing = "empty"\n'
        '[output]\nreleases = "releases"\n'
    )
    proc = run_in_process(capsys, "nightly", "--config", os.fspath(job), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"date {today.isoformat()} (today's local date" in proc.stdout
    assert "epoch 2" in proc.stdout  # the day after start_date
