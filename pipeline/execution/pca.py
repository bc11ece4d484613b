"""The PCA passes over a row-banded dask array (a :class:`RowSource` on Dask).

Graph of one pass (``A`` in full-width row bands ``c``)::

    payload          = (X, [(B_j, R_j)])                  inside each band task when small,
                                                          else one task fetched once per worker
    (part, c)        = band_pass(A[c], payload)           one task per band (consecutive row
                                                          chunks, about BAND_BYTES); reads it once
                                                          (with an inline payload the read is fused into it)
    total            = fixed tree-sum over c (fan-in 8)   delivered to the client

Nothing is added in the tasks: the noise is drawn on the client, by the core,
after the global sum (design 3.1). Per-row intermediates (``A_c X``, the clipped
rows) never leave the task that computes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

import dask.array as da
import numpy as np
import scipy.sparse as sp
from distributed import futures_of

from pipeline._types import FloatArray, Shape2D
from pipeline.algorithms.pca import Secret, band_pass
from pipeline.execution.cache import (
    CachePlan,
    plan_cache,
    stored_band_bytes,
    worker_memory_limits,
)
from pipeline.execution.progress import show_progress
from pipeline.execution.source import (
    add_tree_sum,
    check_indices_on_workers,
    concat_rows,
    layer_graph,
    row_bands,
    task_name,
)

__all__ = ["DaskRowSource"]


class _Payload:
    """Opaque holder, so the graph never parses released arrays as tasks."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


#: Payloads up to this size travel inside every band task instead of as one
#: shared task: a band task then depends on its read alone, so the graph
#: optimiser fuses the read into it (one task per band, no hand-over of the
#: band between tasks, or workers, in between).
INLINE_PAYLOAD_BYTES = 2**16


#: Target size (float64 bytes) of the row band one pass task handles: a dask
#: input with smaller row chunks has several consecutive chunks per task, so the
#: tasks and the tree scale with bands, not chunks (a Zarr input is already read
#: in bands of about this size, :func:`pipeline.io.open_input`).
BAND_BYTES = 64 * 2**20


def _nbytes(payload: Any) -> int:
    """Bytes of the arrays in a (nested tuple/list) payload."""
    if isinstance(payload, np.ndarray):
        return int(payload.nbytes)
    if isinstance(payload, (tuple, list)):
        return sum(_nbytes(p) for p in payload)
    return 0


def _band_kernel(
    block: Any, kind: str, holder: _Payload, bound: float, clip: bool
) -> FloatArray:
    return band_pass(block, kind, holder.value, bound, clip)


class DaskRowSource:
    """:class:`~pipeline.algorithms.pca.RowSource` over a dask array.

    Parameters
    ----------
    A : dask.array.Array of shape (n, d)
        Column-split inputs are rechunked to full-width bands (each band joins
        only the chunks of its own rows; not a shuffle).
    client : distributed.Client
    row_norm_bound : float
        Public ``C`` (rows are divided by it before clipping).
    clip : bool
        False for the non-private variant.
    progress : text stream or None
    cache : {"never", "auto", "always"}
        Whether the first pass keeps its row bands in worker memory for the later
        passes (:mod:`pipeline.execution.cache`), decided here before anything is
        read; :attr:`cache_plan` says what was decided, :meth:`close` releases
        the bands.
    reader : object or None
        A CSR store's reader behind ``A`` (:class:`~pipeline.io.csr.CsrReader`):
        its row pointers size the bands for the cache decision.
    """

    def __init__(
        self,
        A: da.Array,
        client: Any,
        *,
        row_norm_bound: float = 1.0,
        clip: bool = True,
        progress: TextIO | None = None,
        cache: str = "never",
        reader: Any = None,
    ) -> None:
        if A.numblocks[1] > 1:
            A = A.rechunk({1: -1})
        self.A = A
        self.client = client
        self.row_norm_bound = float(row_norm_bound)
        self.clip = clip
        self.progress = progress
        # a sparse input's pass takes a time that grows with its stored entries
        self.dense = not sp.issparse(getattr(A, "_meta", None))
        check_indices_on_workers(client, reader, A.chunks[0])
        self.n_passes = 0
        self.n_tasks = 0
        self._held: da.Array | None = None
        self.cache_plan: CachePlan = self._plan_cache(cache, reader)

    def _plan_cache(self, mode: str, reader: Any) -> CachePlan:
        """The cache decision from the bands' sizes (before any read): public
        ones for a dense input, stored ones for a sparse store (never published)."""
        if mode == "never":
            return plan_cache(mode, [], [])
        A, limits = self.A, worker_memory_limits(self.client)
        if not self.dense:
            sizes = stored_band_bytes(reader, A.chunks[0], self._bands)
            return plan_cache(mode, sizes, limits, dense=False)
        row = int(A.shape[1]) * np.dtype(A.dtype).itemsize
        return plan_cache(mode, [sum(A.chunks[0][a:b]) * row for a, b in self._bands],
                          limits)  # fmt: skip

    @property
    def shape(self) -> Shape2D:
        return int(self.A.shape[0]), int(self.A.shape[1])

    @property
    def n_bands(self) -> int:
        return len(self._bands)

    @property
    def _bands(self) -> list[tuple[int, int]]:
        return row_bands(self.A.chunks, BAND_BYTES)

    def _band(self, a: int, b: int) -> Any:
        if b - a == 1:
            return (self.A.name, a, 0)
        return (concat_rows, [(self.A.name, r, 0) for r in range(a, b)], a, 0)

    def _hold(self) -> None:
        """Submit the bands as tasks whose results the client holds (once: the
        first pass computes them, the later ones find them in memory)."""
        if not self.cache_plan.used or self._held is not None:
            return
        A, name = self.A, task_name("pca-band")
        layer = {(name, c, 0): self._band(a, b) for c, (a, b) in enumerate(self._bands)}
        brows = tuple(sum(A.chunks[0][a:b]) for a, b in self._bands)
        held = da.Array(
            layer_graph(name, layer, dependencies=[A]), name,
            chunks=(brows, A.chunks[1]), meta=A._meta,
        )  # fmt: skip
        self._held = self.client.persist(held)

    def close(self) -> None:
        """Release the held bands (when the job ends)."""
        if self._held is not None:
            for future in futures_of(self._held):
                future.release()
            self._held = None

    def _pass(
        self, kind: str, payload: Any, out_shape: tuple[int, int], label: str
    ) -> Secret:
        A = self.A
        self._hold()
        layer: dict[Any, Any] = {}
        pay: Any = _Payload(payload)
        if _nbytes(payload) > INLINE_PAYLOAD_BYTES:
            pay_key = (task_name("payload"),)
            layer[pay_key] = pay
            pay = pay_key
        pname, oname = task_name(f"pca-{kind}"), task_name(f"pca-{kind}-sum")
        leaves = []
        for c, (a, b) in enumerate(self._bands):
            layer[(pname, c)] = (
                _band_kernel,
                self._band(a, b) if self._held is None else (self._held.name, c, 0),
                kind,
                pay,
                self.row_norm_bound,
                self.clip,
            )
            leaves.append((pname, c))
        add_tree_sum(layer, oname, (oname, 0, 0), leaves, None)
        deps = [A] if self._held is None else [A, self._held]
        graph = layer_graph(oname, layer, dependencies=deps)
        total = da.Array(
            graph, oname, chunks=((out_shape[0],), (out_shape[1],)), dtype=np.float64
        )
        self.n_tasks += len(layer)
        self.n_passes += 1
        # one round trip: the reduced (small) result comes back with the pass
        future = self.client.compute(total)
        show_progress(
            self.client,
            [future],
            f"{label}: {self.n_bands} row bands",
            self.progress,
            timed=self.dense,
        )
        return Secret(np.asarray(future.result()))

    def gram(self) -> Secret:
        d = self.shape[1]
        return self._pass("gram", None, (d, d), "Gram pass")

    def products(self, X: FloatArray) -> Secret:
        k = X.shape[1]
        return self._pass("products", np.ascontiguousarray(X), (k, k), "products pass")

    def power_step(
        self, X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
    ) -> Secret:
        payload = (
            np.ascontiguousarray(X),
            [(np.ascontiguousarray(B), float(R)) for B, R in trials],
        )
        return self._pass("update", payload, (self.shape[1], X.shape[1]), "power pass")
