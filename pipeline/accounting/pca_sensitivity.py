"""L2 sensitivities of the statistics the private PCA releases.

Problem. Every release of the PCA is a Gaussian mechanism on a sum over rows of
norm at most 1 (after the public rescaling and clipping). Its noise is
calibrated to the largest Frobenius change of that sum between neighbouring
datasets, which depends on the neighbouring relation:

* ``"add-remove"`` (the default, as for ``factorize``): one row is present or
  is the zero row (shapes stay public). The change is one summand.
* ``"replace"``: one row is replaced by any other row of norm <= 1 ([P]'s
  relation, spec power-pca 1.2). The change is a difference of two summands.

Per statistic (spec power-pca 3.1; ``u = a`` or ``u = X^T a``, ``|u| <= 1``):

============  ===========================  ============  =========  ===========
statistic     summand                      add-remove    replace    [P]
============  ===========================  ============  =========  ===========
``M``, ``H``  ``u u^T``                    1             sqrt(2)    2
``Z``         ``a Clip_R(a^T X B)``        R             2 R        2 R
score         ``1/h``-Lipschitz in ``S``   1 / h         sqrt(2)/h  2 / h
DP mean       ``a``                        1             2          --
============  ===========================  ============  =========  ===========

Replacement of ``u`` by ``u'``: ``||u u^T - u' u'^T||_F^2 = |u|^4 + |u'|^4 -
2 (u^T u')^2 <= 2``, attained by orthogonal unit rows; [P] bounds it by the
triangle inequality, 2. ``||a c^T||_F = |a| |c| <= R`` for a clipped ``c``, and
two such summands can point in opposite directions, so replacement moves ``Z``
by up to ``2 R`` (approached, not attained). Under add/remove each bound is the
norm of one summand, attained by a unit row (a unit row whose whitened
projection is clipped, for ``Z``); the triangle inequality is then exact, so
``sensitivity="paper"`` and ``"tight"`` coincide.

The tight values are the default; ``"paper"`` keeps [P]'s constants for
comparison. The property tests of ``tests/property/test_pca_sensitivity.py``
check every bound on random neighbours and its attainment by a worst-case pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import InvalidParameterError

__all__ = [
    "NEIGHBORINGS",
    "SENSITIVITIES",
    "PcaSensitivities",
    "check_choice",
    "pca_sensitivities",
]

SENSITIVITIES = ("tight", "paper")
NEIGHBORINGS = ("add-remove", "replace")


def check_choice(value: object, name: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else one clear InvalidParameterError."""
    if not isinstance(value, str) or value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise InvalidParameterError(
            f"{name} must be one of {options}, got {name}={value!r}."
        )
    return value


@dataclass(frozen=True, slots=True)
class PcaSensitivities:
    """Frobenius sensitivities of the PCA's releases under one relation.

    Attributes
    ----------
    gram : float
        Of ``M = A^T A`` and ``H = X^T A^T A X``.
    clip : float
        Of ``Z`` per unit of clip radius (``Z`` moves by ``clip * R``).
    mean : float
        Of the row sum ``sum_i a_i`` (the DP mean of a centred fit).
    """

    gram: float
    clip: float
    mean: float

    def score(self, gap: float) -> float:
        """Of the selection score, a ``1/gap``-Lipschitz function of ``A^T A``."""
        return self.gram / gap


def pca_sensitivities(mode: str, neighboring: str) -> PcaSensitivities:
    """The sensitivities of ``mode`` (tight or [P]'s) under ``neighboring``.

    Parameters
    ----------
    mode : {"tight", "paper"}
    neighboring : {"add-remove", "replace"}

    Returns
    -------
    PcaSensitivities

    Examples
    --------
    >>> s = pca_sensitivities("tight", "replace")
    >>> round(s.gram, 4), s.clip, s.mean
    (1.4142, 2.0, 2.0)
    >>> pca_sensitivities("paper", "replace").gram
    2.0
    >>> pca_sensitivities("tight", "add-remove")
    PcaSensitivities(gram=1.0, clip=1.0, mean=1.0)
    """
    check_choice(mode, "sensitivity", SENSITIVITIES)
    check_choice(neighboring, "neighboring", NEIGHBORINGS)
    if neighboring == "add-remove":
        # one summand: |u u^T|_F = |u|^2 <= 1, |a c^T|_F <= R, |a| <= 1
        return PcaSensitivities(gram=1.0, clip=1.0, mean=1.0)
    # replace: sup |u u^T - u' u'^T|_F = sqrt(2) (spec 3.1); [P] uses 2
    gram = 2.0 if mode == "paper" else math.sqrt(2.0)
    return PcaSensitivities(gram=gram, clip=2.0, mean=2.0)
