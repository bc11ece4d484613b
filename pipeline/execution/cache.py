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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pipeline.errors import InvalidParameterError

__all__ = ["CACHE_FRACTION", "CachePlan", "plan_cache", "worker_memory_limits"]

#: Share of each worker's memory limit the held bands may take. Dask starts
#: spilling a worker's results to disk at 60% of its limit; the rest of the
#: margin is for a pass's own memory (a band's float64 copy, partial sketches,
#: the tall sketches), and for an uneven placement of the bands.
CACHE_FRACTION = 0.5


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
    """

    mode: str
    used: bool
    reason: str
    n_bands: int = 0
    band_bytes: int = 0
    per_worker_bytes: int = 0
    budget_bytes: int = 0
    n_workers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The plan as a report's ``cache`` entry (with the margin used)."""
        return {**dataclasses.asdict(self), "fraction": CACHE_FRACTION}


def plan_cache(
    mode: str,
    band_bytes: Sequence[int],
    memory_limits: Sequence[int],
    *,
    dense: bool = True,
) -> CachePlan:
    """Decide whether the bands are held, from public sizes and limits.

    The bands fit when each worker's even share of them (rounded up, each at
    the size of the largest band) is at most :data:`CACHE_FRACTION` of the
    smallest worker memory limit.

    Parameters
    ----------
    mode : {"auto", "never", "always"}
    band_bytes : sequence of int
        The size of each band of one pass, from the shape, the chunking and the
        item size alone.
    memory_limits : sequence of int
        Each worker's memory limit in bytes (0 or less: none stated).
    dense : bool
        False for sparse input, whose band sizes depend on its non-zeros (data):
        never held.

    Returns
    -------
    CachePlan

    Raises
    ------
    InvalidParameterError
        ``mode="always"`` and the bands cannot be held (before anything is read).
    """
    n_bands, n_workers = len(band_bytes), len(memory_limits)
    total = int(sum(band_bytes))
    share = math.ceil(n_bands / n_workers) if n_workers else n_bands
    per_worker = share * max(band_bytes, default=0)
    limit = min(memory_limits, default=0)
    budget = int(CACHE_FRACTION * limit) if limit > 0 else 0
    sizes = {
        "n_bands": n_bands, "band_bytes": total, "per_worker_bytes": per_worker,
        "budget_bytes": budget, "n_workers": n_workers,
    }  # fmt: skip
    if mode == "never":
        return CachePlan(mode, False, "not asked (cache='never')", **sizes)
    if not dense:
        reason = "a sparse input's band sizes depend on its non-zeros"
    elif n_workers == 0 or limit <= 0:
        reason = "a worker states no memory limit"
    elif per_worker > budget:
        reason = (
            f"the bands need {per_worker} bytes per worker, above "
            f"{CACHE_FRACTION:g} of the smallest worker memory limit ({budget} bytes)"
        )
    else:
        return CachePlan(mode, True, "the bands fit in the workers' memory", **sizes)
    if mode == "always":
        raise InvalidParameterError(
            f"cache='always' cannot hold the input's row bands in the workers' "
            f"memory: {reason}. Nothing was read or charged; use cache='auto' or "
            "'never', or workers with more memory."
        )
    return CachePlan(mode, False, reason, **sizes)


def worker_memory_limits(client: Any) -> list[int]:
    """The memory limit of each worker of ``client``'s cluster, in bytes (0: none)."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return [int(w.get("memory_limit") or 0) for w in workers.values()]
