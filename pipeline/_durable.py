"""Durable writes: fsync of files and directories, and atomic private files.

A step is durable once its bytes and the directory entries naming them are on
disk; only then may a later step (a rename that publishes, a ledger charge)
depend on it.
"""

from __future__ import annotations

import contextlib
import os
import uuid

__all__ = ["fsync_path", "fsync_tree", "write_private"]

_FILE_MODE = 0o600


def fsync_path(path: str) -> None:
    """fsync one file or directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync every file and directory under ``root``."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            fsync_path(os.path.join(dirpath, f))
        fsync_path(dirpath)


def write_private(path: str, data: bytes, *more: bytes | memoryview) -> None:
    """Replace ``path`` by ``data`` atomically, mode 0600, durably.

    The bytes go to ``<path>.tmp-<random>`` first (created 0600, whatever the
    umask), are fsynced, renamed over ``path``, and the directory is fsynced.
    ``more``: buffers written after ``data`` (e.g. an array's memory, not
    copied into one ``bytes`` first).
    """
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            for buf in more:
                f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(os.path.dirname(os.path.abspath(path)))
