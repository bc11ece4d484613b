"""Dense linear-algebra kernels shared by the algorithms (numpy/scipy only).

Problem. Given the small noisy sketches of a one-pass factorization, recover the
rank-k factors ``U_k`` (n_rows, k), ``s_k`` (k,), ``V_k`` (n_cols, k) of the
minimiser of ``|| L X R - Z ||_F`` over rank-k ``X`` (the "core problem"), and
measure the spectral-norm error of a low-rank approximation.

References
----------
.. [TYUC17] Tropp, Yurtsever, Udell, Cevher, "Practical sketching algorithms for
   low-rank matrix approximation", SIMAX 2017 (arXiv:1609.00048).
.. [Upa18] J. Upadhyay, arXiv:1612.04740, Fig. 1 and Fig. 2 (corrected in spec
   sketch-lrf.md, section 3.0).
.. [HMT11] Halko, Martinsson, Tropp, "Finding structure with randomness",
   SIAM Review 2011 (arXiv:0909.4061).
"""

from pipeline.linalg.core import (
    core_one_sided,
    core_two_sided,
    orth,
    sign_convention,
)
from pipeline.linalg.metrics import hmt_bound, spectral_error

__all__ = [
    "core_one_sided",
    "core_two_sided",
    "hmt_bound",
    "orth",
    "sign_convention",
    "spectral_error",
]
