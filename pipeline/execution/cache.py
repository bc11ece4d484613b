"""Whether a job keeps the row bands it read in the workers' memory.

A pass source (:class:`~pipeline.execution.source.DaskSource`,
:class:`~pipeline.execution.pca.DaskRowSource`) may keep the bands its first pass
reads as persisted dask results, held by the client for the job's lifetime, so
that its later passes (the two-pass release's second pass, every power
iteration, a selection's candidates) read them from memory instead of the store.
The bands are the same bytes either way, and each pass runs the same
computation on them, so the release does not change.

The decision is taken once, before the first read, from public values alone:
the bands' sizes (shape, dtype, chunking) and the workers' memory limits. A
worker lost while it holds bands costs their recomputation from the store (dask
keeps their lineage while the client holds them).

A sparse input's bands have sizes that count its stored entries, a statistic
of the data. Its decision is taken from those sizes (a CSR store's row
pointers at the bands' edges, checked by its validation before anything else)
inside the trusted zone,
like any other use of ``nnz`` that sizes work, and it is not published: the
report states the mode asked and that the decision is withheld, and neither
the report nor the progress states a duration (docs/privacy.md, "Times"), so
nothing published tells whether the bands were held. ``always`` holds a sparse
input's bands without a check (a refusal would be a data-dependent message);
a dask array of sparse chunks, whose sizes are unknown before it is computed,
is held only under ``always``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.errors import InvalidParameterError

__all__ = [
    "CACHE_FRACTION",
    "SPARSE_REASON",
    "CachePlan",
    "plan_cache",
    "stored_band_bytes",
    "worker_memory_limits",
]

#: Share of each worker's memory limit the held bands may take. Dask starts
#: spilling a worker's results to disk at 60% of its limit; the rest of the
#: margin is for a pass's own memory (a band's float64 copy, partial sketches,
#: the tall sketches), and for an uneven placement of the bands.
CACHE_FRACTION = 0.5
#: What a sparse input's report says of its decision (module docstring).
SPARSE_REASON = (
    "withheld: a sparse input's bands are held when their stored entries fit in "
    "the workers' memory, and their size is a count of the data"
)


@dataclasses.dataclass(frozen=True, slots=True)
class CachePlan:
    """The cache decision of one job, from public values; stated in its report.

    Attributes
    ----------
    mode : {"auto", "never", "always"}
        What was asked (``Runtime.cache``).
    used : bool
        Whether the bands are held.
    reason : str
        Why (public words).
    n_bands : int
        Bands (tasks) of one pass.
    band_bytes : int
        Bytes of all bands as read (shape times the input's item size).
    per_worker_bytes : int
        What one worker holds when the bands are spread evenly: its share of
        the bands, rounded up, times the largest band.
    budget_bytes : int
        :data:`CACHE_FRACTION` of the smallest worker memory limit (0: a
        worker states no limit).
    n_workers : int
    published : bool
        False for a sparse input: the decision and the sizes are data
        (module docstring) and :meth:`to_dict` withholds them.
    """

    mode: str
    used: bool
    reason: str
    n_bands: int = 0
    band_bytes: int = 0
    per_worker_bytes: int = 0
    budget_bytes: int = 0
    n_workers: int = 0
    published: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The plan as a report's ``cache`` entry (with the margin used); a
        sparse input's states the mode and the margin only."""
        if not self.published:
            return {"mode": self.mode, "used": None, "reason": self.reason,
                    "fraction": CACHE_FRACTION}  # fmt: skip
        fields = dataclasses.asdict(self)
        del fields["published"]
        return {**fields, "fraction": CACHE_FRACTION}


def plan_cache(
    mode: str,
    band_bytes: Sequence[int] | None,
    memory_limits: Sequence[int],
    *,
    dense: bool = True,
) -> CachePlan:
    """Decide whether the bands are held, from their sizes and the limits.

    The bands fit when each worker's even share of them (rounded up, each at
    the size of the largest band) is at most :data:`CACHE_FRACTION` of the
    smallest worker memory limit.

    Parameters
    ----------
    mode : {"auto", "never", "always"}
    band_bytes : sequence of int or None
        The size of each band of one pass: for a dense input from the shape,
        the chunking and the item size alone; for a sparse one as stored
        (:func:`stored_band_bytes`), or None when unknown.
    memory_limits : sequence of int
        Each worker's memory limit in bytes (0 or less: none stated).
    dense : bool
        False for sparse input: decided from its stored sizes, never refused,
        and not published (module docstring).

    Returns
    -------
    CachePlan

    Raises
    ------
    InvalidParameterError
        ``mode="always"``, a dense input and bands that cannot be held (before
        anything is read).
    """
    sizes = _sizes(band_bytes or [], memory_limits)
    if mode == "never":
        return _plan(mode, False, "not asked (cache='never')", sizes)
    if not dense:
        fit = band_bytes is not None and _fits(sizes) is None
        return CachePlan(mode, mode == "always" or fit, SPARSE_REASON, published=False)
    reason = _fits(sizes)
    if reason is None:
        return _plan(mode, True, "the bands fit in the workers' memory", sizes)
    if mode == "always":
        raise InvalidParameterError(
            f"cache='always' cannot hold the input's row bands in the workers' "
            f"memory: {reason}. Nothing was read or charged; use cache='auto' or "
            "'never', or workers with more memory."
        )
    return _plan(mode, False, reason, sizes)


def _plan(mode: str, used: bool, reason: str, sizes: dict[str, int]) -> CachePlan:
    return CachePlan(
        mode, used, reason, n_bands=sizes["n_bands"], band_bytes=sizes["band_bytes"],
        per_worker_bytes=sizes["per_worker_bytes"],
        budget_bytes=sizes["budget_bytes"], n_workers=sizes["n_workers"],
    )  # fmt: skip


def _sizes(band_bytes: Sequence[int], memory_limits: Sequence[int]) -> dict[str, int]:
    """The plan's sizes: bands, their total, one worker's share, the budget."""
    n_bands, n_workers = len(band_bytes), len(memory_limits)
    share = math.ceil(n_bands / n_workers) if n_workers else n_bands
    limit = min(memory_limits, default=0)
    return {
        "n_bands": n_bands,
        "band_bytes": int(sum(band_bytes)),
        "per_worker_bytes": share * max(band_bytes, default=0),
        "budget_bytes": int(CACHE_FRACTION * limit) if limit > 0 else 0,
        "n_workers": n_workers,
    }


def _fits(sizes: dict[str, int]) -> str | None:
    """None when the bands fit the budget, else why not (public words)."""
    if sizes["n_workers"] == 0 or sizes["budget_bytes"] <= 0:
        return "a worker states no memory limit"
    if sizes["per_worker_bytes"] > sizes["budget_bytes"]:
        return (
            f"the bands need {sizes['per_worker_bytes']} bytes per worker, above "
            f"{CACHE_FRACTION:g} of the smallest worker memory limit "
            f"({sizes['budget_bytes']} bytes)"
        )
    return None


def stored_band_bytes(
    reader: Any,
    row_chunks: Sequence[int],
    bands: Sequence[tuple[int, int]],
    *,
    value_bytes: int = 0,
) -> list[int] | None:
    """The bytes of each band of a CSR store as a pass holds it (values, column
    indices, row pointers), or None when ``reader`` is not a CSR store's.

    ``bands`` are ranges ``[a, b)`` of the row chunks ``row_chunks``; only the
    row pointers at the bands' edges are read. ``value_bytes``: the values
    counted at least this wide (a band held once prepared, in float64). A
    count of the data: for :func:`plan_cache` only, never published.
    """
    if not hasattr(reader, "row_pointers"):
        return None
    offsets = np.cumsum((0, *row_chunks))
    edges = sorted({int(offsets[i]) for band in bands for i in band})
    at = {r: int(reader.row_pointers(r, r)[0]) for r in edges}
    entry = (
        max(np.dtype(reader.dtype).itemsize, value_bytes)
        + np.dtype(reader.indices.dtype).itemsize
    )
    return [
        (at[int(offsets[b])] - at[int(offsets[a])]) * entry
        + (int(offsets[b] - offsets[a]) + 1) * 8
        for a, b in bands
    ]


def worker_memory_limits(client: Any) -> list[int]:
    """The memory limit of each worker of ``client``'s cluster, in bytes (0: none)."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return [int(w.get("memory_limit") or 0) for w in workers.values()]
