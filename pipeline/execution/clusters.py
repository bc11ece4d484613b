"""Cluster configuration files: load, validate, start.

Problem. A user names a YAML file (``dplr factorize ... --cluster FILE``) that
says *where* the job runs -- an embedded LocalCluster, a running scheduler, SSH
hosts, a Slurm or PBS queue, or a Kubernetes ``DaskCluster`` -- and this module
turns it into a connected :class:`distributed.Client`. The files are data (the
``cluster/`` folder holds commented examples, installed with the package and
addressable by name: ``--cluster slurm``, :func:`resolve_cluster_config`); every
rule about them lives here.

Schema. A mapping with ``kind`` (one of :data:`KINDS`) and the keys of that kind
(:data:`FIELDS`); keys mirror the arguments of the class that starts the cluster
(``LocalCluster``, ``Client``, ``SSHCluster``, ``SLURMCluster``, ``PBSCluster``),
so their documentation applies. A Kubernetes file is instead the dask-kubernetes
operator's ``DaskCluster`` manifest itself (``apiVersion: kubernetes.dask.org/v1``,
``kind: DaskCluster``), so the same file also works with ``kubectl apply -f``.

The whole file is validated -- unknown keys, missing keys, wrong types, the
optional library of its kind -- before anything starts, and every problem is an
:class:`~pipeline.errors.InvalidParameterError` (or, for a missing extra, a
:class:`~pipeline.errors.PipelineError`) naming the file, the key and what is
allowed: the command line exits with code 2.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from distributed import Client, LocalCluster, SSHCluster

from pipeline._shipped import cluster_configs, shipped_file, shipped_folder
from pipeline.errors import (
    InvalidParameterError,
    PipelineError,
    SchedulerUnavailableError,
)

if TYPE_CHECKING:  # an optional extra: imported where a batch cluster starts
    from dask_jobqueue.core import JobQueueCluster

__all__ = [
    "FIELDS",
    "KINDS",
    "ClusterConfig",
    "cluster_kwargs",
    "load_cluster_config",
    "local_cluster_kwargs",
    "resolve_cluster_config",
    "start_from_config",
    "validate_cluster_config",
]

#: The kinds of cluster a configuration file may describe.
KINDS = ("local", "scheduler", "ssh", "slurm", "pbs", "kubernetes")

#: kind -> (module it needs, extra of this package that installs it)
EXTRAS = {
    "ssh": ("asyncssh", "ssh"),
    "slurm": ("dask_jobqueue", "jobqueue"),
    "pbs": ("dask_jobqueue", "jobqueue"),
    "kubernetes": ("dask_kubernetes", "kubernetes"),
}

K8S_API_VERSION = "kubernetes.dask.org/v1"


# ---------------------------------------------------------------- value checks
# Each check returns None when the value is acceptable, else what was expected.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(low: int) -> Callable[[Any], str | None]:
    return lambda v: None if _is_int(v) and v >= low else f"an integer >= {low}"


def _positive(v: Any) -> str | None:
    ok = (_is_int(v) or isinstance(v, float)) and v > 0
    return None if ok else "a number of seconds > 0"


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "a non-empty string"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _str_list(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else "a list of strings"


def _mapping(v: Any) -> str | None:
    ok = isinstance(v, dict) and all(isinstance(k, str) for k in v)
    return None if ok else "a mapping of names to values"


def _memory(v: Any) -> str | None:
    ok = (_is_int(v) and v > 0) or (isinstance(v, str) and bool(v.strip()))
    return None if ok else 'a size such as "4GiB", a number of bytes, or "auto"'


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def inner(v: Any) -> str | None:
        what = check(v)
        return None if v is None or what is None else f"{what} or null"

    return inner


def _mappings(v: Any) -> str | None:
    if _mapping(v) is None:
        return None
    ok = isinstance(v, list) and all(_mapping(x) is None for x in v)
    return None if ok else "a mapping, or a list of mappings (one per host)"


@dataclass(frozen=True, slots=True)
class _Field:
    check: Callable[[Any], str | None]
    required: bool = False


_WAIT = {"timeout": _Field(_positive), "wait_for_workers": _Field(_int(0))}
_JOBQUEUE = {
    "jobs": _Field(_int(1)),
    "adapt": _Field(_mapping),
    "cores": _Field(_int(1), required=True),
    "memory": _Field(_str, required=True),
    "processes": _Field(_int(1)),
    "walltime": _Field(_str),
    "queue": _Field(_str),
    "account": _Field(_str),
    "python": _Field(_str),
    "local_directory": _Field(_str),
    "log_directory": _Field(_str),
    "job_name": _Field(_str),
    "interface": _Field(_str),
    "death_timeout": _Field(_positive),
    "job_script_prologue": _Field(_str_list),
    "worker_extra_args": _Field(_str_list),
    "job_extra_directives": _Field(_str_list),
    "job_directives_skip": _Field(_str_list),
    "scheduler_options": _Field(_mapping),
    **_WAIT,
}

#: kind -> key -> its check. ``kind`` itself is implied.
FIELDS: dict[str, dict[str, _Field]] = {
    "local": {
        "n_workers": _Field(_optional(_int(1))),
        "threads_per_worker": _Field(_int(1)),
        "processes": _Field(_bool),
        "memory_limit": _Field(_memory),
        "dashboard_address": _Field(_optional(_str)),
        "local_directory": _Field(_optional(_str)),
    },
    "scheduler": {
        "address": _Field(_str),
        "scheduler_file": _Field(_str),
        **_WAIT,
    },
    "ssh": {
        "hosts": _Field(_str_list, required=True),
        "connect_options": _Field(_mappings),
        "worker_options": _Field(_mapping),
        "scheduler_options": _Field(_mapping),
        "worker_class": _Field(_str),
        "remote_python": _Field(_str),
        **_WAIT,
    },
    "slurm": {**_JOBQUEUE, "job_cpu": _Field(_int(1)), "job_mem": _Field(_str)},
    "pbs": {**_JOBQUEUE, "resource_spec": _Field(_str)},
}

#: How long to wait for workers, and for how many, unless the file says.
DEFAULT_WAIT = {
    "scheduler": (10.0, 1),
    "ssh": (60.0, None),  # None: one per worker host
    "slurm": (600.0, 1),  # a batch queue may take a while
    "pbs": (600.0, 1),
    "kubernetes": (300.0, 1),
}

#: The embedded cluster used when nothing is configured (``cluster/local.yaml``
#: spells out the same values): one single-threaded worker process per core, at
#: most four, because threaded BLAS inside one worker would make results depend
#: on the thread count.
LOCAL_DEFAULTS: dict[str, Any] = {
    "n_workers": None,
    "threads_per_worker": 1,
    "processes": True,
    "memory_limit": "auto",
    "dashboard_address": ":0",
    "local_directory": None,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    """A validated cluster configuration.

    ``options`` holds the file's keys (without ``kind``); for ``kubernetes`` it
    is the whole ``DaskCluster`` manifest.
    """

    kind: str
    path: str
    options: Mapping[str, Any] = field(default_factory=dict)


# -------------------------------------------------------------------- loading


def resolve_cluster_config(path: str | os.PathLike[str]) -> str:
    """The file a ``--cluster`` value names: an existing file, else the
    installed configuration of that name (``local``, ``slurm``, ...).

    Raises
    ------
    InvalidParameterError
        Neither a file nor an installed name; the message lists the names.
    """
    where = os.fspath(path)
    if os.path.exists(where):
        return where
    installed = cluster_configs()
    found = shipped_file("cluster", where)
    if found is not None and found.stem in installed:
        return os.fspath(found)
    folder = shipped_folder("cluster")
    names = ", ".join(installed) or "none"
    raise InvalidParameterError(
        f"cluster configuration {where!r} does not exist and is not the name of "
        f"an installed one ({names}"
        f"{f', in {folder}' if folder is not None else ''})."
    )


def load_cluster_config(
    path: str | os.PathLike[str], *, require_extras: bool = True
) -> ClusterConfig:
    """Read and validate a cluster configuration file; start nothing.

    ``require_extras=False`` checks the file alone, without requiring the
    optional library its kind needs to start (e.g. to lint configurations).

    Raises
    ------
    InvalidParameterError
        The file is missing, is not YAML, or breaks the schema; the message
        names the file, the key and what is allowed.
    PipelineError
        The kind needs an optional library that is not installed; the message
        names the extra to install.
    """
    where = resolve_cluster_config(path)
    try:
        with open(where, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise InvalidParameterError(
            f"cluster configuration {where!r} does not exist."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(
            f"cannot read cluster configuration {where!r}: {exc}."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidParameterError(
            f"{where}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})."
        ) from None
    config = validate_cluster_config(data, where)
    if require_extras:
        _check_extra(config)
    return config


def validate_cluster_config(data: Any, where: str = "<config>") -> ClusterConfig:
    """Check a parsed configuration against the schema (see the module docstring)."""
    if not isinstance(data, dict):
        raise InvalidParameterError(
            f"{where}: a cluster configuration must be a mapping with a 'kind' "
            f"key, got {type(data).__name__}."
        )
    allowed = ", ".join(KINDS)
    if "apiVersion" in data or data.get("kind") == "DaskCluster":
        _check_manifest(data, where)
        return ClusterConfig(kind="kubernetes", path=where, options=data)
    if "kind" not in data:
        raise InvalidParameterError(
            f"{where}: missing key 'kind'; set it to one of {allowed} "
            "(or use a DaskCluster manifest for Kubernetes)."
        )
    kind = data["kind"]
    if kind not in FIELDS:
        hint = (
            f" (a Kubernetes file is a DaskCluster manifest: apiVersion: "
            f"{K8S_API_VERSION}, kind: DaskCluster)"
            if kind == "kubernetes"
            else ""
        )
        raise InvalidParameterError(
            f"{where}: kind must be one of {allowed}, got kind={kind!r}{hint}."
        )
    options = {k: v for k, v in data.items() if k != "kind"}
    _check_fields(options, FIELDS[kind], kind, where)
    _check_kind_rules(options, kind, where)
    return ClusterConfig(kind=kind, path=where, options=options)


def _check_fields(
    options: Mapping[str, Any], fields: Mapping[str, _Field], kind: str, where: str
) -> None:
    for key in options:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidParameterError(
                f"{where}: unknown key {key!r} for kind {kind!r}{hint}; allowed "
                f"keys: kind, {', '.join(fields)}."
            )
    for key, spec in fields.items():
        if key not in options:
            if spec.required:
                raise InvalidParameterError(
                    f"{where}: kind {kind!r} needs key {key!r} "
                    f"({spec.check(object())})."
                )
            continue
        what = spec.check(options[key])
        if what is not None:
            got = options[key]
            raise InvalidParameterError(
                f"{where}: {key} must be {what}, got {key}={got!r} "
                f"({type(got).__name__})."
            )


def _check_kind_rules(options: Mapping[str, Any], kind: str, where: str) -> None:
    if kind == "scheduler" and ("address" in options) == ("scheduler_file" in options):
        raise InvalidParameterError(
            f"{where}: kind 'scheduler' needs exactly one of 'address' (such as "
            "tcp://host:8786) or 'scheduler_file' (written by `dask scheduler "
            "--scheduler-file`)."
        )
    if kind == "ssh" and len(options["hosts"]) < 2:
        raise InvalidParameterError(
            f"{where}: hosts must list at least 2 hosts (the first runs the "
            f"scheduler, the others workers), got {len(options['hosts'])}."
        )
    if kind in ("slurm", "pbs"):
        _check_jobqueue_rules(options, where)


def _check_jobqueue_rules(options: Mapping[str, Any], where: str) -> None:
    if "jobs" in options and "adapt" in options:
        raise InvalidParameterError(
            f"{where}: give either 'jobs' (a fixed number of batch jobs) or "
            "'adapt' (minimum_jobs/maximum_jobs), not both."
        )
    adapt = options.get("adapt", {})
    for key, value in adapt.items():
        if key not in ("minimum_jobs", "maximum_jobs") or not _is_int(value):
            raise InvalidParameterError(
                f"{where}: adapt takes integers minimum_jobs and maximum_jobs, "
                f"got adapt.{key}={value!r}."
            )
    if adapt and adapt.get("minimum_jobs", 0) > adapt.get("maximum_jobs", 1 << 30):
        raise InvalidParameterError(
            f"{where}: adapt.minimum_jobs must be <= adapt.maximum_jobs, got "
            f"{adapt['minimum_jobs']} > {adapt['maximum_jobs']}."
        )
    if options.get("processes", 1) > options["cores"]:
        raise InvalidParameterError(
            f"{where}: processes must be <= cores (each worker process gets "
            f"cores // processes threads), got processes={options['processes']}, "
            f"cores={options['cores']}."
        )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_manifest(data: Mapping[str, Any], where: str) -> None:
    """The parts of a ``DaskCluster`` resource that dask-kubernetes relies on."""

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise InvalidParameterError(f"{where}: DaskCluster manifest: {what}.")

    version = data.get("apiVersion")
    need(
        version == K8S_API_VERSION and data.get("kind") == "DaskCluster",
        f"apiVersion must be {K8S_API_VERSION!r} and kind 'DaskCluster', got "
        f"apiVersion={version!r}, kind={data.get('kind')!r}",
    )
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    need(
        isinstance(name, str) and bool(_DNS_LABEL.match(name)),
        f"metadata.name must be a lower-case DNS label, got {name!r}",
    )
    # parsed YAML, typed Any: need() raises unless each part has the shape it names
    spec: Any = data.get("spec")
    need(isinstance(spec, dict), "missing key 'spec' (a mapping)")
    for role in ("scheduler", "worker"):
        part = spec.get(role)
        need(isinstance(part, dict), f"missing key 'spec.{role}' (a mapping)")
        pod = part.get("spec")
        containers: Any = pod.get("containers") if isinstance(pod, dict) else None
        need(
            isinstance(containers, list) and len(containers) > 0,
            f"spec.{role}.spec.containers must be a non-empty list",
        )
        for i, c in enumerate(containers):
            need(
                isinstance(c, dict) and _str(c.get("image")) is None,
                f"spec.{role}.spec.containers[{i}].image must be a non-empty string",
            )
    replicas = spec["worker"].get("replicas")
    need(
        _is_int(replicas) and replicas >= 1,
        f"spec.worker.replicas must be an integer >= 1, got {replicas!r}",
    )
    service = spec["scheduler"].get("service")
    need(
        isinstance(service, dict) and isinstance(service.get("ports"), list),
        "spec.scheduler.service must be a mapping with a list of ports",
    )


def _check_extra(config: ClusterConfig) -> None:
    """Refuse a kind whose optional library is missing, naming the extra."""
    if config.kind not in EXTRAS:
        return
    module, extra = EXTRAS[config.kind]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules
        found = False
    if not found:
        raise PipelineError(
            f"{config.path}: kind {config.kind!r} needs the Python package "
            f"{module!r}, which is not installed; install it with "
            f"`pip install 'dplr[{extra}]'`."
        )


# ------------------------------------------------------------------- starting


def local_cluster_kwargs(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``LocalCluster`` arguments for a ``local`` configuration (or the default)."""
    merged = {**LOCAL_DEFAULTS, **(options or {})}
    if merged["n_workers"] is None:
        merged["n_workers"] = max(1, min(os.cpu_count() or 1, 4))
    return {**merged, "silence_logs": 50}


#: Keys read by dplr itself; all others are arguments of the cluster class.
OWN_KEYS = ("jobs", "adapt", "timeout", "wait_for_workers")


def cluster_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments of ``SSHCluster``/``SLURMCluster``/``PBSCluster``: the file's
    keys less dplr's own (:data:`OWN_KEYS`)."""
    return {k: v for k, v in options.items() if k not in OWN_KEYS}


@contextlib.contextmanager
def start_from_config(
    config: ClusterConfig, *, announce: Callable[[str], None] | None = None
) -> Iterator[Any]:
    """Start (or connect to) the configured cluster; yield a connected Client.

    Waits for ``wait_for_workers`` workers (``timeout`` seconds), so that the
    caller's version check sees them. Whatever was started is closed on exit.

    Raises
    ------
    SchedulerUnavailableError
        The scheduler cannot be reached, or the cluster cannot be started, or
        too few workers joined in time.
    """
    with contextlib.ExitStack() as stack:
        if config.kind == "local":
            cluster = stack.enter_context(
                LocalCluster(**local_cluster_kwargs(config.options))
            )
            yield stack.enter_context(Client(cluster, set_as_default=False))
            return
        timeout, n_wait = _wait_of(config)
        if config.kind == "scheduler":
            client = stack.enter_context(_connect(config, timeout))
        else:
            cluster = stack.enter_context(_started(config))
            client = stack.enter_context(Client(cluster, set_as_default=False))
            if announce is not None:
                announce(
                    f"started the {config.kind} cluster of {config.path}: "
                    f"dashboard {getattr(cluster, 'dashboard_link', None)}; "
                    f"waiting for {n_wait} worker(s), up to {timeout:g} s"
                )
        _wait_for_workers(client, config, n_wait, timeout)
        yield client


def _wait_of(config: ClusterConfig) -> tuple[float, int]:
    timeout, n_wait = DEFAULT_WAIT[config.kind]
    if config.kind == "ssh" and n_wait is None:
        n_wait = len(config.options["hosts"]) - 1
    opts = config.options if config.kind != "kubernetes" else {}
    return float(opts.get("timeout", timeout)), int(
        opts.get("wait_for_workers", n_wait)
    )


def _connect(config: ClusterConfig, timeout: float) -> Any:
    opts = config.options
    if "scheduler_file" in opts:
        target = f"the scheduler file {opts['scheduler_file']!r}"
        if not os.path.exists(opts["scheduler_file"]):
            raise SchedulerUnavailableError(
                f"{config.path}: {target} does not exist; start the scheduler "
                "with `dask scheduler --scheduler-file FILE` first."
            )
        kwargs: dict[str, Any] = {"scheduler_file": opts["scheduler_file"]}
    else:
        target = f"the Dask scheduler at {opts['address']!r}"
        kwargs = {"address": opts["address"]}
    try:
        return Client(**kwargs, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise SchedulerUnavailableError(
            f"{config.path}: cannot reach {target} within {timeout:g} s "
            f"({type(exc).__name__}); start it, or fix the file."
        ) from None


def _started(config: ClusterConfig) -> Any:
    """The cluster object of an ssh, slurm, pbs or kubernetes configuration."""
    try:
        if config.kind == "ssh":
            return SSHCluster(**cluster_kwargs(config.options))
        if config.kind == "kubernetes":
            import kr8s  # optional: kr8s, the kubernetes extra

            # optional: dask_kubernetes, the kubernetes extra
            from dask_kubernetes.operator import KubeCluster

            # credentials first: a KubeCluster that fails to start leaves a
            # traceback in its exit-time clean-up
            kr8s.api()
            manifest = dict(config.options)
            namespace = manifest.get("metadata", {}).get("namespace")
            return KubeCluster(custom_cluster_spec=manifest, namespace=namespace)
        return _jobqueue_cluster(config)
    except _start_errors(config.kind) as exc:
        raise SchedulerUnavailableError(
            f"{config.path}: could not start the {config.kind} cluster "
            f"({type(exc).__name__}: {exc})."
        ) from None


def _start_errors(kind: str) -> tuple[type[BaseException], ...]:
    """What a cluster that cannot start raises: unreachable hosts, refused
    logins, batch commands that fail (distributed wraps most in RuntimeError),
    and for Kubernetes no credentials (ValueError) or API errors."""
    errors: list[type[BaseException]] = [
        OSError,
        TimeoutError,
        RuntimeError,
        ValueError,
    ]
    if kind == "kubernetes":
        with contextlib.suppress(ImportError):
            import httpx  # optional: httpx, the kubernetes extra
            import kr8s  # optional: kr8s, the kubernetes extra

            errors += [kr8s.ServerError, httpx.HTTPError]
    return tuple(errors)


def _jobqueue_cluster(config: ClusterConfig) -> Any:
    from dask_jobqueue.pbs import PBSCluster  # optional: dask_jobqueue, an extra
    from dask_jobqueue.slurm import SLURMCluster  # optional: dask_jobqueue

    cls: type[JobQueueCluster] = SLURMCluster if config.kind == "slurm" else PBSCluster
    cluster = cls(**cluster_kwargs(config.options))
    if "adapt" in config.options:
        cluster.adapt(**config.options["adapt"])
    else:
        cluster.scale(jobs=config.options.get("jobs", 1))
    return cluster


def _wait_for_workers(
    client: Any, config: ClusterConfig, n_wait: int, timeout: float
) -> None:
    if n_wait <= 0:
        return
    try:
        client.wait_for_workers(n_wait, timeout=timeout)
    except TimeoutError:
        have = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        raise SchedulerUnavailableError(
            f"{config.path}: only {have} of {n_wait} worker(s) joined the "
            f"{config.kind} cluster within {timeout:g} s; check that the workers "
            "can start and reach the scheduler (for batch queues: the queue and "
            "the job logs), or raise 'timeout'."
        ) from None
