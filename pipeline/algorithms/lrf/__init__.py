"""One-pass differentially private low-rank factorization: Spectral-LRF and Low-Space-LRF.

Problem. Given ``A`` (n_rows, n_cols), a rank ``k`` and a budget ``(epsilon, delta)``,
release ``U_k`` (n_rows, k), ``s_k`` (k,), ``V_k`` (n_cols, k) such that
``||A - U_k diag(s_k) V_k^T||_2`` is close to ``sigma_{k+1}(A)`` plus an additive
noise term of order ``(sqrt(n_rows) + sqrt(n_cols)) / epsilon``, reading ``A`` once.

Method [Upa18, Fig. 1 and Fig. 2], as corrected by spec sketch-lrf.md:

* Spectral-LRF (default): ``Y = X Phi + N_1`` (M x t), ``Z = S X + N_2`` (v x N) with
  ``X`` = ``A`` oriented so that M >= N; ``U = orth(Y)``; core solve
  ``(S U)^+ [P Z]_k`` [spec 3.2].
* Low-Space-LRF: ``Y_c = X Phi_c + N``, ``Y_r = Psi X + N``, ``Z = S X T + N``;
  two-sided core solve [spec 3.3]. ``padded=True`` reproduces the paper's
  ``(A, sigma_min I)`` construction with the padding block drawn from the secret
  noise stream (the paper's public padding would carry no noise at all).

Privacy [spec 4.4]: all noisy sketches of a release form ONE Gaussian mechanism,
calibrated with the analytic Gaussian mechanism [BW18]. (epsilon, delta)-DP for
neighbours with ``||A - A'||_F <= Delta_F`` (Priv1, hence Priv2). A Gaussian
operator's sensitivity factor is ``Delta_JL(d, beta)`` from the actual sizes
[spec 4.2], its failure probability charged to delta; that tail bound is for a
pair fixed before the operators are drawn, so it needs a secret sketch seed. With
a public seed (``plan_lrf(..., public_seed=seed)``) the factors are the exact
worst case of the actual operators instead (spec private-lrf-2 section 3;
:func:`worst_case_factors`). A sparse sign ``S`` has the exact factor 1, and a
range sketch clipped in sketch space (:func:`clips_range`, :class:`ClippedNoise`:
its rows to ``rho(t) C`` after the pass, before the noise) the exact factor
``rho``, for any seed. The plan (:mod:`pipeline.algorithms.lrf.plan`) reads only
public values; :mod:`pipeline.algorithms.lrf.run` runs it.

Passes over A: 1 (plus one norm pass when clipping rows of a column-split store).

References
----------
.. [Upa18] J. Upadhyay, "The price of privacy for low-rank factorization",
   NeurIPS 2018, arXiv:1612.04740 (v5).
.. [BW18] B. Balle, Y.-X. Wang, ICML 2018, arXiv:1805.06530.
.. [TYUC17] Tropp, Yurtsever, Udell, Cevher, SIMAX 2017, arXiv:1609.00048.
"""

from __future__ import annotations

from pipeline.algorithms.lrf.kernels import (
    ClippedNoise,
    gram_basis,
    gram_svd,
    top_singular_vectors,
)
from pipeline.algorithms.lrf.model import choose_private_sizes
from pipeline.algorithms.lrf.plan import (
    LrfPlan,
    Reach,
    calibrate_plan,
    clips_range,
    default_operator,
    default_sketch_sizes,
    plan_operators,
    reach_of,
    sparse_is_exact,
    worst_case_factors,
)
from pipeline.algorithms.lrf.run import pass_request, plan_lrf, run_lrf
from pipeline.algorithms.lrf.signal import noise_level, plan_noise_level
from pipeline.algorithms.lrf.two_pass import SKETCHES, TwoPassPlan
from pipeline.sketches.operators import seed_fingerprint

# callers plan and run through this package
__all__ = [
    "SKETCHES",
    "ClippedNoise",
    "LrfPlan",
    "Reach",
    "TwoPassPlan",
    "calibrate_plan",
    "choose_private_sizes",
    "clips_range",
    "default_operator",
    "default_sketch_sizes",
    "gram_basis",
    "gram_svd",
    "noise_level",
    "pass_request",
    "plan_lrf",
    "plan_noise_level",
    "plan_operators",
    "reach_of",
    "run_lrf",
    "seed_fingerprint",
    "sparse_is_exact",
    "top_singular_vectors",
    "worst_case_factors",
]
