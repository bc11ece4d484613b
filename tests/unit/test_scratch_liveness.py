"""Scratch subdirectories and their liveness locks (``pipeline.io.scratch``).

A job's scratch subdirectory holds exact intermediates (trusted zone). It is
marked alive by an ``flock`` its client process holds; :func:`remove_dead`
removes the subdirectories whose lock nobody holds (dead jobs) and never a live
one. The locks here are held by real separate processes, and a dead job is one
that was SIGKILLed: the kernel, not the job, releases its lock.
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import pipeline.io.release as release_mod
from pipeline.errors import StoreLayoutError
from pipeline.io import scratch as _scratch
from pipeline.io.release import read_group, write_group
from pipeline.io.scratch import LOCK_NAME, PREFIX, JobScratch, remove_dead

# A job's client, reduced to its scratch subdirectory: creates and locks it,
# spills one block, prints the path, then waits (alive) until stdin closes.
_HOLDER = """
import sys
from pipeline.io.scratch import JobScratch
job = JobScratch.create(sys.argv[1], sys.argv[2])
with open(job.path + "/dplr-spill-Y-0.npy", "wb") as fh:
    fh.write(b"exact block")
print(job.path, flush=True)
sys.stdin.read()
"""


@contextmanager
def holder(
    directory: Path, prefix: str
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A live job (another process) with its subdirectory in ``directory``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, os.fspath(directory), prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, "the holder did not start"
        yield proc, Path(line)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def dead_job(directory: Path, prefix: str) -> Path:
    """The subdirectory of a job that was SIGKILLed while it ran (lock taken, block spilled)."""
    with holder(directory, prefix) as (proc, path):
        proc.kill()
        assert proc.wait(timeout=30) == -9
    assert (path / "dplr-spill-Y-0.npy").exists()
    return path


def lock_is_free(path: Path) -> bool:
    fd = os.open(path / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


LOCATIONS = {
    # (where the job's directory is, the arguments of remove_dead)
    "beside OUT": lambda tmp: (tmp, f".r.zarr{PREFIX}", {"out": tmp / "r.zarr"}),
    "scratch directory": lambda tmp: (tmp, PREFIX, {"scratch": tmp}),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("location", list(LOCATIONS))
def test_a_live_jobs_directory_is_never_removed(tmp_path: Path, location: str) -> None:
    directory, prefix, where = LOCATIONS[location](tmp_path)
    with holder(directory, prefix) as (proc, live):
        assert not lock_is_free(live)
        assert remove_dead(**where) == []
        assert remove_dead(**where) == []
        assert (live / "dplr-spill-Y-0.npy").read_bytes() == b"exact block"
        # the same directory is removable as soon as its job is dead: the check
        # above is the lock, nothing else
        proc.kill()
        assert proc.wait(timeout=30) == -9
        assert lock_is_free(live)
        assert remove_dead(**where) == [os.fspath(live)]
    assert list(tmp_path.iterdir()) == []


def test_a_job_is_alive_from_its_creation_to_its_removal(tmp_path: Path) -> None:
    job = JobScratch.create(os.fspath(tmp_path), f".r.zarr{PREFIX}")
    path = Path(job.path)
    assert path.name.startswith(f".r.zarr{PREFIX}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((path / LOCK_NAME).stat().st_mode) == 0o600
    assert not lock_is_free(path)  # flock: another open file, even in this process
    assert remove_dead(out=tmp_path / "r.zarr") == []
    with job:
        (path / "block.npy").write_bytes(b"x")
    assert not job.alive
    assert list(tmp_path.iterdir()) == []
    job.remove()  # idempotent


def test_dead_leftovers_are_removed_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "r.zarr"
    out.mkdir()
    (tmp_path / ".r.zarr.dplr-journal").mkdir()
    killed = dead_job(tmp_path, f".r.zarr{PREFIX}")
    # a job that died between making its directory and locking it, or one of a
    # version without locks
    unlocked = tmp_path / f".r.zarr{PREFIX}nolock"
    unlocked.mkdir(mode=0o700)
    (unlocked / "dplr-spill-Y-1.npy").write_bytes(b"exact block")
    removing = tmp_path / f".r.zarr{PREFIX}abc.removing"
    removing.mkdir()
    (removing / "dplr-spill-Q-0.npy").write_bytes(b"block")
    # not this output's, or not a directory of ours to delete
    other = dead_job(tmp_path, f".other.zarr{PREFIX}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"keep")
    (tmp_path / f".r.zarr{PREFIX}link").symlink_to(elsewhere)
    (tmp_path / f".r.zarr{PREFIX}file").write_bytes(b"keep")

    removed = remove_dead(out=out)
    assert sorted(removed) == sorted(map(os.fspath, (killed, unlocked, removing)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".r.zarr.dplr-journal", "r.zarr", other.name, "elsewhere",
         f".r.zarr{PREFIX}link", f".r.zarr{PREFIX}file"]
    )  # fmt: skip
    assert (elsewhere / "keep").read_bytes() == b"keep"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]  # no lock made there
    assert remove_dead(out=tmp_path / "other.zarr") == [os.fspath(other)]


def test_a_user_scratch_directory_and_the_place_beside_out_are_both_cleaned(
    tmp_path: Path,
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "unrelated").write_bytes(b"keep")
    in_scratch = dead_job(scratch, PREFIX)
    beside = dead_job(tmp_path, f".r.zarr{PREFIX}")
    removed = remove_dead(scratch, tmp_path / "r.zarr")
    assert sorted(removed) == sorted(map(os.fspath, (in_scratch, beside)))
    assert [p.name for p in scratch.iterdir()] == ["unrelated"]
    assert remove_dead(tmp_path / "missing", tmp_path / "missing" / "o.zarr") == []


WINDOWS = ["after mkdir, before the lock file", "after the lock file, before flock"]


def _cleaner_in(mp: pytest.MonkeyPatch, tmp_path: Path, window: str) -> list[str]:
    """Runs ``remove_dead`` (another job starting at the same place) once, inside
    ``window`` of the creation of a job's directory; returns what it removed."""
    removed: list[str] = []
    started: list[bool] = []

    def clean_once() -> None:
        if not started:
            started.append(True)
            removed.extend(remove_dead(out=tmp_path / "r.zarr"))

    if window == WINDOWS[0]:
        real_mkdtemp = tempfile.mkdtemp

        def mkdtemp(*args, **kwargs):  # type: ignore[no-untyped-def]
            path = real_mkdtemp(*args, **kwargs)
            clean_once()
            return path

        mp.setattr(_scratch.tempfile, "mkdtemp", mkdtemp)
    else:
        real_lock = _scratch._lock

        def lock(fd: int) -> bool:
            clean_once()
            return real_lock(fd)

        mp.setattr(_scratch, "_lock", lock)
    return removed


@pytest.mark.parametrize("window", WINDOWS)
def test_a_cleaner_in_the_creation_window_makes_the_job_start_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: str
) -> None:
    """A cleaner that looks at a directory before its job has locked it takes it
    (it cannot tell it from a dead one); the job must then notice and use a new
    one, never run in a directory a cleaner removes."""
    with monkeypatch.context() as mp:
        removed = _cleaner_in(mp, tmp_path, window)
        job = JobScratch.create(os.fspath(tmp_path), f".r.zarr{PREFIX}")
    assert len(removed) == 1
    assert removed[0] != job.path  # the first one was taken
    assert not os.path.lexists(removed[0])
    assert not lock_is_free(Path(job.path))
    assert remove_dead(out=tmp_path / "r.zarr") == []
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(job.path)]
    job.remove()


def test_negative_control_a_cleaner_without_the_lock_check_removes_a_live_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the cleaner judged a job dead without trying its lock, the live
    holder's directory would go: the lock is what protects it."""
    monkeypatch.setattr(_scratch, "_lock", lambda fd: True)
    with holder(tmp_path, f".r.zarr{PREFIX}") as (_, live):
        assert remove_dead(out=tmp_path / "r.zarr") == [os.fspath(live)]
        assert not live.exists()


def test_an_unusable_scratch_directory_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    for bad in (tmp_path / "missing", afile):
        with pytest.raises(
            StoreLayoutError,
            match=r"^the scratch directory .* does not exist; create it",
        ):
            _scratch.check_scratch(bad)
    assert _scratch.check_scratch(tmp_path) == os.fspath(tmp_path)


def test_make_and_remove_by_path(tmp_path: Path) -> None:
    assert _scratch.make_scratch(None, None) is None
    dead = dead_job(tmp_path, PREFIX)
    with _scratch.job_scratch(tmp_path, tmp_path / "r.zarr") as path:
        assert path is not None
        assert os.path.dirname(path) == os.fspath(tmp_path)
        assert not dead.exists()  # a new job first removes what dead ones left
        assert not lock_is_free(Path(path))
    assert list(tmp_path.iterdir()) == []


# -- temporary publications (``.OUT.tmp-<id>``, pipeline.io.release.write_group) --
# A client killed while it publishes, reduced to its temporary group: creates and
# locks it beside OUT, writes a file into it, prints the path, then waits (alive)
# until stdin closes.
_PUBLISHER = """
import sys
from pipeline.io.scratch import Publication, publication_location
pub = Publication.create(*publication_location(sys.argv[1]))
with open(pub.path + "/zarr.json", "w") as fh:
    fh.write("{}")
print(pub.path, flush=True)
sys.stdin.read()
"""


@contextmanager
def publisher(out: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A live publication of ``out`` (another process) beside it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PUBLISHER, os.fspath(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, "the publisher did not start"
        yield proc, Path(line)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def dead_publication(out: Path) -> Path:
    """The temporary group of a publication SIGKILLed before its rename."""
    with publisher(out) as (proc, path):
        proc.kill()
        assert proc.wait(timeout=30) == -9
    assert (path / "zarr.json").exists()
    return path


def dir_lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _publish(out: Path, value: float, *, overwrite: bool) -> None:
    write_group(out, {"S": np.full(3, value)}, {"value": value}, overwrite=overwrite)


@pytest.mark.timeout(60)
def test_a_live_publication_is_never_removed_and_a_dead_one_is(tmp_path: Path) -> None:
    out = tmp_path / "r.zarr"
    with publisher(out) as (proc, live):
        assert live.name.startswith(f".r.zarr{_scratch.TMP_INFIX}")
        assert not dir_lock_is_free(live)
        assert remove_dead(out=out) == []
        _publish(out, 1.0, overwrite=False)  # another job publishes OUT meanwhile
        assert (live / "zarr.json").read_text() == "{}"
        # removable as soon as its writer is dead: the check above is the lock
        proc.kill()
        assert proc.wait(timeout=30) == -9
        assert dir_lock_is_free(live)
        assert remove_dead(out=out) == [os.fspath(live)]
    assert [p.name for p in tmp_path.iterdir()] == ["r.zarr"]


@pytest.mark.timeout(60)
def test_the_next_publication_removes_a_dead_ones_temporary_and_the_old_code_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control first: a publication that does not look for dead ones
    (what write_group did before) leaves the killed one's temporary group
    beside OUT. Then the next publication removes it; the group it publishes
    holds zarr's files only (the lock is on the directory, not a file in it)."""
    out = tmp_path / "r.zarr"
    dead = dead_publication(out)
    with monkeypatch.context() as mp:
        mp.setattr(release_mod, "remove_dead", lambda *a, **k: [])
        _publish(out, 1.0, overwrite=False)
    assert (dead / "zarr.json").exists()  # the old behaviour: it stays
    _publish(out, 2.0, overwrite=True)
    assert not os.path.lexists(dead)
    assert [p.name for p in tmp_path.iterdir()] == ["r.zarr"]
    assert sorted(p.name for p in out.iterdir()) == ["S", "zarr.json"]
    arrays, report = read_group(out, ("S",))
    assert report == {"value": 2.0}
    np.testing.assert_array_equal(arrays["S"], np.full(3, 2.0))


def test_a_cleaner_in_the_publication_window_makes_the_writer_start_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner that looks at a temporary group before its writer has locked
    it takes it; the writer must then use a new one."""
    out = tmp_path / "r.zarr"
    with monkeypatch.context() as mp:
        removed = _cleaner_in(mp, tmp_path, WINDOWS[1])
        pub = _scratch.Publication.create(*_scratch.publication_location(out))
    assert len(removed) == 1
    assert removed[0] != pub.path  # the first one was taken
    assert not os.path.lexists(removed[0])
    assert not dir_lock_is_free(Path(pub.path))
    assert remove_dead(out=out) == []
    pub.release()
    assert remove_dead(out=out) == [pub.path]
    assert list(tmp_path.iterdir()) == []
