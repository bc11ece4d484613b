"""CSR matrices stored in a Zarr group (AnnData's on-disk layout), read by row bands.

Problem. A sparse matrix (ratings, documents x terms, cells x genes) of ``m`` rows,
``n`` columns and ``nnz`` non-zeros costs O(nnz) bytes in compressed sparse row
(CSR) form and ``8 m n`` dense. It must be opened, checked and read band by band
without ever being densified or held whole in memory.

Layout [AnnData on-disk format, "Sparse array specification (v0.1.0)"]. A group
with the attributes ``encoding-type: "csr_matrix"``, ``encoding-version:
"0.1.0"`` and ``shape: [m, n]``, holding three one-dimensional arrays:

* ``indptr`` (m + 1,), integer: row ``i`` holds the entries ``indptr[i]:indptr[i+1]``;
* ``indices`` (nnz,), integer: their column indices, strictly increasing within a row;
* ``data`` (nnz,), real: their values.

The ``X`` of an AnnData store (a root group with ``encoding-type: "anndata"``) is
recognised from the root's own attributes and read the same way. Zarr v2 (AnnData's
default) and v3 groups are both read; :func:`write_csr` writes v3.

Validation (:func:`open_csr`), before anything is charged: first the metadata
(attributes, ranks, lengths, dtypes: nothing is read), then one streamed pass over
``indptr`` and ``indices`` in pieces of about :data:`VALIDATE_CHUNK` entries
(O(piece) memory, whatever the size of the store): ``indptr`` starts at 0, never
decreases and ends at ``len(data)``; every index is in ``[0, n)`` and strictly
greater than its predecessor in the row. ``data`` is not read: NaN and Inf follow
the one rule for non-finite input in the kernels (the individual holding one counts
as zero, docs/privacy.md). Every refusal is one line naming the rule and the store;
it shows no value, position or count other than the declared shape (the number of
non-zeros is itself a statistic of the data).

The check of ``indices`` reads every column index, O(nnz). A job on a cluster
defers it (:func:`open_csr` with ``check_indices=False``): the workers check the
bands in parallel before the first pass reads a value
(:meth:`CsrReader.index_problem`, run by the execution layer), with the same
rules and messages, and until then the reader refuses to read a band
(:attr:`CsrReader.indices_checked`): a band whose indices were never checked
never reaches a kernel, whose loops do not check their bounds.

Unsorted or duplicate column indices within a row are refused rather than sorted.
A duplicate ``(i, j)`` is ambiguous (scipy sums duplicates, other readers keep
one), and the privacy unit ``entry`` clips each stored value to ``C``: two stored
values of one cell would make that individual's contribution ``2C``, twice the
calibrated sensitivity. Sorting each band in every pass would cost O(nnz log nnz)
per pass for a case that AnnData and scipy's canonical form never produce; the
fix is one call before writing (``X.sum_duplicates()``, which also sorts).

References
----------
.. [AnnData] anndata.readthedocs.io, "On-disk format" (fileformat-prose), the
   ``csr_matrix`` encoding, v0.1.0.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import BloscCodec

from pipeline.errors import StoreLayoutError
from pipeline.io import objectstore
from pipeline.io.chunkio import plain_layout, read_range
from pipeline.io.nodes import open_node
from pipeline.linalg.compiled import COMPILED_ENTRIES, index_fault

__all__ = [
    "CSR_ENCODING",
    "DEFER_INDICES_FROM",
    "VALIDATE_CHUNK",
    "WRITE_CODEC",
    "CsrReader",
    "is_csr_group",
    "open_csr",
    "write_csr",
]

#: Stored entries from which a job's check of the column indices may be left to
#: its workers (:func:`open_csr`): 2^22, about 35 ms of the check on one
#: thread here, near the cost of the round trip of the workers' tasks (the
#: job's time grew by about 50 ms on a 1000-row store checked by them). A
#: count of the data, used inside the trusted zone only: where the check runs
#: changes no message and no result.
DEFER_INDICES_FROM = 2**22
#: Attributes of a CSR group in AnnData's layout.
CSR_ENCODING = {"encoding-type": "csr_matrix", "encoding-version": "0.1.0"}
#: Entries of ``indptr`` / ``indices`` read at once by the validation pass.
VALIDATE_CHUNK = 2**22
#: Entries per chunk of the arrays written by :func:`write_csr` (2 MiB of
#: float64 values): a row band decodes the chunks it overlaps whole, so chunks
#: much larger than a band's entries would be decoded several times per pass.
WRITE_CHUNK = 2**18
#: The compressor of the arrays :func:`write_csr` writes: Blosc, LZ4 after a
#: byte shuffle (any Zarr v3 reader, AnnData's included, decodes it). Measured
#: on the ten chunks of one band of a 1% store (one thread): the int32 column
#: indices compress 2.6x and decode in 5 ms, against 2.0x and 17 ms with
#: zarr's default zstd; the float64 values of random magnitude compress 1.06x
#: (1.04x) and decode in 11 ms (34 ms). A pass decodes every band it reads, so
#: this is most of the cost of reading one.
WRITE_CODEC = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def _attrs(node: Any) -> dict[str, Any]:
    return dict(node.attrs) if isinstance(node, zarr.Group) else {}


def is_csr_group(node: Any) -> bool:
    """True if ``node`` is a Zarr group that declares the CSR encoding, or an
    AnnData root group whose ``X`` does (decided from attributes alone)."""
    attrs = _attrs(node)
    if attrs.get("encoding-type") == "csr_matrix":
        return True
    if attrs.get("encoding-type") == "anndata" and "X" in node:
        return _attrs(node["X"]).get("encoding-type") == "csr_matrix"
    return False


class CsrReader:
    """A checked CSR group: public metadata, and row bands as scipy CSR matrices.

    Built by :func:`open_csr`, which validates the store first. Pickles with its
    zarr arrays, so a pass task reads its own band on a worker.

    Attributes
    ----------
    shape : tuple of (int, int)
        The declared shape ``(m, n)`` (public).
    dtype : numpy.dtype
        The dtype of ``data``.
    nnz : int
        The number of stored entries. A statistic of the data, not public: for
        planning and cost estimates inside the trusted zone, never for a message,
        a report, a log or the choice of bands.
    layout : None
        Not a plain dense store (a pass reads a band in one call, see
        :meth:`block`).
    indices_checked : bool
        Whether every column index was checked (module docstring); a band is
        read only once they were.
    """

    def __init__(self, group: zarr.Group, what: str) -> None:
        self.what = what
        self.shape = _check_metadata(group, what)
        arrays: dict[str, Any] = {k: group[k] for k in ("indptr", "indices", "data")}
        self.indptr, self.indices, self.data = (
            arrays["indptr"],
            arrays["indices"],
            arrays["data"],
        )
        # plain local arrays are read and decoded directly (chunkio), others by zarr
        self.direct = {name: plain_layout(a) for name, a in arrays.items()}
        self.dtype = np.dtype(self.data.dtype)
        self.nnz = int(self.data.shape[0])
        self.ndim, self.layout = 2, None
        self.indices_checked = False

    def __repr__(self) -> str:
        return f"CsrReader({self.what}, shape={self.shape}, dtype={self.dtype})"

    def _read(self, arr: Any, lo: int, hi: int, name: str) -> np.ndarray:
        """``arr[lo:hi]`` as numpy; a failed chunk read is one line naming the array."""
        lay = self.direct.get(name)
        try:
            if lay is not None:
                return read_range(lay, lo, hi)
            return np.asarray(arr[lo:hi])
        except Exception as exc:  # noqa: BLE001 - codecs and stores raise many types
            raise StoreLayoutError(
                f"{self.what} cannot be read ({name}, {type(exc).__name__}): "
                "a chunk is truncated or corrupted."
            ) from None

    def row_pointers(self, r0: int, r1: int) -> np.ndarray:
        """``indptr[r0:r1 + 1]`` as int64, shape (r1 - r0 + 1,)."""
        return self._read(self.indptr, r0, r1 + 1, "indptr").astype(np.int64)

    def read_indices(self, p0: int, p1: int) -> np.ndarray:
        """``indices[p0:p1]``, in their stored integer dtype."""
        return self._read(self.indices, p0, p1, "indices")

    def band(self, r0: int, r1: int) -> sp.csr_matrix:
        """Rows ``[r0, r1)`` as a CSR matrix of shape (r1 - r0, n), dtype of ``data``.

        Reads ``indptr[r0:r1 + 1]`` and the matching slices of ``indices`` and
        ``data`` only; ``r0`` and ``r1`` may fall anywhere (a band need not start
        or end at a chunk of the arrays). NaN/Inf values are returned as stored.
        """
        if not 0 <= r0 <= r1 <= self.shape[0]:
            raise ValueError(
                f"rows [{r0}, {r1}) are outside the matrix's [0, {self.shape[0]})."
            )
        if not self.indices_checked:
            raise StoreLayoutError(
                f"{self.what} is read before its column indices were checked; "
                "open it with open_csr(check_indices=True) or check them first."
            )
        ptr = self.row_pointers(r0, r1)
        p0, p1 = int(ptr[0]), int(ptr[-1])
        idx = self._read(self.indices, p0, p1, "indices")
        vals = self._read(self.data, p0, p1, "data")
        return sp.csr_matrix((vals, idx, ptr - p0), shape=(r1 - r0, self.shape[1]))

    def __getitem__(self, key: tuple[slice, slice]) -> sp.csr_matrix:
        """``reader[r0:r1, c0:c1]`` (unit steps) as CSR: what a dask array over
        the reader (``dask.array.from_array``) reads for one chunk."""
        rows, cols = key
        r0, r1, _ = rows.indices(self.shape[0])
        c0, c1, _ = cols.indices(self.shape[1])
        return self.block((r0, r1), (c0, c1))

    def block(self, rows: tuple[int, int], cols: tuple[int, int]) -> sp.csr_matrix:
        """Rows ``rows`` and columns ``cols`` (``[start, stop)`` each) as CSR."""
        x = self.band(*rows)
        if cols == (0, self.shape[1]):
            return x
        return sp.csr_matrix(x[:, cols[0] : cols[1]])

    def index_problem(self, r0: int, r1: int) -> str | None:
        """The refusal of the column indices of rows ``[r0, r1)``, or None when
        they are valid (:func:`open_csr`'s rules and one-line message, streamed):
        what a worker runs for its bands when the check is deferred."""
        try:
            _validate_indices(self, r0, r1)
        except StoreLayoutError as exc:
            return str(exc)
        return None

    def bands(self, rows: int) -> Iterator[tuple[int, sp.csr_matrix]]:
        """``(r0, band)`` for consecutive bands of ``rows`` rows (the last shorter)."""
        for r0 in range(0, self.shape[0], rows):
            yield r0, self.band(r0, min(r0 + rows, self.shape[0]))


def _refuse(what: str, rule: str) -> StoreLayoutError:
    return StoreLayoutError(f"{what} is not a valid CSR matrix: {rule}.")


def _check_metadata(group: zarr.Group, what: str) -> tuple[int, int]:
    """The declared shape after every check that needs no data read."""
    attrs = _attrs(group)
    version = attrs.get("encoding-version")
    if version != CSR_ENCODING["encoding-version"]:
        raise _refuse(what, f"encoding-version {version!r} is not supported (0.1.0 is)")
    shape = attrs.get("shape")
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape)
        or min(shape) < 1
    ):
        raise _refuse(
            what, f"the attribute shape must be two positive integers, got {shape!r}"
        )
    names = set(group.array_keys())
    arrays: dict[str, Any] = {}
    for name in ("indptr", "indices", "data"):
        if name not in names:
            raise _refuse(what, f"the array {name!r} is missing")
        arrays[name] = group[name]
        if len(arrays[name].shape) != 1:
            raise _refuse(what, f"{name} must be one-dimensional")
    for name in ("indptr", "indices"):
        if np.dtype(arrays[name].dtype).kind not in "iu":
            raise _refuse(what, f"{name} must hold integers")
    dt = np.dtype(arrays["data"].dtype)
    if dt.kind not in "iuf":
        raise _refuse(what, f"data must hold real numbers (int or float), got {dt}")
    m, n = int(shape[0]), int(shape[1])
    if arrays["indptr"].shape[0] != m + 1:
        raise _refuse(what, f"indptr must have shape[0] + 1 = {m + 1} entries")
    if arrays["indices"].shape[0] != arrays["data"].shape[0]:
        raise _refuse(what, "indices and data must have the same length")
    return m, n


def _step(arr: Any) -> int:
    """About :data:`VALIDATE_CHUNK` entries, a whole number of ``arr``'s chunks."""
    chunk = int(arr.chunks[0]) or 1
    return max(1, VALIDATE_CHUNK // chunk) * chunk


def _validate_indptr(reader: CsrReader) -> None:
    """``indptr`` starts at 0, never decreases and ends at ``len(data)``, streamed."""
    what, m = reader.what, reader.shape[0]
    step = _step(reader.indptr)
    prev = None
    for lo in range(0, m + 1, step):
        ptr = reader.row_pointers(lo, min(lo + step, m + 1) - 1)
        if lo == 0 and ptr[0] != 0:
            raise _refuse(what, "indptr must start at 0")
        if (prev is not None and ptr[0] < prev) or (np.diff(ptr) < 0).any():
            raise _refuse(what, "indptr must never decrease")
        prev = int(ptr[-1])
    if prev != reader.nnz:
        raise _refuse(what, "the last entry of indptr must equal the length of data")


def _validate_indices(
    reader: CsrReader, first: int = 0, stop: int | None = None
) -> None:
    """Every index of rows ``[first, stop)`` (default: all) in ``[0, n)`` and
    strictly increasing within its row, streamed.

    Rows are taken ``step`` at a time (their pointers in memory) and their entries
    ``step`` at a time: a position may hold an index no greater than the previous
    one only where a row starts.
    """
    what, (m, n) = reader.what, reader.shape
    end = m if stop is None else stop
    step = _step(reader.indices)
    rows = _step(reader.indptr)
    for r0 in range(first, end, rows):
        ptr = reader.row_pointers(r0, min(r0 + rows, end))
        prev = 0  # the last index read (the first piece starts at a row start)
        for q0 in range(int(ptr[0]), int(ptr[-1]), step):
            q1 = min(q0 + step, int(ptr[-1]))
            idx = reader.read_indices(q0, q1)
            starts = ptr[(ptr >= q0) & (ptr < q1)] - q0  # where a row starts
            fault = (
                index_fault(idx, starts, prev, n)
                if q1 - q0 >= COMPILED_ENTRIES
                else _index_fault(idx, starts, prev, n)
            )
            if fault == 1:
                raise _refuse(
                    what, f"column indices must be in [0, shape[1]) = [0, {n})"
                )
            if fault == 2:
                raise _refuse(
                    what,
                    "column indices must be sorted and unique within each row "
                    "(call X.sum_duplicates() before writing)",
                )
            prev = int(idx[-1])


def _index_fault(idx: np.ndarray, starts: np.ndarray, prev: int, n: int) -> int:
    """:func:`~pipeline.linalg.compiled.index_fault` in numpy, for pieces
    too small to repay loading the compiled loop: 1 for an index outside
    ``[0, n)``, else 2 for one not greater than its predecessor in its row."""
    if idx.min() < 0 or idx.max() >= n:
        return 1
    ok = np.empty(idx.shape[0], dtype=bool)
    ok[0] = idx[0] > prev
    np.greater(idx[1:], idx[:-1], out=ok[1:])
    ok[starts] = True
    return 0 if ok.all() else 2


def open_csr(
    source: str | os.PathLike[str] | zarr.Group,
    *,
    validate: bool = True,
    check_indices: bool = True,
    what: str | None = None,
) -> CsrReader:
    """Open and check a CSR matrix in AnnData's layout (module docstring).

    Parameters
    ----------
    source : str, os.PathLike or zarr.Group
        A CSR group, or an AnnData store whose ``X`` is one: a local path, an
        ``s3://`` URL (the same opening path as dense inputs,
        :func:`~pipeline.io.nodes.open_node`) or an open group.
    validate : bool
        Stream over ``indptr`` and ``indices`` to check them (module docstring).
        False only for a store already validated unchanged, or where the shape
        alone is needed (its bands are then never read).
    check_indices : bool
        With ``validate``: False defers the check of ``indices`` to the caller
        (the workers of a job's cluster, :meth:`CsrReader.index_problem`) for a
        store of at least :data:`DEFER_INDICES_FROM` entries; a smaller store's,
        and ``indptr``, are checked here either way.
    what : str or None
        How messages name the store (default: its path, or "the input group").

    Returns
    -------
    CsrReader

    Raises
    ------
    StoreLayoutError
        Not a CSR group, or a malformed one: one line, no data value or count.

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> _ = write_csr(os.path.join(d, "m.zarr"), sp.eye(4, 3, format="csr"))
    >>> r = open_csr(os.path.join(d, "m.zarr"))
    >>> r.shape, r.band(1, 3).shape
    ((4, 3), (2, 3))
    """
    if isinstance(source, zarr.Group):
        node: Any = source
        what = what or "the input group"
    else:
        path = os.fspath(source)
        what = what or f"input store {objectstore.redact(path)!r}"
        node = open_node(path, "input store")
    if not is_csr_group(node):
        kind = _attrs(node).get("encoding-type")
        found = "an array" if isinstance(node, zarr.Array) else f"encoding {kind!r}"
        raise StoreLayoutError(
            f"{what} is not a CSR matrix (encoding-type 'csr_matrix' or an AnnData "
            f"store whose X is one); found {found}."
        )
    if _attrs(node).get("encoding-type") == "anndata":
        node, what = node["X"], f"{what} (X)"
    reader = CsrReader(node, what)
    if validate:
        _validate_indptr(reader)
        # a small store's indices are checked here: faster than a round trip
        check_indices = check_indices or reader.nnz < DEFER_INDICES_FROM
        if check_indices:
            _validate_indices(reader)
    reader.indices_checked = not validate or check_indices
    return reader


def write_csr(
    path: str | os.PathLike[str],
    matrix: Any,
    *,
    shape: tuple[int, int] | None = None,
    overwrite: bool = False,
    chunk_nnz: int = WRITE_CHUNK,
    attrs: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Write a CSR matrix in AnnData's layout to a new local Zarr v3 group.

    Parameters
    ----------
    path : str or os.PathLike
        Where; published by one rename of a temporary group beside it.
    matrix : scipy.sparse matrix or array, or iterable of them
        The whole matrix (any scipy sparse format), or its row bands in order
        (each of ``shape[1]`` columns), so a matrix larger than memory is
        written band by band. Written in canonical form: duplicates summed,
        indices sorted.
    shape : tuple of (int, int) or None
        Required with bands (their rows must add up to ``shape[0]``).
    overwrite : bool
        Replace an existing store.
    chunk_nnz : int
        Entries per chunk of ``indices`` and ``data`` (and of ``indptr``).
    attrs : dict or None
        More attributes of the group (JSON-ready), written before it is published.

    Returns
    -------
    tuple of (int, int)
        The shape written.
    """
    path = objectstore.local_path(path, "CSR store")
    if os.path.lexists(path) and not overwrite:
        raise StoreLayoutError(
            f"{path!r} already exists; pass overwrite to replace it."
        )
    if sp.issparse(matrix):
        shape = (int(matrix.shape[0]), int(matrix.shape[1]))
        bands: Iterable[Any] = [matrix]
    elif shape is None:
        raise ValueError("shape is required when the matrix is given as bands.")
    else:
        bands = matrix
    m, n = int(shape[0]), int(shape[1])
    parent, base = os.path.split(path)
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    try:
        _write_bands(tmp, bands, (m, n), chunk_nnz)
        if attrs:
            zarr.open_group(store=tmp, mode="r+").attrs.update(attrs)
        if os.path.lexists(path):
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return m, n


def _flush_pointers(z: Any, pending: list[np.ndarray], done: int, step: int) -> int:
    """Write the whole multiples of ``step`` of the ``pending`` pointers to ``z``
    from entry ``done`` on; keep the rest pending. Returns the new ``done``."""
    if sum(p.size for p in pending) < step:
        return done
    buf = np.concatenate(pending)
    cut = buf.size // step * step
    z[done : done + cut] = buf[:cut]
    pending[:] = [buf[cut:]]
    return done + cut


def _write_bands(
    where: str, bands: Iterable[Any], shape: tuple[int, int], chunk_nnz: int
) -> None:
    m, n = shape
    group = zarr.open_group(store=where, mode="w-", zarr_format=3)
    index_dtype = np.int32 if n < 2**31 else np.int64
    arrays: dict[str, Any] = {}
    rows = nnz = 0
    # the row pointers are written as they come too, a whole chunk at a time:
    # O(band + chunk) memory, not O(m)
    ptr_chunk = min(m + 1, chunk_nnz)
    indptr = group.create_array(
        "indptr", shape=(m + 1,), dtype=np.int64, chunks=(ptr_chunk,),
        compressors=WRITE_CODEC,
    )  # fmt: skip
    pending, done = [np.zeros(1, dtype=np.int64)], 0
    for band in bands:
        x = sp.csr_matrix(band, copy=True)
        if x.shape[1] != n:
            raise ValueError(f"a band has {x.shape[1]} columns, the shape {n}.")
        if rows + x.shape[0] > m:
            raise ValueError(f"the bands hold more than the shape's {m} rows.")
        x.sum_duplicates()  # canonical: sorted, unique indices per row
        if not arrays:
            for name, dt in (("indices", index_dtype), ("data", x.dtype)):
                arrays[name] = group.create_array(
                    name, shape=(0,), dtype=dt, chunks=(chunk_nnz,),
                    compressors=WRITE_CODEC,
                )  # fmt: skip
        k = int(x.nnz)
        for name, values in (("indices", x.indices), ("data", x.data)):
            arrays[name].resize((nnz + k,))
            arrays[name][nnz : nnz + k] = values
        pending.append(x.indptr[1:].astype(np.int64) + nnz)
        rows, nnz = rows + x.shape[0], nnz + k
        done = _flush_pointers(indptr, pending, done, ptr_chunk)
    if rows != m:
        raise ValueError(f"the bands hold {rows} rows, the shape {m}.")
    if not arrays:  # pragma: no cover - m >= 1 means at least one band
        raise ValueError("no band to write.")
    _flush_pointers(indptr, pending, done, 1)
    group.attrs.update({**CSR_ENCODING, "shape": [m, n]})
