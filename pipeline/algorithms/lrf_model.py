"""Public error model of the one-pass private factorization (being fitted)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.algorithms.lrf import LrfPlan


@dataclass(frozen=True, slots=True)
class SizeChoice:
    t: int
    v: int
    range_weight: float
    basis_rank: int | None


@dataclass(frozen=True, slots=True)
class Prediction:
    error: float


def choose(plan: LrfPlan) -> SizeChoice:
    from pipeline.algorithms.lrf import _resolve_sizes

    M, N = plan.oriented_shape
    p = plan.params
    t, v = _resolve_sizes(p, M, N)
    w = 0.5 if p.range_weight is None else p.range_weight
    return SizeChoice(t=t, v=v, range_weight=w, basis_rank=None if p.padded else p.rank)


def predict(plan: LrfPlan) -> Prediction:
    return Prediction(error=0.0)
