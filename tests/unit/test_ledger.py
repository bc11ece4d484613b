"""Persistent per-dataset privacy ledger (spec section 4.4 "Privacy ledger")."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pathlib
import stat

import numpy as np
import pytest
from scipy import stats

from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchRequest,
    calibrate_release,
)
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.ledger import LEDGER_FORMAT, Ledger, default_ledger_path
from pipeline.errors import (
    BudgetExceededError,
    InvalidParameterError,
    PipelineError,
    StoreLayoutError,
)

RECORD_KEYS = {
    "release_id",
    "time",
    "algorithm",
    "epsilon",
    "delta",
    "delta_jl",
    "noise_multiplier_total",
    "details",
    "contract",
}


def _calibration(epsilon: float = 1.0, delta: float = 1e-6) -> ReleaseCalibration:
    return calibrate_release(
        [
            SketchRequest(name="Y", shape=(100, 40), jl_dims=(40,), weight=0.5),
            SketchRequest(name="Z", shape=(160, 80), jl_dims=(160,), weight=0.5),
        ],
        epsilon=epsilon,
        delta=delta,
        frobenius_bound=1.0,
        n_sketch_matrices=2,
    )


def _contract(cal: ReleaseCalibration) -> PrivacyContract:
    """A row, add/remove release (Delta_F = C = 1) with ``cal``'s budget."""
    return PrivacyContract(
        unit="row", neighboring="add-remove", clip_norm=1.0, epsilon=cal.epsilon,
        delta=cal.delta, accountant="analytic-gaussian", shape=(100, 80),
    )  # fmt: skip


def _oracle_delta(z: float, eps: float) -> float:
    """[BW18, Thm 8] in its textbook form (independent of the module's log space)."""
    return float(
        stats.norm.cdf(0.5 / z - eps * z)
        - np.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z)
    )


@pytest.fixture
def ledger_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "sample.zarr.dplr-ledger.json"


def test_create_open_round_trip(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="sample", epsilon=4.0, delta=1e-5)
    again = Ledger.open(ledger_path)
    assert again.budget == led.budget == (4.0, 1e-5)
    assert again.dataset == "sample"
    assert again.releases == ()
    assert again.path == ledger_path
    assert again.spent() == (0.0, 0.0)
    data = json.loads(ledger_path.read_text())
    assert data == {
        "format": LEDGER_FORMAT,
        "dataset": "sample",
        "budget": {"epsilon": 4.0, "delta": 1e-5},
        "contract": {"unit": "row", "neighboring": "add-remove"},
        "releases": [],
    }


def test_create_refuses_existing(ledger_path: pathlib.Path) -> None:
    Ledger.create(ledger_path, dataset="sample", epsilon=4.0, delta=1e-5)
    before = ledger_path.read_bytes()
    with pytest.raises(PipelineError, match="already exists"):
        Ledger.create(ledger_path, dataset="sample", epsilon=100.0, delta=0.5)
    assert ledger_path.read_bytes() == before


def test_file_mode_is_0600(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="sample", epsilon=4.0, delta=1e-5)
    assert stat.S_IMODE(os.stat(ledger_path).st_mode) == 0o600
    led.charge(
        _calibration(),
        contract=_contract(_calibration()),
        release_id="r1",
        algorithm="spectral",
        details={},
    )
    # os.replace swaps in a new inode: the mode must survive rewrites.
    assert stat.S_IMODE(os.stat(ledger_path).st_mode) == 0o600


def test_two_releases_compose_exactly(ledger_path: pathlib.Path) -> None:
    eps_b, delta_b = 3.0, 1e-5
    led = Ledger.create(ledger_path, dataset="sample", epsilon=eps_b, delta=delta_b)
    cal1, cal2 = _calibration(1.0, 1e-6), _calibration(0.5, 2e-6)
    rec1 = led.charge(
        cal1,
        contract=_contract(cal1),
        release_id="r1",
        algorithm="spectral",
        details={"k": 5},
    )
    rec2 = led.charge(
        cal2,
        contract=_contract(cal2),
        release_id="r2",
        algorithm="low_space",
        details={"k": 7},
    )
    assert set(rec1) == set(rec2) == RECORD_KEYS
    assert rec1["noise_multiplier_total"] == 1.0 / cal1.effective_sensitivity

    z1, z2 = 1.0 / cal1.effective_sensitivity, 1.0 / cal2.effective_sensitivity
    z_tot = (z1**-2 + z2**-2) ** -0.5
    expected = _oracle_delta(z_tot, eps_b) + cal1.delta_jl + cal2.delta_jl
    eps_used, delta_used = Ledger.open(ledger_path).spent()
    # Same formula evaluated by scipy.stats instead of log_ndtr; the composed
    # delta is ~1e-6 here, so the direct form loses nothing beyond 1e-9 relative.
    np.testing.assert_allclose(delta_used, expected, rtol=1e-9, atol=0)
    assert delta_used < delta_b
    # epsilon_used is where the composed Gaussian meets delta_B - sum delta_JL.
    room = delta_b - cal1.delta_jl - cal2.delta_jl
    assert _oracle_delta(z_tot, eps_used) <= room * (1 + 1e-9)
    assert _oracle_delta(z_tot, eps_used * 0.999) > room
    assert eps_used < eps_b
    summary = led.remaining_summary()
    assert summary["n_releases"] == 2
    assert summary["delta_used"] == delta_used


def test_over_budget_leaves_file_identical(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="sample", epsilon=1.0, delta=1.5e-6)
    led.charge(
        _calibration(),
        contract=_contract(_calibration()),
        release_id="r1",
        algorithm="spectral",
        details={},
    )
    before = ledger_path.read_bytes()
    with pytest.raises(
        BudgetExceededError, match="would exceed the dataset's lifetime budget"
    ):
        led.check(_calibration(), contract=_contract(_calibration()))
    with pytest.raises(
        BudgetExceededError,
        match=r"needs epsilon = [0-9.]+ at delta = 1\.5e-06; [0-9.]+ of epsilon = "
        r"1\.00 is left",
    ):
        led.charge(
            _calibration(),
            contract=_contract(_calibration()),
            release_id="r2",
            algorithm="spectral",
            details={},
        )
    assert ledger_path.read_bytes() == before
    assert len(Ledger.open(ledger_path).releases) == 1


def test_single_release_fits_its_own_budget(ledger_path: pathlib.Path) -> None:
    # A release calibrated to exactly the budget fits: LEDGER_CHECK slack only.
    led = Ledger.create(ledger_path, dataset="sample", epsilon=1.0, delta=1e-6)
    led.check(_calibration(1.0, 1e-6), contract=_contract(_calibration(1.0, 1e-6)))
    # Negative control: a release at a larger epsilon than the budget does not.
    with pytest.raises(BudgetExceededError):
        led.check(_calibration(1.5, 1e-6), contract=_contract(_calibration(1.5, 1e-6)))


def test_refuses_infinite_epsilon(ledger_path: pathlib.Path) -> None:
    import dataclasses

    led = Ledger.create(ledger_path, dataset="sample", epsilon=1.0, delta=1e-6)
    cal = dataclasses.replace(_calibration(), epsilon=math.inf)
    with pytest.raises(
        InvalidParameterError, match=r"calibration\.epsilon must be finite"
    ):
        led.charge(
            cal,
            contract=_contract(_calibration()),
            release_id="r",
            algorithm="spectral",
            details={},
        )


def test_duplicate_release_id(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="sample", epsilon=10.0, delta=1e-3)
    led.charge(
        _calibration(),
        contract=_contract(_calibration()),
        release_id="r1",
        algorithm="spectral",
        details={},
    )
    with pytest.raises(InvalidParameterError, match="release_id must be unique"):
        led.charge(
            _calibration(),
            contract=_contract(_calibration()),
            release_id="r1",
            algorithm="spectral",
            details={},
        )


def test_no_secrets_in_records(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="sample", epsilon=10.0, delta=1e-3)
    cal = _calibration()
    details = {"k": 5, "calibration": cal.to_dict(), "sketch_seed_hash": "ab12"}
    led.charge(
        cal,
        contract=_contract(cal),
        release_id="r1",
        algorithm="spectral",
        details=details,
    )
    data = json.loads(ledger_path.read_text())
    assert set(data) == {"format", "dataset", "budget", "contract", "releases"}
    (record,) = data["releases"]
    assert set(record) == RECORD_KEYS
    # Negative control: the API refuses details that would carry a seed or key.
    for bad in ({"sketch_seed": 1}, {"noise_key": "00ff"}, {"nested": {"seed": 3}}):
        with pytest.raises(InvalidParameterError, match="must not carry seeds or keys"):
            led.charge(
                cal,
                contract=_contract(cal),
                release_id="r2",
                algorithm="spectral",
                details=bad,
            )
    assert len(Ledger.open(ledger_path).releases) == 1


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "is not valid JSON"),
        ('{"format": "other/9", "releases": []}', "must have format 'dplr-ledger/2'"),
        ("[]", "must have format"),
        (
            (
                '{"format": "dplr-ledger/1", "dataset": "d", "budget": {"epsilon": 1, '
                '"delta": 0}, "releases": []}'
            ),
            "invalid budget",
        ),
    ],
)
def test_corrupt_file_gives_clear_error(
    ledger_path: pathlib.Path, content: str, match: str
) -> None:
    ledger_path.write_text(content)
    with pytest.raises(StoreLayoutError, match=match):
        Ledger.open(ledger_path)


def test_missing_file(ledger_path: pathlib.Path) -> None:
    with pytest.raises(StoreLayoutError, match=r"not found.*Ledger\.create"):
        Ledger.open(ledger_path)


@pytest.mark.parametrize(
    ("store", "expected"),
    [
        ("data/sample.zarr", "data/sample.zarr.dplr-ledger.json"),
        ("data/sample.zarr/", "data/sample.zarr.dplr-ledger.json"),
        (pathlib.Path("/x/y.zarr"), "/x/y.zarr.dplr-ledger.json"),
    ],
)
def test_default_ledger_path(store: str | pathlib.Path, expected: str) -> None:
    assert default_ledger_path(store) == pathlib.Path(expected)


def _charge_worker(
    path: str, release_id: str, barrier: object, results: object
) -> None:
    """Runs in a spawned process: one charge attempt against a shared ledger."""
    cal = _calibration()
    led = Ledger.open(path)
    barrier.wait()  # type: ignore[attr-defined]  # both attempt at once
    try:
        led.charge(
            cal,
            contract=_contract(cal),
            release_id=release_id,
            algorithm="spectral",
            details={},
        )
    except BudgetExceededError:
        results.put((release_id, "refused"))  # type: ignore[attr-defined]
    else:
        results.put((release_id, "charged"))  # type: ignore[attr-defined]


def test_concurrent_charges_admit_exactly_one(ledger_path: pathlib.Path) -> None:
    # One release uses delta = 1e-6; two would use far more than 1.5e-6. Both
    # processes opened the ledger while it was empty, so only the re-read
    # under the lock can stop the second one.
    Ledger.create(ledger_path, dataset="sample", epsilon=1.0, delta=1.5e-6)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_charge_worker, args=(str(ledger_path), rid, barrier, results)
        )
        for rid in ("a", "b")
    ]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert sorted(outcomes.values()) == ["charged", "refused"]
    (record,) = Ledger.open(ledger_path).releases
    assert outcomes[record["release_id"]] == "charged"
    # No temporary files are left next to the ledger.
    leftovers = {p.name for p in ledger_path.parent.iterdir()}
    assert leftovers == {ledger_path.name, ledger_path.name + ".lock"}


def test_create_in_missing_directory(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreLayoutError, match="does not exist"):
        Ledger.create(
            tmp_path / "nope" / "l.json", dataset="d", epsilon=1.0, delta=1e-6
        )
