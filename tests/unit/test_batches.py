"""Turnstile update batches: formats, entity keys, and validation (spec 1.1, 1.3, 6.4).

Every error case plants sentinel values in the bad file and checks that none of
them reaches the message (style B.6: no data values in errors).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from pipeline.errors import InvalidParameterError, PipelineError, StoreLayoutError
from pipeline.io.batches import (
    COLUMNS,
    SUFFIXES,
    BatchError,
    UpdateBatch,
    entity_keys,
    read_batch,
    write_batch,
)

SHAPE = (10, 6)
KEY = b"batch-test-key"
# Values planted in bad files; none may appear in an error message.
SENTINEL_S = 123456.789
SENTINEL_INT = 987654321
SENTINEL_ID = "secret-entity-7f3a"
SENTINELS = ("123456.789", "123456", "987654321", "7f3a", "secret-entity")


def _random_columns(rng: np.random.Generator, n: int = 50) -> dict[str, np.ndarray]:
    return {
        "entity": rng.integers(-(2**62), 2**62, n),
        "i": rng.integers(0, SHAPE[0], n),
        "j": rng.integers(0, SHAPE[1], n),
        "s": rng.standard_normal(n) * 10.0 ** rng.integers(-5, 5, n),
    }


def _string_columns(rng: np.random.Generator, n: int = 50) -> dict[str, Any]:
    cols: dict[str, Any] = dict(_random_columns(rng, n))
    names = np.array(["ann", "bo", "cé", "d,e", 'q"x', "user 1", "ü-7"])
    cols["entity"] = names[rng.integers(0, len(names), n)]
    return cols


def _raise_batch(path: pathlib.Path, match: str, shape: tuple[int, int] = SHAPE) -> str:
    """Read ``path``, expect a BatchError matching ``match``, check it leaks nothing."""
    with pytest.raises(BatchError, match=match) as info:
        read_batch(path, shape=shape, entity_key=KEY)
    msg = str(info.value)
    assert os.fspath(path) in msg, msg  # names the file
    for sentinel in SENTINELS:
        assert sentinel not in msg, f"data value {sentinel!r} leaked into: {msg}"
    # no counts or positions of offending rows either
    assert not re.search(r"\b(rows?|positions?|index(es)?) \d", msg), msg
    return msg


def _bad(tmp_path: pathlib.Path, suffix: str, **columns: Any) -> pathlib.Path:
    path = tmp_path / f"bad{suffix}"
    write_batch(path, columns)
    return path


def _good_columns(n: int = 4) -> dict[str, Any]:
    return {
        "entity": np.arange(n) + SENTINEL_INT,
        "i": np.arange(n) % SHAPE[0],
        "j": np.arange(n) % SHAPE[1],
        "s": np.full(n, SENTINEL_S),
    }


# -- round trips ------------------------------------------------------------------


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_int_entities(
    tmp_path: pathlib.Path, rng: np.random.Generator, suffix: str
) -> None:
    cols = _random_columns(rng)
    batch = UpdateBatch(**cols, entity_kind="int")
    path = tmp_path / f"b{suffix}"
    write_batch(path, batch)
    got = read_batch(path, shape=SHAPE)
    for name in COLUMNS:
        arr = getattr(got, name)
        assert arr.dtype == cols[name].dtype
        assert arr.shape == (50,)
        # bitwise: the text of a CSV must also round-trip every double exactly
        np.testing.assert_array_equal(arr, cols[name], strict=True)
        assert not arr.flags.writeable
    assert got.entity_kind == "int"
    assert len(got) == 50
    assert got.fingerprint() == batch.fingerprint()
    assert got == batch


def test_fingerprint_same_across_formats_str(
    tmp_path: pathlib.Path, rng: np.random.Generator
) -> None:
    cols = _string_columns(rng)
    batches = []
    for suffix in SUFFIXES:
        write_batch(tmp_path / f"b{suffix}", cols)
        batches.append(read_batch(tmp_path / f"b{suffix}", shape=SHAPE, entity_key=KEY))
    keys, kind = entity_keys(cols["entity"], key=KEY)
    for got in batches:
        assert got.entity_kind == kind == "str"
        np.testing.assert_array_equal(got.entity, keys, strict=True)
        np.testing.assert_array_equal(got.s, cols["s"], strict=True)
    assert len({b.fingerprint() for b in batches}) == 1


def test_fingerprint_sees_every_field(rng: np.random.Generator) -> None:
    """Negative controls: changing any one field changes the fingerprint."""
    cols = _random_columns(rng, 5)
    base = UpdateBatch(**cols, entity_kind="int")
    prints = {base.fingerprint()}
    for name in COLUMNS:
        changed = dict(cols)
        changed[name] = cols[name].copy()
        changed[name][0] += 1
        prints.add(UpdateBatch(**changed, entity_kind="int").fingerprint())
    prints.add(UpdateBatch(**cols, entity_kind="str").fingerprint())
    assert len(prints) == 6
    assert re.fullmatch(r"[0-9a-f]{64}", base.fingerprint())


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_extra_columns_ignored(
    tmp_path: pathlib.Path, rng: np.random.Generator, suffix: str
) -> None:
    cols = _random_columns(rng, 8)
    write_batch(
        tmp_path / f"b{suffix}", {"note": np.arange(8) * 0.5, **cols, "x": np.arange(8)}
    )
    got = read_batch(tmp_path / f"b{suffix}", shape=SHAPE)
    assert got == UpdateBatch(**cols, entity_kind="int")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_empty_batch_is_valid(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = {
        "entity": np.zeros(0, np.int64),
        "i": np.zeros(0, np.int64),
        "j": np.zeros(0, np.int64),
        "s": np.zeros(0),
    }
    write_batch(tmp_path / f"b{suffix}", cols)
    got = read_batch(tmp_path / f"b{suffix}", shape=SHAPE)
    assert len(got) == 0
    assert got.entity_kind == "int"
    assert all(getattr(got, c).shape == (0,) for c in COLUMNS)


def test_narrow_and_unsigned_types_are_widened(tmp_path: pathlib.Path) -> None:
    cols = {
        "entity": np.array([3, 2**63 - 1], np.uint64),
        "i": np.array([0, 9], np.uint8),
        "j": np.array([5, 0], np.int16),
        "s": np.array([1, -2], np.int32),
    }
    write_batch(tmp_path / "b.parquet", cols)
    got = read_batch(tmp_path / "b.parquet", shape=SHAPE)
    assert got.entity.tolist() == [3, 2**63 - 1]
    assert got.i.tolist() == [0, 9]
    assert got.j.tolist() == [5, 0]
    assert got.s.dtype == np.float64
    assert got.s.tolist() == [1.0, -2.0]


def test_dictionary_encoded_parquet(tmp_path: pathlib.Path) -> None:
    """A categorical entity column and one stored in several row groups."""
    ids = pa.array(["ann", "bo", "ann", "cé", "bo", "ann"])
    table = pa.table(
        {
            "entity": ids.dictionary_encode(),
            "i": [0, 1, 2, 3, 4, 5],
            "j": [0] * 6,
            "s": [1.0] * 6,
        }
    )
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=2)
    got = read_batch(tmp_path / "b.parquet", shape=SHAPE, entity_key=KEY)
    np.testing.assert_array_equal(got.entity, entity_keys(ids, key=KEY)[0])
    assert got.entity[0] == got.entity[2] == got.entity[5] != got.entity[1]


def test_csv_text_is_typed(tmp_path: pathlib.Path) -> None:
    """CSV: spaces are trimmed, ids that are all integers are int, else str."""
    path = tmp_path / "b.csv"
    path.write_text("x,entity,i,j,s\nq, 7 , 1,2, 0.5\nr,8,3, 0 ,-1e3\n")
    got = read_batch(path, shape=SHAPE)
    assert got.entity_kind == "int"
    assert got.entity.tolist() == [7, 8]
    assert got.i.tolist() == [1, 3]
    assert got.j.tolist() == [2, 0]
    assert got.s.tolist() == [0.5, -1000.0]
    path.write_text("entity,i,j,s\n7,1,2,0.5\nann,3,0,1\nNA,0,0,1\n")
    got = read_batch(path, shape=SHAPE, entity_key=KEY)
    assert got.entity_kind == "str"
    np.testing.assert_array_equal(
        got.entity, entity_keys(["7", "ann", "NA"], key=KEY)[0]
    )


def test_read_does_not_touch_the_file(
    tmp_path: pathlib.Path, rng: np.random.Generator
) -> None:
    path = tmp_path / "b.npz"
    write_batch(path, _random_columns(rng))
    before = path.read_bytes(), path.stat().st_mtime_ns
    read_batch(path, shape=SHAPE)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_repr_shows_no_data() -> None:
    batch = UpdateBatch(
        **{k: np.asarray(v) for k, v in _good_columns().items()}, entity_kind="int"
    )
    text = repr(batch)
    assert "int" in text
    assert not any(s in text for s in SENTINELS)


# -- entity keys --------------------------------------------------------------------


def _oracle_key(value: str, key: bytes | None) -> int:
    digest = hashlib.blake2b(value.encode(), digest_size=8, key=key or b"").digest()
    return int.from_bytes(digest, "little", signed=True)


def test_string_keys_match_blake2b_oracle() -> None:
    values = ["ann", "bo", "cé", "", "ann"]
    for key in (KEY, None):
        keys, kind = entity_keys(np.array(values), key=key)
        assert kind == "str"
        assert keys.tolist() == [_oracle_key(v, key) for v in values]


def test_keyed_hash_differs_by_key_and_is_stable() -> None:
    values = np.array([f"user-{k}" for k in range(200)])
    a1, _ = entity_keys(values, key=b"key-one")
    a2, _ = entity_keys(values.copy(), key=b"key-one")
    b, _ = entity_keys(values, key=b"key-two")
    unkeyed, _ = entity_keys(values, key=None)
    np.testing.assert_array_equal(a1, a2, strict=True)
    assert len(np.unique(a1)) == 200  # distinct ids, distinct keys here
    assert not np.any(a1 == b)
    assert not np.any(a1 == unkeyed)


@pytest.mark.parametrize(
    "make",
    [
        lambda v: np.array(v),
        lambda v: np.array(v, dtype=object),
        lambda v: np.array(v, dtype=np.dtypes.StringDType()),
        lambda v: list(v),
        lambda v: pa.array(v),
        lambda v: pa.array(v, type=pa.large_string()),
        lambda v: pa.chunked_array([pa.array(v[:2]), pa.array(v[2:])]),
        lambda v: pa.array(v).dictionary_encode(),
        lambda v: np.array([x.encode() for x in v]),
        lambda v: pa.array([x.encode() for x in v], type=pa.binary()),
    ],
    ids=[
        "U",
        "object",
        "StringDType",
        "list",
        "arrow",
        "large",
        "chunked",
        "dict",
        "bytes",
        "binary",
    ],
)
def test_string_key_same_for_every_container(make: Any) -> None:
    values = ["ann", "bo", "cé", "ann", "ü"]
    keys, kind = entity_keys(make(values), key=KEY)
    assert kind == "str"
    assert keys.tolist() == [_oracle_key(v, KEY) for v in values]


def test_integer_keys_are_the_ids() -> None:
    for values in (np.array([-5, 0, 2**62]), pa.array([-5, 0, 2**62]), [-5, 0, 2**62]):
        keys, kind = entity_keys(values, key=KEY)
        assert kind == "int"
        assert keys.dtype == np.int64
        assert keys.tolist() == [-5, 0, 2**62]


def test_entity_keys_refuses_bad_values() -> None:
    with pytest.raises(InvalidParameterError, match="fit in int64"):
        entity_keys(np.array([1, 2**63 + SENTINEL_INT], np.uint64), key=None)
    with pytest.raises(InvalidParameterError, match="integers or strings, got float64"):
        entity_keys(np.array([SENTINEL_S]), key=None)
    with pytest.raises(InvalidParameterError, match="nulls"):
        entity_keys(pa.array([SENTINEL_ID, None]), key=None)
    with pytest.raises(InvalidParameterError, match="mixed objects"):
        entity_keys(np.array([SENTINEL_ID, 3], dtype=object), key=None)


@pytest.mark.parametrize("key", [b"", b"k" * 65, "text-key", 5])
def test_bad_entity_key(key: Any, tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidParameterError, match="entity_key must"):
        entity_keys(["a"], key=key)
    # checked before the file is looked at
    with pytest.raises(InvalidParameterError, match="entity_key must"):
        read_batch(tmp_path / "absent.parquet", shape=SHAPE, entity_key=key)


@pytest.mark.parametrize("shape", [(0, 5), (5,), (5, 2.0), "5x5", (5, -1)])
def test_bad_shape(shape: Any, tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidParameterError, match=r"shape|n_rows|n_cols"):
        read_batch(tmp_path / "absent.parquet", shape=shape)


# -- file-level errors ---------------------------------------------------------------


def test_batch_error_is_a_store_layout_error() -> None:
    assert issubclass(BatchError, StoreLayoutError)
    assert issubclass(BatchError, PipelineError)  # exit code 2 in the CLI


def test_missing_file(tmp_path: pathlib.Path) -> None:
    _raise_batch(tmp_path / "nope.parquet", "does not exist")
    _raise_batch(tmp_path / "nope.zarr", "does not exist")


def test_unknown_suffix(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(f'{{"s": [{SENTINEL_S}]}}')
    msg = _raise_batch(path, "unknown suffix")
    assert all(s in msg for s in SUFFIXES)
    _raise_batch(tmp_path / "noext", "unknown suffix")


def test_wrong_kind_of_path(tmp_path: pathlib.Path) -> None:
    (tmp_path / "dir.parquet").mkdir()
    _raise_batch(tmp_path / "dir.parquet", "is a directory")
    (tmp_path / "file.zarr").write_text(str(SENTINEL_S))
    _raise_batch(tmp_path / "file.zarr", "must be a Zarr group directory")


@pytest.mark.parametrize("suffix", [".parquet", ".npz", ".csv"])
def test_garbage_bytes(
    tmp_path: pathlib.Path, rng: np.random.Generator, suffix: str
) -> None:
    path = tmp_path / f"g{suffix}"
    noise = rng.integers(128, 256, 300, dtype=np.uint8).tobytes()  # not UTF-8
    path.write_bytes(noise + f"{SENTINEL_S},{SENTINEL_ID}".encode() + noise)
    _raise_batch(path, "is not a readable")


@pytest.mark.parametrize("suffix", [".parquet", ".npz"])
def test_truncated_file(tmp_path: pathlib.Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    write_batch(path, _good_columns(200))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _raise_batch(path, r"not a readable|cannot be read")


def test_not_a_zarr_group(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.zarr"
    path.mkdir()
    (path / "zarr.json").write_text(f'{{"oops": {SENTINEL_S}')
    _raise_batch(path, "not a readable Zarr group")


def test_npz_single_array(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.npz"
    with open(path, "wb") as f:
        np.save(f, np.array([SENTINEL_S]))
    _raise_batch(path, "single array, not an NPZ archive")


def test_npz_object_arrays_refused(tmp_path: pathlib.Path) -> None:
    cols = _good_columns(3)
    cols["entity"] = np.array([SENTINEL_ID, None, 3], dtype=object)  # pickled by savez
    msg = _raise_batch(_bad(tmp_path, ".npz", **cols), "column 'entity' cannot be read")
    assert "object arrays" in msg


# -- column-level errors ---------------------------------------------------------------


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_missing_columns(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns()
    del cols["j"], cols["entity"]
    msg = _raise_batch(
        _bad(tmp_path, suffix, **cols, jj=np.arange(4)),
        r"lacks the column\(s\) 'entity', 'j'",
    )
    assert "required columns are entity, i, j, s" in msg


def test_csv_without_header(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text(f"{SENTINEL_ID},{SENTINEL_INT},1,{SENTINEL_S}\n7,1,1,0.5\n")
    msg = _raise_batch(path, "lacks the column")
    assert "header row" in msg


def test_duplicate_column(tmp_path: pathlib.Path) -> None:
    table = pa.Table.from_arrays(
        [
            pa.array([1]),
            pa.array([1]),
            pa.array([2]),
            pa.array([0]),
            pa.array([SENTINEL_S]),
        ],
        names=["entity", "i", "i", "j", "s"],
    )
    pq.write_table(table, tmp_path / "d.parquet")
    _raise_batch(tmp_path / "d.parquet", "more than one column named 'i'")
    path = tmp_path / "d.csv"
    path.write_text(f"entity,i,j,s,i\n1,1,0,{SENTINEL_S},{SENTINEL_INT}\n")
    _raise_batch(path, "more than one column named 'i'")


@pytest.mark.parametrize("suffix", [".npz", ".zarr"])
def test_columns_of_different_lengths(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns(4)
    cols["s"] = np.full(5, SENTINEL_S)
    msg = _raise_batch(
        _bad(tmp_path, suffix, **cols),
        "column 's' has a different length from column 'entity'",
    )
    text = msg.replace(os.fspath(tmp_path), "")
    assert not re.search(r"\d", text), msg  # no lengths


@pytest.mark.parametrize("suffix", [".npz", ".zarr"])
def test_columns_must_be_1d(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns(4)
    cols["i"] = np.zeros((2, 2), np.int64)
    _raise_batch(_bad(tmp_path, suffix, **cols), "column 'i' must be 1-D, got a 2-D")


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("column", ["i", "j"])
def test_index_floats_refused(tmp_path: pathlib.Path, suffix: str, column: str) -> None:
    cols = _good_columns()
    cols[column] = np.array([1.0, 2.0, 3.0, SENTINEL_S])
    _raise_batch(
        _bad(tmp_path, suffix, **cols), rf"column '{column}' must hold integers"
    )


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize(
    ("column", "bad", "bound"),
    [
        ("i", -SENTINEL_INT, r"\[0, n_rows\) = \[0, 10\)"),
        ("i", SENTINEL_INT, r"\[0, n_rows\) = \[0, 10\)"),
        ("i", SHAPE[0], r"\[0, n_rows\) = \[0, 10\)"),
        ("j", SHAPE[1], r"\[0, n_cols\) = \[0, 6\)"),
        ("j", -1, r"\[0, n_cols\) = \[0, 6\)"),
    ],
)
def test_index_out_of_range(
    tmp_path: pathlib.Path, suffix: str, column: str, bad: int, bound: str
) -> None:
    cols = _good_columns()
    cols[column] = np.array([0, 1, bad, 2])
    _raise_batch(
        _bad(tmp_path, suffix, **cols), rf"column '{column}' must lie in {bound}"
    )


def test_index_bounds_are_inclusive_exclusive(tmp_path: pathlib.Path) -> None:
    """Negative control for the range test: the extreme valid indices pass."""
    cols = _good_columns(2)
    cols["i"] = np.array([0, SHAPE[0] - 1])
    cols["j"] = np.array([SHAPE[1] - 1, 0])
    write_batch(tmp_path / "b.npz", cols)
    assert len(read_batch(tmp_path / "b.npz", shape=SHAPE)) == 2


def test_index_bool_and_text_refused(tmp_path: pathlib.Path) -> None:
    cols = _good_columns(2)
    cols["i"] = np.array([True, False])
    _raise_batch(
        _bad(tmp_path, ".npz", **cols), "column 'i' must hold integers, got bool"
    )
    cols["i"] = np.array([str(SENTINEL_INT), "1"])
    _raise_batch(
        _bad(tmp_path, ".parquet", **cols), "column 'i' must hold integers, got string"
    )


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_read_as_they_are(
    tmp_path: pathlib.Path, suffix: str, bad: float
) -> None:
    """Not refused (a refusal would depend on one entity's data): ingest zeroes the
    entity's updates of the batch (docs/privacy.md, "Non-finite values";
    tests/hostile/test_non_finite_everywhere.py::test_stream_batches)."""
    cols = _good_columns()
    cols["s"] = np.array([SENTINEL_S, bad, 1.0, 2.0])
    got = read_batch(_bad(tmp_path, suffix, **cols), shape=SHAPE, entity_key=KEY).s
    np.testing.assert_array_equal(got, cols["s"])


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_values_must_be_numbers(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns(2)
    cols["s"] = np.array([str(SENTINEL_S), "x1"])
    _raise_batch(_bad(tmp_path, suffix, **cols), "column 's' must hold real numbers")


def test_values_complex_refused(tmp_path: pathlib.Path) -> None:
    cols = _good_columns(2)
    cols["s"] = np.array([SENTINEL_S + 1j, 0])
    _raise_batch(
        _bad(tmp_path, ".npz", **cols), "column 's' must hold real numbers, got complex"
    )


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize("column", COLUMNS)
def test_nulls_refused(tmp_path: pathlib.Path, suffix: str, column: str) -> None:
    cols: dict[str, Any] = {c: v.tolist() for c, v in _good_columns().items()}
    if column == "entity":
        cols["entity"] = [SENTINEL_ID, None, "b", "c"]
    else:
        cols[column][1] = None
    _raise_batch(_bad(tmp_path, suffix, **cols), rf"column '{column}' contains nulls")


@pytest.mark.parametrize("suffix", [".parquet", ".npz", ".zarr"])
def test_entity_unsupported_type(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns()
    cols["entity"] = np.array([SENTINEL_S, 1.5, 2.5, 3.5])
    _raise_batch(
        _bad(tmp_path, suffix, **cols),
        "column 'entity' must hold integers or strings, got (double|float64)",
    )


def test_entity_bool_refused(tmp_path: pathlib.Path) -> None:
    cols = _good_columns(2)
    cols["entity"] = np.array([True, False])
    _raise_batch(
        _bad(tmp_path, ".parquet", **cols),
        "column 'entity' must hold integers or strings, got bool",
    )


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_entity_uint64_above_int64(tmp_path: pathlib.Path, suffix: str) -> None:
    cols = _good_columns(2)
    cols["entity"] = np.array([1, 2**63 + SENTINEL_INT], np.uint64)
    _raise_batch(
        _bad(tmp_path, suffix, **cols),
        "column 'entity' must hold ids that fit in int64",
    )


def test_pyarrow_messages_would_leak(tmp_path: pathlib.Path) -> None:
    """Negative control: the library's own error quotes the data; ours does not."""
    path = tmp_path / "b.csv"
    path.write_text(f"entity,i,j,s\n1,{SENTINEL_S},0,1\n")
    with pytest.raises(pa.ArrowInvalid) as raw:
        pcsv.read_csv(
            path, convert_options=pcsv.ConvertOptions(column_types={"i": pa.int64()})
        )
    assert "123456.789" in str(raw.value)
    _raise_batch(path, "column 'i' must hold integers")


# -- write_batch and UpdateBatch arguments -------------------------------------------


def test_write_refuses_overwrite_and_unknown_suffix(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.npz"
    write_batch(path, _good_columns())
    with pytest.raises(InvalidParameterError, match="exists; pass overwrite=True"):
        write_batch(path, _good_columns())
    cols = _good_columns()
    cols["s"] = np.zeros(4)
    write_batch(path, cols, overwrite=True)
    assert read_batch(path, shape=SHAPE).s.tolist() == [0.0] * 4
    with pytest.raises(InvalidParameterError, match="must end in one of"):
        write_batch(tmp_path / "b.txt", cols)
    assert sorted(os.listdir(tmp_path)) == ["b.npz"]  # no temporary left behind


def test_write_overwrites_zarr_group(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.zarr"
    write_batch(path, _good_columns(4))
    write_batch(path, _good_columns(2), overwrite=True)
    assert len(read_batch(path, shape=SHAPE)) == 2
    assert sorted(os.listdir(tmp_path)) == ["b.zarr"]


def test_write_refuses_hashed_batch(tmp_path: pathlib.Path) -> None:
    batch = read_batch(
        _bad(tmp_path, ".npz", **dict(_good_columns(2), entity=["a", "b"])), shape=SHAPE
    )
    with pytest.raises(InvalidParameterError, match="entity_kind='str'"):
        write_batch(tmp_path / "again.npz", batch)


def test_write_unequal_table_columns(tmp_path: pathlib.Path) -> None:
    cols = _good_columns()
    cols["s"] = np.zeros(3)
    with pytest.raises(InvalidParameterError, match="cannot form one table"):
        write_batch(tmp_path / "b.parquet", cols)
    assert os.listdir(tmp_path) == []


def test_update_batch_checks_fields() -> None:
    good = {k: np.asarray(v) for k, v in _good_columns().items()}
    with pytest.raises(InvalidParameterError, match="entity_kind must be"):
        UpdateBatch(**good, entity_kind="float")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="i must be a 1-D int64"):
        UpdateBatch(**dict(good, i=good["i"].astype(np.int32)), entity_kind="int")
    with pytest.raises(InvalidParameterError, match="equal lengths"):
        UpdateBatch(**dict(good, s=good["s"][:2]), entity_kind="int")
