"""The ledger composes frozen event descriptions, not calibration classes.

A new kind of mechanism plugs in by defining an event class (its terms, its
reading at another contract, its record): the ledger charges it, writes it,
reads it back and composes it with the Gaussians, with no edit of
``pipeline/accounting/ledger.py`` or of :func:`compose`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import pathlib
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

import pipeline.accounting.ledger as ledger_module
from pipeline.accounting.calibration import SketchRequest, calibrate_release
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.events import (
    EventTerms,
    GaussianEvent,
    PrivacyEvent,
    compose,
)
from pipeline.accounting.gaussian import gaussian_delta, gaussian_epsilon
from pipeline.accounting.ledger import Ledger
from pipeline.errors import InvalidParameterError, StoreLayoutError


@dataclasses.dataclass(frozen=True, slots=True)
class PureDpEvent(PrivacyEvent):
    """A pure epsilon-DP mechanism (e.g. Laplace), defined only in this test."""

    kind: ClassVar[str | None] = "pure-dp-test"
    gaussian: ClassVar[bool] = False

    epsilon: float

    def terms(self) -> EventTerms:
        return EventTerms(epsilons=(self.epsilon,), deltas=(0.0,))

    def read_at(self, factor: float) -> PureDpEvent:
        return PureDpEvent(int(factor) * self.epsilon)  # group privacy, pure DP

    def record_fields(self) -> dict[str, Any]:
        return {"delta_jl": 0.0, "noise_multiplier_total": None, "kind": self.kind,
                "epsilon_pure": self.epsilon}  # fmt: skip

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], where: str) -> PureDpEvent:
        return cls(float(rec["epsilon_pure"]))


@dataclasses.dataclass(frozen=True)
class PureCalibration:
    """A calibration of the new kind: the four members a ledger asks for."""

    epsilon: float
    delta: float = 1e-12  # the contract's; the event itself is pure
    event: object = None

    def check(self) -> None:
        pass

    def privacy_event(self) -> object:
        return PureDpEvent(self.epsilon) if self.event is None else self.event


def _pure_contract(epsilon: float) -> PrivacyContract:
    return PrivacyContract(
        unit="row", neighboring="add-remove", clip_norm=1.0, epsilon=epsilon,
        delta=1e-12, accountant="rdp", shape=(10, 5),
    )  # fmt: skip


def _gaussian_release() -> tuple[Any, PrivacyContract]:
    cal = calibrate_release(
        [SketchRequest(name="Y", shape=(10, 5), jl_dims=(), weight=1.0)],
        epsilon=1.0, delta=1e-6, frobenius_bound=1.0, n_sketch_matrices=0,
    )  # fmt: skip
    con = PrivacyContract(
        unit="row", neighboring="add-remove", clip_norm=1.0, epsilon=1.0, delta=1e-6,
        accountant="analytic-gaussian", shape=(10, 5),
    )  # fmt: skip
    return cal, con


def test_compose_adds_a_new_event_kind_by_its_terms() -> None:
    z = 2.0
    both = compose([GaussianEvent(z), PureDpEvent(0.5)])
    assert (both.epsilon_approx, both.delta_fixed) == (0.5, 0.0)
    # the Gaussian gets what the pure part leaves [DR14, Thm 3.16]; z_tot = (z^-2)^-1/2
    # is z up to two roundings, hence the relative 1e-12
    assert both.delta_at(2.0) == pytest.approx(gaussian_delta(z, 1.5), rel=1e-12)
    assert both.epsilon_at(1e-6) == pytest.approx(0.5 + gaussian_epsilon(z, 1e-6), rel=1e-12)


def test_a_new_event_kind_is_charged_written_and_read_back(tmp_path: pathlib.Path) -> None:
    # the new kind (pure 0.5, then 0.25) composes with a Gaussian (1, 1e-6) release
    led = Ledger.create(tmp_path / "d.json", dataset="d", epsilon=3.0, delta=1e-5)
    cal, con = _gaussian_release()
    led.charge(cal, contract=con, release_id="g", algorithm="spectral", details={})
    for i, eps in enumerate((0.5, 0.25)):
        led.charge(PureCalibration(eps), contract=_pure_contract(eps),  # type: ignore[arg-type]
                   release_id=f"p{i}", algorithm="laplace", details={})  # fmt: skip
    record = json.loads(led.path.read_text())["releases"][1]
    assert (record["kind"], record["epsilon_pure"]) == ("pure-dp-test", 0.5)
    eps_used, delta_used = Ledger.open(led.path).spent()
    z = 1.0 / cal.effective_sensitivity
    # exact: the same fsum of the same terms in the same formula
    assert delta_used == gaussian_delta(z, 3.0 - 0.75)
    assert eps_used == 0.75 + gaussian_epsilon(z, 1e-5)
    # read on a replace ledger, the add-remove pure releases count as groups of 2
    rep = Ledger.create(tmp_path / "r.json", dataset="r", epsilon=3.0, delta=1e-5,
                        neighboring="replace")  # fmt: skip
    rep.charge(PureCalibration(0.5), contract=_pure_contract(0.5),  # type: ignore[arg-type]
               release_id="p", algorithm="laplace", details={})  # fmt: skip
    assert Ledger.open(rep.path).spent() == (1.0, 0.0)


def test_what_is_not_an_event_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidParameterError, match="PrivacyEvent"):
        compose([GaussianEvent(1.0), (1.0, 0.0)])  # type: ignore[list-item]
    led = Ledger.create(tmp_path / "d.json", dataset="d", epsilon=3.0, delta=1e-5)
    fake = PureCalibration(0.5, event={"epsilon": 0.5})  # describes, but not as an event
    with pytest.raises(InvalidParameterError, match=r"privacy_event\(\) must return"):
        led.charge(fake, contract=_pure_contract(0.5), release_id="x",  # type: ignore[arg-type]
                   algorithm="laplace", details={})  # fmt: skip
    with pytest.raises(InvalidParameterError, match="calibration must be"):
        led.check(object(), contract=_pure_contract(0.5))  # type: ignore[arg-type]
    assert Ledger.open(led.path).releases == ()
    # a record of a kind no event class defines is refused when the file is read
    led.charge(PureCalibration(0.5), contract=_pure_contract(0.5),  # type: ignore[arg-type]
               release_id="p", algorithm="laplace", details={})  # fmt: skip
    data = json.loads(led.path.read_text())
    data["releases"][0]["kind"] = "unknown-kind"
    led.path.write_text(json.dumps(data))
    with pytest.raises(StoreLayoutError, match="must have kind 'approx'"):
        Ledger.open(led.path)


def test_the_ledger_knows_no_calibration_class() -> None:
    """The composer imports events, never a calibration module (no isinstance branches)."""
    tree = ast.parse(inspect.getsource(ledger_module))
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    }
    assert "pipeline.accounting.events" in imported  # negative control: the scan sees it
    calibrations = {"pipeline.accounting.calibration", "pipeline.accounting.pca",
                    "pipeline.accounting.pca_random_stopping",
                    "pipeline.accounting.pca_selection"}  # fmt: skip
    assert not imported & calibrations
