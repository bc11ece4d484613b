"""The batch-queue, Kubernetes and docker compose files, checked without the
systems they are for.

* Slurm and PBS: the job scripts are rendered by dask-jobqueue itself
  (``SLURMCluster(...).job_script()``, ``PBSCluster(...).job_script()``; only an
  in-process scheduler is started, on loopback) from exactly the arguments that
  ``dplr --cluster`` passes, and the resources, walltime, worker command and
  Python environment are read back from the script. A Slurm cluster is also
  started for real through ``sbatch``/``scancel`` stand-ins that run the job
  script on this machine, so the start-wait-check-close path runs end to end.
* Kubernetes: the DaskCluster manifest is validated against the DaskCluster
  custom resource definition that dask-kubernetes ships (its Helm chart's CRD,
  what the operator installs in a cluster), refusing unknown fields as the API
  server does under strict field validation; it is then rendered by the
  operator's own controller functions into the scheduler Deployment and Service,
  the DaskWorkerGroup and a worker Deployment, which are validated against the
  Kubernetes API models (the ``kubernetes`` client) and the DaskWorkerGroup CRD,
  and checked to fit together (the Service selects the scheduler pod, ports are
  named where they are used, the workers get the scheduler's address). No API
  server is needed.
* docker compose: the file parses and has one scheduler and N workers.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import os
import re
import shlex
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cluster_util import CLUSTER_DIR, copy_sample, read_yaml, write_yaml
from dask.utils import parse_bytes
from dask_kubernetes.operator import make_cluster_spec
from dask_kubernetes.operator.controller import controller as k8s_operator
from dask_kubernetes.operator.validation import validate_cluster_name
from kubernetes.client import ApiClient

from pipeline.execution.clusters import (
    cluster_kwargs,
    load_cluster_config,
    validate_cluster_config,
)

pytestmark = pytest.mark.cluster


VERSION = importlib.metadata.version("dplr")
#: a pinned image: a registry path with an explicit tag other than "latest",
#: or a digest
PINNED = re.compile(
    r"^[\w.\-/:]+?(:(?!latest$)[\w][\w.\-]{0,127}|@sha256:[0-9a-f]{64})$"
)
LOOPBACK = {"host": "127.0.0.1", "dashboard_address": ":0"}


@pytest.fixture
def jobqueue() -> Any:
    return pytest.importorskip(
        "dask_jobqueue",
        reason="dask-jobqueue is not installed (pip install 'dplr[jobqueue]')",
    )


def _render(
    jobqueue: Any, kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    """The job script of cluster/KIND.yaml, with the scheduler on loopback."""
    config = load_cluster_config(CLUSTER_DIR / f"{kind}.yaml")
    kwargs = cluster_kwargs(config.options)
    # the file's fixed dashboard port could be taken on a shared machine
    kwargs["scheduler_options"] = {**kwargs.get("scheduler_options", {}), **LOOPBACK}
    monkeypatch.chdir(tmp_path)  # log_directory is created relative to here
    cls = jobqueue.SLURMCluster if kind == "slurm" else jobqueue.PBSCluster
    with cls(**kwargs) as cluster:
        script = cluster.job_script()
        address = cluster.scheduler_address
    assert address.startswith("tcp://127.0.0.1:")
    assert f" {address} " in script  # the workers are pointed at this scheduler
    return str(script)


def _worker_command(script: str, python: str) -> list[str]:
    lines = [ln for ln in script.splitlines() if "distributed.cli.dask_worker" in ln]
    assert len(lines) == 1, script
    argv = shlex.split(lines[0], posix=False)
    # the python environment of the file runs the worker
    assert argv[:3] == [python, "-m", "distributed.cli.dask_worker"], argv
    return argv


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _check_worker(argv: list[str], options: dict[str, Any]) -> None:
    processes = options["processes"]
    assert int(_option(argv, "--nworkers")) == processes
    assert int(_option(argv, "--nthreads")) == options["cores"] // processes == 1
    per_worker = parse_bytes(options["memory"]) / processes
    # dask-jobqueue prints the limit with two decimals (4.00GiB)
    assert abs(parse_bytes(_option(argv, "--memory-limit")) - per_worker) < 0.01 * 2**30
    assert "--nanny" in argv
    assert _option(argv, "--local-directory") == options["local_directory"]
    tail = " ".join(argv)
    assert " ".join(options["worker_extra_args"]) in tail  # graceful --lifetime


def test_slurm_job_script(
    jobqueue: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = dict(load_cluster_config(CLUSTER_DIR / "slurm.yaml").options)
    script = _render(jobqueue, "slurm", monkeypatch, tmp_path)
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert f"#SBATCH --cpus-per-task={options['cores']}" in directives
    assert f"#SBATCH --mem={parse_bytes(options['memory']) // 2**30}G" in directives
    assert f"#SBATCH -t {options['walltime']}" in directives
    assert f"#SBATCH -p {options['queue']}" in directives
    assert f"#SBATCH -A {options['account']}" in directives
    log_dir = options["log_directory"]
    assert any(d.startswith(f"#SBATCH -e {log_dir}/") for d in directives)
    assert (tmp_path / log_dir).is_dir()
    argv = _worker_command(script, options["python"])
    _check_worker(argv, options)
    # the prologue runs before the worker starts
    body = script.splitlines()
    prologue = body.index(options["job_script_prologue"][0])
    assert prologue < next(
        i for i, ln in enumerate(body) if "distributed.cli.dask_worker" in ln
    )


def test_pbs_job_script(
    jobqueue: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = dict(load_cluster_config(CLUSTER_DIR / "pbs.yaml").options)
    script = _render(jobqueue, "pbs", monkeypatch, tmp_path)
    directives = [ln for ln in script.splitlines() if ln.startswith("#PBS")]
    assert f"#PBS -l {options['resource_spec']}" in directives
    # the resource request asks for the cores and memory the workers use
    assert f"ncpus={options['cores']}" in options["resource_spec"]
    mem = re.search(r"mem=(\d+)GB", options["resource_spec"])
    assert mem is not None
    assert int(mem.group(1)) == parse_bytes(options["memory"]) // 2**30
    assert f"#PBS -l walltime={options['walltime']}" in directives
    assert f"#PBS -q {options['queue']}" in directives
    assert f"#PBS -A {options['account']}" in directives
    assert f"#PBS -e {options['log_directory']}/" in directives
    argv = _worker_command(script, options["python"])
    _check_worker(argv, options)


FAKE_SBATCH = """#!/bin/bash
# Stand-in for Slurm's sbatch in a test: runs the job script at once on this
# machine, in its own session, and prints the id sbatch would.
job="$(dirname "$0")/job.$$.sh"
cp "$1" "$job"
setsid bash "$job" > "$job.log" 2>&1 < /dev/null &
echo $! > "$job.id"
echo "Submitted batch job $!"
"""
FAKE_SCANCEL = """#!/bin/bash
# Stand-in for scancel: ends the session the fake sbatch started.
for id in "$@"; do kill -TERM -- "-$id" 2>/dev/null; done
exit 0
"""


def _install_fakes(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(180)
def test_slurm_kind_starts_checks_and_cancels(
    jobqueue: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """cluster/slurm.yaml, shrunk to this machine, through ``dplr``'s own path:
    submit, wait for the workers, check their versions, run, cancel."""
    from pipeline.api import factorize

    _install_fakes(tmp_path / "bin", monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    config = read_yaml(CLUSTER_DIR / "slurm.yaml")
    config.update(
        jobs=1, cores=2, processes=2, memory="2GiB", python=sys.executable,
        local_directory=str(tmp_path / "scratch"), log_directory="logs",
        scheduler_options=LOOPBACK, timeout=90, wait_for_workers=2,
    )  # fmt: skip
    config["worker_extra_args"] = [*config["worker_extra_args"], "--host", "127.0.0.1"]
    path = write_yaml(tmp_path / "slurm-here.yaml", config)
    progress = io.StringIO()
    try:
        result = factorize(
            str(copy_sample("sample.zarr", tmp_path)), 2, private=False, seed=3,
            cluster_config=path, progress=progress,
        )  # fmt: skip
        # closing the cluster cancelled the batch job: its processes are gone
        (job_id,) = [int(p.read_text()) for p in (tmp_path / "bin").glob("*.id")]
        assert _gone(job_id, timeout=20)
    finally:
        for p in (tmp_path / "bin").glob("*.id"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(p.read_text()), signal.SIGKILL)
    assert result.report["cluster"]["kind"] == "slurm"
    assert result.report["cluster"]["n_workers"] == 2
    assert result.U.shape == (400, 2)
    text = progress.getvalue()
    assert f"started the slurm cluster of {path}: dashboard http://" in text
    assert "dask cluster: slurm, 2 workers, dashboard http://" in text
    jobs = list((tmp_path / "bin").glob("job.*.sh"))
    assert len(jobs) == 1  # one batch job of two worker processes
    assert "--nworkers 2" in jobs[0].read_text()


def test_kubernetes_manifest() -> None:
    path = CLUSTER_DIR / "kubernetes.yaml"
    config = load_cluster_config(path, require_extras=False)
    assert config.kind == "kubernetes"
    m = read_yaml(path)
    assert m["apiVersion"] == "kubernetes.dask.org/v1"
    assert m["kind"] == "DaskCluster"
    name = m["metadata"]["name"]
    sched = m["spec"]["scheduler"]
    worker = m["spec"]["worker"]
    assert isinstance(worker["replicas"], int)
    assert worker["replicas"] >= 1
    (s,) = sched["spec"]["containers"]
    (w,) = worker["spec"]["containers"]
    for c in (s, w):
        assert PINNED.match(c["image"]), c["image"]
        env = {e["name"]: e["value"] for e in c["env"]}
        # the package, pinned to this version, on the scheduler and the workers
        assert env["EXTRA_PIP_PACKAGES"] == f"dplr=={VERSION}"
        res = c["resources"]
        assert set(res) == {"requests", "limits"}
        assert res["requests"] == res["limits"]  # a fixed memory limit per pod
        assert set(res["limits"]) == {"cpu", "memory"}
    assert s["image"] == w["image"]
    assert s["args"][0] == "dask-scheduler"
    assert w["args"][0] == "dask-worker"
    assert w["args"][w["args"].index("--nthreads") + 1] == "1"
    assert w["resources"]["limits"]["cpu"] == "1"
    ports = {p["name"]: p["containerPort"] for p in s["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    assert s["readinessProbe"]["httpGet"]["path"] == "/health"
    service = sched["service"]
    assert service["selector"]["dask.org/cluster-name"] == name
    assert {p["port"] for p in service["ports"]} == {8786, 8787}
    volumes = {v["name"] for v in worker["spec"]["volumes"]}
    assert {v["name"] for v in w["volumeMounts"]} <= volumes


def test_kubernetes_manifest_matches_the_operator_spec() -> None:
    """Every field the operator's own ``make_cluster_spec`` sets is in the file."""
    m = read_yaml(CLUSTER_DIR / "kubernetes.yaml")
    c = m["spec"]["worker"]["spec"]["containers"][0]
    ref = make_cluster_spec(
        name=m["metadata"]["name"], image=c["image"], n_workers=2,
        resources=c["resources"],
    )  # fmt: skip

    def paths(d: Any, prefix: str = "") -> set[str]:
        if isinstance(d, dict):
            return {p for k, v in d.items() for p in paths(v, f"{prefix}.{k}")} | {
                prefix
            }
        if isinstance(d, list) and d and isinstance(d[0], dict):
            return paths(d[0], f"{prefix}[0]") | {prefix}
        return {prefix}

    missing = paths(ref) - paths(m)
    assert not missing, sorted(missing)


#: The custom resource definitions dask-kubernetes ships: its Helm chart's, which
#: install the operator in a Kubernetes cluster (cluster/kubernetes.yaml says how).
CRDS = (
    Path(k8s_operator.__file__).parents[1]
    / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
)  # fmt: skip
NAMESPACE = "dplr-test"


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses unknown fields, as
    the API server does under strict field validation (kubectl's default)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: (
            {name: _strict(sub) for name, sub in v.items()}
            if k == "properties"
            else _strict(v)
            if k in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf")
            else v
        )
        for k, v in schema.items()
    }
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator(plural: str) -> jsonschema.Draft7Validator:
    """A validator of the served version of kubernetes.dask.org/PLURAL; the
    API server checks apiVersion, kind and metadata itself (here: their values)."""
    crd = read_yaml(CRDS / f"{plural}.yaml")
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"] |= {
        "apiVersion": {"const": f"{crd['spec']['group']}/{version['name']}"},
        "kind": {"const": crd["spec"]["names"]["kind"]},
        "metadata": {"type": "object"},
    }
    schema["required"] = [*schema.get("required", []), "apiVersion", "kind"]
    return jsonschema.Draft7Validator(schema)


def _crd_errors(plural: str, resource: Any) -> list[str]:
    """Where and why the resource breaks its CRD, one line per error."""
    errors = _crd_validator(plural).iter_errors(resource)
    return sorted(f"{e.json_path}: {e.message}" for e in errors)


def _through_api_model(resource: dict[str, Any], model: str) -> Any:
    """The resource read into the Kubernetes API model ``model`` (the kubernetes
    client's pydantic model: a wrong type raises ValueError) and written back:
    a field the API does not know is dropped, so the result differs."""
    api = ApiClient()
    text = json.dumps(resource)
    obj = api.deserialize(text, model, "application/json")
    return api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


def test_kubernetes_manifest_validates_against_the_operator_crd() -> None:
    m = read_yaml(CLUSTER_DIR / "kubernetes.yaml")
    assert _crd_errors("daskcluster", m) == []
    validate_cluster_name(m["metadata"]["name"])  # the operator's own check


@pytest.mark.parametrize(
    ("where", "change", "expected"),
    [
        # a misspelled field: the API server refuses it, dplr's checks do not
        ("scheduler", {"imagePulPolicy": "IfNotPresent"}, ("$.spec.scheduler.spec.containers[0]", "'imagePulPolicy' was unexpected")),
        # a wrong type
        ("worker", {"resources": {"limits": {"cpu": 1}}}, ("$.spec.worker.spec.containers[0].resources.limits.cpu", "1 is not of type 'string'")),
        # a container without its required name (None: the key is removed)
        ("worker", {"name": None}, ("$.spec.worker.spec.containers[0]", "'name' is a required property")),
    ],
)  # fmt: skip
def test_crd_validation_refuses_what_the_api_server_would(
    where: str, change: dict[str, Any], expected: tuple[str, str]
) -> None:
    """Negative control: the CRD validation above can fail, at the field; dplr's
    own load-time checks of a manifest let each of these through."""
    m = read_yaml(CLUSTER_DIR / "kubernetes.yaml")
    container = m["spec"][where]["spec"]["containers"][0]
    for key, value in change.items():
        if value is None:
            del container[key]
        else:
            container[key] = value
    assert validate_cluster_config(m, "changed.yaml").kind == "kubernetes"
    (error,) = _crd_errors("daskcluster", m)
    path, message = expected
    assert error.startswith(f"{path}: "), error
    assert message in error


def _rendered(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the operator's controller creates for this DaskCluster (its
    ``daskcluster_create_components`` and worker-group scaling), built by the
    controller's own functions; JSON round-trip as over the API."""
    name, spec = m["metadata"]["name"], m["spec"]
    worker_pod = spec["worker"]["spec"]
    objects = {
        "scheduler": k8s_operator.build_scheduler_deployment_spec(
            name, spec["scheduler"]["spec"], {}, {}
        ),
        "service": k8s_operator.build_scheduler_service_spec(
            name, spec["scheduler"]["service"], {}, {}
        ),
        "workergroup": k8s_operator.build_default_worker_group_spec(
            name, spec["worker"], {}, {}
        ),
        "worker": k8s_operator.build_worker_deployment_spec(
            f"{name}-default", NAMESPACE, name, "0123456789", worker_pod, {}, {}
        ),
    }
    return {k: json.loads(json.dumps(v)) for k, v in objects.items()}


def _names(items: list[dict[str, Any]]) -> set[str]:
    return {item["name"] for item in items}


def test_kubernetes_manifest_renders_through_the_operator() -> None:
    m = read_yaml(CLUSTER_DIR / "kubernetes.yaml")
    r = _rendered(m)
    # each object is valid for the API that receives it
    assert _crd_errors("daskworkergroup", r["workergroup"]) == []
    for key, model in (
        ("scheduler", "V1Deployment"),
        ("worker", "V1Deployment"),
        ("service", "V1Service"),
    ):
        assert _through_api_model(r[key], model) == r[key], key
    # the Service selects the scheduler pod, and its ports and the probes name
    # ports of the scheduler container
    pod = r["scheduler"]["spec"]["template"]
    (sched,) = pod["spec"]["containers"]
    service = r["service"]["spec"]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    named = {p["name"]: p["containerPort"] for p in sched["ports"]}
    assert {p["targetPort"] for p in service["ports"]} <= set(named)
    for probe in ("readinessProbe", "livenessProbe"):
        assert sched[probe]["httpGet"]["port"] in named
    # the workers reach the scheduler through that Service, on its comm port,
    # and the variable their arguments use is set
    (worker,) = r["worker"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    comm = next(p for p in service["ports"] if p["name"] == "tcp-comm")
    host = f"{r['service']['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert env["DASK_SCHEDULER_ADDRESS"] == f"tcp://{host}:{comm['port']}"
    assert named[comm["targetPort"]] == comm["port"] == 8786
    assert "$(DASK_WORKER_NAME)" in worker["args"]
    assert env["DASK_WORKER_NAME"]
    group = r["workergroup"]["spec"]["worker"]
    assert group["replicas"] == m["spec"]["worker"]["replicas"]
    volumes = _names(r["worker"]["spec"]["template"]["spec"]["volumes"])
    assert _names(worker["volumeMounts"]) <= volumes


def test_api_models_refuse_what_the_api_server_would() -> None:
    """Negative control: the round trip above can fail (an unknown field is
    dropped; a wrong type is refused)."""
    r = _rendered(read_yaml(CLUSTER_DIR / "kubernetes.yaml"))
    typo = json.loads(json.dumps(r["scheduler"]))
    typo["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    assert _through_api_model(typo, "V1Deployment") != typo
    wrong = json.loads(json.dumps(r["service"]))
    wrong["spec"]["ports"][0]["port"] = "comm"
    with pytest.raises(ValueError, match="port"):
        _through_api_model(wrong, "V1Service")


def test_docker_compose_has_one_scheduler_and_n_workers() -> None:
    compose = read_yaml(CLUSTER_DIR / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"scheduler", "worker"}
    sched, worker = services["scheduler"], services["worker"]
    assert "deploy" not in sched  # exactly one scheduler
    replicas = worker["deploy"]["replicas"]
    assert isinstance(replicas, int)
    assert replicas >= 1
    assert "container_name" not in worker  # would forbid --scale worker=N
    assert sched["command"][:2] == ["dask", "scheduler"]
    assert worker["command"][:3] == ["dask", "worker", "tcp://scheduler:8786"]
    assert worker["command"][worker["command"].index("--nthreads") + 1] == "1"
    assert "scheduler" in worker["depends_on"]
    assert "127.0.0.1:8786:8786" in sched["ports"]
    for svc in (sched, worker):
        assert PINNED.match(svc["image"]), svc["image"]
        wheel = svc["environment"]["EXTRA_PIP_PACKAGES"]
        # this package at this version, from the mounted wheel
        assert wheel == f"/wheels/dplr-{VERSION}-py3-none-any.whl"
        mounts = [v.split(":") for v in svc["volumes"]]
        assert ["../dist", "/wheels", "ro"] in mounts
        # the data at the same path inside as outside (workers open dplr's paths)
        data = [v for v in svc["volumes"] if "DPLR_DATA" in v]
        assert len(data) == 1
        host, _, inside = data[0].partition("}:")
        assert f"{host}}}" == inside
    k8s = read_yaml(CLUSTER_DIR / "kubernetes.yaml")
    # one pinned Dask image for every deployment
    assert sched["image"] == k8s["spec"]["worker"]["spec"]["containers"][0]["image"]
