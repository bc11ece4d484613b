"""Per-block partial sketches: the only kernel that touches the input data.

For a block ``A_rc = A[R_r, C_c]`` the partials of [spec 6.1] are

* right sketch ``A Phi``:   ``A_rc @ Phi[C_c, :]``          -> rows R_r, summed over c;
* left sketch ``S A``:      ``S[:, R_r] @ A_rc``            -> columns C_c, summed over r;
* two-sided ``S A T``:      ``S[:, R_r] @ A_rc @ T[C_c, :]`` -> summed over all blocks.

Linearity makes the partials summable in any grouping, so one pass over the chunks,
in any order on any number of workers, yields the exact sketches. The kernel also
validates (finite values) and clips (privacy unit) each block before any product
(a whole row's clip factor may multiply the operator's entries or the row's product
instead of its entries: the same product, ``S diag(f) X = S (diag(f) X)``). A dense
band is handled in cache-sized pieces of rows, with no float64 copy of the band
(:data:`PIECE_BYTES`); from :data:`COMPILED_ENTRIES` entries on, its norms and its
sparse sign products run in compiled loops on the stored rows
(:mod:`pipeline.linalg.compiled`: the same bits as the numpy path).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from pipeline._types import FloatArray
from pipeline.errors import NonFiniteInputError
from pipeline.linalg.clipping import (
    CLIP_SHRINK,
    clip_by_peak,
    dense_row_sumsq,
    scale_factors_from_sumsq,
    sparse_clip,
    sparse_zero_non_finite,
    stored_float,
    zero_non_finite,
)
from pipeline.linalg.compiled import COMPILED_ENTRIES, sign_dense_into
from pipeline.params import ClipSpec, PrivacyUnit
from pipeline.sketches.operators import SketchOperator
from pipeline.sketches.sparse import SparseSignOperator
from pipeline.sketches.sparse_band import left_product, sparse_left, sparse_right


@dataclass(frozen=True, kw_only=True, slots=True)
class PassRequest:
    """Everything one pass over ``A`` must produce, described without data.

    The sketches are of the *oriented* matrix ``X`` = ``A`` or ``A.T``
    (``transpose``); clipping always follows ``A``'s own rows and columns.

    Parameters
    ----------
    transpose : bool
        Sketch ``X = A.T`` instead of ``A``.
    clip : ClipSpec or None
        Clipping of ``A`` (None: non-private mode, no clipping).
    right : tuple of (name, SketchOperator)
        Right sketches ``X @ G``, of shape (X rows, d); ``G.length`` = X columns.
    left : tuple of (name, SketchOperator)
        Left sketches ``G.T @ X``, of shape (d, X columns); ``G.length`` = X rows.
    two_sided : tuple of (name, SketchOperator, SketchOperator)
        ``S.T @ X @ T``, of shape (d_S, d_T).
    compute_dtype : numpy dtype
        Dtype of the block products (partials are accumulated in float64).
    local_qr : tuple of (right name, left name)
        Non-private runs only. For a source whose row blocks of ``X`` are whole
        chunks, the right sketch's block ``Y_b`` is returned orthonormalised,
        ``Y_b = Q_b R_b``, with two more results per pair: ``"<right>_R"``
        (``R_b``) and ``"<right>_left"`` (``G_b^T Q_b`` for the named left
        sketch's operator ``G``). A block with fewer rows ``r`` than ``t`` is
        returned as is, with ``R_b = Y_b`` (``Q_b = I``) and ``G_b^T`` padded
        with zero columns to ``t``. This is the first level of a TSQR done where the
        block is computed, and it gives ``S Q`` without regenerating ``S`` later.
        Refused with clipping: a private ``Y`` gets its noise before any QR.
    """

    transpose: bool
    clip: ClipSpec | None
    right: tuple[tuple[str, SketchOperator], ...] = ()
    left: tuple[tuple[str, SketchOperator], ...] = ()
    two_sided: tuple[tuple[str, SketchOperator, SketchOperator], ...] = field(
        default=()
    )
    compute_dtype: type = np.float64
    local_qr: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.local_qr and self.clip is not None:
            raise ValueError(
                "local_qr is for non-private passes: a private range sketch is "
                "noised after the global sum, before it is orthonormalised."
            )
        rights, lefts = {n for n, _ in self.right}, {n for n, _ in self.left}
        for r, left in self.local_qr:
            if r not in rights or left not in lefts:
                raise ValueError(
                    f"local_qr pair ({r!r}, {left!r}) names no right/left sketch."
                )

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the results, in the order :func:`block_partials` returns them."""
        return (
            tuple(n for n, _ in self.right)
            + tuple(n for n, _ in self.left)
            + tuple(n for n, _, _ in self.two_sided)
            + tuple(x for r, _ in self.local_qr for x in (f"{r}_R", f"{r}_left"))
        )


def check_finite_block(block: FloatArray, where: str) -> None:
    """Raise :class:`NonFiniteInputError` naming ``where`` if a partial sketch
    of it overflowed (NaN/Inf).

    Non-finite input never gets here (:func:`zero_non_finite` zeroes its
    individuals first); clipped rows cannot overflow a sketch either, so
    this fires only for a run without clipping (``--non-private``) on values
    near the float limit.

    Notes
    -----
    Privacy. The error names the chunk, never a value or a count of entries
    [design 3.6].
    """
    if not np.isfinite(block).all():
        raise NonFiniteInputError(
            f"a sketch of {where} overflowed the floating-point range (values near "
            "the float limit in a run without clipping); rescale the input "
            "(no value is shown here, by design)."
        )


def clip_block(
    block: FloatArray,
    clip: ClipSpec | None,
    row_scale: FloatArray | None = None,
    col_scale: FloatArray | None = None,
    *,
    inplace: bool = False,
) -> FloatArray:
    """Clip one block of ``A`` for its privacy unit.

    Parameters
    ----------
    block : ndarray of shape (b_rows, b_cols)
    clip : ClipSpec or None
    row_scale : ndarray of shape (b_rows,) or None
        Precomputed row factors (unit ``row``); None when the block spans all
        columns, so the factors are computed from the block itself.
    col_scale : ndarray of shape (b_cols,) or None
        Same for unit ``column``.
    inplace : bool
        Overwrite ``block`` (when the caller owns it) instead of copying it.

    Returns
    -------
    ndarray of shape (b_rows, b_cols)

    Notes
    -----
    Privacy. After this step every individual's contribution has Frobenius norm
    ``<= clip.clip_norm`` [spec 1.3, rule 6]; the factors are never returned.
    """
    if clip is None:
        return block
    out = block if inplace else None
    if clip.unit is PrivacyUnit.ENTRY:
        return np.clip(block, -clip.clip_norm, clip.clip_norm, out=out)
    if clip.unit is PrivacyUnit.ROW:
        if row_scale is not None:
            return np.multiply(
                block, row_scale.astype(block.dtype, copy=False)[:, None], out=out
            )
        return _clip_vectors(block, clip.clip_norm, out)
    if col_scale is not None:
        return np.multiply(
            block, col_scale.astype(block.dtype, copy=False)[None, :], out=out
        )
    return _clip_vectors(block.T, clip.clip_norm, None if out is None else out.T).T


def _clip_vectors(
    x: FloatArray, clip_norm: float, out: FloatArray | None
) -> FloatArray:
    """Rows of ``x`` clipped to norm ``<= C`` from their own norms (into ``out``)."""
    sumsq = np.einsum("ij,ij->i", x, x, dtype=np.float64)
    # a finite row whose squares overflow (entries near 1e154 and up) would get
    # the factor C / inf = 0: zeroed instead of clipped; those rows go by peak
    huge = np.flatnonzero(np.isposinf(sumsq))
    kept = clip_by_peak(x[huge], clip_norm) if huge.size else None
    scale = scale_factors_from_sumsq(sumsq, clip_norm)
    if kept is None and not (scale < 1.0).any():
        # no row to clip (data scaled within C): a product by ones would change no
        # bit and cost a pass over the block; x is out when clipping in place
        return x
    res = np.multiply(x, scale.astype(x.dtype, copy=False)[:, None], out=out)
    if kept is not None:
        res[huge] = kept
    return res


def block_partials(
    block: Any,
    row0: int,
    col0: int,
    request: PassRequest,
    *,
    row_scale: FloatArray | None = None,
    col_scale: FloatArray | None = None,
    where: str = "the input",
    left_blocks: Mapping[str, Any] | None = None,
) -> tuple[FloatArray, ...]:
    """Partial sketches of one block of ``A`` starting at ``(row0, col0)``.

    Parameters
    ----------
    block : ndarray, scipy.sparse matrix or PreparedBand of shape (b_rows, b_cols)
        ``A[row0:row0 + b_rows, col0:col0 + b_cols]``. A sparse block (e.g. a
        CSR row band) is handled on its stored entries, in O(non-zeros), and
        never densified; its partials equal those of ``block.toarray()`` up to
        the rounding of a different summation order
        (:mod:`~pipeline.sketches.sparse_band`). A :class:`PreparedBand` is
        already cleared and clipped as ``request`` asks: straight to the products.
    row0, col0 : int
        Offsets of the block in ``A``.
    request : PassRequest
    row_scale, col_scale : ndarray or None
        See :func:`clip_block`.
    where : str
        Name of the block for error messages, e.g. ``"chunk (3, 0)"``.
    left_blocks : mapping or None
        For a sparse block: the blocks ``op.left_block(...)`` of the left
        operators over this block's rows of ``X``, by sketch name, when the
        caller already made them (an in-memory source keeps them for its later
        products with ``S``); None: made here. A dense block makes its own.

    Returns
    -------
    tuple of float64 ndarrays, in ``request.names`` order
        Right partials of shape (b_x_rows, d), left partials of shape
        (d, b_x_cols), two-sided partials of shape (d_S, d_T).

    Notes
    -----
    Privacy. Zeroes the individuals holding NaN or Inf, then clips, before any
    product [design 3.5] (a dense band's whole rows by factors that the products
    take on their small side, :func:`_prepare_piece`: the same products of the
    clipped rows). The partials are as sensitive as the data: they are only
    ever summed, then noised by the algorithm.
    """
    if isinstance(block, PreparedBand):
        if not block.serves(request) or row_scale is not None or col_scale is not None:
            raise ValueError(f"{where} was prepared for another clipping or dtype.")
        return _sparse_products(block.matrix, row0, col0, request, where, left_blocks)
    if sp.issparse(block):
        return _sparse_partials(
            block, row0, col0, request, (row_scale, col_scale), where, left_blocks
        )
    a = np.asarray(block)
    if not np.issubdtype(a.dtype, np.number) or np.issubdtype(
        a.dtype, np.complexfloating
    ):
        raise NonFiniteInputError(f"{where} has non-numeric dtype {a.dtype}.")
    if _fused_applies(request):
        return _fused_partials(a, row0, col0, request, row_scale, where)
    owned = a.dtype != request.compute_dtype  # astype copies: clip in place then
    a = a.astype(request.compute_dtype, copy=False)
    # the unit holding NaN/Inf counts as zero (rows when no unit: a non-private run)
    zeroed = zero_non_finite(a, None if request.clip is None else request.clip.unit)
    owned, a = owned or zeroed is not a, zeroed
    with np.errstate(over="ignore"):
        a = clip_block(a, request.clip, row_scale, col_scale, inplace=owned)
    x, xr0, xc0 = (a.T, col0, row0) if request.transpose else (a, row0, col0)
    xr1, xc1 = xr0 + x.shape[0], xc0 + x.shape[1]
    dt = request.compute_dtype
    out: list[FloatArray] = []
    for _, op in request.right:
        out.append(_f64(op.right(x, xc0, xc1, dt)))
    # the left operators' blocks are kept for the local QR's G_b^T Q_b
    left_blocks = {name: op.left_block(xr0, xr1, dt) for name, op in request.left}
    for name, _ in request.left:
        out.append(_f64(left_blocks[name] @ x))
    for _, s_op, t_op in request.two_sided:
        # contract the longer side of the block first: fewer flops [spec 6.1]; a
        # sparse S costs zeta per entry of the block, so it always goes first
        if isinstance(s_op, SparseSignOperator) or x.shape[1] >= x.shape[0]:
            out.append(_f64(t_op.right(s_op.left(x, xr0, xr1, dt), xc0, xc1, dt)))
        else:
            out.append(_f64(s_op.left(t_op.right(x, xc0, xc1, dt), xr0, xr1, dt)))
    return _finish_partials(out, left_blocks, request, where)


#: Float64 bytes of the row pieces a dense band is prepared and multiplied in
#: (:func:`_fused_partials`): a piece is cast, cleared of non-finite rows,
#: clipped and multiplied while it is in the core's cache, and the band never
#: has a float64 copy of its own.
PIECE_BYTES = 2**23


def _fused_applies(request: PassRequest) -> bool:
    """Whether :func:`_fused_partials` computes a dense block's partials: the
    rows of ``X`` are the block's own rows (no transpose) and each individual
    lies within one row of the block (not the column unit, whose non-finite
    check and norms need whole columns)."""
    unit = None if request.clip is None else request.clip.unit
    return not request.transpose and unit is not PrivacyUnit.COLUMN


def piece_rows(n_cols: int) -> int:
    """Rows of one piece of a band with ``n_cols`` columns (:data:`PIECE_BYTES`),
    from the shape alone, so the summation order never depends on the data."""
    return max(16, PIECE_BYTES // (8 * max(n_cols, 1)))


def _right_factor(
    op: SketchOperator, start: int, stop: int, dt: type
) -> Callable[[FloatArray], FloatArray]:
    """``x -> x @ G[start:stop]`` with the operator's block made once per band."""
    if isinstance(op, SparseSignOperator):
        g_t = op.left_block(start, stop, dt)
        return lambda x: np.asarray(g_t @ x.T).T
    # a Gaussian operator's block is generated once per job on a worker
    # (GaussianOperator.right_block); a DenseOperator's is a slice of its matrix.
    # (G^T X^T)^T: this BLAS makes the few columns of a tall-skinny product
    # 15-30% faster as rows of G^T times the transposed rows of X (no copy).
    g_t = np.ascontiguousarray(getattr(op, "right_block", op.block)(start, stop, dt).T)
    return lambda x: np.asarray(g_t @ x.T).T


class _LeftFactor:
    """``G[start:stop].T`` of one band, applied piece by piece: ``add_piece(z, x,
    a, b)`` adds ``G[start + a:start + b].T @ x`` to ``z``, with the operator
    made once per band. ``fast``: a sparse sign operator's product of a C-contiguous
    float32 or float64 piece runs in a compiled loop on the stored rows
    (:func:`pipeline.linalg.compiled.sign_dense_into`: the same bits as scipy's
    product of their float64 copy, without the copy)."""

    def __init__(
        self, op: SketchOperator, start: int, stop: int, dt: type, fast: bool = False
    ) -> None:
        self.dim = op.dim
        self.sparse = isinstance(op, SparseSignOperator)
        self.fast = fast and self.sparse
        self.ones: FloatArray = np.ones(stop - start if self.fast else 0, dtype=dt)
        self.scratch: FloatArray | None = None  # the compiled product's
        if isinstance(op, SparseSignOperator):
            cols, vals = op.structure(start, stop)
            self.zeta = op.zeta
            self.cols2d = cols
            self.vals2d: FloatArray = vals.astype(dt, copy=False)
            self.cols = cols.ravel()
            self.vals: FloatArray = self.vals2d.ravel()
            self.indptr = np.arange(0, cols.size + 1, op.zeta, dtype=np.int64)
        else:
            self.block = op.left_block(start, stop, dt)

    def add_piece(
        self,
        z: FloatArray,
        x: FloatArray,
        a: int,
        b: int,
        factors: FloatArray | None = None,
    ) -> None:
        """``z += G[start + a:start + b].T @ diag(factors) @ x`` (``factors``: the
        rows' clip factors, applied to the operator's entries: O(rows zeta) or
        O(rows dim) instead of a pass over the rows)."""
        if self.fast and stored_float(x):
            f = self.ones[: b - a] if factors is None else factors
            self._compiled(z, x, a, b, f, None)
            return
        if not self.sparse:
            g = self.block[:, a:b]
            z += np.asarray((g if factors is None else g * factors) @ x)
            return
        k = self.zeta
        vals = self.vals[a * k : b * k]
        if factors is not None:
            vals = vals * np.repeat(factors, k)
        g_t = sp.csc_array(
            (vals, self.cols[a * k : b * k], self.indptr[: b - a + 1]),
            shape=(self.dim, b - a),
        )
        z += np.asarray(g_t @ x)

    def add_clipped_piece(
        self, z: FloatArray, raw: FloatArray, a: int, b: int, clip_norm: float
    ) -> bool:
        """:meth:`add_piece` of the stored rows ``raw`` clipped to norm
        ``clip_norm``, their norms and factors computed in the product's loop
        (the bits of :func:`_prepare_piece` then :meth:`add_piece`). False, with
        ``z`` untouched, when a row's squares are not finite: the piece then
        takes :func:`_prepare_piece`, which clears or clips such rows."""
        factors = np.empty(b - a)
        return self._compiled(z, raw, a, b, factors, (clip_norm, CLIP_SHRINK))

    def _compiled(
        self,
        z: FloatArray,
        x: FloatArray,
        a: int,
        b: int,
        factors: FloatArray,
        clip: tuple[float, float] | None,
    ) -> bool:
        if self.scratch is None or self.scratch.shape != z.shape:
            self.scratch = np.empty(z.shape, dtype=self.vals2d.dtype)
        return sign_dense_into(
            z, x, self.cols2d[a:b], self.vals2d[a:b], factors,
            scratch=self.scratch, clip=clip,
        )  # fmt: skip

    def whole(self) -> Any:
        """``G[start:stop].T``, the operator's ``left_block`` of the band, from the
        block made once here (for the local QR's finishing products)."""
        if not self.sparse:
            return self.block
        n = self.indptr.size - 1
        return sp.csc_array((self.vals, self.cols, self.indptr), shape=(self.dim, n))


def _prepare_piece(
    raw: Any,
    buf: FloatArray,
    request: PassRequest,
    row_scale: FloatArray | None,
    *,
    fast: bool,
    cast: bool,
) -> tuple[FloatArray, FloatArray | None]:
    """Rows ``raw`` cleared of their non-finite individuals and clipped
    (:func:`block_partials`'s steps, on one piece), cast into ``buf``.

    Returns ``(x, f)``: the clipped rows are ``x * f[:, None]`` (``f`` None:
    ``x`` itself). The factors of whole rows are returned rather than applied --
    the products take them on their small side (the operator's entries, the
    product's rows), as the PCA kernels do -- so a clipped row costs no pass
    over its entries. Their norms come from the stored values, exactly
    converted (:func:`~pipeline.linalg.clipping.dense_row_sumsq`, while the
    rows are cast when ``cast``); whole rows of finite float32 or float64
    entries (the common case) are returned uncast when ``cast`` is False, for
    products that take them as they are. ``fast``: in compiled loops.
    """
    clip = request.clip
    if clip is None and raw.dtype == buf.dtype:
        # nothing to clip or cast: the stored rows, or a copy of them with the
        # rows holding NaN/Inf zeroed
        return zero_non_finite(raw, None), None
    x = buf[: raw.shape[0]]
    if clip is None or clip.unit is not PrivacyUnit.ROW or row_scale is not None:
        np.copyto(x, raw, casting="unsafe")
        zeroed = zero_non_finite(x, None if clip is None else clip.unit)
        if zeroed is not x:
            x[...] = zeroed
        # entries, or the factors of rows split over column chunks: applied to
        # the rows themselves (such a row's squares may overflow, and so may its
        # unclipped products)
        with np.errstate(over="ignore"):
            return clip_block(x, clip, row_scale, None, inplace=True), None
    if stored_float(raw):
        sumsq = dense_row_sumsq(raw, fast=fast, into=x if cast else None)
        if np.isfinite(sumsq).all():
            return (x if cast else raw), _factors(sumsq, clip.clip_norm)
        if not cast:
            np.copyto(x, raw)
    else:
        np.copyto(x, raw, casting="unsafe")
    with np.errstate(over="ignore"):
        return x, _row_factors(x, clip.clip_norm, fast)


def _row_factors(x: FloatArray, clip_norm: float, fast: bool) -> FloatArray | None:
    """The clip factors of the whole float64 rows ``x`` (None: no row is clipped).

    Finite squared norms (the common case) mean finite entries and no
    overflow: the norms are the non-finite check. Otherwise the rows holding
    NaN/Inf are zeroed in ``x`` (factor 1: a zero row) and the rows whose
    squares overflow are clipped in ``x`` by their peak
    (:func:`~pipeline.linalg.clipping.clip_by_peak`, factor 1); every other
    row gets the same factor either way.
    """
    sumsq = dense_row_sumsq(x, fast=fast)
    if not np.isfinite(sumsq).all():
        zeroed = zero_non_finite(x, PrivacyUnit.ROW)
        if zeroed is not x:
            x[...] = zeroed
            sumsq = dense_row_sumsq(x, fast=fast)
        huge = np.flatnonzero(np.isposinf(sumsq))
        if huge.size:
            x[huge] = clip_by_peak(x[huge], clip_norm)
            sumsq[huge] = 0.0
    return _factors(sumsq, clip_norm)


def _factors(sumsq: FloatArray, clip_norm: float) -> FloatArray | None:
    """The clip factors of rows of squared norms ``sumsq`` (None: none is below 1)."""
    f = scale_factors_from_sumsq(sumsq, clip_norm)
    return f if (f < 1.0).any() else None


def _scaled_rows(y: FloatArray, f: FloatArray | None) -> FloatArray:
    """``diag(f) y`` (``y`` itself when ``f`` is None), in place: ``y`` is a
    fresh product."""
    if f is not None:
        y *= f[:, None]
    return y


def _fused_partials(
    a: Any,
    row0: int,
    col0: int,
    request: PassRequest,
    row_scale: FloatArray | None,
    where: str,
) -> tuple[FloatArray, ...]:
    """:func:`block_partials` of a dense block, one piece of rows at a time.

    Each piece of :func:`piece_rows` rows is cast into one reusable buffer,
    cleared of non-finite individuals and clipped there (row factors applied on
    the products' small side, :func:`_prepare_piece`), and multiplied while it
    is in cache: the right sketches' rows are written out, the left and
    two-sided ones summed over the pieces in a fixed order. No band-sized
    temporary is formed. A band of at least :data:`COMPILED_ENTRIES` entries
    takes the compiled loops (the same bits): its norms and sparse sign
    products read the stored float32 or float64 rows, which are cast only for
    the products that need float64 rows; a pass whose only product is one
    sparse sign ``G^T X`` of whole clipped rows gets each row's norm, factor and
    product in one loop (:meth:`_LeftFactor.add_clipped_piece`). The result equals the whole-band computation up to
    rounding: a different summation order of the left products (a sum of sums
    over the pieces) and one more rounding per term where a row factor
    multiplies an operator entry or a product instead of the row's entries.
    """
    n, width = a.shape
    dt = request.compute_dtype
    xr1, xc1 = row0 + n, col0 + width
    fast = n * width >= COMPILED_ENTRIES
    rights = [_right_factor(op, col0, xc1, dt) for _, op in request.right]
    lefts = [_LeftFactor(op, row0, xr1, dt, fast) for _, op in request.left]
    # the stored rows serve as they are when every product takes them so
    cast = bool(request.right or request.two_sided) or not all(g.fast for g in lefts)
    # one sparse sign product of whole stored rows: norms, factors and product
    # in one loop over each row
    c = 0.0 if request.clip is None else request.clip.clip_norm
    fused = (
        not cast
        and len(lefts) == 1
        and request.clip is not None
        and request.clip.unit is PrivacyUnit.ROW
        and row_scale is None
        and stored_float(a)
    )
    # two-sided: S first (a sum over pieces, then T) or T first (X T per piece,
    # then S), chosen from the band's shape as the whole-band kernel does
    s_first = [
        isinstance(s, SparseSignOperator) or width >= n for _, s, _ in request.two_sided
    ]
    s_lefts = [_LeftFactor(s, row0, xr1, dt) for _, s, _ in request.two_sided]
    t_rights = [_right_factor(t, col0, xc1, dt) for _, _, t in request.two_sided]
    right_out = [np.empty((n, op.dim)) for _, op in request.right]
    left_out = [np.zeros((op.dim, width)) for _, op in request.left]
    two_out = [
        np.zeros((s.dim, width if first else t.dim))
        for (_, s, t), first in zip(request.two_sided, s_first, strict=True)
    ]
    step = piece_rows(width)
    buf = _piece_buffer(min(step, n), width, dt)
    for p0 in range(0, n, step):
        p1 = min(p0 + step, n)
        if fused and lefts[0].add_clipped_piece(left_out[0], a[p0:p1], p0, p1, c):
            continue
        scale = None if row_scale is None else row_scale[p0:p1]
        x, f = _prepare_piece(a[p0:p1], buf, request, scale, fast=fast, cast=cast)
        for right, y in zip(rights, right_out, strict=True):
            y[p0:p1] = _scaled_rows(right(x), f)
        for g, z in zip(lefts, left_out, strict=True):
            g.add_piece(z, x, p0, p1, f)
        for i, first in enumerate(s_first):
            if first:
                s_lefts[i].add_piece(two_out[i], x, p0, p1, f)
            else:
                y = _scaled_rows(t_rights[i](x), f)
                s_lefts[i].add_piece(two_out[i], y, p0, p1)
    out = right_out + left_out
    for i, (_, _, t_op) in enumerate(request.two_sided):
        w = two_out[i]
        out.append(_f64(t_op.right(w, col0, xc1, dt)) if s_first[i] else w)
    # the local QR's left blocks are the band's operators made above, not made again
    left_blocks = {
        name: g.whole()
        for (name, _), g in zip(request.left, lefts, strict=True)
        if any(name == lname for _, lname in request.local_qr)
    }
    return _finish_partials(out, left_blocks, request, where)


_PIECES = threading.local()


def _piece_buffer(rows: int, width: int, dtype: Any) -> FloatArray:
    """A (rows, width) array of ``dtype`` in memory this thread keeps for the
    pieces of its bands (at most :data:`PIECE_BYTES` and one row): a band's
    pieces then never take fresh pages from the system, as an array made per
    band does where the allocator returns freed memory at once (dask's workers
    set ``MALLOC_TRIM_THRESHOLD_``)."""
    size = rows * width * np.dtype(dtype).itemsize
    held = getattr(_PIECES, "buf", None)
    if held is None or held.nbytes < size:
        held = _PIECES.buf = np.empty(max(size, PIECE_BYTES), dtype=np.uint8)
    out: FloatArray = held[:size].view(dtype).reshape(rows, width)
    return out


def _finish_partials(
    out: list[FloatArray],
    left_blocks: dict[str, Any],
    request: PassRequest,
    where: str,
) -> tuple[FloatArray, ...]:
    """Check the partials for overflow, then the local QR of ``request.local_qr``."""
    # the block is finite now; an unclipped (non-private) product of values near the
    # float limit can still overflow, which shows in the small outputs
    for part in out:
        check_finite_block(part, where)
    right_index = {name: i for i, (name, _) in enumerate(request.right)}
    for rname, lname in request.local_qr:
        i = right_index[rname]
        y = out[i]
        rows, t = y.shape
        if rows >= t:
            # y = q r, q (rows, t) orthonormal, r (t, t); y is this task's own array
            # and already checked finite (scipy's economic QR: half numpy's time)
            q, r = scipy.linalg.qr(
                y, mode="economic", overwrite_a=True, check_finite=False
            )
            out[i] = q
            out += [r, _f64(left_blocks[lname] @ q)]
        else:
            # a block shorter than t is its own R (its Q is the identity); its G^T
            # is padded with zero columns to the common (d, t) block shape
            g_t = left_blocks[lname] @ np.eye(rows)
            out += [y, np.hstack([g_t, np.zeros((g_t.shape[0], t - rows))])]
    return tuple(out)


def _sparse_partials(
    block: Any,
    row0: int,
    col0: int,
    request: PassRequest,
    scales: tuple[FloatArray | None, FloatArray | None],
    where: str,
    given: Mapping[str, Any] | None,
) -> tuple[FloatArray, ...]:
    """:func:`block_partials` of a scipy sparse block, in O(non-zeros).

    The same steps as for a dense block -- dtype check, non-finite individuals
    zeroed, clipping, then the products -- on the stored entries only
    (:func:`~pipeline.linalg.clipping.sparse_clip`,
    :mod:`~pipeline.sketches.sparse_band`); no dense block of the input is formed.
    """
    a = _prepared_csr(block, request.clip, request.compute_dtype, scales, where)
    return _sparse_products(a, row0, col0, request, where, given)


def _prepared_csr(
    block: Any,
    clip: ClipSpec | None,
    dt: Any,
    scales: tuple[FloatArray | None, FloatArray | None],
    where: str,
    *,
    owned: bool = False,
) -> Any:
    """The CSR ``block`` with values of dtype ``dt``, its non-finite individuals
    zeroed and clipped; ``owned``: its values may be changed in place (a band
    read for this step alone), else they are copied first."""
    if not np.issubdtype(block.dtype, np.number) or np.issubdtype(
        block.dtype, np.complexfloating
    ):
        raise NonFiniteInputError(f"{where} has non-numeric dtype {block.dtype}.")
    src = sp.csr_matrix(block)  # no copy for a CSR matrix
    # this step's own values (zeroed and clipped in place below); the structure
    # is shared, since no step changes it
    values = src.data
    if not (owned and values.dtype == dt and values.flags.writeable):
        values = np.array(values, dtype=dt, copy=True)
    a = sp.csr_matrix((values, src.indices, src.indptr), shape=src.shape)
    sparse_zero_non_finite(a, None if clip is None else clip.unit)
    with np.errstate(over="ignore"):
        sparse_clip(a, clip, *scales)
    return a


@dataclass(frozen=True, slots=True)
class PreparedBand:
    """A sparse row band of ``A`` already cleared of its non-finite individuals
    and clipped (:func:`prepare_sparse_band`): what a job holds in worker
    memory between passes that all prepare it the same way, so a later pass
    goes straight to the products (:func:`block_partials`).

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix
        The prepared band, values of dtype ``dtype``.
    clip : ClipSpec or None
    dtype : numpy.dtype
    """

    matrix: Any
    clip: ClipSpec | None
    dtype: np.dtype

    def serves(self, request: PassRequest) -> bool:
        """Whether ``request`` prepares its band as this one was."""
        return prepared_alike(request, self.clip, self.dtype)


def prepared_alike(request: PassRequest, clip: ClipSpec | None, dtype: Any) -> bool:
    """Whether ``request`` prepares a band as ``clip`` and ``dtype`` do."""
    return request.clip == clip and np.dtype(request.compute_dtype) == np.dtype(dtype)


def band_local_clip(clip: ClipSpec | None, one_band: bool) -> bool:
    """Whether a full-width band can be prepared alone: its individuals lie
    within it (entries, rows; columns only when the band holds every row)."""
    if clip is None or clip.unit is not PrivacyUnit.COLUMN:
        return True
    return one_band


def prepare_sparse_band(
    block: Any, clip: ClipSpec | None, dtype: Any, where: str, owned: bool = False
) -> PreparedBand:
    """A sparse band prepared for every pass that clips with ``clip`` in
    ``dtype`` (:class:`PreparedBand`): the values :func:`block_partials` would
    compute from it, bit for bit; ``owned``: the band was read for this call
    alone, and is prepared in place."""
    a = _prepared_csr(block, clip, dtype, (None, None), where, owned=owned)
    return PreparedBand(matrix=a, clip=clip, dtype=np.dtype(dtype))


def _sparse_products(
    a: Any,
    row0: int,
    col0: int,
    request: PassRequest,
    where: str,
    given: Mapping[str, Any] | None,
) -> tuple[FloatArray, ...]:
    """The partials of a prepared sparse block ``a``."""
    dt = request.compute_dtype
    x, xr0, xc0 = (a.T, col0, row0) if request.transpose else (a, row0, col0)
    xr1, xc1 = xr0 + x.shape[0], xc0 + x.shape[1]
    out: list[FloatArray] = []
    for _, op in request.right:
        out.append(_f64(sparse_right(op, x, xc0, xc1, dt)))
    left_blocks = {
        name: op.left_block(xr0, xr1, dt) if given is None else given[name]
        for name, op in request.left
    }
    for name, _ in request.left:
        out.append(_f64(left_product(left_blocks[name], x)))
    for _, s_op, t_op in request.two_sided:
        # X T first costs nnz d_T, then S^T (X T) b d_T d_S (zeta for a sparse S);
        # S^T X first nnz d_S, then N d_S d_T. The order is chosen from the
        # shapes alone (b zeta or b d_S against N d_S), never from nnz: the rounding of
        # the result must not depend on the data
        d_s = s_op.zeta if isinstance(s_op, SparseSignOperator) else s_op.dim
        if x.shape[0] * d_s <= x.shape[1] * s_op.dim:
            xt = sparse_right(t_op, x, xc0, xc1, dt)
            out.append(_f64(s_op.left(xt, xr0, xr1, dt)))
        else:
            out.append(
                _f64(t_op.right(sparse_left(s_op, x, xr0, xr1, dt), xc0, xc1, dt))
            )
    return _finish_partials(out, left_blocks, request, where)


def _f64(x: FloatArray) -> FloatArray:
    return np.asarray(x, dtype=np.float64)
