"""``dplr budget show``: a readable table, and ``--json`` for machines (as a subprocess)."""

from __future__ import annotations

import json
import pathlib

import pytest
from cli_util import run_dplr

from pipeline.accounting.calibration import SketchRequest, calibrate_release
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.ledger import Ledger


def _ledger_with_releases(tmp_path: pathlib.Path, n: int) -> tuple[pathlib.Path, Ledger]:
    """A (2, 1e-6) row ledger beside ``d.zarr`` with ``n`` exact (1, 1e-7) releases."""
    store = tmp_path / "d.zarr"
    led = Ledger.create(
        tmp_path / "d.zarr.dplr-ledger.json", dataset="d.zarr", epsilon=2.0, delta=1e-6
    )
    for i in range(n):
        cal = calibrate_release(
            [SketchRequest(name="Y", shape=(50, 10), jl_dims=(), weight=1.0)],
            epsilon=1.0, delta=1e-7, frobenius_bound=1.0, n_sketch_matrices=0,
        )  # fmt: skip
        contract = PrivacyContract(
            unit="row", neighboring="add-remove", clip_norm=1.0, epsilon=1.0,
            delta=1e-7, accountant="analytic-gaussian", shape=(50, 10),
        )  # fmt: skip
        led.charge(cal, contract=contract, release_id=f"r{i}", algorithm="power",
                   details={}, stamp=f"2031-05-0{i + 1}T10:00:00+00:00")  # fmt: skip
    return store, led


@pytest.mark.timeout(120)
def test_budget_show_prints_a_table_and_json_keeps_the_machine_form(
    tmp_path: pathlib.Path,
) -> None:
    store, led = _ledger_with_releases(tmp_path, 4)
    proc = run_dplr("budget", "show", store, timeout=110)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    with pytest.raises(json.JSONDecodeError):  # not the machine form
        json.loads(out)
    spent = led.spent()[0]  # the composed epsilon at the budget's delta
    assert 1.89 < spent < 1.91  # docs/privacy.md: four epsilon=1 releases fit in 2
    lines = out.splitlines()
    budget = next(x for x in lines if x.startswith("budget"))
    assert "epsilon 2" in budget, out
    assert "delta 1e-06" in budget, out
    assert "one row under add-remove neighbours" in budget, out
    assert f"epsilon {spent:.2f} at delta 1e-06" in next(
        x for x in lines if x.startswith("spent")
    ), out
    assert f"epsilon {2.0 - spent:.2f} at delta 1e-06" in next(
        x for x in lines if x.startswith("left")
    ), out
    rows = [x.split() for x in lines if x.startswith("2031-05-0")]
    assert rows == [
        [f"2031-05-0{i}", "power", "1", "1e-07", "row", "add-remove"] for i in (1, 2, 3, 4)
    ], out
    # --json: exactly the machine form of before
    proc = run_dplr("budget", "show", store, "--json", timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "path": str(led.path),
        **Ledger.open(led.path).remaining_summary(),
        "releases": 4,
    }
