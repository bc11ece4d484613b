"""The cluster/ configuration files load and validate; bad ones are refused.

Every refusal happens before anything starts or is written: ``dplr`` exits with
code 2 and one line naming the file, the key and what is allowed (style B.6).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

# asyncssh (the ssh kind's library, in the test extra) warns at import time,
# which this suite's filterwarnings turns into an error; loopback_ssh imports it
# with that warning silenced, before any test starts an SSHCluster.
import loopback_ssh  # noqa: F401
import pytest
from cluster_util import (
    CLUSTER_DIR,
    ROOT,
    copy_sample,
    read_yaml,
    shipped_configs,
    write_yaml,
)

import pipeline.execution.client
from pipeline.cli import main
from pipeline.errors import InvalidParameterError
from pipeline.execution.client import cluster_client
from pipeline.execution.clusters import (
    EXTRAS,
    FIELDS,
    KINDS,
    ClusterConfig,
    load_cluster_config,
    local_cluster_kwargs,
)
from pipeline.io import read_group

pytestmark = pytest.mark.cluster


def test_every_kind_has_a_shipped_file() -> None:
    kinds = {
        load_cluster_config(p, require_extras=False).kind for p in shipped_configs()
    }
    assert kinds == set(KINDS)
    names = {p.name for p in shipped_configs()}
    # processes.yaml is the `scheduler` kind, for `dask scheduler`/`dask worker`
    assert names == {f"{k}.yaml" for k in KINDS if k != "scheduler"} | {
        "processes.yaml"
    }


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: p.name)
def test_shipped_file_loads_and_validates(path: Path) -> None:
    config = load_cluster_config(path, require_extras=False)
    assert isinstance(config, ClusterConfig)
    assert config.kind in KINDS
    assert config.path == str(path)
    if config.kind != "kubernetes":
        # every key the file sets is a documented key of its kind
        assert set(config.options) <= set(FIELDS[config.kind])
        text = path.read_text()
        for key in config.options:
            # ... and is explained by a comment in the file
            assert f"\n{key}:" in text or f"\n# {key}:" in text, key
        assert text.lstrip().startswith("#")  # opens with what it is for


def test_the_test_extra_installs_what_every_kind_needs() -> None:
    """No kind's tests can skip for want of its library after
    ``pip install -e '.[test]'``: the test extra requires every extra that a
    cluster kind needs (ssh: asyncssh; slurm, pbs: dask-jobqueue; kubernetes:
    dask-kubernetes)."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(KINDS) - {"local", "scheduler"}
    for kind, (_, extra) in EXTRAS.items():
        missing = set(extras[extra]) - set(extras["test"])
        assert not missing, f"{kind}: the test extra lacks {sorted(missing)}"


def test_local_yaml_spells_out_the_embedded_default() -> None:
    config = load_cluster_config(CLUSTER_DIR / "local.yaml")
    assert local_cluster_kwargs(config.options) == local_cluster_kwargs()
    assert local_cluster_kwargs()["threads_per_worker"] == 1


def _bad(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# (file text, snippets the one-line message must contain)
BAD = {
    "unknown-kind": (
        "kind: yarn\n",
        ["kind must be one of local, scheduler, ssh, slurm, pbs, kubernetes", "'yarn'"],
    ),
    "missing-kind": ("address: tcp://127.0.0.1:8786\n", ["missing key 'kind'"]),
    "missing-key": (
        "kind: slurm\nmemory: 4GiB\n",
        ["kind 'slurm' needs key 'cores'", "an integer >= 1"],
    ),
    "wrong-type": (
        "kind: local\nn_workers: two\n",
        ["n_workers must be an integer >= 1 or null", "n_workers='two' (str)"],
    ),
    "wrong-type-list": (
        "kind: ssh\nhosts: head.example.org\n",
        ["hosts must be a list of strings", "(str)"],
    ),
    "bool-is-not-int": (
        "kind: local\nthreads_per_worker: true\n",
        ["threads_per_worker must be an integer >= 1"],
    ),
    "unknown-key": (
        "kind: ssh\nhosts: [a, b]\nworker_option: {nthreads: 1}\n",
        ["unknown key 'worker_option' for kind 'ssh'", "did you mean 'worker_options'"],
    ),
    "scheduler-needs-one-target": (
        "kind: scheduler\ntimeout: 5\n",
        ["exactly one of 'address'", "'scheduler_file'"],
    ),
    "ssh-one-host": ("kind: ssh\nhosts: [head]\n", ["at least 2 hosts"]),
    "jobs-and-adapt": (
        "kind: pbs\ncores: 4\nmemory: 8GiB\njobs: 2\nadapt: {maximum_jobs: 4}\n",
        ["either 'jobs'", "'adapt'"],
    ),
    "processes-over-cores": (
        "kind: slurm\ncores: 2\nmemory: 8GiB\nprocesses: 4\n",
        ["processes must be <= cores"],
    ),
    "not-yaml": ("kind: [local\n", ["not valid YAML at line"]),
    "not-a-mapping": ("- local\n- ssh\n", ["must be a mapping with a 'kind' key"]),
    "manifest-api": (
        "apiVersion: kubernetes.dask.org/v2\nkind: DaskCluster\n",
        ["apiVersion must be 'kubernetes.dask.org/v1'"],
    ),
    "manifest-no-workers": (
        (
            "apiVersion: kubernetes.dask.org/v1\nkind: DaskCluster\n"
            "metadata: {name: dplr}\nspec: {scheduler: {spec: {containers: "
            "[{name: s, image: 'x:1'}]}}}\n"
        ),
        ["missing key 'spec.worker'"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_exits_2_naming_file_and_key(
    case: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    text, needles = BAD[case]
    path = _bad(tmp_path, text)
    out = tmp_path / "release.zarr"
    code = main([
        "factorize", str(tmp_path / "absent.zarr"), "--rank", "2", "--non-private",
        "--out", str(out), "--cluster", str(path), "--quiet",
    ])  # fmt: skip
    err = capsys.readouterr()
    assert code == 2, err
    lines = err.err.strip().splitlines()
    assert len(lines) == 1, err.err
    assert lines[0].startswith(f"dplr: error: {path}:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert err.out == ""
    assert not out.exists()


def test_missing_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "pca", str(tmp_path / "absent.zarr"), "--rank", "2", "--iterations", "2",
        "--clip-radius", "0.2", "--non-private", "--out", str(tmp_path / "o.zarr"),
        "--cluster", str(tmp_path / "nowhere.yaml"),
    ])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "cluster configuration" in err
    assert "nowhere.yaml" in err
    assert "does not exist" in err


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [
        ("ssh.yaml", "asyncssh", "ssh"),
        ("slurm.yaml", "dask_jobqueue", "jobqueue"),
        ("pbs.yaml", "dask_jobqueue", "jobqueue"),
        ("kubernetes.yaml", "dask_kubernetes", "kubernetes"),
    ],
)
def test_missing_extra_exits_2_naming_it(
    name: str,
    module: str,
    extra: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a None entry makes the import fail, as for a package that is not installed
    monkeypatch.setitem(sys.modules, module, None)
    code = main([
        "factorize", str(tmp_path / "absent.zarr"), "--rank", "2", "--non-private",
        "--out", str(tmp_path / "o.zarr"), "--cluster", str(CLUSTER_DIR / name),
    ])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dplr: error: "), err
    assert f"pip install 'dplr[{extra}]'" in err
    assert repr(module) in err


def test_cluster_and_scheduler_together_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("factorize", "pca"):
        with pytest.raises(SystemExit) as stop:
            main([
                command, str(tmp_path / "a.zarr"), "--rank", "2",
                "--out", str(tmp_path / "o.zarr"),
                "--cluster", str(CLUSTER_DIR / "processes.yaml"),
                "--scheduler", "tcp://127.0.0.1:8786",
            ])  # fmt: skip
        assert stop.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err
    # the same rule in the Python API
    with (
        pytest.raises(InvalidParameterError, match="not both"),
        cluster_client(
            "tcp://127.0.0.1:8786", cluster_config=CLUSTER_DIR / "local.yaml"
        ),
    ):
        pass


def test_api_validates_a_path_before_starting(tmp_path: Path) -> None:
    bad = _bad(tmp_path, "kind: local\nprocesses: maybe\n")
    with (
        pytest.raises(InvalidParameterError, match="processes must be true or false"),
        cluster_client(cluster_config=bad),
    ):
        pass


@pytest.mark.timeout(120)
def test_local_kind_runs_an_embedded_cluster(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--cluster`` with a local file starts an embedded cluster of that shape,
    prints its dashboard, and skips the version check (its workers are this
    very environment)."""

    def no_check(client: object) -> None:
        raise AssertionError("the embedded cluster needs no version check")

    monkeypatch.setattr(pipeline.execution.client, "check_worker_versions", no_check)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    config = read_yaml(CLUSTER_DIR / "local.yaml")
    config["n_workers"] = 1
    path = write_yaml(tmp_path / "local1.yaml", config)
    store = copy_sample("sample.zarr", tmp_path)
    out = tmp_path / "rel.zarr"
    code = main([
        "factorize", str(store), "--rank", "2", "--non-private", "--seed", "3",
        "--out", str(out), "--cluster", str(path),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "dask cluster: local, 1 workers, dashboard http://" in err
    arrays, report = read_group(out, ("U", "S", "V"))
    assert report["cluster"]["kind"] == "local"
    assert report["cluster"]["n_workers"] == 1
    assert arrays["U"].shape == (400, 2)


def test_ssh_host_that_refuses_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    config = read_yaml(CLUSTER_DIR / "ssh.yaml")
    # port 9 (discard) on loopback: nothing listens there, the connection is refused
    config.update(hosts=["127.0.0.1", "127.0.0.1"], timeout=10)
    config["connect_options"] = {"port": 9}
    path = write_yaml(tmp_path / "refused.yaml", config)
    code = main([
        "factorize", str(copy_sample("sample.zarr", tmp_path)), "--rank", "2",
        "--non-private", "--out", str(tmp_path / "o.zarr"), "--cluster", str(path),
    ])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"dplr: error: {path}: could not start the ssh cluster")
    assert not (tmp_path / "o.zarr").exists()


def test_kubernetes_without_credentials_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no kubeconfig and no in-cluster service account
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    code = main([
        "factorize", str(copy_sample("sample.zarr", tmp_path)), "--rank", "2",
        "--non-private", "--out", str(tmp_path / "o.zarr"),
        "--cluster", str(CLUSTER_DIR / "kubernetes.yaml"),
    ])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"dplr: error: {CLUSTER_DIR / 'kubernetes.yaml'}: could not start the "
        "kubernetes cluster (ValueError: Unable to find valid credentials)."
    )
