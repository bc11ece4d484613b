"""Atomic publication of releases as Zarr v3 groups."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import dask.array as da
import numpy as np
import zarr

from pipeline._durable import fsync_path, fsync_tree
from pipeline.algorithms.base import Factorization
from pipeline.errors import StoreLayoutError
from pipeline.io import objectstore
from pipeline.io._store import store_array
from pipeline.io.scratch import TMP_INFIX, Publication, remove_dead

#: Rows per chunk of the released U and V.
OUTPUT_ROW_CHUNK = 65536


def check_output_path(
    out: str | os.PathLike[str], *, overwrite: bool, inputs: tuple[str | None, ...] = ()
) -> str:
    """Refuse an unusable destination before anything is read or charged.

    Raises
    ------
    StoreLayoutError
        If ``out`` exists and ``overwrite`` is false, its directory is missing or
        not writable, or it is one of the inputs.
    """
    out = os.fspath(out)
    shown = objectstore.redact(out)
    # compared as recorded: a URL as itself, a path made absolute, user-info redacted
    here = objectstore.redact(objectstore.location(out))
    if any(
        p is not None and objectstore.redact(objectstore.location(p)) == here
        for p in inputs
    ):
        raise StoreLayoutError(
            f"the output {shown!r} is the input store; choose another path."
        )
    if objectstore.is_url(out):
        if objectstore.url_exists(out, what="output") and not overwrite:
            raise StoreLayoutError(
                f"the output {shown!r} already exists; pass --overwrite (overwrite=True) to replace it."
            )
        return out
    parent = os.path.dirname(here)
    if not os.path.isdir(parent):
        raise StoreLayoutError(f"the directory of the output {out!r} does not exist.")
    if not os.access(parent, os.W_OK):
        raise StoreLayoutError(f"the directory of the output {out!r} is not writable.")
    if os.path.lexists(out) and not overwrite:
        raise StoreLayoutError(
            f"the output {out!r} already exists; pass --overwrite (overwrite=True) to replace it."
        )
    return out


def _write_array(group: zarr.Group, name: str, x: Any, client: Any) -> None:
    if isinstance(x, da.Array):
        rows = int(min(max(x.chunks[0]), OUTPUT_ROW_CHUNK))
        x = x.rechunk({0: rows, 1: -1})
        z = group.create_array(
            name, shape=x.shape, dtype="float64", chunks=(rows, x.shape[1])
        )
        # dask chunks equal the zarr chunks, so no two tasks write one chunk (no
        # sharding: sharded writes from unaligned chunks corrupt data silently)
        store_array(x, z, client)
        return
    arr = np.asarray(x, dtype=np.float64)
    chunks = (
        (min(max(arr.shape[0], 1), OUTPUT_ROW_CHUNK), *arr.shape[1:])
        if arr.ndim == 2
        else arr.shape
    )
    z = group.create_array(name, shape=arr.shape, dtype="float64", chunks=chunks)
    z[...] = arr


def write_release(
    out: str | os.PathLike[str],
    result: Factorization,
    *,
    overwrite: bool,
    client: Any = None,
    before_publish: Callable[[], None] | None = None,
) -> str:
    """Write ``U``, ``S``, ``V`` and ``attrs["report"]`` to the Zarr v3 group ``out``.

    Atomic, as :func:`write_group`.
    """
    return write_group(
        out,
        {"U": result.U, "S": result.S, "V": result.V},
        result.report,
        overwrite=overwrite,
        client=client,
        before_publish=before_publish,
    )


def write_group(
    out: str | os.PathLike[str],
    arrays: dict[str, Any],
    report: dict[str, Any],
    *,
    overwrite: bool,
    client: Any = None,
    before_publish: Callable[[], None] | None = None,
) -> str:
    """Write ``arrays`` and ``attrs["report"]`` to the Zarr v3 group ``out``.

    Everything goes to a hidden temporary group beside ``out``, which is renamed
    into place last (atomic on POSIX); a crash leaves at most a hidden directory,
    never a group at ``out`` that looks complete. The writer holds that
    directory's liveness lock (:class:`pipeline.io.scratch.Publication`), so the
    next publication of ``out`` (a rerun) first removes what a killed one left,
    and never a live one's. ``before_publish`` is called when the temporary
    group is complete, just before the rename.
    """
    out = os.fspath(out)
    if objectstore.is_url(out):
        return _write_group_url(out, arrays, report, overwrite, client, before_publish)
    parent, base = os.path.split(objectstore.location(out))
    remove_dead(None, out)  # what a killed publication of out left beside it
    held = Publication.create(parent, f".{base}{TMP_INFIX}")
    tmp = held.path
    try:
        group = zarr.open_group(store=tmp, mode="w-", zarr_format=3)
        for name, x in arrays.items():
            _write_array(group, name, x, client)
        # round-trip through json so a non-serialisable report fails here, not later
        group.attrs["report"] = json.loads(json.dumps(report))
        fsync_tree(tmp)
        if before_publish is not None:
            before_publish()
        if os.path.lexists(out):
            if not overwrite:
                raise StoreLayoutError(
                    f"the output {out!r} appeared while the job ran; nothing was replaced."
                )
            old = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        fsync_path(parent)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        held.release()  # alive until published or removed
    return out


def _write_group_url(
    out: str,
    arrays: dict[str, Any],
    report: dict[str, Any],
    overwrite: bool,
    client: Any,
    before_publish: Callable[[], None] | None,
) -> str:
    """:func:`write_group` to object storage: the arrays first, the report last.

    No rename there: the release is published by the last PUT, the root
    group's metadata with the report; a reader refuses a group without it.
    """
    if objectstore.url_exists(out, what="output"):
        if not overwrite:
            raise StoreLayoutError(
                f"the output {objectstore.redact(out)!r} appeared while the job ran; "
                "nothing was replaced."
            )
        objectstore.remove_url(out)
    store = objectstore.open_store(out, read_only=False, what="output")
    group = zarr.open_group(store=store, mode="w-", zarr_format=3)
    for name, x in arrays.items():
        _write_array(group, name, x, client)
    body = json.loads(json.dumps(report))
    if before_publish is not None:
        before_publish()
    group.attrs["report"] = body
    return out


def _open_release(path: str) -> zarr.Group:
    """The group at ``path`` (a directory or an object-store URL), read-only."""
    if objectstore.is_url(path):
        if not objectstore.url_exists(path, what="release"):
            raise StoreLayoutError(
                f"release {objectstore.redact(path)!r} does not exist."
            )
        store = objectstore.open_store(path, read_only=True, what="release")
        return zarr.open_group(store=store, mode="r")
    if not os.path.isdir(path):
        raise StoreLayoutError(f"release {path!r} does not exist.")
    return zarr.open_group(store=path, mode="r")


def release_exists(path: str | os.PathLike[str]) -> bool:
    """True if a release group (complete or not) exists at ``path``."""
    path = os.fspath(path)
    if objectstore.is_url(path):
        return objectstore.url_exists(path, what="release")
    return os.path.isdir(path)


def _member_array(group: zarr.Group, name: str) -> zarr.Array[Any]:
    """Member ``name`` of a release group, an array by the release layout."""
    # zarr types a member as Array | Group; a release stores arrays under these
    # names (a hand-edited group fails at the indexing below, as before)
    return cast("zarr.Array[Any]", group[name])


def _report_of(group: zarr.Group) -> dict[str, Any]:
    """The report attribute of a release group, as a new dict."""
    # zarr types attributes as JSON; write_group stores the report as an object
    return dict(cast("Mapping[str, Any]", group.attrs["report"]))


def read_group(
    path: str | os.PathLike[str], names: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays ``names`` and the report of a group written by :func:`write_group`."""
    path = os.fspath(path)
    try:
        g = _open_release(path)
        arrays = {n: np.asarray(_member_array(g, n)[...]) for n in names}
        return arrays, _report_of(g)
    except (KeyError, FileNotFoundError) as exc:
        raise StoreLayoutError(
            f"{objectstore.redact(path)!r} is not a dplr release (missing {exc})."
        ) from None


class StoredArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A released array read from its store only when asked.

    ``shape``, ``dtype`` and ``ndim`` come from the metadata; indexing reads the
    selected chunks only; ``np.asarray``, numpy functions and operators read the
    whole array (so ``np.asarray(f.U)``, ``f.U.T @ f.U`` or ``f.U[:, 0]`` work
    as on numpy). Any other ndarray attribute is that of the loaded array.
    """

    __slots__ = ("_z",)

    def __init__(self, z: Any) -> None:
        self._z = z

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._z.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self._z.dtype)
        return dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def zarr(self) -> Any:
        """The underlying zarr array (read-only)."""
        return self._z

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"StoredArray(shape={self.shape}, dtype={self.dtype})"

    def __getitem__(self, key: Any) -> Any:
        return np.asarray(self._z[key])

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = np.asarray(self._z[...])
        return a if dtype is None else a.astype(dtype, copy=False)

    @staticmethod
    def _loaded(x: Any) -> Any:
        if isinstance(x, StoredArray):
            return np.asarray(x)
        if isinstance(x, (list, tuple)):
            return type(x)(StoredArray._loaded(v) for v in x)
        return x

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kw: Any) -> Any:
        inputs = tuple(self._loaded(x) for x in inputs)
        if "out" in kw:
            kw["out"] = self._loaded(kw["out"])
        return getattr(ufunc, method)(*inputs, **kw)

    def __array_function__(
        self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]
    ) -> Any:
        args = self._loaded(args)
        kwargs = {k: self._loaded(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def read_release(path: str | os.PathLike[str], *, load: bool = True) -> Factorization:
    """Read a release written by :func:`write_release`.

    With ``load=False``, ``U`` and ``V`` are :class:`StoredArray` views of the
    store, read only when asked (nothing of size ``n_rows`` enters memory).
    """
    path = os.fspath(path)
    g = _open_release(path)

    def tall(z: Any) -> Any:
        return np.asarray(z[...]) if load else StoredArray(z)

    try:
        return Factorization(
            U=tall(g["U"]),
            S=np.asarray(_member_array(g, "S")[...]),
            V=tall(g["V"]),
            report=_report_of(g),
        )
    except KeyError as exc:
        raise StoreLayoutError(
            f"{objectstore.redact(path)!r} is not a dplr release (missing {exc})."
        ) from None


def open_published(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, StoredArray]]:
    """The report and every array of a release group, nothing of them loaded.

    Any group that :func:`write_group` wrote qualifies: a factorization (``U``,
    ``S``, ``V``), a stream epoch's release (the same) or a PCA
    (``components``, ``eigenvalues``). Each array is a :class:`StoredArray`,
    so its shape and dtype come from the metadata and its values are read only
    when asked.

    Raises
    ------
    StoreLayoutError
        If ``path`` does not exist, or is not a group with a release report (a
        Zarr array, an empty directory, a group of another writer).
    """
    path = os.fspath(path)
    shown = objectstore.redact(path)
    try:
        g = _open_release(path)
        report = _report_of(g)
        arrays = {name: StoredArray(z) for name, z in g.arrays()}
    except (KeyError, TypeError, FileNotFoundError, zarr.errors.BaseZarrError):
        raise StoreLayoutError(
            f"{shown!r} is not a dplr release (a group with a release report, as "
            "dplr factorize, dplr pca and dplr stream release write)."
        ) from None
    return report, dict(sorted(arrays.items()))
