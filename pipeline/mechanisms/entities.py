"""Per-entity clipping of turnstile updates with a budget that spans epochs.

Problem. A stream of update quadruples ``(e, i, j, s)`` ("entity e adds s to
``A[i, j]``") arrives in batches over epochs. Removing entity e changes the
matrix by ``D_e``, the sum of all of e's updates, insertions and deletions
alike; the continual neighbour relation [spec sketch-lrf 1.4] is
``sum_tau ||D_{e,tau}||_F <= C``. Enforce it without trusting the data
[spec 1.3, rules 2-4]:

* within a batch, coalesce e's updates of the same cell and measure the **net**
  contribution ``c_e = ||D_{e,batch}||_F`` (never update by update: a +s / -s
  pair is free, a thousand +s updates of one cell are not);
* keep a remaining budget ``b_e = C - spent_e`` per entity, across batches and
  epochs; scale e's batch contribution by ``min(1, b_e / c_e)`` and add the
  norm actually applied to ``spent_e``. Deletions spend budget too;
* for the units ``row``, ``column`` and ``entry``, refuse an entity whose
  updates, over the whole stream, touch more than one row (column, cell);
  for an *exclusive* stream, also refuse a row (column, cell) touched by two
  entities over the whole stream. Then one row's (column's, cell's)
  individual is exactly one entity, and a guarantee per entity is one per row
  (column, cell): the stream is a release at that matrix unit.

By the triangle inequality the per-epoch difference ``||D_{e,tau}||_F`` is at
most the sum of its batches' applied norms, so every entity's stream-long
contribution satisfies the relation above whatever the batches hold.

Each entity's factor depends only on its own updates, so adding or removing an
entity changes nothing for the others: the clipping itself leaks nothing
[spec 4.6]. The table of spent budgets is as sensitive as the data and lives
only in the stream state.

References
----------
.. [Upa18] J. Upadhyay, "The price of privacy for low-rank factorization",
   NeurIPS 2018 (seed paper); corrected by spec sketch-lrf.md 1.3-1.4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline._types import FloatArray, IntArray
from pipeline.errors import InvalidParameterError, PrivacyUnitError
from pipeline.params import StreamUnit

__all__ = [
    "ClippedBatch",
    "EntityTable",
    "StreamUnit",
    "clip_updates",
    "coalesce",
    "zero_non_finite_entities",
]

# Contributions are clipped to (1 - 1e-9) C, so rounding in the norms (a few ulps
# per epoch) can never push a stream-long total above C.
_CLIP_MARGIN = 1.0 - 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class EntityTable:
    """Budget spent by each entity so far, sorted by key.

    Attributes
    ----------
    keys : ndarray of int64, shape (n_entities,)
        Sorted, unique entity keys.
    spent : ndarray of float64, shape (n_entities,)
        Frobenius norm applied so far, ``<= C``.
    anchor : ndarray of int64, shape (n_entities,)
        The row (unit ``row``), column (``column``) or flat cell ``i n + j``
        (``entry``) the entity is bound to; -1 for ``general``.
    """

    keys: IntArray
    spent: FloatArray
    anchor: IntArray

    @classmethod
    def empty(cls) -> EntityTable:
        z = np.zeros(0, dtype=np.int64)
        return cls(keys=z, spent=np.zeros(0), anchor=z.copy())

    def __len__(self) -> int:
        return int(self.keys.size)

    def __repr__(self) -> str:  # the table is private: never print its content
        return f"EntityTable(<{len(self)} entities>)"


@dataclass(frozen=True, kw_only=True, slots=True)
class ClippedBatch:
    """A batch after clipping: cells coalesced over entities, and the new table.

    ``rows``, ``cols`` are sorted by (row, col) and unique; ``vals`` are the
    clipped net values of those cells.
    """

    rows: IntArray
    cols: IntArray
    vals: FloatArray
    table: EntityTable | None

    def __repr__(self) -> str:
        return "ClippedBatch(<private>)"


def _group_starts(*keys: IntArray) -> IntArray:
    """Start offsets of runs of equal consecutive tuples in sorted ``keys``."""
    n = keys[0].size
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for k in keys:
            change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def _cell_order(
    rows: IntArray, cols: IntArray, n_cols: int, first: IntArray | None = None
) -> IntArray:
    """Permutation sorting by (first, row, col); two 1-key sorts when cells fit in int64."""
    if n_cols * (int(rows.max()) + 1 if rows.size else 1) < 2**62:
        order = np.argsort(rows * n_cols + cols, kind="stable")
    else:
        order = np.lexsort((cols, rows))
    if first is not None:
        order = order[np.argsort(first[order], kind="stable")]
    return order


def coalesce(
    rows: IntArray, cols: IntArray, vals: FloatArray, n_cols: int
) -> tuple[IntArray, IntArray, FloatArray]:
    """Sum duplicate cells; returns unique (row, col) sorted, with their sums.

    Examples
    --------
    >>> r, c, v = coalesce(np.array([1, 0, 1]), np.array([2, 0, 2]), np.array([1.0, 2.0, 3.0]), 3)
    >>> r.tolist(), c.tolist(), v.tolist()
    ([0, 1], [0, 2], [2.0, 4.0])
    """
    order = _cell_order(rows, cols, n_cols)
    r, c, v = rows[order], cols[order], vals[order]
    starts = _group_starts(r, c)
    sums = np.add.reduceat(v, starts) if starts.size else v[:0]
    return r[starts], c[starts], sums


def zero_non_finite_entities(entity: IntArray, vals: FloatArray) -> FloatArray:
    """``vals`` with every update of an entity holding NaN or +-Inf set to 0.

    Parameters
    ----------
    entity : ndarray of int64, shape (n,)
    vals : ndarray of float64, shape (n,)

    Returns
    -------
    ndarray of float64, shape (n,)
        ``vals`` itself when every value is finite, else a new array.

    Notes
    -----
    Privacy. The stream's form of the one rule for non-finite input
    (docs/privacy.md): an entity whose updates in a batch hold a non-finite
    value contributes nothing from that batch (a zero net contribution, no
    budget spent), silently. It depends on that entity's own updates only,
    so the others are untouched. Huge finite values are clipped as usual.

    Examples
    --------
    >>> zero_non_finite_entities(np.array([1, 2, 1]), np.array([1.0, 2.0, np.inf])).tolist()
    [0.0, 2.0, 0.0]
    """
    bad = ~np.isfinite(vals)
    if not bad.any():
        return vals
    return np.where(np.isin(entity, entity[bad]), 0.0, vals)


def clip_updates(
    entity: IntArray,
    rows: IntArray,
    cols: IntArray,
    vals: FloatArray,
    *,
    table: EntityTable,
    unit: StreamUnit,
    clip_norm: float,
    n_cols: int,
    exclusive: bool = False,
) -> ClippedBatch:
    """Clip one batch per entity against the entities' remaining budgets.

    Parameters
    ----------
    entity : ndarray of int64, shape (n,)
        Entity key of each update. Distinct entities must have distinct keys:
        updates under one key are clipped as one entity, so two entities sharing
        a key could together move the output by 2 C (streams key string ids by
        :class:`pipeline.io.entity_ids.EntityIds`).
    rows, cols : ndarray of int64, shape (n,)
        Cell of each update, already validated against the shape.
    vals : ndarray of float64, shape (n,)
        Update values; an entity holding NaN or +-Inf among them contributes
        nothing from this batch (:func:`zero_non_finite_entities`).
    table : EntityTable
        Budgets spent before this batch (not modified).
    unit : StreamUnit
    clip_norm : float
        ``C > 0``.
    n_cols : int
        Number of columns (to flatten cells for unit ``entry``).
    exclusive : bool
        No two entities may touch the same row (column, cell) of ``unit``, in
        this batch or together with the entities of ``table`` (a stream whose
        entities are its rows' individuals). Not for unit ``general``.

    Returns
    -------
    ClippedBatch
        The clipped cells and the updated table.

    Raises
    ------
    PrivacyUnitError
        If an entity touches more than one row (column, cell) under unit
        ``row`` (``column``, ``entry``), in this batch or together with earlier
        batches; nothing is returned and the table is unchanged. The message
        shows no entity key, cell or value. Also, when ``exclusive``, if two
        entities touch one row (column, cell), in this batch or with an
        entity of ``table``. Cost of that check: a sort of the batch's
        entities' anchors and one of the new ones together with the table's,
        of the order of the table's merge below.

    Notes
    -----
    Privacy. After this step ``sum over batches ||D_{e,batch}||_F <= C`` for every
    entity e [spec 1.3, rules 2-4]; the scale factors and norms are never
    returned or logged. Values near the float limits are handled by scaling each
    entity's updates by their largest magnitude before summing, so no square or
    duplicate sum overflows.

    Examples
    --------
    >>> out = clip_updates(np.array([7, 7]), np.array([0, 0]), np.array([0, 1]),
    ...                    np.array([3.0, 4.0]), table=EntityTable.empty(),
    ...                    unit=StreamUnit.ROW, clip_norm=1.0, n_cols=2)
    >>> np.round(out.vals, 6).tolist(), np.round(out.table.spent, 6).tolist()
    ([0.6, 0.8], [1.0])
    """
    entity = np.asarray(entity, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    vals = zero_non_finite_entities(entity, np.asarray(vals, dtype=np.float64))
    if entity.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return ClippedBatch(rows=z, cols=z.copy(), vals=np.zeros(0), table=table)
    # 1. group by entity, then by cell
    order = _cell_order(rows, cols, n_cols, first=entity)
    e, r, c, v = entity[order], rows[order], cols[order], vals[order]
    est = _group_starts(e)  # entity runs over the raw updates
    keys = e[est]
    counts = np.diff(np.append(est, e.size))
    # scale each entity's raw values by their largest magnitude: duplicate sums
    # and squares then stay far from overflow, subnormals far from underflow
    peak = np.maximum.reduceat(np.abs(v), est)
    peak_rep = np.repeat(np.where(peak > 0, peak, 1.0), counts)
    u = v / peak_rep
    # 2. coalesce duplicate cells of one entity (net contribution per cell)
    cst = _group_starts(e, r, c)
    ce, cr, cc = e[cst], r[cst], c[cst]
    cu = np.add.reduceat(u, cst)
    cell_entity_start = _group_starts(ce)  # entity runs over the coalesced cells
    # 3. privacy unit: one row / column / cell per entity
    anchor = _anchors(unit, cr, cc, cell_entity_start, n_cols)
    # 4. remaining budget and factors
    if table.keys.size:
        pos = np.searchsorted(table.keys, keys)
        known = table.keys[np.minimum(pos, table.keys.size - 1)] == keys
    else:
        pos, known = (
            np.zeros(keys.size, dtype=np.int64),
            np.zeros(keys.size, dtype=bool),
        )
    if unit is not StreamUnit.GENERAL and np.any(
        table.anchor[pos[known]] != anchor[known]
    ):
        raise PrivacyUnitError(_unit_message(unit, earlier=True))
    if exclusive:
        _check_exclusive(unit, anchor, table.anchor, known)
    spent = np.zeros(keys.size)
    spent[known] = table.spent[pos[known]]
    budget = np.maximum(clip_norm * _CLIP_MARGIN - spent, 0.0)
    with np.errstate(over="ignore"):
        unorm = np.sqrt(np.add.reduceat(cu * cu, cell_entity_start))  # ||D_e|| / peak
        norm = peak * unorm  # may overflow to inf: the budget binds then
    binding = norm > budget
    # clipped contribution: u * peak (the net cells) or u * budget / unorm (norm = budget)
    factor = peak.copy()
    factor[binding] = budget[binding] / unorm[binding]  # unorm > 0 wherever binding
    applied = np.where(binding, budget, norm)
    cell_counts = np.diff(np.append(cell_entity_start, ce.size))
    cv = cu * np.repeat(factor, cell_counts)
    # 5. new table: known entities updated in place, new ones merged in key order
    n_new = int((~known).sum())
    tkeys = np.concatenate([table.keys, keys[~known]])
    tspent = np.concatenate([table.spent, applied[~known]])
    tspent[pos[known]] += applied[known]
    tanchor = np.concatenate([table.anchor, anchor[~known]])
    srt = np.argsort(tkeys, kind="stable") if n_new else np.arange(tkeys.size)
    new_table = EntityTable(keys=tkeys[srt], spent=tspent[srt], anchor=tanchor[srt])
    # 6. coalesce the clipped cells over entities
    rr, cc2, vv = coalesce(cr, cc, cv, n_cols)
    return ClippedBatch(rows=rr, cols=cc2, vals=vv, table=new_table)


def _anchors(
    unit: StreamUnit, cr: IntArray, cc: IntArray, starts: IntArray, n_cols: int
) -> IntArray:
    """The row/column/cell each entity is bound to; raises if it has several."""
    if unit is StreamUnit.GENERAL:
        return np.full(starts.size, -1, dtype=np.int64)
    if unit is StreamUnit.ENTRY:
        counts = np.diff(np.append(starts, cr.size))
        if np.any(counts != 1):
            raise PrivacyUnitError(_unit_message(unit, earlier=False))
        return cr[starts] * n_cols + cc[starts]
    x = cr if unit is StreamUnit.ROW else cc
    if np.any(np.minimum.reduceat(x, starts) != np.maximum.reduceat(x, starts)):
        raise PrivacyUnitError(_unit_message(unit, earlier=False))
    return x[starts]


def _check_exclusive(
    unit: StreamUnit, anchor: IntArray, held: IntArray, known: npt.NDArray[np.bool_]
) -> None:
    """Refuse two entities on one row (column, cell): in the batch, or a new entity
    on one an earlier entity holds. ``anchor``: the batch's entities' (one each,
    known ones already checked against their own); ``held``: the table's."""
    if unit is StreamUnit.GENERAL:
        raise InvalidParameterError(
            "an exclusive stream binds entities to rows, columns or cells; unit "
            "'general' has none."
        )
    srt = np.sort(anchor)
    if np.any(srt[1:] == srt[:-1]):
        raise PrivacyUnitError(_exclusive_message(unit, earlier=False))
    # both sides are unique (the batch's just checked, the table's by this rule),
    # so one sort of the two finds a shared one (np.isin: 15-30x slower at 10^6)
    if held.size and np.intersect1d(anchor[~known], held, assume_unique=True).size:
        raise PrivacyUnitError(_exclusive_message(unit, earlier=True))


def _exclusive_message(unit: StreamUnit, *, earlier: bool) -> str:
    what = {"row": "row", "column": "column", "entry": "cell"}[unit.value]
    found = (
        f"a new entity touches a {what} that an entity of an earlier batch touches"
        if earlier
        else f"two entities touch one {what} in this batch"
    )
    return (
        f"this stream is exclusive (each {what} is one entity's), but {found}; give "
        f"every {what}'s updates one entity id, or create a stream without "
        "--exclusive (it then protects entities, and composes only with streams). "
        "Nothing was applied."
    )


def _unit_message(unit: StreamUnit, *, earlier: bool) -> str:
    what = {"row": "row", "column": "column", "entry": "cell"}[unit.value]
    found = (
        f"some entity touches a different {what} than in earlier batches"
        if earlier
        else f"some entity touches more than one {what} in this batch"
    )
    return (
        f"privacy unit '{unit.value}' requires every entity to touch one {what}, but "
        f"{found}; declare unit 'general' (each entity's whole contribution is "
        "clipped) or fix the entity ids. Nothing was applied."
    )
