"""Sketching a turnstile batch's partitions on Dask, with the sketch seed kept out of the graph.

A clipped batch is split into row ranges (:func:`pipeline.algorithms.continual.partition_cells`);
each range is one task that regenerates only the operator tiles its cells touch
and returns its :class:`~pipeline.algorithms.continual.SketchDelta`. The client
adds the deltas (they touch disjoint rows of the tall sketches).

The sketch seed is confidential until release [spec sketch-lrf 4.6, item 4]. It
never enters a task's arguments or key: tasks carry a sealed reference, and the
seed reaches the workers in a worker plugin for the duration of one ingest
(:mod:`pipeline.execution.secrets`), so a task retried on a replacement worker
regenerates the same operators.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence

from distributed import Client, wait
from distributed.client import FuturesCancelledError

from pipeline._sealed import Sealed
from pipeline._types import FloatArray, IntArray
from pipeline.algorithms.continual import (
    SketchDelta,
    StreamPlan,
    operators,
    sketch_cells,
)
from pipeline.execution.secrets import install_secret, remove_secret

__all__ = ["sketch_partitions"]

Part = tuple[IntArray, IntArray, FloatArray]
_ATTEMPTS = 3  # scatters of a part whose data died with its worker


def _sketch_on_worker(plan: StreamPlan, seed: Sealed, part: Part) -> SketchDelta:
    return sketch_cells(plan, operators(plan, seed), *part)


def sketch_partitions(
    plan: StreamPlan,
    sketch_seed: int,
    parts: Sequence[Part],
    client: Client | None = None,
) -> list[SketchDelta]:
    """The sketch deltas of ``parts``, on ``client``'s workers or in this process.

    Parameters
    ----------
    plan : StreamPlan
    sketch_seed : int
        The stream's sketch seed (never put into a task).
    parts : sequence of (rows, cols, vals)
        Clipped cells of the oriented matrix, one row range each.
    client : distributed.Client or None
        None runs the parts here, one after the other: the kernels (Philox
        generation, sparse products) hold the GIL, so threads would not help.

    Returns
    -------
    list of SketchDelta, one per part, in order.
    """
    if client is None or len(parts) <= 1:
        ops = operators(plan, sketch_seed)
        return [sketch_cells(plan, ops, *p) for p in parts]
    sealed, plugin = install_secret(client, sketch_seed)
    try:
        results: list[SketchDelta | None] = [None] * len(parts)
        todo = list(range(len(parts)))
        for _ in range(_ATTEMPTS):
            # the cells are scattered (not embedded in the graph); a part whose
            # scattered cells died with their worker is scattered again
            data = client.scatter([parts[k] for k in todo], hash=False)
            futures = {
                k: client.submit(
                    _sketch_on_worker,
                    plan,
                    sealed,
                    d,
                    key=f"dplr-stream-part-{uuid.uuid4().hex}",
                    pure=False,
                )
                for k, d in zip(todo, data, strict=True)
            }
            with contextlib.suppress(
                FuturesCancelledError
            ):  # looked at one by one below
                wait(list(futures.values()))
            lost = []
            for k, f in futures.items():
                if f.status == "finished":
                    results[k] = f.result()
                elif f.status == "error":
                    f.result()  # a bug in the kernel: raise it
                else:
                    lost.append(k)
            todo = lost
            if not todo:
                return [r for r in results if r is not None]
        raise RuntimeError(
            f"{len(todo)} part(s) of the batch were lost {_ATTEMPTS} times with their workers; "
            "nothing was applied. Check the cluster and retry."
        )
    finally:
        remove_secret(client, plugin)
