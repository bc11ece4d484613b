"""Synthetic turnstile streams over a low-rank matrix, for tests and benchmarks.

Problem. Produce the batches ``(entity, i, j, s)`` of a turnstile stream over
``T`` epochs (spec sketch-lrf 1.1, 6.4) whose cumulative matrix ``A(tau)`` is
known exactly, with insertions and exact deletions, without ever forming the
``n_rows x n_cols`` matrix (so that 10^5 x 10^5 streams are cheap).

Construction (all from one ``numpy.random.Generator`` seeded by ``seed``, in
this order):

1. Ground truth ``A = c U diag(sigma) V^T`` of rank ``r``: ``sigma_l = decay^l``
   (``l = 0..r-1``); ``U`` (n_rows x r) and ``V`` (n_cols x r) Haar-distributed
   with orthonormal columns (QR of a Gaussian matrix with the sign fix). Row
   ``i`` of ``A`` has norm ``c ||U[i] diag(sigma)||_2`` because ``V`` has
   orthonormal columns; ``c = row_norm / max_i ||U[i] diag(sigma)||_2``, so the
   largest row norm is ``row_norm`` (default 1) and the singular values of ``A``
   are exactly ``c sigma``.
2. Reveal order: ``n_epochs * updates_per_epoch`` distinct cells drawn uniformly
   without replacement from the ``n_rows n_cols`` cells (flat index
   ``i n_cols + j``), consumed in that order. A cell is inserted at most once,
   with its exact value ``s = A[i, j]`` (computed as the row dot product
   ``c sum_l U[i, l] sigma_l V[j, l]``).
3. Epoch ``tau``: ``n_del = min(floor(delete_fraction * updates_per_epoch),
   live)`` updates withdraw distinct cells inserted in epochs ``< tau`` and not
   yet withdrawn (uniformly among them; none in epoch 1): each is the exact
   negative ``-s`` of its insertion, so the cell returns to exactly 0. The other
   ``updates_per_epoch - n_del`` updates insert the next cells of the reveal
   order. Insertions come first, then deletions; a withdrawn cell never
   returns.
4. The entity of an update is its row: ``entity = i`` (one entity per row, as
   for the privacy unit ``row``).

Hence ``A(tau)`` equals ``A`` on the cells inserted up to ``tau`` and not
withdrawn, and 0 elsewhere; every update has ``|s| <= |A[i, j]|``.

Clipping. Per-entity clipping (:mod:`pipeline.mechanisms.entities`) spends an
entity's budget ``C`` by the net norm of each batch, deletions included, so what
it compares with ``C`` is ``b_e = sum_tau ||D_{e,tau}||_F``, not ``||A_e||``.
With one batch per epoch, ``b_e <= sqrt(2 n_e) ||A_e restricted to the revealed
cells||_2`` (Cauchy-Schwarz over the ``n_e`` epochs that touch row e; each cell
is inserted once and withdrawn at most once), so clipping with ``C`` never
binds when ``row_norm <= C / sqrt(2 n_epochs)``; with ``row_norm = C`` it binds
only for rows whose revealed cells are many and spread over many epochs.
:func:`entity_budget_spent` computes ``b_e`` exactly, to check a given stream.

References
----------
.. [Mez07] F. Mezzadri, "How to generate random matrices from the classical
   compact groups", Notices AMS 54(5), 2007 (the sign fix of step 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline._types import FloatArray, IntArray
from pipeline._validation import check_float_in_interval, check_int_in_range
from pipeline.errors import InvalidParameterError

__all__ = ["entity_budget_spent", "turnstile_matrix", "turnstile_updates"]

Updates = tuple[IntArray, IntArray, IntArray, FloatArray]


@dataclass(frozen=True, slots=True)
class _Schedule:
    """Low-rank factors and, per epoch, the flat cells inserted and withdrawn."""

    left: FloatArray  # c U diag(sigma), (n_rows, r)
    right: FloatArray  # V, (n_cols, r)
    inserted: list[IntArray]
    withdrawn: list[IntArray]


def _haar(n: int, r: int, rng: np.random.Generator) -> FloatArray:
    q, rr = np.linalg.qr(rng.standard_normal((n, r)))
    return q * np.sign(np.diag(rr))


def _schedule(
    n_rows: int,
    n_cols: int,
    *,
    rank: int,
    n_epochs: int,
    updates_per_epoch: int,
    delete_fraction: float,
    seed: int | np.random.SeedSequence,
    decay: float,
    row_norm: float,
) -> _Schedule:
    m = check_int_in_range(n_rows, "n_rows", 1)
    n = check_int_in_range(n_cols, "n_cols", 1)
    r = check_int_in_range(rank, "rank", 1, min(m, n))
    T = check_int_in_range(n_epochs, "n_epochs", 1)
    u = check_int_in_range(updates_per_epoch, "updates_per_epoch", 1)
    f = check_float_in_interval(
        delete_fraction, "delete_fraction", 0.0, 1.0, low_open=False, high_open=False
    )
    decay = check_float_in_interval(decay, "decay", 0.0, 1.0, high_open=False)
    row_norm = check_float_in_interval(row_norm, "row_norm", 0.0, np.inf)
    if T * u > m * n:
        raise InvalidParameterError(
            f"n_epochs * updates_per_epoch must be at most n_rows * n_cols (each cell is "
            f"inserted at most once), got {T} * {u} > {m} * {n}."
        )
    rng = np.random.default_rng(seed)
    sigma = decay ** np.arange(r, dtype=np.float64)
    left = _haar(m, r, rng) * sigma
    right = _haar(n, r, rng)
    left *= row_norm / np.sqrt(np.einsum("ij,ij->i", left, left).max())
    order = rng.choice(m * n, size=T * u, replace=False).astype(np.int64)
    n_del = int(np.floor(f * u))
    inserted: list[IntArray] = []
    withdrawn: list[IntArray] = []
    live = np.zeros(0, dtype=np.int64)  # inserted before this epoch, not withdrawn
    taken = 0
    for _ in range(T):
        k = min(n_del, live.size)
        pick = (
            rng.choice(live.size, size=k, replace=False)
            if k
            else np.zeros(0, dtype=np.int64)
        )
        gone = live[pick]
        keep = np.ones(live.size, dtype=bool)
        keep[pick] = False
        new = order[taken : taken + u - k]
        taken += u - k
        inserted.append(new)
        withdrawn.append(gone)
        live = np.concatenate([live[keep], new])
    return _Schedule(left=left, right=right, inserted=inserted, withdrawn=withdrawn)


def _values(s: _Schedule, rows: IntArray, cols: IntArray) -> FloatArray:
    return np.einsum("ij,ij->i", s.left[rows], s.right[cols])  # type: ignore[no-any-return]


def turnstile_updates(
    n_rows: int,
    n_cols: int,
    *,
    rank: int,
    n_epochs: int,
    updates_per_epoch: int,
    delete_fraction: float = 0.1,
    seed: int | np.random.SeedSequence,
    decay: float = 0.5,
    row_norm: float = 1.0,
) -> list[Updates]:
    """The batches of a synthetic turnstile stream, one per epoch.

    Parameters
    ----------
    n_rows, n_cols : int
        Shape of the matrix; rows are the entities.
    rank : int
        ``r``, rank of the ground truth ``A``.
    n_epochs : int
        ``T``, number of epochs (batches).
    updates_per_epoch : int
        Updates in every epoch's batch; ``n_epochs * updates_per_epoch`` must
        not exceed ``n_rows * n_cols``.
    delete_fraction : float in [0, 1]
        Share of each epoch's updates (from epoch 2 on) that withdraw an earlier
        insertion exactly.
    seed : int or SeedSequence
        Everything is a function of the seed and the parameters.
    decay : float in (0, 1]
        Geometric spectrum ``sigma_l = decay^l`` before scaling.
    row_norm : float
        The largest row norm of the ground truth (see the module notes on
        clipping).

    Returns
    -------
    list of (entity, i, j, s)
        ``n_epochs`` tuples of arrays of shape (updates_per_epoch,): entity,
        i, j int64 (``entity == i``), s float64. Insertions first, then the
        deletions of the epoch.

    Notes
    -----
    Cost: ``O(n_rows r^2 + n_cols r^2)`` for the factors and ``O(T u r)`` for
    the values; memory ``O((n_rows + n_cols) r + T u)``, never the dense matrix.

    Examples
    --------
    >>> ups = turnstile_updates(20, 10, rank=2, n_epochs=3, updates_per_epoch=8,
    ...                         delete_fraction=0.25, seed=0)
    >>> len(ups), [e.size for e, i, j, s in ups]
    (3, [8, 8, 8])
    >>> _, i2, j2, s2 = ups[1]  # the last floor(0.25 * 8) = 2 updates withdraw epoch-1 cells
    >>> first = dict(zip(zip(ups[0][1].tolist(), ups[0][2].tolist()), ups[0][3].tolist()))
    >>> all(first[c] == -v for c, v in zip(zip(i2[6:].tolist(), j2[6:].tolist()), s2[6:].tolist()))
    True
    >>> bool((ups[0][0] == ups[0][1]).all()), ups[0][3].dtype.name
    (True, 'float64')
    """
    sch = _schedule(
        n_rows,
        n_cols,
        rank=rank,
        n_epochs=n_epochs,
        updates_per_epoch=updates_per_epoch,
        delete_fraction=delete_fraction,
        seed=seed,
        decay=decay,
        row_norm=row_norm,
    )
    out: list[Updates] = []
    for ins, dele in zip(sch.inserted, sch.withdrawn, strict=True):
        flat = np.concatenate([ins, dele])
        i, j = np.divmod(flat, np.int64(n_cols))
        s = _values(sch, i, j)
        s[ins.size :] = -s[ins.size :]
        out.append((i.copy(), i, j, s))
    return out


def turnstile_matrix(
    n_rows: int,
    n_cols: int,
    *,
    epoch: int,
    rank: int,
    n_epochs: int,
    updates_per_epoch: int,
    delete_fraction: float = 0.1,
    seed: int | np.random.SeedSequence,
    decay: float = 0.5,
    row_norm: float = 1.0,
) -> FloatArray:
    """Dense ``A(epoch)`` of the stream :func:`turnstile_updates` makes (small sizes).

    Computed from the construction (the dense ground truth ``c U diag(sigma)
    V^T`` masked to the cells live after ``epoch``), not by summing the
    updates, so tests can compare the two. ``epoch = 0`` is the zero matrix.

    Examples
    --------
    >>> kw = dict(rank=2, n_epochs=3, updates_per_epoch=8, delete_fraction=0.25, seed=0)
    >>> A3 = turnstile_matrix(20, 10, epoch=3, **kw)
    >>> A3.shape, int((A3 != 0).sum())  # 8 + 2 * (8 - 2) insertions, 2 * 2 withdrawn
    ((20, 10), 16)
    """
    sch = _schedule(
        n_rows,
        n_cols,
        rank=rank,
        n_epochs=n_epochs,
        updates_per_epoch=updates_per_epoch,
        delete_fraction=delete_fraction,
        seed=seed,
        decay=decay,
        row_norm=row_norm,
    )
    tau = check_int_in_range(epoch, "epoch", 0, len(sch.inserted))
    live = np.zeros(n_rows * n_cols, dtype=bool)
    for ins, dele in zip(sch.inserted[:tau], sch.withdrawn[:tau], strict=True):
        live[ins] = True
        live[dele] = False
    full = sch.left @ sch.right.T
    return np.where(live.reshape(n_rows, n_cols), full, 0.0)


def entity_budget_spent(updates: list[Updates], n_entities: int) -> FloatArray:
    """``b_e = sum over batches ||D_{e,batch}||_F``: what per-entity clipping compares with C.

    Each batch's updates are coalesced per (entity, cell) first (the net
    contribution, as :func:`pipeline.mechanisms.entities.clip_updates` does).

    Parameters
    ----------
    updates : list of (entity, i, j, s)
        One tuple per batch; entity keys in ``[0, n_entities)``.
    n_entities : int

    Returns
    -------
    ndarray of float64, shape (n_entities,)

    Examples
    --------
    >>> e = np.array([0, 0, 1]); i = np.array([0, 0, 1]); j = np.array([0, 1, 0])
    >>> b1 = (e, i, j, np.array([3.0, 4.0, 1.0]))
    >>> b2 = (e[:1], i[:1], j[:1], np.array([-3.0]))
    >>> entity_budget_spent([b1, b2], 2).tolist()
    [8.0, 1.0]
    """
    total = np.zeros(check_int_in_range(n_entities, "n_entities", 1))
    for e, i, j, s in updates:
        key = np.stack([e, i, j], axis=1)
        cells, inv = np.unique(key, axis=0, return_inverse=True)
        net = np.bincount(inv.ravel(), weights=s, minlength=cells.shape[0])
        total += np.sqrt(
            np.bincount(cells[:, 0], weights=net * net, minlength=total.size)
        )
    return total
