"""What the PCA's docs, docstrings, reports and refusals say agrees with the code.

Each test recomputes or reruns what a text states: the calibration table of
docs/pca.md from the calibration code, ``pipeline.api.pca``'s description of
``select`` from the accountant the default selection actually uses, a report's
top-level ``neighboring`` from its own contract, and the refusal of
``DPPCA(centre=True, select=True)`` from the selection's accounting.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline import api
from pipeline.accounting import pca as pca_accounting
from pipeline.accounting.pca import PcaCalibration
from pipeline.accounting.pca_paper import paper_constants
from pipeline.errors import InvalidParameterError
from pipeline.estimators import DPPCA
from pipeline.linalg.synthetic import coherent_matrix
from pipeline.params import PcaParams

ROOT = Path(__file__).resolve().parents[2]
N, D, K = 4096, 12, 2
#: The setting of docs/pca.md's calibration table.
TABLE = {"epsilon": 1.0, "delta": 1e-6, "rank": 2, "iterations": 10, "clip_radius": 0.05}
TABLE_D = 64


def calibrate_pca(**kw: Any) -> PcaCalibration:
    """:func:`pca_accounting.calibrate_pca` of the power method on ``TABLE_D`` columns."""
    return pca_accounting.calibrate_pca(
        PcaParams(method="power", **kw), n_features=TABLE_D
    )
#: What a report says of each relation (docs/privacy.md, "Neighbouring relations").
RELATION_WORDS = {
    "add-remove": ("present or a zero row", "n public"),
    "replace": ("replaced", "n public"),
}


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return coherent_matrix(N, D, K, support=N, top=300, bottom=60, rng=3).A


def _table_row(label: str) -> str:
    rows = [r for r in (ROOT / "docs/pca.md").read_text().splitlines() if r.startswith(f"| {label}")]
    assert len(rows) == 1, rows
    return rows[0]


def _numbers(cell: str, name: str) -> list[float]:
    """The values written ``name = <number>`` in a table cell."""
    return [float(v) for v in re.findall(rf"{re.escape(name)} = ([0-9.]+)", cell)]


def test_the_calibration_table_of_docs_pca_is_what_the_code_computes() -> None:
    """Old docs: "dplr default" Delta = 53.4, the replace relation with [P]'s
    sensitivity 2; the default (add-remove) gives 26.72."""
    paper = paper_constants(TABLE["epsilon"], TABLE["delta"], TABLE["iterations"])
    default = calibrate_pca(**TABLE)
    replace = calibrate_pca(**TABLE, neighboring="replace")
    assert default.neighboring == "add-remove"  # the code's default relation
    _, p_cell, d_cell, _ = _table_row("noise per iteration, T = 10").split("|")[1:]
    # values are written to the digits shown: half a unit of the last digit
    np.testing.assert_allclose(_numbers(p_cell, "Δ"), [paper["noise_iter"]], rtol=0, atol=0.05)
    delta = _numbers(d_cell, "Δ")
    np.testing.assert_allclose(delta, [default.noise_H], rtol=0, atol=0.005)
    np.testing.assert_allclose(default.noise_Z, default.noise_H, rtol=1e-12, atol=0)
    np.testing.assert_allclose(_numbers(d_cell, "Δ_H"), [replace.noise_H], rtol=0, atol=0.005)
    np.testing.assert_allclose(_numbers(d_cell, "Δ_Z"), [replace.noise_Z], rtol=0, atol=0.005)
    ratios = [int(r) for r in re.findall(r"(\d+)\N{MULTIPLICATION SIGN} less", d_cell)]
    assert ratios == [
        round(paper["noise_iter"] / default.noise_H),
        round(paper["noise_iter"] / replace.noise_Z),
    ]
    _, p_eps, d_eps, _ = _table_row("realised ε at nominal").split("|")[1:]
    paper_cal = calibrate_pca(**TABLE, accounting="paper", sensitivity="paper",
                              neighboring="replace")  # fmt: skip
    first = [float(re.findall(r"[0-9.]+", c)[0]) for c in (p_eps, d_eps)]
    want = [paper_cal.realised_epsilon(), default.realised_epsilon()]
    np.testing.assert_allclose(first, want, rtol=0, atol=5e-4)


def _doc_entry(doc: str, name: str) -> str:
    """The text of parameter ``name`` in a numpy-style docstring."""
    m = re.search(rf"\n    {name} : [^\n]*\n((?:        [^\n]*\n)+)", doc)
    assert m is not None, name
    return " ".join(m.group(1).split())


def test_the_docstring_of_select_describes_the_default_selection(data: np.ndarray) -> None:
    """Old docstring: ``select`` was "Papernot-Steinke random stopping ...
    accounted with RDP", while the default runs every candidate once (mu-GDP)."""
    assert api.pca.__doc__ is not None
    select = _doc_entry(api.pca.__doc__, "select")
    trials = _doc_entry(api.pca.__doc__, "expected_trials")
    kw: dict[str, Any] = {"epsilon": 4.0, "delta": 1e-6, "select": True, "insecure_noise_seed": 4}
    default = api.pca(data, K, **kw).report
    stopped = api.pca(data, K, **kw, expected_trials=4.0).report
    assert default["accountant"].startswith("gdp")
    assert stopped["accountant"].startswith("rdp")
    assert "every candidate once" in default["accountant"]
    assert "every candidate runs once" in select
    assert "mu-GDP" in select
    for sentence in re.split(r"(?<=\.) ", select):
        if "random stopping" in sentence or "RDP" in sentence:
            assert "expected_trials" in sentence, sentence
    assert "None" in trials
    assert "every candidate once" in trials


def _relation_ok(report: dict[str, Any]) -> None:
    relation = report["contract"]["neighboring"]
    for words in RELATION_WORDS[relation]:
        assert words in report["neighboring"], (relation, report["neighboring"])
    other = next(r for r in RELATION_WORDS if r != relation)
    assert RELATION_WORDS[other][0] not in report["neighboring"]


@pytest.mark.parametrize("neighboring", ["add-remove", "replace"])
def test_a_pca_report_states_the_relation_of_its_contract(
    data: np.ndarray, neighboring: str
) -> None:
    """Old reports: "add or remove one row" (the relation is "a row present or a
    zero row, n public"); a centred fit's said "replace one row" (the relation
    its centred PCA is calibrated for) under an add-remove contract."""
    kw: dict[str, Any] = {"epsilon": 2.0, "delta": 1e-6, "neighboring": neighboring,
                          "insecure_noise_seed": 1}  # fmt: skip
    fixed = api.pca(data, K, iterations=2, clip_radius=0.1, **kw).report
    selected = api.pca(data, K, select=True, **kw).report
    del kw["insecure_noise_seed"]
    centred = DPPCA(K, n_iter=2, clip_radius=0.1, centre=True, insecure_noise=True,
                    random_state=1, **kw).fit(data).privacy_report_  # fmt: skip
    for report in (fixed, selected, centred):
        assert report["contract"]["neighboring"] == neighboring  # what is checked
        _relation_ok(report)


def test_negative_control_the_relation_check_fails_on_the_other_relation() -> None:
    report = {"contract": {"neighboring": "add-remove"},
              "neighboring": "one row replaced by another, n public"}  # fmt: skip
    with pytest.raises(AssertionError):
        _relation_ok(report)


def test_the_refusal_of_a_centred_selection_cites_no_accounting_it_does_not_use(
    data: np.ndarray,
) -> None:
    """Old message: "the selection is accounted in Renyi DP, not as a Gaussian
    mechanism", but the default selection is accounted as one (mu-GDP)."""
    default = api.pca(data, K, epsilon=4.0, delta=1e-6, select=True,
                      insecure_noise_seed=4).report  # fmt: skip
    assert default["accountant"].startswith("gdp")
    with pytest.raises(InvalidParameterError) as exc:
        DPPCA(K, epsilon=4.0, delta=1e-6, select=True, centre=True).fit(data)
    message = str(exc.value)
    assert "centre=False" in message  # the refusal this test is about
    for claim in ("Renyi", "Rényi", "RDP", "not as a Gaussian"):
        assert claim not in message, message
    doc = DPPCA.__doc__ or ""
    assert "accounted in Renyi DP, not as a Gaussian" not in " ".join(doc.split())
