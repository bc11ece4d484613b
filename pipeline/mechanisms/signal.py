"""Signal against noise: how many released components stand above the noise.

Problem. A release adds Gaussian noise ``N`` of a public law (its standard
deviation and shape are public parameters) to an exact statistic ``X`` and
releases singular values (or eigenvalues) of ``X + N``. By Weyl's inequality
``s_i(X + N) <= s_i(X) + ||N||_2``, so with probability at least ``c`` every
released value above a bound ``L`` of ``||N||_2`` that holds with probability
``c`` belongs to a component that carries signal (``s_i(X) >= s_i(X + N) - L >
0``); a release whose values are all below ``L`` is indistinguishable from pure
noise at that confidence. ``L`` and the count are computed from the released
values and the public noise law only: post-processing, no privacy cost.

Bounds used.

* Rectangular Gaussian ``G`` (r x n, i.i.d. ``N(0, s^2)``): ``||G||_2 <= s
  (sqrt(r) + sqrt(n) + t)`` with probability at least ``1 - exp(-t^2 / 2)``
  [DS01, Thm. II.13] (Gordon's inequality for the mean, Gaussian concentration
  of the 1-Lipschitz map ``G -> ||G||_2`` for the tail).
* Symmetrised Gaussian ``E = s (G + G^T) / 2`` (d x d, ``G`` as above): by the
  triangle inequality ``||E||_2 <= s ||G||_2``, so ``||E||_2 <= s (2 sqrt(d) +
  t)`` with the same probability. (This is the noise law of Analyze Gauss as
  implemented here, :func:`pipeline.algorithms.pca.linalg.sym`; the sharper
  Wigner constant is not needed for a valid level.)

``t = sqrt(2 ln(1 / (1 - c)))`` gives confidence ``c`` (2.448 at 95%).

References
----------
.. [DS01] K. R. Davidson, S. J. Szarek, "Local operator theory, random matrices
   and Banach spaces", Handbook of the Geometry of Banach Spaces, vol. 1, 2001.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "CONFIDENCE",
    "Signal",
    "deviation",
    "gaussian_norm_bound",
    "signal_of",
    "symmetric_norm_bound",
]

#: The confidence of every release's noise level.
CONFIDENCE = 0.95


def deviation(confidence: float) -> float:
    """``t`` with ``exp(-t^2 / 2) = 1 - confidence`` (the tail of [DS01, Thm. II.13]).

    Examples
    --------
    >>> round(deviation(0.95), 4)
    2.4477
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence}.")
    return math.sqrt(2.0 * math.log(1.0 / (1.0 - confidence)))


def gaussian_norm_bound(
    n_rows: int, n_cols: int, sigma: float, confidence: float = CONFIDENCE
) -> float:
    """Bound of ``||G||_2`` for ``G`` (n_rows, n_cols) i.i.d. ``N(0, sigma^2)``.

    ``sigma (sqrt(n_rows) + sqrt(n_cols) + t)``, exceeded with probability at
    most ``1 - confidence`` [DS01, Thm. II.13].

    Examples
    --------
    >>> round(gaussian_norm_bound(100, 4, 1.0), 3)
    14.448
    """
    t = deviation(confidence)
    return float(sigma * (math.sqrt(n_rows) + math.sqrt(n_cols) + t))


def symmetric_norm_bound(
    dim: int, sigma: float, confidence: float = CONFIDENCE
) -> float:
    """Bound of ``||sigma (G + G^T) / 2||_2`` for ``G`` (dim, dim) i.i.d. ``N(0, 1)``.

    ``sigma (2 sqrt(dim) + t)``: ``||(G + G^T) / 2|| <= ||G||`` and [DS01, Thm.
    II.13]; exceeded with probability at most ``1 - confidence``.

    Examples
    --------
    >>> round(symmetric_norm_bound(16, 0.5), 3)
    5.224
    """
    return gaussian_norm_bound(dim, dim, sigma, confidence)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Signal:
    """How many released components stand above the noise (public values only).

    Attributes
    ----------
    noise_level : float
        The level, on the scale of the released values, that pure noise stays
        below with probability ``confidence``.
    confidence : float
    above : int
        Released components whose value is above ``noise_level``.
    of : int
        Released components.
    advice : str
        Empty when every component stands above the noise; otherwise one
        sentence: what the release is, and what would help.
    """

    noise_level: float
    confidence: float
    above: int
    of: int
    advice: str

    def to_dict(self) -> dict[str, Any]:
        """The report's ``signal`` entry."""
        return {
            "noise_level": self.noise_level,
            "confidence": self.confidence,
            "above": self.above,
            "of": self.of,
            "advice": self.advice,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Signal:
        """The inverse of :meth:`to_dict`."""
        return cls(
            noise_level=float(d["noise_level"]), confidence=float(d["confidence"]),
            above=int(d["above"]), of=int(d["of"]), advice=str(d["advice"]),
        )  # fmt: skip

    def line(self) -> str:
        """The summary's line: ``k components above the noise (level L at 95%)``."""
        return (
            f"{self.above} of {self.of} components above the noise (level "
            f"{self.noise_level:.4g} at {self.confidence:.0%})"
        )


def signal_of(
    released: Sequence[float] | np.ndarray,
    noise_level: float,
    *,
    confidence: float = CONFIDENCE,
    remedies: str = "a larger epsilon, more rows or another unit",
) -> Signal:
    """Count the released values above ``noise_level`` and advise when few are.

    Parameters
    ----------
    released : array of shape (n_components,)
        Released (noisy) singular values or eigenvalues, one per component.
    noise_level : float
        A public bound of the noise on the same scale (this module's bounds).
    confidence : float
        The probability with which pure noise stays below ``noise_level``.
    remedies : str
        What would raise the signal against the noise besides a smaller k, for
        the advice.

    Returns
    -------
    Signal

    Notes
    -----
    Privacy. Post-processing of released values and public parameters only:
    no data is read and nothing is charged.

    Examples
    --------
    >>> signal_of([9.0, 5.0, 1.0], 4.0).above
    2
    """
    values = np.asarray(released, dtype=np.float64).ravel()
    of = int(values.size)
    above = int(np.count_nonzero(values > noise_level))
    advice = ""
    if above == 0:
        advice = (
            f"no released component stands above the noise: this release is "
            f"indistinguishable from noise; a smaller k, {remedies} would help."
        )
    elif above < of:
        advice = (
            f"only {above} of {of} components stand above the noise (the others are "
            f"noise); a smaller k ({above}), {remedies} would help."
        )
    return Signal(
        noise_level=float(noise_level), confidence=float(confidence),
        above=above, of=of, advice=advice,
    )  # fmt: skip
