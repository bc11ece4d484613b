"""Frozen descriptions of the mechanisms a ledger composes, and their composition.

Problem. A ledger composes releases of several kinds (a factorization's
Gaussian sketches, a PCA run, a private selection accounted in RDP, a stream's
tree) without knowing how each was calibrated. As ``dp_accounting.dp_event``
does, each kind of mechanism is described by a frozen *event* holding exactly
the parameters accounting needs; every calibration produces its event
(``privacy_event()``), and :func:`compose` is the one place where events are
composed. A new kind of release adds an event class (its terms, its reading at
another contract and its ledger record), not a branch in the ledger.

Every event reduces to terms of three kinds, which :func:`compose` adds:

* **Gaussian**: a unit-sensitivity Gaussian mechanism with noise multiplier
  ``z`` (``mu = 1/z``). Gaussians compose exactly: together they are one with
  ``z_tot = (sum_i z_i^-2)^(-1/2)`` [BW18, Thm 8; DRS22, Cor. 3.3].
* **approximate** ``(epsilon, delta)``: a release that is not a composition of
  Gaussians (the random-stopping selection, accounted in RDP); these and the
  Gaussian part compose by basic composition [DR14, Thm 3.16].
* **failure**: the probability ``delta_JL`` that a sensitivity bound fails
  (a sketch's norm bound, spec section 4.4); it adds to delta.

So a :class:`Composition` is ``(epsilon, delta)``-DP with ``epsilon = E_a +
eps_G`` and ``delta = gaussian_delta(z_tot, eps_G) + sum delta_JL + D_a`` for
any ``eps_G >= 0`` (``E_a``, ``D_a``: the approximate terms).

Reading a release at another contract (another unit or relation) scales an
event by the factor :mod:`pipeline.accounting.contract` proves: a Gaussian's
``mu`` grows by ``gdp_scale``; an approximate release is read by group privacy
of size ``k`` as ``(k epsilon, k e^((k-1) epsilon) delta)`` [Vadhan 2017,
Lemma 2.2]; a failure probability is unchanged (the norm bound fails with
probability ``beta`` for any fixed difference of the inputs).

References
----------
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530.
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS B 84(1), 2022.
.. [DR14] Dwork, Roth. The algorithmic foundations of differential privacy,
   Thm 3.16 (basic composition).
.. [Vadhan 2017] Vadhan. The complexity of differential privacy, Lemma 2.2
   (group privacy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pipeline.accounting.gaussian import gaussian_delta, gaussian_epsilon
from pipeline.errors import InvalidParameterError, StoreLayoutError

__all__ = [
    "BUDGET_RTOL",
    "ApproxDpEvent",
    "Calibration",
    "Composition",
    "EventTerms",
    "GaussianEvent",
    "PrivacyEvent",
    "compose",
    "event_of_record",
]

# Same slack as LEDGER_CHECK (spec section 4.4): rounding in z_tot only.
BUDGET_RTOL = 1e-9


class Calibration(Protocol):
    """What a ledger charges: a release's calibration (duck-typed).

    ``ReleaseCalibration``, ``PcaCalibration`` and ``SelectionCalibration``
    are calibrations; a new kind of release needs only these four members.
    """

    @property
    def epsilon(self) -> float: ...

    @property
    def delta(self) -> float: ...

    def check(self) -> None:
        """LEDGER_CHECK: raise if the recorded noise does not give (epsilon, delta)."""

    def privacy_event(self) -> PrivacyEvent:
        """The release as an event at its own contract."""
        ...


@dataclass(frozen=True, slots=True)
class EventTerms:
    """An event's terms (see the module docstring); :func:`compose` adds them.

    Attributes
    ----------
    noise_multipliers : tuple of float
        One ``z`` per unit-sensitivity Gaussian mechanism.
    epsilons, deltas : tuple of float
        The approximate ``(epsilon, delta)`` parts.
    failures : tuple of float
        Failure probabilities of sensitivity bounds (``delta_JL``).
    """

    noise_multipliers: tuple[float, ...] = ()
    epsilons: tuple[float, ...] = ()
    deltas: tuple[float, ...] = ()
    failures: tuple[float, ...] = ()


class PrivacyEvent:
    """A frozen description of one mechanism, as ``dp_accounting.DpEvent``.

    A subclass states its ``kind`` (the ledger record's ``"kind"``; None: the
    format's default, Gaussian), whether it is accounted by the Gaussian
    accountants (``gaussian``; else its contract names ``'rdp'``), and
    implements :meth:`terms`, :meth:`read_at`, :meth:`record_fields` and
    :meth:`from_record`. Defining the subclass registers its kind, so a ledger
    reads its records back without any edit of the ledger or of
    :func:`compose`.
    """

    __slots__ = ()
    kind: ClassVar[str | None]
    gaussian: ClassVar[bool]
    _KINDS: ClassVar[dict[str | None, type[PrivacyEvent]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            PrivacyEvent._KINDS[cls.kind] = cls

    def terms(self) -> EventTerms:
        """The event's terms for :func:`compose`."""
        raise NotImplementedError

    def read_at(self, factor: float) -> PrivacyEvent:
        """The event read at another contract, ``factor`` as ``gdp_scale`` or the group size."""
        raise NotImplementedError

    def record_fields(self) -> dict[str, Any]:
        """The ledger record's accounting fields (``delta_jl``, ``noise_multiplier_total``, ...)."""
        raise NotImplementedError

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], where: str) -> PrivacyEvent:
        """The event of a ledger record; StoreLayoutError naming ``where`` if invalid."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class GaussianEvent(PrivacyEvent):
    """A unit-sensitivity Gaussian mechanism and a sensitivity failure probability.

    Attributes
    ----------
    noise_multiplier : float
        ``z = 1/mu`` (``inf``: no noise needed, nothing released).
    delta_jl : float
        Probability that the sensitivity bound fails (0 for exact bounds).
    """

    kind: ClassVar[str | None] = None
    gaussian: ClassVar[bool] = True

    noise_multiplier: float
    delta_jl: float = 0.0

    def terms(self) -> EventTerms:
        return EventTerms(
            noise_multipliers=(self.noise_multiplier,), failures=(self.delta_jl,)
        )

    def read_at(self, factor: float) -> GaussianEvent:
        """``mu`` grows by ``factor`` (:func:`~pipeline.accounting.contract.gdp_scale`)."""
        return GaussianEvent(self.noise_multiplier / factor, self.delta_jl)

    def record_fields(self) -> dict[str, Any]:
        return {
            "delta_jl": self.delta_jl,
            "noise_multiplier_total": self.noise_multiplier,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], where: str) -> GaussianEvent:
        z, djl = rec["noise_multiplier_total"], rec["delta_jl"]
        if not (_positive(z) and isinstance(djl, int | float) and djl >= 0):
            raise StoreLayoutError(
                f"{where} has an invalid noise_multiplier_total or delta_jl (got "
                f"{z!r}, {djl!r})."
            )
        return cls(float(z), float(djl))


@dataclass(frozen=True, slots=True)
class ApproxDpEvent(PrivacyEvent):
    """An ``(epsilon, delta)``-DP release that is not a composition of Gaussians.

    Recorded with ``"kind": "approx"``, ``epsilon_approx``, ``delta_approx``
    and ``noise_multiplier_total = null`` (no Gaussian part; JSON has no
    infinity).
    """

    kind: ClassVar[str | None] = "approx"
    gaussian: ClassVar[bool] = False
    _KEYS: ClassVar[tuple[str, ...]] = ("kind", "epsilon_approx", "delta_approx")

    epsilon: float
    delta: float
    delta_jl: float = 0.0

    def terms(self) -> EventTerms:
        return EventTerms(
            epsilons=(self.epsilon,), deltas=(self.delta,), failures=(self.delta_jl,)
        )

    def read_at(self, factor: float) -> ApproxDpEvent:
        """Group privacy of size ``k = int(factor)`` [Vadhan 2017, Lemma 2.2]."""
        k = int(factor)
        if k == 1:
            return self
        grown = k * math.exp((k - 1) * self.epsilon) * self.delta
        return ApproxDpEvent(k * self.epsilon, grown, self.delta_jl)

    def record_fields(self) -> dict[str, Any]:
        return {
            "delta_jl": self.delta_jl,
            "noise_multiplier_total": None,
            "kind": self.kind,
            "epsilon_approx": self.epsilon,
            "delta_approx": self.delta,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], where: str) -> ApproxDpEvent:
        if rec.get("kind") != cls.kind or any(k not in rec for k in cls._KEYS):
            raise StoreLayoutError(
                f"{where} must have kind {cls.kind!r} and the keys "
                f"{list(cls._KEYS)}, got kind={rec.get('kind')!r}."
            )
        eps, dlt, djl = rec["epsilon_approx"], rec["delta_approx"], rec["delta_jl"]
        ok = (
            _positive(eps)
            and isinstance(dlt, int | float)
            and not isinstance(dlt, bool)
            and 0.0 <= dlt < 1.0
            and isinstance(djl, int | float)
            and djl >= 0
            and rec["noise_multiplier_total"] is None
        )
        if not ok:
            raise StoreLayoutError(
                f"{where} has an invalid approx record (epsilon_approx={eps!r}, "
                f"delta_approx={dlt!r}, delta_jl={djl!r}, noise_multiplier_total="
                f"{rec['noise_multiplier_total']!r}; expected null)."
            )
        return cls(float(eps), float(dlt), float(djl))


def event_of_record(rec: Mapping[str, Any], where: str) -> PrivacyEvent:
    """The event a ledger record describes (its ``"kind"``), validated.

    An unknown kind is refused as a malformed approximate record (the only
    non-Gaussian kind a file written by dplr holds).
    """
    cls = PrivacyEvent._KINDS.get(rec.get("kind"), ApproxDpEvent)
    return cls.from_record(rec, where)


@dataclass(frozen=True, slots=True)
class Composition:
    """Events composed: one Gaussian and the basic-composition terms.

    Attributes
    ----------
    noise_multiplier : float
        ``z_tot`` of the Gaussian parts (``inf``: none).
    epsilon_approx, delta_approx : float
        ``E_a``, ``D_a``: sums of the approximate parts.
    delta_fixed : float
        ``sum delta_JL + D_a``, summed as one exactly rounded sum.
    """

    noise_multiplier: float
    epsilon_approx: float
    delta_approx: float
    delta_fixed: float

    def delta_at(self, epsilon: float) -> float:
        """Delta of the composition at ``epsilon`` (``inf``: ``E_a`` exceeds it).

        The Gaussian gets the epsilon the approximate parts leave [DR14, Thm
        3.16]; ``E_a`` may exceed ``epsilon`` by the relative slack
        :data:`BUDGET_RTOL`.
        """
        eps_left = epsilon - self.epsilon_approx
        if eps_left < -epsilon * BUDGET_RTOL:
            return math.inf
        z_tot = self.noise_multiplier
        # No Gaussian part (z_tot = inf) costs nothing at any epsilon.
        gauss = 0.0 if math.isinf(z_tot) else gaussian_delta(z_tot, max(eps_left, 0.0))
        return gauss + self.delta_fixed

    def epsilon_at(self, delta: float) -> float:
        """The smallest epsilon at which the composition is ``(epsilon, delta)``-DP.

        ``E_a + gaussian_epsilon(z_tot, delta - sum delta_JL - D_a)``; ``inf``
        when the delta terms alone use up ``delta``.
        """
        room = delta - self.delta_fixed
        if not room > 0.0:
            return math.inf
        return self.epsilon_approx + gaussian_epsilon(self.noise_multiplier, room)

    def stated_at(self, delta_gaussian: float) -> tuple[float, float]:
        """``(epsilon, delta)`` with the Gaussian part stated at ``delta_gaussian``."""
        z_tot = self.noise_multiplier
        gauss = 0.0 if math.isinf(z_tot) else gaussian_epsilon(z_tot, delta_gaussian)
        return self.epsilon_approx + gauss, delta_gaussian + self.delta_fixed


def compose(events: Iterable[PrivacyEvent]) -> Composition:
    """Compose events: Gaussians exactly, the rest by basic composition.

    Parameters
    ----------
    events : iterable of PrivacyEvent
        Each already read at one common contract.

    Returns
    -------
    Composition
        Each sum is one exactly rounded ``math.fsum``, so the result does not
        depend on the order of the events.

    Raises
    ------
    InvalidParameterError
        If an item is not a :class:`PrivacyEvent`.
    """
    zs: list[float] = []
    eps: list[float] = []
    dlt: list[float] = []
    fails: list[float] = []
    for event in events:
        if not isinstance(event, PrivacyEvent):
            raise InvalidParameterError(
                "events must be PrivacyEvent descriptions of mechanisms, got "
                f"{type(event).__name__}."
            )
        t = event.terms()
        zs += t.noise_multipliers
        eps += t.epsilons
        dlt += t.deltas
        fails += t.failures
    inv_sq = math.fsum(z**-2 for z in zs)
    return Composition(
        noise_multiplier=math.inf if inv_sq == 0.0 else inv_sq**-0.5,
        epsilon_approx=math.fsum(eps),
        delta_approx=math.fsum(dlt),
        delta_fixed=math.fsum(fails + dlt),
    )


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0.0 < value < math.inf
    )
