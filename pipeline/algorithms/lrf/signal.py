"""The noise level of a factorization's released singular values (public values only).

Problem. Say, from the public noise law of a release alone, below which level
its released singular values are indistinguishable from noise
(:mod:`pipeline.mechanisms.signal` has the principle and the bounds). Each
algorithm passes its noise to ``S`` differently:

* two-pass [private-lrf-2, 6.3]: ``S`` are the singular values of ``Y = X V_k +
  N_Y`` (M x t, ``N_Y`` i.i.d. ``N(0, sigma_Y^2)``, ``V_k`` fixed before ``N_Y``
  is drawn), debiased to ``sqrt(max(s^2 - M sigma_Y^2, 0))``. Weyl and
  [DS01, Thm. II.13]: ``s_i(Y) <= s_i(X V_k) + L`` with ``L = sigma_Y (sqrt(M) +
  sqrt(t) + t_c)`` at confidence ``c``; the level on the released (debiased)
  scale is ``sqrt(max(L^2 - M sigma_Y^2, 0))``, a monotone map. A valid bound.
* Spectral-LRF [spec 3.2, F2]: ``S`` are the singular values of ``(S U)^+
  [P Z]_k``; the co-range noise reaches them as ``U_t^T N_Z`` (t x N, i.i.d.
  ``N(0, sigma_Z^2)`` exactly: ``U_t`` is orthonormal and fixed before
  ``N_Z``), bounded by ``sigma_Z (sqrt(t) + sqrt(N) + t_c)``. **Weaker**: the
  factor ``1 / s_min(S U)`` that follows is not bounded here (``S U`` is a
  subspace embedding with singular values near 1, but its conditioning is not
  public and no sharp embedding bound for the sparse sign operator is used), and
  the range noise is left out.
* Low-Space-LRF [spec 3.3, F2]: likewise through ``U_s^T N U_t`` (t x t) of
  the core sketch's noise: ``sigma_Z (2 sqrt(t) + t_c)``, with the same caveat
  for the two pseudo-inverses.

A continual release (a stream's epoch) is the same one-pass post-processing of
sketches whose noise std is the epoch's (``sqrt(popcount) sigma``), so the same
levels apply with those stds.

References
----------
.. [DS01] K. R. Davidson, S. J. Szarek, Handbook of the Geometry of Banach
   Spaces, vol. 1, 2001, Thm. II.13.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pipeline.algorithms.lrf.plan import LrfPlan
from pipeline.mechanisms.signal import CONFIDENCE, gaussian_norm_bound
from pipeline.params import Algorithm

if TYPE_CHECKING:  # annotations only
    from pipeline.algorithms.lrf.two_pass import TwoPassPlan

__all__ = ["noise_level", "plan_noise_level"]


def noise_level(
    algorithm: Algorithm,
    oriented_shape: tuple[int, int],
    t: int,
    sigmas: Mapping[str, float],
    confidence: float = CONFIDENCE,
) -> float:
    """The level of the released singular values that noise stays below.

    Parameters
    ----------
    algorithm : Algorithm
        ``spectral``, ``low-space`` or ``two-pass`` (not ``auto``).
    oriented_shape : (int, int)
        ``(M, N)`` of the oriented matrix ``X``.
    t : int
        Width of the range sketch (``Y``, ``Y_c``).
    sigmas : mapping of str to float
        Per-entry noise std of each released sketch, by name (``Y``, ``Z``).
    confidence : float

    Returns
    -------
    float
        On the scale of the released ``S`` (debiased for two-pass); a valid
        bound at ``confidence`` for two-pass, an isometry approximation for one
        pass (module docstring).

    Notes
    -----
    Privacy. Public values only (shape, sizes, noise stds): no data is read.

    Examples
    --------
    >>> round(noise_level(Algorithm.TWO_PASS, (400, 60), 3, {"Y": 1.0}), 3)
    13.589
    """
    M, N = oriented_shape
    if algorithm is Algorithm.TWO_PASS:
        s = sigmas["Y"]
        level = gaussian_norm_bound(M, t, s, confidence)
        # the released S are debiased by M sigma_Y^2 in quadrature [6.3]
        return math.sqrt(max(level * level - M * s * s, 0.0))
    if algorithm is Algorithm.SPECTRAL:
        return gaussian_norm_bound(t, N, sigmas["Z"], confidence)
    if algorithm is Algorithm.LOW_SPACE:
        return gaussian_norm_bound(t, t, sigmas["Z"], confidence)
    raise ValueError(f"no noise level for algorithm={algorithm.value!r}.")


def plan_noise_level(
    plan: LrfPlan | TwoPassPlan, confidence: float = CONFIDENCE
) -> float | None:
    """:func:`noise_level` of a private plan (None for a non-private one).

    Notes
    -----
    Privacy. Public values only (the plan): no data is read.
    """
    if plan.calibration is None:
        return None
    sigmas = {s.name: s.sigma for s in plan.calibration.sketches}
    return noise_level(
        plan.params.algorithm, plan.oriented_shape, plan.t, sigmas, confidence
    )
