"""Worker preload of the fault tests: chunk reads of stores named ``*slow.zarr`` are slow.

``dask worker --preload tests/cluster/slow_reads.py`` patches zarr's ``LocalStore.get``
and dplr's direct chunk read (``pipeline.io.inputs._chunk_bytes``) in the worker process: each chunk read of a store whose directory ends in
``slow.zarr`` sleeps ``DPLR_SLOW_READ_SECONDS`` (default 0.1) and leaves a marker
file in ``DPLR_SLOW_READ_MARKS``, a counter the test process can watch. Every
other store reads normally, so the other tests on the same cluster are unaffected.

With ``DPLR_SLOW_NOISE_MARKS`` set, each task of the step that adds a private
range sketch's noise (``pipeline.execution.source._block_noise_gram``) first
leaves a marker named ``<worker pid>-<random>`` there, then sleeps
``DPLR_SLOW_NOISE_SECONDS`` (default 1): the test can kill the very worker that
runs it.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from zarr.storage import LocalStore

# the preload may be imported more than once in a process: patch the original only
_original_get = getattr(LocalStore, "_dplr_original_get", LocalStore.get)
LocalStore._dplr_original_get = _original_get  # type: ignore[attr-defined]


async def _slow_get(self: LocalStore, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
    value = await _original_get(self, key, prototype, byte_range)
    if key.startswith("c/") and str(self.root).rstrip("/").endswith("slow.zarr"):
        await asyncio.sleep(float(os.environ.get("DPLR_SLOW_READ_SECONDS", "0.1")))
        marks = os.environ.get("DPLR_SLOW_READ_MARKS")
        if marks:
            Path(marks, uuid.uuid4().hex).touch()
    return value


# the pass tasks read the chunks of a plain local store directly, not via get()
import pipeline.io.inputs as _inputs

_original_chunk_bytes = getattr(_inputs, "_dplr_original_chunk_bytes", _inputs._chunk_bytes)
_inputs._dplr_original_chunk_bytes = _original_chunk_bytes  # type: ignore[attr-defined]


def _slow_chunk_bytes(store: Any, key: str) -> Any:
    value = _original_chunk_bytes(store, key)
    if key.startswith("c/") and str(store.root).rstrip("/").endswith("slow.zarr"):
        time.sleep(float(os.environ.get("DPLR_SLOW_READ_SECONDS", "0.1")))
        marks = os.environ.get("DPLR_SLOW_READ_MARKS")
        if marks:
            Path(marks, uuid.uuid4().hex).touch()
    return value


if os.environ.get("DPLR_SLOW_READ_MARKS"):  # only in the workers the test starts
    LocalStore.get = _slow_get  # type: ignore[method-assign]
    _inputs._chunk_bytes = _slow_chunk_bytes


# the noise step of a private release: a task tasks refer to by module and name
import pipeline.execution.source as _source

_original_noise_gram = getattr(_source, "_dplr_original_noise_gram", _source._block_noise_gram)
_source._dplr_original_noise_gram = _original_noise_gram  # type: ignore[attr-defined]


def _slow_noise_gram(y: Any, fn: Any, op: Any, start: int, stop: int) -> Any:
    marks = os.environ.get("DPLR_SLOW_NOISE_MARKS")
    if marks:
        Path(marks, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        time.sleep(float(os.environ.get("DPLR_SLOW_NOISE_SECONDS", "1")))
    return _original_noise_gram(y, fn, op, start, stop)


if os.environ.get("DPLR_SLOW_NOISE_MARKS"):
    _source._block_noise_gram = _slow_noise_gram
