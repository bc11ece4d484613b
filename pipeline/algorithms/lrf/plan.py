"""Planning of the one-pass private factorizations: parameters, sizes, calibration.

Everything here reads public values only -- the shape, the rank, the budget, the
privacy unit and clip norm, and (for a public seed) the operators it generates --
never the data (plan-then-execute, style B.3.1). :func:`plan_lrf` validates the
parameters, orients the matrix, picks the operators' kinds, the sizes and the
budget split (:mod:`~pipeline.algorithms.lrf.model`) and calibrates the joint
Gaussian mechanism; :mod:`pipeline.algorithms.lrf.run` executes the plan.

Sensitivities [spec 4.2; private-lrf-2, 2-3]: a Gaussian operator contributes its
tail bound ``Delta_JL(d, beta)`` for a pair fixed before it is drawn (a secret
seed, delta_JL charged), or its exact worst case for a public seed; a sparse sign
``S`` contributes exactly 1; a range sketch clipped in sketch space
(:func:`clips_range`) exactly ``rho(t)``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from pipeline._sealed import Sealed
from pipeline._types import Shape2D
from pipeline._validation import (
    check_int_in_range,
)
from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchRequest,
    calibrate_release,
)
from pipeline.errors import InvalidParameterError
from pipeline.params import (
    Algorithm,
    LrfParams,
    OperatorKind,
    PrivacyUnit,
)
from pipeline.sketches.gaussian import OperatorCode
from pipeline.sketches.norms import operator_norms
from pipeline.sketches.operators import SketchOperator, make_operator


class Reach(enum.Enum):
    """What one individual's difference may touch in the sketched matrix ``X``.

    Decides the worst-case sensitivity of public operators (:func:`worst_case_factors`).
    """

    ROW = "row"  # one row of X
    COLUMN = "column"  # one column of X
    ANY = "any"  # any cells: only ||D||_F <= Delta_F is known


def reach_of(unit: PrivacyUnit, transpose: bool) -> Reach:
    """The reach of a privacy unit of ``A`` in ``X`` (``A`` or ``A.T``).

    The entry unit gets ``ANY``: a ledger reads an entry-unit release at row or
    column level through ``||dA||_F <= sqrt(n) Delta_F``
    (:mod:`pipeline.accounting.contract`), which needs a bound linear in
    ``||dA||_F`` for every ``dA``.

    Examples
    --------
    >>> reach_of(PrivacyUnit.ROW, transpose=True).value
    'column'
    """
    if unit is PrivacyUnit.ENTRY:
        return Reach.ANY
    along_rows = (unit is PrivacyUnit.ROW) != transpose
    return Reach.ROW if along_rows else Reach.COLUMN


def default_sketch_sizes(rank: int, *, private: bool) -> tuple[int, int]:
    """Default ``(t, v)`` for rank ``k`` [spec 2.3, corrected by measurement].

    DP: ``t = max(4k, k + 20)``, ``v = 4t`` -- the noise that reaches the output is
    amplified by ``||(S U)^+|| ~ 1/(1 - sqrt(t/v))``, 2 at ``v = 4t``.

    Non-private: ``t = max(3k, k + 20)``, ``v = 6t + 1``. The specification's
    ``t = max(2k, k + 10)``, ``v = 2t + 1`` is too small for one-pass accuracy on
    spectra that do not decay fast (its own addendum says so). Measured on
    20000 x 2000, k = 10, ``||A - M_k||_2 / sigma_11`` over 12 seeds: decay 0.8 max
    1.068, decay 0.9 max 1.087 with (30, 181), against 1.21 and 1.51 for (20, 81);
    at decay 0.9 the error is governed by t (t = 20 fails whatever v is), at 0.8 by
    v. Cost grows as ``2 m n (t + v)`` flops per pass.

    Examples
    --------
    >>> default_sketch_sizes(10, private=True), default_sketch_sizes(10, private=False)
    ((40, 160), (30, 181))
    """
    if private:
        t = max(4 * rank, rank + 20)
        return t, 4 * t
    t = max(3 * rank, rank + 20)
    return t, 6 * t + 1


def sparse_is_exact(unit: PrivacyUnit, transpose: bool, *, public_seed: bool) -> bool:
    """True when a sparse sign ``S`` adds exactly ``Delta_F`` to ``Z = S X``.

    Every column of a sparse sign ``S`` has norm exactly 1 [private-lrf-2, 2], so
    an individual confined to one row ``i`` of ``X`` changes ``Z`` by
    ``S[:, i] d^T``, of norm ``||d|| <= Delta_F``, for every draw of ``S``: the
    row unit when it lies along the rows of ``X`` (row unit not transposed,
    column unit transposed), and the entry unit (one cell lies in one row). An
    individual spread over a column of ``X`` would need a tail bound on
    ``||S c||`` that sparse maps do not have at the deltas of DP. A public seed
    with the entry unit is calibrated for any difference (:func:`reach_of`), so
    it keeps the Gaussian operator.

    Examples
    --------
    >>> sparse_is_exact(PrivacyUnit.ROW, False, public_seed=False)
    True
    >>> sparse_is_exact(PrivacyUnit.ROW, True, public_seed=False)
    False
    """
    if unit is PrivacyUnit.ENTRY:
        return not public_seed
    return reach_of(unit, transpose) is Reach.ROW


def clips_range(params: LrfParams, transpose: bool, reach: Reach | None) -> bool:
    """True when a plan clips the rows of its range sketch in sketch space.

    A private Spectral-LRF release of a stored matrix (``reach`` None) whose
    individuals are rows of ``X`` (:func:`reach_of`): one individual's row
    ``x`` moves ``Y = X Phi`` by the one row ``x Phi``, which the clip keeps
    within ``rho C`` for every ``Phi`` -- an exact sensitivity ``rho Delta_F``
    in place of the tail bound ``Delta_JL(t, beta)``, which needed a share of
    delta and a large ``t``. A stream's sketches are sums over time, whose
    rows cannot be clipped once; an individual spread over a column of ``X``
    (the entry unit, or the row unit of a wide matrix) changes every row.

    Examples
    --------
    >>> p = LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0, delta=1e-6)
    >>> clips_range(p, False, None), clips_range(p, True, None)
    (True, False)
    """
    return (
        params.private
        and params.range_clip
        and params.algorithm is Algorithm.SPECTRAL
        and reach is None
        and params.clip.unit is not PrivacyUnit.ENTRY
        and reach_of(params.clip.unit, transpose) is Reach.ROW
    )


def default_operator(*, private: bool, exact_sparse: bool = False) -> OperatorKind:
    """The co-range operator kind used when none is asked for.

    Sparse sign with 8 non-zeros per index [spec 5.3; TYUC19] wherever it may
    be used: always in a non-private run, and in a private release when its
    sensitivity is exact (``exact_sparse``, :func:`sparse_is_exact`). Then
    ``Z = S X`` costs 16 instead of ``2v`` flops per entry, needs no normal
    draws, and spends no delta on a tail bound. Otherwise Gaussian, calibrated
    with ``Delta_JL`` [spec 4.2].

    Examples
    --------
    >>> default_operator(private=True).value, default_operator(private=False).value
    ('gaussian', 'sparse-sign')
    >>> default_operator(private=True, exact_sparse=True).value
    'sparse-sign'
    """
    if not private or exact_sparse:
        return OperatorKind.SPARSE_SIGN
    return OperatorKind.GAUSSIAN


@dataclass(frozen=True, kw_only=True, slots=True)
class LrfPlan:
    """A validated release plan: orientation, sizes and calibration. No data.

    ``public_seed_fingerprint`` is set when the calibration is the worst case of
    the operators of a public sketch seed (this seed's fingerprint), and
    ``reach`` says which worst case. A private plan also has ``range_weight``
    (the range sketches' share of the budget), ``basis_rank`` (``k'``: the range
    basis is the top ``k'`` left singular vectors of the noisy range sketch,
    [private-lrf-2, 4]) and ``predicted_error`` (the public error model's
    prediction of the additive spectral error, :mod:`~pipeline.algorithms.lrf.model`).
    ``range_clip`` is ``rho`` when the rows of ``Y`` are clipped to ``rho C``
    before the noise (:func:`clips_range`), else None.
    """

    params: LrfParams
    shape: Shape2D
    transpose: bool
    t: int
    v: int
    calibration: ReleaseCalibration | None
    operator: OperatorKind = OperatorKind.GAUSSIAN
    public_seed_fingerprint: str | None = None
    reach: Reach | None = None
    range_weight: float | None = None
    basis_rank: int | None = None
    predicted_error: float | None = None
    range_clip: float | None = None

    @property
    def range_clip_bound(self) -> float | None:
        """``rho C``: the norm the rows of ``Y`` are clipped to before the noise
        (:func:`clips_range`), or None."""
        if self.range_clip is None:
            return None
        return self.range_clip * self.params.clip.clip_norm

    @property
    def public_sketch_seed(self) -> bool:
        """True when the calibration covers the operators of a public seed."""
        return self.public_seed_fingerprint is not None

    @property
    def oriented_shape(self) -> Shape2D:
        """Shape (M, N) of the matrix X actually sketched."""
        m, n = self.shape
        return (n, m) if self.transpose else (m, n)

    @property
    def n_gaussian_operators(self) -> int:
        """``J``: the Gaussian operators whose norm bound a sensitivity relies on.

        Spectral: ``Phi`` unless ``Y`` is clipped in sketch space, and ``S``
        unless it is sparse (exact, [private-lrf-2, 2]). Low-Space: ``Phi_c``,
        ``Psi``, ``T``, and ``S`` unless sparse.
        """
        if self.params.algorithm is Algorithm.SPECTRAL:
            base = 0 if self.range_clip is not None else 1  # a clipped Y needs no bound
        else:
            base = 3
        return base + int(self.operator is OperatorKind.GAUSSIAN)

    @property
    def entry_reads(self) -> tuple[str, ...]:
        """Units of ``A`` an entry-unit release may be read at by a ledger.

        A sparse ``S`` is exact for a difference within one row of ``X`` only
        (:func:`sparse_is_exact`), so the entry release converts to that axis
        of ``A`` alone (:func:`pipeline.accounting.contract.gdp_scale`).
        """
        if self.operator is not OperatorKind.SPARSE_SIGN or self.calibration is None:
            return ("row", "column")
        return ("column",) if self.transpose else ("row",)

    def sigma(self, name: str) -> float:
        """Noise std of released statistic ``name`` (0.0 when not private)."""
        if self.calibration is None:
            return 0.0
        return next(s.sigma for s in self.calibration.sketches if s.name == name)


def resolve_sizes(p: LrfParams, M: int, N: int) -> tuple[int, int]:
    """Validate (t, v) against ``k < t <= min(M, N)``, ``t < v`` (``v <= M`` for Spectral)."""
    small = min(M, N)
    v_cap = M if p.algorithm is Algorithm.SPECTRAL else None
    k = check_int_in_range(
        p.rank, "rank", 1, small - 1, what="[1, min(n_rows, n_cols) - 1]"
    )
    t0, v0 = default_sketch_sizes(k, private=p.private)
    if p.sketch_size is None:
        t = min(
            t0, small
        )  # defaults shrink to fit a small matrix; user values never do
        if v_cap is not None:
            t = min(t, v_cap - 1)  # leave room for t < v <= M (square Spectral input)
        if t <= k:  # only M = N = k + 1: no k < t < v <= M exists
            raise InvalidParameterError(
                "rank must be in [1, min(n_rows, n_cols) - 2] for algorithm='spectral' "
                f"on a square matrix, got rank={k}."
            )
    else:
        t = check_int_in_range(
            p.sketch_size,
            "sketch_size",
            k + 1,
            small,
            what="[rank + 1, min(n_rows, n_cols)]",
        )
    if p.core_size is None:
        v = v0 if p.sketch_size is None else (4 * t if p.private else 6 * t + 1)
        v = min(v, v_cap) if v_cap is not None else v
    else:
        v = p.core_size
    hi_txt = (
        "[sketch_size + 1, max(n_rows, n_cols)]" if v_cap else "[sketch_size + 1, inf)"
    )
    v = check_int_in_range(v, "core_size", t + 1, v_cap, what=hi_txt)
    return t, v


def operator_of(
    params: LrfParams, transpose: bool, public_seed: bool, reach: Reach | None
) -> OperatorKind:
    """The co-range operator of a plan; a sparse one only where it is exact.

    A caller that declares ``reach`` (a stream: an entity's cells may lie in
    any rows) gets a sparse ``S`` only for ``Reach.ROW``.
    """
    exact = (
        params.private
        and not params.padded  # the paper's construction, reproduced as it is
        and (
            reach is Reach.ROW
            if reach is not None
            else sparse_is_exact(params.clip.unit, transpose, public_seed=public_seed)
        )
    )
    operator = params.operator or default_operator(
        private=params.private, exact_sparse=exact
    )
    if params.private and operator is OperatorKind.SPARSE_SIGN and not exact:
        raise InvalidParameterError(
            "operator='sparse-sign' in a private release needs every individual within "
            "one sketched row (the row unit on a matrix with n_rows >= n_cols, the "
            "column unit on one with n_cols > n_rows, or the entry unit with a secret "
            "sketch seed; not padded); use operator='gaussian' or drop it."
        )
    return operator


def calibrate_plan(
    plan: LrfPlan, factors: dict[str, float] | None = None, *, tree_levels: int = 1
) -> LrfPlan:
    """``plan`` with the joint calibration of its sketches over ``tree_levels`` levels.

    ``factors``: the public operators' worst-case factors (None: ``Delta_JL``).
    """
    p = plan.params
    if p.epsilon is None or p.delta is None:
        raise InvalidParameterError("a private release needs epsilon and delta.")
    _M, _N = plan.oriented_shape
    requests = _requests(plan)
    calibration = calibrate_release(
        requests,
        epsilon=p.epsilon,
        delta=p.delta,
        frobenius_bound=p.neighboring.frobenius_bound(p.clip.clip_norm),
        # every distinct Gaussian matrix whose tail bound a sensitivity uses
        n_sketch_matrices=plan.n_gaussian_operators,
        tree_levels=tree_levels,
        delta_jl_fraction=p.delta_jl_fraction,
        public_operator_factors=factors,
    )
    calibration.check()
    return dataclasses.replace(plan, calibration=calibration)


#: Per released sketch: the operator applied along the rows of X (``G^T X``) and
#: the one applied along its columns (``X G``); None where there is none.
_SIDES = {
    Algorithm.SPECTRAL: {"Y": (None, "Phi"), "Z": ("S", None)},
    Algorithm.LOW_SPACE: {"Yc": (None, "PhiC"), "Yr": ("Psi", None), "Z": ("S", "T")},
}


def worst_case_factors(plan: LrfPlan, seed: int, reach: Reach) -> dict[str, float]:
    """Exact worst-case sensitivity factor of each sketch for public operators.

    Parameters
    ----------
    plan : LrfPlan
        Sizes, orientation and operator kind (its calibration is not used).
    seed : int
        The public sketch seed; the operators are generated from it exactly as
        the pass generates them.
    reach : Reach
        What one individual's difference ``D`` may touch in ``X``.

    Returns
    -------
    dict
        Sketch name -> ``Delta_i`` with ``||f_i(X + D) - f_i(X)||_F <= Delta_i
        ||D||_F`` for EVERY such ``D``, attained by some ``D``.

    Notes
    -----
    A row operator ``G`` (``G^T X``) contributes ``max_i ||G[i, :]||`` when
    ``D`` is one row of ``X`` (``G^T e_i d^T``) and ``||G||_2`` otherwise; a
    column operator (``X G``) contributes ``max_j ||G[j, :]||`` when ``D`` is one
    column and ``||G||_2`` otherwise (``d^T G``). A two-sided sketch
    ``G_S^T D G_T`` multiplies its two factors: for ``D = e_i d^T`` it is
    ``||G_S[i, :]|| ||G_T^T d||``, and ``||A D B||_F <= ||A||_2 ||D||_F ||B||_2``
    for any ``D``. Each bound is attained (the maximising row and the top
    singular vector), so it is the exact worst case [private-lrf-2, 3]. Sparse
    sign operators have rows of norm exactly 1. The norms are computed tile by
    tile (:func:`pipeline.sketches.norms.operator_norms`).

    Examples
    --------
    >>> from pipeline.algorithms.lrf import plan_lrf
    >>> plan = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0,
    ...                           delta=1e-6, range_clip=False), (500, 300))
    >>> f = worst_case_factors(plan, 7, Reach.ROW)
    >>> bool(f["Y"] > 2.0), round(f["Z"], 12)  # a sparse S: columns of norm 1
    (True, 1.0)
    """
    ops = plan_operators(plan, seed)
    sides = dict(_SIDES[plan.params.algorithm])
    clipped = {"Y": plan.range_clip} if plan.range_clip is not None else {}
    for name in clipped:  # rho for any operator: its norm is not needed
        del sides[name]
    # True: the operator's largest row norm is its factor (D's index along the
    # operator's axis is fixed); False: its spectral norm. Each operator acts on
    # one side only.
    by_row: dict[str, bool] = {}
    for left, right in sides.values():
        if left is not None:
            by_row[left] = reach is Reach.ROW
        if right is not None:
            by_row[right] = reach is Reach.COLUMN
    factor = {}
    for name, use_rows in by_row.items():
        nm = operator_norms(ops[name], spectral=not use_rows, max_row=use_rows)
        value = nm.max_row if use_rows else nm.spectral
        assert value is not None
        factor[name] = value
    return clipped | {
        sketch: math.prod(factor[op] for op in (left, right) if op is not None)
        for sketch, (left, right) in sides.items()
    }


def _requests(plan: LrfPlan) -> list[SketchRequest]:
    """The released sketches, their Gaussian factors and budget weights.

    A sparse ``S`` contributes no ``Delta_JL`` factor (exact). The range
    sketches share ``range_weight`` of the budget (Low-Space: half each for
    ``Y_c`` and ``Y_r``; equal thirds when no weight is set, the paper's split).
    """
    M, N = plan.oriented_shape
    t, v = plan.t, plan.v
    s_dims: tuple[int, ...] = () if plan.operator is OperatorKind.SPARSE_SIGN else (v,)
    w = plan.range_weight
    if plan.params.algorithm is Algorithm.SPECTRAL:
        w = 0.5 if w is None else w
        rho = plan.range_clip
        y_side = (
            {"jl_dims": (), "clip_factor": rho}
            if rho is not None
            else {"jl_dims": (t,)}
        )
        return [
            SketchRequest(name="Y", shape=(M, t), weight=w, **y_side),
            SketchRequest(name="Z", shape=(v, N), jl_dims=s_dims, weight=1.0 - w),
        ]
    wc = wr = 1.0 / 3.0 if w is None else w / 2.0
    return [
        SketchRequest(name="Yc", shape=(M, t), jl_dims=(t,), weight=wc),
        SketchRequest(name="Yr", shape=(t, N), jl_dims=(t,), weight=wr),
        SketchRequest(
            name="Z", shape=(v, v), jl_dims=(*s_dims, v), weight=1.0 - wc - wr
        ),
    ]


#: The operators whose kind ``LrfPlan.operator`` sets.
_CO_RANGE = frozenset({OperatorCode.S, OperatorCode.T, OperatorCode.T_PAD})


def plan_operators(plan: LrfPlan, root: int | Sealed) -> dict[str, SketchOperator]:
    """The sketch operators of ``plan`` under the root ``root``, by name:
    ``Phi`` and ``S`` (Spectral-LRF); ``PhiC``, ``Psi``, ``S``, ``T`` and, padded,
    ``Tpad`` (Low-Space-LRF). Descriptions only: nothing is generated here."""
    M, N = plan.oriented_shape
    t, v, b = plan.t, plan.v, plan.params.tile_size

    # range operators stay Gaussian; S follows plan.operator, and so do T and
    # T_pad of a non-private run: a private T needs its Delta_JL tail bound
    sparse_ok = {OperatorCode.S} if plan.params.private else _CO_RANGE

    def op(code: OperatorCode, length: int, dim: int) -> SketchOperator:
        kind = plan.operator if code in sparse_ok else OperatorKind.GAUSSIAN
        return make_operator(
            kind, root=root, code=code, length=length, dim=dim, tile_size=b
        )

    if plan.params.algorithm is Algorithm.SPECTRAL:
        return {"Phi": op(OperatorCode.PHI, N, t), "S": op(OperatorCode.S, M, v)}
    ops = {
        "PhiC": op(OperatorCode.PHI_C, N, t),
        "Psi": op(OperatorCode.PSI, M, t),
        "S": op(OperatorCode.S, M, v),
        "T": op(OperatorCode.T, N, v),
    }
    if plan.params.padded:
        ops["Tpad"] = op(OperatorCode.T_PAD, M, v)
    return ops
