"""Every in-memory release of a process composes in one accountant unless a dataset is named.

Without a persistent ledger, an in-memory (numpy or dask) release is charged to
an accountant that lives in the process. It used to be found by a digest of the
array's bytes, so ``A``, ``A.astype(np.float32)`` and ``A[::-1]`` -- the same
people -- each got a fresh accountant and each report said ``n_releases = 1``,
``epsilon_used = 1.0`` after three releases at epsilon = 1. The process cannot
tell which arrays hold the same people, so by default it composes all of them
(over-charging a caller with several populations, never under-reporting); a
caller that knows better names the population: ``dataset="name"``. The
accountant of unnamed inputs refuses nothing some matrix unit covers: a column
release after row releases turns its reading to the entry unit.

The expected epsilons come from the textbook mu-GDP profile [DRS22, Cor. 2.13]
solved with brentq, independently of dplr's accounting code: the three releases
are Gaussian mechanisms of ``mu_i = report["calibration"]["effective_sensitivity"]``
(``delta_JL = 0`` for the default algorithm on this shape), composed as one
``sqrt(sum mu_i^2)``-GDP mechanism [DRS22, Cor. 3.3], and the in-process
accountant states its epsilon at the sum of the releases' deltas.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.errors import InvalidParameterError
from pipeline.estimators import DPPCA, DPLowRank
from pipeline.params import PcaParams

EPS, DELTA = 1.0, 1e-6

# Run in a fresh interpreter: the default accountant is the process's own, and
# the test must see exactly the releases it makes, whatever ran before it.
_THREE_RELEASES = """
import json, sys
import numpy as np
from pipeline.api import factorize
A = np.random.default_rng(7).normal(size=(200, 10)) / 10
out = []
for X, unit in ((A, "row"), (A.astype(np.float32), "row"), (A[::-1], "row"), (A, "column")):
    r = factorize(X, 2, epsilon=1.0, delta=1e-6, unit=unit).report
    out.append({"ledger": r["ledger"], "calibration": r["calibration"]})
json.dump(out, sys.stdout)
"""


def _profile(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP [DRS22, Cor. 2.13]."""
    return float(
        stats.norm.cdf(-eps / mu + mu / 2)
        - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


def _eps_of(mu: float, delta: float) -> float:
    return float(
        optimize.brentq(lambda e: _profile(mu, e) - delta, 0.0, 100.0, xtol=1e-13)
    )


def _data() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(200, 10)) / 10


def _name(tag: str) -> str:
    """A public label no other test of this process uses."""
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def test_releases_on_copies_of_the_same_people_compose_by_default() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _THREE_RELEASES],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    reports = json.loads(out.stdout)
    ledgers = [r["ledger"] for r in reports]
    assert [x["kind"] for x in ledgers] == ["in-process"] * 4
    assert len({x["dataset"] for x in ledgers}) == 1
    assert [x["n_releases"] for x in ledgers] == [1, 2, 3, 4]
    mus = [r["calibration"]["effective_sensitivity"] for r in reports]
    assert all(r["calibration"]["delta_jl"] == 0.0 for r in reports)
    for i, x in enumerate(ledgers[:3]):
        assert (x["unit"], x["neighboring"]) == ("row", "add-remove")
        mu = float(np.sqrt(np.sum(np.square(mus[: i + 1]))))
        want = _eps_of(mu, (i + 1) * DELTA)
        # brentq's xtol 1e-13 plus the calibration's own solve (rtol 1e-9)
        np.testing.assert_allclose(x["epsilon_used"], want, rtol=1e-8)
        np.testing.assert_allclose(x["delta_used"], (i + 1) * DELTA, rtol=1e-12)
    # Negative control: the composed epsilon is not what one release reports,
    # so a per-array accountant (1.0 each time) fails the assertions above.
    assert ledgers[2]["epsilon_used"] > 1.5 * ledgers[0]["epsilon_used"]
    # A column release says nothing about one row: the accountant of unrelated
    # arrays refuses nothing, it reads all four at the entry unit, where an
    # entry neighbour is a replace-one row (column) neighbour: each add/remove
    # release counts 2 mu (group privacy of size 2) [DRS22, Thm 2.14].
    last = ledgers[3]
    assert (last["unit"], last["neighboring"]) == ("entry", "add-remove")
    mu = 2.0 * float(np.sqrt(np.sum(np.square(mus))))
    np.testing.assert_allclose(last["epsilon_used"], _eps_of(mu, 4 * DELTA), rtol=1e-8)


def test_named_datasets_compose_separately_through_api_and_estimators() -> None:
    A = _data()
    a, b = _name("cohort-a"), _name("cohort-b")
    kw = {"epsilon": EPS, "delta": DELTA}
    first = api.factorize(A, 2, dataset=a, **kw).report["ledger"]
    other = api.factorize(A.astype(np.float32), 2, dataset=b, **kw).report["ledger"]
    again = api.factorize(A[::-1], 2, dataset=a, **kw).report["ledger"]
    assert (first["dataset"], other["dataset"], again["dataset"]) == (a, b, a)
    assert [first["n_releases"], other["n_releases"], again["n_releases"]] == [1, 1, 2]
    # Control: one release alone is (EPS, DELTA) (up to the calibration's solve).
    np.testing.assert_allclose(first["epsilon_used"], EPS, rtol=1e-9)
    np.testing.assert_allclose(other["epsilon_used"], EPS, rtol=1e-9)
    assert again["epsilon_used"] > 1.2 * EPS

    # api.pca and both estimators forward the name to the same accountant
    pca = api.pca(A, 2, iterations=2, clip_radius=0.5, dataset=a, **kw)
    assert (pca.report["ledger"]["dataset"], pca.report["ledger"]["n_releases"]) == (a, 3)
    est = DPPCA(2, method="analyze-gauss", dataset=a, **kw).fit(A)
    assert est.privacy_report_["ledger"]["n_releases"] == 4
    centred = DPPCA(2, method="analyze-gauss", centre=True, dataset=a, **kw).fit(A)
    assert centred.privacy_report_["ledger"]["n_releases"] == 5
    low = DPLowRank(2, dataset=b, **kw).fit(A)
    assert (low.privacy_report_["ledger"]["dataset"], low.privacy_report_["ledger"]["n_releases"]) == (b, 2)


def test_a_release_a_named_accountant_cannot_read_says_how_to_name_another() -> None:
    A = _data()
    name = _name("rows")
    api.factorize(A, 2, epsilon=EPS, delta=DELTA, dataset=name)
    # a column release tells nothing about one row: no conversion, refused
    with pytest.raises(Exception, match=r"dataset=") as refused:
        api.factorize(A, 2, epsilon=EPS, delta=DELTA, unit="column", dataset=name)
    assert name in str(refused.value)
    cols = api.factorize(
        A, 2, epsilon=EPS, delta=DELTA, unit="column", dataset=_name("columns")
    )
    assert cols.report["ledger"]["unit"] == "column"


def test_a_dataset_name_is_refused_where_a_ledger_takes_the_charge(
    tmp_path: Path,
) -> None:
    A = _data()
    path = tmp_path / "d.dplr-ledger.json"
    Ledger.create(path, dataset="d", epsilon=9.0, delta=1e-4)
    before = path.read_bytes()
    with pytest.raises(InvalidParameterError, match="dataset"):
        api.factorize(A, 2, epsilon=EPS, delta=DELTA, ledger=path, dataset="d")
    assert path.read_bytes() == before
    for bad in ("", 3):
        with pytest.raises(InvalidParameterError, match="dataset"):
            api.factorize(A, 2, epsilon=EPS, delta=DELTA, dataset=bad)  # type: ignore[arg-type]


def test_an_approx_release_read_by_group_privacy_is_stated_with_its_grown_delta() -> None:
    """A selection ((epsilon, delta) at row add/remove) read by an accountant under
    replace is (2 epsilon, 2 e^epsilon delta) [Vadhan 2017, Lemma 2.2, k = 2]. The
    accountant used to state the composition at the sum of the releases' own
    deltas, which the grown term exceeds: its report failed ("delta must be in
    (0, 1)") instead of stating the larger delta."""
    from pipeline.accounting.calibration import ReleaseCalibration, SketchNoise
    from pipeline.accounting.contract import PrivacyContract
    from pipeline.accounting.gaussian import gaussian_epsilon
    from pipeline.accounting.ledger import in_process_ledger
    from pipeline.accounting.pca import calibrate_selection

    mu, sigma = 0.5, 2.0 / 0.5  # replace: Delta_F = 2C, C = 1
    gauss = ReleaseCalibration(
        epsilon=gaussian_epsilon(1.0 / mu, DELTA) * (1 + 1e-12), delta=DELTA,
        delta_mechanism=DELTA, delta_jl=0.0, n_sketch_matrices=0, beta=0.0,
        frobenius_bound=2.0, noise_multiplier=sigma / 2.0, tree_levels=1,
        sketches=(SketchNoise(name="X", shape=(1, 1), sensitivity=2.0,
                              jl_factor=1.0, weight=1.0, sigma=sigma),),
    )  # fmt: skip
    sel = calibrate_selection(
        PcaParams(rank=2, epsilon=1.0, delta=DELTA), n_rows=4096, n_features=8,
        radii=(0.1, 0.2), iteration_grid=(1, 2),
    )  # fmt: skip

    def contract(cal: object, neighboring: str, accountant: str) -> PrivacyContract:
        return PrivacyContract(
            unit="row", neighboring=neighboring, clip_norm=1.0, shape=(4096, 8),
            epsilon=cal.epsilon, delta=cal.delta, accountant=accountant,  # type: ignore[attr-defined]
        )  # fmt: skip

    first = contract(gauss, "replace", "analytic-gaussian")
    book = in_process_ledger(_name("replace-rows"), first)
    book.charge(gauss, contract=first, release_id="g", algorithm="x", details={})
    book.charge(sel, contract=contract(sel, "add-remove", "rdp"), release_id="s",
                algorithm="pca-select", details={})  # fmt: skip
    eps, delta = book.spent()
    grown = 2 * np.exp(sel.epsilon) * sel.delta
    np.testing.assert_allclose(delta, DELTA + grown, rtol=1e-12)
    # the Gaussian at its own delta, plus the selection's 2 epsilon
    np.testing.assert_allclose(eps, 2 * sel.epsilon + _eps_of(mu, DELTA), rtol=1e-8)
