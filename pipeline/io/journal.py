"""Release journal: the write-ahead log that makes a crashed run resumable.

A multi-release job (PCA: ``M``, then ``H_t`` and ``Z_t`` per iteration) records
every release here *before* using it, and keeps its secret noise key here too.
A rerun of the same job over the same input finds the journal, reuses every
recorded release (no second noise draw, no second charge, no pass to recompute
it) and continues with the first missing one; even a release lost just before
it was recorded re-materialises with the same noise, because the key is kept
(spec power-pca 4.9).

The journal holds the noise key: it is inside the trusted zone, like the data.
It is a directory with mode 0700 and files with mode 0600, and the job deletes
it once its release is published.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from pipeline._types import FloatArray
from pipeline.errors import StoreLayoutError
from pipeline.mechanisms.noise import NoiseKey

__all__ = ["FileJournal", "PendingJournal", "default_journal_path", "input_fingerprint"]

JOURNAL_FORMAT = "dplr-journal/1"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def default_journal_path(out: str | os.PathLike[str]) -> str:
    """``<dir>/.<name>.dplr-journal`` beside the output ``out``."""
    out = os.path.abspath(os.fspath(out)).rstrip(os.sep)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.dplr-journal")


def input_fingerprint(path: str | None) -> str | None:
    """Cheap version tag of a store: names, sizes and mtimes of its files.

    Resuming over a changed input would compose releases over two datasets, so a
    journal refuses to resume when this changes. It reads metadata only.
    """
    if path is None:
        return None
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            st = os.stat(p)
            h.update(
                f"{os.path.relpath(p, path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode()
            )
    return h.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _label_file(label: str) -> str:
    if not label or not all(ch.isalnum() or ch in "-_" for ch in label):
        raise ValueError(f"journal labels are alphanumeric, got {label!r}.")
    return f"{label}.npy"


class FileJournal:
    """A :class:`~pipeline.algorithms.power_pca.ReleaseJournal` on disk.

    Use :meth:`open` to create one or to resume from one.
    """

    def __init__(self, path: str, header: dict[str, Any], key: NoiseKey | None) -> None:
        self.path = path
        self.header = header
        self.noise_key = key
        self.resumed = False

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        noise_key: NoiseKey | None,
    ) -> FileJournal:
        """Reopen the journal of the same job (:meth:`find`), or create it.

        Parameters
        ----------
        path : path
            The journal directory.
        header : dict
            JSON-serialisable public description of the job (parameters, input
            shape and fingerprint, release id). A resumed job must match it
            except for ``release_id``, which is taken from the journal.
        noise_key : NoiseKey or None
            The fresh key of a new job; ignored when resuming (the journal's
            key is used so that no noise is ever drawn twice).

        Raises
        ------
        StoreLayoutError
            The journal belongs to another job or input, or is damaged.
        """
        found = cls.find(path, header)
        return (
            found
            if found is not None
            else cls.create(path, header, noise_key=noise_key)
        )

    @classmethod
    def find(
        cls, path: str | os.PathLike[str], header: dict[str, Any]
    ) -> FileJournal | None:
        """The journal of an interrupted run of this job, or None; writes nothing.

        A journal of another job that recorded no release yet is ignored (it
        will be replaced); one that recorded releases is refused.

        Raises
        ------
        StoreLayoutError
            The journal belongs to another job or input, or is damaged.
        """
        p = os.path.abspath(os.fspath(path))
        head = os.path.join(p, "header.json")
        if not os.path.exists(head):
            return None
        return cls._resume(p, head, header, strict=False)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        noise_key: NoiseKey | None,
    ) -> FileJournal:
        """Start a new journal (replacing one that recorded nothing)."""
        p = os.path.abspath(os.fspath(path))
        os.makedirs(p, mode=_DIR_MODE, exist_ok=True)
        os.chmod(p, _DIR_MODE)
        record = {
            "format": JOURNAL_FORMAT,
            "job": header,
            "noise_key": None if noise_key is None else noise_key.secret.hex(),
            "insecure": bool(noise_key is not None and noise_key.insecure),
        }
        _write_bytes(
            os.path.join(p, "header.json"), json.dumps(record, indent=2).encode()
        )
        return cls(p, header, noise_key)

    @classmethod
    def _resume(
        cls, p: str, head: str, header: dict[str, Any], *, strict: bool
    ) -> FileJournal | None:
        try:
            with open(head, encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, json.JSONDecodeError):
            raise StoreLayoutError(
                f"the release journal at {p!r} is damaged (header unreadable); its "
                "releases were charged. Remove it only if no release was published."
            ) from None
        if record.get("format") != JOURNAL_FORMAT:
            raise StoreLayoutError(
                f"{p!r} is not a dplr release journal (format={record.get('format')!r})."
            )
        old = dict(record.get("job", {}))
        new = dict(header)
        old_id = old.pop("release_id", None)
        new.pop("release_id", None)
        recorded = any(f.endswith(".npy") for f in os.listdir(p))
        if old != new and not recorded and not strict:
            return None  # nothing was released yet: a new job may take the place
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise StoreLayoutError(
                f"an interrupted job's release journal exists at {p!r} with different "
                f"{', '.join(diff)}; rerun that job with the same parameters and input to "
                "finish it (its releases are already charged), or remove the journal to "
                "abandon it."
            )
        hexkey = record.get("noise_key")
        key = (
            None
            if hexkey is None
            else NoiseKey(bytes.fromhex(hexkey), insecure=bool(record.get("insecure")))
        )
        job = dict(header)
        job["release_id"] = old_id
        journal = cls(p, job, key)
        journal.resumed = True
        return journal

    @property
    def release_id(self) -> str | None:
        rid = self.header.get("release_id")
        return None if rid is None else str(rid)

    def load(self, label: str) -> FloatArray | None:
        f = os.path.join(self.path, _label_file(label))
        if not os.path.exists(f):
            return None
        try:
            with open(f, "rb") as fh:
                raw = fh.read()
            with open(f + ".sha256", encoding="ascii") as fh:
                digest = fh.read().strip()
        except OSError:
            digest, raw = "", b""
        if hashlib.sha256(raw).hexdigest() != digest:
            raise StoreLayoutError(
                f"release {label!r} in the journal at {self.path!r} fails its checksum; "
                "the journal is damaged and the job cannot resume safely."
            )
        return np.load(io.BytesIO(raw), allow_pickle=False)  # type: ignore[no-any-return]

    def record(self, label: str, value: FloatArray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(value, dtype=np.float64), allow_pickle=False)
        raw = buf.getvalue()
        f = os.path.join(self.path, _label_file(label))
        # checksum first: a value file without a matching checksum is never trusted
        _write_bytes(f + ".sha256", hashlib.sha256(raw).hexdigest().encode())
        _write_bytes(f, raw)

    def labels(self) -> list[str]:
        """Labels recorded so far."""
        return sorted(f[:-4] for f in os.listdir(self.path) if f.endswith(".npy"))

    def remove(self) -> None:
        """Delete the journal (after the release is published)."""
        shutil.rmtree(self.path, ignore_errors=True)


class PendingJournal:
    """A journal that is written only when the job is about to draw noise.

    A job refused before that point (over budget, bad input, unreachable
    scheduler) leaves nothing on disk -- in particular no noise key. The job
    calls :meth:`ensure` before its ledger charge and its first noise draw.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        noise_key: NoiseKey | None,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.header = header
        self.noise_key = noise_key
        self.journal: FileJournal | None = None

    def ensure(self) -> FileJournal:
        if self.journal is None:
            self.journal = FileJournal.create(
                self.path, self.header, noise_key=self.noise_key
            )
        return self.journal

    def load(self, label: str) -> FloatArray | None:
        return None if self.journal is None else self.journal.load(label)

    def record(self, label: str, value: FloatArray) -> None:
        self.ensure().record(label, value)

    def remove(self) -> None:
        if self.journal is not None:
            self.journal.remove()
