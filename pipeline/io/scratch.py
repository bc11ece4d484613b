"""Scratch directories: where a job's tall exact intermediates wait, and for how long.

A ``factorize`` job on a Dask input keeps the blocks of its tall objects (the
exact range sketch ``Y``, its noisy copy, the orthonormal basis: ``m x t`` each)
in a private (0700) subdirectory of its *scratch location*: the user's scratch
directory (``.dplr-scratch-*`` inside it) or, by default, the directory of
``OUT`` (``.<OUT basename>.dplr-scratch-*`` beside it). The blocks of the exact
``Y`` are as sensitive as the data (trusted zone, like the journal).

Liveness. The client process holds an exclusive ``flock`` on the file
:data:`LOCK_NAME` inside the subdirectory for as long as the job runs. The
kernel drops the lock when the process ends, however it ends (SIGKILL, power
loss of that machine), so a subdirectory whose lock nobody holds belongs to a
dead job. :func:`remove_dead` removes those, and every job that uses a scratch
location calls it first: what a killed job left is removed by the next job at
that location (a rerun of the same command, or any job on the same ``OUT``).
A live job's subdirectory is never removed: its lock cannot be taken.

The same holds for a job's temporary publication, the hidden group
``.<OUT basename>.tmp-<id>`` beside ``OUT`` that is renamed to ``OUT`` last
(:class:`Publication`): its writer holds an ``flock`` on that directory itself,
and :func:`remove_dead` (which every publication of ``OUT`` calls first)
removes it once the writer is dead, never while it writes.

Races, and why they are safe:

* a job creates its subdirectory, then creates the lock file with ``O_EXCL``
  and locks it; a cleaner that looks in between finds no lock file, creates it
  itself and takes the lock. Either the cleaner wins (the job's ``O_EXCL`` or
  its lock fails, or its lock file is gone once it has the lock: the job starts
  over with a new subdirectory) or the job wins (the cleaner cannot lock);
* removal renames the subdirectory to ``<name>.removing`` before deleting it, so
  a task of a failed or dead job that still spills a block fails instead of
  re-populating it (:func:`remove_tree`). ``*.removing`` leftovers are always
  dead and are removed too.

Limits: the lock is an advisory ``flock``; on a file system that does not share
locks between the machines that run dplr clients (an NFS mount with ``nolock``
or ``local_lock``), give each such machine its own scratch location. Where the
file system refuses locks altogether, a job runs without one and a subdirectory
it leaves after a crash is not recognised as dead (it stays, as a directory
whose owner cannot be decided). Directories of other users and symbolic links
are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Self

from pipeline.errors import StoreLayoutError
from pipeline.io.objectstore import is_url, location, refuse_url

__all__ = [
    "LOCK_NAME",
    "PREFIX",
    "TMP_INFIX",
    "JobScratch",
    "Publication",
    "check_scratch",
    "job_scratch",
    "make_scratch",
    "publication_location",
    "remove_dead",
    "remove_scratch",
    "remove_tree",
    "scratch_locations",
]

#: Name prefix of a job's subdirectory in a user-given scratch directory
#: (beside ``OUT`` it is ``.<OUT basename>`` + this).
PREFIX = ".dplr-scratch-"
#: The liveness lock file inside a job's subdirectory.
LOCK_NAME = ".lock"
#: Infix of a job's hidden temporary publication beside ``OUT``
#: (``.<OUT basename>.tmp-<id>``, see :class:`Publication`).
TMP_INFIX = ".tmp-"
_REMOVING = ".removing"
#: Pauses between deletion attempts: a task that held an open handle.
_REMOVE_PAUSES = (0.0, 0.05, 0.25, 1.0)
#: New subdirectories tried when cleaners keep taking the one just created.
_CREATE_ATTEMPTS = 8


def check_scratch(scratch: str | os.PathLike[str]) -> str:
    """Refuse an unusable scratch directory before anything is read or charged."""
    path = os.fspath(scratch)
    if not os.path.isdir(path):
        raise StoreLayoutError(
            f"the scratch directory {path!r} does not exist; create it (every worker "
            "must reach it) or pass another one."
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreLayoutError(
            f"the scratch directory {path!r} is not writable; pass one you can write to."
        )
    return path


def scratch_locations(
    scratch: str | os.PathLike[str] | None, out: str | os.PathLike[str] | None
) -> list[tuple[str, str]]:
    """``(directory, name prefix)`` of each scratch location of a job.

    The first is where the job makes its subdirectory: the scratch directory if
    given, else beside ``out`` (not when ``out`` is an object-store URL: then
    worker memory); none without either. With both, the place
    beside ``out`` is listed too, since an earlier job on the same ``out`` may
    have used it.
    """
    where: list[tuple[str, str]] = []
    if scratch is not None:
        refuse_url(os.fspath(scratch), "scratch directory", "--scratch")
        where.append((os.fspath(scratch), PREFIX))
    if out is not None and not is_url(os.fspath(out)):  # beside a URL: none
        parent, base = os.path.split(location(out))
        where.append((parent, f".{base}{PREFIX}"))
    return where


def publication_location(out: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(directory, name prefix)`` of the temporary publications of ``out``:
    ``.<OUT basename>.tmp-`` beside it; None for an object-store URL."""
    beside = scratch_locations(None, out)
    if not beside:
        return None
    directory, prefix = beside[0]
    return directory, prefix[: -len(PREFIX)] + TMP_INFIX


def _lock(fd: int) -> bool:
    """Take the exclusive lock of ``fd`` without waiting; False if another holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _names_file(fd: int, path: str) -> bool:
    """True if ``path`` still names the file open as ``fd``."""
    mine = os.fstat(fd)
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


class JobScratch:
    """A job's private scratch subdirectory, marked alive while this object holds it.

    Create it with :meth:`create`; :meth:`remove` deletes it and only then
    releases the lock. Used as a context manager, it is removed on exit.
    """

    def __init__(self, path: str, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, directory: str, prefix: str) -> JobScratch:
        """Make a new 0700 subdirectory of ``directory`` and take its liveness lock."""
        for _ in range(_CREATE_ATTEMPTS):
            path = tempfile.mkdtemp(prefix=prefix, dir=directory)
            lock = os.path.join(path, LOCK_NAME)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except (FileExistsError, FileNotFoundError):
                continue  # a cleaner took it as it appeared; it removes it
            try:
                held = _lock(fd)
            except OSError:  # a file system without locks: run unmarked
                return cls(path, fd)
            if held and _names_file(fd, lock):
                return cls(path, fd)
            os.close(fd)
        raise StoreLayoutError(
            f"could not create a scratch directory in {directory!r}: each new one was "
            "removed as it appeared; check what else cleans that directory."
        )

    @property
    def alive(self) -> bool:
        """True until :meth:`remove`."""
        return self._fd is not None

    def remove(self) -> None:
        """Delete the subdirectory (even while tasks still spill), then release the lock."""
        if self._fd is None:
            return
        try:
            remove_tree(self.path)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"JobScratch({self.path!r}, alive={self.alive})"


class Publication:
    """A job's hidden temporary group beside ``OUT``, marked alive while held.

    A release is written to ``.<OUT basename>.tmp-<id>`` and renamed to ``OUT``
    last. The liveness lock is an ``flock`` on that directory itself (so
    nothing is added to what is published; the rename keeps the lock on the
    same directory): :func:`remove_dead` removes such a directory once its
    writer is dead, never while it runs. Created as :meth:`JobScratch.create`
    creates a subdirectory, with the same race with a cleaner.
    """

    def __init__(self, path: str, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, directory: str, prefix: str) -> Publication:
        """Make a new directory ``prefix<id>`` in ``directory`` and take its lock
        (``directory, prefix`` from :func:`publication_location`)."""
        for _ in range(_CREATE_ATTEMPTS):
            path = os.path.join(directory, f"{prefix}{uuid.uuid4().hex}")
            os.mkdir(path)
            try:
                fd = _open_dir(path)
            except OSError:
                continue  # a cleaner took it as it appeared; it removes it
            try:
                held = _lock(fd)
            except OSError:  # a file system without locks: run unmarked
                return cls(path, fd)
            if held and _names_file(fd, path):
                return cls(path, fd)
            os.close(fd)
        raise StoreLayoutError(
            f"could not create a temporary release in {directory!r}: each new "
            "one was removed as it appeared; check what else cleans that directory."
        )

    def release(self) -> None:
        """Release the lock (once the directory is published or removed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"Publication({self.path!r}, alive={self._fd is not None})"


def _open_dir(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _owned_dir(path: str) -> bool:
    """True for a directory of this user (not a symbolic link to one)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _claim_dead(path: str, *, lock_file: bool = True) -> int | None:
    """The lock of ``path`` if its job is dead (the caller then removes it), else None.

    The lock is the file :data:`LOCK_NAME` inside ``path`` (a scratch
    subdirectory) or, without ``lock_file``, the directory itself (a
    :class:`Publication`). None also for anything this process may not judge:
    another user's directory, a symbolic link, a file system without locks.
    """
    if not _owned_dir(path):
        return None
    lock = os.path.join(path, LOCK_NAME) if lock_file else path
    try:
        # a lock file is created if missing: a job that died before locking, or
        # one being created now (which then loses the race and starts over)
        fd = (
            os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            if lock_file
            else _open_dir(path)
        )
    except OSError:
        return None
    try:
        if _lock(fd) and _names_file(fd, lock):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _delete(doomed: str) -> None:
    for pause in _REMOVE_PAUSES:
        time.sleep(pause)
        shutil.rmtree(doomed, ignore_errors=True)
        if not os.path.lexists(doomed):
            return


def remove_tree(path: str) -> None:
    """Remove a scratch subdirectory, even while tasks still write to it.

    When one task of a step fails (or the client dies), the step's other tasks
    may still be running on the workers and spilling their blocks. A file one
    of them creates while the tree is being removed would make the final
    ``rmdir`` fail and leave the directory behind. So the directory is first
    renamed: a task that opens a file under the old name after that fails, and
    the files created before it are all listed by the removal that follows.
    """
    doomed = f"{path}{_REMOVING}"
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path  # removed already, or a file system that cannot rename it
    _delete(doomed)


def remove_dead(
    scratch: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Remove what dead jobs left at the scratch locations of a job; the paths removed.

    Every job subdirectory there (:func:`scratch_locations`) whose liveness lock
    nobody holds, every temporary publication of ``out`` whose writer is dead
    (:class:`Publication`), and every ``*.removing`` leftover. A live job's
    directory is never removed. A location that does not exist (yet) is
    skipped, so this may run before the arguments are checked.
    """
    where = [(d, p, True) for d, p in scratch_locations(scratch, out)]
    published = None if out is None else publication_location(out)
    if published is not None:
        where.append((*published, False))
    removed: list[str] = []
    for directory, prefix, lock_file in where:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix):
                path = os.path.join(directory, name)
                if _remove_if_dead(path, lock_file=lock_file):
                    removed.append(path)
    return [p for p in removed if not os.path.lexists(p)]


def _remove_if_dead(path: str, *, lock_file: bool) -> bool:
    """Remove ``path`` if a dead job left it (:func:`remove_dead`); True if so."""
    if path.endswith(_REMOVING):
        if not _owned_dir(path):
            return False
        _delete(path)  # renamed for removal: nobody writes there
        return True
    fd = _claim_dead(path, lock_file=lock_file)
    if fd is None:
        return False
    try:
        remove_tree(path)
    finally:
        os.close(fd)
    return True


_HELD: dict[str, JobScratch] = {}
_HELD_LOCK = threading.Lock()


def make_scratch(
    scratch: str | os.PathLike[str] | None, out: str | os.PathLike[str] | None
) -> str | None:
    """The path of a new job's scratch subdirectory, or None (worker memory).

    Removes what dead jobs left there first, then creates and locks the
    subdirectory; it stays alive until :func:`remove_scratch` of that path (or
    the end of this process).
    """
    where = scratch_locations(scratch, out)
    if not where:
        return None
    remove_dead(scratch, out)
    job = JobScratch.create(*where[0])
    with _HELD_LOCK:
        _HELD[job.path] = job
    return job.path


def remove_scratch(path: str) -> None:
    """Remove a subdirectory made by :func:`make_scratch` and release its lock."""
    with _HELD_LOCK:
        job = _HELD.pop(path, None)
    if job is None:
        remove_tree(path)
    else:
        job.remove()


@contextlib.contextmanager
def job_scratch(
    scratch: str | os.PathLike[str] | None, out: str | os.PathLike[str] | None
) -> Iterator[str | None]:
    """:func:`make_scratch` for the duration of a ``with`` block, then removed."""
    path = make_scratch(scratch, out)
    try:
        yield path
    finally:
        if path is not None:
            remove_scratch(path)
