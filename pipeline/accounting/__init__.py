"""Privacy accounting: calibrate Gaussian noise for sketches and keep the budget.

Problem. Given a release budget ``(epsilon, delta)``, the per-individual
Frobenius bound ``Delta_F`` of the neighbouring relation and the Gaussian sketch
matrices (their dimensions) behind the K released sketches, find the smallest
Gaussian noise ``sigma_i`` per sketch such that the whole release -- every
noisy sketch and everything computed from them -- is ``(epsilon, delta)``-DP:

* the L2 sensitivity of a Gaussian sketch of a fixed difference E is bounded by
  ``Delta_F * Delta_JL(d, beta)`` except with probability ``beta``
  [LM00, Lemma 1] (spec section 4.2), charged to ``delta_JL``;
* all K noisy sketches (and all tree nodes of a continual release) are one
  Gaussian mechanism, calibrated exactly by the analytic Gaussian mechanism
  [BW18, Thm 8] for ``delta_M = delta - delta_JL`` (spec sections 4.3-4.5);
* across releases from one dataset, Gaussian mechanisms compose exactly
  (``z_tot^-2 = sum z_i^-2``), and a persistent ledger refuses any release that
  would exceed the dataset's lifetime budget.

This replaces the paper's calibration [Upa18, Thm 37, Lemma 16, Lemma 26],
whose noise constant is too small and whose compositions give (2 epsilon,
4 delta) / (3 epsilon, 6 delta) instead of the (epsilon, delta) claimed.

Only stdlib, numpy, scipy and dp_accounting are imported; dp_accounting is
imported lazily, inside the few functions that use it.

References
----------
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy: analytical calibration and optimal denoising. ICML 2018,
   arXiv:1805.06530.
.. [DR14] Dwork, Roth. The algorithmic foundations of differential privacy.
.. [LM00] Laurent, Massart. Adaptive estimation of a quadratic functional by
   model selection. Ann. Statist. 28(5), 2000.
.. [Upa18] Upadhyay. On low-space differentially private low-rank
   factorization in the spectral norm.
"""

from __future__ import annotations

from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchNoise,
    SketchRequest,
    calibrate_release,
    pld_epsilon,
    to_dp_event,
)
from pipeline.accounting.contract import (
    Accountant,
    EntityUnit,
    PrivacyContract,
    approx_group_factor,
    gdp_scale,
)
from pipeline.accounting.gaussian import (
    classical_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
    jl_sensitivity_factor,
    paper_gaussian_sigma,
)
from pipeline.accounting.ledger import LEDGER_FORMAT, Ledger, default_ledger_path

__all__ = [
    "LEDGER_FORMAT",
    "Accountant",
    "EntityUnit",
    "Ledger",
    "PrivacyContract",
    "ReleaseCalibration",
    "SketchNoise",
    "SketchRequest",
    "approx_group_factor",
    "calibrate_release",
    "classical_gaussian_sigma",
    "default_ledger_path",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_noise_multiplier",
    "gdp_scale",
    "jl_sensitivity_factor",
    "paper_gaussian_sigma",
    "pld_epsilon",
    "to_dp_event",
]
