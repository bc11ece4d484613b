"""The ledger holds privacy contracts: every release is read at the ledger's unit and relation.

The epsilons of the mixed-contract examples are recomputed here independently of the
ledger's code: by the textbook mu-GDP profile [DRS22, Cor. 2.13] evaluated with
scipy.stats and solved with brentq, and by dp_accounting's PLD accountant, whose
``NeighboringRelation`` models the relation itself (a ``GaussianDpEvent``'s
noise multiplier is sigma over one individual's clip norm C; ``REPLACE_ONE``
moves the statistic by 2C).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import zarr
from dp_accounting.pld import pld_privacy_accountant
from scipy import optimize, stats

from pipeline.accounting.calibration import ReleaseCalibration, SketchNoise
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.gaussian import gaussian_epsilon
from pipeline.accounting.ledger import LEDGER_FORMAT, Ledger
from pipeline.accounting.pca import SelectionCalibration, calibrate_selection
from pipeline.errors import (
    BudgetExceededError,
    InvalidParameterError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.mechanisms.clipping import clip_entries
from pipeline.params import PcaParams

DELTA = 1e-6
NR = dp_accounting.NeighboringRelation


# -- independent oracles ------------------------------------------------------------
def _profile(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP [DRS22, Cor. 2.13], textbook form with scipy.stats."""
    return float(
        stats.norm.cdf(-eps / mu + mu / 2)
        - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


def _eps_of(mu: float, delta: float = DELTA) -> float:
    return float(
        optimize.brentq(lambda e: _profile(mu, e) - delta, 0.0, 500.0, xtol=1e-13)
    )


def _mu_of(eps: float, delta: float = DELTA) -> float:
    return float(
        optimize.brentq(lambda m: _profile(m, eps) - delta, 1e-3, 50.0, xtol=1e-15)
    )


def _pld_epsilon(relation: NR, multipliers: list[float], delta: float = DELTA) -> float:
    """dp_accounting's PLD epsilon of Gaussians with noise multipliers sigma / C."""
    acc = pld_privacy_accountant.PLDAccountant(relation)
    acc.compose(
        dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z) for z in multipliers]
        )
    )
    return float(acc.get_epsilon(delta))


def _assert_pld_close(pld: float, exact: float) -> None:
    """The PLD accountant rounds privacy losses up to its grid (interval 1e-4, the
    default ``value_discretization_interval``), so its epsilon is at most one
    interval above the exact one, and never below it (up to the root-finds' 1e-9)."""
    assert exact - 1e-9 <= pld <= exact + 1e-4, (pld, exact)


MU0 = _mu_of(1.0)  # the mu of a (1, 1e-6) budget: 0.2367


# -- releases -----------------------------------------------------------------------
def _gaussian(mu: float, frobenius_bound: float) -> ReleaseCalibration:
    """One plain Gaussian release (no sketch, delta_JL = 0) that is ``mu``-GDP at its contract."""
    sigma = frobenius_bound / mu
    return ReleaseCalibration(
        epsilon=gaussian_epsilon(1.0 / mu, DELTA) * (1 + 1e-12), delta=DELTA,
        delta_mechanism=DELTA, delta_jl=0.0, n_sketch_matrices=0, beta=0.0,
        frobenius_bound=frobenius_bound, noise_multiplier=sigma / frobenius_bound,
        tree_levels=1,
        sketches=(SketchNoise(name="X", shape=(1, 1), sensitivity=frobenius_bound,
                              jl_factor=1.0, weight=1.0, sigma=sigma),),
    )  # fmt: skip


def _contract(
    cal: object, unit: str, neighboring: str, **kw: object
) -> PrivacyContract:
    args: dict[str, object] = {
        "unit": unit, "neighboring": neighboring, "clip_norm": 1.0,
        "epsilon": cal.epsilon, "delta": cal.delta,  # type: ignore[attr-defined]
        "accountant": "rdp" if isinstance(cal, SelectionCalibration) else "analytic-gaussian",
        "shape": (500, 100),
    }  # fmt: skip
    args.update(kw)
    return PrivacyContract(**args)  # type: ignore[arg-type]


def _release(
    mu: float, unit: str, neighboring: str
) -> tuple[ReleaseCalibration, PrivacyContract]:
    """A ``mu``-GDP release at (unit, relation), C = 1: Delta_F = C or 2C."""
    cal = _gaussian(mu, 1.0 if neighboring == "add-remove" else 2.0)
    return cal, _contract(cal, unit, neighboring)


def _contract_blind_epsilon(
    records: list[dict[str, object]], delta: float = DELTA
) -> float:
    """The composition before contracts: every record's own z, whatever its relation or unit."""
    z_tot = math.fsum(float(r["noise_multiplier_total"]) ** -2 for r in records) ** -0.5  # type: ignore[arg-type]
    return _eps_of(1.0 / z_tot, delta)


def _assert_never_understates(reported: float, true: float) -> None:
    assert reported >= true * (1 - 1e-6), (reported, true)


@pytest.fixture
def path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "d.dplr-ledger.json"


# -- (a) add/remove and replace releases under replace -----------
def test_add_remove_plus_replace_is_refused_on_a_replace_ledger(
    path: pathlib.Path,
) -> None:
    rep_cal, rep_con = _release(MU0 / math.sqrt(2), "row", "replace")
    ar_cal, ar_con = _release(MU0 / math.sqrt(2), "row", "add-remove")
    # The true epsilon of the two under replace-one, by dp_accounting's PLD: sigma / C is
    # 2 / mu for the replace release (calibrated for 2C), 1 / mu for the add/remove one.
    true_eps = _pld_epsilon(
        NR.REPLACE_ONE,
        [2 / rep_cal.effective_sensitivity, 1 / ar_cal.effective_sensitivity],
    )
    # ... and by the closed form: mu = sqrt(mu_r^2 + (2 mu_a)^2) = sqrt(5/2) mu0.
    np.testing.assert_allclose(_eps_of(math.sqrt(2.5) * MU0), 1.6422, rtol=0, atol=5e-5)
    _assert_pld_close(true_eps, _eps_of(math.sqrt(2.5) * MU0))
    assert round(true_eps, 2) == 1.64

    led = Ledger.create(
        path, dataset="d", epsilon=1.0, delta=DELTA, neighboring="replace"
    )
    led.charge(
        rep_cal, contract=rep_con, release_id="pca", algorithm="pca-power", details={}
    )
    before = path.read_bytes()
    with pytest.raises(
        BudgetExceededError,
        match=r"read at the ledger's unit 'row' under 'replace' neighbours\) would exceed",
    ):
        led.charge(
            ar_cal, contract=ar_con, release_id="lrf", algorithm="spectral", details={}
        )
    assert path.read_bytes() == before

    # The same two releases on an add/remove ledger fit: there they compose to mu0 (eps 1).
    other = Ledger.create(
        path.with_name("ar.json"), dataset="d", epsilon=1.0, delta=DELTA
    )
    for rid, (cal, con) in {"pca": (rep_cal, rep_con), "lrf": (ar_cal, ar_con)}.items():
        other.charge(cal, contract=con, release_id=rid, algorithm="x", details={})
    eps_ar = other.spent()[0]
    np.testing.assert_allclose(eps_ar, 1.0, rtol=1e-6)
    # ... and never below the truth under add/remove (replace -> add/remove is read at
    # factor 1, conservative: the replace release alone is mu / 2 there).
    _assert_never_understates(
        eps_ar,
        _pld_epsilon(
            NR.ADD_OR_REMOVE_ONE,
            [2 / rep_cal.effective_sensitivity, 1 / ar_cal.effective_sensitivity],
        ),
    )


def test_contract_blind_composition_understates_the_replace_reading(
    path: pathlib.Path,
) -> None:
    """Negative control: the composition before contracts accepts both releases of
    scenario (a) at epsilon 1.0, below the true 1.64, so the check above can fail."""
    rep_cal, rep_con = _release(MU0 / math.sqrt(2), "row", "replace")
    ar_cal, ar_con = _release(MU0 / math.sqrt(2), "row", "add-remove")
    led = Ledger.create(
        path, dataset="d", epsilon=10.0, delta=DELTA, neighboring="replace"
    )
    led.charge(rep_cal, contract=rep_con, release_id="a", algorithm="x", details={})
    led.charge(ar_cal, contract=ar_con, release_id="b", algorithm="x", details={})
    true_eps = _eps_of(math.sqrt(2.5) * MU0)
    blind = _contract_blind_epsilon(list(led.releases))
    np.testing.assert_allclose(
        blind, 1.0, rtol=1e-6
    )  # the old ledger's reading: fits (1, 1e-6)
    with pytest.raises(AssertionError):
        _assert_never_understates(blind, true_eps)
    _assert_never_understates(led.spent()[0], true_eps)
    np.testing.assert_allclose(led.spent()[0], true_eps, rtol=1e-6)


# -- (b) an entry-unit and a row-unit release read at row level ----
def test_entry_plus_row_release_read_at_row_level(path: pathlib.Path) -> None:
    n_cols = 100
    # The row sensitivity of the entry-clipped matrix, measured: a row of hostile
    # entries against the zero row (add/remove of the row) moves it by sqrt(100) C.
    hostile = np.tile([1e6, -1e6], (3, n_cols // 2))
    zeroed = hostile.copy()
    zeroed[1] = 0.0
    row_sens = float(
        np.linalg.norm(clip_entries(hostile, 1.0) - clip_entries(zeroed, 1.0))
    )
    np.testing.assert_allclose(row_sens, math.sqrt(n_cols), rtol=1e-12)

    entry_cal, entry_con = _release(MU0 / math.sqrt(2), "entry", "add-remove")
    row_cal, row_con = _release(MU0 / math.sqrt(2), "row", "add-remove")
    assert entry_con.shape == (500, n_cols)
    led = Ledger.create(path, dataset="d", epsilon=10.0, delta=DELTA)  # row, add/remove
    led.charge(
        entry_cal, contract=entry_con, release_id="entry", algorithm="x", details={}
    )
    led.charge(row_cal, contract=row_con, release_id="row", algorithm="x", details={})
    eps_used = led.spent()[0]

    # Independent: sigma over the measured row sensitivity for the entry release.
    sigma_entry = 1.0 / entry_cal.effective_sensitivity  # Delta_F = C = 1
    pld = _pld_epsilon(
        NR.ADD_OR_REMOVE_ONE,
        [sigma_entry / row_sens, 1 / row_cal.effective_sensitivity],
    )
    closed = _eps_of(math.sqrt(50.5) * MU0)
    np.testing.assert_allclose(closed, 8.9378, rtol=0, atol=5e-5)
    assert round(eps_used, 2) == 8.94
    # The ledger against the closed form: both root-find the same profile (1e-6 relative).
    np.testing.assert_allclose(eps_used, closed, rtol=1e-6)
    _assert_pld_close(pld, eps_used)
    # Negative control: the composition before contracts reads the pair as mu0, epsilon 1.
    blind = _contract_blind_epsilon(list(led.releases))
    np.testing.assert_allclose(blind, 1.0, rtol=1e-6)
    with pytest.raises(AssertionError):
        _assert_never_understates(blind, closed)
    summary = led.remaining_summary()
    np.testing.assert_allclose(
        summary["noise_multiplier_total"], 1 / (math.sqrt(50.5) * MU0), rtol=1e-9
    )


# -- refusals -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ledger_unit", "release_unit"),
    [("row", "column"), ("column", "row"), ("row", "entity"), ("entity", "entry")],
)
def test_no_proven_conversion_is_refused_in_one_line(
    path: pathlib.Path, ledger_unit: str, release_unit: str
) -> None:
    led = Ledger.create(path, dataset="d", epsilon=100.0, delta=1e-3, unit=ledger_unit)
    cal, con = _release(0.1, release_unit, "replace")
    before = path.read_bytes()
    for attempt in (
        lambda: led.check(cal, contract=con),
        lambda: led.charge(
            cal, contract=con, release_id="r", algorithm="x", details={}
        ),
        lambda: Ledger.check_against_budget(
            cal,
            contract=con,
            epsilon=100.0,
            delta=1e-3,
            unit=ledger_unit,
            neighboring="add-remove",
        ),
    ):
        with pytest.raises(PrivacyConfigError) as info:
            attempt()
        msg = str(info.value)
        assert "\n" not in msg
        assert f"unit '{ledger_unit}' under 'add-remove' neighbours" in msg
        assert f"unit '{release_unit}' under 'replace'" in msg
        assert (
            f"separate ledger for that population (dplr budget init --unit {release_unit}"
            in msg
        )
    assert path.read_bytes() == before
    # Negative control: the same release on a ledger of its own unit is charged.
    own = Ledger.create(
        path.with_name("own.json"),
        dataset="d",
        epsilon=100.0,
        delta=1e-3,
        unit=release_unit,
    )
    own.charge(cal, contract=con, release_id="r", algorithm="x", details={})


@pytest.fixture(scope="module")
def selection() -> SelectionCalibration:
    return calibrate_selection(
        PcaParams(rank=2, epsilon=1.0, delta=1e-6), n_rows=4096, n_features=8,
        radii=(0.1, 0.2), iteration_grid=(1, 2),
    )  # fmt: skip


def test_approx_release_is_read_by_group_privacy(
    path: pathlib.Path, selection: SelectionCalibration
) -> None:
    """(eps, delta) at row add/remove is (2 eps, 2 e^eps delta) under row replace
    [Vadhan 2017, Lemma 2.2, k = 2]; through entries it is refused."""
    led = Ledger.create(
        path, dataset="d", epsilon=5.0, delta=1e-4, neighboring="replace"
    )
    con = _contract(selection, "row", "add-remove")
    rec = led.charge(
        selection, contract=con, release_id="s", algorithm="pca-select", details={}
    )
    assert (rec["epsilon_approx"], rec["delta_approx"]) == (
        1.0,
        1e-6,
    )  # its own, as recorded
    summary = led.remaining_summary()
    assert summary["epsilon_approx_total"] == 2.0
    np.testing.assert_allclose(
        summary["delta_approx_total"], 2 * math.e * 1e-6, rtol=1e-12
    )
    assert led.spent() == (2.0, pytest.approx(2 * math.e * 1e-6, rel=1e-12))
    # the same selection under replace counts once
    led.charge(
        selection,
        contract=_contract(selection, "row", "replace"),
        release_id="t",
        algorithm="x",
        details={},
    )
    assert led.remaining_summary()["epsilon_approx_total"] == 3.0
    with pytest.raises(
        PrivacyConfigError, match="approximate-DP release is at unit 'entry'"
    ):
        led.check(selection, contract=_contract(selection, "entry", "replace"))


def test_contract_must_match_the_calibration(
    path: pathlib.Path, selection: SelectionCalibration
) -> None:
    led = Ledger.create(path, dataset="d", epsilon=100.0, delta=1e-3)
    cal, con = _release(0.2, "row", "add-remove")
    with pytest.raises(
        InvalidParameterError, match="contract must be a PrivacyContract"
    ):
        led.check(cal, contract=None)  # type: ignore[arg-type]
    with pytest.raises(PrivacyConfigError, match=r"the contract states \(epsilon=2\.0"):
        led.check(cal, contract=dataclasses.replace(con, epsilon=2.0))
    with pytest.raises(
        PrivacyConfigError, match="'rdp' goes with a SelectionCalibration"
    ):
        led.check(cal, contract=dataclasses.replace(con, accountant="rdp"))
    with pytest.raises(
        PrivacyConfigError, match="does not match a SelectionCalibration"
    ):
        led.check(
            selection, contract=_contract(selection, "row", "replace", accountant="gdp")
        )
    with pytest.raises(TypeError):
        led.charge(cal, release_id="r", algorithm="x", details={})  # type: ignore[call-arg]
    assert led.releases == ()


# -- the file -------------------------------------------------------------------------
def test_contracts_round_trip_through_the_file(path: pathlib.Path) -> None:
    led = Ledger.create(
        path, dataset="d", epsilon=50.0, delta=1e-4, unit="row", neighboring="replace"
    )
    cal = _gaussian(0.1, 1.0)
    con = _contract(
        cal,
        "entry",
        "add-remove",
        clip_norm=0.5,
        secret_noise=False,
        public_operators=True,
    )
    rec = led.charge(
        cal, contract=con, release_id="r", algorithm="spectral", details={}
    )
    data = json.loads(path.read_text())
    assert data["format"] == LEDGER_FORMAT == "dplr-ledger/2"
    assert data["contract"] == {"unit": "row", "neighboring": "replace"}
    (stored,) = data["releases"]
    assert stored["contract"] == rec["contract"] == con.to_dict()
    again = Ledger.open(path)
    assert PrivacyContract.from_dict(again.releases[0]["contract"]) == con
    assert (again.unit.value, again.neighboring.value) == ("row", "replace")
    summary = again.remaining_summary()
    assert (summary["unit"], summary["neighboring"], summary["contract_assumed"]) == (
        "row",
        "replace",
        False,
    )
    # entry add/remove read at row replace: mu x sqrt(100) x 2
    np.testing.assert_allclose(
        summary["noise_multiplier_total"], 1 / (0.1 * 20), rtol=1e-12
    )
    assert "unit='row', neighboring='replace'" in repr(again)


def test_a_record_that_cannot_be_composed_makes_the_file_unreadable(
    path: pathlib.Path,
) -> None:
    led = Ledger.create(path, dataset="d", epsilon=50.0, delta=1e-4)
    cal, con = _release(0.1, "row", "add-remove")
    led.charge(cal, contract=con, release_id="r", algorithm="x", details={})
    data = json.loads(path.read_text())
    data["releases"][0]["contract"]["unit"] = (
        "column"  # an edit: column at a row ledger
    )
    path.write_text(json.dumps(data))
    with pytest.raises(
        StoreLayoutError, match=r"releases\[0\] cannot be composed here"
    ):
        Ledger.open(path)
    data["releases"][0]["contract"] = {"unit": "row"}
    path.write_text(json.dumps(data))
    with pytest.raises(
        StoreLayoutError, match=r"releases\[0\] has an invalid contract"
    ):
        Ledger.open(path)
    path.write_text(json.dumps({**data, "releases": [], "contract": {"unit": "row"}}))
    with pytest.raises(StoreLayoutError, match="must declare 'contract'"):
        Ledger.open(path)


def _v1(records: list[dict[str, object]]) -> dict[str, object]:
    return {
        "format": "dplr-ledger/1",
        "dataset": "d",
        "budget": {"epsilon": 4.0, "delta": 1e-5},
        "releases": records,
    }


OLD_GAUSSIAN = {"release_id": "r1", "time": "t", "algorithm": "spectral", "epsilon": 1.0, "delta": 1e-6,
                "delta_jl": 5e-7, "noise_multiplier_total": 4.5, "details": {}}  # fmt: skip
OLD_APPROX = {"release_id": "s1", "time": "t", "algorithm": "pca-select", "epsilon": 0.5, "delta": 1e-7,
              "delta_jl": 0.0, "noise_multiplier_total": None, "details": {}, "kind": "approx",
              "epsilon_approx": 0.5, "delta_approx": 1e-7}  # fmt: skip


def test_a_ledger_from_before_contracts_is_read_as_row_replace(
    path: pathlib.Path,
) -> None:
    path.write_text(json.dumps(_v1([OLD_GAUSSIAN, OLD_APPROX])))
    led = Ledger.open(path)
    summary = led.remaining_summary()
    assert (summary["unit"], summary["neighboring"], summary["contract_assumed"]) == (
        "row",
        "replace",
        True,
    )
    # every old record counts as a row add/remove release: mu x 2, approx as a group of 2
    assert summary["noise_multiplier_total"] == 4.5 / 2
    assert summary["epsilon_approx_total"] == 1.0
    np.testing.assert_allclose(
        summary["delta_approx_total"], 2 * math.exp(0.5) * 1e-7, rtol=1e-12
    )
    d_a = 2 * math.exp(0.5) * 1e-7
    np.testing.assert_allclose(
        summary["delta_used"], _profile(2 / 4.5, 4.0 - 1.0) + 5e-7 + d_a, rtol=1e-8
    )
    conservative = 1.0 + _eps_of(2 / 4.5, 1e-5 - 5e-7 - d_a)
    np.testing.assert_allclose(summary["epsilon_used"], conservative, rtol=1e-6)
    # Negative control: the contract-blind reading of the same file (mu = 1/4.5,
    # (0.5, 1e-7) once) spends less, so the assertion above would catch it.
    blind = 0.5 + _eps_of(1 / 4.5, 1e-5 - 5e-7 - 1e-7)
    assert blind < 0.9 * conservative

    # A new charge rewrites the file in the new format, with the assumed contract marked.
    cal, con = _release(0.05, "row", "replace")
    led.charge(cal, contract=con, release_id="new", algorithm="pca-power", details={})
    data = json.loads(path.read_text())
    assert data["format"] == "dplr-ledger/2"
    assert data["contract"] == {
        "unit": "row",
        "neighboring": "replace",
        "assumed_for": "dplr-ledger/1",
    }
    assert data["releases"][:2] == [
        OLD_GAUSSIAN,
        OLD_APPROX,
    ]  # unchanged, still without contract
    again = Ledger.open(path).remaining_summary()
    assert again["contract_assumed"] is True
    np.testing.assert_allclose(
        again["noise_multiplier_total"], ((4.5 / 2) ** -2 + 0.05**2) ** -0.5, rtol=1e-12
    )


# -- call sites: the releases state their contracts ---------------------------------------
def test_factorize_and_pca_charge_their_contracts(path: pathlib.Path) -> None:
    from pipeline.api import factorize, pca

    A = np.random.default_rng(7).normal(size=(60, 20)) / 10
    led = Ledger.create(path, dataset="d", epsilon=200.0, delta=1e-3)  # row, add/remove
    factorize(
        A,
        2,
        epsilon=1.0,
        delta=1e-6,
        unit="entry",
        seed=3,
        insecure_noise_seed=1,
        ledger=path,
    )
    pca(
        A,
        2,
        epsilon=1.0,
        delta=1e-6,
        iterations=2,
        clip_radius=0.5,
        insecure_noise_seed=2,
        ledger=led,
    )
    f_rec, p_rec = led.releases
    assert f_rec["contract"] == {
        "unit": "entry", "neighboring": "add-remove", "clip_norm": 1.0, "epsilon": 1.0, "delta": 1e-6,
        "accountant": "analytic-gaussian", "shape": [60, 20], "secret_noise": False, "public_operators": True,
        # the default private algorithm (two-pass) has a sparse S even with a
        # public seed: exact along the rows of X = A only
        "entry_reads": ["row"],
    }  # fmt: skip
    assert p_rec["contract"] == {
        "unit": "row", "neighboring": "add-remove", "clip_norm": 1.0, "epsilon": 1.0, "delta": 1e-6,
        "accountant": "gdp", "shape": [60, 20], "secret_noise": False, "public_operators": False,
        "entry_reads": ["row", "column"],
    }  # fmt: skip
    # entry read at row: sqrt(20); the PCA (add/remove, its default) at add/remove: 1
    z = (f_rec["noise_multiplier_total"] / math.sqrt(20)) ** -2 + p_rec[
        "noise_multiplier_total"
    ] ** -2
    np.testing.assert_allclose(
        led.remaining_summary()["noise_multiplier_total"], z**-0.5, rtol=1e-12
    )


def test_a_ledger_created_by_a_release_declares_the_release_contract(
    tmp_path: pathlib.Path,
) -> None:
    """A ledger written at the first charge (``budget=``) declares that release's unit
    and relation; a stream's population ledger, created by it, declares its entities."""
    from pipeline.api import factorize, pca
    from pipeline.jobs.stream import stream_init

    A = np.random.default_rng(8).normal(size=(60, 20)) / 10
    budget = (50.0, 1e-3)
    pca(A, 2, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.5, insecure_noise_seed=2,
        ledger=tmp_path / "p.json", budget=budget)  # fmt: skip
    factorize(A, 2, epsilon=1.0, delta=1e-6, unit="column", insecure_noise_seed=1,
              ledger=tmp_path / "f.json", budget=budget)  # fmt: skip
    stream_init(tmp_path / "s.stream", n_rows=40, n_cols=10, rank=2, horizon=4, epsilon=1.0,
                delta=1e-6, neighboring="replace", ledger=tmp_path / "s.json",
                budget=budget)  # fmt: skip
    declared = {
        name: json.loads((tmp_path / name).read_text())["contract"]
        for name in ("p.json", "f.json", "s.json")
    }
    assert declared == {
        "p.json": {"unit": "row", "neighboring": "add-remove"},
        "f.json": {"unit": "column", "neighboring": "add-remove"},
        "s.json": {"unit": "entity", "neighboring": "replace"},
    }


def test_a_stream_is_refused_on_a_row_ledger(
    tmp_path: pathlib.Path, path: pathlib.Path
) -> None:
    from pipeline.jobs.stream import stream_init

    Ledger.create(path, dataset="d", epsilon=100.0, delta=1e-3)
    before = path.read_bytes()
    state = tmp_path / "s.stream"
    with pytest.raises(PrivacyConfigError, match="release is at unit 'entity'"):
        stream_init(
            state,
            n_rows=40,
            n_cols=10,
            rank=2,
            horizon=4,
            epsilon=1.0,
            delta=1e-6,
            ledger=path,
        )
    assert not state.exists()
    assert path.read_bytes() == before
    # Negative control: on an entity ledger the stream is charged.
    ent = tmp_path / "entities.json"
    Ledger.create(ent, dataset="d", epsilon=100.0, delta=1e-3, unit="entity")
    stream_init(
        state,
        n_rows=40,
        n_cols=10,
        rank=2,
        horizon=4,
        epsilon=1.0,
        delta=1e-6,
        ledger=ent,
    )
    (rec,) = Ledger.open(ent).releases
    assert rec["contract"]["unit"] == "entity"


# -- the command line ---------------------------------------------------------------------
def test_cli_declares_shows_and_refuses(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    store = tmp_path / "A.zarr"
    z = zarr.create_array(store=store, shape=(40, 10), chunks=(20, 10), dtype="float64")
    z[...] = np.random.default_rng(3).normal(size=(40, 10))
    ledger = tmp_path / "A.zarr.dplr-ledger.json"
    budget = ["--epsilon", "10", "--delta", "1e-4"]
    assert (
        main(
            [
                "budget",
                "init",
                str(store),
                *budget,
                "--unit",
                "column",
                "--neighboring",
                "replace",
            ]
        )
        == 0
    )
    assert "for one column under replace neighbours" in capsys.readouterr().out
    assert json.loads(ledger.read_text())["contract"] == {
        "unit": "column",
        "neighboring": "replace",
    }
    assert main(["budget", "show", str(store), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["unit"], shown["neighboring"]) == ("column", "replace")
    before = ledger.read_bytes()
    # a row release on the column ledger: exit 2, one line, nothing read, written or charged
    out = tmp_path / "out.zarr"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "factorize", str(store), "--rank", "2", "--out", str(out),
         "--epsilon", "1", "--delta", "1e-6"],
        capture_output=True, text=True, timeout=180, check=False,
        env={k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith(
        "dplr: error: this ledger composes releases at unit 'column'"
    )
    assert "dplr budget init --unit row --neighboring add-remove" in lines[0]
    assert ledger.read_bytes() == before
    assert not out.exists()
