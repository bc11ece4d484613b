"""Every public parameter set of a release, declared once, and the enums they name.

A value object here (:class:`LrfParams`, :class:`PcaParams`, :class:`StreamParams`,
:class:`ReleaseOptions`, :class:`Runtime`) validates itself once, in ``__post_init__``,
from public values alone (never data). The metadata of its fields (:func:`param`) is
the one source of the command line's flags (``pipeline.cli.common.add_params`` and
``params_of`` build them and read them back) and of the estimators' parameter checks
(:func:`check_param`): a new parameter is one field here (and, for an estimator, one
argument of its ``__init__``, which scikit-learn requires).

Imports only :mod:`pipeline._validation` and :mod:`pipeline.errors`; every other layer
may import it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from pipeline._validation import (
    check_enum,
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.errors import InvalidParameterError, PrivacyConfigError

__all__ = [
    "AUTO",
    "CACHE_MODES",
    "DEFAULT_TILE_SIZE",
    "Algorithm",
    "ClipSpec",
    "Flag",
    "LrfParams",
    "Neighboring",
    "OperatorKind",
    "PcaAccounting",
    "PcaMethod",
    "PcaParams",
    "PcaRoute",
    "PcaSensitivity",
    "PrivacyUnit",
    "ReleaseOptions",
    "Runtime",
    "StreamMechanism",
    "StreamParams",
    "StreamUnit",
    "assemble",
    "check_dataset_name",
    "check_param",
    "flag_fields",
    "meta",
]

#: The value of ``algorithm``, ``method``, ``operator`` or ``route`` that the value
#: object resolves from its other (public) parameters.
AUTO = "auto"

#: Rows per generation tile along the data axis; recorded in every report because
#: changing it changes the operator [Upa18 spec, section 9, item 20].
DEFAULT_TILE_SIZE = 1024


# ---------------------------------------------------------------------------
# Enums
# ---------------------------------------------------------------------------
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


class StreamUnit(enum.Enum):
    """Who one individual of a stream is [spec 1.3, rule 1]."""

    GENERAL = "general"  # any set of cells, e.g. a document's co-occurrences
    ROW = "row"
    COLUMN = "column"
    ENTRY = "entry"


class StreamMechanism(enum.Enum):
    """The factorization mechanism of a stream's continual release.

    The values are :mod:`pipeline.algorithms.continual_factorization`'s names.
    """

    BLT = "blt"  # buffered linear Toeplitz decoder, 3 noise buffers (default)
    SQRT = "sqrt-factorization"  # square root of the prefix-sum matrix
    TREE = "tree"  # the binary tree (comparison; every state before the field)


class Algorithm(enum.Enum):
    """The factorizations: two one-pass, one two-pass (stored matrices only)."""

    SPECTRAL = "spectral"
    LOW_SPACE = "low-space"
    TWO_PASS = "two-pass"  # pipeline.algorithms.lrf.two_pass


class OperatorKind(enum.Enum):
    """The distribution of the co-range and core operators (``S``, ``T``).

    Range operators (``Phi``, ``Phi_c``, ``Psi``) are always Gaussian: they are
    t columns wide, so a dense product is as cheap as a sparse one, and the
    Gaussian range finder has the best constants [HMT11, section 10].
    """

    GAUSSIAN = "gaussian"
    SPARSE_SIGN = "sparse-sign"


class PcaMethod(enum.Enum):
    """The private PCA's methods (``"auto"`` picks one, :mod:`pipeline.algorithms.pca.auto`)."""

    AUTO = "auto"
    POWER = "power"
    ANALYZE_GAUSS = "analyze-gauss"


class PcaAccounting(enum.Enum):
    """Exact Gaussian (GDP) calibration, or the paper's literal constants."""

    GDP = "gdp"
    PAPER = "paper"


class PcaSensitivity(enum.Enum):
    """The exact sensitivities, or the paper's constants (comparison)."""

    TIGHT = "tight"
    PAPER = "paper"


class PcaRoute(enum.Enum):
    """Where the power method's ``H`` comes from: the client's Gram matrix or the data."""

    AUTO = "auto"
    GRAM = "gram"
    TWO_PASS = "two-pass"


def values(cls: type[enum.Enum], *first: str) -> tuple[str, ...]:
    """``first`` followed by the values of the members of ``cls`` (CLI choices)."""
    return (*first, *(str(m.value) for m in cls if m.value not in first))


# ---------------------------------------------------------------------------
# Field metadata: the one source of the CLI flags and the estimators' checks
# ---------------------------------------------------------------------------
#: A field's check: ``check(value, name)`` returns the value validated (and
#: normalised) or raises with a message that names ``name``.
Check = Callable[[Any, str], Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class Flag:
    """How a field appears on the command line.

    Attributes
    ----------
    names : tuple of str
        The option strings, long first (``("--rank", "-k")``); the argparse
        destination is derived from the first, as argparse does.
    section : str
        The group of flags it is listed with; a verb's parser adds its sections
        in its own order (``pipeline.cli.common.add_params``).
    help, metavar : str or None
    choices : tuple of str or None
        Allowed values (from the enums: :func:`values`).
    parse : callable or None
        The argparse ``type`` (``int``, ``float``, ...).
    default : object
        What the flag means when absent (None unless given).
    required : bool
    switch : bool
        A flag without a value that sets the field to True.
    negate : bool
        A flag without a value that sets the field to False (``--non-private``).
    """

    names: tuple[str, ...]
    section: str
    help: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    default: Any = None
    required: bool = False
    switch: bool = False
    negate: bool = False

    @property
    def dest(self) -> str:
        """The argparse destination of the flag (its first long name)."""
        return self.names[0].lstrip("-").replace("-", "_")


def meta(
    *, check: Check | None = None, flag: Flag | None = None, nested: bool = False
) -> dict[str, Any]:
    """The metadata of a field of a parameter set (``field(metadata=meta(...))``).

    ``check`` validates the value (:func:`check_param`); ``flag`` puts it on the
    command line; ``nested`` marks a field whose value is itself a parameter
    set, whose fields' flags stand for it (``LrfParams.clip``).
    """
    return {"check": check, "flag": flag, "nested": nested}


def flag_fields(
    cls: type,
) -> Iterator[tuple[dataclasses.Field[Any], Flag, tuple[str, ...]]]:
    """Every field of ``cls`` with a flag, nested sets flattened, in declaration
    order, with its path of field names (``("clip", "clip_norm")``)."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            for g, flag, path in flag_fields(_NESTED[f.name]):
                yield g, flag, (f.name, *path)
        elif f.metadata.get("flag") is not None:
            yield f, f.metadata["flag"], (f.name,)


def assemble(cls: type, values: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """Keyword arguments of ``cls`` from values by field path (:func:`flag_fields`):
    a nested parameter set is built from the values of its own fields."""
    kw: dict[str, Any] = {}
    nested: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in values.items():
        if len(path) == 1:
            kw[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, sub in nested.items():
        sub_cls = _NESTED[name]
        kw[name] = sub_cls(**assemble(sub_cls, sub))
    return kw


def check_param(cls: type, name: str, value: Any, *, label: str | None = None) -> Any:
    """``value`` checked as field ``name`` of ``cls`` would be, the message naming
    ``label`` (default ``name``): an estimator checks its own parameter names."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    check = f.metadata.get("check")
    return value if check is None else check(value, label or name)


def _checked(obj: Any, *names: str, write: bool = True) -> None:
    """Run the checks of the fields ``names`` of ``obj`` (None means unset, unchecked)."""
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        out = check_param(type(obj), name, value)
        if write:
            object.__setattr__(obj, name, out)


def _check_others(obj: Any, done: tuple[str, ...], *, write: bool = True) -> None:
    """Run the checks of the fields that ``__post_init__`` did not validate by hand
    (``done``): a new field's ``check`` runs here with no edit of its class."""
    rest = [f.name for f in dataclasses.fields(obj) if f.metadata.get("check")]
    _checked(obj, *(name for name in rest if name not in done), write=write)


def _int(low: int, high: int | None = None) -> Check:
    return lambda v, n: check_int_in_range(v, n, low, high)


def _positive(*, privacy: bool = False) -> Check:
    return lambda v, n: check_float_in_interval(v, n, 0.0, math.inf, privacy=privacy)


def _fraction(v: Any, n: str) -> float:
    return check_float_in_interval(v, n, 0.0, 1.0)


def _enum(cls: type[enum.Enum]) -> Check:
    return lambda v, n: check_enum(cls, v, n)


def _choice(allowed: tuple[str, ...]) -> Check:
    def check(value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise InvalidParameterError(
                f"{name} must be one of {', '.join(map(repr, allowed))}, got {name}={value!r}."
            )
        return value

    return check


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(
            f"{name} must be True or False, got {name}={value!r}."
        )
    return value


#: Help shared by the ``privacy`` group of ``dplr factorize`` and ``dplr pca``.
_EPSILON = Flag(names=("--epsilon",), section="privacy", parse=float,
                help="epsilon of this release (> 0)")  # fmt: skip
_DELTA = Flag(names=("--delta",), section="privacy", parse=float,
              help="delta of this release, in (0, 1)")  # fmt: skip
_NON_PRIVATE = Flag(names=("--non-private",), section="privacy", negate=True,
                    help="no clipping, no noise, no ledger: NOT PRIVATE (for comparison)")  # fmt: skip


# ---------------------------------------------------------------------------
# Factorization
# ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class ClipSpec:
    """Clipping applied to the input before any sketch sees it.

    Parameters
    ----------
    clip_norm : float
        ``C > 0``.
    unit : PrivacyUnit
    """

    clip_norm: float = field(metadata=meta(check=_positive(privacy=True), flag=Flag(
        names=("--clip-norm",), section="privacy", parse=float, default=1.0,
        help="C: each individual's contribution is clipped to norm <= C (default 1)")))  # fmt: skip
    unit: PrivacyUnit = field(metadata=meta(check=_enum(PrivacyUnit), flag=Flag(
        names=("--unit",), section="privacy", choices=values(PrivacyUnit), default="row",
        help="who one individual is (default: row)")))  # fmt: skip

    def __post_init__(self) -> None:
        """Validate the unit and the clip norm (the unit's order: as ``LrfParams.of`` did)."""
        _checked(self, "unit", "clip_norm")


def _default_clip() -> ClipSpec:
    return ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)


_HELP_ALGORITHM = (
    "default auto: two-pass for a private release (reads the store twice, exact "
    "sensitivities, both charged once before any noise; the most accurate), spectral "
    "(one pass) when --sketch-size or --operator gaussian asks for one pass, or with "
    "--non-private; low-space with --padded"
)
_HELP_OPERATOR = (
    "distribution of the co-range sketch S (default auto: sparse-sign, 8 non-zeros per "
    "row, wherever its sensitivity is exact; gaussian where one individual spans a "
    "column of the sketched matrix)"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class LrfParams:
    """Public parameters of one factorization release (never chosen from data).

    Parameters
    ----------
    rank : int
        Target rank k.
    algorithm : Algorithm or "auto"
        ``"auto"`` is resolved at construction (:meth:`_algorithm`): two-pass
        for a private release, Spectral-LRF otherwise.
    padded : bool
        Low-Space-LRF only: the paper's padded construction (comparison mode).
    operator : OperatorKind, "auto" or None
        Distribution of the co-range operator ``S`` (and of the core operator
        ``T`` of a non-private run). None (or ``"auto"``) picks by
        ``pipeline.algorithms.lrf.plan.default_operator``: sparse sign wherever
        its sensitivity is exact, Gaussian otherwise.
    sketch_size, core_size : int or None
        ``t`` and ``v``; None picks the defaults (clamped to the shape when the
        matrix is small).
    epsilon, delta : float or None
        The release's budget (required when private).
    private : bool
        False gives the non-private variant [spec 3.5]: no clipping, no noise.
    clip : ClipSpec
        Privacy unit and clip norm C.
    neighboring : Neighboring
        add/remove (``Delta_F = C``) or replace-one (``Delta_F = 2C``).
    delta_jl_fraction : float
        Share of delta charged to the sketch-norm failure events [spec 2.2].
    tile_size : int
        Rows per RNG tile.
    range_weight : float or None
        Private releases: the share ``w`` of the budget (in ``mu^2`` of the joint
        Gaussian mechanism) spent on the range sketch(es); None picks it by the
        public error model (:mod:`pipeline.algorithms.lrf.model`).
    range_clip : bool
        Private Spectral-LRF where one individual is one row of the sketched
        matrix: clip the rows of ``Y = X Phi`` to ``rho(t) C`` before the noise
        (sensitivity exactly ``rho Delta_F``). False keeps the Gaussian tail
        bound ``Delta_JL(t, beta)`` (comparison mode).
    """

    rank: int = field(metadata=meta(check=_int(1), flag=Flag(
        names=("--rank", "-k"), section="target", parse=int, required=True,
        help="target rank k")))  # fmt: skip
    algorithm: Algorithm = field(metadata=meta(flag=Flag(
        names=("--algorithm",), section="method", default=AUTO,
        choices=values(Algorithm, AUTO), help=_HELP_ALGORITHM)))  # fmt: skip
    padded: bool = field(default=False, metadata=meta(check=_bool, flag=Flag(
        names=("--padded",), section="method", switch=True,
        help="low-space only: the paper's padded construction (comparison)")))  # fmt: skip
    operator: OperatorKind | None = field(default=None, metadata=meta(flag=Flag(
        names=("--operator",), section="method", default=AUTO,
        choices=values(OperatorKind, AUTO), help=_HELP_OPERATOR)))  # fmt: skip
    sketch_size: int | None = field(default=None, metadata=meta(check=_int(2), flag=Flag(
        names=("--sketch-size", "-t"), section="method", parse=int,
        help="range sketch size t of a one-pass algorithm (default: the error model's, "
        "see --plan, when private; max(3k, k+20) with --non-private)")))  # fmt: skip
    core_size: int | None = field(default=None, metadata=meta(check=_int(3), flag=Flag(
        names=("--core-size", "-v"), section="method", parse=int,
        help="co-range/core sketch size v (default: one pass, the planned v, see --plan, "
        "or 2t for a larger --sketch-size; two-pass, max(10k, 100); 6t+1 with "
        "--non-private)")))  # fmt: skip
    epsilon: float | None = field(default=None, metadata=meta(flag=_EPSILON))
    delta: float | None = field(default=None, metadata=meta(flag=_DELTA))
    private: bool = field(default=True, metadata=meta(check=_bool, flag=_NON_PRIVATE))
    clip: ClipSpec = field(default_factory=_default_clip, metadata=meta(nested=True))
    neighboring: Neighboring = field(default=Neighboring.ADD_REMOVE, metadata=meta(check=_enum(Neighboring), flag=Flag(
        names=("--neighboring",), section="privacy", default="add-remove",
        choices=values(Neighboring), help="Delta_F = C (add-remove) or 2C (replace)")))  # fmt: skip
    delta_jl_fraction: float = 0.5
    tile_size: int = DEFAULT_TILE_SIZE
    range_weight: float | None = None
    range_clip: bool = field(default=True, metadata=meta(check=_bool))

    def __post_init__(self) -> None:
        """Validate every field and turn names into enums (no data needed)."""
        set_ = object.__setattr__
        # the rank is required: None is refused here, not skipped as "unset"
        set_(self, "rank", check_param(LrfParams, "rank", self.rank))
        _checked(self, "sketch_size", "core_size", write=False)
        _checked(self, "private", "padded", "range_clip", write=False)
        if self.private:
            if self.epsilon is None or self.delta is None:
                raise InvalidParameterError(
                    "a private release needs epsilon and delta, got "
                    f"epsilon={self.epsilon!r}, delta={self.delta!r}; pass both, or "
                    "private=False for the non-private variant."
                )
            eps, dlt = check_privacy_pair(self.epsilon, self.delta)
            set_(self, "epsilon", eps)
            set_(self, "delta", dlt)
        elif self.epsilon is not None or self.delta is not None:
            raise PrivacyConfigError(
                "a non-private run takes no epsilon or delta; drop them or drop non-private."
            )
        _checked(self, "neighboring")
        operator: Any = self.operator  # "auto" (a name) is accepted for None
        if operator == AUTO:
            set_(self, "operator", None)
        if self.operator is not None:
            set_(self, "operator", check_enum(OperatorKind, self.operator, "operator"))
        set_(self, "algorithm", self._algorithm())
        if self.range_weight is not None:
            if not self.private:
                raise InvalidParameterError(
                    "range_weight splits a privacy budget; a non-private run has none, "
                    "drop it."
                )
            set_(self, "range_weight", check_float_in_interval(
                self.range_weight, "range_weight", 0.0, 1.0))  # fmt: skip
        _check_others(self, ("rank", "sketch_size", "core_size", "private", "padded",
                             "range_clip", "neighboring"))  # fmt: skip

    def _algorithm(self) -> Algorithm:
        """``algorithm``, with ``"auto"`` resolved (docs/algorithms.md, "Which algorithm").

        ``"auto"``: the two-pass algorithm for a private release (the most
        accurate, at comparable time: ``benchmarks/bench_utility.py``,
        ``benchmarks/bench_lrf.py``), unless a one-pass option is set
        (``sketch_size``, a Gaussian ``operator``: Spectral-LRF; ``padded``:
        Low-Space-LRF, the only algorithm with the paper's padding); Spectral-LRF
        for a non-private run, where one pass is as accurate and reads A once.
        """
        if not (isinstance(self.algorithm, str) and self.algorithm == AUTO):
            return check_enum(Algorithm, self.algorithm, "algorithm")
        if self.padded:
            return Algorithm.LOW_SPACE
        one_pass_only = (
            self.sketch_size is not None or self.operator is OperatorKind.GAUSSIAN
        )
        if self.private and not one_pass_only:
            return Algorithm.TWO_PASS
        return Algorithm.SPECTRAL

    @classmethod
    def of(
        cls,
        rank: int,
        *,
        clip_norm: float = 1.0,
        unit: str | PrivacyUnit = "row",
        operator: str | OperatorKind | None = None,
        **kw: Any,
    ) -> LrfParams:
        """From user-facing names: ``clip_norm`` and ``unit`` make the ClipSpec,
        ``operator="auto"`` means None.

        Examples
        --------
        >>> p = LrfParams.of(5, epsilon=1.0, delta=1e-6, algorithm="low-space")
        >>> p.algorithm.value, p.clip.unit.value, p.neighboring.value
        ('low-space', 'row', 'add-remove')
        """
        clip = ClipSpec(unit=unit, clip_norm=clip_norm)  # type: ignore[arg-type]
        kw.setdefault("algorithm", AUTO)
        return cls(rank=rank, clip=clip, operator=operator, **kw)  # type: ignore[arg-type]


#: Nested parameter sets by field name (``from __future__ import annotations``
#: leaves a field's type as a string).
_NESTED: dict[str, type] = {"clip": ClipSpec}


# ---------------------------------------------------------------------------
# PCA
# ---------------------------------------------------------------------------
def _flag(section: str, *names: str, **kw: Any) -> Flag:
    return Flag(names=names, section=section, **kw)


#: The fields of :class:`PcaParams` its ``__post_init__`` validates by hand.
_PCA_BY_HAND = (
    "private", "method", "route", "neighboring", "accounting", "sensitivity",
    "row_norm_bound", "init_fraction", "h_fraction", "beta", "gamma_scale",
    "clip_radius", "rank", "iterations",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaParams:
    """Public parameters of one private PCA (all fixed before the data is read).

    The field order is the order of the report's ``parameters``.

    Attributes
    ----------
    rank : int
        ``k``, ``1 <= k <= d``.
    epsilon, delta : float or None
        Budget (None only when ``private`` is False).
    method : {"auto", "power", "analyze-gauss"}
        ``"auto"`` picks one of the two (and ``T``, ``R``) from public
        quantities (:mod:`pipeline.algorithms.pca.auto`).
    iterations : int or None
        ``T`` for the power method (required; never chosen from the data).
    clip_radius : float or None
        ``R`` for the power method (required when private).
    accounting : {"gdp", "paper"}
        Exact Gaussian (GDP) calibration, or the paper's literal constants.
    sensitivity : {"tight", "paper"}
        The exact sensitivities (default) or [P]'s (Gram and ``H``: 2 instead
        of sqrt(2) under replacement; the same under add/remove).
    neighboring : {"add-remove", "replace"}
        One row present or zero (default, as ``factorize``), or replaced.
    init_fraction, h_fraction : float
        Budget split: initialisation vs iterations, ``H`` vs ``Z`` (spec 3.4).
    beta : float
        Failure probability of the utility analysis (sets ``gamma`` only).
    gamma_scale : float
        Public multiplier of the eigenvalue floor ``gamma``.
    row_norm_bound : float
        Public ``C``: rows are divided by it, then clipped to norm 1.
    route : {"auto", "gram", "two-pass"}
    private : bool
        False: no clipping, no noise, ``gamma`` tiny, ``R`` infinite unless
        given -- the classical block power method, for comparison only.

    Each field is checked on its own here (the values are kept as given: they
    are the report's); what depends on the shape or on the method once
    ``"auto"`` is resolved is checked by ``plan_pca`` and ``calibrate_pca``.
    """

    rank: int = field(metadata=meta(check=_int(1), flag=_flag(
        "target", "--rank", "-k", parse=int, required=True,
        help="number of components k (<= columns)")))  # fmt: skip
    epsilon: float | None = field(default=None, metadata=meta(flag=_EPSILON))
    delta: float | None = field(default=None, metadata=meta(flag=_DELTA))
    method: str = field(default=AUTO, metadata=meta(check=_choice(values(PcaMethod)), flag=_flag(
        "method", "--method", choices=values(PcaMethod), default=AUTO,
        help="auto (default): Analyze Gauss, or the power method (T=3, R=sqrt(k/n)) "
        "when n/d exceeds 8 eigenvalue floors, from public quantities only; power: "
        "Analyze Gauss start + T clipped power iterations")))  # fmt: skip
    iterations: int | None = field(default=None, metadata=meta(check=_int(1), flag=_flag(
        "method", "--iterations", "-T", parse=int,
        help="public number of power iterations T (required for power)")))  # fmt: skip
    clip_radius: float | None = field(default=None, metadata=meta(check=_positive(privacy=True), flag=_flag(
        "method", "--clip-radius", "-R", parse=float,
        help="public clip radius R of the power iterations (required for power; "
        "about 2*sqrt(k*log(n)/n) for incoherent data)")))  # fmt: skip
    accounting: str = field(default="gdp", metadata=meta(check=_choice(values(PcaAccounting)), flag=_flag(
        "model", "--accounting", choices=values(PcaAccounting), default="gdp",
        help="gdp: exact Gaussian calibration (default); paper: the paper's constants")))  # fmt: skip
    sensitivity: str = field(default="tight", metadata=meta(check=_choice(values(PcaSensitivity)), flag=_flag(
        "model", "--sensitivity", choices=values(PcaSensitivity), default="tight",
        help="tight: exact sensitivities (default); paper: the paper's constants "
        "(Gram 2 instead of sqrt(2) under --neighboring replace)")))  # fmt: skip
    neighboring: str = field(default="add-remove", metadata=meta(check=_choice(values(Neighboring)), flag=_flag(
        "model", "--neighboring", choices=values(Neighboring), default="add-remove",
        help="one row present or a zero row, n public (default, as factorize), "
        "or one row replaced")))  # fmt: skip
    init_fraction: float = field(default=0.5, metadata=meta(check=_fraction))
    h_fraction: float = field(default=0.5, metadata=meta(check=_fraction))
    beta: float = field(default=0.1, metadata=meta(check=_fraction))
    gamma_scale: float = field(default=1.0, metadata=meta(check=_positive()))
    row_norm_bound: float = field(default=1.0, metadata=meta(check=_positive(), flag=_flag(
        "input", "--row-norm-bound", parse=float, default=1.0,
        help="public C: rows are divided by C, then clipped to norm 1 (default 1)")))  # fmt: skip
    route: str = field(default=AUTO, metadata=meta(check=_choice(values(PcaRoute)), flag=_flag(
        "model", "--route", choices=values(PcaRoute), default=AUTO,
        help="H from the client's Gram matrix (1+T passes) or from the data (1+2T)")))  # fmt: skip
    private: bool = field(default=True, metadata=meta(check=_bool, flag=_NON_PRIVATE))

    def __post_init__(self) -> None:
        """Check each field on its own (no data, no shape); the values are kept."""
        _checked(self, "private", "method", "route", "neighboring", "accounting", "sensitivity",
                 "row_norm_bound", write=False)  # fmt: skip
        if not self.private and (self.epsilon is not None or self.delta is not None):
            raise PrivacyConfigError(
                "a non-private run takes no epsilon or delta; drop them or drop non-private "
                f"(got epsilon={self.epsilon!r}, delta={self.delta!r})."
            )
        if self.private:
            if self.epsilon is None or self.delta is None:
                raise InvalidParameterError(
                    "epsilon and delta are required for a private PCA "
                    f"(got epsilon={self.epsilon!r}, delta={self.delta!r})."
                )
            check_privacy_pair(self.epsilon, self.delta)
        _checked(
            self, "init_fraction", "h_fraction", "beta", "gamma_scale", write=False
        )
        if self.clip_radius is not None:
            check_float_in_interval(self.clip_radius, "clip_radius", 0.0, math.inf,
                                    privacy=self.private)  # fmt: skip
        # rank and iterations are checked against the shape and the method (plan_pca)
        _check_others(self, _PCA_BY_HAND, write=False)


# ---------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StreamParams:
    """Public parameters of a stream, fixed at its creation (validated here).

    The fields are ``stream_init``'s; :meth:`to_manifest` is what the
    stream's manifest records, and every later step plans from that.

    Examples
    --------
    >>> p = StreamParams(n_rows=40, n_cols=10, rank=2, horizon=4, epsilon=1.0,
    ...                  delta=1e-6, unit="row")
    >>> p.unit.value, p.neighboring.value, p.to_manifest()["operator"]
    ('row', 'add-remove', 'gaussian')
    """

    n_rows: int = field(metadata=meta(check=_int(1), flag=_flag(
        "stream", "--rows", parse=int, required=True, help="number of rows m (public)")))  # fmt: skip
    n_cols: int = field(metadata=meta(check=_int(1), flag=_flag(
        "stream", "--cols", parse=int, required=True, help="number of columns n (public)")))  # fmt: skip
    rank: int = field(metadata=meta(check=_int(1), flag=_flag(
        "stream", "--rank", "-k", parse=int, required=True, help="target rank k")))  # fmt: skip
    horizon: int = field(metadata=meta(check=_int(1), flag=_flag(
        "stream", "--horizon", parse=int, required=True,
        help="number of epochs T the budget covers")))  # fmt: skip
    epsilon: float | None = field(default=None, metadata=meta(flag=_flag(
        "stream", "--epsilon", parse=float, help="epsilon of the whole stream")))  # fmt: skip
    delta: float | None = field(default=None, metadata=meta(flag=_flag(
        "stream", "--delta", parse=float, help="delta of the whole stream")))  # fmt: skip
    private: bool = field(default=True, metadata=meta(check=_bool, flag=_flag(
        "stream", "--non-private", negate=True, help="no clipping, no noise (NOT PRIVATE)")))  # fmt: skip
    algorithm: Algorithm = field(default=Algorithm.SPECTRAL, metadata=meta(check=_enum(Algorithm), flag=_flag(
        "stream", "--algorithm", choices=("spectral", "low-space"), default="spectral")))  # fmt: skip
    clip_norm: float = field(default=1.0, metadata=meta(check=_positive(privacy=True), flag=_flag(
        "stream", "--clip-norm", parse=float, default=1.0,
        help="C: an entity's total contribution over the stream has Frobenius norm <= C")))  # fmt: skip
    unit: StreamUnit = field(default=StreamUnit.GENERAL, metadata=meta(check=_enum(StreamUnit), flag=_flag(
        "stream", "--unit", choices=values(StreamUnit), default="general",
        help="what one entity may touch (default: general)")))  # fmt: skip
    neighboring: Neighboring = field(default=Neighboring.ADD_REMOVE, metadata=meta(check=_enum(Neighboring), flag=_flag(
        "stream", "--neighboring", choices=values(Neighboring), default="add-remove")))  # fmt: skip
    sketch_size: int | None = field(default=None, metadata=meta(flag=_flag(
        "stream", "--sketch-size", "-t", parse=int, help="t (default: max(4k, k + 20))")))  # fmt: skip
    core_size: int | None = field(default=None, metadata=meta(flag=_flag(
        "stream", "--core-size", "-v", parse=int, help="v (default: 4t)")))  # fmt: skip
    mechanism: StreamMechanism = field(default=StreamMechanism.BLT, metadata=meta(
        check=_enum(StreamMechanism), flag=_flag(
            "stream", "--mechanism", choices=values(StreamMechanism), default="blt",
            help="continual-release mechanism: blt (default), sqrt-factorization, or "
            "tree (the binary tree, for comparison)")))  # fmt: skip
    exclusive: bool = field(default=False, metadata=meta(check=_bool, flag=_flag(
        "stream", "--exclusive", switch=True,
        help="no two entities share a row (column, cell) of --unit: each entity is one "
        "row's (column's, cell's) individual, so the stream is a release at that unit "
        "and composes on its ledger with dplr factorize and pca releases")))  # fmt: skip

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "algorithm", check_enum(Algorithm, self.algorithm, "algorithm"))
        if self.algorithm is Algorithm.TWO_PASS:
            raise InvalidParameterError(
                "a stream is read once, so algorithm='two-pass' (stored matrices only) "
                "does not apply; use 'spectral' or 'low-space'."
            )
        _checked(self, "unit", "neighboring", "rank", "horizon", "n_rows", "n_cols")
        _checked(self, "private", write=False)
        if self.private:
            eps, dlt = check_privacy_pair(self.epsilon, self.delta)
            set_(self, "epsilon", eps)
            set_(self, "delta", dlt)
        elif self.epsilon is not None or self.delta is not None:
            raise InvalidParameterError(
                "a non-private stream takes no epsilon or delta."
            )
        _checked(self, "clip_norm")
        _check_others(self, ("unit", "neighboring", "rank", "horizon", "n_rows",
                             "n_cols", "private", "clip_norm", "algorithm"))  # fmt: skip
        if self.exclusive and self.unit is StreamUnit.GENERAL:
            raise InvalidParameterError(
                "exclusive=True (--exclusive) binds each entity to one row, column or "
                "cell that no other entity touches; it needs unit 'row', 'column' or "
                "'entry', got unit='general'."
            )
        if self.exclusive and not self.private:
            raise InvalidParameterError(
                "exclusive=True (--exclusive) says how a private stream is charged to "
                "its population's ledger; a non-private stream is charged to none, so "
                "drop it."
            )

    def to_manifest(self) -> dict[str, Any]:
        """The parameters as the stream's manifest records them (JSON-ready).

        ``operator`` is the co-range operator of a stream of the first plan
        version (Gaussian when private, sparse sign otherwise); ``stream_init``
        replaces it by its plan's operator and adds ``plan_version``
        (``pipeline.algorithms.continual.plan_stream``), and a manifest without
        ``plan_version`` is re-planned with the first version's rule.
        ``mechanism`` is absent from states written before it existed: they
        release by the binary tree; ``exclusive`` likewise (they are not).
        """
        operator = OperatorKind.GAUSSIAN if self.private else OperatorKind.SPARSE_SIGN
        return {
            "n_rows": self.n_rows, "n_cols": self.n_cols, "rank": self.rank,
            "horizon": self.horizon, "algorithm": self.algorithm.value,
            "private": self.private, "epsilon": self.epsilon, "delta": self.delta,
            "clip_norm": self.clip_norm, "unit": self.unit.value,
            "neighboring": self.neighboring.value, "sketch_size": self.sketch_size,
            "core_size": self.core_size, "delta_jl_fraction": 0.5,
            "operator": operator.value, "mechanism": self.mechanism.value,
            "exclusive": self.exclusive,
        }  # fmt: skip


# ---------------------------------------------------------------------------
# Where a release goes and runs (never what is released)
# ---------------------------------------------------------------------------
def check_dataset_name(dataset: object) -> None:
    """``dataset`` is None or a non-empty string (a public label), else raise."""
    if dataset is not None and (not isinstance(dataset, str) or not dataset):
        raise InvalidParameterError(
            "dataset must be None or a non-empty string (a public label of the "
            f"population), got dataset={dataset!r}."
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseOptions:
    """Where a release is published and charged (never what is released).

    Attributes
    ----------
    out : path or None
        Zarr v3 group to publish to (atomically); None returns arrays only.
    overwrite : bool
        Replace an existing ``out``.
    ledger : path, Ledger or None
        The dataset's privacy ledger (default: beside a Zarr input; this
        process's accountant for in-memory and dask inputs).
    budget : (epsilon, delta) or None
        Lifetime budget declared when the ledger does not exist yet.
    journal : path or None
        The crash-recovery journal (default beside ``out``, else beside the ledger).
    scratch : path or None
        Where a factorization's tall intermediates wait between steps.
    insecure_noise_seed : int or None
        Test only: reproducible noise; the release says NOT PRIVATE.
    dataset : str or None
        Without a persistent ledger: a public label of the population the
        input holds, whose in-process accountant is charged (one per name).
        None (default): the one accountant of every in-memory input of the
        process, which cannot tell whether two arrays hold the same people
        and so composes them all. Refused where a persistent ledger takes the
        charge (the ledger is the dataset's account).
    """

    out: str | None = None
    overwrite: bool = False
    ledger: Any = None
    budget: tuple[float, float] | None = None
    journal: str | None = None
    scratch: str | None = None
    insecure_noise_seed: int | None = None
    dataset: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("out", "journal", "scratch"):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, os.fspath(value))
        if not isinstance(self.overwrite, bool):
            raise InvalidParameterError(
                f"overwrite must be True or False, got overwrite={self.overwrite!r}."
            )
        if self.budget is not None:
            if not isinstance(self.budget, tuple | list) or len(self.budget) != 2:
                raise InvalidParameterError(
                    f"budget must be a pair (epsilon, delta), got budget={self.budget!r}."
                )
            set_(self, "budget", check_privacy_pair(*self.budget))
        if self.insecure_noise_seed is not None:
            set_(self, "insecure_noise_seed", check_int_in_range(
                self.insecure_noise_seed, "insecure_noise_seed", 0))  # fmt: skip
        check_dataset_name(self.dataset)

    def spec_fields(self) -> dict[str, Any]:
        """The fields a release spec takes from these options."""
        return {
            "out": self.out, "overwrite": self.overwrite, "ledger": self.ledger,
            "budget": self.budget, "journal": self.journal,
            "insecure_noise_seed": self.insecure_noise_seed, "dataset": self.dataset,
        }  # fmt: skip


#: The values of ``Runtime.cache``: keep the bands read by a dense input's first
#: pass in worker memory when they fit (``auto``), never, or always (refused
#: before anything is read when they cannot fit).
CACHE_MODES = ("auto", "never", "always")


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    """Where and how a job runs (never part of what is released).

    Attributes
    ----------
    scheduler : str or None
        A Dask scheduler's address (None: ``DASK_SCHEDULER_ADDRESS``, the active
        client, else an embedded local cluster).
    cluster_config : path, ClusterConfig or None
        A cluster configuration to start or connect to.
    progress : text stream or None
        Where progress lines go.
    cache : {"auto", "never", "always"}
        Whether the row bands of a dense input, read by the first pass, stay in
        the workers' memory for the later passes: ``auto`` when they fit within
        the workers' public memory limits (with a margin), ``never``, or
        ``always`` (refused before anything is read when they cannot fit). The
        release is the same either way.
    """

    scheduler: str | None = None
    cluster_config: Any = None
    progress: TextIO | None = None
    cache: str = field(default="auto", metadata=meta(
        check=_choice(CACHE_MODES),
        flag=Flag(names=("--cache",), section="runtime", choices=CACHE_MODES,
                  default="auto",
                  help="keep the row bands the first pass reads in the workers' "
                  "memory for the later passes: auto (when they fit within the "
                  "workers' memory limits, with a margin), never, or always "
                  "(refused before anything is read when they cannot fit); the "
                  "release is the same"),
    ))  # fmt: skip

    def __post_init__(self) -> None:
        _check_others(self, ())

    def say(self, msg: str) -> None:
        if self.progress is not None:
            print(msg, file=self.progress, flush=True)
