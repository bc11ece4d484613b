"""A :class:`~pipeline.algorithms.base.MatrixSource` over a chunked dask array.

Graph of one pass (``A`` with row blocks r and column blocks c)::

    (partial, r, c) = block_partials(A[r, c], ...)     one task per chunk; reads it once
    Y[r]  = tree-sum over c of partial[r, c][i]        tall right sketches, stay distributed
    Z[c]  = tree-sum over r of partial[r, c][j]        left sketches, gathered (small)
    W     = tree-sum over all (r, c)                   two-sided sketches, gathered

The reduction trees have a fixed shape (fan-in :data:`SPLIT_EVERY`), so for a
fixed chunking the floating-point summation order -- hence the result, bit for
bit -- does not depend on the number of workers or on retries.

Tall objects (``Y``, its orthonormal basis) have one block per row block of the
input. By default they stay in the workers' memory. Given a ``scratch``
directory that every worker can reach, each task writes its block there as a
``.npy`` file instead and later tasks read it back, so a worker holds a bounded
number of blocks at any time and the memory of the job does not grow with the
number of rows (only the disk use does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO, cast

import dask.array as da
import dask.core
import numpy as np
import scipy.linalg
import scipy.sparse as sp
from dask.highlevelgraph import HighLevelGraph
from dask.typing import DaskCollection
from distributed import futures_of

from pipeline._types import FloatArray, Shape2D
from pipeline.algorithms.base import RowBlockFn
from pipeline.errors import StoreLayoutError
from pipeline.execution.cache import (
    CachePlan,
    plan_cache,
    stored_band_bytes,
    worker_memory_limits,
)
from pipeline.execution.progress import show_progress
from pipeline.execution.secrets import install_secret, remove_secret
from pipeline.io.chunkio import release_read_buffers
from pipeline.linalg.clipping import CLIP_SHRINK, sparse_sumsq
from pipeline.mechanisms.clipping import scale_factors_from_sumsq
from pipeline.params import PrivacyUnit
from pipeline.sketches.apply import (
    PassRequest,
    band_local_clip,
    block_partials,
    prepare_sparse_band,
    prepared_alike,
)
from pipeline.sketches.operators import SketchOperator

#: Fan-in of every reduction tree.
SPLIT_EVERY = 8

#: Largest stack of per-block ``G_b^T Q_b`` (local QR) gathered on the client;
#: above it they stay on the workers and are combined there.
LOCAL_QR_GATHER_BYTES = 32 * 2**20

#: Target size (float64 bytes) of the row band one pass task reads: consecutive
#: row chunks of one column block are read and sketched together, so the number
#: of tasks -- and the reduction trees -- scale with bands, not chunks. Fixed
#: by the chunk shape alone, so a release does not depend on the cluster.
BAND_BYTES = 32 * 2**20

#: Most row blocks whose TSQR ``R_b`` factors are stacked and factored on the
#: client; with more, they are reduced in a tree of fan-in :data:`SPLIT_EVERY`
#: on the workers and only the final ``R`` (t x t) reaches the client.
TSQR_GATHER_BLOCKS = 64


def task_name(label: str) -> str:
    """A fresh name for a layer of graph tasks: ``dplr-<label>-<random hex>``.

    Parameters
    ----------
    label : str
        A public label of what the tasks compute (shown in the dashboard).

    Returns
    -------
    str
        The name; random, never derived from the tasks' arguments (which may
        hold key material), so two graphs never share a key.
    """
    return f"dplr-{label}-{uuid.uuid4().hex}"


def layer_graph(
    name: str, layer: Mapping[Any, Any], dependencies: Sequence[da.Array] = ()
) -> HighLevelGraph:
    """``HighLevelGraph.from_collections(name, layer, dependencies)``, typed.

    dask annotates the dependencies as ``DaskCollection``, a protocol its own
    ``Array`` does not meet for mypy (``__dask_scheduler__`` is a staticmethod in
    the protocol and a method on ``Array``): the cast states that they are arrays.
    """
    deps = cast("Sequence[DaskCollection]", dependencies)
    return HighLevelGraph.from_collections(name, layer, dependencies=deps)


def _offsets(chunks: Sequence[int]) -> list[int]:
    return [0, *np.cumsum(chunks).tolist()]


def _block_task(
    block: Any,
    row0: int,
    col0: int,
    request: PassRequest,
    row_scale: Any,
    col_scale: Any,
    where: str,
    spill: tuple[str, ...] | None = None,
) -> tuple[Any, ...]:
    parts = block_partials(
        block,
        row0,
        col0,
        request,
        row_scale=row_scale,
        col_scale=col_scale,
        where=where,
    )
    return _spill_parts(parts, spill)


def _spill_parts(
    parts: tuple[Any, ...], paths: tuple[str, ...] | None
) -> tuple[Any, ...]:
    """Write the first ``len(paths)`` (tall) partials to the scratch directory
    in the pass task itself; the result keeps only the small ones."""
    if not paths:
        return parts
    for part, path in zip(parts, paths, strict=False):
        _spill(part, path)
    return (None,) * len(paths) + tuple(parts[len(paths) :])


def _spilled(parts: list[Any]) -> FloatArray:
    """A token: every pass task (hence every spill) is done."""
    return np.zeros((1, 1))


def _read_block_task(
    reader: Any,
    cuts: tuple[int, ...],
    cols: tuple[int, int],
    first: int,
    c: int,
    request: PassRequest,
    row_scale: Any,
    col_scale: Any,
    spill: tuple[str, ...] | None = None,
) -> tuple[Any, ...]:
    """Read one row band of the store and sketch it, in one task."""
    # possibly a view of this thread's read buffer: used here only, and dropped
    # before this thread's next read
    block = _read_rows(reader, cuts, cols, first, c)
    where = _band_where(first, first + len(cuts) - 2, c)
    parts = block_partials(
        block,
        cuts[0],
        cols[0],
        request,
        row_scale=row_scale,
        col_scale=col_scale,
        where=where,
    )
    return _spill_parts(parts, spill)


def _kept_rows(
    reader: Any, cuts: tuple[int, ...], cols: tuple[int, int], first: int, c: int
) -> Any:
    """:func:`_read_rows` as a band kept in worker memory: never a view of the
    thread's read buffer (which the next read overwrites): a one-chunk band is
    decoded straight into an array of its own where the reader can."""
    if len(cuts) == 2 and hasattr(reader, "owned_block"):
        return reader.owned_block((cuts[0], cuts[1]), cols)
    block = _read_rows(reader, cuts, cols, first, c)
    if isinstance(block, np.ndarray) and block.base is not None:
        return np.array(block, copy=True)
    return block


def _band_where(first: int, last: int, c: int) -> str:
    return (
        f"chunk ({first}, {c})" if first == last else f"chunks ({first}..{last}, {c})"
    )


def _read_rows(
    reader: Any, cuts: tuple[int, ...], cols: tuple[int, int], first: int, c: int
) -> Any:
    """Rows ``cuts[0]:cuts[-1]`` of the column block ``cols``, read chunk by chunk
    (``cuts``: the row offsets of the band's chunks, ``first`` its first chunk's
    row index, ``c`` the column block's).

    One chunk: the reader's block itself (maybe a view of a read buffer). Several:
    copied into one array as they are read. NaN/Inf values are left to the
    kernels, which zero their individuals (:func:`block_partials`).
    """
    if len(cuts) == 2:
        return reader.block((cuts[0], cuts[1]), cols)
    if getattr(reader, "layout", None) is None:
        # not a plain local store (object storage, sharded, other codecs): one
        # read of the band, whose chunks zarr fetches concurrently
        return reader.block((cuts[0], cuts[-1]), cols)
    out: Any = None
    for a, b in itertools.pairwise(cuts):
        piece = reader.block((a, b), cols)
        if out is None:
            out = np.empty((cuts[-1] - cuts[0], cols[1] - cols[0]), dtype=piece.dtype)
        out[a - cuts[0] : b - cuts[0]] = piece
    return out


def concat_rows(parts: list[Any], first: int, c: int) -> Any:
    """The chunks of one row band stacked: the task that loads a band.

    Parameters
    ----------
    parts : list of array
        The band's chunks, top to bottom (one column chunk): numpy, or scipy
        sparse (a CSR store's bands, a dask array of sparse chunks).
    first, c : int
        The first chunk's row and column index, kept for the task's signature.

    Returns
    -------
    ndarray or scipy.sparse.csr_matrix
        The chunks concatenated along the rows (CSR when any chunk is sparse).
    """
    if any(sp.issparse(p) for p in parts):
        return sp.vstack([sp.csr_matrix(p) for p in parts], format="csr")
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


def row_bands(
    chunks: tuple[tuple[int, ...], tuple[int, ...]], target: int | None = None
) -> list[tuple[int, int]]:
    """Row-chunk ranges of the bands a pass reads as one task each.

    Parameters
    ----------
    chunks : (row chunks, column chunks)
        The input's dask chunks.
    target : int or None
        About how many float64 bytes a band holds (default :data:`BAND_BYTES`).

    Returns
    -------
    list of (a, b)
        Consecutive ranges ``[a, b)`` of row-chunk indices, at least one chunk each.
    """
    nr = len(chunks[0])
    chunk_bytes = max(chunks[0]) * max(chunks[1]) * 8
    k = max(1, (BAND_BYTES if target is None else target) // max(chunk_bytes, 1))
    return [(a, min(a + k, nr)) for a in range(0, nr, k)]


def check_indices_on_workers(
    client: Any, reader: Any, row_chunks: Sequence[int]
) -> None:
    """Check a CSR store's column indices on the workers, before any pass.

    A job defers the check of ``indices`` (O(nnz), :mod:`pipeline.io.csr`) to
    its cluster: one task per row chunk runs
    :meth:`~pipeline.io.csr.CsrReader.index_problem`, in parallel, and the
    first chunk's refusal in row order is raised here, so the message does not
    depend on which task finished first. Only then is the reader marked
    checked, which lets a pass read its bands. Nothing for another reader (a
    dense store, a store checked when opened).

    Raises
    ------
    StoreLayoutError
        A chunk holds an index out of ``[0, n)`` or not strictly increasing in
        its row (one line, as :func:`~pipeline.io.csr.open_csr`'s).
    """
    if reader is None or getattr(reader, "indices_checked", True):
        return
    name = task_name("csr-check")
    cuts = _offsets(row_chunks)
    futures = [
        client.submit(reader.index_problem, a, b, key=f"{name}-{i}", pure=False)
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ]
    try:
        problems = client.gather(futures)
    finally:
        for future in futures:
            future.release()
    for problem in problems:
        if problem is not None:
            raise StoreLayoutError(problem)
    reader.indices_checked = True


def gather_blocks(
    client: Any, arrays: Sequence[da.Array], *, persisted: bool = False
) -> list[FloatArray]:
    """``arrays`` in client memory: their blocks fetched in one gather and
    assembled here.

    ``client.compute`` of an array would add a task per array that concatenates
    its blocks on a worker (one more round trip, and the whole array on that
    worker) before sending it.
    """
    if not persisted:
        arrays = client.persist(list(arrays))
    futures = [futures_of(a) for a in arrays]
    values = dict(
        zip(
            (f.key for fs in futures for f in fs),
            client.gather([f for fs in futures for f in fs]),
            strict=True,
        )
    )
    out = []
    for a in arrays:
        grid = np.empty(a.numblocks, dtype=object)
        for index in np.ndindex(*a.numblocks):
            grid[index] = np.asarray(values[(a.name, *index)])
        out.append(np.block(grid.tolist()) if grid.size > 1 else grid.flat[0])
    return out


def _spill(block: Any, path: str) -> FloatArray:
    """Write one tall block to the scratch directory; a (1, 1) token.

    The file appears under its final name only when complete (rename), and a
    retried task writes the same bytes again.
    """
    a = np.ascontiguousarray(block, dtype=np.float64)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, a, allow_pickle=False)
    os.replace(tmp, path)
    return np.zeros((1, 1))


def _load(path: str) -> FloatArray:
    block: FloatArray = np.load(path, allow_pickle=False)  # a .npy spilled by _spill
    return block


def _load_array(paths: list[str], chunks: Any, name: str | None = None) -> da.Array:
    """The tall array whose block b is the scratch file ``paths[b]`` (lazy)."""
    lname = name or task_name("load")
    loads = {(lname, b, 0): (_load, path) for b, path in enumerate(paths)}
    return da.Array(
        layer_graph(lname, loads, dependencies=[]),
        lname,
        chunks=chunks,
        dtype=np.float64,
    )


def _block_qr(y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(Q_b, R_b)`` of one row block, as the in-pass local QR forms them.

    A block shorter than its width is its own R, and its Q is the identity
    (kept as the block itself, which :func:`_block_local_q` recognises by shape).
    """
    y = np.asarray(y, dtype=np.float64)
    if y.shape[0] < y.shape[1]:
        return y, y
    q, r = scipy.linalg.qr(y, mode="economic")  # as the in-pass local QR
    return q, r


def _block_noise_gram(
    y: FloatArray, fn: RowBlockFn, op: SketchOperator | None, start: int, stop: int
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """``(y', y'^T y', G^T y')`` of one row block, ``y' = fn(start, y)``."""
    y = fn(start, np.asarray(y, dtype=np.float64))
    return y, y.T @ y, None if op is None else op.left(y, start, stop)


def _drop_tall(parts: tuple[Any, ...], n_tall: int) -> tuple[Any, ...]:
    """A chunk's partial sketches without the first ``n_tall`` (the tall ones)."""
    return (None,) * n_tall + tuple(parts[n_tall:])


def _block_sumsq(block: Any, axis: int, where: str) -> FloatArray:
    """Per row (axis 1) or column (axis 0): sum of squares, peak exponent ``e``,
    the sum of squares of the entries scaled by ``2**-e`` and the number of
    NaN/Inf entries, shape (4, n).

    The scaled sum never overflows, so a row whose squares overflow float64
    (entries near 1e154 and beyond) is still clipped by its norm, not zeroed.
    A row holding NaN/Inf is measured with those entries at 0 and flagged: its
    factor is 0 (:func:`_scale_from`), the one rule for non-finite input.
    A sparse block is measured from its stored entries (:func:`sparse_sumsq`).
    """
    if sp.issparse(block):
        return sparse_sumsq(sp.csr_matrix(block), axis)
    a = np.asarray(block, dtype=np.float64)
    a = a if axis == 1 else a.T
    bad = ~np.isfinite(a)
    n_bad = bad.sum(axis=1).astype(np.float64)
    if n_bad.any():
        a = np.where(bad, 0.0, a)
    plain = np.einsum("ij,ij->i", a, a)
    _, e = np.frexp(np.abs(a).max(axis=1) if a.shape[1] else np.zeros(a.shape[0]))
    scaled = np.ldexp(a, -e[:, None])
    return np.stack(
        [plain, e.astype(np.float64), np.einsum("ij,ij->i", scaled, scaled), n_bad]
    )


def _sum_leaves(parts: list[Any], index: int | None) -> FloatArray:
    arrays = [p if index is None else p[index] for p in parts]
    if len(arrays) == 1:  # a block's only partial (one chunk per row block): no copy
        return np.asarray(arrays[0], dtype=np.float64)
    total = np.array(arrays[0], dtype=np.float64, copy=True)
    for a in arrays[1:]:
        total += a
    return total


def _scale_from(parts: list[FloatArray], clip_norm: float) -> FloatArray:
    sumsq = _sum_leaves([p[0] for p in parts], None)
    scale = scale_factors_from_sumsq(sumsq, clip_norm)
    huge = np.flatnonzero(np.isposinf(sumsq))
    if huge.size:
        # squares overflowed: norm = sqrt(sum_p scaled_p 4**(e_p - E)) * 2**E
        e = np.stack([p[1][huge] for p in parts]).astype(np.int64)
        top = e.max(axis=0)
        total = sum(
            np.ldexp(p[2][huge], 2 * (ep - top)) for p, ep in zip(parts, e, strict=True)
        )
        ratio = clip_norm * CLIP_SHRINK / np.sqrt(total)
        small = np.ldexp(ratio, -top)
        # a subnormal factor is rounded to nearest: step down so it never exceeds C
        sub = small < np.finfo(np.float64).tiny
        small[sub] = np.nextafter(small[sub], 0.0)
        scale[huge] = small
    # a row (column) holding NaN/Inf in any chunk is a zero row (column)
    scale[_sum_leaves([p[3] for p in parts], None) > 0] = 0.0
    return scale


def add_tree_sum(
    layer: dict[Any, Any], name: str, out_key: Any, leaves: list[Any], index: int | None
) -> None:
    """Add to ``layer`` the tasks of a fixed tree sum of ``leaves`` into ``out_key``.

    Parameters
    ----------
    layer : dict
        The graph layer the tasks are added to.
    name : str
        The layer's name (:func:`task_name`); inner nodes are ``<name>-t<depth>``.
    out_key : tuple
        The key of the sum.
    leaves : list of keys
        The partials, summed :data:`SPLIT_EVERY` at a time in a fixed order.
    index : int or None
        Sum entry ``index`` of each leaf (a tuple), or the leaves themselves.
    """
    level, depth = leaves, 0
    first = True
    while len(level) > SPLIT_EVERY or first:
        groups = [level[i : i + SPLIT_EVERY] for i in range(0, len(level), SPLIT_EVERY)]
        if len(groups) == 1:
            break
        nxt = []
        for g, grp in enumerate(groups):
            key = (f"{name}-t{depth}", *out_key[1:], g)
            layer[key] = (_sum_leaves, list(grp), index if first else None)
            nxt.append(key)
        level, depth, first = nxt, depth + 1, False
    layer[out_key] = (_sum_leaves, list(level), index if first else None)


class _Holder:
    """Opaque holder, so the graph never parses the reader as a task."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _unhold(holder: _Holder) -> Any:
    return holder.value


class DaskSource:
    """Matrix source over a 2-D dask array, run on a distributed client.

    Parameters
    ----------
    A : dask.array.Array of shape (n_rows, n_cols)
    client : distributed.Client
    progress : text stream or None
        Where pass progress bars go (None: silent).
    reader : object or None
        ``reader.block(rows, cols)`` returns that block of ``A`` as numpy (a Zarr
        input's checked reader, :func:`pipeline.io.open_input`); the pass tasks
        then read their chunks themselves. ``A`` must be that reader's array
        with these chunks.
    scratch : path or None
        A private directory, reachable by every worker, for the blocks of the
        tall objects (``Y``, ``Q``) between steps; None keeps them in worker
        memory. The caller creates and removes it.
    cache : {"never", "auto", "always"}
        Whether the first pass keeps the row bands it reads in worker memory for
        the later passes (:mod:`pipeline.execution.cache`); decided here, from
        the bands' sizes and the workers' memory limits, before anything is
        read (``always`` raises when they cannot fit). :attr:`cache_plan` says
        what was decided; :meth:`close` releases the bands.
    gather_tall : bool
        The job returns its tall results in client memory (no output store):
        :meth:`tall_matmul` of a tall object kept in worker memory then gathers
        its blocks and multiplies them here, block by block (the products the
        workers would make, without a round of tasks before the gather).
    """

    def __init__(
        self,
        A: da.Array,
        client: Any,
        *,
        progress: TextIO | None = None,
        reader: Any = None,
        scratch: str | os.PathLike[str] | None = None,
        cache: str = "never",
        gather_tall: bool = False,
    ) -> None:
        self.A = A
        self.gather_tall = gather_tall
        self.reader = reader
        self.scratch = None if scratch is None else os.fspath(scratch)
        self.client = client
        self.progress = progress
        # a sparse input's pass takes a time that grows with its stored entries
        self.dense = not sp.issparse(getattr(A, "_meta", None))
        check_indices_on_workers(client, reader, A.chunks[0])
        self.n_passes = 0
        self.n_tasks = 0
        self._secrets: list[str] = []
        self.cache_plan: CachePlan = self._plan_cache(cache)
        self._held: da.Array | None = None
        # None: the held bands are raw; else the request whose preparation
        # (clipping, dtype) they hold (a sparse input's: prepare_sparse_band)
        self._held_for: PassRequest | None = None

    @property
    def shape(self) -> Shape2D:
        return int(self.A.shape[0]), int(self.A.shape[1])

    # -- secrets used by tasks (sketch seed, tall noise keys) -------------------
    def seal(self, value: Any) -> Any:
        """A reference to ``value`` that tasks can carry: the value reaches the
        workers out of band (:mod:`pipeline.execution.secrets`) until :meth:`close`."""
        sealed, plugin = install_secret(self.client, value)
        self._secrets.append(plugin)
        return sealed

    def _plan_cache(self, mode: str) -> CachePlan:
        """The cache decision from the bands' public sizes (before any read)."""
        A = self.A
        if mode == "never":
            return plan_cache(mode, [], [])
        limits = worker_memory_limits(self.client)
        if not self.dense:  # stored sizes: a count of the data, never published
            sizes = None
            if A.numblocks[1] == 1:
                sizes = stored_band_bytes(
                    self.reader, A.chunks[0], row_bands(A.chunks), value_bytes=8
                )  # held prepared: the values in float64 at most
            return plan_cache(mode, sizes, limits, dense=False)
        itemsize = np.dtype(A.dtype).itemsize
        width = max(A.chunks[1])
        public = [
            sum(A.chunks[0][a:b]) * width * itemsize
            for a, b in row_bands(A.chunks)
            for _ in range(A.numblocks[1])
        ]
        return plan_cache(mode, public, limits)

    def _hold(self, bands: list[tuple[int, int]], request: PassRequest) -> None:
        """Submit the bands as tasks whose results the client holds (once: the
        first pass computes them, the later ones find them in memory).

        A sparse input's bands are held prepared for ``request`` (non-finite
        individuals zeroed, clipped, in its dtype: :class:`PreparedBand`) when
        each band can be prepared alone: the later passes that prepare them the
        same way (the two-pass release's second pass, with the same clipping)
        go straight to their products; another pass reads its bands again.
        """
        if not self.cache_plan.used or self._held is not None:
            return
        A = self.A
        name = task_name("band")
        layer: dict[Any, Any] = {}
        rkey = None
        if self.reader is not None:
            rkey = task_name("band-reader")
            layer[rkey] = _Holder(self.reader)
        prepare = (
            not self.dense
            and A.numblocks[1] == 1
            and band_local_clip(request.clip, len(bands) == 1)
        )
        for i, band in enumerate(bands):
            for c in range(A.numblocks[1]):
                src = self._band_source(band, c, rkey, keep=True)
                if prepare:
                    # a band read for this task alone is prepared in place
                    src = (
                        prepare_sparse_band, src, request.clip, request.compute_dtype,
                        _band_where(band[0], band[1] - 1, c), rkey is not None,
                    )  # fmt: skip
                layer[(name, i, c)] = src
        brows = tuple(sum(A.chunks[0][a:b]) for a, b in bands)
        held = da.Array(
            layer_graph(name, layer, dependencies=[A]), name,
            chunks=(brows, A.chunks[1]), meta=A._meta,
        )  # fmt: skip
        self._held = self.client.persist(held)
        self._held_for = request if prepare else None

    def _held_serves(self, request: PassRequest | None) -> bool:
        """Whether the held bands serve a pass with ``request`` (None: one that
        needs the raw values, e.g. for norms)."""
        if self._held is None:
            return False
        if self._held_for is None:
            return True
        held = self._held_for
        return request is not None and prepared_alike(
            request, held.clip, held.compute_dtype
        )

    def _deps(self) -> list[da.Array]:
        """The collections a pass graph depends on: ``A``, and the held bands."""
        return [self.A] if self._held is None else [self.A, self._held]

    def close(self) -> None:
        """Remove this job's secrets from the cluster (after its last compute),
        the held bands, and the workers' chunk read buffers."""
        if self._held is not None:
            for future in futures_of(self._held):
                future.release()
            self._held = None
        while self._secrets:
            remove_secret(self.client, self._secrets.pop())
        if getattr(self.reader, "layout", None) is not None:
            # only a plain store's direct reads use the buffers (not a CSR store's)
            with contextlib.suppress(Exception):  # a closed client: workers are gone
                self.client.run(release_read_buffers)

    # -- running a step -----------------------------------------------------------
    def _run(
        self,
        tall: dict[str, da.Array],
        small: dict[str, da.Array],
        label: str | None,
    ) -> tuple[dict[str, da.Array], dict[str, FloatArray]]:
        """Compute one step: ``tall`` arrays are kept (in worker memory, or in
        the scratch directory as lazily loaded blocks), ``small`` ones gathered.

        Everything runs as one graph, so tasks shared by the two (the chunk
        tasks of a pass) run once.
        """
        kept: dict[str, Any] = {}
        tokens: list[Any] = []
        if self.scratch is None:
            running = self.client.persist([*tall.values(), *small.values()])
            kept = dict(zip(tall, running[: len(tall)], strict=True))
            running = running[len(tall) :]
        else:
            for name, x in tall.items():
                if x.numblocks[1] != 1:
                    x = x.rechunk({1: -1})
                sname, lname = task_name(f"spill-{name}"), task_name(f"load-{name}")
                paths = [
                    os.path.join(self.scratch, f"{sname}-{b}.npy")
                    for b in range(x.numblocks[0])
                ]
                layer = {
                    (sname, b, 0): (_spill, (x.name, b, 0), path)
                    for b, path in enumerate(paths)
                }
                graph = layer_graph(sname, layer, dependencies=[x])
                tokens.append(
                    da.Array(
                        graph, sname, chunks=((1,) * len(paths), (1,)), dtype=np.float64
                    )
                )
                kept[name] = _load_array(paths, x.chunks, lname)
            running = self.client.persist([*tokens, *small.values()])
        if label is not None:
            shown = running if self.scratch is not None else [*kept.values(), *running]
            show_progress(self.client, shown, label, self.progress, timed=self.dense)
        values = gather_blocks(self.client, running, persisted=True)
        gathered = dict(zip(small, values[len(tokens) :], strict=True))
        return kept, gathered

    # -- the pass over A --------------------------------------------------------
    def _band_source(
        self, band: tuple[int, int], c: int, rkey: Any, *, keep: bool = False
    ) -> Any:
        """The graph expression of one row band of column block ``c`` (numpy);
        ``keep``: a band to hold in worker memory (never a read buffer's view)."""
        A = self.A
        a, b = band
        if rkey is not None:
            roff, coff = _offsets(A.chunks[0]), _offsets(A.chunks[1])
            return (
                _kept_rows if keep else _read_rows, (_unhold, rkey),
                tuple(roff[a : b + 1]), (coff[c], coff[c + 1]), a, c,
            )  # fmt: skip
        if b - a == 1:
            return (A.name, a, c)
        return (concat_rows, [(A.name, r, c) for r in range(a, b)], a, c)

    def _scale_keys(
        self,
        request: PassRequest,
        layer: dict[Any, Any],
        bands: list[tuple[int, int]],
        rkey: Any,
    ) -> tuple[dict[int, Any], dict[int, Any]]:
        """Norm pre-pass for row/column clipping when a row/column spans chunks
        (one task per band and column block)."""
        A, clip = self.A, request.clip
        rows: dict[int, Any] = {}
        cols: dict[int, Any] = {}
        if clip is None or clip.unit is PrivacyUnit.ENTRY:
            return rows, cols
        nb, nc = len(bands), A.numblocks[1]
        axis = {PrivacyUnit.ROW: 1, PrivacyUnit.COLUMN: 0}[clip.unit]
        if (axis == 1 and nc == 1) or (axis == 0 and nb == 1):
            return rows, cols
        nname, sname = task_name("norms"), task_name("scales")
        for i, band in enumerate(bands):
            for c in range(nc):
                where = _band_where(band[0], band[1] - 1, c)
                src = (
                    (self._held.name, i, c)
                    if self._held is not None and self._held_serves(None)
                    else self._band_source(band, c, rkey)
                )
                layer[(nname, i, c)] = (_block_sumsq, src, axis, where)
        for j in range(nc if axis == 0 else nb):
            leaves = (
                [(nname, j, c) for c in range(nc)]
                if axis == 1
                else [(nname, i, j) for i in range(nb)]
            )
            layer[(sname, j)] = (_scale_from, leaves, clip.clip_norm)
            (rows if axis == 1 else cols)[j] = (sname, j)
        self.n_passes += 1
        return rows, cols

    def _partial_tasks(
        self,
        layer: dict[Any, Any],
        request: PassRequest,
        bands: list[tuple[int, int]],
        rkey: Any,
        scales: tuple[dict[int, Any], dict[int, Any]],
        spill: Callable[[int, int], tuple[str, ...] | None],
    ) -> str:
        """One pass task per band and column block; returns their layer name."""
        A = self.A
        roff, coff = _offsets(A.chunks[0]), _offsets(A.chunks[1])
        pname = task_name("partials")
        for i, (a, b) in enumerate(bands):
            for c in range(A.numblocks[1]):
                common = (request, scales[0].get(i), scales[1].get(c))
                held = self._held is not None and self._held_serves(request)
                if self.reader is None or held:
                    src = (
                        (self._held.name, i, c)
                        if held and self._held is not None
                        else self._band_source((a, b), c, None)
                    )
                    layer[(pname, i, c)] = (
                        _block_task, src, roff[a], coff[c],
                        *common, _band_where(a, b - 1, c), spill(i, c),
                    )  # fmt: skip
                else:
                    # the task reads its band itself: one task per band instead of
                    # read tasks and a sketch task, and no hand-over between them
                    layer[(pname, i, c)] = (
                        _read_block_task, (_unhold, rkey), tuple(roff[a : b + 1]),
                        (coff[c], coff[c + 1]), a, c, *common, spill(i, c),
                    )  # fmt: skip
        return pname

    def _spill_plan(
        self, request: PassRequest, n_x_rows: int, one_part: bool
    ) -> dict[str, list[str]]:
        """Scratch files of the tall sketches when the pass tasks write them
        themselves: with a scratch directory, when each X row block comes from
        one pass task (no sum over column blocks), so no task per block is added."""
        if self.scratch is None or not request.right or not one_part:
            return {}
        out = {}
        for name, _ in request.right:
            sname = task_name(f"spill-{name}")
            out[name] = [
                os.path.join(self.scratch, f"{sname}-{R}.npy") for R in range(n_x_rows)
            ]
        return out

    def sketch(self, request: PassRequest) -> dict[str, Any]:
        A = self.A
        tr = request.transpose
        nc = A.numblocks[1]
        bands = row_bands(A.chunks)
        nb = len(bands)
        if request.local_qr and (nb if tr else nc) > 1:
            # a row block of X that spans several bands has its Y rows only after
            # the sum over them: no local QR, the post-processing runs TSQR instead
            request = dataclasses.replace(request, local_qr=())
        layer: dict[Any, Any] = {}
        self._hold(bands, request)
        rkey = None
        if self.reader is not None and not (
            self._held_serves(request) and self._held_serves(None)
        ):
            rkey = task_name("reader")
            layer[rkey] = _Holder(self.reader)
        row_keys, col_keys = self._scale_keys(request, layer, bands, rkey)
        brows = tuple(sum(A.chunks[0][a:b]) for a, b in bands)
        # X = A.T when transposed: X row block R is A column block R
        x_row_chunks, x_col_chunks = (
            (A.chunks[1], brows) if tr else (brows, A.chunks[1])
        )
        spilled = self._spill_plan(request, len(x_row_chunks), (nb if tr else nc) == 1)

        def spill(i: int, c: int) -> tuple[str, ...] | None:
            R = c if tr else i
            return tuple(p[R] for p in spilled.values()) if spilled else None

        pname = self._partial_tasks(
            layer, request, bands, rkey, (row_keys, col_keys), spill
        )

        def parts_of_x_row(R: int) -> list[Any]:
            return [
                (pname, c, R) if tr else (pname, R, c)
                for c in range(nc if not tr else nb)
            ]

        sname = self._small_partials(layer, request, pname, (nb, nc), bool(spilled))

        def parts_of_x_col(C: int) -> list[Any]:
            return [
                (sname, C, r) if tr else (sname, r, C)
                for r in range(nb if not tr else nc)
            ]

        rows = [parts_of_x_row(R) for R in range(len(x_row_chunks))]
        cols = [parts_of_x_col(C) for C in range(len(x_col_chunks))]
        all_parts = [(sname, r, c) for r in range(nb) for c in range(nc)]
        out_names = _output_trees(
            layer, request, rows, cols, all_parts, (x_row_chunks, x_col_chunks),
            sname, bool(spilled),
        )  # fmt: skip
        if spilled and not (request.left or request.two_sided):
            # nothing gathered depends on every pass task: a token that does
            oname = task_name("spilled")
            layer[(oname, 0, 0)] = (_spilled, all_parts)
            out_names["_spilled"] = (oname, ((1,), (1,)))
        self.n_tasks += len(layer)
        arrays = {}
        for name, (oname, chunks) in out_names.items():
            graph = layer_graph(oname, layer, dependencies=self._deps())
            arrays[name] = da.Array(graph, oname, chunks=chunks, dtype=np.float64)
        self.n_passes += 1
        return self._gather_pass(request, arrays, spilled, tuple(x_row_chunks))

    def _small_partials(
        self,
        layer: dict[Any, Any],
        request: PassRequest,
        pname: str,
        blocks: tuple[int, int],
        spilled: bool,
    ) -> str:
        """The name of the chunk results the left and two-sided trees read.

        With a scratch directory, they read the chunk results without their tall
        entries: a chunk's Y block is then freed as soon as it has reached the
        scratch, not when the last sibling of its Z leaf is done (in worker
        memory Y stays anyway: no extra tasks there).
        """
        n_right = len(request.right)
        if not (n_right and self.scratch is not None and not spilled):
            return pname
        sname = task_name("partials-small")
        for r in range(blocks[0]):
            for c in range(blocks[1]):
                layer[(sname, r, c)] = (_drop_tall, (pname, r, c), n_right)
        return sname

    def _gather_pass(
        self,
        request: PassRequest,
        arrays: dict[str, da.Array],
        spilled: dict[str, list[str]],
        x_row_chunks: tuple[int, ...],
    ) -> dict[str, Any]:
        """The pass's results: the spilled right sketches loaded from the
        scratch, the others computed (:meth:`_finish_pass`)."""
        nr, nc = self.A.numblocks
        loaded = {
            name: _load_array(spilled[name], (x_row_chunks, (op.dim,)))
            for name, op in request.right
            if spilled
        }
        result = self._finish_pass(
            request, arrays, f"pass over the input: {nr * nc} chunks"
        )
        result.pop("_spilled", None)
        return {**loaded, **result}

    def _finish_pass(
        self, request: PassRequest, arrays: dict[str, da.Array], label: str
    ) -> dict[str, Any]:
        """Run a pass's outputs: tall ones kept, small ones gathered."""
        tall = {n for n, _ in request.right}
        for r, _ in request.local_qr:
            # the G_b^T Q_b blocks are gathered with Z when small (one round trip
            # fewer after the pass), kept on the workers when they grow with m
            if arrays[f"{r}_left"].nbytes > LOCAL_QR_GATHER_BYTES:
                tall.add(f"{r}_left")
            if arrays[f"{r}_R"].numblocks[0] > TSQR_GATHER_BLOCKS:
                tall.update((f"{r}_R", f"{r}_left"))  # R_b reduced on the workers
        kept, gathered = self._run(
            {n: a for n, a in arrays.items() if n in tall},
            {n: a for n, a in arrays.items() if n not in tall},
            label,
        )
        return {n: kept[n] if n in kept else gathered[n] for n in arrays}

    # -- operations on tall arrays ---------------------------------------------
    def tall_noise_gram(
        self, Y: da.Array, fn: RowBlockFn, op: SketchOperator | None
    ) -> tuple[da.Array, FloatArray, FloatArray | None]:
        """One step over the row blocks of ``Y``: ``Y_b' = fn(start_b, Y_b)`` (the
        noise), kept; ``Y_b'^T Y_b'`` and ``G_b^T Y_b'`` (unless ``op`` is None)
        summed in trees and gathered. Each noisy block is used where it is made."""
        if Y.numblocks[1] != 1:
            Y = Y.rechunk({1: -1})
        t, nb, offs = int(Y.shape[1]), Y.numblocks[0], _offsets(Y.chunks[0])
        bname, yname = task_name("noise-gram-block"), task_name("noisy")
        gname, lname = task_name("noisy-gram"), task_name("noisy-left")
        layer: dict[Any, Any] = {}
        for b in range(nb):
            layer[(bname, b)] = (
                _block_noise_gram,
                (Y.name, b, 0),
                fn,
                op,
                offs[b],
                offs[b + 1],
            )
            layer[(yname, b, 0)] = (operator.getitem, (bname, b), 0)
        leaves = [(bname, b) for b in range(nb)]
        add_tree_sum(layer, gname, (gname, 0, 0), leaves, 1)
        if op is not None:
            add_tree_sum(layer, lname, (lname, 0, 0), leaves, 2)
        graph = layer_graph(yname, layer, dependencies=[Y])
        small = {"G": da.Array(graph, gname, chunks=((t,), (t,)), dtype=np.float64)}
        if op is not None:
            small["L"] = da.Array(
                graph, lname, chunks=((op.dim,), (t,)), dtype=np.float64
            )
        noisy = da.Array(graph, yname, chunks=Y.chunks, dtype=np.float64)
        kept, gathered = self._run(
            {"noisy-Y": noisy}, small, "adding noise to the range sketch"
        )
        return kept["noisy-Y"], gathered["G"], gathered.get("L")

    def tall_qr(self, Y: da.Array, *, with_r: bool = False) -> Any:
        """Two-level TSQR: ``Y_b = Q_b R_b`` on the workers (``Q_b`` kept, ``R_b``
        gathered), then ``[R_1; ...; R_B] = Q2 R`` on the client.

        Returns the same factored object as :meth:`finish_local_qr`: the
        orthonormal basis ``Q_b Q2_b`` is never formed as a whole; with
        ``with_r`` also ``R`` (t x t), so that ``Y = Q R``.
        """
        if Y.numblocks[1] != 1:
            Y = Y.rechunk({1: -1})
        t = int(Y.shape[1])
        qrname, qname, rname = (
            task_name("block-qr"),
            task_name("block-q"),
            task_name("block-r"),
        )
        layer: dict[Any, Any] = {}
        for b in range(Y.numblocks[0]):
            layer[(qrname, b)] = (_block_qr, (Y.name, b, 0))
            layer[(qname, b, 0)] = (operator.getitem, (qrname, b), 0)
            layer[(rname, b, 0)] = (operator.getitem, (qrname, b), 1)
        graph = layer_graph(qname, layer, dependencies=[Y])
        Q = da.Array(graph, qname, chunks=Y.chunks, dtype=np.float64)
        heights = tuple(min(h, t) for h in Y.chunks[0])
        R = da.Array(
            layer_graph(rname, layer, dependencies=[Y]),
            rname, chunks=(heights, (t,)), dtype=np.float64,
        )  # fmt: skip
        tree = Y.numblocks[0] > TSQR_GATHER_BLOCKS
        kept, gathered = self._run(
            {"Q": Q, "R": R} if tree else {"Q": Q},
            {} if tree else {"R": R},
            "orthonormalising the range sketch (TSQR)",
        )
        blocks, R_final = self._q2(kept["Q"], kept["R"] if tree else gathered["R"])
        Q_local = _LocalQ(kept["Q"], blocks)
        return (Q_local, R_final) if with_r else Q_local

    def tall_left_sketch(self, Q: Any, op: SketchOperator) -> FloatArray:
        lname, oname = task_name("left-partial"), task_name("left")
        local = isinstance(Q, _LocalQ)
        blocks = Q.Q if local else Q
        offs = _offsets(blocks.chunks[0])
        layer: dict[Any, Any] = {}
        leaves = []
        for r in range(blocks.numblocks[0]):
            where = (op, offs[r], offs[r + 1])
            layer[(lname, r)] = (
                (_block_left_local, (blocks.name, r, 0), _q2_ref(Q.blocks, r), *where)
                if local
                else (_block_left, (blocks.name, r, 0), *where)
            )
            leaves.append((lname, r))
        add_tree_sum(layer, oname, (oname, 0, 0), leaves, None)
        deps = [blocks, *_q2_deps(Q.blocks)] if local else [blocks]
        graph = layer_graph(oname, layer, dependencies=deps)
        total = da.Array(
            graph, oname, chunks=((op.dim,), (blocks.shape[1],)), dtype=np.float64
        )
        return np.asarray(self.client.compute(total, sync=True))

    def finish_local_qr(
        self, Q: da.Array, R: FloatArray, left: Any
    ) -> tuple[Any, FloatArray]:
        """Second level of the TSQR begun in the pass (``PassRequest.local_qr``).

        With ``Y_b = Q_b R_b`` per row block and ``[R_1; ...; R_B] = Q2 R``, the
        orthonormal basis of ``Y`` is ``Q_b Q2_b`` on block b, and
        ``G^T Q = sum_b (G_b^T Q_b) Q2_b`` needs no regeneration of ``G``.

        Parameters
        ----------
        Q : dask array of shape (M, t)
            The blocks ``Q_b``.
        R : ndarray of shape (B t, t)
            The blocks ``R_b`` stacked.
        left : dask or numpy array of shape (B d, t)
            The blocks ``G_b^T Q_b`` stacked (numpy when :meth:`sketch`
            gathered them).

        Returns
        -------
        Q : opaque tall object of shape (M, t)
            Orthonormal ``Q_b Q2_b``, never formed: :meth:`tall_matmul` takes it
            and computes ``Q_b (Q2_b M)``, one small product per block.
        GQ : ndarray of shape (d, t)
        """
        t, nb = Q.shape[1], Q.numblocks[0]
        blocks, _ = self._q2(Q, R)
        if isinstance(left, np.ndarray) and isinstance(blocks, list):
            d = left.shape[0] // nb
            GQ = np.zeros((d, t))
            for b in range(nb):  # fixed order: the same sum on every run
                GQ += _block_left_combine(left[b * d : (b + 1) * d], blocks[b])
            return _LocalQ(Q, blocks), GQ
        if isinstance(left, np.ndarray):
            d = left.shape[0] // nb
            left = da.from_array(left, chunks=((d,) * nb, (left.shape[1],)))
        lname, oname = task_name("local-qr-left"), task_name("local-qr-sum")
        layer: dict[Any, Any] = {}
        for b in range(nb):
            layer[(lname, b)] = (
                _block_left_combine,
                (left.name, b, 0),
                _q2_ref(blocks, b),
            )
        add_tree_sum(layer, oname, (oname, 0, 0), [(lname, b) for b in range(nb)], None)
        graph = layer_graph(oname, layer, dependencies=[left, *_q2_deps(blocks)])
        d = left.chunks[0][0]
        total = da.Array(graph, oname, chunks=((d,), (t,)), dtype=np.float64)
        GQ = np.asarray(self.client.compute(total, sync=True))
        return _LocalQ(Q, blocks), GQ

    def _q2(self, Q: da.Array, R: Any) -> tuple[Any, FloatArray]:
        """Row blocks of ``Q2`` in ``[R_1; ...; R_B] = Q2 R`` and the final ``R``.

        ``R`` gathered (numpy): factored here, the blocks are a list of arrays.
        ``R`` kept on the workers (dask): reduced there in a tree, the blocks are
        a persisted dask array (block b: ``Q2_b``), and only ``R`` is gathered.
        """
        if isinstance(R, np.ndarray):
            return _q2_blocks(Q, R)
        heights = tuple(min(c, int(Q.shape[1])) for c in Q.chunks[0])
        if R.chunks[0] != heights:
            R = R.rechunk({0: heights, 1: -1})
        Q2, R_final = _q2_tree(R)
        Q2, R_final = self.client.persist([Q2, R_final])  # one graph, one submission
        (R_host,) = gather_blocks(self.client, [R_final], persisted=True)
        return Q2, R_host

    def tall_matmul(self, Q: Any, M: FloatArray) -> Any:
        if self.gather_tall and self.scratch is None and _persisted(Q):
            # kept in worker memory: its blocks come here anyway
            (q,) = gather_blocks(self.client, [Q], persisted=True)
            out = np.empty((q.shape[0], M.shape[1]))
            for a, b in itertools.pairwise(_offsets(Q.chunks[0])):
                np.matmul(q[a:b], M, out=out[a:b])
            return out
        if isinstance(Q, _LocalQ) and not isinstance(Q.blocks, list):
            qname = task_name("local-q-matmul")
            layer: dict[Any, Any] = {
                (qname, b, 0): (
                    _block_local_q2,
                    (Q.Q.name, b, 0),
                    (Q.blocks.name, b, 0),
                    M,
                )
                for b in range(Q.Q.numblocks[0])
            }
            graph = layer_graph(qname, layer, dependencies=[Q.Q, Q.blocks])
            return da.Array(
                graph, qname, chunks=(Q.Q.chunks[0], (M.shape[1],)), dtype=np.float64
            )
        if isinstance(Q, _LocalQ):
            qname = task_name("local-q-matmul")
            layer = {
                (qname, b, 0): (_block_local_q, (Q.Q.name, b, 0), q2 @ M)
                for b, q2 in enumerate(Q.blocks)
            }
            graph = layer_graph(qname, layer, dependencies=[Q.Q])
            return da.Array(
                graph, qname, chunks=(Q.Q.chunks[0], (M.shape[1],)), dtype=np.float64
            )
        product: da.Array = Q.map_blocks(
            _block_matmul,
            np.ascontiguousarray(M),
            chunks=(Q.chunks[0], (M.shape[1],)),
            dtype=np.float64,
            name=task_name("matmul"),
        )
        return product


def _output_trees(
    layer: dict[Any, Any],
    request: PassRequest,
    rows: list[list[Any]],
    cols: list[list[Any]],
    all_parts: list[Any],
    chunks: tuple[tuple[int, ...], tuple[int, ...]],
    sname: str,
    spilled: bool,
) -> dict[str, tuple[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """The reduction trees of a pass: name -> (layer name, chunks) of each output.

    ``rows[R]`` / ``cols[C]``: the pass tasks of X row block R / column block C
    (``cols`` and ``all_parts`` without their tall entries); ``spilled``: the
    tall sketches were written by the pass tasks (no tree for them).
    """
    x_row_chunks, x_col_chunks = chunks
    out: dict[str, tuple[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    index = 0
    for name, op in request.right:
        if not spilled:
            oname = task_name(f"sketch-{name}")
            for R, parts in enumerate(rows):
                add_tree_sum(layer, oname, (oname, R, 0), parts, index)
            out[name] = (oname, (tuple(x_row_chunks), (op.dim,)))
        index += 1
    for name, op in request.left:
        oname = task_name(f"sketch-{name}")
        for C, parts in enumerate(cols):
            add_tree_sum(layer, oname, (oname, 0, C), parts, index)
        out[name] = (oname, ((op.dim,), tuple(x_col_chunks)))
        index += 1
    for name, s_op, t_op in request.two_sided:
        oname = task_name(f"sketch-{name}")
        add_tree_sum(layer, oname, (oname, 0, 0), all_parts, index)
        out[name] = (oname, ((s_op.dim,), (t_op.dim,)))
        index += 1
    for rname, _ in request.local_qr:
        # one part per X row block: R_b blocks (small, gathered) and
        # G_b^T Q_b blocks (v x t each, kept on the workers)
        t = dict(request.right)[rname].dim
        left_dim = dict(request.left)[dict(request.local_qr)[rname]].dim
        heights = tuple(min(c, t) for c in x_row_chunks)
        for suffix, hs in (("R", heights), ("left", (left_dim,) * len(heights))):
            oname = task_name(f"sketch-{rname}-{suffix}")
            for R, parts in enumerate(rows):
                (part,) = parts
                layer[(oname, R, 0)] = (operator.getitem, (sname, *part[1:]), index)
            out[f"{rname}_{suffix}"] = (oname, (hs, (t,)))
            index += 1
    return out


def _block_left(q: FloatArray, op: SketchOperator, start: int, stop: int) -> FloatArray:
    return op.left(q, start, stop)


def _block_left_local(
    q: FloatArray, q2: FloatArray, op: SketchOperator, start: int, stop: int
) -> FloatArray:
    """``G_b^T (Q_b Q2_b)`` of one block of a factored basis (:class:`_LocalQ`)."""
    if q.shape[0] < q.shape[1]:  # Q_b is the identity
        return op.left(q2, start, stop)
    return op.left(q, start, stop) @ q2


def _q2_blocks(Q: da.Array, R: FloatArray) -> tuple[list[FloatArray], FloatArray]:
    """Row blocks of ``Q2`` in ``[R_1; ...; R_B] = Q2 R`` (``R_b`` of height
    ``min(rows_b, t)``), one per block of ``Q``, and the final ``R``."""
    t = Q.shape[1]
    offs = _offsets([min(c, t) for c in Q.chunks[0]])
    Q2, R_final = np.linalg.qr(R)
    blocks = [
        np.ascontiguousarray(Q2[offs[b] : offs[b + 1]]) for b in range(Q.numblocks[0])
    ]
    return blocks, R_final


def _q2_ref(blocks: Any, b: int) -> Any:
    """``Q2_b`` in a graph: the array itself, or the key of its block."""
    return blocks[b] if isinstance(blocks, list) else (blocks.name, b, 0)


def _q2_deps(blocks: Any) -> list[da.Array]:
    return [] if isinstance(blocks, list) else [blocks]


def _stack_qr(parts: list[Any]) -> tuple[FloatArray, FloatArray]:
    """QR of the stacked R factors of one group of the tree."""
    q, r = np.linalg.qr(
        np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
    )
    return q, r


def _q2_child(
    qr: tuple[FloatArray, FloatArray], start: int, stop: int, parent: Any
) -> FloatArray:
    """Rows ``start:stop`` of a group's ``Q``, times the group's own ``Q2`` block."""
    q = qr[0][start:stop]
    return np.ascontiguousarray(q if parent is None else q @ parent)


def _q2_tree(R: da.Array) -> tuple[da.Array, da.Array]:
    """TSQR of the stacked ``R_b`` as a tree on the workers.

    Groups of :data:`SPLIT_EVERY` factors are stacked and factored, their R's
    again, up to one root whose R is the final one. Going down, the ``Q2`` block
    of a child is its rows of its group's Q times the group's own ``Q2`` block.
    Fixed shape for a fixed blocking: the same result on any number of workers.
    """
    t = int(R.shape[1])
    qname, rname, dname = (
        task_name("tsqr-node"),
        task_name("tsqr-r"),
        task_name("tsqr-q2"),
    )
    layer: dict[Any, Any] = {}
    level = [((R.name, b, 0), h) for b, h in enumerate(R.chunks[0])]
    levels: list[
        list[tuple[Any, list[int]]]
    ] = []  # per level: (node key, child heights)
    depth = 0
    while True:
        groups = [level[i : i + SPLIT_EVERY] for i in range(0, len(level), SPLIT_EVERY)]
        nodes, nxt = [], []
        for g, grp in enumerate(groups):
            key = (qname, depth, g)
            layer[key] = (_stack_qr, [k for k, _ in grp])
            layer[(rname, depth, g)] = (operator.getitem, key, 1)
            nodes.append((key, [h for _, h in grp]))
            nxt.append(((rname, depth, g), min(sum(h for _, h in grp), t)))
        levels.append(nodes)
        level, depth = nxt, depth + 1
        if len(groups) == 1:
            break
    parents: list[Any] = [None]
    for d in range(len(levels) - 1, -1, -1):
        children: list[Any] = []
        for (key, heights), parent in zip(levels[d], parents, strict=True):
            offs = _offsets(heights)
            for i in range(len(heights)):
                ck = (dname, d, len(children))
                layer[ck] = (_q2_child, key, offs[i], offs[i + 1], parent)
                children.append(ck)
        parents = children
    cols = level[0][1]
    out = task_name("tsqr-q2-blocks")
    for b, key in enumerate(parents):
        layer[(out, b, 0)] = layer.pop(key)
    root = (rname, len(levels) - 1, 0)
    fname = task_name("tsqr-r-final")
    layer[(fname, 0, 0)] = (np.asarray, root)
    graph = layer_graph(out, layer, dependencies=[R])
    Q2 = da.Array(graph, out, chunks=(R.chunks[0], (cols,)), dtype=np.float64)
    R_final = da.Array(graph, fname, chunks=((cols,), (t,)), dtype=np.float64)
    return Q2, R_final


def _block_local_q2(q: FloatArray, q2: FloatArray, M: FloatArray) -> FloatArray:
    """Block b of ``Q M`` from ``Q_b`` and ``Q2_b`` (both on the worker)."""
    if q.shape[0] < q.shape[1]:
        return q2 @ M
    return q @ (q2 @ M)


def _persisted(x: Any) -> bool:
    """Whether ``x`` is a dask array whose every block is a future (persisted)."""
    if not isinstance(x, da.Array):
        return False
    keys = {f.key for f in futures_of(x)}
    return all(key in keys for key in dask.core.flatten(x.__dask_keys__()))


def _block_matmul(q: FloatArray, M: FloatArray) -> FloatArray:
    return q @ M


def _block_left_combine(g_q: FloatArray, q2: FloatArray) -> FloatArray:
    # a block shorter than t has a Q2 block of its own height (zero-padded G^T)
    return g_q[:, : q2.shape[0]] @ q2


def _block_local_q(q: FloatArray, q2m: FloatArray) -> FloatArray:
    """Block b of ``Q M`` from ``Q_b`` and ``Q2_b M``.

    A block shorter than t holds ``Y_b`` itself and its ``Q_b`` is the identity.
    """
    if q.shape[0] < q.shape[1]:
        return q2m.copy()
    return q @ q2m


@dataclasses.dataclass(frozen=True, slots=True)
class _LocalQ:
    """``Q = blockdiag(Q_b) [Q2_1; ...; Q2_B]`` of a local QR, kept factored."""

    Q: da.Array
    #: ``Q2_b`` per block: numpy arrays, or a dask array with one block per b
    blocks: Any


__all__ = [
    "SPLIT_EVERY",
    "DaskSource",
    "add_tree_sum",
    "concat_rows",
    "gather_blocks",
    "row_bands",
    "task_name",
]
