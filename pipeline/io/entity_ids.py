"""A stream's table of string entity ids: each distinct id gets its own key.

Problem. Per-entity clipping (spec sketch-lrf sections 1.3 and 6.4) bounds the
net contribution of each *key*; it bounds each *entity*'s contribution only if
distinct entities never share a key. Hashing string ids to 64-bit keys breaks
this when two ids collide: under add/remove, entities with +10 and -20 in one
cell share one clip, so removing one of them moves the clipped output by 2 C
while the calibration assumes C. A keyed hash makes collisions rare but not
impossible, and a key an adversary can learn lets them construct a pair.

This module replaces the hash by a table: the stream keeps every string id it
has seen, in order of first appearance, and the key of an id is its position
in that table. Distinct ids get distinct keys by construction, and an id keeps
its key for the life of the stream.

* An id is its bytes: a string is its UTF-8 encoding, so the string ``"ann"``
  and the binary value ``b"ann"`` are one id; the empty string is an id too.
* New ids of a batch are appended in the order of the first row that holds
  each, so a batch gives the same keys whatever its file format, and a rerun
  of an ingest that did not commit gives the same keys again.
* The table is stored as two arrays of the stream state (the ids' concatenated
  bytes and their int64 offsets) and replaced in the same atomic commit as the
  entity budgets it indexes (:mod:`pipeline.io.stream_state`).

Privacy. The table holds the raw ids: it is as sensitive as the data and lives
only in the stream state (the trusted zone). Nothing here logs or prints an id;
reprs show the number of ids only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import StoreLayoutError

__all__ = ["EntityIds"]

IntArray = npt.NDArray[np.int64]

_DAMAGED = (
    "the stream state's table of entity ids is damaged ({what}); restore the "
    "state from a backup."
)


@dataclass(frozen=True, slots=True)
class EntityIds:
    """Distinct string entity ids in order of first appearance; key = position.

    Attributes
    ----------
    ids : pyarrow.LargeBinaryArray
        The ids (their bytes), unique; the key of ``ids[k]`` is ``k``.

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = EntityIds.empty()
    >>> keys, t = t.assign(pa.array([b"bo", b"ann"], pa.large_binary()),
    ...                    np.array([1, 0, 1]))
    >>> keys.tolist(), len(t)
    ([0, 1, 0], 2)
    >>> keys, t2 = t.assign(pa.array([b"cy", b"bo"], pa.large_binary()),
    ...                     np.array([0, 1]))
    >>> keys.tolist(), len(t2)
    ([2, 1], 3)
    """

    ids: pa.LargeBinaryArray

    @classmethod
    def empty(cls) -> EntityIds:
        # pa.nulls, not pa.array([]): a Python list makes pyarrow import pandas
        # (0.2 s) to test whether it is a pandas object, on every ingest
        return cls(pa.nulls(0, type=pa.large_binary()))

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:  # the ids are private: never print them
        return f"EntityIds(<{len(self)} ids>)"

    def assign(
        self, distinct: pa.Array, indices: npt.NDArray[np.integer]
    ) -> tuple[IntArray, EntityIds]:
        """Keys of a column given as distinct values and row indices into them.

        Parameters
        ----------
        distinct : pyarrow binary or string array, no nulls
            The column's values, each listed at least once (repeats allowed).
        indices : ndarray of int, shape (n,)
            Row r holds ``distinct[indices[r]]``.

        Returns
        -------
        keys : ndarray of int64, shape (n,)
            The key of each row: the id's position in the table, known ids
            first looked up, new ids appended in order of their first row.
        table : EntityIds
            This table with the new ids appended (``self`` when none are new).

        Notes
        -----
        Cost: a hash set of the whole table is built and the distinct values
        are looked up in it; a few vectorised passes over the rows; a sort of
        the new ids only.
        """
        indices = np.asarray(indices, dtype=np.int64)
        values = distinct.cast(pa.large_binary())
        # one key per distinct *value*: merge repeated entries of the dictionary
        encoded = pc.dictionary_encode(values)
        values = encoded.dictionary
        indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)[
            indices
        ]
        found = pc.index_in(values, value_set=self.ids)
        codes = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        new_rows = np.flatnonzero(codes[indices] < 0)
        if new_rows.size == 0:
            return codes[indices], self
        # new ids in the order of the first row holding each (ids no row holds stay out)
        first_row = np.full(len(values), indices.size, dtype=np.int64)
        np.minimum.at(first_row, indices[new_rows], new_rows)
        new_values = np.flatnonzero(first_row < indices.size)
        new_values = new_values[np.argsort(first_row[new_values], kind="stable")]
        codes[new_values] = len(self) + np.arange(new_values.size, dtype=np.int64)
        table = pa.concat_arrays([self.ids, values.take(pa.array(new_values))])
        return codes[indices], EntityIds(table)

    def to_arrays(self) -> tuple[npt.NDArray[np.uint8], IntArray]:
        """The table as ``(data, offsets)``: uint8 bytes and int64 offsets (n + 1)."""
        arr = self.ids
        offsets = np.frombuffer(arr.buffers()[1], dtype="<i8")[
            arr.offset : arr.offset + len(arr) + 1
        ]
        buf = arr.buffers()[2]
        data = np.zeros(0, np.uint8) if buf is None else np.frombuffer(buf, np.uint8)
        start, end = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
        out_offsets = offsets.astype(np.int64) - start
        if out_offsets.size == 0:
            out_offsets = np.zeros(1, dtype=np.int64)
        return data[start:end].copy(), out_offsets

    @classmethod
    def from_arrays(cls, data: np.ndarray, offsets: np.ndarray) -> EntityIds:
        """Rebuild a table from :meth:`to_arrays`, checking it.

        Raises
        ------
        StoreLayoutError
            If the arrays do not describe a table of unique ids (a damaged
            state); the message names no id.
        """
        data, offsets = np.asarray(data), np.asarray(offsets)
        if (
            data.ndim != 1
            or data.dtype != np.uint8
            or offsets.ndim != 1
            or offsets.dtype != np.int64
        ):
            raise StoreLayoutError(_DAMAGED.format(what="wrong array types"))
        if (
            offsets.size == 0
            or offsets[0] != 0
            or offsets[-1] != data.size
            or np.any(np.diff(offsets) < 0)
        ):
            raise StoreLayoutError(_DAMAGED.format(what="inconsistent offsets"))
        n = offsets.size - 1
        ids = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(),
            n,
            [
                None,
                pa.py_buffer(np.ascontiguousarray(offsets)),
                pa.py_buffer(np.ascontiguousarray(data)),
            ],
        )
        if n and pc.count_distinct(ids).as_py() != n:
            raise StoreLayoutError(_DAMAGED.format(what="repeated ids"))
        return cls(ids)
