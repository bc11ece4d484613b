"""Reading one batch of turnstile updates from a file.

Problem. In the turnstile model (spec sections 1.1 and 6.4) the private matrix
``A`` of public shape ``(n_rows, n_cols)`` starts at zero and receives batches of
update quadruples ``(entity, i, j, s)``: entity ``e`` adds ``s`` to ``A[i, j]``;
deletions are negative ``s``, and a batch may repeat a cell. The privacy unit is
the entity (spec section 1.3): ingest groups a batch by entity and clips each
entity's net contribution, so every update must carry an entity id. This module
reads one batch, checks all of it, and returns four numpy arrays; it neither
clips nor aggregates.

Formats, chosen by the path's suffix:

* ``.parquet`` -- a Parquet file;
* ``.csv`` -- a CSV file with a header row (comma separated, UTF-8);
* ``.npz`` -- a NumPy archive holding 1-D arrays (no pickled objects);
* ``.zarr`` -- a Zarr group directory holding 1-D arrays.

The columns are named exactly ``entity``, ``i``, ``j`` and ``s``; other columns
are ignored.

Entity ids. An integer column is used as the int64 key directly. A string or
binary column (strings are taken as their UTF-8 bytes) is mapped to int64 keys
in one of two ways:

* through a stream's id table (``entity_ids``, :class:`EntityIds`): each
  distinct id has its own key, its position in the table, and new ids are
  appended in order of first appearance. Distinct ids never share a key, which
  per-entity clipping needs: two entities under one key would share one clip,
  and under add/remove removing one of them could then move the clipped output
  by 2 C instead of C. Streams use this;
* by a keyed BLAKE2b hash with an 8-byte digest (``entity_key``; the digest is
  read as a little-endian signed integer). Two ids can collide, rarely by
  chance and on purpose by anyone who knows the key, so these keys must not be
  used where distinct entities need distinct keys.

One entity under two keys would get two budgets. Hence a stream keeps one
entity kind (the string ``"17"`` and the integer 17 get different keys), and
its id table only grows. CSV carries no types: an entity column is read as
integers when every value is an integer literal, and as strings otherwise, so a
CSV stream with string ids should use ids that do not all look like integers,
and ingest must compare :attr:`UpdateBatch.entity_kind` with the kind its
stream started with.

Errors. Every problem raises :class:`BatchError` naming the file, the column and
the constraint; messages never contain data values, counts of offending rows or
their positions (style guide B.6).

References: spec ``sketch-lrf.md`` sections 1.1 (data model), 1.3 (privacy unit,
per-entity clipping), 6.4 (vectorised COO batches).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import zarr

from pipeline._validation import check_int_in_range
from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.io.entity_ids import EntityIds
from pipeline.io.objectstore import local_path

__all__ = [
    "COLUMNS",
    "SUFFIXES",
    "BatchError",
    "EntityIds",
    "UpdateBatch",
    "entity_indices",
    "entity_keys",
    "read_batch",
    "write_batch",
]

#: The column names of a batch, in their canonical order.
COLUMNS = ("entity", "i", "j", "s")
#: The file formats :func:`read_batch` understands, by suffix.
SUFFIXES = (".parquet", ".csv", ".npz", ".zarr")

_FORMAT_NAMES = {
    ".parquet": "Parquet file",
    ".csv": "CSV file",
    ".npz": "NPZ archive",
    ".zarr": "Zarr group",
}
_INT64_MAX = np.iinfo(np.int64).max
_FINGERPRINT_TAG = b"dplr-update-batch-v1\0"
# A missing CSV field is a null; every other text, "NA" and "null" included, is a
# value (an entity may be called "NA"; "nan" in s is NaN, zeroed at ingest).
_CSV_CONVERT = pcsv.ConvertOptions(
    column_types=dict.fromkeys(COLUMNS, pa.string()),
    include_columns=list(COLUMNS),
    null_values=[""],
    strings_can_be_null=True,
    quoted_strings_can_be_null=False,
)

Column: TypeAlias = np.ndarray | pa.Array | pa.ChunkedArray
IntArray = npt.NDArray[np.int64]


class BatchError(StoreLayoutError):
    """A batch file is missing, unreadable, or holds an invalid update.

    The message names the file, the column and the constraint, never a data
    value, a count of offending rows or their positions (exit code 2).
    """


class _Problem(Exception):
    """A column breaks a constraint; the caller adds where it was found."""

    def __init__(self, column: str, text: str) -> None:
        super().__init__(text)
        self.column = column
        self.text = text


@dataclass(frozen=True, kw_only=True, slots=True)
class UpdateBatch:
    """One validated batch of turnstile updates ``A[i, j] += s`` by ``entity``.

    Parameters
    ----------
    entity : ndarray of int64, shape (n,)
        Entity keys (the privacy unit): the ids themselves for integer ids; for
        string ids their positions in a stream's id table (see
        :func:`entity_indices`) or keyed hashes (see :func:`entity_keys`).
    i : ndarray of int64, shape (n,)
        Row indices in ``[0, n_rows)``.
    j : ndarray of int64, shape (n,)
        Column indices in ``[0, n_cols)``.
    s : ndarray of float64, shape (n,)
        Update values; negative values are deletions. NaN and +-Inf are kept
        here: at ingest they zero their entity's updates of the batch
        (:func:`pipeline.mechanisms.entities.zero_non_finite_entities`).
    entity_kind : {"int", "str"}
        What the file's entity column held.
    id_table : EntityIds or None
        When the batch was read with an id table: that table with this batch's
        new string ids appended (the table itself for integer ids). None when
        no table was given. Not part of the batch's content (equality and
        :meth:`fingerprint` ignore it).

    Notes
    -----
    Batches returned by :func:`read_batch` hold read-only arrays. Equality and
    hashing use :meth:`fingerprint`. The ``repr`` shows no data.

    Examples
    --------
    >>> b = UpdateBatch(entity=np.array([7, 7]), i=np.array([0, 2]),
    ...                 j=np.array([1, 1]), s=np.array([0.5, -0.5]),
    ...                 entity_kind="int")
    >>> len(b), b.i.shape, len(b.fingerprint())
    (2, (2,), 64)
    """

    entity: IntArray
    i: IntArray
    j: IntArray
    s: npt.NDArray[np.float64]
    entity_kind: Literal["int", "str"]
    id_table: EntityIds | None = None

    def __post_init__(self) -> None:
        if self.entity_kind not in ("int", "str"):
            raise InvalidParameterError(
                f"entity_kind must be 'int' or 'str', got "
                f"entity_kind={self.entity_kind!r}."
            )
        if self.id_table is not None and not isinstance(self.id_table, EntityIds):
            raise InvalidParameterError(
                f"id_table must be an EntityIds or None, got "
                f"{type(self.id_table).__name__}."
            )
        for name, dtype in (
            ("entity", "int64"),
            ("i", "int64"),
            ("j", "int64"),
            ("s", "float64"),
        ):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != dtype:
                got = (
                    f"{arr.ndim}-D {arr.dtype} array"
                    if isinstance(arr, np.ndarray)
                    else type(arr).__name__
                )
                raise InvalidParameterError(
                    f"{name} must be a 1-D {dtype} numpy array, got a {got}."
                )
        if not len(self.entity) == len(self.i) == len(self.j) == len(self.s):
            raise InvalidParameterError(
                "entity, i, j and s must have equal lengths; they differ."
            )

    def __len__(self) -> int:
        return len(self.s)

    def __repr__(self) -> str:
        return f"UpdateBatch(entity_kind={self.entity_kind!r}, <arrays not shown>)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UpdateBatch):
            return NotImplemented
        return self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def fingerprint(self) -> str:
        """SHA-256 of the batch's canonical content, as 64 hex digits.

        The content is ``entity_kind`` and the bytes of ``entity``, ``i``, ``j``
        (little-endian int64) and ``s`` (little-endian float64), in that order,
        so the same updates read from any file format give the same fingerprint.
        String entities enter through their keys, so the fingerprint depends on
        ``entity_key``, or on the id table the batch was read with. Within one
        stream the latter identifies content: an id keeps its position for
        good, and ids new to the table get positions no earlier batch used.

        Returns
        -------
        str
            64 lowercase hex digits.

        Notes
        -----
        Privacy. The fingerprint is a deterministic function of private data:
        use it to recognise a batch that was already applied (spec section 6.4),
        keep it with the stream state, and do not publish it (a guessable batch
        could be confirmed against it).
        """
        h = hashlib.sha256(_FINGERPRINT_TAG)
        h.update(self.entity_kind.encode("ascii") + b"\0")
        h.update(len(self).to_bytes(8, "little"))
        for arr, dtype in (
            (self.entity, "<i8"),
            (self.i, "<i8"),
            (self.j, "<i8"),
            (self.s, "<f8"),
        ):
            h.update(np.ascontiguousarray(arr, dtype=dtype).data)
        return h.hexdigest()


# -- public functions ----------------------------------------------------------


def read_batch(
    path: str | os.PathLike[str],
    *,
    shape: tuple[int, int],
    entity_key: bytes | None = None,
    entity_ids: EntityIds | None = None,
) -> UpdateBatch:
    """Read and fully validate one batch of turnstile updates.

    Parameters
    ----------
    path : str or path-like
        A ``.parquet``, ``.csv`` (header row required) or ``.npz`` file, or a
        ``.zarr`` group directory, with columns ``entity``, ``i``, ``j``, ``s``.
    shape : tuple of int
        The public shape ``(n_rows, n_cols)`` of the matrix being updated; it
        must not be derived from the data (spec section 1.1).
    entity_key : bytes or None
        Key (1 to 64 bytes) of the BLAKE2b hash that maps string entity ids to
        keys; ``None`` hashes without a key. Ignored for integer ids. Hashed
        keys can collide; streams pass ``entity_ids`` instead.
    entity_ids : EntityIds or None
        A stream's id table: string ids map to their positions in it, new ids
        to positions after it (see :func:`entity_indices`); the extended table
        is returned as ``id_table``. Excludes ``entity_key``.

    Returns
    -------
    UpdateBatch
        ``entity``, ``i``, ``j`` (int64) and ``s`` (float64), each of shape
        ``(n,)`` and read-only; ``n = 0`` for an empty batch.

    Raises
    ------
    InvalidParameterError
        If ``shape``, ``entity_key`` or ``entity_ids`` is invalid, or both of
        the last two are given (checked before reading).
    BatchError
        If the file is missing, has an unknown suffix or cannot be read; a column
        is missing, duplicated, of another length, not 1-D, or of the wrong type;
        ``i`` or ``j`` lies outside ``[0, n_rows)`` or ``[0, n_cols)``; any
        column holds nulls; or integer entity ids exceed int64.

    Notes
    -----
    Privacy. This reads raw private updates and does not clip them: per-entity
    clipping of the net contribution happens at ingest (spec section 1.3,
    rules 2-3). Error messages name the file, the column and the constraint,
    with the public shape for index ranges, and never a value, a count of
    offending rows or a position. Each distinct string id is hashed, or
    looked up in the table, once.

    Cost: one read of the four columns and a few vectorised passes over them;
    nothing in the file is modified.

    Examples
    --------
    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "batch.npz")
    ...     write_batch(path, {"entity": ["ann", "bo"], "i": [0, 3],
    ...                        "j": [1, 1], "s": [0.5, -0.5]})
    ...     batch = read_batch(path, shape=(4, 2), entity_key=b"secret")
    >>> len(batch), batch.entity_kind, batch.entity.dtype, batch.s.shape
    (2, 'str', dtype('int64'), (2,))
    """
    n_rows, n_cols = _check_shape(shape)
    keyer = _keyer(entity_key, entity_ids)
    where = os.fspath(path)
    suffix = _suffix(where)
    columns = _READERS[suffix](where)
    try:
        entity, kind = _entity_keys(columns["entity"], keyer)
        i = _index_column(columns["i"], "i", n_rows, "n_rows")
        j = _index_column(columns["j"], "j", n_cols, "n_cols")
        s = _value_column(columns["s"])
    except _Problem as p:
        raise BatchError(f"batch {where!r}: column {p.column!r} {p.text}.") from None
    for arr in (entity, i, j, s):
        arr.flags.writeable = False
    table = keyer.table if isinstance(keyer, _TableKeyer) else None
    return UpdateBatch(entity=entity, i=i, j=j, s=s, entity_kind=kind, id_table=table)


def entity_keys(
    values: Any, *, key: bytes | None
) -> tuple[IntArray, Literal["int", "str"]]:
    """Map a column of entity ids to int64 keys.

    Parameters
    ----------
    values : array-like of shape (n,)
        Integer ids (any integer dtype; unsigned ids must be at most 2**63 - 1),
        or string or binary ids: a numpy array, a pyarrow array, or a list.
    key : bytes or None
        Key (1 to 64 bytes) of the BLAKE2b hash for string ids; ``None`` hashes
        without a key. Ignored for integer ids.

    Returns
    -------
    keys : ndarray of int64, shape (n,)
        The ids themselves for integer ids; for string ids the 8-byte BLAKE2b
        digest (keyed with ``key``) of each value's UTF-8 bytes, read as a
        little-endian signed integer.
    kind : {"int", "str"}
        Which of the two mappings was used.

    Raises
    ------
    InvalidParameterError
        If ``key`` is invalid, or the values are null, not 1-D, neither integers
        nor strings, or unsigned ids above 2**63 - 1 (no value is quoted).

    Notes
    -----
    Privacy. Two ids whose hashes collide share one key. Where keys stand for
    privacy units that is not safe: two entities under one key share one
    clip, and under add/remove removing one of them can move the clipped sum by
    twice the clip norm. Anyone who knows
    ``key`` can construct such a pair. Streams therefore map string ids through
    an id table (:func:`entity_indices`), never through this hash. Each
    distinct string is hashed once.

    Examples
    --------
    >>> keys, kind = entity_keys(np.array(["ann", "bo", "ann"]), key=b"k")
    >>> keys.shape, keys.dtype, kind, bool(keys[0] == keys[2])
    ((3,), dtype('int64'), 'str', True)
    >>> entity_keys(np.array([5, 9], dtype=np.uint8), key=None)[0].tolist()
    [5, 9]
    """
    return _keys_of(values, _keyer(key, None))


def _keys_of(values: Any, keyer: Any) -> tuple[IntArray, Literal["int", "str"]]:
    """A column of entity ids through ``keyer``, with the one-line refusal of bad ids."""
    if not isinstance(values, np.ndarray | pa.Array | pa.ChunkedArray):
        values = np.asarray(values)
    try:
        return _entity_keys(values, keyer)
    except _Problem as p:
        raise InvalidParameterError(f"entity values {p.text}.") from None


def entity_indices(
    values: Any, *, ids: EntityIds
) -> tuple[IntArray, Literal["int", "str"], EntityIds]:
    """Map a column of entity ids to int64 keys through an id table.

    Parameters
    ----------
    values : array-like of shape (n,)
        Integer ids, or string or binary ids (as for :func:`entity_keys`).
    ids : EntityIds
        The table of string ids seen so far (not modified).

    Returns
    -------
    keys : ndarray of int64, shape (n,)
        The ids themselves for integer ids; for string ids the position of each
        value's bytes in the table, ids not in it being appended in the order
        of the first row that holds each.
    kind : {"int", "str"}
    table : EntityIds
        ``ids`` with the new string ids appended (``ids`` for integer ids).

    Raises
    ------
    InvalidParameterError
        As :func:`entity_keys`, or if ``ids`` is not an :class:`EntityIds`.

    Notes
    -----
    Privacy. Distinct string ids get distinct keys, and an id keeps its key as
    long as the table is kept, so each entity has exactly one clipping budget.

    Examples
    --------
    >>> keys, kind, table = entity_indices(["bo", "ann", "bo"], ids=EntityIds.empty())
    >>> keys.tolist(), kind, len(table)
    ([0, 1, 0], 'str', 2)
    >>> entity_indices(["cy", "ann"], ids=table)[0].tolist()
    [2, 1]
    """
    keyer = _keyer(None, ids)
    keys, kind = _keys_of(values, keyer)
    assert isinstance(keyer, _TableKeyer)
    return keys, kind, keyer.table


def write_batch(
    path: str | os.PathLike[str],
    batch: UpdateBatch | Mapping[str, Any],
    *,
    overwrite: bool = False,
) -> None:
    """Write a batch as ``.parquet``, ``.csv``, ``.npz`` or a ``.zarr`` group.

    Parameters
    ----------
    path : str or path-like
        Destination; its suffix chooses the format (see :data:`SUFFIXES`).
    batch : UpdateBatch or mapping of str to array-like
        An ``UpdateBatch`` with integer entities, or columns by name (each of
        shape (n,)). A mapping is written as given, without validation, and may
        hold string entities, extra columns, or deliberately invalid data (tests
        use this); :func:`read_batch` is where batches are checked.
    overwrite : bool
        Replace an existing file or group; otherwise an existing path is an
        error.

    Raises
    ------
    InvalidParameterError
        If the suffix is unknown, the path exists and ``overwrite`` is false,
        ``batch`` is an ``UpdateBatch`` of string entities (their strings are not
        kept, only the keys), or the columns cannot be laid out in the format
        (e.g. unequal lengths in a Parquet or CSV table).

    Notes
    -----
    The data is written under a temporary name in the destination's directory
    and renamed into place, so a reader never sees a half-written batch. NPZ is
    written uncompressed, for read speed. CSV keeps no types: string ids that
    all look like integers are read back as integer ids.
    """
    where = os.fspath(path)
    suffix = os.path.splitext(where.rstrip("/" + os.sep))[1].lower()
    if suffix not in SUFFIXES:
        raise InvalidParameterError(
            f"path must end in one of {', '.join(SUFFIXES)}, got path={where!r}."
        )
    columns = _batch_columns(batch)
    if os.path.lexists(where) and not overwrite:
        raise InvalidParameterError(
            f"{where!r} exists; pass overwrite=True to replace it."
        )
    head, tail = os.path.split(local_path(where, "batch file"))
    tmp = os.path.join(head, f".{tail}.{uuid.uuid4().hex}.tmp")
    try:
        _WRITERS[suffix](tmp, columns)
        if os.path.isdir(where) and not os.path.islink(where):
            shutil.rmtree(where)
        os.replace(tmp, where)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)


def generate_batch(
    path: str | os.PathLike[str],
    shape: tuple[int, int],
    n_updates: int,
    *,
    seed: int = 0,
    overwrite: bool = False,
) -> None:
    """Write a synthetic batch of ``n_updates`` random updates (``dplr generate
    --kind stream-batch``).

    Cells are uniform over ``shape``, values standard normal, and each entity is
    its row (``entity = i``), which suits a stream of unit ``row`` or
    ``general``. Test data from a seeded generator, not private data.

    Raises
    ------
    InvalidParameterError
        As :func:`write_batch`; or ``n_updates`` < 1.
    """
    rows, cols = _check_shape(shape)
    if isinstance(n_updates, bool) or not isinstance(n_updates, int) or n_updates < 1:
        raise InvalidParameterError(
            f"n_updates must be an integer >= 1, got n_updates={n_updates!r}."
        )
    rng = np.random.default_rng(seed)
    i = rng.integers(0, rows, n_updates)
    columns = {
        "entity": i,
        "i": i,
        "j": rng.integers(0, cols, n_updates),
        "s": rng.standard_normal(n_updates),
    }
    write_batch(path, columns, overwrite=overwrite)


# -- argument checks -------------------------------------------------------------


def _check_shape(shape: Any) -> tuple[int, int]:
    if not isinstance(shape, tuple | list) or len(shape) != 2:
        raise InvalidParameterError(
            f"shape must be a pair (n_rows, n_cols), got shape={shape!r}."
        )
    return (
        check_int_in_range(shape[0], "n_rows", 1),
        check_int_in_range(shape[1], "n_cols", 1),
    )


def _keyer(key: Any, ids: Any) -> _Keyer:
    """How string ids become keys: by the hash, or through the id table."""
    if ids is None:
        return _HashKeyer(_check_entity_key(key))
    if key is not None:
        raise InvalidParameterError(
            "entity_key and entity_ids exclude each other; pass one of them."
        )
    if not isinstance(ids, EntityIds):
        raise InvalidParameterError(
            f"entity_ids must be an EntityIds or None, got {type(ids).__name__}."
        )
    return _TableKeyer(ids)


def _check_entity_key(key: Any) -> bytes:
    if key is None:
        return b""  # BLAKE2b with an empty key is the unkeyed hash
    if not isinstance(key, bytes | bytearray):
        raise InvalidParameterError(
            f"entity_key must be bytes or None, got {type(key).__name__}."
        )
    if not 1 <= len(key) <= hashlib.blake2b.MAX_KEY_SIZE:
        raise InvalidParameterError(
            f"entity_key must hold 1 to {hashlib.blake2b.MAX_KEY_SIZE} bytes, "
            f"got {len(key)} bytes."
        )
    return bytes(key)


def _suffix(where: str) -> str:
    suffix = os.path.splitext(where.rstrip("/" + os.sep))[1].lower()
    if suffix not in SUFFIXES:
        raise BatchError(
            f"batch {where!r} has an unknown suffix {suffix or '(none)'!r}; "
            f"use one of {', '.join(SUFFIXES)}."
        )
    if not os.path.exists(where):
        raise BatchError(f"batch {where!r} does not exist.")
    is_dir = os.path.isdir(where)
    if suffix == ".zarr" and not is_dir:
        raise BatchError(f"batch {where!r} must be a Zarr group directory.")
    if suffix != ".zarr" and is_dir:
        raise BatchError(
            f"batch {where!r} is a directory, not a {_FORMAT_NAMES[suffix]}."
        )
    return suffix


# -- readers: one per format, each returns the four raw columns ---------------------


def _unreadable(where: str, suffix: str, exc: BaseException) -> BatchError:
    # The library's own message is dropped: it can quote the file's contents
    # (pyarrow's CSV errors print the offending row).
    return BatchError(
        f"batch {where!r} is not a readable {_FORMAT_NAMES[suffix]} "
        f"({type(exc).__name__})."
    )


def _check_names(where: str, names: list[str], suffix: str) -> None:
    """Refuse missing or repeated required columns, naming only required names."""
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        hint = "; CSV files need a header row" if suffix == ".csv" else ""
        raise BatchError(
            f"batch {where!r} lacks the column(s) "
            f"{', '.join(repr(c) for c in missing)}; the required columns are "
            f"{', '.join(COLUMNS)}{hint}."
        )
    repeated = [c for c in COLUMNS if names.count(c) > 1]
    if repeated:
        raise BatchError(
            f"batch {where!r} has more than one column named "
            f"{', '.join(repr(c) for c in repeated)}; each of "
            f"{', '.join(COLUMNS)} must appear once."
        )


def _check_lengths(where: str, lengths: dict[str, int]) -> None:
    for name in COLUMNS[1:]:
        if lengths[name] != lengths["entity"]:
            raise BatchError(
                f"batch {where!r}: column {name!r} has a different length from "
                "column 'entity'; all four columns must have equal lengths."
            )


def _read_parquet(where: str) -> dict[str, Column]:
    try:
        with pq.ParquetFile(where, memory_map=True) as pf:
            schema = pf.schema_arrow
            _check_names(where, schema.names, ".parquet")
        # String ids are read dictionary-encoded: a file that stores them so (the
        # usual case) is then never expanded to one string per row.
        text = _is_text(schema.field("entity").type)
        with pq.ParquetFile(
            where, memory_map=True, read_dictionary=["entity"] if text else None
        ) as pf:
            table = pf.read(columns=list(COLUMNS), use_threads=True)
    except (BatchError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise _unreadable(where, ".parquet", exc) from None
    return {c: table.column(c) for c in COLUMNS}


def _csv_header(where: str) -> list[str]:
    with open(where, encoding="utf-8-sig", newline="") as f:
        return next(csv.reader(f), [])


def _read_csv(where: str) -> dict[str, Column]:
    try:
        _check_names(where, _csv_header(where), ".csv")
        table = pcsv.read_csv(where, convert_options=_CSV_CONVERT)
    except (BatchError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - csv/pyarrow raise many types
        raise _unreadable(where, ".csv", exc) from None
    try:
        return _parse_csv_columns(table)
    except _Problem as p:
        raise BatchError(f"batch {where!r}: column {p.column!r} {p.text}.") from None


def _parse_csv_columns(table: pa.Table) -> dict[str, Column]:
    """Type the CSV's text columns: i, j integers, s real numbers, entity either."""
    cols = {c: pc.utf8_trim_whitespace(table.column(c)) for c in COLUMNS}
    for name in COLUMNS:
        if cols[name].null_count:
            raise _Problem(name, _NULLS)
    out: dict[str, Column] = {}
    for name, typ, what in (
        ("i", pa.int64(), _INTEGERS),
        ("j", pa.int64(), _INTEGERS),
        ("s", pa.float64(), "must hold real numbers"),
    ):
        try:
            out[name] = pc.cast(cols[name], typ)
        except pa.ArrowInvalid:
            raise _Problem(name, what) from None
    try:
        out["entity"] = pc.cast(cols["entity"], pa.int64())
    except pa.ArrowInvalid:
        out["entity"] = cols["entity"]  # not all integer literals: string ids
        try:
            pc.cast(cols["entity"], pa.uint64())
        except pa.ArrowInvalid:
            pass
        else:
            raise _Problem("entity", _TOO_LARGE) from None
    return out


def _read_npz(where: str) -> dict[str, Column]:
    out: dict[str, Column] = {}
    try:
        loaded = np.load(where, allow_pickle=False)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - zip and format errors vary
        raise _unreadable(where, ".npz", exc) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise BatchError(
            f"batch {where!r} holds a single array, not an NPZ archive of the "
            f"columns {', '.join(COLUMNS)} (write it with numpy.savez)."
        )
    with loaded:
        _check_names(where, list(loaded.files), ".npz")
        for name in COLUMNS:
            try:
                out[name] = loaded[name]
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - corrupt member or object array
                raise BatchError(
                    f"batch {where!r}: column {name!r} cannot be read "
                    f"({type(exc).__name__}); it must be a plain numeric or string "
                    "array (object arrays need pickle and are refused)."
                ) from None
    _check_ndim(where, out)
    _check_lengths(where, {c: len(out[c]) for c in COLUMNS})
    return out


def _read_zarr(where: str) -> dict[str, Column]:
    try:
        group = zarr.open_group(where, mode="r")
        members = dict(group.members())
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - zarr raises many types for a non-group
        raise _unreadable(where, ".zarr", exc) from None
    _check_names(where, list(members), ".zarr")
    arrays: dict[str, zarr.Array[Any]] = {}
    for name in COLUMNS:
        member = members[name]
        if not isinstance(member, zarr.Array):
            raise BatchError(
                f"batch {where!r}: {name!r} must be a 1-D array, found a group."
            )
        arrays[name] = member
    _check_ndim(where, arrays)
    _check_lengths(where, {c: arrays[c].shape[0] for c in COLUMNS})
    out: dict[str, Column] = {}
    for name, arr in arrays.items():
        try:
            out[name] = arr[...]
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - codec and storage errors vary
            raise BatchError(
                f"batch {where!r}: column {name!r} cannot be read "
                f"({type(exc).__name__})."
            ) from None
    return out


def _check_ndim(where: str, arrays: Mapping[str, Any]) -> None:
    for name in COLUMNS:
        if arrays[name].ndim != 1:
            raise BatchError(
                f"batch {where!r}: column {name!r} must be 1-D, got a "
                f"{arrays[name].ndim}-D array."
            )


_READERS: dict[str, Callable[[str], dict[str, Column]]] = {
    ".parquet": _read_parquet,
    ".csv": _read_csv,
    ".npz": _read_npz,
    ".zarr": _read_zarr,
}


# -- column checks (format independent) ------------------------------------------

_NULLS = "contains nulls (missing values); every update needs all four fields"
_INTEGERS = "must hold integers (floating-point values such as 1.0 are refused)"
_TOO_LARGE = "must hold ids that fit in int64; unsigned ids above 2**63 - 1 are refused"


def _arrow_numeric(col: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A numeric arrow column as numpy; other types are refused by name."""
    if col.null_count:
        raise _Problem(name, _NULLS)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    typ = col.type
    if name == "s" and pa.types.is_decimal(typ):
        col = pc.cast(col, pa.float64())
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        what = "integers" if name in ("i", "j") else "real numbers"
        raise _Problem(name, f"must hold {what}, got {typ}")
    return _numeric_numpy(col)


def _numeric_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An integer or floating arrow column without nulls as numpy, from its buffers.

    What ``to_numpy(zero_copy_only=False)`` returns (a view of a single chunk, a
    copy of several), without its first call's import of pandas (0.2 s on every
    ``dplr stream ingest``).
    """
    typ = col.type
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)) or col.null_count:
        return np.asarray(col.to_numpy(zero_copy_only=False))
    dtype = np.dtype(typ.to_pandas_dtype())
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [
        np.frombuffer(
            c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * dtype.itemsize
        )
        if len(c)
        else np.zeros(0, dtype=dtype)
        for c in chunks
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _index_column(col: Column, name: str, bound: int, bound_name: str) -> IntArray:
    arr = col if isinstance(col, np.ndarray) else _arrow_numeric(col, name)
    if arr.dtype.kind not in "iu":
        raise _Problem(
            name,
            f"must hold integers, got {arr.dtype}; write indices "
            "with an integer type (floating-point 1.0 is refused)",
        )
    if arr.size and (arr.min() < 0 or arr.max() >= bound):
        # one message for both sides: which side was crossed is itself data
        raise _Problem(
            name,
            f"must lie in [0, {bound_name}) = [0, {bound}) for the declared shape",
        )
    return arr.astype(np.int64, copy=False)


def _value_column(col: Column) -> npt.NDArray[np.float64]:
    arr = col if isinstance(col, np.ndarray) else _arrow_numeric(col, "s")
    if arr.dtype.kind not in "iuf":
        raise _Problem("s", f"must hold real numbers, got {arr.dtype}")
    # NaN/Inf are not refused (a refusal would depend on one entity's data):
    # ingest zeroes that entity's updates of the batch
    return arr.astype(np.float64, copy=False)


class _HashKeyer:
    """String ids to keys by the keyed BLAKE2b-64 hash (keys may collide)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def __call__(self, distinct: pa.Array, indices: np.ndarray) -> IntArray:
        digests = _digests(distinct.cast(pa.large_binary()).to_pylist(), self.key)
        keys: IntArray = digests[indices]
        return keys


class _TableKeyer:
    """String ids to their positions in an id table; keeps the extended table."""

    def __init__(self, table: EntityIds) -> None:
        self.table = table

    def __call__(self, distinct: pa.Array, indices: np.ndarray) -> IntArray:
        keys, self.table = self.table.assign(distinct, indices)
        return keys


_Keyer = _HashKeyer | _TableKeyer


def _entity_keys(col: Column, keyer: _Keyer) -> tuple[IntArray, Literal["int", "str"]]:
    if isinstance(col, np.ndarray):
        return _numpy_entity_keys(col, keyer)
    if col.null_count:
        raise _Problem("entity", _NULLS)
    typ = col.type
    if pa.types.is_dictionary(typ) and _is_text(typ.value_type):
        return _text_keys(col, keyer), "str"  # already encoded: no per-row work
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    if pa.types.is_integer(typ):
        return _integer_keys(_numeric_numpy(col)), "int"
    if _is_text(typ):
        return _text_keys(col, keyer), "str"
    raise _Problem("entity", f"must hold integers or strings, got {typ}")


def _numpy_entity_keys(
    arr: np.ndarray, keyer: _Keyer
) -> tuple[IntArray, Literal["int", "str"]]:
    if arr.ndim != 1:
        raise _Problem("entity", f"must be 1-D, got a {arr.ndim}-D array")
    kind = arr.dtype.kind
    if kind in "iu":
        return _integer_keys(arr), "int"
    if kind in "US" and arr.dtype.itemsize:
        # Deduplicate the fixed-width raw values in place (a zero-copy arrow view)
        # and decode only the distinct ones; converting every row to UTF-8 first
        # costs more than all the rest.
        arr = np.ascontiguousarray(arr)
        raw = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(arr.dtype.itemsize), len(arr), [None, pa.py_buffer(arr)]
        )
        encoded = pc.dictionary_encode(raw)
        distinct = np.frombuffer(
            encoded.dictionary.buffers()[1],
            dtype=arr.dtype,
            count=len(encoded.dictionary),
        )
        values = [v.encode("utf-8") if kind == "U" else v for v in distinct.tolist()]
        indices = _numeric_numpy(encoded.indices)
        return keyer(pa.array(values, type=pa.large_binary()), indices), "str"
    if kind not in "USTO":
        raise _Problem("entity", f"must hold integers or strings, got {arr.dtype}")
    try:
        col = pa.array(arr)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        raise _Problem(
            "entity", "must hold integers or strings, got mixed objects"
        ) from None
    return _entity_keys(col, keyer)


def _is_text(typ: pa.DataType) -> bool:
    # the view types are compared by name: pa.types.is_string_view needs pyarrow 16
    return (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or str(typ) in ("string_view", "binary_view")
    )


def _integer_keys(arr: np.ndarray) -> IntArray:
    if arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
        raise _Problem("entity", _TOO_LARGE)
    return arr.astype(np.int64, copy=False)


def _text_keys(col: pa.Array | pa.ChunkedArray, keyer: _Keyer) -> IntArray:
    """Keys of a text column (plain or dictionary-encoded), row by row."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    chunks = (
        col.unify_dictionaries().chunks if isinstance(col, pa.ChunkedArray) else [col]
    )
    if not chunks:
        return np.empty(0, dtype=np.int64)
    dictionary = chunks[0].dictionary  # shared by every chunk after unification
    if dictionary.null_count:
        raise _Problem("entity", _NULLS)
    indices = np.concatenate([_numeric_numpy(c.indices) for c in chunks])
    # strings are keyed by their UTF-8 bytes
    return keyer(dictionary.cast(pa.large_binary()), indices)


def _digests(values: list[bytes], key: bytes) -> IntArray:
    """Keyed BLAKE2b-64 of each (distinct) value, as little-endian int64."""
    base = hashlib.blake2b(digest_size=8, key=key)

    def digest(value: bytes) -> bytes:
        h = base.copy()  # copying skips re-processing the key block
        h.update(value)
        return h.digest()

    return np.frombuffer(b"".join(map(digest, values)), dtype="<i8").astype(np.int64)


# -- writers ------------------------------------------------------------------------


def _batch_columns(batch: UpdateBatch | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(batch, UpdateBatch):
        if batch.entity_kind == "str":
            raise InvalidParameterError(
                "an UpdateBatch with entity_kind='str' holds keys, not the ids; "
                "pass the columns as a dict with the original strings."
            )
        return {c: getattr(batch, c) for c in COLUMNS}
    if not isinstance(batch, Mapping) or not batch:
        raise InvalidParameterError(
            "batch must be an UpdateBatch or a non-empty mapping of column names "
            f"to arrays, got {type(batch).__name__}."
        )
    return dict(batch)


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return np.asarray(value.to_numpy(zero_copy_only=False))
    return np.asarray(value)


def _as_table(columns: Mapping[str, Any]) -> pa.Table:
    try:
        return pa.table(
            {
                name: value
                if isinstance(value, pa.Array | pa.ChunkedArray)
                else pa.array(value)
                for name, value in columns.items()
            }
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise InvalidParameterError(
            "the columns cannot form one table (equal lengths, one type per "
            f"column are needed): {type(exc).__name__}."
        ) from None


def _write_parquet(tmp: str, columns: Mapping[str, Any]) -> None:
    pq.write_table(_as_table(columns), tmp)


def _write_csv(tmp: str, columns: Mapping[str, Any]) -> None:
    pcsv.write_csv(_as_table(columns), tmp)


def _write_npz(tmp: str, columns: Mapping[str, Any]) -> None:
    with open(tmp, "wb") as f:  # a file object: savez would append ".npz" to a name
        # values typed Any: numpy's stub checks ** against its keyword allow_pickle
        arrays: dict[str, Any] = {name: _as_numpy(v) for name, v in columns.items()}
        np.savez(f, **arrays)


def _write_zarr(tmp: str, columns: Mapping[str, Any]) -> None:
    group = zarr.open_group(tmp, mode="w", zarr_format=3)
    for name, value in columns.items():
        arr = _as_numpy(value)
        if arr.dtype.kind in "UO":
            # Zarr v3 specifies variable-length strings; fixed-width ones are not
            arr = arr.astype(np.dtypes.StringDType())
        group.create_array(name, data=arr)


_WRITERS: dict[str, Callable[[str, Mapping[str, Any]], None]] = {
    ".parquet": _write_parquet,
    ".csv": _write_csv,
    ".npz": _write_npz,
    ".zarr": _write_zarr,
}
