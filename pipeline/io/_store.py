"""Writing a tall dask array into a Zarr array, with nothing left running after.

Problem. A release or a journal entry is written under a temporary name that the
caller removes when the write fails. dask's ``store`` on a distributed client
raises at the first failed chunk while the other chunk writes go on on the
workers; one that lands after the removal recreates the directories of its chunk
(zarr's local store makes the parents of a chunk file), and a hidden half-group
stays beside the output. So every chunk write is its own future here, and the
call returns or raises only once all of them have finished or failed.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import numpy as np


def _write_block(
    z: Any, block: np.ndarray, block_info: dict[Any, Any] | None = None
) -> np.ndarray:
    """Write one block where it belongs in ``z``; a (1, 1) token."""
    assert block_info is not None
    (r0, r1), (c0, c1) = block_info[0]["array-location"]
    z[r0:r1, c0:c1] = block
    return np.zeros((1, 1))


def store_array(x: Any, z: Any, client: Any) -> None:
    """Write the 2-D dask array ``x`` into the Zarr array ``z`` of the same shape.

    The chunks of ``x`` must be unions of whole chunks of ``z`` (no two tasks
    write one chunk). With a client, wait for every chunk write to settle, then
    raise the first failure in block order, if any.
    """
    import dask.array as da  # heavy: dask, kept off the stream state's import path

    if client is None:
        da.store(x, z, lock=False)  # no cluster: dask's in-process scheduler
        return
    tokens = x.map_blocks(
        functools.partial(_write_block, z),
        dtype=np.float64,
        chunks=((1,) * x.numblocks[0], (1,) * x.numblocks[1]),
        meta=np.empty((0, 0)),
        name=f"dplr-store-{uuid.uuid4().hex}",  # a new write, never a cached one
    )
    futures = client.compute(list(tokens.to_delayed().ravel()))
    try:
        client.gather(futures, errors="skip")  # returns once all have settled
        for future in futures:  # block order: the failure reported is reproducible
            if future.status != "finished":
                future.result()  # raises the task's exception (or CancelledError)
    finally:
        client.cancel(futures)
