"""Persistent per-dataset privacy ledger with a lifetime budget.

Problem. Releases computed from the same dataset compose. Given the dataset's
lifetime budget ``(epsilon_B, delta_B)`` and the releases already charged,
decide whether a new release still fits, and record it durably if so. The
ledger knows no calibration class: a calibration describes its release as a
frozen event (``privacy_event()``, :mod:`pipeline.accounting.events`), the
ledger records the event's fields and composes the events in one place
(:func:`~pipeline.accounting.events.compose`). Two kinds exist today:

* **Gaussian** (``ReleaseCalibration`` of a low-rank factorization, or
  ``PcaCalibration`` of a PCA run with public ``(R, T)``): a Gaussian mechanism
  with unit sensitivity and noise multiplier ``z_i`` (``1/mu`` for a PCA run),
  plus a sketch-failure probability ``delta_JL,i`` (spec section 4.4; 0 for
  PCA);
* **approx** (``SelectionCalibration`` of the private selection of ``(R, T)``):
  an ``(epsilon_i, delta_i)``-DP release that is not a composition of
  Gaussians (random stopping, accounted in RDP), recorded with
  ``noise_multiplier_total = null`` and the fields ``kind = "approx"``,
  ``epsilon_approx``, ``delta_approx``.

A new kind of release adds an event class there, not a branch here.

Composition is exact among the Gaussians: k Gaussian mechanisms with
multipliers ``z_i`` are together one Gaussian with
``z_tot = (sum_i z_i^-2)^(-1/2)`` (their sensitivities add in squares) [BW18,
Thm 8]. That Gaussian, the ``delta_JL`` failure events and the approx
releases compose by basic composition [DR14, Thm 3.16]: the ledger is
``(epsilon, delta)``-DP with

    epsilon = E_a + eps_G,  delta = gaussian_delta(z_tot, eps_G)
              + sum_i delta_JL,i + D_a,

for any ``eps_G >= 0``, where ``E_a`` and ``D_a`` sum ``epsilon_approx`` and
``delta_approx``. A release fits iff this holds with ``epsilon = epsilon_B``,
``delta <= delta_B``, i.e. ``gaussian_delta(z_tot, epsilon_B - E_a) + sum
delta_JL + D_a <= delta_B``. The ``delta_JL`` terms are added, which is
conservative when releases reuse the same sketch matrices (then one good
event covers them all). Here ``z_i``, ``epsilon_approx`` and ``delta_approx``
are those of the releases *read at the ledger's contract* (below).

**Contracts.** A ledger declares, when it is created, who an individual is
(``unit``: row, column, entry, or a stream's entity) and which datasets are
neighbours (``neighboring``: add-remove or replace); its budget is a guarantee
at that unit and relation. Every charge states the release's own
:class:`~pipeline.accounting.contract.PrivacyContract`, which is recorded with
it, and every release is composed *as read at the ledger's unit and
relation*: a Gaussian release's ``mu = 1/z`` is multiplied by
:func:`~pipeline.accounting.contract.gdp_scale` (``z`` divided by it), an
approx release is read by group privacy of size
``k = approx_group_factor(...)`` as ``(k epsilon, k e^((k-1) epsilon)
delta)`` [Vadhan 2017, Lemma 2.2]. A release with no proven conversion (row
vs column, a stream's entities vs a matrix unit, an approx release through
entries) is refused with a :class:`PrivacyConfigError`. The ``delta_JL``
terms are unchanged by a conversion: the sketch norm bound fails with
probability ``beta`` for *any* fixed difference of the inputs, whatever its
norm. The proofs are in ``docs/privacy.md``, "Composing releases of
different contracts".

File format (JSON, mode 0600)::

    {"format": "dplr-ledger/2", "dataset": str,
     "budget": {"epsilon": E, "delta": D},
     "contract": {"unit": U, "neighboring": N},
     "releases": [{"release_id", "time", "algorithm", "epsilon", "delta",
                   "delta_jl", "noise_multiplier_total", "details",
                   "contract"}, ...]}

``noise_multiplier_total`` is the release's own ``z`` (at its own contract);
the conversion is applied when the ledger composes. An approx record also has
``"kind": "approx"``, ``"epsilon_approx"`` and ``"delta_approx"`` (again its
own), and ``"noise_multiplier_total": null`` (no Gaussian part; JSON has no
infinity).

**Ledgers written before contracts** (format ``dplr-ledger/1``: no declared
contract, no contract per record) open unchanged. An old record states no
relation: it is read as an ``add-remove`` release under relation ``replace``,
its ``mu`` counted twice (its approx ``(epsilon, delta)`` by group privacy of
size 2). That is the worst case among the relations, so the old charges are
never understated under either relation, and a replace-one guarantee implies
the add-remove one. An old record's unit is read from what the record is: a
stream's charge (``algorithm`` ``continual-*``, or ``details["stream"]``, as
``stream init`` wrote it) is a release about one of the stream's *entities*;
any other old record is a matrix release, taken to be about a ``row`` (its own
unit, ``--unit column`` or ``entry``, is recorded only in that release's
report, not in the ledger). The file is read at unit ``entity`` if it holds a
stream's charge, else at ``row``, always under ``replace``. A file holding both
kinds has no exact reading (no conversion between entities and rows is proven)
and is refused when it is opened; so is a stream's charge in a file that
declares a matrix unit. The first new charge rewrites the file as
``dplr-ledger/2`` with that declared contract (marked ``"assumed_for":
"dplr-ledger/1"``), so an older dplr, which composes without contracts, refuses
the file instead of under-counting it.

No seed or noise key is ever stored: the API has no argument that carries one,
and ``details`` keys that name a seed or key (other than a hash) are refused.
Writers serialise on an exclusive ``fcntl.flock`` of ``<path>.lock`` and
replace the file atomically, so readers never see a partial file.

References
----------
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530.
.. [DR14] Dwork, Roth. The algorithmic foundations of differential privacy,
   Thm 3.16 (basic composition).
.. [Vadhan 2017] Vadhan. The complexity of differential privacy, Lemma 2.2
   (group privacy).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import math
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline._durable import write_private
from pipeline._validation import check_enum, check_privacy_pair
from pipeline.accounting.contract import (
    EntityUnit,
    PrivacyContract,
    Unit,
    approx_group_factor,
    as_unit,
    gdp_scale,
)
from pipeline.accounting.events import (
    BUDGET_RTOL,
    Calibration,
    PrivacyEvent,
    compose,
    event_of_record,
)
from pipeline.errors import (
    BudgetExceededError,
    InvalidParameterError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.params import Neighboring, PrivacyUnit

__all__ = [
    "IN_MEMORY_DATASET",
    "LEDGER_FORMAT",
    "InProcessLedger",
    "Ledger",
    "default_ledger_path",
    "in_process_ledger",
]

LEDGER_FORMAT = "dplr-ledger/2"
# Ledgers written before contracts existed: read at (entity, replace) when they
# hold a stream's charge, else (row, replace), see above.
_LEGACY_FORMAT = "dplr-ledger/1"
_LEGACY_NEIGHBORING = Neighboring.REPLACE
# How ``stream init`` marked its charge before contracts.
_LEGACY_STREAM_ALGORITHM = "continual-"
_LEDGER_SUFFIX = ".dplr-ledger.json"
_FILE_MODE = 0o600
_RECORD_KEYS = (
    "release_id",
    "time",
    "algorithm",
    "epsilon",
    "delta",
    "delta_jl",
    "noise_multiplier_total",
    "details",
)
# Key fragments refused in ``details`` (spec section 4.6, item 3: the noise key
# and the sketch seed are never logged); "hash" marks an allowed digest.
_SECRET_FRAGMENTS = ("seed", "key", "secret", "entropy")


def default_ledger_path(store_path: str | os.PathLike[str]) -> pathlib.Path:
    """Ledger file next to a store: ``<store name>.dplr-ledger.json``.

    Parameters
    ----------
    store_path : str or path-like
        The dataset's store directory, e.g. ``data/sample.zarr``.

    Returns
    -------
    pathlib.Path
        Sibling of the store, e.g. ``data/sample.zarr.dplr-ledger.json``.

    Examples
    --------
    >>> default_ledger_path("data/sample.zarr/").as_posix()
    'data/sample.zarr.dplr-ledger.json'
    """
    raw = os.fspath(store_path)
    stripped = raw.rstrip("/" + os.sep) or raw
    store = pathlib.Path(stripped)
    if not store.name:
        raise InvalidParameterError(
            f"store_path must name a store directory, got store_path={raw!r}."
        )
    return store.with_name(store.name + _LEDGER_SUFFIX)


@dataclass(frozen=True, slots=True)
class _Declared:
    """The ledger's own unit and relation; ``assumed``: a pre-contract file."""

    unit: Unit
    neighboring: Neighboring
    assumed: bool = False

    def describe(self) -> str:
        return f"unit '{self.unit.value}' under '{self.neighboring.value}' neighbours"

    def to_dict(self) -> dict[str, str]:
        out = {"unit": self.unit.value, "neighboring": self.neighboring.value}
        if self.assumed:  # kept when a pre-contract file is rewritten
            out["assumed_for"] = _LEGACY_FORMAT
        return out


def _legacy_unit(rec: object) -> Unit:
    """The unit of a record written without a contract: what the record is.

    ``stream init`` charged a whole stream once, with ``algorithm`` set to
    ``continual-<algorithm>`` and ``details["stream"]`` naming its state: a
    release about one entity of the stream. Either mark is enough (reading a
    matrix release as an entity's can only refuse, never under-count). Any
    other record is a matrix release, taken as a row's (module docstring).
    """
    if not isinstance(rec, Mapping):
        return PrivacyUnit.ROW
    algorithm, details = rec.get("algorithm"), rec.get("details")
    stream = isinstance(algorithm, str) and algorithm.startswith(
        _LEGACY_STREAM_ALGORITHM
    )
    if stream or (isinstance(details, Mapping) and "stream" in details):
        return EntityUnit.ENTITY
    return PrivacyUnit.ROW


def _legacy_factor(rec: Mapping[str, Any], led: _Declared) -> float | None:
    """``gdp_scale`` (or group size) of a contract-less record at the ledger's contract.

    The record is read as an add/remove release at its :func:`_legacy_unit`:
    factor 2 under replace (group privacy of size 2), 1 under add/remove;
    ``None`` (refused) when that unit is not the ledger's.
    """
    if _legacy_unit(rec) is not led.unit:
        return None
    return 2.0 if led.neighboring is Neighboring.REPLACE else 1.0


def _declared(data: Mapping[str, Any]) -> _Declared:
    if data.get("format") == _LEGACY_FORMAT:
        releases = data.get("releases")
        records = releases if isinstance(releases, list) else []
        stream = any(_legacy_unit(r) is EntityUnit.ENTITY for r in records)
        unit: Unit = EntityUnit.ENTITY if stream else PrivacyUnit.ROW
        return _Declared(unit, _LEGACY_NEIGHBORING, assumed=True)
    c = data["contract"]
    return _Declared(
        as_unit(c["unit"]),
        check_enum(Neighboring, c["neighboring"], "neighboring"),
        assumed="assumed_for" in c,
    )


def _contract_factor(contract: PrivacyContract, led: _Declared) -> float | None:
    """``gdp_scale`` or the group size of ``contract`` at the ledger's contract."""
    if contract.accountant.gaussian:
        return gdp_scale(contract, led.unit, led.neighboring)
    return approx_group_factor(contract, led.unit, led.neighboring)


def _refusal(contract: PrivacyContract, led: _Declared) -> PrivacyConfigError:
    kind = "" if contract.accountant.gaussian else "approximate-DP "
    return PrivacyConfigError(
        f"this ledger composes releases at {led.describe()}, but the {kind}release is "
        f"at unit '{contract.unit.value}' under '{contract.neighboring.value}' "
        "neighbours and no conversion between the two is proven; charge it to a "
        "separate ledger for that population (dplr budget init --unit "
        f"{contract.unit.value} --neighboring {contract.neighboring.value} --ledger "
        "PATH), or release it at the ledger's unit and relation."
    )


def _check_contract(calibration: Calibration, contract: object) -> PrivacyContract:
    """The release's contract must be one and must state this calibration's budget."""
    if not isinstance(contract, PrivacyContract):
        raise InvalidParameterError(
            "contract must be a PrivacyContract (the release's unit, relation and "
            f"budget), got contract={type(contract).__name__}."
        )
    if contract.accountant.gaussian != _described(calibration).gaussian:
        raise PrivacyConfigError(
            f"contract.accountant={contract.accountant.value!r} does not match a "
            f"{type(calibration).__name__}: 'rdp' goes with a SelectionCalibration, "
            "the Gaussian accountants with the other calibrations."
        )
    same = math.isclose(
        contract.epsilon, calibration.epsilon, rel_tol=1e-12
    ) and math.isclose(contract.delta, calibration.delta, rel_tol=1e-12)
    if not same:
        raise PrivacyConfigError(
            f"the contract states (epsilon={contract.epsilon!r}, delta="
            f"{contract.delta!r}) but the calibration is for (epsilon="
            f"{calibration.epsilon!r}, delta={calibration.delta!r}); build the "
            "contract from the release's own budget."
        )
    return contract


def _check_finite_epsilon(calibration: Calibration) -> None:
    if math.isinf(calibration.epsilon):
        raise InvalidParameterError(
            "calibration.epsilon must be finite to charge a ledger, got "
            f"epsilon={calibration.epsilon!r}; non-private releases are not "
            "ledger entries."
        )


def _describer(calibration: object) -> Callable[[], object]:
    """A calibration's ``privacy_event`` (what makes it a calibration)."""
    describe = getattr(calibration, "privacy_event", None)
    if not callable(describe):
        raise InvalidParameterError(
            "calibration must be a ReleaseCalibration, PcaCalibration or "
            f"SelectionCalibration, got calibration={type(calibration).__name__}."
        )
    return describe  # type: ignore[no-any-return]


def _described(calibration: object) -> PrivacyEvent:
    """The event a calibration describes its release by (``privacy_event()``)."""
    event = _describer(calibration)()
    if not isinstance(event, PrivacyEvent):
        raise InvalidParameterError(
            "calibration.privacy_event() must return a PrivacyEvent, got "
            f"{type(event).__name__}."
        )
    return event


def _own_event(calibration: Calibration) -> PrivacyEvent:
    """Validate and self-check a calibration; its event at its own contract."""
    _describer(calibration)
    _check_finite_epsilon(calibration)
    # Bug guard before anything is charged: the recorded noise must give the
    # release's own (epsilon, delta) [spec section 4.4, LEDGER_CHECK].
    calibration.check()
    return _described(calibration)


def _at_ledger(
    own: PrivacyEvent, contract: PrivacyContract, led: _Declared
) -> PrivacyEvent:
    """A release's own event read at the ledger's contract; refuses what cannot convert."""
    factor = _contract_factor(contract, led)
    if factor is None:
        raise _refusal(contract, led)
    return own.read_at(factor)


def _record_contract(rec: Mapping[str, Any]) -> PrivacyContract | None:
    """A record's contract; None for a record written before contracts."""
    raw = rec.get("contract")
    return None if raw is None else PrivacyContract.from_dict(raw)


def _record_event(rec: Mapping[str, Any], led: _Declared) -> PrivacyEvent:
    """A (checked) record's event, read at the ledger's contract."""
    own = event_of_record(rec, "a release record")
    contract = _record_contract(rec)
    # A pre-contract record: its own unit, relation taken as add-remove (the
    # worst case: group privacy of size 2 under replace; module docstring).
    found = (
        _legacy_factor(rec, led)
        if contract is None
        else _contract_factor(contract, led)
    )
    assert found is not None, "records are checked when the file is read"
    return own.read_at(found)


def _check_details(details: object, where: str = "details") -> None:
    if not isinstance(details, Mapping):
        raise InvalidParameterError(
            f"{where} must be a dict, got {where}={type(details).__name__}."
        )
    for key, value in details.items():
        if not isinstance(key, str):
            raise InvalidParameterError(
                f"{where} keys must be strings, got key={key!r}."
            )
        low = key.lower()
        # a yes/no flag ("public_sketch_seed": true) carries no secret
        flag = isinstance(value, bool) or value is None
        if any(f in low for f in _SECRET_FRAGMENTS) and "hash" not in low and not flag:
            raise InvalidParameterError(
                f"{where} must not carry seeds or keys, got key {key!r}; "
                "record a hash (e.g. 'sketch_seed_hash') instead."
            )
        if isinstance(value, Mapping):
            _check_details(value, f"{where}[{key!r}]")


def _write_atomic(path: pathlib.Path, data: Mapping[str, Any]) -> None:
    """Write JSON atomically and durably, mode 0600 (:func:`pipeline._durable.write_private`)."""
    write_private(
        os.fspath(path), (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()
    )


@contextlib.contextmanager
def _exclusive_lock(path: pathlib.Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Closing the descriptor releases the flock.
        os.close(fd)


def _read_ledger(path: pathlib.Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = f"Privacy ledger not found at {str(path)!r}."
        raise StoreLayoutError(
            f"{where} Create it with "
            "Ledger.create(path, dataset=..., epsilon=..., delta=...).",
            cli=f"{where} Declare the dataset's lifetime budget first: dplr budget "
            "init DATASET --epsilon E --delta D (with --ledger PATH for a ledger "
            "elsewhere than beside the store).",
        ) from None
    except OSError as exc:
        raise StoreLayoutError(
            f"Privacy ledger at {str(path)!r} could not be read: {exc.strerror}."
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreLayoutError(
            f"Privacy ledger at {str(path)!r} is not valid JSON (line {exc.lineno}, "
            f"column {exc.colno}); restore it from a backup, never delete it."
        ) from None
    _check_layout(data, path)
    return data  # type: ignore[no-any-return]


def _check_layout(data: object, path: pathlib.Path) -> None:
    where = f"Privacy ledger at {str(path)!r}"
    if not isinstance(data, dict) or data.get("format") not in (
        LEDGER_FORMAT,
        _LEGACY_FORMAT,
    ):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise StoreLayoutError(
            f"{where} must have format {LEDGER_FORMAT!r} (or the older "
            f"{_LEGACY_FORMAT!r}), found format={found!r}."
        )
    budget = data.get("budget")
    if (
        not isinstance(data.get("dataset"), str)
        or not isinstance(budget, dict)
        or not isinstance(data.get("releases"), list)
    ):
        raise StoreLayoutError(
            f"{where} must hold 'dataset' (str), 'budget' (object) and "
            "'releases' (list)."
        )
    try:
        check_privacy_pair(budget.get("epsilon"), budget.get("delta"))
    except InvalidParameterError as exc:
        raise StoreLayoutError(f"{where} has an invalid budget: {exc}") from None
    led = _check_declared(data, where)
    for i, rec in enumerate(data["releases"]):
        _check_record(rec, led, f"{where}: releases[{i}]")


def _check_declared(data: Mapping[str, Any], where: str) -> _Declared:
    if data["format"] == LEDGER_FORMAT:
        c = data.get("contract")
        keys = {"unit", "neighboring"}
        if not isinstance(c, dict) or not keys <= set(c) <= keys | {"assumed_for"}:
            raise StoreLayoutError(
                f"{where} must declare 'contract': {{'unit': ..., 'neighboring': ...}}, "
                f"got {c!r}."
            )
    try:
        return _declared(data)
    except InvalidParameterError as exc:
        raise StoreLayoutError(f"{where} declares an invalid contract: {exc}") from None


def _check_record(rec: object, led: _Declared, where: str) -> None:
    if not isinstance(rec, dict) or any(k not in rec for k in _RECORD_KEYS):
        raise StoreLayoutError(f"{where} must have the keys {list(_RECORD_KEYS)}.")
    event = event_of_record(rec, where)
    try:
        contract = _record_contract(rec)
    except (InvalidParameterError, TypeError, KeyError) as exc:
        raise StoreLayoutError(f"{where} has an invalid contract: {exc}") from None
    if contract is None:
        _check_legacy_record(rec, led, where)
        return
    if contract.accountant.gaussian != event.gaussian:
        raise StoreLayoutError(
            f"{where} has accountant {contract.accountant.value!r}, which does not "
            f"match its kind {rec.get('kind')!r}."
        )
    if _contract_factor(contract, led) is None:
        raise StoreLayoutError(
            f"{where} cannot be composed here: {_refusal(contract, led)}"
        )


def _check_legacy_record(rec: Mapping[str, Any], led: _Declared, where: str) -> None:
    """A record without a contract must be of the ledger's unit (no conversion is proven)."""
    if _legacy_factor(rec, led) is not None:
        return
    unit = _legacy_unit(rec)
    what = "a stream's charge" if unit is EntityUnit.ENTITY else "a matrix release"
    raise StoreLayoutError(
        f"{where} was written without a contract and is {what}, read at unit "
        f"'{unit.value}', but this ledger composes releases at {led.describe()}; no "
        "conversion between the two units is proven, so this file states no "
        "guarantee at either. Keep it as the record of what was "
        "spent and declare a ledger per population (dplr budget init --unit entity or "
        "--unit row) whose budget leaves room for it."
    )


class Ledger:
    """The privacy ledger of one dataset, stored as a JSON file.

    Use :meth:`create` once per dataset and :meth:`open` afterwards. Reads
    (:meth:`spent`, :meth:`check`, :meth:`remaining_summary`) first reload the
    file, so they see releases charged by other processes; :attr:`releases`
    and :attr:`budget` are the snapshot of the last reload. Every release is
    composed as read at the ledger's :attr:`unit` and :attr:`neighboring`
    (module docstring).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "d.dplr-ledger.json"
    ...     led = Ledger.create(p, dataset="d", epsilon=2.0, delta=1e-5)
    ...     led.spent(), led.unit.value, led.neighboring.value
    ((0.0, 0.0), 'row', 'add-remove')
    """

    __slots__ = ("_data", "_path")

    def __init__(self, path: pathlib.Path, data: dict[str, Any]) -> None:
        self._path = path
        self._data = data

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        dataset: str,
        epsilon: float,
        delta: float,
        unit: str | Unit = "row",
        neighboring: str | Neighboring = "add-remove",
    ) -> Ledger:
        """Create a new, empty ledger with a lifetime budget and its contract.

        Parameters
        ----------
        path : str or path-like
            The ledger file; it must not exist. Its directory must.
        dataset : str
            Non-empty dataset identifier.
        epsilon, delta : float
            Lifetime budget, ``epsilon > 0``, ``delta`` in ``(0, 1)``.
        unit : {"row", "column", "entry", "entity"}
            Who an individual of this dataset is ("entity": a stream's entity
            ids). The budget is a guarantee for one such individual.
        neighboring : {"add-remove", "replace"}
            The relation the budget holds under.

        Returns
        -------
        Ledger

        Raises
        ------
        StoreLayoutError
            If the file already exists (a budget is never reset silently).
        PrivacyConfigError
            If the budget is invalid.
        InvalidParameterError
            If the unit or the relation is unknown.
        """
        eps, dlt = check_privacy_pair(epsilon, delta)
        led = _Declared(
            as_unit(unit), check_enum(Neighboring, neighboring, "neighboring")
        )
        if not isinstance(dataset, str) or not dataset:
            raise InvalidParameterError(
                f"dataset must be a non-empty string, got dataset={dataset!r}."
            )
        p = pathlib.Path(path)
        if not p.parent.is_dir():
            raise StoreLayoutError(
                f"Privacy ledger directory {str(p.parent)!r} does not exist; "
                "create the dataset's directory first."
            )
        data = _new_data(dataset, eps, dlt, led)
        with _exclusive_lock(p):
            if p.exists():
                where = f"Privacy ledger already exists at {str(p)!r}"
                raise StoreLayoutError(
                    f"{where}; open it with Ledger.open(path). Its budget cannot be "
                    "reset.",
                    cli=f"{where}; its budget cannot be reset. See what it holds with "
                    "dplr budget show DATASET (with --ledger PATH for a ledger "
                    "elsewhere than beside the store).",
                )
            _write_atomic(p, data)
        return cls(p, data)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Ledger:
        """Open an existing ledger (a ``dplr-ledger/1`` one too: module docstring).

        Raises
        ------
        StoreLayoutError
            If the file is missing, not valid JSON, not a dplr ledger, or holds
            a record that cannot be composed at its declared contract.
        """
        p = pathlib.Path(path)
        return cls(p, _read_ledger(p))

    @property
    def path(self) -> pathlib.Path:
        """The ledger file."""
        return self._path

    @property
    def dataset(self) -> str:
        """Dataset identifier."""
        return str(self._data["dataset"])

    @property
    def budget(self) -> tuple[float, float]:
        """Lifetime budget ``(epsilon_B, delta_B)``."""
        b = self._data["budget"]
        return float(b["epsilon"]), float(b["delta"])

    @property
    def unit(self) -> Unit:
        """Who an individual is, for this ledger's budget."""
        return _declared(self._data).unit

    @property
    def neighboring(self) -> Neighboring:
        """The neighbouring relation this ledger's budget holds under."""
        return _declared(self._data).neighboring

    @property
    def releases(self) -> tuple[dict[str, Any], ...]:
        """Copies of the release records, oldest first."""
        return tuple(json.loads(json.dumps(r)) for r in self._data["releases"])

    def reload(self) -> None:
        """Re-read the file (done by every accounting method)."""
        self._data = _read_ledger(self._path)

    def _events(self) -> list[PrivacyEvent]:
        """The releases' events, each read at the ledger's contract."""
        led = _declared(self._data)
        return [_record_event(r, led) for r in self._data["releases"]]

    def spent(self) -> tuple[float, float]:
        """Budget used so far, as ``(epsilon_used, delta_used)``, at the ledger's contract.

        Returns
        -------
        tuple of float
            ``delta_used = gaussian_delta(z_tot, epsilon_B - E_a) + sum
            delta_JL + D_a``, the composed delta at the budget's epsilon, with
            ``z_tot = (sum z_i^-2)^(-1/2)`` over the Gaussian releases and
            ``E_a``, ``D_a`` the sums of ``epsilon_approx``, ``delta_approx``
            over the approx releases (0 without them; 1 if ``E_a`` exceeds
            ``epsilon_B``), every release read at the ledger's unit and
            relation (``z_i`` divided by its ``gdp_scale``; an approx release
            by group privacy). ``epsilon_used`` is the smallest epsilon at which
            all releases together are ``(epsilon, delta_B)``-DP:
            ``E_a + gaussian_epsilon(z_tot, delta_B - sum delta_JL - D_a)``, or
            ``inf`` when the delta terms alone use up ``delta_B`` (no epsilon
            then works). ``(0.0, 0.0)`` for an empty ledger.
        """
        self.reload()
        events = self._events()
        if not events:
            return 0.0, 0.0
        eps_b, delta_b = self.budget
        composed = compose(events)
        delta_used = composed.delta_at(eps_b)
        if math.isinf(delta_used):
            delta_used = 1.0
        return composed.epsilon_at(delta_b), delta_used

    def _check_loaded(
        self, calibration: Calibration, new: PrivacyEvent, own: PrivacyEvent
    ) -> None:
        """Refuse ``new`` (``own`` read at the ledger's contract) if it does not fit.

        The refusal states, in epsilon at the budget's delta, what the release
        needs (the composed epsilon with it minus without it) and what is left:
        public budgets and charges only.
        """
        eps_b, delta_b = self.budget
        earlier = self._events()
        after = compose([*earlier, new])
        if after.delta_at(eps_b) <= delta_b * (1 + BUDGET_RTOL):
            return
        spent = compose(earlier).epsilon_at(delta_b)
        left = max(eps_b - spent, 0.0)
        need = after.epsilon_at(delta_b) - spent
        read = (
            f" (read at the ledger's {_declared(self._data).describe()})"
            if new != own
            else ""
        )
        n = len(self._data["releases"])
        if math.isinf(need):
            cost = (
                f"its delta terms leave no room in delta = {delta_b:g} after {n} "
                f"earlier release(s) ({_eps_text(left, left)} of epsilon = "
                f"{_eps_text(eps_b, eps_b)} is left)"
            )
        else:
            cost = (
                f"it needs epsilon = {_eps_text(need, left)} at delta = {delta_b:g}; "
                f"{_eps_text(left, need)} of epsilon = {_eps_text(eps_b, need, left)} "
                f"is left after {n} earlier release(s), composed exactly"
            )
        raise BudgetExceededError(
            f"Release (epsilon={calibration.epsilon!r}, "
            f"delta={calibration.delta!r}){read} would exceed the dataset's lifetime "
            f"budget (epsilon={eps_b!r}, delta={delta_b!r}): {cost}."
        )

    @staticmethod
    def check_against_budget(
        calibration: Calibration,
        *,
        contract: PrivacyContract,
        epsilon: float,
        delta: float,
        unit: str | Unit | None = None,
        neighboring: str | Neighboring | None = None,
    ) -> None:
        """Check a first release against a budget that no file records yet.

        Lets a caller refuse an over-budget plan before creating the ledger, so
        that a job failing on bad input leaves no file behind. ``unit`` and
        ``neighboring`` are those the ledger will declare (default: the
        release's own).

        Raises
        ------
        BudgetExceededError
            If the release alone exceeds ``(epsilon, delta)``.
        PrivacyConfigError
            If the release cannot be read at ``unit``/``neighboring``.
        """
        eps, dlt = check_privacy_pair(epsilon, delta)
        _check_contract(calibration, contract)
        led = _Declared(
            as_unit(contract.unit if unit is None else unit),
            check_enum(
                Neighboring,
                contract.neighboring if neighboring is None else neighboring,
                "neighboring",
            ),
        )
        data = _new_data("-", eps, dlt, led)
        book = Ledger(pathlib.Path(os.devnull), data)
        own = _own_event(calibration)
        new = _at_ledger(own, _check_contract(calibration, contract), led)
        book._check_loaded(calibration, new, own)

    def check(self, calibration: Calibration, *, contract: PrivacyContract) -> None:
        """Raise if charging ``calibration`` would exceed the lifetime budget.

        Parameters
        ----------
        calibration : Calibration
            E.g. a ``ReleaseCalibration``, ``PcaCalibration`` or
            ``SelectionCalibration``: anything with ``epsilon``, ``delta``,
            ``check()`` and ``privacy_event()``.
        contract : PrivacyContract
            The release's own contract; the release is read at the ledger's.

        Raises
        ------
        BudgetExceededError
            If the composed delta at ``epsilon_B`` with the new release would
            exceed ``delta_B (1 + 1e-9)`` (approx releases first take their
            epsilon from ``epsilon_B`` and their delta from ``delta_B``).
        PrivacyConfigError
            If no conversion from the release's unit and relation to the
            ledger's is proven, if the contract does not state the
            calibration's budget, or if the calibration fails its own
            LEDGER_CHECK (a bug).
        InvalidParameterError
            If ``calibration.epsilon`` is infinite (non-private).
        """
        self.reload()
        own = _own_event(calibration)
        checked = _check_contract(calibration, contract)
        self._check_loaded(
            calibration, _at_ledger(own, checked, _declared(self._data)), own
        )

    def charge(
        self,
        calibration: Calibration,
        *,
        contract: PrivacyContract,
        release_id: str,
        algorithm: str,
        details: Mapping[str, Any],
        stamp: str | None = None,
    ) -> dict[str, Any]:
        """Check the budget and append a release record, atomically.

        Parameters
        ----------
        calibration : Calibration
            The release's noise, charged as its ``privacy_event()``: a
            Gaussian release (``ReleaseCalibration``, ``PcaCalibration``) its
            ``1/Delta_eff`` (``1/mu`` for PCA) and ``delta_jl``; a selection
            (``SelectionCalibration``) an approx record, its ``(epsilon,
            delta)`` composed with the rest by basic composition.
        contract : PrivacyContract
            The release's own contract, recorded with it; the release is
            composed as read at the ledger's unit and relation.
        release_id : str
            Unique within this ledger.
        algorithm : str
            Name of the algorithm, e.g. ``"spectral"``.
        details : dict
            JSON-serialisable free-form record (shapes, k, t, v, the
            calibration's ``to_dict()``, a hash of the sketch seed). Keys naming
            a seed or key are refused.
        stamp : str or None
            The record's ``time`` (ISO 8601): the release's one published
            stamp, taken before any data was read; None for now.

        Returns
        -------
        dict
            The record written.

        Raises
        ------
        BudgetExceededError
            If the release does not fit; nothing is written.
        PrivacyConfigError
            As in :meth:`check`; nothing is written.
        InvalidParameterError
            For a duplicate ``release_id``, non-serialisable ``details`` or
            an infinite epsilon.
        """
        for name, value in (("release_id", release_id), ("algorithm", algorithm)):
            if not isinstance(value, str) or not value:
                raise InvalidParameterError(
                    f"{name} must be a non-empty string, got {name}={value!r}."
                )
        _check_details(details)
        try:
            details_copy = json.loads(json.dumps(dict(details), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(
                f"details must be JSON-serialisable with finite floats: {exc}."
            ) from None
        own = _own_event(calibration)
        checked = _check_contract(calibration, contract)
        _at_ledger(own, checked, _declared(self._data))  # refused before the lock
        with self._locked():
            # Re-read under the lock: another process may have charged meanwhile.
            self.reload()
            if any(r["release_id"] == release_id for r in self._data["releases"]):
                raise InvalidParameterError(
                    f"release_id must be unique in the ledger, got "
                    f"release_id={release_id!r} (already charged)."
                )
            led = _declared(self._data)
            self._check_loaded(calibration, _at_ledger(own, checked, led), own)
            record = _record(calibration, checked, own, release_id, algorithm)
            if stamp is not None:
                record["time"] = str(stamp)
            record["details"] = details_copy
            new_data = {
                **self._data,
                "format": LEDGER_FORMAT,
                "contract": led.to_dict(),
            }
            new_data["releases"] = [*self._data["releases"], record]
            self._persist(new_data)
            self._data = new_data
        return json.loads(json.dumps(record))  # type: ignore[no-any-return]

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Exclusive access to the file while a charge is checked and written."""
        return _exclusive_lock(self._path)

    def _persist(self, data: Mapping[str, Any]) -> None:
        _write_atomic(self._path, data)

    def remaining_summary(self) -> dict[str, Any]:
        """Display summary: contract, budget, spent, release count, composed multiplier.

        Returns
        -------
        dict
            Keys ``dataset``, ``unit``, ``neighboring`` (the ledger's declared
            contract), ``contract_assumed`` (True for a ledger written before
            contracts, read as row/replace), ``budget_epsilon``,
            ``budget_delta``, ``n_releases``, ``epsilon_used``,
            ``delta_used``, ``delta_remaining_at_budget_epsilon``
            (``delta_B - delta_used``, floored at 0),
            ``noise_multiplier_total`` (``z_tot`` of the Gaussian releases
            read at the ledger's contract, ``inf`` when there are none) and
            ``epsilon_approx_total``, ``delta_approx_total`` (sums over the
            approx releases read at the ledger's contract, 0 when there are
            none).
        """
        eps_used, delta_used = self.spent()
        eps_b, delta_b = self.budget
        recs = self._data["releases"]
        composed = compose(self._events())
        led = _declared(self._data)
        return {
            "dataset": self.dataset,
            "unit": led.unit.value,
            "neighboring": led.neighboring.value,
            "contract_assumed": led.assumed,
            "budget_epsilon": eps_b,
            "budget_delta": delta_b,
            "n_releases": len(recs),
            "epsilon_used": eps_used,
            "delta_used": delta_used,
            "delta_remaining_at_budget_epsilon": max(delta_b - delta_used, 0.0),
            "noise_multiplier_total": composed.noise_multiplier,
            "epsilon_approx_total": composed.epsilon_approx,
            "delta_approx_total": composed.delta_approx,
        }

    def __repr__(self) -> str:
        """Path, dataset, contract, budget and release count (no record contents)."""
        eps_b, delta_b = self.budget
        led = _declared(self._data)
        return (
            f"Ledger(path={str(self._path)!r}, dataset={self.dataset!r}, "
            f"unit={led.unit.value!r}, neighboring={led.neighboring.value!r}, "
            f"budget=(epsilon={eps_b!r}, delta={delta_b!r}), "
            f"n_releases={len(self._data['releases'])})"
        )


class InProcessLedger(Ledger):
    """The accountant of the releases that no persistent ledger takes.

    In-memory and dask inputs and the estimators charge one of these by default
    (as diffprivlib's default ``BudgetAccountant`` does): every release is
    recorded with its contract and composed exactly at the unit and relation of
    the first, as a :class:`Ledger` does. It has no budget to refuse against
    (pass a persistent ledger for that), writes nothing, and ends with the
    process. :func:`in_process_ledger` finds it: one for every in-memory input
    of the process, and one for each dataset a caller names.

    The accountant of the unnamed inputs (``widens``) holds releases on arrays
    it cannot relate, so it refuses none that some matrix unit covers: when a
    release cannot be read at its unit (a column release after a row release),
    it reads every release at the ``entry`` unit instead, to which every row,
    column and entry release converts (an entry neighbour is a replace-one row
    or column neighbour; :func:`~pipeline.accounting.contract.gdp_scale`), and
    says so in its reports. A named accountant is the caller's statement of one
    population and refuses such a release, as a ledger does.
    """

    __slots__ = ("_widens",)

    def __init__(
        self, dataset: str, contract: PrivacyContract, *, widens: bool = False
    ) -> None:
        led = _Declared(contract.unit, contract.neighboring)
        # no budget: composed delta at epsilon = inf is 0, so nothing is refused
        super().__init__(pathlib.Path(f"<in-process:{dataset}>"), {
            **_new_data(dataset, math.inf, 1.0, led), "contract": led.to_dict(),
        })  # fmt: skip
        self._widens = widens

    def reload(self) -> None:
        """Nothing to re-read: the records live in this process only."""

    def _widen_for(self, contract: object) -> None:
        """Read everything at ``entry`` if that is what admits ``contract`` (``widens``)."""
        led = _declared(self._data)
        if (
            not self._widens
            or not isinstance(contract, PrivacyContract)
            or _contract_factor(contract, led) is not None
        ):
            return
        wide = _Declared(PrivacyUnit.ENTRY, led.neighboring)
        contracts = [_record_contract(r) for r in self._data["releases"]]
        if all(
            c is not None and _contract_factor(c, wide) is not None
            for c in [*contracts, contract]
        ):
            self._data = {**self._data, "contract": wide.to_dict()}

    def check(self, calibration: Calibration, *, contract: PrivacyContract) -> None:
        """As :meth:`Ledger.check`; a release of another population is told to name it."""
        self._widen_for(contract)
        led = _declared(self._data)
        if (
            isinstance(contract, PrivacyContract)
            and _contract_factor(contract, led) is None
        ):
            raise PrivacyConfigError(
                f"this process's accountant {self.dataset!r} composes releases at "
                f"{led.describe()} (those of its first release), but the release is at "
                f"unit '{contract.unit.value}' under '{contract.neighboring.value}' "
                "neighbours and no conversion between the two is proven. If its "
                "individuals are another population, name it: dataset='NAME' (a public "
                "label) gives it an accountant of its own; otherwise charge both to one "
                "persistent ledger of the unit that holds for both."
            )
        super().check(calibration, contract=contract)

    def charge(
        self,
        calibration: Calibration,
        *,
        contract: PrivacyContract,
        release_id: str,
        algorithm: str,
        details: Mapping[str, Any],
        stamp: str | None = None,
    ) -> dict[str, Any]:
        """As :meth:`Ledger.charge` (the unnamed inputs' accountant widens first)."""
        self._widen_for(contract)
        return super().charge(
            calibration, contract=contract, release_id=release_id,
            algorithm=algorithm, details=details, stamp=stamp,
        )  # fmt: skip

    def _check_loaded(
        self, calibration: Calibration, new: PrivacyEvent, own: PrivacyEvent
    ) -> None:
        """No budget to exceed (the conversion to its contract is still checked)."""

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def _persist(self, data: Mapping[str, Any]) -> None:
        pass

    def spent(self) -> tuple[float, float]:
        """``(epsilon, delta)`` of all releases together, read at its contract.

        The composed Gaussian is stated at ``delta_G``, the sum of the Gaussian
        releases' own mechanism deltas (``delta - delta_jl`` of each), and the
        basic-composition terms (``delta_jl``, approx releases read by group
        privacy) are added: ``delta = delta_G + sum delta_JL + D_a``, the sum of
        the releases' own deltas when no release needed a conversion.
        """
        events = self._events()
        if not events:
            return 0.0, 0.0
        delta_g = math.fsum(
            float(r["delta"]) - float(r["delta_jl"])
            for r, e in zip(self._data["releases"], events, strict=True)
            if e.gaussian
        )
        return compose(events).stated_at(delta_g)

    def remaining_summary(self) -> dict[str, Any]:
        """Kind, dataset, contract, release count and what they spent together."""
        eps_used, delta_used = self.spent()
        led = _declared(self._data)
        return {
            "kind": "in-process",
            "dataset": self.dataset,
            "unit": led.unit.value,
            "neighboring": led.neighboring.value,
            "n_releases": len(self._data["releases"]),
            "epsilon_used": eps_used,
            "delta_used": delta_used,
        }


#: What the accountant of every in-memory input without a named dataset shows.
IN_MEMORY_DATASET = "in-memory inputs of this process"
_IN_PROCESS: dict[str | None, InProcessLedger] = {}


def in_process_ledger(
    dataset: str | None, contract: PrivacyContract
) -> InProcessLedger:
    """This process's accountant of ``dataset`` (created with ``contract``'s unit).

    Parameters
    ----------
    dataset : str or None
        A public label of the population a caller knows its inputs hold (it is
        shown in reports and messages). None: the one accountant of every
        in-memory input the process releases without a name. The process cannot
        tell whether two arrays hold the same people (a copy, another dtype, the
        rows in another order, a subset), so it composes all of them:
        over-charging a caller with several populations, never under-reporting
        what was spent on one (and reads them at the ``entry`` unit once
        their units differ with no conversion: :class:`InProcessLedger`).
    contract : PrivacyContract
        The first release's contract; fixes the accountant's unit and relation.

    Returns
    -------
    InProcessLedger
    """
    if dataset not in _IN_PROCESS:
        _IN_PROCESS[dataset] = InProcessLedger(
            IN_MEMORY_DATASET if dataset is None else dataset,
            contract,
            widens=dataset is None,
        )
    return _IN_PROCESS[dataset]


def _new_data(dataset: str, eps: float, dlt: float, led: _Declared) -> dict[str, Any]:
    return {
        "format": LEDGER_FORMAT,
        "dataset": dataset,
        "budget": {"epsilon": eps, "delta": dlt},
        "contract": led.to_dict(),
        "releases": [],
    }


def _record(
    calibration: Calibration,
    contract: PrivacyContract,
    own: PrivacyEvent,
    release_id: str,
    algorithm: str,
) -> dict[str, Any]:
    """A release record at the release's own contract (converted when composed)."""
    fields = own.record_fields()
    record: dict[str, Any] = {
        "release_id": release_id,
        "time": datetime.datetime.now(datetime.UTC).isoformat(),
        "algorithm": algorithm,
        "epsilon": calibration.epsilon,
        "delta": calibration.delta,
        "delta_jl": fields.pop("delta_jl"),
        # JSON has no infinity: null marks "no Gaussian part".
        "noise_multiplier_total": fields.pop("noise_multiplier_total"),
        "details": {},
        "contract": contract.to_dict(),
    }
    return record | fields  # the event's own keys (an approx record's "kind", ...)


def _eps_text(value: float, *others: float) -> str:
    """``value`` with 2 decimals, or more until it differs from each of ``others``."""
    for places in range(2, 10):
        if all(round(value, places) != round(o, places) for o in others if o != value):
            break
    return f"{value:.{places}f}"
