"""Direct chunk reads of plain local Zarr v3 stores (``_CheckedReads.block``).

A pass task reads its chunk with ``reader.block``: for the plain layout (local
directory store, regular chunks, ``bytes`` + optional ``zstd``) the chunk file is
decoded straight into a per-thread buffer; every other layout, and every block
that is not exactly one chunk, goes through zarr. Either way the values must be
zarr's, bit for bit, and a damaged chunk must give the one-line error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

from pipeline.errors import StoreLayoutError
from pipeline.io import open_input

SHAPE = (250, 70)  # edge chunks in both directions for the chunkings below


def _store(path: Path, dtype: str, chunks: tuple[int, int], **kw) -> zarr.Array:
    rng = np.random.default_rng(3)
    A = (rng.standard_normal(SHAPE) * 100).astype(dtype)
    z = zarr.create_array(store=os.fspath(path), shape=SHAPE, chunks=chunks, dtype=dtype, **kw)
    z[...] = A
    return z


def _blocks(chunks: tuple[int, int]):
    for r0 in range(0, SHAPE[0], chunks[0]):
        for c0 in range(0, SHAPE[1], chunks[1]):
            yield (r0, min(r0 + chunks[0], SHAPE[0])), (c0, min(c0 + chunks[1], SHAPE[1]))


PLAIN = {
    "float32 zstd": ("float32", (64, 70), {}),
    "float64 zstd, column chunks": ("float64", (64, 32), {}),
    "int16 uncompressed": ("int16", (100, 30), {"compressors": None}),
    "float64 zstd with checksum": (
        "float64",
        (64, 70),
        {"compressors": [ZstdCodec(level=3, checksum=True)]},
    ),
    "dot-separated chunk keys": (
        "float32",
        (64, 70),
        {"chunk_key_encoding": {"name": "default", "separator": "."}},
    ),
}
THROUGH_ZARR = {
    "big-endian bytes": ("float64", (64, 70), {"serializer": BytesCodec(endian="big")}),
    "crc32c codec": ("float32", (64, 70), {"compressors": [Crc32cCodec()]}),
    "sharded": ("float32", (64, 70), {"shards": (128, 70)}),
    "zarr v2": ("float32", (64, 70), {"zarr_format": 2}),
}


@pytest.mark.parametrize("name", list(PLAIN) + list(THROUGH_ZARR))
def test_every_chunk_is_zarrs_bit_for_bit(tmp_path: Path, name: str) -> None:
    dtype, chunks, kw = {**PLAIN, **THROUGH_ZARR}[name]
    z = _store(tmp_path / "a.zarr", dtype, chunks, **kw)
    _, info = open_input(os.fspath(tmp_path / "a.zarr"), unit=None)
    reader = info.reader
    # the negative control of the parametrisation: the direct path is really taken
    assert (reader.layout is not None) is (name in PLAIN)
    for rows, cols in _blocks(chunks):
        got = np.array(reader.block(rows, cols))  # copy: the buffer is reused
        want = z[slice(*rows), slice(*cols)]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=f"{rows} {cols}")
    # a block that is not one chunk goes through zarr
    got = reader.block((10, 200), (0, SHAPE[1]))
    np.testing.assert_array_equal(got, z[10:200, :])


def test_a_missing_chunk_reads_as_the_fill_value(tmp_path: Path) -> None:
    z = zarr.create_array(
        store=os.fspath(tmp_path / "a.zarr"), shape=SHAPE, chunks=(64, 70),
        dtype="float64", fill_value=7.5,
    )
    z[64:128, :] = 1.0  # only chunk (1, 0) is written
    _, info = open_input(os.fspath(tmp_path / "a.zarr"), unit=None)
    assert info.reader.layout is not None
    for rows, cols in _blocks((64, 70)):
        np.testing.assert_array_equal(
            info.reader.block(rows, cols), z[slice(*rows), slice(*cols)]
        )
    assert float(info.reader.block((0, 64), (0, 70))[0, 0]) == 7.5


def test_the_buffer_is_reused_so_a_block_is_valid_until_the_next_read(tmp_path: Path) -> None:
    z = _store(tmp_path / "a.zarr", "float32", (64, 70))
    _, info = open_input(os.fspath(tmp_path / "a.zarr"), unit=None)
    first = info.reader.block((0, 64), (0, 70))
    np.testing.assert_array_equal(first, z[0:64])
    info.reader.block((64, 128), (0, 70))
    # documented: the earlier view now shows the later chunk (no per-read allocation)
    np.testing.assert_array_equal(first, z[64:128])


@pytest.mark.parametrize("name", list(PLAIN) + list(THROUGH_ZARR))
def test_an_owned_block_is_zarrs_and_outlives_later_reads(tmp_path: Path, name: str) -> None:
    """``owned_block`` (a band held in worker memory) gives zarr's values bit for
    bit in a C-contiguous array of its own, decoded straight into it: a later
    read on the same thread leaves it as it was."""
    dtype, chunks, kw = {**PLAIN, **THROUGH_ZARR}[name]
    z = _store(tmp_path / "a.zarr", dtype, chunks, **kw)
    _, info = open_input(os.fspath(tmp_path / "a.zarr"), unit=None)
    reader = info.reader
    held = []
    for rows, cols in _blocks(chunks):
        block = reader.owned_block(rows, cols)
        assert block.flags.c_contiguous
        held.append((rows, cols, block))
        reader.block((0, chunks[0]), (0, chunks[1]))  # the thread's buffer, reused
    for rows, cols, block in held:
        np.testing.assert_array_equal(block, z[slice(*rows), slice(*cols)])
    # negative control: a block (not owned) of the first chunk, read before
    # another chunk, shows the later chunk (the buffer the owned blocks avoid)
    if reader.layout is not None:
        first = reader.block((0, chunks[0]), (0, chunks[1]))
        reader.block((chunks[0], 2 * chunks[0]), (0, chunks[1]))
        assert not np.array_equal(first, z[0 : chunks[0], 0 : chunks[1]])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "grown"])
@pytest.mark.parametrize("compressed", [True, False])
def test_a_damaged_chunk_gives_the_one_line_error(
    tmp_path: Path, damage: str, compressed: bool
) -> None:
    kw = {} if compressed else {"compressors": None}
    _store(tmp_path / "a.zarr", "float64", (64, 70), **kw)
    chunk = tmp_path / "a.zarr" / "c" / "1" / "0"
    raw = chunk.read_bytes()
    chunk.write_bytes(
        {"truncated": raw[: len(raw) // 2], "garbage": b"\x00" * len(raw), "grown": raw + b"x"}[damage]
    )
    _, info = open_input(os.fspath(tmp_path / "a.zarr"), unit=None)
    assert info.reader.layout is not None
    if damage == "garbage" and not compressed:
        # uncompressed zeros are valid data: read as zeros, like zarr
        np.testing.assert_array_equal(info.reader.block((64, 128), (0, 70)), 0.0)
        return
    with pytest.raises(StoreLayoutError) as err:
        info.reader.block((64, 128), (0, 70))
    msg = str(err.value)
    assert "cannot be read at rows 64:128, columns 0:70" in msg
    assert "a chunk is truncated or corrupted" in msg
    assert "\n" not in msg


class _CountingStore(LocalStore):
    """A LocalStore subclass that records the keys it is asked for (module level:
    the array may be pickled on the way, and a class defined in a test function
    would then come back with a copy of its closure)."""

    asked: ClassVar[list[str]] = []

    async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def]
        self.asked.append(key)
        return await super().get(key, prototype, byte_range)


def test_a_store_subclass_is_read_through_its_own_get(tmp_path: Path) -> None:
    """Only zarr's own LocalStore is read file by file; a subclass that changes
    how bytes are fetched (instrumentation, caching, decryption) is asked."""
    z = _store(tmp_path / "a.zarr", "float32", (64, 70))
    sub = zarr.open_array(store=_CountingStore(os.fspath(tmp_path / "a.zarr")), mode="r")
    _, info = open_input(sub, unit=None)
    assert info.reader.layout is not None
    _CountingStore.asked.clear()
    np.testing.assert_array_equal(info.reader.block((64, 128), (0, 70)), z[64:128])
    assert _CountingStore.asked == ["c/1/0"]
