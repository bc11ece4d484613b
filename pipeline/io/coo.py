"""COO batches ``(i, j, s)`` converted out of core into a CSR store (AnnData's layout).

Problem. The updates of a stream batch (:mod:`pipeline.io.batches`) are COO
triples: ``s`` added to cell ``(i, j)`` of a matrix of public shape ``(m, n)``,
in any order, a cell possibly repeated. A one-shot release reads a CSR store
(:mod:`pipeline.io.csr`), so the triples of one or more Parquet files must become
``indptr``, ``indices`` and ``data`` sorted by row and column, with repeated
cells summed, without ever holding all the triples (or the matrix) in memory.

Method: a two-pass bucket sort by row bands.

1. *Count.* Read every file in pieces of ``band_entries`` rows, check each piece
   (types, nulls, ranges) and count the triples of each row (``m`` integers).
   Any refusal happens here, before anything is written.
2. *Scatter.* Cut the rows into bands of at most ``band_entries`` triples (a
   row with more is a band of its own), read the files again and append each
   piece's triples to a spill file per band, in input order, beside the output.
3. *Write.* Band by band, in row order: read its spill file, convert it as
   scipy does (``coo_matrix((s, (i, j))).tocsr()``: repeated cells summed, in
   input order within each row) and append it to the store
   (:func:`~pipeline.io.csr.write_csr`, published by one rename).

Memory is O(``band_entries`` + ``m`` + a Parquet row group), whatever the number
of triples; the disk holds one spilled copy of the triples (24 bytes each) until
the store is published. The result does not depend on ``band_entries``: each
row's values are summed in the same order, so the stored bits are those of
scipy's conversion of all the triples at once.

Privacy. The store holds the data; the entity column of a stream batch, if
present, is not read. The CSR store's individuals are then its rows, columns or
entries (the release's unit), so a stream whose entities span several rows is
released as a stream, not converted. Messages name the file, the column and the
rule, never a value, a count or a position; NaN and Inf values are kept as
stored (their individuals count as zero in a release, docs/privacy.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from pipeline._validation import check_int_in_range
from pipeline.errors import StoreLayoutError
from pipeline.io import objectstore
from pipeline.io.batches import BatchError
from pipeline.io.csr import WRITE_CHUNK, write_csr

__all__ = ["BAND_ENTRIES", "COO_COLUMNS", "coo_to_csr"]

#: The columns read from each file; others (``entity``) are ignored.
COO_COLUMNS = ("i", "j", "s")
#: Default triples per row band and per piece read (about 100 MB of triples).
BAND_ENTRIES = 2**22
#: One spilled triple.
_TRIPLE = np.dtype([("i", "<i8"), ("j", "<i8"), ("s", "<f8")])

IntArray = npt.NDArray[np.int64]
Triples = tuple[IntArray, IntArray, npt.NDArray[np.float64]]


def coo_to_csr(
    batches: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    shape: tuple[int, int],
    band_entries: int = BAND_ENTRIES,
    overwrite: bool = False,
    chunk_nnz: int = WRITE_CHUNK,
) -> tuple[int, int]:
    """Convert the COO Parquet files ``batches`` into a CSR store at ``out``.

    Parameters
    ----------
    batches : sequence of str or os.PathLike
        ``.parquet`` files with integer columns ``i`` (in ``[0, m)``), ``j`` (in
        ``[0, n)``) and a real column ``s``; other columns are ignored. Their
        triples are taken in the order given.
    out : str or os.PathLike
        A new local Zarr v3 group (module docstring of :mod:`pipeline.io.csr`),
        written under a temporary name and renamed into place.
    shape : tuple of (int, int)
        The public shape ``(m, n)``; never derived from the data.
    band_entries : int
        Triples per row band and per piece read: the memory bound (module
        docstring).
    overwrite : bool
        Replace an existing ``out``.
    chunk_nnz : int
        Entries per chunk of the store's arrays.

    Returns
    -------
    tuple of (int, int)
        The shape written.

    Raises
    ------
    InvalidParameterError
        A shape or ``band_entries`` below 1 (before any file is opened).
    StoreLayoutError
        ``out`` exists and ``overwrite`` is false, or its directory does not
        exist (before any file is read).
    BatchError
        A file is missing, not Parquet, unreadable, lacks a column, holds the
        wrong type, a null or an index outside the shape, or changed between
        the passes. Nothing is written.
    """
    m = check_int_in_range(shape[0], "rows", 1)
    n = check_int_in_range(shape[1], "cols", 1)
    band_entries = check_int_in_range(band_entries, "band_entries", 1)
    path = objectstore.local_path(out, "CSR store")
    if os.path.lexists(path) and not overwrite:
        raise StoreLayoutError(
            f"{path!r} already exists; pass overwrite to replace it."
        )
    parent, base = os.path.split(path)
    if not os.path.isdir(parent):
        raise StoreLayoutError(
            f"the directory of {path!r} does not exist; create it first."
        )
    files = [_check_file(os.fspath(b)) for b in batches]
    counts = np.zeros(m, dtype=np.int64)
    for where in files:
        for i, _, _ in _pieces(where, (m, n), band_entries):
            counts += np.bincount(i, minlength=m)
    cum = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
    del counts
    bounds = _band_bounds(cum, band_entries)
    spill = tempfile.mkdtemp(prefix=f".{base}.spill-", dir=parent)
    try:
        _scatter(files, (m, n), bounds, band_entries, spill)
        bands = _bands(spill, bounds, cum, n, files)
        return write_csr(
            path, bands, shape=(m, n), overwrite=overwrite, chunk_nnz=chunk_nnz
        )
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _check_file(where: str) -> str:
    if os.path.splitext(where.rstrip("/" + os.sep))[1].lower() != ".parquet":
        raise BatchError(
            f"batch {where!r} is not a .parquet file; dplr converts COO batches "
            "from Parquet files (columns i, j, s)."
        )
    if not os.path.isfile(where):
        what = "is a directory" if os.path.isdir(where) else "does not exist"
        raise BatchError(f"batch {where!r} {what}.")
    return where


def _schema(where: str, pf: pq.ParquetFile) -> None:
    """Refuse a missing, repeated or mistyped column from the footer alone."""
    names = pf.schema_arrow.names
    missing = [c for c in COO_COLUMNS if c not in names]
    if missing:
        raise BatchError(
            f"batch {where!r} lacks the column(s) "
            f"{', '.join(repr(c) for c in missing)}; a COO batch needs the columns "
            f"{', '.join(COO_COLUMNS)}."
        )
    for name in COO_COLUMNS:
        if names.count(name) > 1:
            raise BatchError(
                f"batch {where!r} has more than one column named {name!r}."
            )
        typ = pf.schema_arrow.field(name).type
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        if name in ("i", "j") and not pa.types.is_integer(typ):
            raise BatchError(
                f"batch {where!r}: column {name!r} must hold integers, got {typ} "
                "(floating-point 1.0 is refused)."
            )
        real = pa.types.is_integer(typ) or pa.types.is_floating(typ)
        if name == "s" and not (real or pa.types.is_decimal(typ)):
            raise BatchError(
                f"batch {where!r}: column 's' must hold real numbers, got {typ}."
            )


def _pieces(where: str, shape: tuple[int, int], rows: int) -> Iterator[Triples]:
    """The checked triples of ``where``, ``rows`` at a time (never the whole file)."""
    try:
        # no pre-buffering: it fetches the column chunks of many row groups ahead,
        # so the memory of a read would grow with the file
        pf = pq.ParquetFile(where, pre_buffer=False)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise _unreadable(where, exc) from None
    with pf:
        _schema(where, pf)
        it = pf.iter_batches(batch_size=rows, columns=list(COO_COLUMNS))
        while True:
            try:
                piece = next(it, None)
            except Exception as exc:  # noqa: BLE001 - a corrupt page or codec
                raise _unreadable(where, exc) from None
            if piece is None:
                return
            yield _triples(where, piece, shape)


def _unreadable(where: str, exc: BaseException) -> BatchError:
    # the library's own message is dropped: it can quote the file's contents
    return BatchError(
        f"batch {where!r} is not a readable Parquet file ({type(exc).__name__})."
    )


def _triples(where: str, piece: pa.RecordBatch, shape: tuple[int, int]) -> Triples:
    out: list[np.ndarray] = []
    for name, bound, label in (("i", shape[0], "n_rows"), ("j", shape[1], "n_cols")):
        arr = _column(where, piece, name)
        if arr.size and (arr.min() < 0 or arr.max() >= bound):
            # one message for both sides: which side was crossed is itself data
            raise BatchError(
                f"batch {where!r}: column {name!r} must lie in [0, {label}) = "
                f"[0, {bound}) for the declared shape."
            )
        out.append(arr.astype(np.int64, copy=False))
    # NaN/Inf are kept: a refusal would depend on one individual's value
    s = _column(where, piece, "s").astype(np.float64, copy=False)
    return out[0], out[1], s


def _column(where: str, piece: pa.RecordBatch, name: str) -> np.ndarray:
    col = piece.column(name)
    if col.null_count:
        raise BatchError(
            f"batch {where!r}: column {name!r} contains nulls (missing values); "
            "every triple needs i, j and s."
        )
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_decimal(col.type):
        col = col.cast(pa.float64())
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _band_bounds(cum: IntArray, budget: int) -> IntArray:
    """Row starts of bands of at most ``budget`` triples (a longer row alone), and m.

    Cut from the counts: only the memory of the conversion depends on them, not
    the store it writes (module docstring).
    """
    m = cum.size - 1
    starts = [0]
    while starts[-1] < m:
        r = starts[-1]
        stop = int(np.searchsorted(cum, cum[r] + budget, side="right")) - 1
        starts.append(min(max(stop, r + 1), m))
    return np.asarray(starts, dtype=np.int64)


def _spill_name(spill: str, band: int) -> str:
    return os.path.join(spill, f"{band}.triples")


def _scatter(
    files: list[str],
    shape: tuple[int, int],
    bounds: IntArray,
    rows: int,
    spill: str,
) -> None:
    """Append each piece's triples to its bands' spill files, in input order."""
    for where in files:
        for i, j, s in _pieces(where, shape, rows):
            band = np.searchsorted(bounds, i, side="right") - 1
            order = np.argsort(band, kind="stable")  # input order within a band
            rec = np.empty(i.size, dtype=_TRIPLE)
            rec["i"], rec["j"], rec["s"] = i[order], j[order], s[order]
            band = band[order]
            cuts = np.flatnonzero(np.diff(band)) + 1
            for lo, hi in zip(
                np.concatenate([[0], cuts]),
                np.concatenate([cuts, [i.size]]),
                strict=True,
            ):
                with open(_spill_name(spill, int(band[lo])), "ab") as f:
                    rec[lo:hi].tofile(f)


def _bands(
    spill: str, bounds: IntArray, cum: IntArray, n: int, files: list[str]
) -> Iterator[sp.csr_matrix]:
    """The row bands as canonical CSR, each from its spill file (then removed)."""
    for b in range(bounds.size - 1):
        r0, r1 = int(bounds[b]), int(bounds[b + 1])
        name = _spill_name(spill, b)
        rec: Any = (
            np.fromfile(name, dtype=_TRIPLE)
            if os.path.exists(name)
            else np.empty(0, dtype=_TRIPLE)
        )
        if rec.size != cum[r1] - cum[r0]:
            raise BatchError(
                f"the batches {', '.join(repr(f) for f in files)} changed while "
                "being converted; nothing was written."
            )
        if os.path.exists(name):
            os.remove(name)
        # scipy's own conversion: repeated cells summed in input order per row
        yield sp.coo_matrix(
            (rec["s"], (rec["i"] - r0, rec["j"])), shape=(r1 - r0, n)
        ).tocsr()
