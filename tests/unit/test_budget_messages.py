"""What a refused release says about the budget, and the advice of ledger errors.

A refusal states, in epsilon at the budget's delta, what the release needs and
what is left; the numbers are recomputed here from the ledger's own
``spent()`` (the composed epsilon at the budget's delta), so the message can
only pass if it states exactly those public quantities.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchRequest,
    calibrate_release,
)
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.ledger import Ledger
from pipeline.cli.main import main
from pipeline.errors import BudgetExceededError, StoreLayoutError


def _exact(epsilon: float, delta: float) -> ReleaseCalibration:
    """A release with exact sensitivity (``delta_JL = 0``), like a PCA run."""
    return calibrate_release(
        [SketchRequest(name="Y", shape=(50, 10), jl_dims=(), weight=1.0)],
        epsilon=epsilon, delta=delta, frobenius_bound=1.0, n_sketch_matrices=0,
    )  # fmt: skip


def _contract(cal: ReleaseCalibration, neighboring: str = "add-remove") -> PrivacyContract:
    return PrivacyContract(
        unit="row", neighboring=neighboring, clip_norm=1.0, epsilon=cal.epsilon,
        delta=cal.delta, accountant="analytic-gaussian", shape=(50, 10),
    )  # fmt: skip


def _charge(led: Ledger, n: int, neighboring: str = "add-remove") -> None:
    for i in range(n):
        cal = _exact(1.0, 1e-7)
        led.charge(cal, contract=_contract(cal, neighboring), release_id=f"r{i}",
                   algorithm="power", details={})  # fmt: skip


def _numbers(message: str) -> tuple[float, float, float]:
    """(needs, left, budget epsilon) as the message states them."""
    found = re.search(
        r"needs epsilon = ([0-9.]+) at delta = 1e-06; ([0-9.]+) of epsilon = "
        r"([0-9.]+) is left",
        message,
    )
    assert found is not None, message
    return float(found[1]), float(found[2]), float(found[3])


def test_a_refusal_says_what_the_release_needs_and_what_is_left(
    tmp_path: pathlib.Path,
) -> None:
    # docs/privacy.md's example: four (1, 1e-7) releases fit in (2, 1e-6), the fifth not
    led = Ledger.create(tmp_path / "d.json", dataset="d", epsilon=2.0, delta=1e-6)
    _charge(led, 4)
    spent_4 = led.spent()[0]
    cal = _exact(1.0, 1e-7)
    with pytest.raises(BudgetExceededError) as refused:
        led.check(cal, contract=_contract(cal))
    needs, left, budget = _numbers(str(refused.value))
    assert budget == 2.0
    # what is left: the budget minus the composed epsilon of the four, at delta_B
    assert left == pytest.approx(2.0 - spent_4, abs=0.005)  # printed with 2 decimals
    # what it needs: the composed epsilon of all five minus that of the four
    # (computed on a throwaway ledger without budget checks)
    probe = Ledger.create(tmp_path / "p.json", dataset="p", epsilon=10.0, delta=1e-6)
    _charge(probe, 5)
    assert needs == pytest.approx(probe.spent()[0] - spent_4, abs=0.005)
    assert needs > left  # negative control: a refusal whose numbers would fit is wrong
    assert "composed delta" not in str(refused.value)


def test_a_converted_release_is_stated_in_epsilon_not_in_mu(tmp_path: pathlib.Path) -> None:
    # an add-remove release on a replace ledger: its mu counts twice
    led = Ledger.create(
        tmp_path / "d.json", dataset="d", epsilon=2.0, delta=1e-6, neighboring="replace"
    )
    _charge(led, 1)
    cal = _exact(1.0, 1e-7)
    with pytest.raises(BudgetExceededError) as refused:
        led.charge(cal, contract=_contract(cal), release_id="x", algorithm="power",
                   details={})  # fmt: skip
    message = str(refused.value)
    assert "mu counts" not in message
    needs, left, _ = _numbers(message)
    assert needs > left
    assert "unit 'row' under 'replace' neighbours" in message


def test_a_first_release_over_a_new_budget_says_the_whole_budget_is_left() -> None:
    cal = _exact(1.0, 1e-7)
    with pytest.raises(BudgetExceededError) as refused:
        Ledger.check_against_budget(cal, contract=_contract(cal), epsilon=0.5, delta=1e-6)
    needs, left, budget = _numbers(str(refused.value))
    assert (left, budget) == (0.5, 0.5)
    assert needs == pytest.approx(0.8959, abs=0.005)  # (1, 1e-7) read at delta 1e-6


def test_cli_ledger_errors_name_commands_and_python_keeps_python(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "d.zarr"
    # no ledger yet: the CLI names `dplr budget init`, the API Ledger.create
    assert main(["budget", "show", str(store)]) == 2
    err = capsys.readouterr().err
    assert "dplr budget init" in err, err
    assert "--epsilon" in err, err
    assert "Ledger." not in err, err
    with pytest.raises(StoreLayoutError, match=r"Ledger\.create\(path"):
        Ledger.open(tmp_path / "d.zarr.dplr-ledger.json")
    # declared twice: the CLI names `dplr budget show`, the API Ledger.open
    args = ["budget", "init", str(store), "--epsilon", "2", "--delta", "1e-6"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "dplr budget show" in err, err
    assert "cannot be reset" in err, err
    assert "Ledger." not in err, err
    with pytest.raises(StoreLayoutError, match=r"Ledger\.open\(path\)"):
        Ledger.create(tmp_path / "d.zarr.dplr-ledger.json", dataset="d", epsilon=2.0,
                      delta=1e-6)  # fmt: skip
