"""Direct chunk reads (pipeline.io.chunkio) against zarr's own reads of the same
arrays: the same values for every codec it takes, and zarr's path for the others."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

from pipeline.errors import StoreLayoutError
from pipeline.io.chunkio import plain_layout, read_range
from pipeline.io.csr import WRITE_CODEC, open_csr, write_csr

CODECS = {
    "none": None,
    "zstd": ZstdCodec(level=0),
    "blosc-lz4": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    "blosc-zstd-bitshuffle": BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),
}


def _array(path: Path, values: np.ndarray, codec: object, chunk: int) -> zarr.Array:
    z = zarr.create_array(
        store=str(path), shape=values.shape, dtype=values.dtype, chunks=(chunk,),
        compressors=codec, fill_value=7,
    )  # fmt: skip
    z[:] = values
    return z


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_ranges_read_directly_equal_zarrs(
    tmp_path: Path, global_seed: int, codec: str, dtype: type
) -> None:
    rng = np.random.default_rng(global_seed)
    values = (rng.standard_normal(1000) * 1000).astype(dtype)
    z = _array(tmp_path / "a.zarr", values, CODECS[codec], 64)  # the last chunk partial
    lay = plain_layout(z)
    assert lay is not None
    assert lay.codec == (None if codec == "none" else codec.split("-")[0])
    ranges = [(0, 1000), (0, 64), (3, 61), (60, 700), (64, 128), (999, 1000), (5, 5)]
    for lo, hi in ranges:
        got = read_range(lay, lo, hi)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, z[lo:hi])  # same bytes decoded: bit for bit
    # negative control: a neighbouring range differs
    assert not np.array_equal(read_range(lay, 1, 101), z[0:100])


def test_a_chunk_never_written_reads_as_the_fill_value(tmp_path: Path) -> None:
    z = zarr.create_array(
        store=str(tmp_path / "a.zarr"), shape=(200,), dtype=np.int64, chunks=(50,),
        compressors=WRITE_CODEC, fill_value=7,
    )  # fmt: skip
    z[0:50] = np.arange(50)
    lay = plain_layout(z)
    assert lay is not None
    np.testing.assert_array_equal(read_range(lay, 40, 120), z[40:120])
    assert (read_range(lay, 50, 200) == 7).all()


def test_other_codecs_and_stores_are_left_to_zarr(tmp_path: Path) -> None:
    values = np.arange(100, dtype=np.float64)
    assert plain_layout(_array(tmp_path / "g.zarr", values, GzipCodec(), 10)) is None
    mem = zarr.create_array(store={}, shape=(10,), dtype=np.float64, chunks=(5,))
    assert plain_layout(mem) is None


def test_a_csr_store_written_by_dplr_is_read_directly(
    tmp_path: Path, global_seed: int
) -> None:
    x = sp.random(300, 40, density=0.1, random_state=global_seed, format="csr")
    write_csr(tmp_path / "x.zarr", x, chunk_nnz=97)
    group = zarr.open_group(str(tmp_path / "x.zarr"), mode="r")
    for name in ("indptr", "indices", "data"):
        codecs = group[name].metadata.codecs
        assert isinstance(codecs[1], BloscCodec)
        assert codecs[1].cname.value == "lz4"
    reader = open_csr(tmp_path / "x.zarr")
    assert all(lay is not None for lay in reader.direct.values())
    for r0, r1 in [(0, 300), (17, 18), (100, 251)]:
        band = reader.band(r0, r1)
        assert (band != x[r0:r1]).nnz == 0


@pytest.mark.parametrize("codec", ["zstd", "blosc-lz4"])
def test_a_truncated_chunk_read_directly_is_one_line(
    tmp_path: Path, codec: str
) -> None:
    """zstd frames carry their size; a Blosc frame's header is checked against
    its length (the decoder trusts it, and zarr reads such a chunk silently)."""
    values = np.arange(1000, dtype=np.float64)
    z = _array(tmp_path / "a.zarr", values, CODECS[codec], 100)
    lay = plain_layout(z)
    assert lay is not None
    np.testing.assert_array_equal(read_range(lay, 150, 450), values[150:450])
    chunk = tmp_path / "a.zarr" / "c" / "2"
    chunk.write_bytes(chunk.read_bytes()[:-5])
    with pytest.raises((ValueError, RuntimeError)):  # numcodecs raises RuntimeError
        read_range(lay, 150, 450)
    np.testing.assert_array_equal(read_range(lay, 0, 200), values[:200])  # control


def test_a_truncated_csr_chunk_is_one_line(tmp_path: Path) -> None:
    x = sp.random(300, 40, density=0.1, random_state=0, format="csr")
    write_csr(tmp_path / "x.zarr", x, chunk_nnz=97)
    chunk = tmp_path / "x.zarr" / "data" / "c" / "2"
    chunk.write_bytes(chunk.read_bytes()[:-5])
    reader = open_csr(tmp_path / "x.zarr")
    with pytest.raises(StoreLayoutError) as info:
        reader.band(0, 300)
    message = str(info.value)
    assert "\n" not in message
    assert "(data, ValueError)" in message
    assert "truncated" in message
    reader.band(0, 1)  # control: the rows before that chunk still read
