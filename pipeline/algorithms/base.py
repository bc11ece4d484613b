"""What an algorithm needs from a matrix and from its job, and the numpy reference.

An algorithm never sees ``A`` itself: it asks a :class:`MatrixSource` for one pass
of exact sketches (:class:`~pipeline.sketches.apply.PassRequest`) and then works on
*tall* arrays (size growing with the number of rows) only through a few operations
that a distributed source runs where the rows live. Everything else is small and
dense on the client.

What it needs from the job that runs it is one :class:`ReleaseHooks` value, the
same for every kind of release: the noise key, the sketch seed, the journal
(:class:`ReleaseJournal`: save and restore of pass state, for a resume), the
charge (called once, before the first noise) and the progress.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray, Shape2D
from pipeline.errors import StoreLayoutError
from pipeline.linalg.core import cholesky_qr2, orth
from pipeline.mechanisms.noise import NoiseKey
from pipeline.sketches.apply import PassRequest, block_partials
from pipeline.sketches.operators import SketchOperator

#: A function of a row block ``(start, block) -> new block``, e.g. adding noise.
RowBlockFn = Callable[[int, FloatArray], FloatArray]


class ReleaseJournal(Protocol):
    """Write-ahead record of a release in progress, by label (trusted zone).

    A run records what it must not compute or draw twice -- the exact sketches
    of a factorization's passes, each noisy release of a PCA -- before it uses
    it; a resumed run loads it back instead of reading the data or drawing the
    noise again.
    """

    def load(self, label: str) -> Any:
        """The value recorded under ``label``, or None."""

    def record(self, label: str, value: Any) -> None:
        """Durably record ``value`` under ``label`` before it is used."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseHooks:
    """What a job hands an algorithm's run: one value for every kind of release.

    Attributes
    ----------
    noise_key : NoiseKey or None
        The release's secret key (a resumed job's is its journal's, so no noise
        is drawn twice); None only for a non-private run.
    sketch_seed : int or None
        Root of the sketch operators (data-independent; confidential unless the
        plan was made with it as its public seed). None for an algorithm that
        draws no sketch operator (PCA).
    journal : ReleaseJournal or None
        Where the run saves, and a resumed run restores, its pass state. None:
        nothing survives the run (a PCA keeps its releases in memory).
    charge : callable or None
        The ledger charge: called once per run, after the data was read and
        before the first noise is drawn (the budget was checked before the
        first read). A PCA whose releases are all journaled does not call it.
    progress : callable or None
        Receives public progress messages (step names only, never data).

    Notes
    -----
    Privacy. The journal receives noise-free statistics (a factorization's
    exact sketches) or noisy releases before they are used: it belongs to the
    trusted zone, as the noise key does. ``progress`` only ever receives
    public step names; a run whose number of steps is secret (a private
    selection's trials) is given none.
    """

    noise_key: NoiseKey | None = None
    sketch_seed: int | None = None
    journal: ReleaseJournal | None = None
    charge: Callable[[], None] | None = None
    progress: Callable[[str], None] | None = None

    def say(self, msg: str) -> None:
        """Report a public progress message (nothing without ``progress``)."""
        if self.progress is not None:
            self.progress(msg)


class MatrixSource(Protocol):
    """A matrix ``A`` of shape (n_rows, n_cols) that can be sketched in one pass."""

    @property
    def shape(self) -> Shape2D: ...

    def sketch(self, request: PassRequest) -> dict[str, Any]:
        """Exact sketches of one pass: right sketches tall, the others numpy."""

    def tall_noise_gram(
        self, Y: Any, fn: RowBlockFn, op: SketchOperator | None
    ) -> tuple[Any, FloatArray, FloatArray | None]:
        """``Y' = fn(Y)`` row block by row block (its noise), kept tall, with
        ``Y'^T Y'`` (t, t) and ``G^T Y'`` (d, t), ``G`` = ``op`` along Y's rows
        (None when ``op`` is), summed over the blocks in the same step."""

    def tall_qr(self, Y: Any, *, with_r: bool = False) -> Any:
        """Orthonormal ``Q`` (tall) with the column space of ``Y`` (TSQR); with
        ``with_r``, the pair ``(Q, R)`` with ``Y = Q R`` and ``R`` (t, t)."""

    def tall_left_sketch(self, Q: Any, op: SketchOperator) -> FloatArray:
        """``G.T @ Q``, of shape (d, t), with ``G`` = ``op`` along Q's rows."""

    def tall_matmul(self, Q: Any, M: FloatArray) -> Any:
        """``Q @ M`` (tall) for a small ``M`` of shape (t, k)."""

    def finish_local_qr(
        self, Q: Any, R: FloatArray, left: Any
    ) -> tuple[Any, FloatArray]:
        """Second TSQR level of a pass run with ``PassRequest.local_qr``.

        Only called when :meth:`sketch` returned ``"<name>_R"``: a source that
        never does (it may always ignore ``local_qr``) need not implement it.
        """


def complete_from_pass(
    source: MatrixSource, request: PassRequest, journaled: dict[str, Any]
) -> dict[str, Any]:
    """The exact sketches of ``request``: ``journaled`` if it holds them all,
    else the pass again, whose sketches that ``journaled`` does hold must be
    the same bit for bit.

    A release journal keeps the small exact sketches of a pass and names the
    tall ones (m x t) for recomputation: those are None in ``journaled``. The
    resumed job reads its unchanged input again (the journal refuses a changed
    one); the comparison shows that the pass did reproduce what was charged
    and will get the same noise.

    Raises
    ------
    StoreLayoutError
        A recomputed sketch differs from the journaled one.
    """
    if all(value is not None for value in journaled.values()):
        return dict(journaled)
    fresh = source.sketch(request)
    for name, kept in journaled.items():
        if kept is None or name not in fresh:
            continue
        if not np.array_equal(np.asarray(kept), np.asarray(fresh[name])):
            raise StoreLayoutError(
                f"the input read again to resume gives another exact sketch {name!r} "
                "than the interrupted run journaled (the data or the cluster's numerics "
                "changed); restore the input, or remove the journal to abandon that "
                "release (a charge it made stays spent)."
            )
    return fresh


@dataclass(frozen=True, kw_only=True, slots=True)
class Factorization:
    """A released rank-k factorization ``A ~ U diag(S) V^T``.

    Attributes
    ----------
    U : array of shape (n_rows, rank)
        Orthonormal columns (numpy, or a dask array before it is written).
    S : ndarray of shape (rank,)
        Non-negative, non-increasing.
    V : array of shape (n_cols, rank)
        Orthonormal columns.
    report : dict
        The privacy report and run metadata (JSON-serialisable).
    """

    U: Any
    S: FloatArray
    V: Any
    report: dict[str, Any] = field(default_factory=dict)


class ArraySource:
    """In-memory numpy :class:`MatrixSource` (the reference for every test).

    Parameters
    ----------
    A : ndarray or scipy.sparse matrix of shape (n_rows, n_cols)
        Any real numeric dtype; a sparse matrix is sketched from its stored
        entries (:func:`~pipeline.sketches.apply.block_partials`).
    """

    def __init__(self, A: Any) -> None:
        self._A = A if sp.issparse(A) else np.asarray(A)
        self.n_passes = 0
        # a sparse input's float64 left operator blocks, made once by the pass and
        # taken by the first later product with the same operator (S^T Q, S^T Y)
        self._kept: list[tuple[SketchOperator, Any]] = []

    @property
    def shape(self) -> Shape2D:
        r, c = self._A.shape
        return int(r), int(c)

    def sketch(self, request: PassRequest) -> dict[str, Any]:
        self.n_passes += 1
        # one block: a local QR would be the whole QR; the plain path is simpler
        request = dataclasses.replace(request, local_qr=())
        blocks = None
        if sp.issparse(self._A):
            # one generation of each left operator (the sparse sign S: a sizeable
            # share of a sparse pass) serves the pass and the product after it
            dt = request.compute_dtype
            blocks = {n: op.left_block(0, op.length, dt) for n, op in request.left}
            if dt == np.float64:
                self._kept = [(op, blocks[n]) for n, op in request.left]
        parts = block_partials(
            self._A, 0, 0, request, where="the input array", left_blocks=blocks
        )
        return dict(zip(request.names, parts, strict=True))

    def _left(self, op: SketchOperator, Y: FloatArray) -> FloatArray:
        """``op.left(Y, 0, op.length)``, from the pass's block of ``op`` if kept
        (the same float64 block, so the same bits)."""
        for i, (kept, block) in enumerate(self._kept):
            if kept == op:
                del self._kept[i]
                return np.asarray(block @ np.asarray(Y, dtype=np.float64))
        return op.left(Y, 0, op.length)

    def tall_noise_gram(
        self, Y: FloatArray, fn: RowBlockFn, op: SketchOperator | None
    ) -> tuple[FloatArray, FloatArray, FloatArray | None]:
        Y = fn(0, Y)
        return Y, Y.T @ Y, None if op is None else self._left(op, Y)

    def tall_qr(self, Y: FloatArray, *, with_r: bool = False) -> Any:
        if sp.issparse(self._A):
            # a sparse pass costs O(nnz): the QR of the tall m x t sketch then
            # dominates, and CholeskyQR2 is 4-5x faster where it applies (a
            # dense input keeps Householder QR, bit for bit as before)
            qr = cholesky_qr2(Y)
            if qr is not None:
                return qr if with_r else qr[0]
        if with_r:
            return np.linalg.qr(Y)
        return orth(Y)

    def tall_left_sketch(self, Q: FloatArray, op: SketchOperator) -> FloatArray:
        return self._left(op, Q)

    def tall_matmul(self, Q: FloatArray, M: FloatArray) -> FloatArray:
        return Q @ M

    def finish_local_qr(
        self, Q: Any, R: FloatArray, left: Any
    ) -> tuple[Any, FloatArray]:
        """Never called: :meth:`sketch` drops ``local_qr`` (one block)."""
        raise NotImplementedError("ArraySource runs no local QR pass.")

    def seal(self, value: Any) -> Any:
        """In memory nothing leaves the process: the value itself."""
        return value
