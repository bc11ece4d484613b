"""A compiled loop for the sparse sign product of a CSR band, where numpy has no
fast form.

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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline._types import FloatArray

__all__ = ["COMPILED_TERMS", "sign_csr_into"]

#: Expanded terms (stored entries times operator entries) from which a product
#: takes the compiled loop: 2^22, about 15 ms of the numpy path, so that the
#: one-time import and load (0.3-0.5 s) are repaid within a job of a few such
#: products, and small inputs (tests, toy data) never pay it.
COMPILED_TERMS = 1 << 22


def _sign_csr(
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
            t = targets[e]
            w = weights[e]
            for p in range(xptr[i], xptr[i + 1]):
                out[t, indices[p]] += w * data[p]


@functools.cache
def _compiled() -> Callable[..., None]:
    """:func:`_sign_csr` compiled, made once per process (numba compiles it on
    the first call, or loads it from its cache on disk)."""
    import numba  # heavy: numba, 0.2 s with the cached loop

    return numba.njit(cache=True, nogil=True)(_sign_csr)


def sign_csr_into(out: FloatArray, x: Any, g_t: Any) -> None:
    """``out += g_t @ x`` in place, for a CSR band ``x`` and a CSC ``g_t``.

    ``out`` (d, N) has the dtype of ``g_t.data * x.data``; the operator's
    entries are cast to it, as a product of the two would. Each entry of
    ``out`` receives ``fl(g x_ij)`` for the rows ``i`` in increasing order.
    """
    p0, p1 = int(x.indptr[0]), int(x.indptr[-1])
    _compiled()(
        x.data[p0:p1], x.indices[p0:p1],
        x.indptr.astype(np.int64) - p0,
        g_t.indptr.astype(np.int64, copy=False),
        g_t.indices.astype(np.int64, copy=False),
        g_t.data.astype(out.dtype, copy=False), out,
    )  # fmt: skip
