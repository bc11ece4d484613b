"""Every file under ``workflows/`` parses, runs the documented job, and dry-runs.

A broken nightly schedule should fail here, not at 02:30 (house style B.11).
Each scheduler's file is parsed with the reader closest to the real one (cron
fields, ``configparser`` for systemd units, ``yaml.safe_load_all`` for
Kubernetes), its command is checked to be ``dplr nightly --config <the job>
--date <yesterday>``, and then that very command line is run with
``--dry-run`` against a real stream state in a temporary directory that stands
for ``/var/lib/dplr``. The dry runs are started together (each is a separate
``dplr`` process, mostly import time) to keep the module under 30 s on 2 cores.
"""

from __future__ import annotations

import configparser
import datetime as dt
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipeline.errors import InvalidParameterError
from pipeline.io.batches import write_batch
from pipeline.jobs.nightly import NightlyConfig, load_nightly_config

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
JOB = WORKFLOWS / "nightly.toml"
CRON = WORKFLOWS / "cron" / "dplr-nightly.cron"
SERVICE = WORKFLOWS / "systemd" / "dplr-nightly.service"
TIMER = WORKFLOWS / "systemd" / "dplr-nightly.timer"
CRONJOB = WORKFLOWS / "kubernetes" / "dplr-nightly-cronjob.yaml"
PVC = WORKFLOWS / "kubernetes" / "dplr-state-pvc.yaml"
README = WORKFLOWS / "README.md"
MONTHLY = WORKFLOWS / "cron-monthly-release.cron"  # a `dplr factorize` job

#: Where cron and systemd expect workflows/nightly.toml to be installed.
INSTALLED_JOB = "/etc/dplr/nightly.toml"
#: The directory every path of the job lives under (the Kubernetes volume).
SITE = "/var/lib/dplr"
#: Horizon of the test stream: the job's start date plus HORIZON days is refused.
HORIZON = 8
SHAPE = (300, 200)
BATCH = "part-000.parquet"

_dplr_script = Path(sys.executable).with_name("dplr")
DPLR = (
    [str(_dplr_script)] if _dplr_script.exists() else [sys.executable, "-m", "pipeline"]
)

NIGHTLY = ("cron", "systemd", "kubernetes")


# -- parsing helpers ------------------------------------------------------------

_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s*=")
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _check_cron_field(field: str, lo: int, hi: int) -> None:
    for part in field.split(","):
        span, _, step = part.partition("/")
        assert not step or (step.isdigit() and int(step) >= 1), field
        if span == "*":
            continue
        bounds = span.split("-")
        assert len(bounds) <= 2, field
        for b in bounds:
            assert b.isdigit(), field
            assert lo <= int(b) <= hi, f"cron field {field!r} not in {lo}..{hi}"


def _cron_schedule(schedule: str) -> None:
    fields = schedule.split()
    assert len(fields) == 5, schedule
    for field, (lo, hi) in zip(fields, _CRON_RANGES, strict=True):
        _check_cron_field(field, lo, hi)


def _crontab_entries(path: Path) -> list[tuple[str, str]]:
    """(schedule, command) of each entry; comments and VAR=value lines skipped."""
    entries = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or _ENV_LINE.match(line):
            continue
        fields = line.split(None, 5)
        assert len(fields) == 6, (
            f"{path.name}: not 5 time fields and a command: {line!r}"
        )
        _cron_schedule(" ".join(fields[:5]))
        entries.append((" ".join(fields[:5]), fields[5]))
    return entries


def _first_command(script: str) -> list[str]:
    """The words of the first simple command of a shell script (up to ; > | &)."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = []
    for token in lex:
        if set(token) <= set("();<>|&"):
            break
        words.append(token)
    return words


def _split_flock(words: list[str]) -> tuple[list[str], list[str]]:
    """``flock [-n] [-E code] LOCK CMD...`` -> (flock words, CMD...)."""
    if os.path.basename(words[0]) != "flock":
        return [], words
    i = 1
    while words[i].startswith("-"):
        i += 2 if words[i] in ("-E", "--conflict-exit-code", "-w", "--timeout") else 1
    return words[: i + 1], words[i + 1 :]


def _sh_c(argv: list[str]) -> list[str]:
    """The dplr command run by ``/bin/sh -c 'exec dplr ...'``."""
    assert os.path.basename(argv[0]) in ("sh", "bash"), argv
    assert argv[1] == "-c", argv
    assert len(argv) == 3, argv
    words = _first_command(argv[2])
    return words[1:] if words[0] == "exec" else words


def _dplr_nightly(argv: list[str], config: str) -> str:
    """Check ``argv`` is ``dplr nightly --config CONFIG --date EXPR``; return EXPR."""
    assert os.path.basename(argv[0]) == "dplr", argv
    assert argv[1:5] == ["nightly", "--config", config, "--date"], argv
    assert len(argv) == 6, argv
    return argv[5]


# -- each workflow: its command line and its job --------------------------------


def _cron_command() -> tuple[list[str], list[str]]:
    """(flock words, dplr argv) of the 02:30 entry, % unescaped as cron does."""
    (schedule, command), *retries = _crontab_entries(CRON)
    assert schedule == "30 2 * * *"
    assert all(c == command for _, c in retries), "every entry runs the same command"
    assert not re.search(r"(?<!\\)%", command), (
        "cron turns an unescaped % into a newline"
    )
    flock, argv = _split_flock(_first_command(command.replace("\\%", "%")))
    assert flock[:2] == ["flock", "-n"], flock
    return flock, argv


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def _systemd_command() -> list[str]:
    """The dplr argv of ExecStart, with systemd's %% and $$ unescaped."""
    exec_start = _unit(SERVICE)["Service"]["ExecStart"]
    assert exec_start[0] not in "-@+!:", "the exit code must not be ignored or altered"
    return _sh_c(shlex.split(exec_start.replace("%%", "%").replace("$$", "$")))


@functools.cache  # read-only; parsed once (PyYAML's pure-Python loader is slow)
def _k8s_docs() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(CRONJOB.read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert len(kinds) == len(docs) == 2, [d["kind"] for d in docs]
    return kinds


def _k8s_pod() -> dict[str, Any]:
    return _k8s_docs()["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def _k8s_command() -> list[str]:
    """The dplr argv of the container, with Kubernetes' $$ unescaped."""
    (container,) = _k8s_pod()["containers"]
    assert "args" not in container
    return _sh_c([w.replace("$$", "$") for w in container["command"]])


def _k8s_job_path() -> str:
    """Where the ConfigMap's nightly.toml is mounted in the container."""
    pod = _k8s_pod()
    (vol,) = [v for v in pod["volumes"] if "configMap" in v]
    assert vol["configMap"]["name"] == _k8s_docs()["ConfigMap"]["metadata"]["name"]
    (item,) = vol["configMap"]["items"]
    (mount,) = [
        m for m in pod["containers"][0]["volumeMounts"] if m["name"] == vol["name"]
    ]
    return f"{mount['mountPath']}/{item['path']}"


def _k8s_job_text() -> str:
    return str(_k8s_docs()["ConfigMap"]["data"]["nightly.toml"])


def _workflow(name: str) -> tuple[list[str], list[str], str]:
    """(wrapper words, dplr argv, job TOML text) of a nightly workflow."""
    if name == "cron":
        flock, argv = _cron_command()
        _dplr_nightly(argv, INSTALLED_JOB)
        return flock, argv, JOB.read_text()
    if name == "systemd":
        argv = _systemd_command()
        _dplr_nightly(argv, INSTALLED_JOB)
        return [], argv, JOB.read_text()
    argv = _k8s_command()
    _dplr_nightly(argv, _k8s_job_path())
    return [], argv, _k8s_job_text()


def _fields(cfg: NightlyConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in NightlyConfig.__slots__ if k != "path"}


def _load_text(text: str, tmp_path: Path) -> NightlyConfig:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return load_nightly_config(path)


def _under(path: str, roots: list[str]) -> bool:
    return any(os.path.commonpath([path, r]) == r for r in roots)


# -- static checks ----------------------------------------------------------------


def test_every_workflow_file_is_known():
    """A new file under workflows/ must get its checks here too."""
    known = {JOB, CRON, SERVICE, TIMER, CRONJOB, PVC, README, MONTHLY}
    found = {p for p in WORKFLOWS.rglob("*") if p.is_file()}
    assert found == known
    readme = README.read_text()
    for p in known - {README}:
        assert p.name in readme, f"{p.name} is not described in workflows/README.md"


def test_job_toml_loads():
    cfg = load_nightly_config(JOB)
    assert cfg.state.startswith(f"{SITE}/")
    assert cfg.releases.startswith(f"{SITE}/")
    assert cfg.inbox.startswith(f"{SITE}/")
    for key in ("state", "start_date", "inbox", "pattern", "missing", "releases"):
        assert re.search(rf"^{key} = ", JOB.read_text(), re.MULTILINE), (
            f"{key} is not set explicitly"
        )


@pytest.mark.parametrize("path", [CRON, MONTHLY], ids=lambda p: p.name)
def test_crontab_parses(path):
    entries = _crontab_entries(path)
    assert entries
    for _, command in entries:
        assert not re.search(r"(?<!\\)%", command), (
            "cron turns an unescaped % into a newline"
        )
        flock, argv = _split_flock(_first_command(command.replace("\\%", "%")))
        assert flock[:2] == ["flock", "-n"]
        assert os.path.isabs(argv[0]) or argv[0] == "dplr"
        assert os.path.basename(argv[0]) == "dplr"


def test_cron_runs_dplr_nightly():
    flock, argv = _cron_command()
    assert os.path.isabs(argv[0]), "cron's PATH is minimal: name dplr by its full path"
    assert flock[flock.index("-E") + 1] == "75", (
        "a held flock exits 75, as dplr's own lock"
    )


def test_systemd_units():
    service, timer = _unit(SERVICE), _unit(TIMER)
    assert {"Unit", "Service"} <= set(service.sections())
    s = service["Service"]
    assert s["Type"] == "oneshot"
    assert s["User"] not in ("", "root")
    assert s.get("Group")
    assert s["ProtectSystem"] == "strict"
    assert s["PrivateTmp"] == "true"
    assert s["NoNewPrivileges"] == "true"
    assert s["UMask"] == "0077"
    assert {"2", "3"} <= set(s["RestartPreventExitStatus"].split())
    assert not {"2", "3"} & set(s.get("SuccessExitStatus", "").split())
    _dplr_nightly(_systemd_command(), INSTALLED_JOB)
    # the run writes the state and the releases, and must not be able to write the inbox
    cfg = load_nightly_config(JOB)
    writable = [p.lstrip("-+") for p in s["ReadWritePaths"].split()]
    assert _under(cfg.state, writable)
    assert _under(cfg.releases, writable)
    assert not _under(os.path.dirname(cfg.inbox), writable)
    assert {"Unit", "Timer", "Install"} <= set(timer.sections())
    t = timer["Timer"]
    assert t["Persistent"] == "true"
    assert t["OnCalendar"] == "*-*-* 02:30:00 UTC"
    assert t.get("Unit", SERVICE.name) == SERVICE.name
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_kubernetes_cronjob():
    docs = _k8s_docs()
    cj = docs["CronJob"]
    assert cj["apiVersion"] == "batch/v1"
    assert docs["ConfigMap"]["apiVersion"] == "v1"
    spec = cj["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedule"] == "30 2 * * *"
    assert spec["timeZone"] == "Etc/UTC"
    _cron_schedule(spec["schedule"])
    assert isinstance(spec["startingDeadlineSeconds"], int)
    assert spec["startingDeadlineSeconds"] > 0
    assert isinstance(spec["jobTemplate"]["spec"]["backoffLimit"], int)
    pod = _k8s_pod()
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(pod["securityContext"]["fsGroup"], int)
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert ":" in container["image"], "pin the image by tag"
    assert not container["image"].endswith(":latest")
    _dplr_nightly(_k8s_command(), _k8s_job_path())


def test_kubernetes_job_is_the_documented_job(tmp_path):
    """The ConfigMap's TOML loads, equals workflows/nightly.toml, and lives on the volume."""
    cfg = _load_text(_k8s_job_text(), tmp_path)
    assert _fields(cfg) == _fields(load_nightly_config(JOB))
    pod = _k8s_pod()
    (pvc,) = yaml.safe_load_all(PVC.read_text())
    assert pvc["kind"] == "PersistentVolumeClaim"
    (vol,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    (mount,) = [
        m for m in pod["containers"][0]["volumeMounts"] if m["name"] == vol["name"]
    ]
    assert not mount.get("readOnly", False)
    for path in (cfg.state, cfg.releases, os.path.dirname(cfg.inbox)):
        assert _under(path, [mount["mountPath"]]), f"{path} is not on the volume"


# the date expression ------------------------------------------------------------

_GNU_DATE = (
    shutil.which("date") is not None
    and subprocess.run(
        ["date", "--version"], capture_output=True, check=False
    ).returncode
    == 0
)


def _date_of(name: str) -> str:
    """The --date argument of a nightly workflow, unescaped for the shell."""
    argv = _workflow(name)[1]
    return _dplr_nightly(argv, argv[3])


def _date_expr(name: str) -> list[str]:
    expr = _date_of(name)
    match = re.fullmatch(r"\$\((.*)\)", expr)
    assert match, f"--date {expr!r} is not a $(...) substitution"
    argv = shlex.split(match.group(1))
    assert argv[0] == "date", argv
    assert "-u" in argv, "the date is a UTC day"
    assert "-d" in argv, argv
    return argv


@pytest.mark.skipif(not _GNU_DATE, reason="needs GNU date")
@pytest.mark.parametrize("name", NIGHTLY)
@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("2027-01-02T02:30:00Z", "2027-01-01"),  # the schedule: yesterday
        ("2027-01-02T08:30:00Z", "2027-01-01"),  # a late start
        ("2027-01-02T01:00:00Z", "2026-12-31"),  # before the grace ends: the day before
        ("2027-01-01T00:30:00Z", "2026-12-30"),
    ],
)
def test_date_is_yesterday_after_the_grace(name, now, expected):
    """--date is the UTC date of now - 26 h: yesterday at 02:30, never a day still arriving."""
    argv = _date_expr(name)
    i = argv.index("-d") + 1
    argv[i] = f"{now} {argv[i]}"
    out = subprocess.run(
        argv, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == expected


@pytest.mark.skipif(not _GNU_DATE, reason="needs GNU date")
@pytest.mark.parametrize("name", NIGHTLY)
def test_date_expression_runs_in_sh(name):
    expr = _date_of(name)
    now = dt.datetime.now(dt.UTC)
    out = subprocess.run(
        ["/bin/sh", "-c", f'printf %s "{expr}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    later = dt.datetime.now(dt.UTC)
    grace = dt.timedelta(hours=26)
    assert out in {(now - grace).date().isoformat(), (later - grace).date().isoformat()}


# -- dry runs -----------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` with its size, mode and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mode, st.st_mtime_ns)
    return out


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=180, env=env
    )


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """Run every workflow's command with --dry-run against a stream in a temporary site.

    Returns the site's job config, the snapshot of the site before and after
    the runs, the bytes of the state's zarr.json before, and each run's result.
    """
    site = tmp_path_factory.mktemp("var-lib-dplr")
    jobs = tmp_path_factory.mktemp("jobs")
    text = JOB.read_text().replace(f"{SITE}/", f"{site}/")
    cfg = _load_text(text, jobs)
    start = cfg.start_date
    init = _run(
        [
            *DPLR,
            "stream",
            "init",
            cfg.state,
            "--rows",
            str(SHAPE[0]),
            "--cols",
            str(SHAPE[1]),
            "--rank",
            "3",
            "--horizon",
            str(HORIZON),
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--unit",
            "row",
            "--ledger",
            str(site / "ratings.dplr-ledger.json"),
            "--budget-epsilon",
            "1",
            "--budget-delta",
            "1e-6",
        ]
    )
    assert init.returncode == 0, init.stderr
    inbox = Path(cfg.inbox_for(start))
    inbox.mkdir(parents=True)
    rng = np.random.default_rng(7)
    i = rng.integers(0, SHAPE[0], 40)
    write_batch(
        inbox / BATCH,
        {
            "entity": i,
            "i": i,
            "j": rng.integers(0, SHAPE[1], 40),
            "s": rng.normal(size=40) * 0.05,
        },
    )

    commands: dict[str, list[str]] = {}
    for name in NIGHTLY:
        wrapper, _, job_text = _workflow(name)
        rewritten = job_text.replace(f"{SITE}/", f"{site}/")
        job = jobs / f"{name}.toml"
        job.write_text(rewritten)
        paths = load_nightly_config(job)
        assert all(
            _under(p, [str(site)]) for p in (paths.state, paths.inbox, paths.releases)
        )
        if wrapper:
            wrapper = [
                shutil.which("flock") or "flock",
                *wrapper[1:-1],
                str(jobs / f"{name}.lock"),
            ]
        commands[name] = [
            *wrapper,
            *DPLR,
            "nightly",
            "--config",
            str(job),
            "--date",
            start.isoformat(),
            "--dry-run",
        ]
    bad = jobs / "unknown-key.toml"
    bad.write_text(text.replace("[output]\n", "[output]\nretention_days = 30\n", 1))
    commands["unknown-key"] = [
        *DPLR,
        "nightly",
        "--config",
        str(bad),
        "--date",
        start.isoformat(),
        "--dry-run",
    ]
    beyond = (start + dt.timedelta(days=HORIZON)).isoformat()
    commands["beyond-horizon"] = [
        *DPLR,
        "nightly",
        "--config",
        str(jobs / "cron.toml"),
        "--date",
        beyond,
        "--dry-run",
    ]
    if shutil.which("flock") is None:
        for name in NIGHTLY:
            commands[name] = commands[name][commands[name].index(DPLR[0]) :]

    meta = Path(cfg.state) / "zarr.json"
    before, meta_bytes = _snapshot(site), meta.read_bytes()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(zip(commands, pool.map(_run, commands.values()), strict=True))
    return {
        "cfg": cfg,
        "before": before,
        "after": _snapshot(site),
        "meta": meta,
        "meta_bytes": meta_bytes,
        "results": results,
        "start": start,
    }


@pytest.mark.parametrize("name", NIGHTLY)
def test_dry_run(dry_runs, name):
    proc = dry_runs["results"][name]
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stderr == ""
    planned = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(dry_runs["start"].isoformat())
    ]
    assert len(planned) == 1, proc.stdout
    assert "epoch 1/" in planned[0]
    assert "1 batch file(s)" in planned[0]
    assert "dry run" in proc.stdout


def test_dry_runs_wrote_nothing(dry_runs):
    assert dry_runs["meta"].read_bytes() == dry_runs["meta_bytes"]
    assert not os.path.lexists(dry_runs["cfg"].releases)
    assert dry_runs["after"] == dry_runs["before"]


def test_dry_run_names_the_batch_files(dry_runs):
    assert BATCH in dry_runs["results"]["cron"].stdout


def test_unknown_key_fails_the_dry_run(dry_runs, tmp_path):
    proc = dry_runs["results"]["unknown-key"]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "retention_days" in proc.stderr
    assert "unknown-key.toml" in proc.stderr
    with pytest.raises(InvalidParameterError, match="retention_days"):
        _load_text(
            JOB.read_text().replace("[output]\n", "[output]\nretention_days = 30\n"),
            tmp_path,
        )


def test_date_beyond_the_horizon_exits_3(dry_runs):
    proc = dry_runs["results"]["beyond-horizon"]
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "horizon" in proc.stderr
