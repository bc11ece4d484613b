"""Scheduled nightly releases of a stream: ingest the day's batches, release, point ``latest`` at it.

A nightly job is one TOML file (``workflows/nightly.toml`` is the documented
example)::

    [stream]
    state = "/var/lib/dplr/ratings.stream"   # created once with `dplr stream init`
    start_date = "2027-01-01"                # the date of epoch 1

    [input]
    inbox = "/var/lib/dplr/inbox/{date}"      # the batches that arrived for {date}
    pattern = "*.parquet"                     # which files of the inbox are batches
    missing = "error"                         # or "empty": a date with no inbox

    [output]
    releases = "/var/lib/dplr/releases"      # <releases>/<date>.zarr and <releases>/latest

    [cluster]                                 # optional: where batches are sketched
    scheduler = "tcp://scheduler:8786"        # or: config = "cluster/local.yaml"

Relative paths are relative to the TOML file's directory. ``dplr nightly
--config JOB.toml --date D`` processes every date from the one after the last
release up to D, in order (a missed night is caught up), each as its epoch
``(date - start_date).days + 1``:

1. take the stream's lock (a second concurrent run fails at once, exit 75);
2. ingest each batch of the date's inbox, in name order, skipping batches whose
   content the stream already holds (a rerun after a crash);
3. release the epoch to ``<releases>/<date>.zarr`` (atomic; a rerun republishes
   byte-identical arrays or finds them published);
4. point ``<releases>/latest`` at it (an atomic symlink swap).

Running the same date twice changes nothing and charges nothing: the stream's
budget was charged once, when it was created. ``--dry-run`` validates the job,
plans the dates, lists the batch files and checks the horizon, without taking
the lock, reading a batch or writing anything.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.accounting.ledger import Ledger
from pipeline.errors import (
    HorizonExceededError,
    InvalidParameterError,
    StoreLayoutError,
)
from pipeline.io.objectstore import location
from pipeline.jobs.engine import crash_point
from pipeline.jobs.stream import (
    continue_advice,
    open_stream,
    plan_of,
    read_manifest,
    stream_ingest,
    stream_release,
)

__all__ = ["NightlyConfig", "load_nightly_config", "parse_date", "run_nightly"]

_MISSING = ("error", "empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class NightlyConfig:
    """A validated nightly job."""

    path: str
    state: str
    start_date: _dt.date
    inbox: str
    pattern: str
    missing: str
    releases: str
    scheduler: str | None
    cluster_config: str | None

    def inbox_for(self, day: _dt.date) -> str:
        return self.inbox.replace("{date}", day.isoformat())

    def release_for(self, day: _dt.date) -> str:
        return os.path.join(self.releases, f"{day.isoformat()}.zarr")

    def epoch_of(self, day: _dt.date) -> int:
        return (day - self.start_date).days + 1

    def date_of(self, epoch: int) -> _dt.date:
        return self.start_date + _dt.timedelta(days=epoch - 1)


def _bad(path: str, text: str) -> InvalidParameterError:
    return InvalidParameterError(f"nightly job {path!r}: {text}")


def _date(value: Any, where: str, path: str) -> _dt.date:
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        return value
    try:
        return _dt.date.fromisoformat(str(value))
    except ValueError:
        raise _bad(path, f"{where} must be a date YYYY-MM-DD, got {value!r}.") from None


def parse_date(text: str) -> _dt.date:
    """Parse ``--date``; raises InvalidParameterError naming the format."""
    try:
        return _dt.date.fromisoformat(text)
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"date must be YYYY-MM-DD, got date={text!r}."
        ) from None


def load_nightly_config(path: str | os.PathLike[str]) -> NightlyConfig:
    """Read and validate a nightly job file.

    Raises
    ------
    InvalidParameterError
        Missing file, invalid TOML, unknown or missing keys, bad values; the
        message names the file and the key.
    """
    path = location(path)  # a URL stays one: "no such file", never <cwd>/s3:/...
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise _bad(path, "no such file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise _bad(path, f"not valid TOML ({exc}).") from None
    allowed = {
        "stream": {"state", "start_date"},
        "input": {"inbox", "pattern", "missing"},
        "output": {"releases"},
        "cluster": {"scheduler", "config"},
    }
    for section, body in doc.items():
        if section not in allowed:
            raise _bad(
                path, f"unknown section [{section}]; expected {sorted(allowed)}."
            )
        if not isinstance(body, dict):
            raise _bad(path, f"[{section}] must be a table.")
        extra = set(body) - allowed[section]
        if extra:
            raise _bad(
                path,
                f"unknown key(s) {sorted(extra)} in [{section}]; expected {sorted(allowed[section])}.",
            )
    base = os.path.dirname(path)

    def need(section: str, key: str) -> Any:
        try:
            value = doc[section][key]
        except KeyError:
            raise _bad(path, f"missing [{section}] {key}.") from None
        if not isinstance(value, str | _dt.date) or (
            isinstance(value, str) and not value
        ):
            raise _bad(path, f"[{section}] {key} must be a non-empty string.")
        return value

    def where(p: str) -> str:
        return os.path.normpath(os.path.join(base, os.path.expanduser(p)))

    inbox = need("input", "inbox")
    if "{date}" not in inbox:
        raise _bad(
            path, "[input] inbox must contain {date}, e.g. '/data/inbox/{date}'."
        )
    missing = doc["input"].get("missing", "error")
    if missing not in _MISSING:
        raise _bad(path, f"[input] missing must be one of {_MISSING}, got {missing!r}.")
    pattern = doc["input"].get("pattern", "*.parquet")
    if not isinstance(pattern, str) or not pattern or "/" in pattern:
        raise _bad(path, f"[input] pattern must be a file-name glob, got {pattern!r}.")
    cluster = doc.get("cluster", {})
    if "scheduler" in cluster and "config" in cluster:
        raise _bad(path, "[cluster] takes scheduler or config, not both.")
    for key in ("scheduler", "config"):
        if key in cluster and (not isinstance(cluster[key], str) or not cluster[key]):
            raise _bad(path, f"[cluster] {key} must be a non-empty string.")
    if "config" in cluster and not os.path.isfile(where(cluster["config"])):
        raise _bad(
            path, f"[cluster] config {where(cluster['config'])!r} does not exist."
        )
    return NightlyConfig(
        path=path,
        state=where(need("stream", "state")),
        start_date=_date(need("stream", "start_date"), "[stream] start_date", path),
        inbox=where(inbox),
        pattern=pattern,
        missing=missing,
        releases=where(need("output", "releases")),
        scheduler=cluster.get("scheduler"),
        cluster_config=where(cluster["config"]) if "config" in cluster else None,
    )


def _batches(cfg: NightlyConfig, day: _dt.date) -> list[str] | None:
    inbox = cfg.inbox_for(day)
    if not os.path.isdir(inbox):
        if cfg.missing == "empty":
            return []
        return None
    return sorted(glob.glob(os.path.join(glob.escape(inbox), cfg.pattern)))


def _point_latest(releases: str, target: str) -> None:
    """Atomically make ``<releases>/latest`` a relative symlink to ``target``."""
    link = os.path.join(releases, "latest")
    tmp = os.path.join(releases, f".latest.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.basename(target), tmp)
    os.replace(tmp, link)
    fd = os.open(releases, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_nightly(
    config: str | os.PathLike[str] | NightlyConfig,
    day: _dt.date,
    *,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or plan) the nightly job for ``day``.

    Returns
    -------
    dict
        ``dates``: per processed date, its epoch, batch file names, release
        path and what was done; ``dry_run``.

    Raises
    ------
    InvalidParameterError
        Bad job file, a date before the stream's start, a missing inbox.
    HorizonExceededError
        ``day``'s epoch is beyond the stream's horizon (exit code 3).
    StateLockedError
        Another run holds the stream's lock (exit code 75).
    BatchError, PrivacyUnitError
        A batch is invalid: nothing of it was applied, earlier dates stay
        released; fix or remove the batch and rerun.
    """
    cfg = config if isinstance(config, NightlyConfig) else load_nightly_config(config)
    store = open_stream(cfg.state)
    epoch = _epoch_of_day(cfg, store.manifest, day)
    if dry_run:
        return _dry_run(cfg, store.manifest, day, epoch, say)
    os.makedirs(cfg.releases, exist_ok=True)
    summary: dict[str, Any] = {"dry_run": False, "dates": []}
    with store.lock(), _client(cfg) as client:
        m = store.manifest
        if str(epoch) in m["releases"]:
            out = m["releases"][str(epoch)]["out"]
            if epoch == max(_released(m)):
                _point_latest(
                    cfg.releases, out
                )  # repairs a pointer a crash left behind
            say(
                f"{day.isoformat()} epoch {epoch}: already released to {out}; nothing to do"
            )
            summary["dates"].append(
                {
                    "date": day.isoformat(),
                    "epoch": epoch,
                    "release": out,
                    "action": "already released",
                }
            )
            return summary
        for e in range(_first_epoch(m), epoch + 1):
            summary["dates"].append(_release_date(cfg, store, e, client, say))
    return summary


def _epoch_of_day(cfg: NightlyConfig, m: dict[str, Any], day: _dt.date) -> int:
    """``day``'s epoch, refused before the stream's start or beyond its horizon."""
    plan = plan_of(m)
    epoch = cfg.epoch_of(day)
    if epoch < 1:
        raise InvalidParameterError(
            f"date {day.isoformat()} is before the stream's start date {cfg.start_date.isoformat()}."
        )
    try:
        plan.check_epoch(epoch)  # HorizonExceededError before anything else
    except HorizonExceededError:
        last = cfg.date_of(plan.horizon).isoformat()
        raise HorizonExceededError(
            f"date {day.isoformat()} is epoch {epoch}, beyond the stream's horizon of "
            f"{plan.horizon} epochs (the last date it covers is {last}); its budget was "
            "calibrated for the horizon; a new stream needs its own job file, with start_date "
            f"{cfg.date_of(plan.horizon + 1).isoformat()}. {continue_advice(m)}"
        ) from None
    return epoch


def _dry_run(
    cfg: NightlyConfig,
    m: dict[str, Any],
    day: _dt.date,
    epoch: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """What a run for ``day`` would do, checked (ledger, output, inbox) but nothing read or written."""
    horizon = plan_of(m).horizon
    summary: dict[str, Any] = {"dry_run": True, "dates": []}
    if m["ledger"] is not None:
        _check_ledger(m["ledger"])
    _check_writable(cfg)
    if str(epoch) in m["releases"]:
        say(f"{day.isoformat()} epoch {epoch}: already released; nothing to do")
        summary["dates"].append(
            {"date": day.isoformat(), "epoch": epoch, "action": "already released"}
        )
    for e in (
        range(_first_epoch(m), epoch + 1) if str(epoch) not in m["releases"] else ()
    ):
        d = cfg.date_of(e)
        files = _batches(cfg, d) if e > m["last_closed"] else []
        if files is None:
            raise _no_inbox(cfg, d, dry_run=True)
        names = ", ".join(os.path.basename(f) for f in files) or "none"
        say(
            f"{d.isoformat()} epoch {e}/{horizon}: to release, {len(files)} batch file(s) "
            f"[{names}] -> {cfg.release_for(d)}"
        )
        summary["dates"].append(
            {
                "date": d.isoformat(),
                "epoch": e,
                "batches": [os.path.basename(f) for f in files],
                "release": cfg.release_for(d),
                "action": "to release",
            }
        )
    say("dry run: the job is valid; nothing was read or written")
    return summary


def _release_date(
    cfg: NightlyConfig, store: Any, e: int, client: Any, say: Callable[[str], None]
) -> dict[str, Any]:
    """Ingest epoch ``e``'s batches (unless a crashed run closed it) and release it."""
    d = cfg.date_of(e)
    out = cfg.release_for(d)
    done: list[str] = []
    if e > read_manifest(store).last_closed:
        files = _batches(cfg, d)
        if files is None:
            raise _no_inbox(cfg, d)
        for f in files:
            # a batch applied by an earlier, interrupted run is skipped
            if not stream_ingest(cfg.state, f, epoch=e, store=store, skip_known=True)[
                "skipped"
            ]:
                done.append(os.path.basename(f))
    rel, new = stream_release(cfg.state, epoch=e, out=out, client=client, store=store)
    _point_latest(cfg.releases, out)
    crash_point("after-latest")
    action = "released" if new else "already released"
    horizon = read_manifest(store).horizon
    say(
        f"{d.isoformat()} epoch {e}/{horizon}: {len(done)} batch file(s) ingested, {action} -> {out}"
        + _signal_words(rel.report)
    )
    return {
        "date": d.isoformat(),
        "epoch": e,
        "batches": done,
        "release": out,
        "action": action,
    }


def _signal_words(report: dict[str, Any]) -> str:
    """The release's components above the noise, and its advice when few are."""
    sig = report.get("signal")
    if not sig:
        return ""
    words = f"; {sig['above']} of {sig['of']} components above the noise"
    return words + (f" (warning: {sig['advice']})" if sig["advice"] else "")


def _first_epoch(m: dict[str, Any]) -> int:
    """The first epoch a run must handle: one closed but unreleased by a crash, else the next."""
    last = int(m["last_closed"])
    if last >= 1 and str(last) not in m["releases"]:
        return last
    return last + 1


def _no_inbox(
    cfg: NightlyConfig, d: _dt.date, *, dry_run: bool = False
) -> InvalidParameterError:
    what = (
        "a run would stop at that date"
        if dry_run
        else "nothing was released for that date"
    )
    return InvalidParameterError(
        f"the inbox {cfg.inbox_for(d)!r} for {d.isoformat()} does not exist; {what} "
        "(set [input] missing = 'empty' to release a date without updates)."
    )


def _released(m: dict[str, Any]) -> set[int]:
    return {int(e) for e in m["releases"]}


def _check_writable(cfg: NightlyConfig) -> None:
    """The run will write the state and the releases directory: check it may."""
    releases = (
        cfg.releases if os.path.isdir(cfg.releases) else os.path.dirname(cfg.releases)
    )
    for what, where in (("stream state", cfg.state), ("releases directory", releases)):
        if not os.access(where, os.W_OK | os.X_OK):
            raise StoreLayoutError(
                f"the {what} {where!r} is not writable by this user."
            )


def _check_ledger(ledger: dict[str, Any]) -> None:
    book = Ledger.open(ledger["path"])
    if not any(r["release_id"] == ledger["release_id"] for r in book.releases):
        raise StoreLayoutError(
            f"the ledger {ledger['path']!r} does not hold this stream's charge "
            f"{ledger['release_id']!r}; the stream's budget is unaccounted for."
        )


@contextlib.contextmanager
def _client(cfg: NightlyConfig) -> Iterator[Any]:
    """The job's Dask client, or None (batches are then sketched in this process)."""
    if cfg.scheduler is None and cfg.cluster_config is None:
        yield None
        return
    from pipeline.execution import cluster_client  # heavy: distributed, dask

    with cluster_client(cfg.scheduler, cluster_config=cfg.cluster_config) as (
        client,
        _,
    ):
        yield client
