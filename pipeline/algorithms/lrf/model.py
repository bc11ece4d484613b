"""A public error model of the private factorizations: it sizes and splits a release.

Problem. A private factorization releases noisy sketches whose sizes (``t``,
``v``) and budget split set how much of the noise reaches the result. They must
be chosen before anything is read, from public values only (the shape, the rank,
the budget, the unit and clip norm) -- never from the data.

Model [private-lrf-2, 5], fitted against simulations. The yardstick is the
full-matrix Gaussian mechanism ("full GM": ``A + N``, ``N_ij ~ N(0, (s
Delta_F)^2)``, truncated SVD; ``s = s(epsilon, delta)`` of [BW18]), whose
additive spectral error ``||A - A_k_hat||_2 - sigma_{k+1}`` is about
``s Delta_F sqrt(M + N)`` (:func:`full_gm_error`). A sketch spends its noise on
two sides: the range side (``M`` rows, noise ``g_Y s Delta_F / sqrt(w)`` per
entry, ``g_Y`` the range sketch's sensitivity factor) and the co-range side
(``N`` columns, ``g_Z s Delta_F / sqrt(1 - w)``). In quadrature, relative to the
full GM::

    ratio = kappa * sqrt(g_Y^2 M / w + c g_Z^2 N / (1 - w)) / sqrt(M + N)

* ``c = C_CORANGE = 0.14``: co-range noise reaches the result through the
  estimated right subspace, damped. Fitted on two independent sets of
  simulations: one pass at 20000 x 400 (t = 160, w in {0.8, 0.95}: c = 0.142)
  and two passes at 4000 x 500 (w_Z = 0.15, epsilon = 4: c = 0.134). The
  specification's first model (``b`` with ``sqrt(N) + sqrt(v)``, no damping)
  put the best split at 0.64-0.89 where simulations found 0.8-0.97.
* The split: ``w = a / (a + b)`` with ``a = g_Y sqrt(M)``, ``b = sqrt(c) g_Z
  sqrt(N)`` minimises the ratio (Lagrange: ``a^2 / w^2 = b^2 / (1 - w)^2``):
  0.96 at 20000 x 400 (measured optimum >= 0.95) and 0.84 at 4000 x 2000, t = 128
  (measured ratio 1.87 at 0.8 and at 0.7, 2.54 at 0.9) (:func:`best_weight`).
* ``kappa = KAPPA_ONE_PASS = 1.10`` for one pass (20000 x 400, unit entry,
  epsilon = 4: 1.09 at t = 160, 1.11 at t = 40). The two-pass algorithm has
  ``g_Y = g_Z = 1`` (exact sensitivities; its range side is ``A V_k``) and
  ``kappa = 1`` (``c`` was fitted on it).

The simulations: a strong rank-5 signal (random sign factors, sigma 1 to 0.4)
plus a uniform tail, scaled to entries in [-1, 1], unit entry, k = 5, delta =
1e-6, median of 3 noise draws; ``python benchmarks/lrf_model_fit.py`` reruns
them next to this model's ratios, docs/algorithms.md "Error model and budget
split" has the tables, and ``benchmarks/bench_utility.py`` measures the result.

The model leaves out the sketch's own approximation error (the part of the
spectrum beyond what the sketch captures), which dominates when the noise is
small against the signal: there one pass does worse than predicted (2.2 at
4000 x 2000, epsilon = 4, where the model says 1.5; 1.67 at 20000 x 400,
epsilon = 16) and the two-pass algorithm is the better choice.

Noise above the one-shot release's. A continual release at epoch tau carries
``f(tau)`` times the one-shot noise on every sketch (``f`` about 1.7 to 3 for a
366-epoch stream, ``ContinualMechanism.noise_factor``). The two sides do not
grow alike. The co-range noise reaches the result in full once it is no longer
small against the range side's error (the damping ``c`` is the second-order
effect of a small term in quadrature). The range side's error is the signal
its basis misses, so it cannot exceed the signal: on the fitted signals the
one-shot release already sits near that edge (``sigma_k`` of the signal below
the range noise's norm ``g_Y s Delta_F sqrt(M / w)``: 173 against 324 at 10000
x 500, epsilon = 2), and beyond it the range error stays near its one-shot
level. This is a fit to such signals, not a bound: a signal far above the noise
keeps its range error growing with ``f``, where the one-shot split would do
better. The model keeps the range term at its
one-shot value and scales the co-range term by ``f^2``; the best split becomes
``a / (a + f b)``, and ``f = 1`` is the one-shot model unchanged. Measured
(``python benchmarks/lrf_model_fit.py --noise-factors 1.69 2.87``: unit entry,
epsilon = 2, median of 3, the stream benchmark's matrices), the additive error
with the one-shot split / the split for ``f``: at ``f = 2.87``, 701 / 442
(10000 x 500 low rank, w = 0.944 / 0.854; the model says 432 / 402) and 518 /
309 (the source bag-of-words 9838 x 128, w = 0.970 / 0.919; model 386 / 370);
at ``f = 1.69``, 430 / 366 and 297 / 229. A stream plans its
split for the root mean square of ``f`` over its horizon
(:func:`pipeline.algorithms.continual.plan_stream`).

Range clipping. Where one individual is one row of the sketched matrix (the
row unit of a matrix with m >= n) a private Spectral-LRF release clips the
rows of ``Y = X Phi`` to ``rho(t) C`` before the noise
(:func:`pipeline.algorithms.lrf.plan.clips_range`). Its range factor is then
``g_Y = rho(t)``, exact for every ``Phi``: ``rho`` is the ``1 - q`` quantile of
``||x Phi|| / ||x||`` (``q = RANGE_CLIP_QUANTILE = 0.01``; 1.37 at t = 20), so a
row at the clip norm is shortened with probability ``q`` -- a small bias, not a
privacy failure. With no tail to shrink, a large ``t`` buys only the sketch's
own approximation, and the pass pays for every column of ``Y`` (its product,
its noise): ``t = max(2k, k + 10)``, with the non-private ``v = 6 max(3k, k +
20) + 1`` (:func:`clipped_range_sizes`). Measured with ``benchmarks/bench_utility.py
--units row --epsilons 16 --algorithms spectral --draws 5`` (20000 x 600,
k = 8 and 5; error over the full GM): 1.11 and 1.11 at these sizes, 0.98 and
1.05 at t = 24, v = 169, 1.41 and 1.21 at t = 24, v = 48 (a small core
amplifies the co-range noise), against 0.97 and 1.06 (3 draws) for the tail
bound at t = 116, v = 232. Where the noise is small against a heavy-tailed
spectrum a larger ``t`` still pays (``--real source_bow``, epsilon = 32: 2.00
at t = 18, 1.30 at t = 60, v = 232), and the two-pass release is the
accurate choice (0.75 there). docs/algorithms.md has the commands and files.

Sizes. The range side's factor ``Delta_JL(t, beta)`` falls slowly with ``t``
(1.71 at t = 40, 1.43 at 100, 1.30 at 200, beta = 5e-7) while the pass costs
``2t`` flops per entry for it. The default ``t`` is the smallest with
``Delta_JL(t, beta) <= JL_TARGET`` (at least ``max(4k, k + 20)``); ``v = 2t``
(a sparse ``S`` costs the same for every ``v``); the range basis keeps the top
``k`` directions of the noisy ``Y`` (``k + 5`` was 1.5% worse).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scipy.special import gammaincinv

from pipeline.accounting.gaussian import (
    gaussian_noise_multiplier,
    jl_sensitivity_factor,
)
from pipeline.algorithms.lrf.plan import LrfPlan, default_sketch_sizes, resolve_sizes
from pipeline.params import Algorithm

if TYPE_CHECKING:  # annotations only: two_pass does not import this module
    from pipeline.algorithms.lrf.two_pass import TwoPassPlan

__all__ = [
    "C_CORANGE",
    "JL_TARGET",
    "KAPPA_ONE_PASS",
    "RANGE_CLIP_QUANTILE",
    "Prediction",
    "best_weight",
    "choose_private_sizes",
    "default_sizes",
    "full_gm_error",
    "predict",
    "range_clip_factor",
    "range_size",
    "sketch_ratio",
    "weight_of",
]

#: Fitted ratio of measured to modelled error of one pass (module docstring).
KAPPA_ONE_PASS = 1.10
#: The damping of co-range noise in the result (module docstring).
C_CORANGE = 0.14
#: The range factor the default ``t`` reaches: ``t ~ 120`` at delta = 1e-6.
JL_TARGET = 1.4
#: Sketch-space clipping of the range sketch: the share of rows at the clip
#: norm whose sketch row is shortened (module docstring, "Range clipping").
RANGE_CLIP_QUANTILE = 0.01
#: Budget splits outside this range are never chosen: both sides need noise
#: small enough to find their subspace.
_W_RANGE = (0.05, 0.97)


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model's additive spectral error, absolute and against the full GM."""

    error: float
    full_gm_error: float
    ratio: float

    def to_dict(self) -> dict[str, float]:
        """JSON-ready form (reports, ``dplr factorize --plan``)."""
        return {
            "predicted_error": self.error,
            "full_gm_error": self.full_gm_error,
            "ratio_to_full_gm": self.ratio,
        }


def full_gm_error(
    M: int, N: int, noise_multiplier: float, frobenius_bound: float
) -> float:
    """``s Delta_F sqrt(M + N)``: the full GM's additive spectral error, roughly.

    Its residual is the noise on the signal's column and row spaces, ``N P_V``
    (M x k) and ``P_U N`` (k x N), of norms about ``s Delta_F sqrt(M)`` and
    ``s Delta_F sqrt(N)``. Measured (20000 x 400, k = 5, unit entry): 170 and
    192 at epsilon = 4 where this gives 170; 51.5 at epsilon = 16 for 52.6.

    Examples
    --------
    >>> round(full_gm_error(20000, 400, 1.0, 1.0), 1)
    142.8
    """
    return noise_multiplier * frobenius_bound * math.sqrt(M + N)


def sketch_ratio(
    M: int,
    N: int,
    *,
    weight: float,
    g_range: float,
    g_corange: float,
    kappa: float = KAPPA_ONE_PASS,
    noise_factor: float = 1.0,
) -> float:
    """The model's error ratio to the full GM of the same budget (module docstring).

    ``noise_factor`` ``f >= 1``: every sketch's noise is ``f`` times the one-shot
    release's (a continual release); the range term keeps its one-shot value and
    the co-range term grows by ``f^2`` (module docstring, "Noise above the
    one-shot release's").

    Examples
    --------
    >>> round(sketch_ratio(4000, 500, weight=0.85, g_range=1.0, g_corange=1.0, kappa=1.0), 3)
    1.072
    """
    rng = g_range**2 * M / weight
    co = C_CORANGE * (noise_factor * g_corange) ** 2 * N / (1.0 - weight)
    return kappa * math.sqrt(rng + co) / math.sqrt(M + N)


def best_weight(
    M: int, N: int, *, g_range: float, g_corange: float, noise_factor: float = 1.0
) -> float:
    """The range side's share ``a / (a + f b)`` that minimises :func:`sketch_ratio`.

    Examples
    --------
    >>> round(best_weight(20000, 400, g_range=1.399, g_corange=1.0), 3)
    0.964
    >>> round(best_weight(10000, 500, g_range=1.399, g_corange=1.0, noise_factor=2.75), 3)
    0.859
    """
    a = g_range * math.sqrt(M)
    b = noise_factor * math.sqrt(C_CORANGE) * g_corange * math.sqrt(N)
    lo, hi = _W_RANGE
    return min(hi, max(lo, a / (a + b)))


def _beta(plan: LrfPlan) -> float:
    """Failure probability per Gaussian operator, as the calibration will set it."""
    p = plan.params
    assert p.delta is not None
    return p.delta_jl_fraction * p.delta / plan.n_gaussian_operators


def range_clip_factor(t: int, quantile: float = RANGE_CLIP_QUANTILE) -> float:
    """``rho(t)``: the range sketch's rows are clipped to ``rho C``.

    The ``1 - quantile`` quantile of ``||x Phi|| / ||x||`` for a Gaussian
    ``Phi`` (t columns, entries N(0, 1/t)): ``sqrt(chi2_t^{-1}(1 - q) / t)``.
    A row at the clip norm is shortened with probability ``quantile``; the
    privacy of the release does not depend on it (the clip bounds every row).

    Examples
    --------
    >>> round(range_clip_factor(30), 3), round(range_clip_factor(116), 3)
    (1.302, 1.153)
    """
    return math.sqrt(2.0 * float(gammaincinv(t / 2.0, 1.0 - quantile)) / t)


def range_size(rank: int, beta: float) -> int:
    """Smallest ``t >= max(4k, k + 20)`` with ``Delta_JL(t, beta) <= JL_TARGET``.

    Examples
    --------
    >>> range_size(5, 5e-7), range_size(40, 5e-7)
    (116, 160)
    """
    t = max(4 * rank, rank + 20)
    while jl_sensitivity_factor(t, beta) > JL_TARGET:
        t += 1
    return t


def clipped_range_sizes(rank: int) -> tuple[int, int]:
    """``(t, v)`` of a clipped range sketch: ``t = max(2k, k + 10)`` and the
    non-private ``v`` (module docstring, "Range clipping").

    Examples
    --------
    >>> clipped_range_sizes(10), clipped_range_sizes(5)
    ((20, 181), (15, 151))
    """
    return max(2 * rank, rank + 10), default_sketch_sizes(rank, private=False)[1]


def default_sizes(
    plan: LrfPlan, *, clipped_range: bool | None = None
) -> tuple[int, int]:
    """The model's ``(t, v)`` for a private ``plan``, clamped to its shape.

    With a tail bound on the range side: the smallest ``t >= max(4k, k + 20)``
    with ``Delta_JL(t, beta) <= JL_TARGET`` and ``v = 2t``. When the range
    sketch is clipped in sketch space (``clipped_range``; None reads it from
    ``plan.range_clip``) its factor ``rho(t)`` has no tail to shrink, and the
    sizes are :func:`clipped_range_sizes` (module docstring, "Range
    clipping"). ``v <= M`` for Spectral-LRF, which needs ``t < v``.
    """
    M, N = plan.oriented_shape
    k = plan.params.rank
    if clipped_range is None:
        clipped_range = plan.range_clip is not None
    if clipped_range:
        t0, v0 = clipped_range_sizes(k)
    else:
        t0 = range_size(k, _beta(plan))
        v0 = 2 * t0
    t = min(t0, M, N)
    v = v0 if t == t0 else 2 * t
    if plan.params.algorithm.value == "spectral":
        v = min(v, M)
        t = min(t, v - 1)
    return t, v


def _factors(plan: LrfPlan) -> tuple[float, float]:
    """(g_range, g_corange) of a sized plan with secret operators."""
    sparse = plan.operator.value == "sparse-sign"
    if plan.range_clip is not None and sparse:
        return plan.range_clip, 1.0  # no Gaussian tail bound at all
    beta = _beta(plan)
    g_range = plan.range_clip or jl_sensitivity_factor(plan.t, beta)
    return g_range, 1.0 if sparse else jl_sensitivity_factor(plan.v, beta)


def weight_of(plan: LrfPlan, *, noise_factor: float = 1.0) -> float:
    """The range sketches' budget share of a sized plan (:func:`best_weight`)."""
    M, N = plan.oriented_shape
    g_range, g_co = _factors(plan)
    return best_weight(M, N, g_range=g_range, g_corange=g_co, noise_factor=noise_factor)


def predict(plan: LrfPlan | TwoPassPlan, *, noise_factor: float = 1.0) -> Prediction:
    """The model's additive error of a sized private ``plan`` (one or two passes).

    ``noise_factor`` (one pass): a release whose every sketch carries ``f``
    times the plan's one-shot noise (:func:`sketch_ratio`); the full GM stays
    the one-shot release's of the same budget.
    """
    M, N = plan.oriented_shape
    p = plan.params
    assert p.epsilon is not None
    assert p.delta is not None
    bound = p.neighboring.frobenius_bound(p.clip.clip_norm)
    gm = full_gm_error(M, N, gaussian_noise_multiplier(p.epsilon, p.delta), bound)
    if p.algorithm.value == "two-pass":
        w = plan.weight_y  # type: ignore[union-attr]
        ratio = sketch_ratio(M, N, weight=w, g_range=1.0, g_corange=1.0, kappa=1.0)
    else:
        w = plan.range_weight  # type: ignore[union-attr]
        assert w is not None
        g_range, g_co = _factors(plan)  # type: ignore[arg-type]
        ratio = sketch_ratio(
            M, N, weight=w, g_range=g_range, g_corange=g_co, noise_factor=noise_factor
        )
    return Prediction(error=ratio * gm, full_gm_error=gm, ratio=ratio)


def choose_private_sizes(plan: LrfPlan, *, clipped_range: bool = False) -> LrfPlan:
    """``plan`` with its private sizes, budget split and range basis rank.

    User-given ``sketch_size``, ``core_size`` and ``range_weight`` are kept; the
    others come from the public error model (this module),
    which reads only the shape, the rank, the budget and the operators' kinds --
    never the data. The paper's padded construction keeps its own basis and
    even split. ``clipped_range`` (:func:`clips_range`) sets ``range_clip`` to
    ``rho(t)`` (:func:`~pipeline.algorithms.range_clip_factor`).
    """
    M, N = plan.oriented_shape
    p = plan.params
    resolve_sizes(p, M, N)  # the rank checks and messages of any plan of this shape
    t0, v0 = default_sizes(plan, clipped_range=clipped_range)
    if p.sketch_size is not None and p.core_size is None and 2 * p.sketch_size > v0:
        # the model's v = 2t for a user's t above the model's: t < v must hold
        v0 = (
            min(2 * p.sketch_size, M)
            if p.algorithm is Algorithm.SPECTRAL
            else 2 * p.sketch_size
        )
    t, v = resolve_sizes(
        dataclasses.replace(p, sketch_size=p.sketch_size or t0, core_size=p.core_size or v0),
        M, N,
    )  # fmt: skip
    plan = dataclasses.replace(
        plan, t=t, v=v, basis_rank=None if p.padded else p.rank,
        range_clip=range_clip_factor(t) if clipped_range else None,
    )  # fmt: skip
    weight = p.range_weight
    if weight is None:
        weight = 2.0 / 3.0 if p.padded else weight_of(plan)
    plan = dataclasses.replace(plan, range_weight=weight)
    return dataclasses.replace(plan, predicted_error=predict(plan).error)
