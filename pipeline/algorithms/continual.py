"""Turnstile streams and continual release by the binary-tree mechanism.

Problem. A matrix ``A`` (n_rows x n_cols) starts at zero and changes by batches of
updates ``(i, j, s)`` over epochs ``tau = 1..T``; after every epoch, release a
differentially private rank-k factorization of the current ``A(tau)`` without
re-reading the past and without paying the budget T times.

Method.

* Every sketch of Spectral-LRF (``X Phi``, ``S X``) and Low-Space-LRF
  (``X Phi_c``, ``Psi X``, ``S X T``) is linear in the data, so a batch ``D`` is
  folded into the sketches by regenerating only the operator rows its cells touch
  [spec sketch-lrf 6.4]: ``Y[I] += D Phi[J]``, ``Z[:, J] += (D^T S^T[I])^T``, ...
  The order, grouping and splitting of batches do not matter.
* The binary-tree mechanism [DNPR10, CSS11], as corrected by spec 3.4: epoch
  ``tau``'s exact sketch ``d`` is merged into the p-sum of level
  ``l = lowest set bit of tau`` together with all lower levels; a released
  sketch is ``sum over the set bits j of tau`` of ``alpha_j + noise(j, tau >> j)``,
  whose noise has variance ``popcount(tau) sigma^2``. Node noise is keyed by
  (stream key, statistic, level, node), so a retried release regenerates it
  exactly and the noisy p-sums need not be stored.
* The whole tree is calibrated as one Gaussian mechanism with ``L =
  floor(log2 T) + 1`` levels: ``sigma_i = Delta_F Delta_i s sqrt(L / w_i)``
  [spec 4.5]. The stream is charged its (epsilon, delta) once, whatever the
  number of releases.

Privacy. (epsilon, delta)-DP for streams that differ in one entity, under the
continual relation ``sum_tau ||D_tau - D'_tau||_F <= Delta_F`` [spec 1.4],
which per-entity clipping with a budget across epochs enforces
(:mod:`pipeline.mechanisms.entities`). Continual Low-Space-LRF is offered
unpadded only: shared padding would cancel between nodes [spec 3.4, P7].

References
----------
.. [Upa18] J. Upadhyay, "The price of privacy for low-rank factorization",
   NeurIPS 2018 (seed paper), Fig. 3; corrected by spec sketch-lrf.md.
.. [DNPR10] Dwork, Naor, Pitassi, Rothblum. Differential privacy under
   continual observation. STOC 2010.
.. [CSS11] Chan, Shi, Song. Private and continual release of statistics.
   ACM TISSEC 14(3), 2011.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from pipeline._sealed import Sealed
from pipeline._types import FloatArray, IntArray
from pipeline._validation import check_int_in_range
from pipeline.algorithms.base import ArraySource, Factorization
from pipeline.algorithms.lrf.kernels import low_space_post, spectral_post
from pipeline.algorithms.lrf.model import predict, weight_of
from pipeline.algorithms.lrf.plan import (
    LrfPlan,
    Reach,
    calibrate_plan,
    plan_operators,
    reach_of,
    resolve_sizes,
    sparse_is_exact,
)
from pipeline.algorithms.lrf.run import plan_lrf
from pipeline.errors import EpochError, HorizonExceededError, InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Algorithm, LrfParams, OperatorKind, PrivacyUnit, StreamUnit
from pipeline.sketches.operators import SketchOperator

__all__ = [
    "LEGACY_PLAN_VERSION",
    "ONE_SHOT_SPLIT_PLAN_VERSION",
    "PLAN_VERSION",
    "SketchDelta",
    "StreamPlan",
    "advance_tree",
    "apply_delta",
    "empty_sketches",
    "lowest_set_bit",
    "model_error",
    "noise_code",
    "noisy_sketches",
    "operator_notes",
    "partition_cells",
    "plan_stream",
    "release_factorization",
    "sketch_cells",
    "stream_reach",
    "tree_levels",
    "tree_nodes",
]

# noise stream of each statistic (the codes of one-shot releases, under a stream
# key that is used for nothing else)
_NOISE_CODES = {
    Algorithm.SPECTRAL: {"Y": NoiseCode.Y, "Z": NoiseCode.Z},
    Algorithm.LOW_SPACE: {
        "Yc": NoiseCode.Y_C,
        "Yr": NoiseCode.Y_R,
        "Z": NoiseCode.Z_CORE,
    },
}


def tree_levels(horizon: int) -> int:
    """``L = floor(log2 T) + 1``: levels of the binary tree over T epochs [spec 3.4, S1].

    Examples
    --------
    >>> [tree_levels(t) for t in (1, 2, 3, 4, 63, 64)]
    [1, 2, 2, 3, 6, 7]
    """
    return int(check_int_in_range(horizon, "horizon", 1)).bit_length()


def lowest_set_bit(tau: int) -> int:
    """Index of the lowest set bit of ``tau >= 1`` (the level epoch tau closes)."""
    return (tau & -tau).bit_length() - 1


def tree_nodes(tau: int) -> list[tuple[int, int]]:
    """The (level, node) pairs whose p-sums make up ``A(tau)``.

    Level j holds node ``tau >> j`` (epochs ``((tau >> j) - 1) 2^j + 1`` to
    ``(tau >> j) 2^j``) whenever bit j of tau is set.

    Examples
    --------
    >>> tree_nodes(6)
    [(1, 3), (2, 1)]
    """
    return [(j, tau >> j) for j in range(tau.bit_length()) if (tau >> j) & 1]


#: How a stream's plan picks its operators, sizes and split. 3: the batch
#: one-pass release's exact machinery where the stream's unit allows it, with
#: the budget split the error model gives at the stream's noise
#: (:func:`plan_stream`). 2: the same with the one-shot release's split.
#: 1: every state written before the version was recorded -- the spec's sizes,
#: an even split and a Gaussian co-range operator with its tail bound whatever
#: the unit (:func:`_stream_sizes`).
PLAN_VERSION = 3
ONE_SHOT_SPLIT_PLAN_VERSION = 2
LEGACY_PLAN_VERSION = 1


def stream_reach(unit: StreamUnit, transpose: bool, *, public_seed: bool) -> Reach:
    """What one entity of a stream of ``unit`` may touch in the sketched ``X``.

    An entity is bound to one row, column or cell of ``A`` for the whole stream
    (:mod:`pipeline.mechanisms.entities` refuses a batch that moves it), so every
    per-epoch difference of a row or column entity lies along that axis of
    ``X`` (:func:`~pipeline.algorithms.lrf.plan.reach_of`), and a cell's within
    one row of ``X``. A cell entity with a public sketch seed keeps
    ``Reach.ANY``, as an entry-unit batch release does
    (:func:`~pipeline.algorithms.lrf.plan.sparse_is_exact`); a ``general``
    entity may touch any cells.

    Examples
    --------
    >>> stream_reach(StreamUnit.ENTRY, False, public_seed=False).value
    'row'
    >>> stream_reach(StreamUnit.ROW, True, public_seed=False).value
    'column'
    """
    if unit is StreamUnit.GENERAL:
        return Reach.ANY
    if unit is StreamUnit.ENTRY:
        exact = sparse_is_exact(PrivacyUnit.ENTRY, transpose, public_seed=public_seed)
        return Reach.ROW if exact else Reach.ANY
    return reach_of(PrivacyUnit(unit.value), transpose)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPlan:
    """Public plan of a stream: shapes, sizes, orientation, tree and calibration.

    ``lrf`` is the plan of one release of the same shape and sizes, whose
    calibration covers the whole tree (``tree_levels = L``) or, for a
    factorization mechanism (``sensitivity_factor`` set), the mechanism's
    Gaussian release ``R X``: every sensitivity and sigma of the one-shot
    calibration times ``sensitivity_factor = max_s ||R e_s||``
    (:mod:`pipeline.algorithms.continual_factorization`). ``lrf.predicted_error``
    is the one-shot release's (:func:`model_error` scales it to an epoch).
    ``version`` is the rule that planned it (:data:`PLAN_VERSION`), ``unit``
    what one entity may touch.
    """

    lrf: LrfPlan
    horizon: int
    levels: int
    sensitivity_factor: float | None = None
    unit: StreamUnit = StreamUnit.GENERAL
    version: int = PLAN_VERSION

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the stream's sketches."""
        if self.lrf.params.algorithm is Algorithm.SPECTRAL:
            return ("Y", "Z")
        return ("Yc", "Yr", "Z")

    @property
    def tall(self) -> tuple[str, ...]:
        """Sketches ``X G`` of shape (M, t), indexed by the rows of X."""
        return ("Y",) if self.lrf.params.algorithm is Algorithm.SPECTRAL else ("Yc",)

    @property
    def wide(self) -> tuple[str, ...]:
        """Sketches of shape (d, N), stored transposed as (N, d): indexed by the columns of X."""
        return ("Z",) if self.lrf.params.algorithm is Algorithm.SPECTRAL else ("Yr",)

    @property
    def core(self) -> tuple[str, ...]:
        """Small two-sided sketches (v, v)."""
        return () if self.lrf.params.algorithm is Algorithm.SPECTRAL else ("Z",)

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Shape of each exact sketch as stored: indexed by its data axis.

        The wide sketches ``S X`` (v x N) and ``Psi X`` (t x N) are stored
        transposed, so that a batch updates whole rows (contiguous memory) and
        their noise is tiled the same way as in one-shot releases.
        """
        M, N = self.lrf.oriented_shape
        t, v = self.lrf.t, self.lrf.v
        if self.lrf.params.algorithm is Algorithm.SPECTRAL:
            return {"Y": (M, t), "Z": (N, v)}
        return {"Yc": (M, t), "Yr": (N, t), "Z": (v, v)}

    def check_epoch(self, epoch: int) -> int:
        """Validate ``1 <= epoch <= horizon``.

        Raises
        ------
        EpochError
            If ``epoch < 1`` or not an integer.
        HorizonExceededError
            If ``epoch > horizon`` (exit code 3: the budget covers T epochs).
        """
        if (
            isinstance(epoch, bool)
            or not isinstance(epoch, int | np.integer)
            or epoch < 1
        ):
            raise EpochError(f"epoch must be an integer >= 1, got epoch={epoch!r}.")
        if epoch > self.horizon:
            raise HorizonExceededError(
                f"epoch {int(epoch)} is beyond the stream's horizon of {self.horizon} "
                "epochs; its budget was calibrated for the horizon. Start a new stream "
                "on the same ledger (its charge composes with this one's) to continue."
            )
        return int(epoch)


def plan_stream(
    params: LrfParams,
    shape: tuple[int, int],
    horizon: int,
    *,
    unit: StreamUnit = StreamUnit.GENERAL,
    public_seed: int | None = None,
    sensitivity_factor: float | None = None,
    noise_factor: float = 1.0,
    version: int = PLAN_VERSION,
) -> StreamPlan:
    """Validate a stream's public parameters and calibrate its tree or factorization.

    Parameters
    ----------
    params : LrfParams
        Algorithm, rank, sizes, budget of the *whole stream*, clip norm and
        neighbouring relation (``clip.unit`` is not used: streams clip per
        entity, and ``unit`` says what an entity may touch). ``operator`` None
        takes the plan's; a recorded one must be exact for ``unit``.
    shape : (n_rows, n_cols)
        Public shape of the matrix.
    horizon : int
        ``T >= 1``, the number of epochs the budget covers.
    unit : StreamUnit
        What one entity may touch (:func:`stream_reach`).
    public_seed : int or None
        The sketch seed when it is public: the plan is calibrated with the
        worst-case sensitivity of its operators for what an entity may touch.
    sensitivity_factor : float or None
        None: the binary tree, calibrated over its ``L`` levels. A float: a
        factorization mechanism ``A = L R`` with ``max_s ||R e_s||`` this value
        (``ContinualMechanism.sensitivity_factor``), calibrated as the one-shot
        release with every sensitivity and sigma scaled by it.
    noise_factor : float
        The root mean square over the horizon of the release's noise over the
        one-shot release's (``ContinualMechanism.rms_noise_factor``): version 3
        splits the budget for it
        (:func:`~pipeline.algorithms.lrf.model.best_weight`); 1 for a horizon
        of one epoch, whose plan is the batch release's.
    version : int
        :data:`PLAN_VERSION`; :data:`ONE_SHOT_SPLIT_PLAN_VERSION` for a state
        planned with the one-shot split; :data:`LEGACY_PLAN_VERSION` for a state
        written before the version was recorded (its operators, sizes and split).

    Returns
    -------
    StreamPlan

    Raises
    ------
    InvalidParameterError
        For a padded Low-Space stream [spec 3.4, P7], a two-pass one,
        inconsistent sizes or an unknown version.

    Notes
    -----
    Machinery (version 2). The batch one-pass release's, through the same
    functions: :func:`~pipeline.algorithms.lrf.run.plan_lrf` with the
    entity's reach (:func:`stream_reach`) picks a sparse sign ``S`` exactly
    where an entity stays in one row of ``X`` -- every column of ``S`` has norm
    1, so ``||S M||_F = ||M||_F`` for the stacked per-epoch differences ``M``
    of such an entity -- and otherwise the Gaussian ``S`` with its tail bound;
    the error model's sizes
    (:func:`~pipeline.algorithms.lrf.model.choose_private_sizes`) and its budget
    split at the stream's noise (version 3): a continual mechanism multiplies
    every sigma by ``f(tau)``, under which the co-range side's share of the
    error grows and the range side's does not
    (:mod:`pipeline.algorithms.lrf.model`, "Noise above the one-shot
    release's"), so the split is the model's best at the root mean square of
    ``f`` over the horizon (a user's ``range_weight`` is kept; version 2 took the
    one-shot split); :func:`model_error` predicts each epoch's error; and the
    denoised range basis (``basis_rank = k``).
    The range sketch keeps the Gaussian ``Phi`` with its tail bound: a
    stream's ``Y`` is a running sum over epochs, so its rows cannot be clipped
    in sketch space once per individual as a batch release's are.

    Privacy. One Gaussian mechanism over every node of the tree:
    ``sigma_i = Delta_F Delta_i s sqrt(L / w_i)`` [spec 4.5]. A tree node sums
    the differences of its epochs, of total Frobenius norm at most ``Delta_F``
    (spec 1.4), so the worst-case factors of public operators hold per node.
    A factorization mechanism releases ``R X + sigma Z``; stacked over epochs,
    one entity's difference has Frobenius norm at most ``f Delta_F`` in data
    space (f = ``sensitivity_factor``), so each sketch's one-shot factor applies
    once and ``sigma_i = f sigma_i^(1)``, ``sensitivity_i = f Delta_F Delta_i``:
    the ledger's event ``z = 1 / Delta_eff`` is the one-shot release's.

    Examples
    --------
    >>> p = plan_stream(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0,
    ...                           delta=1e-6), (500, 300), horizon=64)
    >>> p.levels, p.lrf.calibration.tree_levels, p.lrf.operator.value
    (7, 7, 'gaussian')
    >>> plan_stream(p.lrf.params, (500, 300), 64, unit=StreamUnit.ENTRY).lrf.operator.value
    'sparse-sign'
    """
    if params.padded:
        raise InvalidParameterError(
            "padded=True is not offered for streams: padding shared by tree nodes "
            "would cancel between them (spec sketch-lrf 3.4); use the unpadded mode."
        )
    levels = tree_levels(horizon)
    params, reach = _machinery(params, shape, unit, public_seed, version)
    one = plan_lrf(params, shape, public_seed=public_seed, reach=reach)
    if not isinstance(one, LrfPlan):  # a two-pass plan: its tree could not be built
        raise InvalidParameterError(
            "a stream is read once, so algorithm='two-pass' (stored matrices only) "
            "does not apply; use 'spectral' or 'low-space'."
        )
    if version == PLAN_VERSION:
        one = _split_for_noise(one, noise_factor)
    base = StreamPlan(
        lrf=one, horizon=int(horizon), levels=levels, unit=unit, version=version,
        sensitivity_factor=None if sensitivity_factor is None else float(sensitivity_factor),
    )  # fmt: skip
    if one.calibration is None:
        return base
    # the operators' worst-case factors do not depend on the tree: reuse them
    factors = (
        {sk.name: sk.jl_factor for sk in one.calibration.sketches}
        if one.public_sketch_seed
        else None
    )
    if sensitivity_factor is None:
        lrf = calibrate_plan(one, factors, tree_levels=levels)
    else:
        lrf = _scaled(calibrate_plan(one, factors), sensitivity_factor)
    return dataclasses.replace(base, lrf=lrf)


def _split_for_noise(plan: LrfPlan, noise_factor: float) -> LrfPlan:
    """``plan`` with the model's budget split at ``noise_factor`` (kept if the user's)."""
    if not (math.isfinite(noise_factor) and noise_factor >= 1.0):
        raise InvalidParameterError(
            f"noise_factor must be a finite float >= 1, got {noise_factor!r}."
        )
    p = plan.params
    if plan.calibration is None or p.range_weight is not None or p.padded:
        return plan
    weight = weight_of(plan, noise_factor=noise_factor)
    plan = dataclasses.replace(plan, range_weight=weight)
    return dataclasses.replace(plan, predicted_error=predict(plan).error)


def _machinery(
    params: LrfParams,
    shape: tuple[int, int],
    unit: StreamUnit,
    public_seed: int | None,
    version: int,
) -> tuple[LrfParams, Reach]:
    """The parameters and reach :func:`plan_stream` plans with, by plan version."""
    if version == LEGACY_PLAN_VERSION:
        return _stream_sizes(params, shape), Reach.ANY
    if version not in (ONE_SHOT_SPLIT_PLAN_VERSION, PLAN_VERSION):
        raise InvalidParameterError(
            f"stream plan version {version!r} is not one this dplr version knows "
            f"({LEGACY_PLAN_VERSION} to {PLAN_VERSION}); use the dplr version that "
            "created the stream."
        )
    m, n = (
        check_int_in_range(x, nm, 1)
        for x, nm in zip(shape, ("n_rows", "n_cols"), strict=True)
    )
    transpose = m < n  # plan_lrf's unpadded orientation
    return params, stream_reach(unit, transpose, public_seed=public_seed is not None)


def _scaled(plan: LrfPlan, factor: float) -> LrfPlan:
    """``plan`` with every sketch's sensitivity and sigma multiplied by ``factor >= 1``.

    The Gaussian mechanism ``R X`` of a factorization: its sensitivities are the
    one-shot ones times ``max_s ||R e_s||``, and so are its sigmas, so its
    ``Delta_eff`` and ledger event are the one-shot release's (checked again).
    """
    cal = plan.calibration
    if cal is None:
        return plan
    if not (math.isfinite(factor) and factor >= 1.0):
        raise InvalidParameterError(
            f"sensitivity_factor must be a finite float >= 1, got {factor!r}."
        )
    sketches = tuple(
        dataclasses.replace(
            sk, sensitivity=sk.sensitivity * factor, sigma=sk.sigma * factor
        )
        for sk in cal.sketches
    )
    scaled = dataclasses.replace(cal, sketches=sketches)
    scaled.check()
    return dataclasses.replace(plan, calibration=scaled)


def _stream_sizes(params: LrfParams, shape: tuple[int, int]) -> LrfParams:
    """The sizes and split of a plan of :data:`LEGACY_PLAN_VERSION`: the spec's defaults.

    What every stream was planned with before the plan version was recorded,
    kept so that their states release as they were created: the spec's ``t``
    and ``v`` (not the error model's), the even budget split, and (with
    ``plan_lrf(reach=Reach.ANY)``) the Gaussian co-range operator whatever the
    unit.
    """
    if not params.private:
        return params
    m, n = shape
    M, N = (n, m) if m < n else (m, n)  # plan_lrf's unpadded orientation
    t, v = resolve_sizes(params, M, N)
    even = 0.5 if params.algorithm is Algorithm.SPECTRAL else 2.0 / 3.0
    return dataclasses.replace(
        params, sketch_size=t, core_size=v,
        range_weight=even if params.range_weight is None else params.range_weight,
    )  # fmt: skip


def operators(plan: StreamPlan, sketch_seed: int | Sealed) -> dict[str, SketchOperator]:
    """The stream's sketch operators (the same as a one-shot release's).

    On a cluster ``sketch_seed`` is a :class:`~pipeline._sealed.Sealed` reference.
    """
    return plan_operators(plan.lrf, sketch_seed)


def empty_sketches(plan: StreamPlan) -> dict[str, FloatArray]:
    """Zero exact sketches: the state of an empty matrix."""
    return {name: np.zeros(shape) for name, shape in plan.shapes().items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class SketchDelta:
    """The contribution of some cells to every sketch, in compact form.

    ``row_index`` / ``row_blocks[name]`` (|I| x t) update rows of the tall
    sketches; ``col_index`` / ``col_blocks[name]`` (|J| x d) update rows of the
    wide ones (stored transposed); ``core[name]`` is a full small sketch. All as
    sensitive as the data.
    """

    row_index: IntArray
    row_blocks: dict[str, FloatArray]
    col_index: IntArray
    col_blocks: dict[str, FloatArray]
    core: dict[str, FloatArray]

    def __repr__(self) -> str:
        return "SketchDelta(<private>)"


def partition_cells(
    rows: IntArray, cols: IntArray, vals: FloatArray, n_parts: int, tile_size: int
) -> list[tuple[IntArray, IntArray, FloatArray]]:
    """Split oriented cells sorted by row into up to ``n_parts`` row ranges.

    Cuts fall on operator tile boundaries, so each tile of the row-indexed
    operators is generated by one part only.
    """
    if rows.size == 0:
        return []
    n_parts = max(1, min(n_parts, rows.size))
    tiles = rows // tile_size
    targets = np.linspace(0, rows.size, n_parts + 1)[1:-1].astype(np.int64)
    cuts = (
        np.unique(np.searchsorted(tiles, tiles[targets], side="left"))
        if targets.size
        else np.zeros(0, np.int64)
    )
    cuts = cuts[(cuts > 0) & (cuts < rows.size)]
    bounds = [0, *cuts.tolist(), rows.size]
    return [
        (rows[a:b], cols[a:b], vals[a:b])
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]


def _compact(index: IntArray, length: int) -> tuple[IntArray, IntArray]:
    """``np.unique(index, return_inverse=True)`` in O(n + length) instead of a sort."""
    if index.size * 8 < length:  # few indices in a long axis: sorting is cheaper
        u, inv = np.unique(index, return_inverse=True)
        return u, inv.reshape(-1)
    present = np.zeros(length, dtype=bool)
    present[index] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[index]


def sketch_cells(
    plan: StreamPlan,
    ops: Mapping[str, SketchOperator],
    rows: IntArray,
    cols: IntArray,
    vals: FloatArray,
) -> SketchDelta:
    """Fold clipped cells of the oriented matrix X into every sketch [spec 6.4].

    Parameters
    ----------
    plan : StreamPlan
    ops : dict of SketchOperator
        From :func:`operators`.
    rows, cols : ndarray of int64
        Cells of ``X`` (``A`` or ``A.T`` per ``plan.lrf.transpose``); duplicates
        allowed, they are summed.
    vals : ndarray of float64

    Returns
    -------
    SketchDelta

    Notes
    -----
    Regenerates only the operator tiles the cells touch: cost
    ``2 nnz (t + v)`` flops plus the touched tiles (Spectral), and
    ``2 |I| v^2`` more for Low-Space's core sketch.
    """
    M, N = plan.lrf.oriented_shape
    I, ii = _compact(rows, M)
    J, jj = _compact(cols, N)
    D = sp.csr_matrix((vals, (ii, jj)), shape=(I.size, J.size))  # duplicates summed
    Dt = D.T.tocsr()
    if plan.lrf.params.algorithm is Algorithm.SPECTRAL:
        y = D @ ops["Phi"].rows(J)
        z = Dt @ ops["S"].rows(I)  # (S X)^T restricted to columns J
        return SketchDelta(
            row_index=I, row_blocks={"Y": y}, col_index=J, col_blocks={"Z": z}, core={}
        )
    yc = D @ ops["PhiC"].rows(J)
    yr = Dt @ ops["Psi"].rows(I)
    zc = ops["S"].rows(I).T @ (D @ ops["T"].rows(J))
    return SketchDelta(
        row_index=I,
        row_blocks={"Yc": yc},
        col_index=J,
        col_blocks={"Yr": yr},
        core={"Z": zc},
    )


def apply_delta(sketches: dict[str, FloatArray], delta: SketchDelta) -> None:
    """Add ``delta`` into ``sketches`` in place (indices are unique per delta)."""
    for name, block in delta.row_blocks.items():
        sketches[name][delta.row_index] += block
    for name, block in delta.col_blocks.items():
        sketches[name][delta.col_index] += block
    for name, block in delta.core.items():
        sketches[name] += block


def advance_tree(
    levels: dict[int, dict[str, FloatArray]],
    last_epoch: int,
    epoch_sketch: Mapping[str, FloatArray] | None,
) -> dict[int, dict[str, FloatArray]]:
    """Close epoch ``last_epoch + 1``: merge its exact sketch into the tree [spec 3.4, steps 2-3].

    Parameters
    ----------
    levels : dict level -> exact p-sums
        The non-empty p-sums after ``last_epoch`` (the set bits of it).
    last_epoch : int
        The last epoch closed (0 for a new stream).
    epoch_sketch : dict or None
        Exact sketch of the new epoch's batches (None: no update this epoch).

    Returns
    -------
    dict level -> exact p-sums
        After epoch ``tau = last_epoch + 1``: level ``l = lowest_set_bit(tau)``
        holds ``d + sum_{j < l} alpha_j``, the lower levels are empty, so the
        keys are exactly the set bits of tau.
    """
    tau = last_epoch + 1
    ell = lowest_set_bit(tau)
    merged: dict[str, FloatArray] | None = None
    for j in range(ell):
        part = levels.get(j)
        if part is None:
            continue
        merged = (
            {k: v.copy() for k, v in part.items()}
            if merged is None
            else {k: merged[k] + v for k, v in part.items()}
        )
    if epoch_sketch is not None:
        merged = (
            {k: np.array(v, dtype=np.float64) for k, v in epoch_sketch.items()}
            if merged is None
            else {k: merged[k] + epoch_sketch[k] for k in merged}
        )
    out = {j: v for j, v in levels.items() if j > ell}
    if merged is not None:
        out[ell] = merged
    return out


def noise_code(plan: StreamPlan, name: str) -> int:
    """The noise code of statistic ``name`` of the stream (that of a one-shot release)."""
    return int(_NOISE_CODES[plan.lrf.params.algorithm][name])


def node_noise(
    plan: StreamPlan, key: NoiseKey, name: str, level: int, node: int
) -> FloatArray:
    """The noise of statistic ``name`` at tree node (level, node), as stored.

    Keyed by (stream key, statistic, level, node) [spec 3.4, step 4]: fresh for
    every node, identical when regenerated.
    """
    cal = plan.lrf.calibration
    if cal is None:
        raise InvalidParameterError("a non-private stream has no noise.")
    sigma = plan.lrf.sigma(name)
    shape = plan.shapes()[name]
    alg = plan.lrf.params.algorithm
    sub = key.derive("tree", int(_NOISE_CODES[alg][name]), int(level), int(node))
    g = GaussianNoise(
        key=sub,
        sigma=sigma,
        length=shape[0],
        dim=shape[1],
        tile_size=plan.lrf.params.tile_size,
    )
    return g.dense()


def noisy_sketches(
    plan: StreamPlan,
    levels: Mapping[int, Mapping[str, FloatArray]],
    epoch: int,
    key: NoiseKey | None,
) -> dict[str, FloatArray]:
    """The released sketches of ``A(epoch)``: the p-sums of its set bits, each with its node's noise.

    ``levels`` must be the tree right after closing ``epoch``.

    Notes
    -----
    Privacy. Each p-sum gets its own node's noise once [spec 3.4, step 4-5]; the
    result's noise has variance ``popcount(epoch) sigma_i^2`` per entry.
    """
    nodes = tree_nodes(epoch)
    if set(levels) - {j for j, _ in nodes}:
        raise EpochError(f"the tree does not hold the state of epoch {epoch}.")
    out: dict[str, FloatArray] = {
        name: np.zeros(shape) for name, shape in plan.shapes().items()
    }
    for j, q in nodes:
        for name in out:
            part = levels.get(j)
            if part is not None:
                out[name] += part[name]
            if plan.lrf.calibration is not None:
                if key is None:
                    raise InvalidParameterError("a private stream needs its noise key.")
                out[name] += node_noise(plan, key, name, j, q)
    return out


def release_factorization(
    plan: StreamPlan, sketches: Mapping[str, FloatArray], sketch_seed: int
) -> Factorization:
    """Factorize released (already noisy) sketches: pure post-processing [spec 3.4, step 6]."""
    lrf = plan.lrf
    ops = plan_operators(lrf, sketch_seed)
    src = ArraySource(
        np.zeros((0, 0))
    )  # only its in-memory tall-matrix operations are used
    exact = {name: (x.T if name in plan.wide else x) for name, x in sketches.items()}
    post = (
        spectral_post if lrf.params.algorithm is Algorithm.SPECTRAL else low_space_post
    )
    Ux, s, Vx = post(src, lrf, exact, ops, None)
    U, V = (Vx, Ux) if lrf.transpose else (Ux, Vx)
    return Factorization(U=U, S=s, V=V)


def noise_std(plan: StreamPlan, epoch: int) -> dict[str, float]:
    """Per-entry noise std of each released sketch at ``epoch``: ``sqrt(popcount) sigma``."""
    cal = plan.lrf.calibration
    if cal is None:
        return {name: 0.0 for name in plan.names}
    pc = int(epoch).bit_count()
    return {name: math.sqrt(pc) * plan.lrf.sigma(name) for name in plan.names}


def model_error(plan: StreamPlan, noise_factor: float) -> dict[str, float] | None:
    """The error model's additive spectral error of a release whose noise is ``noise_factor``
    times the one-shot release's (None for a non-private stream).

    A continual mechanism multiplies every released sketch's noise by the same
    factor at an epoch (``ContinualMechanism.noise_factor``); the model's error
    at that noise (:func:`~pipeline.algorithms.lrf.model.predict`: the co-range
    term grows with it, the range term stays near its one-shot value) and its
    ratio to the full-matrix Gaussian mechanism of the same (epsilon, delta).
    """
    if plan.lrf.calibration is None:
        return None
    p = predict(plan.lrf, noise_factor=noise_factor)
    return {
        "predicted_error": p.error,
        "full_gm_error": p.full_gm_error,
        "ratio_to_full_gm": p.ratio,
    }


def operator_notes(plan: StreamPlan) -> dict[str, str]:
    """Which operators a stream's plan uses and why (public; status and reports say it)."""
    lrf = plan.lrf
    if plan.version == LEGACY_PLAN_VERSION:
        why = "the stream was created before streams used the batch release's exact operators"
        return {
            "co_range": f"{lrf.operator.value}; {why}",
            "range": "Gaussian with its tail bound",
            "sizes": "the spec's defaults and an even budget split (fixed at creation)",
        }
    if lrf.operator is OperatorKind.SPARSE_SIGN:
        co = (
            f"sparse sign, exact: each entity (unit {plan.unit.value}) stays in one row "
            "of the sketched matrix, where every column of S has norm 1"
        )
    elif plan.unit is StreamUnit.GENERAL:
        co = (
            "Gaussian with its tail bound: an entity of unit general may span rows of "
            "the sketched matrix, where a sparse sign has no exact bound"
        )
    else:
        co = (
            f"Gaussian with its tail bound: an entity of unit {plan.unit.value} spans "
            "a column of the sketched matrix (or a public seed covers any difference), "
            "where a sparse sign has no exact bound"
        )
    worst = " (worst case of the public operators)" if lrf.public_sketch_seed else ""
    return {
        "co_range": co + worst,
        "range": (
            "Gaussian with its tail bound: a stream's range sketch is a running sum "
            "over epochs, so its rows cannot be clipped once per individual"
        ),
        "sizes": (
            "the batch error model's sizes and its budget split at the stream's noise; "
            "denoised range basis"
            if plan.version == PLAN_VERSION
            else "the batch error model's sizes and one release's budget split; "
            "denoised range basis"
        ),
    }


def sum_deltas(
    plan: StreamPlan,
    deltas: Iterable[SketchDelta],
    into: dict[str, FloatArray] | None = None,
) -> dict[str, FloatArray]:
    """Accumulate deltas into exact sketches (zero ones when ``into`` is None)."""
    acc = empty_sketches(plan) if into is None else into
    for d in deltas:
        apply_delta(acc, d)
    return acc
