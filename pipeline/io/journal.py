"""Release journal: the write-ahead log that makes a crashed run resumable.

A multi-release job (PCA: ``M``, then ``H_t`` and ``Z_t`` per iteration) records
every release here *before* using it, and keeps its secret noise key here too.
A rerun of the same job over the same input finds the journal, reuses every
recorded release (no second noise draw, no second charge, no pass to recompute
it) and continues with the first missing one; even a release lost just before
it was recorded re-materialises with the same noise, because the key is kept
(spec power-pca 4.9).

A factorization (``dplr factorize``) journals instead the small *exact*
(noise-free) sketches of its passes, its noise key and sketch seed, and a
marker once the ledger is charged; its tall sketches (m x t) are named, not
written, when the input is a fingerprinted store: a rerun recomputes them with
one pass and checks the small ones against the journal, draws the same noise
and does not charge again (:meth:`FileJournal.record_sketches`,
:meth:`FileJournal.load_sketches`, :meth:`FileJournal.mark_charged`).

The journal holds the noise key (and may hold exact sketches, which are as
sensitive as the data): it is inside the trusted zone, like the data. It is a
directory with mode 0700 and files with mode 0600 (subdirectories 0700), and
the job deletes it once its release is published.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import uuid
import weakref
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import Crc32cCodec

from pipeline._durable import fsync_path, write_private
from pipeline._types import FloatArray
from pipeline.errors import StoreLayoutError
from pipeline.io._store import store_array
from pipeline.io.objectstore import is_url, local_path, url_fingerprint
from pipeline.mechanisms.noise import NoiseKey

__all__ = [
    "FileJournal",
    "JournalMismatchError",
    "PendingJournal",
    "array_fingerprint",
    "default_journal_path",
    "input_fingerprint",
]

JOURNAL_FORMAT = "dplr-journal/1"
_DIR_MODE = 0o700
_FILE_MODE = 0o600
#: Commit marker of the exact sketches of a one-pass job (written last).
_SKETCHES_FILE = "sketches.json"
#: Marker written once the ledger holds the job's charge.
_CHARGED_FILE = "charged.json"


class JournalMismatchError(StoreLayoutError):
    """A journal at the path belongs to another job or input.

    Attributes
    ----------
    path : str
        The journal directory.
    differences : list of str
        Header fields that differ (e.g. ``"parameters"``, ``"input_fingerprint"``).
    release_id : str or None
        The release id of the interrupted job (to look it up in a ledger).
    ledger : str or None
        The ledger that job charges, when its journal says.
    charged : dict or None
        That job's charge marker (:meth:`FileJournal.charged`), if written.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        differences: list[str],
        release_id: str | None,
        ledger: str | None = None,
        charged: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.differences = differences
        self.release_id = release_id
        self.ledger = ledger
        self.charged = charged


def default_journal_path(out: str | os.PathLike[str]) -> str:
    """``<dir>/.<name>.dplr-journal`` beside the output ``out``."""
    out = local_path(out, "journal", "--journal").rstrip(os.sep)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.dplr-journal")


def input_fingerprint(path: str | None) -> str | None:
    """Cheap version tag of a store: names, sizes and mtimes of its files.

    Resuming over a changed input would compose releases over two datasets, so a
    journal refuses to resume when this changes. It reads metadata only.
    """
    if path is None:
        return None
    if is_url(path):
        return url_fingerprint(path)
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


def array_fingerprint(array: Any) -> str:
    """SHA-256 of an in-memory array's dtype, shape and bytes.

    The in-memory counterpart of :func:`input_fingerprint` (which needs a path).
    It is a digest of the data: it belongs to the trusted zone, like the journal.
    A scipy sparse matrix (canonical CSR, :func:`~pipeline.io.inputs.open_input`)
    is digested from its ``indptr``, ``indices`` and ``data``.
    """
    if sp.issparse(array):
        x = sp.csr_matrix(array)
        h = hashlib.sha256(f"csr\0{x.dtype.str}\0{x.shape}\n".encode())
        for part in (x.indptr, x.indices, x.data):
            h.update(np.ascontiguousarray(part).data.cast("B"))
        return h.hexdigest()
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.dtype.str}\0{a.shape}\n".encode())
    h.update(a.data.cast("B"))  # ndarray.data is memoryview(a)
    return h.hexdigest()


def _make_private(root: str) -> None:
    """Directories 0700, files 0600 under ``root`` (written by workers), fsynced."""
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, _DIR_MODE)
        for f in files:
            p = os.path.join(dirpath, f)
            os.chmod(p, _FILE_MODE)
            fsync_path(p)
        fsync_path(dirpath)


def _label_file(label: str) -> str:
    if not label or not all(ch.isalnum() or ch in "-_" for ch in label):
        raise ValueError(f"journal labels are alphanumeric, got {label!r}.")
    return f"{label}.npy"


class FileJournal:
    """A :class:`~pipeline.algorithms.pca.ReleaseJournal` on disk.

    Use :meth:`open` to create one or to resume from one.
    """

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        key: NoiseKey | None,
        sketch_seed: int | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.noise_key = key
        self.sketch_seed = sketch_seed
        self.resumed = False
        # per sketch name: the array last written and its manifest entry, so the
        # same object recorded again is not written again (a weak reference: the
        # journal does not keep a v x N sketch alive)
        self._written: dict[str, tuple[weakref.ref[Any], dict[str, Any]]] = {}

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
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        strict: bool = False,
    ) -> FileJournal | None:
        """The journal of an interrupted run of this job, or None; writes nothing.

        A journal of another job that recorded no release yet is ignored (it
        will be replaced) unless ``strict``; one that recorded releases is
        refused.

        Raises
        ------
        JournalMismatchError
            The journal belongs to another job or input.
        StoreLayoutError
            The journal is damaged.
        """
        p = local_path(path, "journal", "--journal")
        head = os.path.join(p, "header.json")
        if not os.path.exists(head):
            return None
        return cls._resume(p, head, header, strict=strict)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        noise_key: NoiseKey | None,
        sketch_seed: int | None = None,
    ) -> FileJournal:
        """Start a new journal (replacing one that recorded nothing).

        ``sketch_seed`` (secret unless the user chose it) is kept for jobs whose
        post-processing regenerates the sketch operators after a resume.
        """
        p = local_path(path, "journal", "--journal")
        os.makedirs(p, mode=_DIR_MODE, exist_ok=True)
        os.chmod(p, _DIR_MODE)
        record: dict[str, Any] = {
            "format": JOURNAL_FORMAT,
            "job": header,
            "noise_key": None if noise_key is None else noise_key.secret.hex(),
            "insecure": bool(noise_key is not None and noise_key.insecure),
        }
        if sketch_seed is not None:
            record["sketch_seed"] = format(int(sketch_seed), "x")
        write_private(
            os.path.join(p, "header.json"), json.dumps(record, indent=2).encode()
        )
        return cls(p, header, noise_key, sketch_seed)

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
            raise JournalMismatchError(
                f"an interrupted job's release journal exists at {p!r} with different "
                f"{', '.join(diff)}; rerun that job with the same parameters and input to "
                "finish it (its releases are already charged), or remove the journal to "
                "abandon it.",
                path=p,
                differences=diff,
                release_id=None if old_id is None else str(old_id),
                ledger=None if old.get("ledger") is None else str(old["ledger"]),
                charged=cls(p, {}, None).charged(),
            )
        hexkey = record.get("noise_key")
        key = (
            None
            if hexkey is None
            else NoiseKey(bytes.fromhex(hexkey), insecure=bool(record.get("insecure")))
        )
        seed_hex = record.get("sketch_seed")
        job = dict(header)
        job["release_id"] = old_id
        journal = cls(p, job, key, None if seed_hex is None else int(seed_hex, 16))
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
        self._save(label, np.asarray(value, dtype=np.float64))

    def _save(self, label: str, value: np.ndarray) -> None:
        """``value`` as a ``.npy`` file and its checksum, written from the
        array's own memory (no serialised copy: a v x N ``Z`` is 16 MB at
        100 x 20000)."""
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise ValueError("the journal keeps numeric arrays only.")
        # the layout is kept, as np.save keeps it: a resumed job computes on the
        # arrays as the uninterrupted one did (BLAS rounds by layout)
        fortran = arr.flags.f_contiguous and not arr.flags.c_contiguous
        if not fortran:
            arr = np.asarray(arr, order="C")
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, np.lib.format.header_data_from_array_1_0(arr)
        )
        flat = arr.T.reshape(-1) if fortran else arr.reshape(-1)
        header, body = head.getvalue(), flat.data.cast("B")
        digest = hashlib.sha256(header)
        digest.update(body)
        f = os.path.join(self.path, _label_file(label))
        # checksum first: a value file without a matching checksum is never trusted
        write_private(f + ".sha256", digest.hexdigest().encode())
        write_private(f, header, body)

    def labels(self) -> list[str]:
        """Labels recorded so far."""
        return sorted(f[:-4] for f in os.listdir(self.path) if f.endswith(".npy"))

    # -- the exact sketches of a one-pass job ------------------------------------
    def record_sketches(
        self, sketches: dict[str, Any], *, client: Any = None, tall: str = "recompute"
    ) -> None:
        """Write the exact (noise-free) sketches of a pass, then commit them.

        numpy arrays (and dtypes) are kept as checksummed ``.npy`` files. Dask
        arrays -- tall sketches that stay distributed, m x t -- are by default
        only named (``tall="recompute"``): a resumed job recomputes them with
        the same pass over the same input and checks that the sketches kept
        here come out bit for bit the same (:func:`check_recomputed`). Writing
        them would cost every release a disk write of m x t float64 to spare
        a rare resume one pass. With ``tall="write"`` they are written chunk by
        chunk by the workers to a Zarr array ``exact-<name>.zarr`` (CRC32C
        checksum per chunk) under a temporary name, made private (0700/0600),
        then renamed into place. The manifest ``sketches.json`` is written last:
        :meth:`load_sketches` sees all of them or none.

        Parameters
        ----------
        sketches : dict of str to array
            Name -> numpy array or 2-D dask array.
        client : distributed.Client or None
            Runs the writes of dask arrays (None: the default scheduler).
        tall : {"recompute", "write"}
            What becomes of the dask arrays.
        """
        if tall not in ("recompute", "write"):
            raise ValueError(f"tall must be 'recompute' or 'write', got {tall!r}.")
        manifest: dict[str, Any] = {}
        for name, value in sketches.items():
            label = f"exact-{name}"
            if isinstance(value, da.Array) and tall == "recompute":
                manifest[name] = {
                    "kind": "recompute",
                    "shape": [int(x) for x in value.shape],
                    "dtype": np.dtype(value.dtype).str,
                }
            elif isinstance(value, da.Array):
                manifest[name] = self._write_tall(label, value, client)
            else:
                manifest[name] = self._write_npy(name, label, value)
        write_private(
            os.path.join(self.path, _SKETCHES_FILE),
            json.dumps({"sketches": manifest}, indent=2).encode(),
        )

    def _write_npy(self, name: str, label: str, value: Any) -> dict[str, Any]:
        """Write one in-memory sketch; the very same array recorded before (a
        two-pass job records ``Z`` after each pass) keeps its file and entry."""
        prev = self._written.get(name)
        if prev is not None and prev[0]() is value:
            return prev[1]
        arr = np.asarray(value)
        self._save(label, arr)
        entry = {
            "kind": "npy", "label": label,
            "shape": list(arr.shape), "dtype": arr.dtype.str,
        }  # fmt: skip
        if isinstance(value, np.ndarray):
            self._written[name] = (weakref.ref(value), entry)
        return entry

    def _write_tall(self, label: str, Y: da.Array, client: Any) -> dict[str, Any]:
        rows = int(max(Y.chunks[0]))
        final = os.path.join(self.path, f"{label}.zarr")
        tmp = os.path.join(self.path, f".tmp-{label}-{uuid.uuid4().hex}.zarr")
        try:
            z = zarr.create_array(
                store=tmp,
                shape=Y.shape,
                chunks=(rows, int(Y.shape[1])),
                dtype=Y.dtype,
                compressors=[Crc32cCodec()],
                zarr_format=3,
            )
            # dask chunks equal the zarr chunks (no two tasks write one chunk); the
            # rechunk is the identity unless the row chunks are irregular
            store_array(Y.rechunk({0: rows, 1: -1}), z, client)
            _make_private(tmp)
            if os.path.lexists(final):
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_path(self.path)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        return {
            "kind": "zarr",
            "label": label,
            "shape": [int(x) for x in Y.shape],
            "dtype": np.dtype(Y.dtype).str,
            # read back with the chunks of the pass: the post-processing (TSQR)
            # then sees the same blocks, and gives the same bits
            "chunks": [[int(c) for c in dim] for dim in Y.chunks],
        }

    def load_sketches(self) -> dict[str, Any] | None:
        """The committed exact sketches (numpy or lazy dask arrays), or None.

        A sketch recorded for recomputation is None: the resumed job's pass
        makes it again (:func:`pipeline.algorithms.base.complete_from_pass`).

        Raises
        ------
        StoreLayoutError
            The manifest or a sketch is damaged (a failed checksum included).
        """
        f = os.path.join(self.path, _SKETCHES_FILE)
        if not os.path.exists(f):
            return None
        try:
            with open(f, encoding="utf-8") as fh:
                manifest = dict(json.load(fh)["sketches"])
        except (OSError, ValueError, KeyError, TypeError):
            raise StoreLayoutError(
                f"the sketch manifest of the journal at {self.path!r} is damaged."
            ) from None
        out: dict[str, Any] = {}
        for name, entry in manifest.items():
            value: Any
            if entry.get("kind") == "recompute":
                out[name] = None  # recomputed by the resumed job's pass
                continue
            if entry.get("kind") == "npy":
                value = self.load(str(entry["label"]))
            else:
                where = os.path.join(self.path, f"{entry['label']}.zarr")
                try:
                    z = zarr.open_array(store=where, mode="r")
                except Exception:  # noqa: BLE001 - zarr raises many types for a missing array
                    raise StoreLayoutError(
                        f"sketch {name!r} in the journal at {self.path!r} is missing or "
                        "damaged; the job cannot resume safely."
                    ) from None
                value = da.from_zarr(z, chunks=tuple(tuple(c) for c in entry["chunks"]))
            if (
                value is None
                or list(value.shape) != list(entry["shape"])
                or np.dtype(value.dtype).str != entry["dtype"]
            ):
                raise StoreLayoutError(
                    f"sketch {name!r} in the journal at {self.path!r} is missing or "
                    "does not match its manifest; the job cannot resume safely."
                )
            out[name] = value
        return out

    # -- the ledger charge ------------------------------------------------------
    def mark_charged(self, ledger: str | None) -> None:
        """Record that the ledger ``ledger`` holds this job's charge."""
        write_private(
            os.path.join(self.path, _CHARGED_FILE),
            json.dumps({"release_id": self.release_id, "ledger": ledger}).encode(),
        )

    def charged(self) -> dict[str, Any] | None:
        """The charge marker (``release_id``, ``ledger``), or None if not charged."""
        f = os.path.join(self.path, _CHARGED_FILE)
        if not os.path.exists(f):
            return None
        try:
            with open(f, encoding="utf-8") as fh:
                return dict(json.load(fh))
        except (OSError, ValueError, TypeError):
            raise StoreLayoutError(
                f"the charge marker of the journal at {self.path!r} is damaged."
            ) from None

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
        self.path = local_path(path, "journal", "--journal")
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
