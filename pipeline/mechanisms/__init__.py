"""Privacy mechanisms: input clipping and secret Gaussian noise.

Problem. The released sketches are linear in the input, so their L2 sensitivity is
bounded once every individual's contribution is bounded in Frobenius norm by the
clip norm ``C`` (clipping), and the Gaussian mechanism then needs noise drawn from
randomness the adversary cannot reproduce (a CSPRNG keyed from ``secrets``), added
once to each entry of each globally summed statistic.

References
----------
.. [BW18] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential
   privacy: analytical calibration and optimal denoising", ICML 2018.
.. [Upa18] J. Upadhyay, arXiv:1612.04740, as corrected by spec sketch-lrf.md.
"""

from pipeline.mechanisms.clipping import clip_entries, scale_factors_from_sumsq
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Neighboring, PrivacyUnit

__all__ = [
    "GaussianNoise",
    "Neighboring",
    "NoiseCode",
    "NoiseKey",
    "PrivacyUnit",
    "clip_entries",
    "scale_factors_from_sumsq",
]
