"""Compiled loops over a CSR band, where numpy has no fast form: the sparse sign
product, the clipping of rows and the check of a store's column indices.

Problem. ``G^T X`` for a sparse sign operator (``zeta`` entries ``+-c`` per row of
``G``) and a CSR band ``X`` adds each stored entry's ``zeta`` terms
``fl(G[i, t] x_ij)`` into the dense d x N result. In numpy that takes a gather
of the signed rows by output row and a scatter-add of every expanded term
(:func:`pipeline.sketches.sparse_band.sign_left`'s numpy path: about 3-4 ns
per term, with an expanded copy of each chunk of the band).

Solution. The loop itself, compiled by numba on first use in a process and
cached on disk (``numba.njit(cache=True)``): each term is formed and added
once, in the same order as the numpy path (rows ``i`` increasing, onto zero),
so both give the same bits. No reduction is reordered (no fast-math), so the
bits do not depend on the machine's vector width. Importing numba and loading
the cached loop cost a process about 0.3-0.5 s once; ``sign_left`` takes this
path only for products large enough to repay it (:data:`COMPILED_TERMS`).

Two loops add the same terms in two orders, and each output entry receives its
terms in increasing ``i`` in both, so they give the same bits:

* by rows (``_sign_rows``): each row of ``X`` scattered into the ``zeta`` rows
  of the result it feeds. The band is read once; the result's rows are hit at
  random, which is fast while a row of the result is short.
* by targets (``_sign_targets``): output row ``t`` (N entries) stays in the
  core's cache while the rows ``i`` that feed it (``G[i, t] != 0``) are added
  onto it, chunk by chunk of the band's rows (:data:`CHUNK_ENTRIES` stored
  entries each, read again from the cache for each output row). Faster for
  long rows of the result, whose scattered updates miss the cache.

Measured on one thread (random CSR, 8 entries per row of ``G``, d = 40, 100,
400), by rows against by targets: 100000 x 2000 at 1 %: 21-40 against 47-79 ms;
42724 x 1000 at 2.9 %: 12-21 against 25-36 ms; 13421 x 20000 at 1 %: 47-61
against 29-46 ms; 100000 x 20000 at 1 %: 352-436 against 251-335 ms. Hence by
targets from :data:`TARGETS_FROM_COLUMNS` columns on.

Clipping a CSR band's rows (:func:`row_sumsq`, :func:`scale_rows`): numpy
expands each stored entry's row index (``np.repeat``), sums the squares by
``np.bincount`` and multiplies by the gathered factors, about 7 ns per stored
entry with three band-sized temporaries; the loops walk each row's entries in
place, in the order ``bincount`` adds them (one sequential sum per row, onto
zero), so the norms, hence the factors and the clipped values, have the same
bits (:data:`COMPILED_ENTRIES`).

Checking a CSR store's column indices (:func:`index_fault`, pieces of at least
:data:`COMPILED_ENTRIES` entries): the same verdict as numpy's range test then
order test, the range first, without their temporaries.

A dense band of at least :data:`COMPILED_ENTRIES` entries
(:func:`pipeline.sketches.apply.block_partials`): its rows' squared norms
(:func:`dense_row_sumsq`, in the one order of
:func:`pipeline.linalg.clipping.dense_row_sumsq`, each row copied to float64
while it is in cache when a product needs the copy) and the sparse sign product
``G^T X`` read from the stored float32 or float64 rows (:func:`sign_dense_into`,
scipy's terms in scipy's order); a pass whose only product is ``G^T X`` gets
each row's norm, clip factor and product in one loop. On one thread, a
10000 x 1000 float32 band, v = 100, zeta = 8: the clipped ``G^T X`` in 17 ms
against 26 ms for the cast, the norms and scipy's product.

Drawing a tile of a sparse sign operator
(:func:`pipeline.sketches.sparse.sparse_tile`): each round of draws asks which rows
still repeat a column (:func:`repeated_rows`, one pass over the rows with a stamp
per column, against numpy's gather, sort and compare). The answer decides what is
drawn next, so the loop must find exactly numpy's rows, and does; it is taken
only in a process that has already loaded numba for another loop (:func:`loaded`):
a tile costs well under a millisecond either way (1024 rows, zeta = 8: 206 against
278 us at dim 100, 543 against 878 us at dim 21, where a tile takes 40 rounds).

The loops share two helpers (``_add_row``, ``_row_sq``), which numba compiles
into each loop that calls them once :func:`_numba` has registered them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline._types import FloatArray

__all__ = [
    "COMPILED_ENTRIES",
    "COMPILED_TERMS",
    "LANES",
    "TARGETS_FROM_COLUMNS",
    "dense_row_sumsq",
    "index_fault",
    "loaded",
    "repeated_rows",
    "row_sumsq",
    "scale_rows",
    "sign_csr_into",
    "sign_dense_into",
]

#: Expanded terms (stored entries times operator entries) from which a product
#: takes the compiled loop: 2^22, about 15 ms of the numpy path, so that the
#: one-time import and load (0.3-0.5 s) are repaid within a job of a few such
#: products, and small inputs (tests, toy data) never pay it.
COMPILED_TERMS = 1 << 22
#: Stored entries of the band per chunk of the sign product by targets (about
#: 50 MB of a float64 band): at or near the best of 2^14 .. 2^22 measured.
CHUNK_ENTRIES = 1 << 22
#: Columns of the band from which the sign product runs by targets (module
#: docstring): 2000 ran faster by rows, 20000 by targets.
TARGETS_FROM_COLUMNS = 8192
#: Stored entries from which a float64 CSR band's rows are clipped by the
#: compiled loops: 2^20, about 7 ms of the numpy path, on the same reasoning.
COMPILED_ENTRIES = 1 << 20
#: Running sums of a dense row's squares (:func:`dense_row_sumsq`): eight, over
#: the columns ``j = r (mod 8)``, so the loop is not one chain of dependent adds.
LANES = 8


def _add_row(
    out: Any, t: int, w: float, data: Any, indices: Any, p0: int, p1: int
) -> None:  # pragma: no cover
    # out[t] += w x_i for the stored entries p0:p1 of row i (a helper of the loops
    # below, compiled with them: _compiled registers it first)
    for p in range(p0, p1):
        out[t, indices[p]] += w * data[p]


def _sign_rows(
    data: Any,
    indices: Any,
    xptr: Any,
    indptr: Any,
    targets: Any,
    weights: Any,
    out: Any,
) -> None:  # pragma: no cover - runs compiled; tested against the numpy path
    rows = xptr.shape[0] - 1
    for i in range(rows):
        for e in range(indptr[i], indptr[i + 1]):
            _add_row(out, targets[e], weights[e], data, indices, xptr[i], xptr[i + 1])


def _sign_targets(
    data: Any,
    indices: Any,
    xptr: Any,
    gptr: Any,
    sources: Any,
    weights: Any,
    cuts: Any,
    out: Any,
) -> None:  # pragma: no cover - runs compiled; tested against the numpy path
    targets = gptr.shape[0] - 1
    cursor = gptr[:-1].copy()  # per output row: its first entry not yet added
    for k in range(cuts.shape[0] - 1):
        stop = cuts[k + 1]
        for t in range(targets):
            e = cursor[t]
            while e < gptr[t + 1] and sources[e] < stop:
                i = sources[e]
                _add_row(out, t, weights[e], data, indices, xptr[i], xptr[i + 1])
                e += 1
            cursor[t] = e


def _row_sumsq(data: Any, indptr: Any, out: Any) -> None:  # pragma: no cover
    for i in range(indptr.shape[0] - 1):
        s = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            s += data[p] * data[p]
        out[i] = s


def _scale_rows(data: Any, indptr: Any, factors: Any) -> None:  # pragma: no cover
    for i in range(indptr.shape[0] - 1):
        f = factors[i]
        for p in range(indptr[i], indptr[i + 1]):
            data[p] *= f


def _row_sq(x: Any, i: int) -> float:  # pragma: no cover - a compiled helper
    # the squares of row i in float64: LANES running sums over j = r (mod 8), each
    # in increasing j onto zero, added pairwise, then the last n mod 8 in order
    n = x.shape[1]
    body = n - n % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for j in range(0, body, 8):
        v0, v1 = np.float64(x[i, j]), np.float64(x[i, j + 1])
        v2, v3 = np.float64(x[i, j + 2]), np.float64(x[i, j + 3])
        v4, v5 = np.float64(x[i, j + 4]), np.float64(x[i, j + 5])
        v6, v7 = np.float64(x[i, j + 6]), np.float64(x[i, j + 7])
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        a4 += v4 * v4
        a5 += v5 * v5
        a6 += v6 * v6
        a7 += v7 * v7
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(body, n):
        v = np.float64(x[i, j])
        s += v * v
    return s


def _dense_sumsq(x: Any, out: Any, copy: Any, into: Any) -> None:  # pragma: no cover
    for i in range(x.shape[0]):
        out[i] = _row_sq(x, i)
        if copy:  # the row is in the core's cache now
            for j in range(x.shape[1]):
                into[i, j] = x[i, j]


def _sign_dense(
    x: Any,
    cols: Any,
    weights: Any,
    factors: Any,
    clip: Any,
    piece: Any,
    out: Any,
) -> int:  # pragma: no cover - runs compiled; tested against the numpy path
    # clip = (C, shrink): each row's factor from its norm, written to factors; a
    # row whose squares are not finite stops the loop before out is touched
    rows, n = x.shape
    piece[:, :] = 0.0
    for i in range(rows):
        if clip[0] > 0.0:
            s = _row_sq(x, i)
            if not np.isfinite(s):
                return i
            norm = np.sqrt(s)
            factors[i] = (clip[0] / norm) * clip[1] if norm > clip[0] else 1.0
        f = factors[i]
        for e in range(cols.shape[1]):
            t = cols[i, e]
            w = weights[i, e] * f
            for j in range(n):  # in the weights' precision (x is exactly converted)
                piece[t, j] += w * x[i, j]
    for t in range(piece.shape[0]):  # onto the float64 sum of the pieces
        for j in range(n):
            out[t, j] += piece[t, j]
    return -1


def _index_fault(idx: Any, starts: Any, prev: int, n: int) -> int:  # pragma: no cover
    if idx.shape[0] == 0:
        return 0
    if idx.min() < 0 or idx.max() >= n:
        return 1
    k, m = 0, starts.shape[0]
    if idx[0] <= prev and not (m > 0 and starts[0] == 0):
        return 2
    for p in range(1, idx.shape[0]):
        if idx[p] <= idx[p - 1]:  # allowed where a row starts only
            while k < m and starts[k] < p:
                k += 1
            if not (k < m and starts[k] == p):
                return 2
    return 0


def _repeated_rows(cols: Any, rows: Any, dim: int, out: Any) -> int:  # pragma: no cover
    # the rows r of `rows` (in order) with two equal entries in cols[r] (all in
    # [0, dim)), into out: each entry stamps its column with its row's turn
    seen = np.full(dim, -1, dtype=np.int64)
    k = 0
    for turn in range(rows.shape[0]):
        r = rows[turn]
        for a in range(cols.shape[1]):
            c = cols[r, a]
            if seen[c] == turn:
                out[k] = r
                k += 1
                break
            seen[c] = turn
    return k


@functools.cache
def _numba() -> Any:
    """numba, imported once per process, with the helpers the loops call
    registered (compiled into each loop that calls them)."""
    import numba  # heavy: numba, 0.2 s with the cached loop
    from numba.extending import register_jitable  # heavy: numba, as above

    for helper in (_add_row, _row_sq):
        register_jitable(helper)
    return numba


@functools.cache
def _compiled(name: str) -> Callable[..., Any]:
    """The loop ``name`` compiled, made once per process (numba compiles it on
    the first call, or loads it from its cache on disk)."""
    loops: dict[str, Callable[..., Any]] = {
        "rows": _sign_rows, "targets": _sign_targets,
        "sumsq": _row_sumsq, "scale": _scale_rows, "index": _index_fault,
        "dense_sumsq": _dense_sumsq, "sign_dense": _sign_dense,
        "repeats": _repeated_rows,
    }  # fmt: skip
    return _numba().njit(cache=True, nogil=True)(loops[name])  # type: ignore[no-any-return]


def loaded() -> bool:
    """Whether this process has loaded numba for these loops (a large enough
    product took one): then a small loop costs nothing more to load."""
    return _numba.cache_info().currsize > 0


def repeated_rows(cols: Any, rows: Any, dim: int) -> Any:
    """The rows ``r`` of ``rows`` (int64, in their order) whose entries
    ``cols[r]`` (int64, in ``[0, dim)``) are not all distinct: what
    :func:`pipeline.sketches.sparse.sparse_tile` draws again. One call instead
    of numpy's gather, sort and compare per round of draws (a tile of 1024 rows
    at dim 21, zeta 8 takes 40 rounds)."""
    out = np.empty(rows.shape[0], dtype=np.int64)
    k = _compiled("repeats")(cols, rows, int(dim), out)
    return out[:k]


def index_fault(idx: Any, starts: Any, prev: int, n: int) -> int:
    """The first fault of a piece of a CSR store's column indices: 1 when an
    index is outside ``[0, n)``, else 2 when one is not greater than its
    predecessor in its row, else 0. ``starts``: the positions in the piece
    where a row starts (sorted); ``prev``: the index before the piece (checked
    against the first entry unless a row starts there). The range, then the
    order, without a temporary (the numpy check in ``pipeline.io.csr`` makes
    three of the piece's size): 2.0 against 4.2 ms for the 2.7e6 indices of
    one band of a 1% store, 20000 columns."""
    return int(
        _compiled("index")(idx, np.asarray(starts, dtype=np.int64), int(prev), int(n))
    )


def row_sumsq(x: Any) -> FloatArray:
    """Per row of the float64 CSR band ``x``: the sum of its stored entries'
    squares, added in stored order onto zero (``np.bincount``'s bits)."""
    out: FloatArray = np.empty(x.shape[0], dtype=np.float64)
    _compiled("sumsq")(x.data, x.indptr.astype(np.int64, copy=False), out)
    return out


def scale_rows(x: Any, factors: FloatArray) -> None:
    """Multiply, in place, the stored entries of each row ``i`` of the float64
    CSR band ``x`` by ``factors[i]``."""
    f = np.asarray(factors, dtype=np.float64)
    _compiled("scale")(x.data, x.indptr.astype(np.int64, copy=False), f)


def dense_row_sumsq(x: FloatArray, into: FloatArray | None = None) -> FloatArray:
    """Per row of the C-contiguous float32 or float64 matrix ``x``: the sum of
    its entries' squares in float64, in the order of
    :func:`pipeline.linalg.clipping.dense_row_sumsq` (the same bits). ``into``:
    a float64 array of ``x``'s shape that also receives ``x``'s values, each
    row copied while it is in the core's cache."""
    out: FloatArray = np.empty(x.shape[0], dtype=np.float64)
    copy = into is not None
    _compiled("dense_sumsq")(x, out, copy, into if copy else out[:0].reshape(0, 0))
    return out


def sign_dense_into(
    out: FloatArray,
    x: FloatArray,
    cols: Any,
    weights: FloatArray,
    factors: FloatArray,
    *,
    scratch: FloatArray | None = None,
    clip: tuple[float, float] | None = None,
) -> bool:
    """``out += G^T diag(factors) X`` for the rows ``X`` (C-contiguous, float32
    or float64) of a dense band and the sparse sign operator's entries over
    them: row ``i`` of ``X`` feeds rows ``cols[i]`` of ``G^T`` with weights
    ``weights[i]`` (both of shape (rows, zeta)).

    The product is formed onto zero in the precision of ``weights`` and
    ``factors`` (one dtype; in ``scratch``, of ``out``'s shape and that dtype,
    if given), then added to ``out`` (float64); each of its entries receives
    ``fl(fl(weights[i, e] factors[i]) x_ij)`` for the rows ``i`` in increasing
    order, which is what scipy's CSC times dense product of the rows in that
    precision adds (the same bits), without a copy of the rows.

    ``clip``: ``(C, shrink)``; ``factors`` (float64, writable) is overwritten
    with each row's clip factor, computed from its squared norm
    (:func:`pipeline.linalg.clipping.dense_row_sumsq`'s bits) as
    :func:`~pipeline.linalg.clipping.scale_factors_from_sumsq` does
    (``fl(fl(C / norm) shrink)`` above ``C``, else 1), while the row is in the
    core's cache. Returns False, with ``out`` untouched, when a
    row's squares are not finite (NaN, Inf, or an overflow): the caller clears
    or clips such rows first. True otherwise.
    """
    if clip is not None and not clip[0] > 0.0:
        raise ValueError("a clip norm is positive.")
    if np.dtype(weights.dtype) != np.dtype(factors.dtype):
        raise ValueError("the weights and the factors have one dtype.")
    piece = np.empty(out.shape, weights.dtype) if scratch is None else scratch
    stopped = _compiled("sign_dense")(
        x, np.asarray(cols, dtype=np.int64), weights, factors,
        np.array(clip or (0.0, 1.0), dtype=np.float64), piece, out,
    )  # fmt: skip
    return bool(stopped < 0)


def sign_csr_into(out: FloatArray, x: Any, g_t: Any) -> None:
    """``out += g_t @ x`` in place, for a CSR band ``x`` and a CSC ``g_t``.

    ``out`` (d, N) has the dtype of ``g_t.data * x.data``; the operator's
    entries are cast to it, as a product of the two would. Each entry of
    ``out`` receives ``fl(g x_ij)`` for the rows ``i`` in increasing order.
    """
    p0, p1 = int(x.indptr[0]), int(x.indptr[-1])
    xptr = x.indptr.astype(np.int64) - p0
    data, indices = x.data[p0:p1], x.indices[p0:p1]
    if x.shape[1] < TARGETS_FROM_COLUMNS:
        _compiled("rows")(
            data, indices, xptr,
            g_t.indptr.astype(np.int64, copy=False),
            g_t.indices.astype(np.int64, copy=False),
            g_t.data.astype(out.dtype, copy=False), out,
        )  # fmt: skip
        return
    # g_t by output row: its CSC entries stably sorted by row (increasing i kept;
    # int16 rows sort by radix)
    d = g_t.shape[0]
    order = np.argsort(g_t.indices.astype(np.int16 if d < 2**15 else np.int64),
                       kind="stable")  # fmt: skip
    sources = np.repeat(np.arange(g_t.shape[1]), np.diff(g_t.indptr))[order]
    gptr = np.zeros(d + 1, dtype=np.int64)
    np.cumsum(np.bincount(g_t.indices, minlength=d), out=gptr[1:])
    cuts = np.searchsorted(xptr, np.arange(0, p1 - p0, CHUNK_ENTRIES), side="right") - 1
    cuts = np.unique(np.r_[0, cuts, x.shape[0]]).astype(np.int64)
    _compiled("targets")(
        data, indices, xptr, gptr, sources.astype(np.int64, copy=False),
        g_t.data[order].astype(out.dtype, copy=False), cuts, out,
    )  # fmt: skip
