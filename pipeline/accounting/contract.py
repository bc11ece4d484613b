"""The privacy contract of a release, and when two contracts compose.

Every private release states one :class:`PrivacyContract`: who an individual
is (``unit``), which datasets are neighbours (``neighboring``), the clip norm,
the budget, the accountant, whether the noise is secret and whether the sketch
operators are public. The release job derives its journal header from it (a
resume can never change any of it), the ledger records it per release, and the
report states it.

A ledger reads every release at the ledger's own unit and relation.
:func:`gdp_scale` says by how much a release's Gaussian privacy parameter
``mu`` (equivalently ``1 / z`` for its total noise multiplier ``z``) grows when
it is read there, or ``None`` where no conversion is proven. The proofs are in
``docs/privacy.md`` ("Composing releases of different contracts"); in short:

* **add/remove -> replace**: a replace-one neighbour is one removal followed by
  one addition, so by group privacy of a ``mu``-GDP mechanism [DRS22, Thm 2.14]
  the release is ``2 mu``-GDP under replacement. Factor 2.
* **replace -> add/remove**: dplr's add/remove neighbour sets one individual's
  clipped contribution to zero (the shape is public and fixed, ``Delta_F = C``),
  and the zero contribution is a valid value of a replace-one neighbour. So every
  add/remove neighbour pair is a replace-one pair. Factor 1.
* **entry -> row** (``n_cols`` entries per row) and **entry -> column**
  (``n_rows``): the statistics are linear in the clipped entries and the noise is
  Gaussian, so ``mu`` scales with the L2 sensitivity. One row's change is up to
  ``n_cols`` entry changes, each of norm at most the entry sensitivity, on
  disjoint coordinates: ``||dA||_F <= sqrt(n_cols) * Delta``. Factor
  ``sqrt(n_cols)`` (Gaussian releases only; then the relation converts as above).
* **row -> entry**, **column -> entry**: two datasets that differ in one entry
  differ in one row (column), i.e. they are replace-one neighbours at row
  (column) level. Factor: the row release read under replacement.
* **row <-> column**: no conversion (an individual of one kind touches every
  individual of the other); refused.
* **entity** (a stream's individual: one entity id, whatever cells its updates
  touch; several entities may share a row, a column or a cell) converts to no
  matrix unit and no matrix unit converts to it; refused. Entity releases
  compose with each other under the relation rule above.
* An **exclusive stream** (each entity bound to one row, column or cell that no
  other entity touches, enforced at ingest) is a release at that matrix unit:
  removing one row's individual removes exactly one entity. Its sensitivity is
  a sum over epochs, not a norm of one ``dA``, so a stream of cells is read at
  the entry unit only (``entry_reads`` empty): a row of cells spent in
  different epochs moves it by up to ``n_cols`` times, not ``sqrt(n_cols)``.

The ``entry -> row`` factor over-counts a replace-one entry release read under
add/remove (the true factor is ``sqrt(n_cols) / 2``), and so does ``replace ->
add/remove`` (``1 / 2`` for a Gaussian of the clipped contributions): both
conversions err on the side of charging more, never less.

Releases accounted outside the Gaussian family (the private selection's RDP
bound, recorded as an approximate ``(epsilon, delta)``) convert only by group
privacy of size 2 [DR14, Thm 2.2 / Lemma 2.2 of Vadhan]: see
:func:`approx_group_factor`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from pipeline._validation import check_enum, check_float_in_interval, check_privacy_pair
from pipeline.errors import InvalidParameterError
from pipeline.params import Neighboring, PrivacyUnit

__all__ = [
    "Accountant",
    "EntityUnit",
    "PrivacyContract",
    "Unit",
    "approx_group_factor",
    "as_unit",
    "gdp_scale",
]


class EntityUnit(enum.Enum):
    """The individual of a stream: one entity id, whatever cells it touches.

    Not a :class:`PrivacyUnit`: several entities may share a row, a column or
    a cell, so a stream's guarantee says nothing about one row (column, cell),
    and a matrix release says nothing about one entity that spans rows.
    """

    ENTITY = "entity"


#: Who an individual is: a unit of a full matrix, or a stream's entity.
Unit = PrivacyUnit | EntityUnit


def as_unit(value: Any, name: str = "unit") -> Unit:
    """``value`` as a :data:`Unit` (member or value), else raise.

    Examples
    --------
    >>> as_unit("entry"), as_unit("entity")
    (<PrivacyUnit.ENTRY: 'entry'>, <EntityUnit.ENTITY: 'entity'>)
    """
    if isinstance(value, PrivacyUnit | EntityUnit):
        return value
    if value == EntityUnit.ENTITY.value:
        return EntityUnit.ENTITY
    try:
        return PrivacyUnit(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in (*PrivacyUnit, *EntityUnit))
        raise InvalidParameterError(
            f"{name} must be one of {allowed}, got {name}={value!r}."
        ) from None


class Accountant(enum.Enum):
    """How a release's noise was calibrated and how the ledger composes it."""

    #: one analytic Gaussian mechanism [BW18], composed as Gaussian (mu-GDP).
    ANALYTIC_GAUSSIAN = "analytic-gaussian"
    #: a composition of Gaussian mechanisms calibrated as one mu-GDP mechanism.
    GDP = "gdp"
    #: the paper's constants (reproduction only); still Gaussian, composed as GDP.
    PAPER = "paper"
    #: Renyi accounting of a private selection; composed as approx (eps, delta).
    RDP = "rdp"

    @property
    def gaussian(self) -> bool:
        """True when the ledger composes the release exactly as a Gaussian."""
        return self is not Accountant.RDP


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyContract:
    """What one private release promises, in public values only.

    Parameters
    ----------
    unit : PrivacyUnit or EntityUnit
        Who an individual is (row, column, entry; or a stream's entity).
    neighboring : Neighboring
        Add/remove (one individual's contribution set to zero) or replace-one.
    clip_norm : float
        ``C``: every individual's contribution is clipped to norm ``<= C``.
    epsilon, delta : float
        The release's own budget.
    accountant : Accountant
    secret_noise : bool
        False when the noise comes from a public seed (test only; NOT PRIVATE).
    public_operators : bool
        True when the sketch operators were drawn from a user-given (public) seed;
        then the calibration must use their worst-case sensitivity.
    shape : (int, int)
        The public shape ``(n_rows, n_cols)`` of the matrix, for unit conversions.
    entry_reads : tuple of str
        For an entry-unit release, the units (``"row"``, ``"column"``) at which
        its sensitivity is linear in ``||dA||_F`` and a ledger may read it
        (:func:`gdp_scale`). A sparse sign co-range sketch is exact along one
        axis only (:func:`pipeline.algorithms.lrf.plan.sparse_is_exact`); a
        stream of cells along none (empty: read at ``entry`` only).

    Examples
    --------
    >>> c = PrivacyContract(unit="row", neighboring="add-remove", clip_norm=1.0,
    ...                     epsilon=1.0, delta=1e-6, accountant="gdp", shape=(10, 4))
    >>> c.unit.value, c.neighboring.value, c.private
    ('row', 'add-remove', True)
    >>> PrivacyContract.from_dict(c.to_dict()) == c
    True
    """

    unit: Unit
    neighboring: Neighboring
    clip_norm: float
    epsilon: float
    delta: float
    accountant: Accountant
    shape: tuple[int, int]
    secret_noise: bool = True
    public_operators: bool = False
    entry_reads: tuple[str, ...] = ("row", "column")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "unit", as_unit(self.unit))
        set_(
            self,
            "neighboring",
            check_enum(Neighboring, self.neighboring, "neighboring"),
        )
        set_(self, "accountant", check_enum(Accountant, self.accountant, "accountant"))
        set_(
            self,
            "clip_norm",
            check_float_in_interval(
                self.clip_norm, "clip_norm", 0.0, math.inf, privacy=True
            ),
        )
        eps, dlt = check_privacy_pair(self.epsilon, self.delta)
        set_(self, "epsilon", eps)
        set_(self, "delta", dlt)
        shape = tuple(int(x) for x in self.shape)
        if len(shape) != 2 or min(shape) < 1:
            raise InvalidParameterError(
                f"shape must be two positive integers, got shape={self.shape!r}."
            )
        set_(self, "shape", shape)
        reads = tuple(self.entry_reads)
        if not set(reads) <= {"row", "column"} or len(set(reads)) != len(reads):
            raise InvalidParameterError(
                "entry_reads must name 'row' and/or 'column' at most once each, got "
                f"entry_reads={self.entry_reads!r}."
            )
        set_(self, "entry_reads", reads)
        for name in ("secret_noise", "public_operators"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(
                    f"{name} must be True or False, got {name}={getattr(self, name)!r}."
                )

    @property
    def private(self) -> bool:
        """False when the noise is reproducible from a public seed."""
        return self.secret_noise

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (journal headers, ledger records, reports)."""
        return {
            "unit": self.unit.value,
            "neighboring": self.neighboring.value,
            "clip_norm": self.clip_norm,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant.value,
            "shape": list(self.shape),
            "secret_noise": self.secret_noise,
            "public_operators": self.public_operators,
            "entry_reads": list(self.entry_reads),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyContract:
        """Inverse of :meth:`to_dict`; refuses unknown or missing fields."""
        expected = set(cls.__dataclass_fields__)
        if isinstance(data, dict) and "entry_reads" not in data:
            # records written before the field existed: both axes (Gaussian S)
            data = {**data, "entry_reads": ["row", "column"]}
        if not isinstance(data, dict) or set(data) != expected:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise InvalidParameterError(
                f"a privacy contract has the fields {sorted(expected)}, got {got}."
            )
        return cls(**{
            **data, "shape": tuple(data["shape"]), "entry_reads": tuple(data["entry_reads"])
        })  # fmt: skip


def _relation_scale(src: Neighboring, dst: Neighboring) -> float:
    """GDP factor of reading a release under ``src`` at relation ``dst``."""
    if src is dst or src is Neighboring.REPLACE:
        return 1.0  # every add/remove pair is a replace pair (module docstring)
    return 2.0  # add/remove -> replace: group privacy of size 2


def gdp_scale(
    contract: PrivacyContract, unit: Unit, neighboring: Neighboring
) -> float | None:
    """Factor by which ``mu`` of a Gaussian release grows at (``unit``, ``neighboring``).

    ``None``: no conversion is proven; the ledger must refuse the release.

    Examples
    --------
    >>> c = PrivacyContract(unit="entry", neighboring="add-remove", clip_norm=1.0,
    ...                     epsilon=1.0, delta=1e-6, accountant="analytic-gaussian",
    ...                     shape=(500, 100))
    >>> gdp_scale(c, PrivacyUnit.ROW, Neighboring.ADD_REMOVE)
    10.0
    >>> gdp_scale(c, PrivacyUnit.ROW, Neighboring.REPLACE)
    20.0
    >>> gdp_scale(c, EntityUnit.ENTITY, Neighboring.REPLACE) is None
    True
    """
    src = contract.unit
    if src is unit:
        return _relation_scale(contract.neighboring, neighboring)
    if EntityUnit.ENTITY in (src, unit):
        return None  # a stream's entities and a matrix's units: no relation
    if src is PrivacyUnit.ENTRY:
        if unit.value not in contract.entry_reads:
            return None  # its sensitivity is exact along the other axis only
        # one row (column) is n_cols (n_rows) entries on disjoint coordinates
        count = contract.shape[1] if unit is PrivacyUnit.ROW else contract.shape[0]
        return math.sqrt(count) * _relation_scale(contract.neighboring, neighboring)
    if unit is PrivacyUnit.ENTRY:
        # entry neighbours are replace-one neighbours of the row (column) unit
        return _relation_scale(contract.neighboring, Neighboring.REPLACE)
    return None  # row <-> column


def approx_group_factor(
    contract: PrivacyContract, unit: Unit, neighboring: Neighboring
) -> int | None:
    """Group size ``k`` for reading an approximate-DP release at (unit, relation).

    ``(epsilon, delta)``-DP gives ``(k epsilon, k e^((k-1) epsilon) delta)``-DP
    for datasets ``k`` neighbour steps apart: applying the definition along the
    steps adds ``(1 + e^epsilon + ... + e^((k-1) epsilon)) delta <= k
    e^((k-1) epsilon) delta`` [Vadhan 2017, Lemma 2.2]. Only the conversions with
    ``k <= 2`` are offered (unit changes through entries would need ``k`` in
    the hundreds and are refused: ``None``).

    Examples
    --------
    >>> c = PrivacyContract(unit="row", neighboring="add-remove", clip_norm=1.0,
    ...                     epsilon=1.0, delta=1e-6, accountant="rdp", shape=(50, 4))
    >>> approx_group_factor(c, PrivacyUnit.ROW, Neighboring.REPLACE)
    2
    >>> approx_group_factor(c, PrivacyUnit.ENTRY, Neighboring.ADD_REMOVE)
    2
    >>> approx_group_factor(c, PrivacyUnit.COLUMN, Neighboring.REPLACE) is None
    True
    """
    src = contract.unit
    if src is unit:
        return int(_relation_scale(contract.neighboring, neighboring))
    if unit is PrivacyUnit.ENTRY and src in (PrivacyUnit.ROW, PrivacyUnit.COLUMN):
        # entry neighbours are replace-one neighbours of the row (column) unit
        return int(_relation_scale(contract.neighboring, Neighboring.REPLACE))
    return None
