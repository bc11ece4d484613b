"""Parameter values shared by every layer: the privacy unit and the neighbouring relation.

Imports only :mod:`pipeline._validation` and :mod:`pipeline.errors`; every other layer
may import it.
"""

from __future__ import annotations

import enum

__all__ = ["Neighboring", "PrivacyUnit"]


class PrivacyUnit(enum.Enum):
    """Who one individual is in a full matrix [spec 1.3]."""

    ROW = "row"
    COLUMN = "column"
    ENTRY = "entry"


class Neighboring(enum.Enum):
    """Neighbouring relation; fixes ``Delta_F`` from the clip norm ``C``.

    Mirrors dp_accounting's ``NeighboringRelation`` (ADD_OR_REMOVE_ONE,
    REPLACE_ONE) without importing it at start-up (its import costs seconds).
    """

    ADD_REMOVE = "add-remove"
    REPLACE = "replace"

    def frobenius_bound(self, clip_norm: float) -> float:
        """``Delta_F``: ``C`` for add/remove, ``2C`` for replace-one [spec 1.3, rule 5]."""
        return clip_norm if self is Neighboring.ADD_REMOVE else 2.0 * clip_norm
