"""The persistent state of a turnstile stream: a Zarr v3 group with atomic commits.

Problem. A stream's state -- exact tree p-sums, the sketches of epochs not yet
closed, the per-entity clipping budgets, the batches applied and the releases
published -- must survive crashes at any instant: a failed ingest or release
must leave the state exactly as it was, and a completed one must be durable.

Layout (``spec sketch-lrf 6.5``)::

    STATE/                     directory, mode 0700 (as sensitive as the data)
      zarr.json                the group; attributes["dplr_stream"] = manifest
      secrets.json             sketch seed and noise key, mode 0600
      .lock                    advisory lock serialising writers
      g<gen>-<name>/           Zarr arrays, immutable once written

Among the arrays, ``entities/ids_data`` and ``entities/ids_offsets`` hold the
stream's string entity ids (:class:`pipeline.io.entity_ids.EntityIds`), as
private as the data; they change only in the commit of the ingest that brings
new ids, together with the budgets ``entities/*`` that they index.

Commits are copy-on-write: the arrays a step changes are written under new
names, flushed to disk, and only then the manifest (``zarr.json``), which maps
each logical array to its current stored name, is replaced in one atomic
rename. A crash before the rename leaves unreferenced arrays (removed by the
next writer); after it, the new state is complete. The sketch seed and the
noise key never enter the manifest, task graphs or logs: they live in
``secrets.json`` only.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import zarr

from pipeline._durable import fsync_path, fsync_tree, write_private
from pipeline.errors import StoreLayoutError
from pipeline.io.objectstore import local_path
from pipeline.mechanisms.noise import NoiseKey

__all__ = [
    "LEGACY_FORMAT",
    "STATE_FORMAT",
    "StateLockedError",
    "StreamStore",
    "is_stream_state",
]

#: The format of the states this version writes. Format 2 maps string entity ids
#: through a table of the ids (``entities/ids_data``, ``entities/ids_offsets``).
STATE_FORMAT = "dplr-stream/2"
#: The earlier format, still read: string entity ids were hashed with a key
#: derived from the public stream id, so two ids could share a key. Such a state
#: opens, releases and reports; it takes no further string ids.
LEGACY_FORMAT = "dplr-stream/1"
_READABLE = (LEGACY_FORMAT, STATE_FORMAT)
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_MANIFEST_KEY = "dplr_stream"
_SECRETS = "secrets.json"
_LOCK = ".lock"
_ROWS_PER_CHUNK_BYTES = 32 * 2**20  # chunk rows so that one chunk is ~32 MiB


class StateLockedError(StoreLayoutError):
    """Another process holds the stream's lock (a concurrent ingest, release or nightly run)."""


def is_stream_state(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a directory whose ``zarr.json`` carries a stream manifest.

    A cheap test of what ``path`` claims to be (no format check, no lock):
    :meth:`StreamStore.open` checks the rest. Never raises.
    """
    try:
        with open(os.path.join(os.fspath(path), "zarr.json"), "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError, TypeError):
        return False
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return isinstance(attrs, dict) and isinstance(attrs.get(_MANIFEST_KEY), dict)


def _stored_name(gen: int, logical: str) -> str:
    return f"g{gen:06d}-" + re.sub(r"[^A-Za-z0-9_]", "_", logical)


class StreamStore:
    """Handle on a stream state directory.

    Use :meth:`create` once, :meth:`open` afterwards. Writers take
    :meth:`lock` and call :meth:`commit`; readers see the last committed
    manifest.
    """

    __slots__ = ("_manifest", "path")

    def __init__(self, path: str, manifest: dict[str, Any]) -> None:
        self.path = path
        self._manifest = manifest

    def __repr__(self) -> str:
        return f"StreamStore({self.path!r})"

    # -- creation and opening -------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        manifest: Mapping[str, Any],
        sketch_seed: int,
        noise_key: NoiseKey | None,
        arrays: Mapping[str, np.ndarray] | None = None,
    ) -> StreamStore:
        """Create a new state directory, atomically.

        Everything is written to a hidden directory beside ``path`` and renamed
        into place last, so a crash leaves no half-made state at ``path``.

        Raises
        ------
        StoreLayoutError
            If ``path`` exists, or its parent directory does not.
        InvalidParameterError
            If ``path`` is an object-store URL (a state needs atomic renames).
        """
        path = local_path(path, "stream state")
        parent, base = os.path.split(path)
        if os.path.lexists(path):
            raise StoreLayoutError(
                f"stream state {path!r} already exists; a stream is created once "
                "(its budget cannot be reset). Choose another path."
            )
        if not os.path.isdir(parent):
            raise StoreLayoutError(
                f"the directory of the stream state {parent!r} does not exist."
            )
        tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
        os.mkdir(tmp, _DIR_MODE)
        try:
            secrets_doc = {
                "format": STATE_FORMAT,
                "sketch_seed": str(int(sketch_seed)),
                "noise_key": None if noise_key is None else noise_key.secret.hex(),
                "insecure_noise": bool(noise_key is not None and noise_key.insecure),
            }
            write_private(os.path.join(tmp, _SECRETS), json.dumps(secrets_doc).encode())
            store = cls(tmp, {})
            doc = dict(manifest) | {
                "format": STATE_FORMAT,
                "generation": 0,
                "arrays": {},
            }
            store._write_arrays_and_manifest(doc, dict(arrays or {}))
            os.rename(tmp, path)
            fsync_path(parent)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        return cls.open(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> StreamStore:
        """Open an existing state and check its format.

        Raises
        ------
        StoreLayoutError
            If ``path`` is not a dplr stream state, or one of another format
            version (the message names both versions).
        InvalidParameterError
            If ``path`` is an object-store URL (a state needs atomic renames).
        """
        path = local_path(path, "stream state")
        meta = os.path.join(path, "zarr.json")
        try:
            with open(meta, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            raise StoreLayoutError(
                f"{path!r} is not a dplr stream state (no zarr.json); create one "
                "with 'dplr stream init'."
            ) from None
        except (OSError, ValueError):
            raise StoreLayoutError(
                f"the stream state {path!r} has an unreadable zarr.json."
            ) from None
        manifest = (
            doc.get("attributes", {}).get(_MANIFEST_KEY)
            if isinstance(doc, dict)
            else None
        )
        if not isinstance(manifest, dict):
            raise StoreLayoutError(
                f"{path!r} is a Zarr group but not a dplr stream state."
            )
        fmt = manifest.get("format")
        if fmt not in _READABLE:
            raise StoreLayoutError(
                f"the stream state {path!r} has format {fmt!r}; this version of dplr "
                f"reads {' and '.join(map(repr, _READABLE))}. Use the dplr version that created it."
            )
        if not os.path.exists(os.path.join(path, _SECRETS)):
            raise StoreLayoutError(
                f"the stream state {path!r} has lost its secrets file."
            )
        return cls(path, manifest)

    # -- reading --------------------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any]:
        """A deep copy of the last committed (or loaded) manifest."""
        return json.loads(json.dumps(self._manifest))  # type: ignore[no-any-return]

    def reload(self) -> None:
        """Re-read the manifest from disk (after another process committed)."""
        self._manifest = StreamStore.open(self.path)._manifest

    def secrets(self) -> tuple[int, NoiseKey | None]:
        """The sketch seed and the stream's noise key (None when not private)."""
        with open(os.path.join(self.path, _SECRETS), "rb") as f:
            doc = json.loads(f.read())
        key = doc.get("noise_key")
        noise = (
            None
            if key is None
            else NoiseKey(bytes.fromhex(key), insecure=bool(doc.get("insecure_noise")))
        )
        return int(doc["sketch_seed"]), noise

    def has(self, logical: str) -> bool:
        return logical in self._manifest["arrays"]

    def names(self, prefix: str) -> list[str]:
        """Logical array names starting with ``prefix``."""
        return sorted(n for n in self._manifest["arrays"] if n.startswith(prefix))

    def read(self, logical: str) -> np.ndarray:
        """Read one committed array into memory."""
        try:
            stored = self._manifest["arrays"][logical]
        except KeyError:
            raise StoreLayoutError(
                f"the stream state has no array {logical!r}."
            ) from None
        try:
            arr = zarr.open_array(os.path.join(self.path, stored), mode="r")
            return np.asarray(arr[...])
        except Exception as exc:  # noqa: BLE001 - a damaged state must not surface as a raw zarr traceback
            raise StoreLayoutError(
                f"the stream state's array {logical!r} is unreadable ({type(exc).__name__}); "
                "restore the state from a backup."
            ) from None

    # -- writing --------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, *, wait: bool = False) -> Iterator[None]:
        """Hold the stream's exclusive lock (``fcntl.flock``).

        Raises
        ------
        StateLockedError
            If another process holds it and ``wait`` is False.
        """
        fd = os.open(os.path.join(self.path, _LOCK), os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise StateLockedError(
                        f"another dplr process is working on the stream {self.path!r} "
                        "(its lock is held); nothing was done. Retry when it has finished."
                    ) from None
                raise
            self.reload()
            self._collect_garbage()
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def commit(
        self,
        *,
        arrays: Mapping[str, np.ndarray | None] = {},
        changes: Mapping[str, Any] = {},
    ) -> None:
        """Write new arrays (None deletes one) and manifest changes in one atomic step.

        Call with the lock held.
        """
        doc = self.manifest
        doc.update(changes)
        self._write_arrays_and_manifest(doc, dict(arrays))
        self._collect_garbage()

    def _write_arrays_and_manifest(
        self, doc: dict[str, Any], arrays: dict[str, np.ndarray | None]
    ) -> None:
        gen = int(doc.get("generation", 0)) + 1
        table = dict(doc.get("arrays", {}))
        written = []
        for logical, value in arrays.items():
            if value is None:
                table.pop(logical, None)
                continue
            stored = _stored_name(gen, logical)
            full = os.path.join(self.path, stored)
            _write_array(full, np.asarray(value))
            written.append(full)
            table[logical] = stored
        for full in written:
            fsync_tree(full)
        doc["generation"] = gen
        doc["arrays"] = table
        doc["updated"] = datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"
        )
        group = {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {_MANIFEST_KEY: doc},
        }
        data = json.dumps(group, indent=1, allow_nan=False).encode()
        write_private(os.path.join(self.path, "zarr.json"), data)
        self._manifest = json.loads(json.dumps(doc))

    def _collect_garbage(self) -> None:
        """Remove arrays no manifest references (left by a crash or superseded)."""
        live = set(self._manifest.get("arrays", {}).values())
        for entry in os.listdir(self.path):
            if re.fullmatch(r"g\d{6}-.+", entry) and entry not in live:
                shutil.rmtree(os.path.join(self.path, entry), ignore_errors=True)
            elif entry.startswith(("zarr.json.tmp-", f"{_SECRETS}.tmp-")):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, entry))


def _write_array(path: str, value: np.ndarray) -> None:
    """One uncompressed Zarr v3 array (the sketches are dense Gaussian sums)."""
    if value.ndim == 0:
        value = value.reshape(1)
    row_bytes = max(1, value.itemsize * int(np.prod(value.shape[1:], dtype=np.int64)))
    rows = max(1, min(value.shape[0] or 1, _ROWS_PER_CHUNK_BYTES // row_bytes))
    chunks = (rows, *value.shape[1:])
    arr = zarr.create_array(
        store=path,
        shape=value.shape,
        chunks=chunks,
        dtype=value.dtype,
        compressors=None,
        fill_value=0,
        zarr_format=3,
    )
    if value.size:
        arr[...] = value
