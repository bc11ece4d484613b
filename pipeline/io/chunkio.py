"""Direct reads of the chunks of plain local Zarr v3 arrays.

Problem. zarr's general read path (an asyncio codec pipeline, fresh buffers,
copies into the selection) costs a pass task more than decoding the chunk
itself: about 1.8x per chunk of a dense store, and 2-4x per row band of a CSR
store read in a single-threaded worker (the pipeline's concurrency helps only
when a core is idle, which in a pass it is not).

Solution. For the common layout -- a Zarr v3 array in a local directory, a
regular chunk grid, no sharding nor storage transformer, the ``bytes`` codec in
native order, optionally followed by ``zstd`` or ``blosc`` -- the chunk files
are read and decoded here, by the decoders zarr's own codecs call
(``numcodecs``), into per-thread buffers or straight into the result. Any other
array (object storage, sharded, other codecs) is read through zarr.

A chunk that was never written reads as the fill value, as zarr reads it; a
chunk whose bytes do not decode to the chunk's size raises (the callers turn it
into one line naming the array).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from numcodecs import Blosc, Zstd
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.core.sync import sync
from zarr.storage import LocalStore

__all__ = [
    "PlainLayout",
    "chunk_bytes",
    "decode_chunk",
    "plain_layout",
    "read_buffer_bytes",
    "read_range",
    "release_read_buffers",
    "thread_buffer",
]

#: The decoders zarr's ``zstd`` and ``blosc`` codecs use, by codec name. Blosc
#: frames describe themselves (type size, shuffle, compressor), so one decoder
#: reads any of them.
_DECODERS: dict[str, Any] = {"zstd": Zstd(), "blosc": Blosc()}
_CODECS: tuple[tuple[type, str], ...] = ((ZstdCodec, "zstd"), (BloscCodec, "blosc"))


@dataclass(frozen=True, slots=True)
class PlainLayout:
    """Where and how the chunks of a plain Zarr v3 array are stored."""

    store: Any  # the zarr store
    prefix: str  # the array's key prefix in the store
    chunks: tuple[int, ...]
    dtype: np.dtype
    codec: str | None  # "zstd", "blosc", or None (uncompressed)
    fill_value: Any
    metadata: Any  # the array's metadata: encodes chunk keys

    @property
    def chunk_nbytes(self) -> int:
        """The decoded size of one chunk (edge chunks are stored whole)."""
        return int(np.prod(self.chunks)) * self.dtype.itemsize

    def key(self, coords: tuple[int, ...]) -> str:
        """The store key of the chunk at grid position ``coords``."""
        return f"{self.prefix}{self.metadata.encode_chunk_key(coords)}"


def plain_layout(z: zarr.Array[Any]) -> PlainLayout | None:
    """The layout of ``z`` if its chunks can be read directly (module
    docstring), else None."""
    m = z.metadata
    if (
        m.zarr_format != 3
        or not isinstance(z.store, LocalStore)
        or not isinstance(m.chunk_grid, RegularChunkGrid)
        or getattr(m, "storage_transformers", None)
        or z.shards is not None
    ):
        return None
    codecs = tuple(m.codecs)
    dtype = np.dtype(z.dtype)
    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return None
    endian = codecs[0].endian
    if dtype.itemsize > 1 and (endian is None or endian.value != sys.byteorder):
        return None
    codec = None
    if len(codecs) == 2:
        names = [name for kind, name in _CODECS if isinstance(codecs[1], kind)]
        if not names:
            return None
        codec = names[0]
    return PlainLayout(
        store=z.store,
        prefix=f"{z.path}/" if z.path else "",
        chunks=tuple(int(c) for c in z.chunks),
        dtype=dtype.newbyteorder("="),
        codec=codec,
        fill_value=z.fill_value,
        metadata=m,
    )


#: Buffers of the direct reads (compressed bytes, decoded chunk), per thread;
#: freed by :func:`release_read_buffers` when a job ends.
_BUFFERS: dict[tuple[int, str], bytearray] = {}
_BUFFERS_LOCK = threading.Lock()


def thread_buffer(name: str, nbytes: int) -> bytearray:
    """This thread's buffer ``name`` of at least ``nbytes``.

    A buffer that is too small is dropped *before* the larger one is made (two
    live at once would double the peak), and grows with 1/32 headroom: the
    compressed sizes of a store's chunks differ by a little, and each new
    largest one would otherwise cost a reallocation.
    """
    key = (threading.get_ident(), name)
    with _BUFFERS_LOCK:
        buf = _BUFFERS.get(key)
        if buf is not None and len(buf) >= nbytes:
            return buf
        _BUFFERS.pop(key, None)
    del buf
    fresh = bytearray(nbytes + nbytes // 32)
    with _BUFFERS_LOCK:
        _BUFFERS[key] = fresh
    return fresh


def read_buffer_bytes() -> int:
    """The bytes of this process's direct-read buffers."""
    with _BUFFERS_LOCK:
        return sum(len(b) for b in _BUFFERS.values())


def release_read_buffers() -> int:
    """Free this process's direct-read buffers; returns the bytes freed.

    Run on every worker when a job is done (``DaskSource.close``), so a worker
    holds no read buffer (about two chunks per thread) between jobs.
    """
    with _BUFFERS_LOCK:
        freed = sum(len(b) for b in _BUFFERS.values())
        _BUFFERS.clear()
    return freed


def chunk_bytes(store: Any, key: str) -> memoryview | None:
    """The stored bytes of chunk ``key``, or None if it was never written.

    A plain local directory store's file is read into a buffer of this thread
    (a fresh 40 MB ``bytes`` per chunk costs its page faults every time); the
    view is valid until this thread's next read. Other stores, subclasses of
    ``LocalStore`` included, answer through their ``get``.
    """
    if type(store) is LocalStore:  # a subclass may fetch its bytes otherwise
        path = os.path.join(str(store.root), *key.split("/"))
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            raw = memoryview(thread_buffer("raw", size))[:size]
            if fh.readinto(raw) != size:
                raise OSError("short read")
            return raw
    got = sync(store.get(key, default_buffer_prototype()))
    return None if got is None else memoryview(got.as_numpy_array())


def decode_chunk(lay: PlainLayout, raw: memoryview | None, out: np.ndarray) -> None:
    """Decode one chunk's stored bytes ``raw`` into ``out`` (uint8, exactly
    :attr:`PlainLayout.chunk_nbytes`); None (never written): the fill value."""
    if raw is None:
        out.view(lay.dtype).fill(lay.fill_value)
        return
    if lay.codec is None:
        if len(raw) != out.nbytes:
            raise ValueError("chunk size")
        out[:] = np.frombuffer(raw, dtype=np.uint8)
        return
    if lay.codec == "blosc":
        _check_blosc_frame(raw, out.nbytes)
    if np.asarray(_DECODERS[lay.codec].decode(raw, out=out)).nbytes != out.nbytes:
        raise ValueError("decoded size")


def _check_blosc_frame(raw: memoryview, nbytes: int) -> None:
    """Refuse a Blosc frame whose header does not match its length or the
    chunk: the decoder trusts the header and would read past a truncated
    frame (zarr's own path reads such a chunk without an error)."""
    head = bytes(raw[:16])
    if (
        len(head) < 16
        or int.from_bytes(head[4:8], "little") != nbytes
        or int.from_bytes(head[12:16], "little") != len(raw)
    ):
        raise ValueError("blosc frame size")


def read_range(lay: PlainLayout, lo: int, hi: int) -> np.ndarray:
    """Entries ``[lo, hi)`` of the 1-D array of layout ``lay``, as a fresh array.

    Whole chunks decode straight into the result; the partial ones at either
    end go through this thread's chunk buffer.
    """
    (step,) = lay.chunks
    out = np.empty(max(hi - lo, 0), dtype=lay.dtype)
    if hi <= lo:
        return out
    flat = out.view(np.uint8)
    size = lay.dtype.itemsize
    for c in range(lo // step, (hi - 1) // step + 1):
        c0, c1 = c * step, (c + 1) * step
        a, b = max(c0, lo), min(c1, hi)
        raw = chunk_bytes(lay.store, lay.key((c,)))
        if a == c0 and b == c1:
            decode_chunk(lay, raw, flat[(a - lo) * size : (b - lo) * size])
            continue
        buf = np.frombuffer(
            thread_buffer("chunk", lay.chunk_nbytes), dtype=np.uint8,
            count=lay.chunk_nbytes,
        )  # fmt: skip
        decode_chunk(lay, raw, buf)
        out[a - lo : b - lo] = buf.view(lay.dtype)[a - c0 : b - c0]
    return out
