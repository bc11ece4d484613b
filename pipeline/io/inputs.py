"""Opening and validating input matrices."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp
import zarr
from dask.base import tokenize

from pipeline.errors import StoreLayoutError
from pipeline.io import objectstore
from pipeline.io.chunkio import (
    PlainLayout,
    decode_chunk,
    plain_layout,
    thread_buffer,
)
from pipeline.io.chunkio import chunk_bytes as _chunk_bytes  # patched by fault tests
from pipeline.io.csr import CsrReader, is_csr_group, open_csr
from pipeline.io.nodes import open_node

#: Largest full-width row band (bytes) read as one task so that row clipping
#: needs no separate norm pass; beyond it, a norm pre-pass is used instead.
ROW_BAND_LIMIT = 256 * 2**20

#: Cells (rows x columns) of the full-width row band a pass task reads from a
#: CSR store: ``max(1, CSR_BAND_CELLS // n)`` rows (:func:`csr_band_rows`). Fixed
#: by the public shape alone, never by the stored entries (docs/sparse.md): 2^28
#: cells hold 32 MiB of values at 1% density. Large bands: a band's fixed costs
#: (its v x n co-range partial, its tasks in the pass and in the steps over the
#: tall sketches) are paid per band, whatever its entries.
CSR_BAND_CELLS = 2**28


def csr_band_rows(n: int) -> int:
    """Rows of the bands a CSR store of ``n`` columns is read in:
    ``max(1, CSR_BAND_CELLS // n)`` (the shape alone decides them).

    Examples
    --------
    >>> csr_band_rows(2_000), csr_band_rows(100_000)
    (134217, 2684)
    """
    return max(1, CSR_BAND_CELLS // n)


@dataclass(frozen=True, kw_only=True, slots=True)
class InputInfo:
    """What was opened: public metadata only."""

    path: str | None
    shape: tuple[int, int]
    dtype: str
    store_chunks: tuple[int, int] | None
    dask_chunks: tuple[tuple[int, ...], tuple[int, ...]]
    #: For a Zarr input, the checked reader behind the dask array
    #: (``reader.block(rows, cols)`` -> numpy, or scipy CSR for a CSR store), so
    #: that a pass task can read its own block; None for in-memory and dask inputs.
    reader: Any = field(default=None, repr=False, compare=False)
    #: Whether the entries are stored sparse (a CSR store, a scipy.sparse matrix,
    #: a dask array of sparse chunks): the format is public, but the work of a
    #: pass then grows with the stored entries, so its durations are data.
    sparse: bool = False


def _pair(values: tuple[int, ...]) -> tuple[int, int]:
    """The two entries of a checked 2-D shape (or chunk shape) as ints."""
    return int(values[0]), int(values[1])


def _check_array_meta(shape: tuple[int, ...], dtype: Any, what: str) -> None:
    if len(shape) != 2:
        raise StoreLayoutError(
            f"{what} must be a 2-D matrix, got {len(shape)}-D with shape {tuple(shape)}."
        )
    if shape[0] < 1 or shape[1] < 1:
        raise StoreLayoutError(
            f"{what} must have at least one row and one column, got shape {tuple(shape)}."
        )
    dt = np.dtype(dtype)
    if dt.kind not in "iuf":
        raise StoreLayoutError(
            f"{what} must hold real numbers (int or float), got dtype {dt}."
        )


def _open_zarr(path: str) -> zarr.Array[Any] | zarr.Group:
    """The array at ``path``, or the group when it holds a CSR matrix."""
    shown = objectstore.redact(path)
    node = open_node(path, "input store")
    if isinstance(node, zarr.Group) and is_csr_group(node):
        return node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stray entries under a group: see open_node
        names = sorted(node.array_keys()) if isinstance(node, zarr.Group) else []
    if isinstance(node, zarr.Group):
        hint = ""
        if (
            names
        ):  # a URL's key is joined with "/", a path's with the system's separator
            url = objectstore.is_url(path)
            inner = (
                f"{shown.rstrip('/')}/{names[0]}"
                if url
                else os.path.join(path, names[0])
            )
            hint = f"; it holds the arrays {names}, pass e.g. {inner!r}"
        raise StoreLayoutError(f"{shown!r} is a Zarr group, not an array{hint}.")
    return node


class _CheckedReads:
    """A zarr array whose failed chunk reads raise :class:`StoreLayoutError`.

    A truncated or overwritten chunk file makes the codec raise (e.g. a zstd
    ``RuntimeError``), which would end the run with a traceback; this names the
    region of the matrix instead, with the exception type and no byte or value.
    Reading happens on the workers: the wrapper pickles with its zarr array.
    """

    def __init__(self, z: zarr.Array[Any], what: str) -> None:
        self.z, self.what = z, what
        self.shape, self.dtype, self.ndim = tuple(z.shape), z.dtype, 2
        self.layout = plain_layout(z)

    def __getitem__(self, key: Any) -> np.ndarray:
        try:
            return np.asarray(self.z[key])
        except Exception as exc:  # noqa: BLE001 - codecs and stores raise many types
            raise self._error(key, exc) from None

    def _error(self, key: Any, exc: BaseException) -> StoreLayoutError:
        rows, cols = (
            (f"{k.start}:{k.stop}" if isinstance(k, slice) else str(k)) for k in key
        )
        return StoreLayoutError(
            f"{self.what} cannot be read at rows {rows}, columns {cols} "
            f"({type(exc).__name__}): a chunk is truncated or corrupted."
        )

    def block(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """The block ``[rows[0]:rows[1], cols[0]:cols[1]]`` as numpy.

        When the block is one chunk of a plain local store
        (:func:`~pipeline.io.chunkio.plain_layout`), the chunk's bytes are read
        and decoded straight into buffers of this thread
        (:mod:`pipeline.io.chunkio`) -- zarr's general path (codec pipeline,
        fresh arrays, copies) costs about 1.8x as much per chunk. The result
        is then a view of that buffer, **valid until the next call on this
        thread**: a pass task uses it and drops it. Any other block is read
        through zarr.
        """
        return self._block(rows, cols, own=False)

    def owned_block(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """:meth:`block` in an array of its own, never a view of a read buffer:
        a band held in worker memory. A chunk of a plain local store is decoded
        straight into it (no copy of the decoded chunk)."""
        block = self._block(rows, cols, own=True)
        return block if block.flags.c_contiguous else np.ascontiguousarray(block)

    def _block(
        self, rows: tuple[int, int], cols: tuple[int, int], *, own: bool
    ) -> np.ndarray:
        key = (slice(*rows), slice(*cols))
        lay = self.layout
        if lay is None:
            return self[key]  # zarr's fresh array
        (r0, r1), (c0, c1) = rows, cols
        cr, cc = lay.chunks
        i, j = divmod(r0, cr), divmod(c0, cc)
        if (
            i[1]
            or j[1]
            or r1 != min(r0 + cr, self.shape[0])
            or c1 != min(c0 + cc, self.shape[1])
        ):
            return self[key]
        try:
            chunk = self._read_chunk(lay, (i[0], j[0]), own)
        except Exception as exc:  # noqa: BLE001 - as zarr's codecs: many types
            raise self._error(key, exc) from None
        return chunk[: r1 - r0, : c1 - c0]

    @staticmethod
    def _read_chunk(
        lay: PlainLayout, coords: tuple[int, int], own: bool = False
    ) -> np.ndarray:
        nbytes = lay.chunk_nbytes
        raw = _chunk_bytes(lay.store, lay.key(coords))
        if own:
            chunk = np.empty(lay.chunks, dtype=lay.dtype)
            decode_chunk(lay, raw, chunk.reshape(-1).view(np.uint8))
            return chunk
        out = np.frombuffer(
            thread_buffer("chunk", nbytes), dtype=np.uint8, count=nbytes
        )
        decode_chunk(lay, raw, out)
        return out.view(lay.dtype).reshape(lay.chunks)


def _band_chunks(
    shape: tuple[int, int], chunks: tuple[int, int], itemsize: int, unit: str | None
) -> tuple[int, int]:
    """Dask chunks that keep rows (columns) whole when that is cheap.

    Row clipping needs each row's norm; when a full-width band of the store's row
    chunks fits in :data:`ROW_BAND_LIMIT`, one task reads the whole band (one pass);
    otherwise the store's chunks are kept and a norm pre-pass runs.
    """
    rows, cols = chunks
    if (
        unit == "row"
        and chunks[1] < shape[1]
        and rows * shape[1] * itemsize <= ROW_BAND_LIMIT
    ):
        return rows, shape[1]
    if (
        unit == "column"
        and chunks[0] < shape[0]
        and cols * shape[0] * itemsize <= ROW_BAND_LIMIT
    ):
        return shape[0], cols
    return rows, cols


def _open_memory(source: Any) -> tuple[Any, InputInfo] | None:
    """An in-memory (numpy, scipy.sparse) or dask input and its info, else None."""
    if sp.issparse(source):
        x = canonical_csr(source)
        whole = ((int(x.shape[0]),), (int(x.shape[1]),))
        return x, InputInfo(
            path=None,
            shape=_pair(x.shape),
            dtype=str(x.dtype),
            store_chunks=None,
            dask_chunks=whole,
            sparse=True,
        )
    if isinstance(source, np.ndarray):
        _check_array_meta(source.shape, source.dtype, "the input array")
        whole = ((int(source.shape[0]),), (int(source.shape[1]),))
        return source, InputInfo(
            path=None,
            shape=source.shape,
            dtype=str(source.dtype),
            store_chunks=None,
            dask_chunks=whole,
        )
    if isinstance(source, da.Array):
        _check_array_meta(source.shape, source.dtype, "the input dask array")
        if any(np.isnan(c) for dim in source.chunks for c in dim):
            raise StoreLayoutError(
                "the input dask array has unknown chunk sizes; call compute_chunk_sizes() first."
            )
        return source, InputInfo(
            path=None,
            shape=_pair(source.shape),
            dtype=str(source.dtype),
            store_chunks=None,
            dask_chunks=source.chunks,
            sparse=sp.issparse(source._meta),
        )
    return None


def canonical_csr(source: Any) -> sp.csr_matrix:
    """A scipy.sparse matrix or array (any format) as a canonical CSR matrix.

    Duplicates are summed (the value scipy itself gives such a matrix) and the
    indices sorted, on a copy when the input is not canonical already; the input
    is never modified. Refused like a dense input when not 2-D with at least one
    row and column, or not real-numeric.

    Parameters
    ----------
    source : scipy.sparse matrix or array

    Returns
    -------
    scipy.sparse.csr_matrix
    """
    _check_array_meta(source.shape, source.dtype, "the input sparse matrix")
    x = sp.csr_matrix(source)  # a CSR matrix is kept as is (no copy)
    if not x.has_canonical_format:
        x = x.copy()
        x.sum_duplicates()
    return x


def _csr_input(reader: CsrReader, path: str | None) -> tuple[da.Array, InputInfo]:
    """A checked CSR store as a dask array of full-width CSR row bands.

    The bands have :func:`csr_band_rows` rows: the public shape alone decides
    them (docs/sparse.md, "What the wiring must keep").
    """
    m, n = reader.shape
    chunks = (min(m, csr_band_rows(n)), n)
    arr = da.from_array(
        reader,
        chunks=chunks,
        name=f"csr-{tokenize(reader.indptr, reader.indices, reader.data, chunks)}",
        asarray=False,
        fancy=False,
        meta=sp.csr_matrix((0, 0), dtype=reader.dtype),
    )
    return arr, InputInfo(
        path=path,
        shape=(m, n),
        dtype=str(reader.dtype),
        store_chunks=None,
        dask_chunks=arr.chunks,
        reader=reader,
        sparse=True,
    )


def open_input(
    source: Any,
    *,
    unit: str | None = "row",
    band_bytes: int | None = None,
    validate: bool = True,
    check_indices: bool = True,
) -> tuple[da.Array | np.ndarray, InputInfo]:
    """Open ``source`` lazily and validate it from metadata alone (no data read).

    Parameters
    ----------
    source : str, os.PathLike, zarr.Array, zarr.Group, dask.array.Array, numpy.ndarray or scipy.sparse matrix
        A Zarr array path, a CSR group's path (AnnData's layout, or an AnnData
        store whose ``X`` is one; validated by :func:`~pipeline.io.csr.open_csr`),
        an open zarr array or CSR group, a dask array (numpy or scipy.sparse
        chunks) or an in-memory array (a scipy.sparse one becomes canonical CSR,
        :func:`canonical_csr`).
    unit : {"row", "column", "entry"} or None
        Privacy unit; decides whether whole rows (columns) are read per task.
    band_bytes : int or None
        When given, a Zarr input is read in full-width row bands of whole store
        row chunks, about this many bytes each in float64 (at least one store
        chunk): the unit of work of row-wise algorithms such as PCA. A CSR
        store is banded by :func:`csr_band_rows` instead.
    validate : bool
        Run a CSR store's streamed check (:func:`~pipeline.io.csr.open_csr`).
        False only where the shape alone is needed and the job that reads the
        data opens the store again (checked then): the check reads all of
        ``indptr`` and ``indices``, so it runs once per job.
    check_indices : bool
        False: a CSR store's column indices are left to the workers of the
        job's cluster (:func:`~pipeline.io.csr.open_csr`), which check them
        before its first pass; ``indptr`` is checked here.

    Returns
    -------
    array : dask.array.Array of shape (n_rows, n_cols), the numpy array itself, or a CSR matrix
        A CSR store gives full-width CSR row bands of :func:`csr_band_rows`
        rows (the public shape alone decides them).
    info : InputInfo

    Raises
    ------
    StoreLayoutError
        Missing or non-Zarr path, a group that is not a CSR matrix, a malformed
        CSR store (streamed check, before anything is charged), not 2-D, not
        real-numeric.
    """
    memory = _open_memory(source)
    if memory is not None:
        return memory
    path = None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        z = _open_zarr(path)
    elif isinstance(source, (zarr.Array, zarr.Group)):
        z = source  # a group: a CSR matrix, else open_csr refuses it
    else:
        raise StoreLayoutError(
            "the input must be a Zarr path, a zarr array, a dask array, a numpy array "
            f"or a scipy.sparse matrix, got {type(source).__name__}."
        )
    what = (
        f"input store {objectstore.redact(path)!r}" if path else "the input zarr array"
    )
    if isinstance(z, zarr.Group):
        checked = open_csr(
            z,
            validate=validate,
            check_indices=check_indices,
            what=what if path else None,
        )
        return _csr_input(checked, path)
    _check_array_meta(z.shape, z.dtype, what)
    store_chunks = _pair(z.shards or z.chunks)
    if band_bytes is not None:
        rows = store_chunks[0] * max(
            1, band_bytes // (store_chunks[0] * z.shape[1] * 8)
        )
        chunks = (min(rows, int(z.shape[0])), int(z.shape[1]))
    else:
        chunks = _band_chunks(_pair(z.shape), store_chunks, z.dtype.itemsize, unit)
    reader = _CheckedReads(z, what)
    arr = da.from_array(
        reader,
        chunks=chunks,
        name=f"zarr-{tokenize(z, chunks)}",
        asarray=True,
        fancy=False,
        meta=np.empty((0, 0), dtype=z.dtype),
    )
    return arr, InputInfo(
        path=path,
        shape=_pair(z.shape),
        dtype=str(z.dtype),
        store_chunks=store_chunks,
        dask_chunks=arr.chunks,
        reader=reader,
    )
