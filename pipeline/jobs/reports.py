"""The release reports: one frozen type per kind of release, serialised from its fields.

A report is a public document (its keys are read by ``dplr show``, the README and
users' scripts), so its serialisation is fixed: :meth:`Report.to_dict` writes the
fields in declaration order, leaves out a field whose value is :data:`OMIT`, and
merges a *flat* field's own fields in place (the fields every release starts
with, :class:`ReleaseCore`; the privacy fields, which differ between a private and
a non-private run). :meth:`Report.from_dict` reads a report back (a field absent
from the dict is :data:`OMIT`); :func:`load_report` picks the type from the
report itself.

Every value is public: parameters, the contract, the calibration, released
quantities (the ``signal`` entry is post-processing of the released values,
:mod:`pipeline.mechanisms.signal`) and times that do not depend on the data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Self

from pipeline.mechanisms.signal import Signal

__all__ = [
    "OMIT",
    "CentredPcaReport",
    "FactorizePrivacy",
    "FactorizeReport",
    "NonPrivate",
    "PcaPrivacy",
    "PcaReport",
    "ReleaseCore",
    "Report",
    "StreamPrivacy",
    "StreamReport",
    "load_report",
]


class _Omit:
    """The value of a report field that the report leaves out (one instance)."""

    def __repr__(self) -> str:
        return "OMIT"


#: A field left out of the serialised report (e.g. the ledger of a non-private run).
OMIT: Any = _Omit()

#: Metadata of the ``signal`` field: a :class:`~pipeline.mechanisms.signal.Signal`.
_SIGNAL = {"signal": True}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    """Base of the report types: the generic serialisation.

    A field with metadata ``{"flat": pick}`` holds a part whose fields are merged
    in place; ``pick(d)`` names the part's type when reading ``d`` back.
    """

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values, keys in field order (flat fields merged)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is OMIT:
                continue
            if "flat" in f.metadata:
                out.update(
                    value.to_dict()
                )  # as ``report | part``: keys keep their place
            elif isinstance(value, Signal):
                out[f.name] = value.to_dict()
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """A report read back from :meth:`to_dict`'s output (absent keys: OMIT)."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if "flat" in f.metadata:
                kw[f.name] = f.metadata["flat"](d).from_dict(d)
            elif "signal" in f.metadata and d.get(f.name) is not None:
                kw[f.name] = Signal.from_dict(d[f.name])
            else:
                kw[f.name] = d.get(f.name, OMIT)
        return cls(**kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReleaseCore(Report):
    """The fields every release of the release job starts with."""

    release_id: str
    created: str
    private: bool
    contract: dict[str, Any] | None
    timings_seconds: dict[str, float]
    versions: dict[str, str]
    insecure_noise_seed: bool = OMIT
    ledger: dict[str, Any] | None = OMIT
    note: str = OMIT

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """The core of a report: its ``note`` only when the noise seed was public
        (a non-private run's note belongs to its privacy fields)."""
        core = super().from_dict(d)
        if d.get("insecure_noise_seed") is True:
            return core
        return dataclasses.replace(core, note=OMIT)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NonPrivate(Report):
    """The privacy fields of a non-private release."""

    mechanism: None = None
    epsilon: None = None
    delta: None = None
    note: str = "non-private run: no clipping, no noise; NOT PRIVATE"


def _privacy(private: type[Report]) -> Callable[[Mapping[str, Any]], type[Report]]:
    return lambda d: NonPrivate if d.get("epsilon") is None else private


def _core(_: Mapping[str, Any]) -> type[Report]:
    return ReleaseCore


@dataclasses.dataclass(frozen=True, kw_only=True)
class FactorizePrivacy(Report):
    """The privacy fields of a private factorization."""

    singular_values: str = OMIT
    mechanism: str
    epsilon: float
    delta: float
    accountant: str
    idealized_numerics: bool
    privacy_unit: str
    neighboring: str
    clip_norm: float
    sensitivity: str
    calibration: dict[str, Any]
    sketches: list[dict[str, Any]]
    noise_floor_estimate: float
    error_model: dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FactorizeReport(Report):
    """The report of ``dplr factorize`` / :func:`pipeline.factorize`."""

    format: str = "dplr-release/1"
    core: ReleaseCore = dataclasses.field(metadata={"flat": _core})
    algorithm: str
    rank: int
    shape: list[int]
    parameters: dict[str, Any]
    n_passes: int
    n_passes_planned: int
    input: dict[str, Any]
    cluster: dict[str, Any] | None
    sketch_seed_fingerprint: str
    public_sketch_seed: bool
    privacy: Report = dataclasses.field(metadata={"flat": _privacy(FactorizePrivacy)})
    signal: Signal | None = dataclasses.field(default=OMIT, metadata=_SIGNAL)
    resumed_from_journal: bool = OMIT


@dataclasses.dataclass(frozen=True, kw_only=True)
class PcaPrivacy(Report):
    """The privacy fields of a private PCA (a fixed run or a selection)."""

    mechanism: str
    epsilon: float
    delta: float
    realised_epsilon: float
    accountant: str
    neighboring: str
    idealized_numerics: bool
    calibration: dict[str, Any]
    mechanisms: list[dict[str, Any]] | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PcaReport(Report):
    """The report of ``dplr pca`` / :func:`pipeline.pca` (a selection names its winner only)."""

    format: str = "dplr-pca-release/1"
    core: ReleaseCore = dataclasses.field(metadata={"flat": _core})
    algorithm: str
    rank: int
    shape: list[int]
    parameters: dict[str, Any]
    auto: dict[str, Any] | None
    n_passes: int | None
    n_passes_planned: int | None
    releases: list[str] | None
    resumed_releases: list[str]
    selection: dict[str, Any] | None
    input: dict[str, Any]
    cluster: dict[str, Any] | None
    privacy: Report = dataclasses.field(metadata={"flat": _privacy(PcaPrivacy)})
    signal: Signal | None = dataclasses.field(default=OMIT, metadata=_SIGNAL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CentredPcaReport(Report):
    """The report of a centred PCA (``DPPCA(centre=True)``): the PCA's report, its
    parameters, input and guarantee restated for the whole release, then the mean's
    release and the composed guarantee (``pca_release`` and ``mu_total`` only when
    private)."""

    pca: PcaReport = dataclasses.field(metadata={"flat": lambda _: PcaReport})
    pca_release: dict[str, Any] = OMIT
    centring: dict[str, Any]
    mu_total: float = OMIT


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamPrivacy(Report):
    """The privacy fields of a private stream's release."""

    mechanism: str
    epsilon: float
    delta: float
    budget_scope: str
    accountant: str
    idealized_numerics: bool
    insecure_noise_seed: bool
    privacy_unit: str
    neighboring: str
    neighbour_relation: str
    clip_norm: float
    calibration: dict[str, Any]
    sketches: list[dict[str, Any]]
    ledger: dict[str, Any] | None
    note: str = OMIT


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamReport(Report):
    """The report of one epoch's release of a stream (``dplr stream release``)."""

    format: str = "dplr-release/1"
    release_id: str
    created: str
    private: bool
    algorithm: str
    rank: int
    shape: list[int]
    parameters: dict[str, Any]
    stream: dict[str, Any]
    n_passes: int
    sketch_seed_fingerprint: str
    versions: dict[str, str]
    privacy: Report = dataclasses.field(metadata={"flat": _privacy(StreamPrivacy)})
    signal: Signal | None = dataclasses.field(default=OMIT, metadata=_SIGNAL)


def load_report(d: Mapping[str, Any]) -> Report:
    """The typed report of a report dict (as read from a release's attributes).

    Examples
    --------
    >>> rep = load_report({"format": "dplr-pca-release/1", "rank": 2})
    >>> type(rep).__name__, rep.rank, rep.signal is OMIT
    ('PcaReport', 2, True)
    """
    if d.get("format") == "dplr-pca-release/1":
        if "centring" in d:
            return CentredPcaReport.from_dict(d)
        return PcaReport.from_dict(d)
    if "stream" in d:
        return StreamReport.from_dict(d)
    return FactorizeReport.from_dict(d)
