"""Accounting of the DP PCA: calibration oracles, cross-checks, ledger (spec power-pca).

Oracles come from the spec (sections 2.3, 3.4, 3.5 and 5.2 P4/P5); each
tolerance names the number of digits the spec quotes. Independent closed forms
(scipy.stats instead of the package's log-space code) back the exact values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest
from scipy import optimize, stats

from pipeline.accounting import pca as pca_accounting
from pipeline.accounting.calibration import SketchRequest, calibrate_release
from pipeline.accounting.contract import PrivacyContract
from pipeline.accounting.ledger import Ledger
from pipeline.accounting.pca import (
    ACCOUNTINGS,
    SENSITIVITIES,
    PcaCalibration,
    SelectionCalibration,
    paper_constants,
    paper_selection_constants,
    pld_epsilon_of,
    selection_rdp_epsilon,
)
from pipeline.errors import (
    BudgetExceededError,
    InvalidParameterError,
    PrivacyConfigError,
    StoreLayoutError,
)
from pipeline.params import PcaParams

EPS, DELTA = 1.0, 1e-6
D, K = 64, 2
#: The spec's oracles are stated for [P]'s relation and constants (spec 3.1,
#: 3.4, 3.5): replacement of one row, Gram sensitivity 2. The package's defaults
#: (tight, add/remove) are tested in test_defaults_are_tight_and_add_remove.
SPEC_SETTING = {"sensitivity": "paper", "neighboring": "replace"}


_FIELDS = {f.name for f in dataclasses.fields(PcaParams)}


def _params(kw: dict[str, object]) -> tuple[PcaParams, dict[str, object]]:
    """``kw`` as a :class:`PcaParams` (its fields) and the other arguments."""
    fields = {n: v for n, v in kw.items() if n in _FIELDS}
    return PcaParams(**fields), {n: v for n, v in kw.items() if n not in _FIELDS}  # type: ignore[arg-type]


def calibrate_pca(**kw: object) -> PcaCalibration:
    """:func:`pca_accounting.calibrate_pca` in the spec's setting unless told
    (the power method unless told: ``PcaParams``' ``"auto"`` is the plan's)."""
    params, rest = _params({"method": "power", **SPEC_SETTING, **kw})
    return pca_accounting.calibrate_pca(params, **rest)  # type: ignore[arg-type]


def calibrate_selection(**kw: object) -> SelectionCalibration:
    """:func:`pca_accounting.calibrate_selection` in the spec's setting unless told."""
    if kw.get("sensitivity") == "tight":
        kw = {"neighboring": "replace", **kw}
    params, rest = _params({**SPEC_SETTING, **kw})
    return pca_accounting.calibrate_selection(params, **rest)  # type: ignore[arg-type]
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


def _power(**kw: object) -> PcaCalibration:
    args: dict[str, object] = {
        "epsilon": EPS,
        "delta": DELTA,
        "rank": K,
        "n_features": D,
        "iterations": 10,
        "clip_radius": 0.05,
    }
    args.update(kw)
    return calibrate_pca(**args)  # type: ignore[arg-type]


def _gdp_profile(mu: float, eps: float) -> float:
    """[BW18, Thm 8] / [DRS22, Cor. 2.13] in textbook form with scipy.stats."""
    return float(
        stats.norm.cdf(-eps / mu + mu / 2)
        - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


def _oracle_mu(eps: float, delta: float) -> float:
    return float(
        optimize.brentq(lambda m: _gdp_profile(m, eps) - delta, 1e-3, 50.0, xtol=1e-14)
    )


# --------------------------------------------------------------------------
# gdp calibration (spec 3.4, 5.2 P4)
# --------------------------------------------------------------------------
def test_gdp_oracles() -> None:
    cal = _power()
    # spec 3.4 / P4 quote mu to 4 decimals and Delta_init, Delta(T=10) to 2 and 1.
    np.testing.assert_allclose(cal.mu, 0.2367, rtol=0, atol=5e-5)
    np.testing.assert_allclose(cal.rho_total, 0.0280, rtol=0, atol=5e-5)
    np.testing.assert_allclose(cal.noise_init, 11.95, rtol=0, atol=5e-3)
    np.testing.assert_allclose(cal.noise_H, 53.4, rtol=0, atol=0.05)
    # Equal H/Z split with sensitivity 2 for both: noise_Z == noise_H.
    np.testing.assert_allclose(cal.noise_Z, cal.noise_H, rtol=1e-12, atol=0)
    # Independent oracle: mu from brentq on the scipy.stats profile; the
    # package's root is rounded up by ~1e-15, brentq here has xtol 1e-14.
    np.testing.assert_allclose(cal.mu, _oracle_mu(EPS, DELTA), rtol=1e-10, atol=0)
    np.testing.assert_allclose(
        cal.noise_init, 2.0 / (cal.mu * math.sqrt(0.5)), rtol=1e-12, atol=0
    )
    # Exact calibration: the realised epsilon is the nominal one (rounding only).
    np.testing.assert_allclose(cal.realised_epsilon(), EPS, rtol=1e-9, atol=0)
    cal.check()


@pytest.mark.parametrize(
    ("T", "delta_t"), [(5, 37.8), (10, 53.4), (20, 75.6), (50, 119.5)]
)
def test_gdp_iteration_noise_table(T: int, delta_t: float) -> None:
    # spec 3.4: Delta = 37.8/53.4/75.6/119.5 for T = 5/10/20/50, 1 decimal.
    np.testing.assert_allclose(_power(iterations=T).noise_H, delta_t, rtol=0, atol=0.05)


def test_gdp_analyze_gauss() -> None:
    ag = calibrate_pca(
        epsilon=EPS, delta=DELTA, rank=K, n_features=D, method="analyze-gauss"
    )
    # spec 3.4: Delta_AG = s_gram / mu = 8.45 at (1, 1e-6), 2 decimals.
    np.testing.assert_allclose(ag.noise_init, 8.45, rtol=0, atol=5e-3)
    assert [m.label for m in ag.mechanisms] == ["M"]
    assert (ag.iterations, ag.noise_H, ag.noise_Z, ag.gamma, ag.clip_radius) == (
        0,
        None,
        None,
        None,
        None,
    )
    assert ag.init_fraction == 1.0
    np.testing.assert_allclose(ag.realised_epsilon(), EPS, rtol=1e-9, atol=0)
    ag.check()
    # iterations=0 is accepted as "no iterations" for Analyze Gauss.
    assert (
        calibrate_pca(
            epsilon=EPS,
            delta=DELTA,
            rank=K,
            n_features=D,
            method="analyze-gauss",
            iterations=0,
        )
        == ag
    )


@pytest.mark.parametrize("sensitivity", SENSITIVITIES)
@pytest.mark.parametrize(("f0", "fh"), [(0.5, 0.5), (0.3, 0.2), (0.8, 0.7)])
def test_gdp_split_is_exact(sensitivity: str, f0: float, fh: float) -> None:
    cal = _power(sensitivity=sensitivity, init_fraction=f0, h_fraction=fh, iterations=7)
    rho = {m.label: m.rho for m in cal.mechanisms}
    total = cal.mu**2 / 2
    # spec 3.4 steps 2-3: rho_init = f0 rho, T rho_H = fH (1-f0) rho, T rho_Z = (1-fH)(1-f0) rho.
    np.testing.assert_allclose(rho["M"], f0 * total, rtol=1e-12, atol=0)
    np.testing.assert_allclose(rho["H"], fh * (1 - f0) * total, rtol=1e-12, atol=0)
    np.testing.assert_allclose(
        rho["Z"], (1 - fh) * (1 - f0) * total, rtol=1e-12, atol=0
    )
    np.testing.assert_allclose(cal.realised_epsilon(), EPS, rtol=1e-9, atol=0)
    cal.check()


def test_gamma_and_radius_cap() -> None:
    cal = _power(clip_radius=10.0)
    # [P, Alg. 2 step 1] with beta/2 (Alg. 3 step 3): log(16 T / beta).
    gamma = (
        4 * cal.noise_H * (2 * math.sqrt(K) + math.sqrt(2 * math.log(16 * 10 / 0.1)))
    )
    np.testing.assert_allclose(cal.gamma, gamma, rtol=1e-12, atol=0)
    # spec 2.2: R >= gamma^(-1/2) never clips, so the cap changes nothing but noise.
    np.testing.assert_allclose(cal.clip_radius, gamma**-0.5, rtol=1e-12, atol=0)
    assert cal.requested_clip_radius == 10.0
    (z,) = [m for m in cal.mechanisms if m.label == "Z"]
    assert z.sensitivity == 2 * cal.clip_radius
    np.testing.assert_allclose(
        z.sigma, cal.noise_Z * cal.clip_radius, rtol=1e-15, atol=0
    )
    # The cost does not depend on R (spec 3.4 table): same mu for R = 0.01.
    np.testing.assert_allclose(_power(clip_radius=0.01).mu, cal.mu, rtol=1e-12, atol=0)
    assert _power(clip_radius=0.01).clip_radius == 0.01
    assert _power(clip_radius=10.0, cap_radius=False).clip_radius == 10.0
    assert _power(clip_radius=10.0, gamma_scale=0.5).gamma == pytest.approx(
        gamma / 2, rel=1e-12
    )


# --------------------------------------------------------------------------
# paper calibration (spec 2.3, 3.4, 5.2 P4)
# --------------------------------------------------------------------------
def test_paper_constants_oracles() -> None:
    c = paper_constants(1.0, 1e-6, 10)
    # spec 2.3 oracle values: 22.06 (2 decimals), 6.798e-3 and 2.27e-8 (4 and 3 digits).
    np.testing.assert_allclose(c["noise_init"], 22.06, rtol=0, atol=5e-3)
    np.testing.assert_allclose(c["eps_iter"], 6.798e-3, rtol=0, atol=5e-7)
    np.testing.assert_allclose(c["delta_iter"], 2.27e-8, rtol=0, atol=5e-11)
    # spec 2.3 closed forms, evaluated independently of Alg. 1/2's forms.
    np.testing.assert_allclose(
        c["noise_init"], 4 * math.sqrt(2 * math.log(4e6)), rtol=1e-12, atol=0
    )
    ag = paper_constants(1.0, 1e-6, 0)
    # spec 3.4: [P]'s classical Analyze Gauss value 10.77 (2 decimals).
    np.testing.assert_allclose(ag["noise_init"], 10.77, rtol=0, atol=5e-3)
    assert ag["noise_iter"] is None
    assert ag["eps_iter"] is None


@pytest.mark.parametrize(
    ("T", "delta_t"), [(5, 1214.9), (10, 1779.6), (20, 2609.3), (50, 4326.6)]
)
def test_paper_iteration_noise(T: int, delta_t: float) -> None:
    c = paper_constants(1.0, 1e-6, T)
    # spec 2.3 oracles, 1 decimal.
    np.testing.assert_allclose(c["noise_iter"], delta_t, rtol=0, atol=0.05)
    closed = 32 * math.sqrt(
        T * math.log(8 * (T + 1) / 1e-6) * math.log(2 * (T + 1) / 1e-6)
    )
    np.testing.assert_allclose(c["noise_iter"], closed, rtol=1e-12, atol=0)


# spec 3.4 table: (nominal eps, T, Delta_init, Delta, rho, realised paper sens., tight).
PAPER_TABLE = [
    (1.0, 5, 22.06, 1214.9, 4.125e-3, 0.358, 0.247),
    (1.0, 10, 22.06, 1779.6, 4.12e-3, 0.358, 0.247),
    (1.0, 50, 22.06, 4326.6, 4.12e-3, 0.358, 0.247),
    (0.5, 10, 44.11, 3559.2, 1.03e-3, 0.171, 0.118),
]


@pytest.mark.parametrize(
    ("eps", "T", "d_init", "d_iter", "rho", "real_p", "real_t"), PAPER_TABLE
)
def test_paper_realised_epsilon_table(
    eps: float,
    T: int,
    d_init: float,
    d_iter: float,
    rho: float,
    real_p: float,
    real_t: float,
) -> None:
    p = _power(epsilon=eps, iterations=T, accounting="paper")
    t = _power(epsilon=eps, iterations=T, accounting="paper", sensitivity="tight")
    # spec 3.4 table: noises to 2 and 1 decimals, rho to 3 digits, epsilons to 3 decimals.
    np.testing.assert_allclose(p.noise_init, d_init, rtol=0, atol=5e-3)
    np.testing.assert_allclose(p.noise_H, d_iter, rtol=0, atol=0.05)
    assert p.noise_Z == p.noise_H  # [P]: the same Delta for H and Z
    np.testing.assert_allclose(p.rho_total, rho, rtol=1.3e-3, atol=0)
    # "99.7% of the zCDP budget goes to the initialisation" (spec 3.4, 1 decimal of %).
    share = next(m.rho for m in p.mechanisms if m.label == "M") / p.rho_total
    np.testing.assert_allclose(share, 0.997, rtol=0, atol=5e-4)
    np.testing.assert_allclose(p.realised_epsilon(), real_p, rtol=0, atol=5e-4)
    np.testing.assert_allclose(t.realised_epsilon(), real_t, rtol=0, atol=5e-4)
    # In paper mode R is not capped by default; the nominal claim holds (check).
    assert p.clip_radius == p.requested_clip_radius == 0.05
    p.check()
    t.check()
    nominal = p.to_dict()["paper_nominal"]
    assert nominal["epsilon"] == eps
    assert nominal["eps_iter"] == pytest.approx(
        paper_constants(eps, 1e-6, T)["eps_iter"], rel=1e-15
    )


def test_paper_analyze_gauss() -> None:
    ag = calibrate_pca(
        epsilon=1.0,
        delta=1e-6,
        rank=K,
        n_features=D,
        method="analyze-gauss",
        accounting="paper",
    )
    np.testing.assert_allclose(
        ag.noise_init, 2 * math.sqrt(2 * math.log(2e6)), rtol=1e-12, atol=0
    )
    assert ag.realised_epsilon() < 1.0
    ag.check()
    assert ag.to_dict()["paper_nominal"]["eps_iter"] is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"epsilon": 3.0}, r"eps_init = epsilon/2 <= 1.*got eps_init=1\.5"),
        (
            {"epsilon": 1.5, "method": "analyze-gauss", "iterations": None},
            r"eps_init = epsilon <= 1",
        ),
        ({"delta": 1.0}, r"delta must be in \(0, 1\), got delta=1\.0"),
    ],
)
def test_paper_preconditions(kw: dict[str, object], match: str) -> None:
    with pytest.raises(PrivacyConfigError, match=match):
        _power(accounting="paper", **kw)
    # Negative control: gdp accounting has no epsilon <= 1 restriction.
    if "delta" not in kw:
        _power(**kw).check()


def test_paper_preconditions_direct() -> None:
    with pytest.raises(
        PrivacyConfigError, match=r"accounting='paper' requires eps_init"
    ):
        paper_constants(2.5, 1e-6, 3)
    paper_constants(2.0, 1e-6, 3)  # eps_init = 1 is allowed ([P] assumes eps <= 1)


@pytest.mark.parametrize("name", ["init_fraction", "h_fraction"])
def test_paper_mode_fixes_the_split(name: str) -> None:
    with pytest.raises(
        InvalidParameterError, match=rf"{name} must be 0\.5 with accounting='paper'"
    ):
        _power(accounting="paper", **{name: 0.3})


# --------------------------------------------------------------------------
# Cross-checks with dp_accounting (spec 5.2 P5)
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"epsilon": 0.3, "iterations": 3},
        {"epsilon": 4.0, "iterations": 20, "sensitivity": "tight"},
        {"epsilon": 1.0, "iterations": 10, "accounting": "paper"},
        {
            "epsilon": 0.5,
            "iterations": 50,
            "accounting": "paper",
            "sensitivity": "tight",
        },
        {"method": "analyze-gauss", "iterations": None, "epsilon": 2.0},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default",
)
def test_pld_agrees_with_gdp(kw: dict[str, object]) -> None:
    cal = _power(**kw)
    pld = pld_epsilon_of(cal)
    # spec 5.2 P5: GDP-exact and PLD agree within 1e-3; PLD's discretisation
    # (interval 1e-4) is pessimistic, so it is never below the exact value.
    np.testing.assert_allclose(pld, cal.realised_epsilon(), rtol=0, atol=1e-3)
    assert pld >= cal.realised_epsilon() - 1e-9


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_rdp_is_looser_than_pld(accounting: str) -> None:
    from dp_accounting import rdp

    cal = _power(accounting=accounting)
    acc = rdp.RdpAccountant()
    acc.compose(cal.to_dp_event())
    eps_rdp = acc.get_epsilon(cal.delta)
    assert eps_rdp >= pld_epsilon_of(cal)
    if accounting == "paper":
        # spec 3.4: "RDP is a bit looser (0.388)", 3 decimals.
        np.testing.assert_allclose(eps_rdp, 0.388, rtol=0, atol=5e-4)


def test_dp_event_structure() -> None:
    import dp_accounting

    cal = _power(iterations=4)
    ev = cal.to_dp_event()
    assert isinstance(ev, dp_accounting.ComposedDpEvent)
    m, h, z = ev.events
    assert isinstance(m, dp_accounting.GaussianDpEvent)
    assert m.noise_multiplier == cal.noise_init / 2.0
    assert isinstance(h, dp_accounting.SelfComposedDpEvent)
    assert h.count == 4
    assert h.event.noise_multiplier == cal.noise_H / 2.0
    assert z.event.noise_multiplier == pytest.approx(cal.noise_Z / 2.0, rel=1e-15)


# --------------------------------------------------------------------------
# LEDGER_CHECK and negative controls
# --------------------------------------------------------------------------
def _replace_mechanism(
    cal: PcaCalibration, label: str, **changes: object
) -> PcaCalibration:
    mechs = tuple(
        dataclasses.replace(m, **changes) if m.label == label else m
        for m in cal.mechanisms
    )
    return dataclasses.replace(cal, mechanisms=mechs)


@pytest.mark.parametrize("label", ["M", "H", "Z"])
def test_check_catches_under_noised_mechanism(label: str) -> None:
    cal = _power()
    cal.check()
    sigma = next(m.sigma for m in cal.mechanisms if m.label == label)
    bad = _replace_mechanism(cal, label, sigma=sigma / 2)
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        bad.check()


@pytest.mark.parametrize(
    ("field", "factor"),
    [("noise_init", 0.5), ("noise_H", 0.5), ("noise_Z", 0.5), ("clip_radius", 0.5)],
)
def test_check_catches_noise_fields_below_accounted(field: str, factor: float) -> None:
    cal = _power()
    bad = dataclasses.replace(cal, **{field: getattr(cal, field) * factor})
    # noise actually applied is below the accounted sigma, or the Z
    # sensitivity no longer covers 2 R_eff (clip_radius changed).
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        bad.check()


def test_check_catches_understated_structure() -> None:
    cal = _power()
    with pytest.raises(PrivacyConfigError, match="below the bound"):
        _replace_mechanism(
            cal, "H", sensitivity=math.sqrt(2)
        ).check()  # paper mode needs 2
    with pytest.raises(PrivacyConfigError, match="count"):
        _replace_mechanism(cal, "Z", count=5).check()
    with pytest.raises(PrivacyConfigError, match="releases"):
        dataclasses.replace(cal, mechanisms=cal.mechanisms[:2]).check()
    with pytest.raises(PrivacyConfigError, match="above the release's delta"):
        dataclasses.replace(cal, epsilon=0.9).check()


def test_to_dict_is_json_and_complete() -> None:
    for cal in (_power(), _power(accounting="paper")):
        rep = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
        assert rep["mu"] == cal.mu
        assert rep["accountant"] == cal.accounting
        assert rep["realised_epsilon"] == cal.realised_epsilon()
        assert rep["rho_total"] == pytest.approx(cal.mu**2 / 2, rel=1e-12)
        assert [m["label"] for m in rep["mechanisms"]] == ["M", "H", "Z"]
        assert set(rep["mechanisms"][0]) >= {
            "label",
            "shape",
            "sensitivity",
            "sigma",
            "rho",
            "count",
        }
        assert ("paper_nominal" in rep) == (cal.accounting == "paper")
    assert _power().delta_jl == 0.0
    assert _power().effective_sensitivity == _power().mu


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (
            {"rank": 0},
            InvalidParameterError,
            r"rank must be in \[1, n_features\] = \[1, 64\], got rank=0",
        ),
        ({"rank": 65}, InvalidParameterError, r"got rank=65"),
        ({"rank": 2.0}, InvalidParameterError, r"rank must be an integer"),
        (
            {"n_features": 1, "rank": 1},
            InvalidParameterError,
            r"n_features must be >= 2",
        ),
        (
            {"iterations": None},
            InvalidParameterError,
            r"iterations must be given for method='power'.*never chosen",
        ),
        (
            {"iterations": 0},
            InvalidParameterError,
            r"iterations must be >= 1, got iterations=0",
        ),
        (
            {"method": "analyze-gauss", "iterations": 3},
            InvalidParameterError,
            r"iterations must be None or 0",
        ),
        (
            {"clip_radius": None},
            PrivacyConfigError,
            r"clip_radius must be given for method='power'",
        ),
        (
            {"clip_radius": -1.0},
            PrivacyConfigError,
            r"clip_radius must be in \(0, inf\), got clip_radius=-1\.0",
        ),
        (
            {"clip_radius": math.inf},
            PrivacyConfigError,
            r"clip_radius must be in \(0, inf\)",
        ),
        (
            {"init_fraction": 1.0},
            InvalidParameterError,
            r"init_fraction must be in \(0, 1\), got init_fraction=1\.0",
        ),
        ({"h_fraction": 0.0}, InvalidParameterError, r"h_fraction must be in \(0, 1\)"),
        (
            {"beta": 1.5},
            InvalidParameterError,
            r"beta must be in \(0, 1\), got beta=1\.5",
        ),
        (
            {"gamma_scale": 0.0},
            InvalidParameterError,
            r"gamma_scale must be in \(0, inf\)",
        ),
        (
            {"epsilon": 0.0},
            PrivacyConfigError,
            r"epsilon must be in \(0, inf\), got epsilon=0\.0",
        ),
        ({"delta": 0.0}, PrivacyConfigError, r"delta must be in \(0, 1\)"),
        (
            {"method": "svd"},
            InvalidParameterError,
            r"method must be one of 'auto', 'power', 'analyze-gauss', got method='svd'",
        ),
        (  # PcaParams allows "auto"; the plan resolves it before the accounting
            {"method": "auto"},
            InvalidParameterError,
            r"method must be one of 'power', 'analyze-gauss', got method='auto'",
        ),
        (
            {"accounting": "rdp"},
            InvalidParameterError,
            r"accounting must be one of 'gdp', 'paper'",
        ),
        (
            {"sensitivity": "loose"},
            InvalidParameterError,
            r"sensitivity must be one of 'tight', 'paper'",
        ),
        (
            {"cap_radius": 1},
            InvalidParameterError,
            r"cap_radius must be None, True or False",
        ),
    ],
)
def test_validation(kw: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        _power(**kw)


# --------------------------------------------------------------------------
# Ledger: PCA releases are Gaussian records
# --------------------------------------------------------------------------
def _lrf(epsilon: float = 1.0, delta: float = 1e-6):  # type: ignore[no-untyped-def]
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


def _con(cal: object) -> PrivacyContract:
    """The contract of ``cal``: PCA and selection replace one row, a factorization adds/removes one."""
    pca = isinstance(cal, PcaCalibration | SelectionCalibration)
    accountant = (
        "rdp"
        if isinstance(cal, SelectionCalibration)
        else getattr(cal, "accounting", "analytic-gaussian")
    )
    return PrivacyContract(
        unit="row", neighboring="replace" if pca else "add-remove", clip_norm=1.0,
        epsilon=cal.epsilon, delta=cal.delta, accountant=accountant, shape=(4096, D),  # type: ignore[attr-defined]
    )  # fmt: skip


@pytest.fixture
def ledger_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "sample.zarr.dplr-ledger.json"


def test_ledger_charges_pca_and_composes_with_lrf(ledger_path: pathlib.Path) -> None:
    eps_b, delta_b = 3.0, 1e-5
    led = Ledger.create(ledger_path, dataset="d", epsilon=eps_b, delta=delta_b)
    pca, lrf = _power(), _lrf(0.5, 2e-6)
    rec = led.charge(
        pca,
        contract=_con(pca),
        release_id="pca",
        algorithm="power-pca",
        details={"k": K, "privacy": pca.to_dict()},
    )
    assert set(rec) == RECORD_KEYS
    assert rec["noise_multiplier_total"] == 1.0 / pca.mu
    assert rec["delta_jl"] == 0.0
    led.charge(
        lrf, contract=_con(lrf), release_id="lrf", algorithm="spectral", details={}
    )
    z_tot = (pca.mu**2 + lrf.effective_sensitivity**2) ** -0.5
    eps_used, delta_used = Ledger.open(ledger_path).spent()
    # Exact Gaussian composition [DRS22]: textbook profile by scipy.stats, ~1e-9 relative.
    np.testing.assert_allclose(
        delta_used, _gdp_profile(1 / z_tot, eps_b) + lrf.delta_jl, rtol=1e-8, atol=0
    )
    room = delta_b - lrf.delta_jl
    assert _gdp_profile(1 / z_tot, eps_used) <= room * (1 + 1e-9)
    assert _gdp_profile(1 / z_tot, eps_used * 0.999) > room


def test_ledger_refuses_pca_over_budget(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="d", epsilon=1.0, delta=1e-6)
    led.check(
        _power(), contract=_con(_power())
    )  # exactly the budget fits (LEDGER_CHECK slack only)
    led.charge(
        _power(),
        contract=_con(_power()),
        release_id="a",
        algorithm="power-pca",
        details={},
    )
    before = ledger_path.read_bytes()
    with pytest.raises(
        BudgetExceededError,
        match=r"needs epsilon = [0-9.]+ at delta = 1e-06; [0-9.]+ of epsilon = 1\.00",
    ):
        led.charge(
            _power(method="analyze-gauss", iterations=None),
            contract=_con(_power(method="analyze-gauss", iterations=None)),
            release_id="b",
            algorithm="ag",
            details={},
        )
    assert ledger_path.read_bytes() == before


def test_ledger_refuses_under_noised_pca(ledger_path: pathlib.Path) -> None:
    led = Ledger.create(ledger_path, dataset="d", epsilon=10.0, delta=1e-3)
    cal = _power()
    bad = _replace_mechanism(cal, "M", sigma=cal.noise_init / 2)
    before = ledger_path.read_bytes()
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        led.charge(
            bad, contract=_con(bad), release_id="x", algorithm="power-pca", details={}
        )
    assert ledger_path.read_bytes() == before


# --------------------------------------------------------------------------
# Selection (spec 2.5, 3.5, 5.2 P4/P5)
# --------------------------------------------------------------------------
RADII_8 = tuple(0.01 * 2.0**j for j in range(8))
ITERS_6 = (1, 2, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def selection() -> SelectionCalibration:
    """The spec 3.5 case: eps=1, delta=1e-6, beta=0.1, m = 8 x 6 = 48."""
    return calibrate_selection(
        epsilon=1.0,
        delta=1e-6,
        rank=K,
        n_rows=2**16,
        n_features=D,
        radii=RADII_8,
        iteration_grid=ITERS_6,
    )


@pytest.fixture(scope="module")
def small_selection() -> SelectionCalibration:
    return calibrate_selection(
        epsilon=1.0,
        delta=1e-6,
        rank=K,
        n_rows=4096,
        n_features=D,
        radii=(0.1, 0.2),
        iteration_grid=(1, 2),
    )


def test_paper_setting_23_oracles() -> None:
    c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    # spec 3.5: theta = 2.60e-4 (3 digits); Delta_init, chi, zeta to 1 decimal.
    np.testing.assert_allclose(c["theta"], 2.60e-4, rtol=0, atol=5e-7)
    np.testing.assert_allclose(
        [c["noise_init"], c["chi"], c["zeta"]], [115.1, 162.7, 57.5], rtol=0, atol=0.05
    )
    # [P, Thm 36]: rho_tot = nu, rho_b = 2 nu / 3 with setting (23).
    np.testing.assert_allclose(c["rho_total"], c["nu"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(c["rho_trial"], 2 * c["nu"] / 3, rtol=1e-12, atol=0)
    eps_rdp = selection_rdp_epsilon(
        noise_init=c["noise_init"],
        chi=c["chi"],
        zeta=c["zeta"],
        theta=c["theta"],
        delta=1e-6,
    )
    # spec 3.5 / P5: bound (22) = 0.400 >= dp_accounting 0.369, 3 decimals each.
    np.testing.assert_allclose(c["bound_22"], 0.400, rtol=0, atol=5e-4)
    np.testing.assert_allclose(eps_rdp, 0.369, rtol=0, atol=5e-4)
    assert c["bound_22"] >= eps_rdp


def test_selection_recalibration(selection: SelectionCalibration) -> None:
    sel = selection
    c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    assert sel.n_grid == 48
    assert sel.theta == c["theta"]
    assert sel.expected_trials == pytest.approx(
        3840.0, rel=1e-12
    )  # spec 3.5: E N = 3840
    assert sel.max_trials == math.ceil(20 * 3840)
    # spec 3.5: q = (1 - theta)^N_max ~ e^-20 = 2e-9 (1 digit).
    np.testing.assert_allclose(sel.truncation_q, 2e-9, rtol=0.05, atol=0)
    # Calibrated from below, tightly: the root finder works to ~1e-12 in log nu.
    assert sel.epsilon * (1 - 1e-6) <= sel.rdp_epsilon <= sel.epsilon
    # spec 3.5: (delta_rdp + e^eps q) / (1 - q) == delta.
    np.testing.assert_allclose(sel.truncated_delta(), sel.delta, rtol=1e-12, atol=0)
    # [P]'s ratios kept.
    np.testing.assert_allclose(
        [sel.chi**2 / sel.noise_init**2, sel.zeta**2 / sel.noise_init**2],
        [2.0, 0.25],
        rtol=1e-12,
    )
    # spec 3.5: Delta_init = 43.0, chi = 60.8, zeta = 21.5 (1 decimal), i.e. the
    # noise divided by 2.68. The spec's numbers are at delta = 1e-6 without the
    # cap; here delta_rdp is 0.56% smaller, which moves the ratio by ~1.5e-3.
    np.testing.assert_allclose(
        [sel.noise_init, sel.chi, sel.zeta], [43.0, 60.8, 21.5], rtol=0, atol=0.05
    )
    np.testing.assert_allclose(
        c["noise_init"] / sel.noise_init, 2.68, rtol=3e-3, atol=0
    )
    # The looser bound (22) on the recalibrated noise is above the RDP value.
    rho_tot = sel.rho_init + sel.rho_trial
    theta = sel.theta
    bound = (
        rho_tot
        + 2 * math.sqrt(rho_tot * math.log(1 / (theta * sel.delta_rdp)))
        + 4 * math.sqrt(sel.rho_trial * math.log(1 / theta))
    )
    assert bound > sel.rdp_epsilon
    sel.check()
    json.dumps(sel.to_dict(), allow_nan=False)


def test_selection_fewer_trials_less_noise() -> None:
    sel = calibrate_selection(
        epsilon=1.0, delta=1e-6, rank=K, n_rows=2**16, n_features=D, radii=RADII_8,
        iteration_grid=ITERS_6, expected_trials=4 * 48,
    )  # fmt: skip
    c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    # spec 3.5: "/3.14 at E N = 4m" (3 digits; same cap remark as above).
    np.testing.assert_allclose(
        c["noise_init"] / sel.noise_init, 3.14, rtol=3e-3, atol=0
    )
    assert sel.theta == 1 / 192


def test_selection_trial_cost_is_independent_of_t(
    selection: SelectionCalibration,
) -> None:
    sel, h, R = selection, 7.5, 0.3
    for t in (1, 5, 32):
        sig = sel.noise_iter(t)
        np.testing.assert_allclose(sig, sel.chi * math.sqrt(t), rtol=1e-15, atol=0)
        # t x (H: s=2, std Delta(t); Z: s=2R, std Delta(t) R) + score (s=2/h, std 2 zeta / h).
        rho = t * (2**2 / (2 * sig**2) + (2 * R) ** 2 / (2 * (sig * R) ** 2))
        rho += (2 / h) ** 2 / (2 * sel.score_noise(h) ** 2)
        np.testing.assert_allclose(rho, sel.rho_trial, rtol=1e-12, atol=0)
        # [P, App. C]: gamma(t) = 4 Delta(t) (2 sqrt k + sqrt(2 log(4t / beta_0))), beta_0 = beta/2.
        gamma = 4 * sig * (2 * math.sqrt(K) + math.sqrt(2 * math.log(4 * t / 0.05)))
        np.testing.assert_allclose(sel.gamma(t), gamma, rtol=1e-12, atol=0)
        assert sel.effective_clip_radius(1e3, t) == pytest.approx(
            gamma**-0.5, rel=1e-12
        )
        assert sel.effective_clip_radius(1e-4, t) == 1e-4
    np.testing.assert_allclose(sel.score_noise(h), 2 * sel.zeta / h, rtol=1e-15, atol=0)


def test_selection_tight_mode(small_selection: SelectionCalibration) -> None:
    paper = small_selection
    tight = calibrate_selection(
        epsilon=1.0,
        delta=1e-6,
        rank=K,
        n_rows=4096,
        n_features=D,
        radii=(0.1, 0.2),
        iteration_grid=(1, 2),
        sensitivity="tight",
    )
    assert tight.noise_init < paper.noise_init
    np.testing.assert_allclose(tight.rdp_epsilon, 1.0, rtol=1e-6, atol=0)
    np.testing.assert_allclose(
        tight.score_noise(2.0), math.sqrt(2) * tight.zeta / 2.0, rtol=1e-15, atol=0
    )
    # rho_trial = s^2/(2 chi^2) + 2/chi^2 + 1/(2 zeta^2) with s^2 = 2.
    np.testing.assert_allclose(
        tight.rho_trial, 3 / tight.chi**2 + 1 / (2 * tight.zeta**2), rtol=1e-12, atol=0
    )
    tight.check()


def test_selection_check_negative_controls(selection: SelectionCalibration) -> None:
    with pytest.raises(PrivacyConfigError, match="RDP epsilon"):
        dataclasses.replace(selection, chi=selection.chi / 2).check()
    with pytest.raises(PrivacyConfigError, match="with the cap gives delta"):
        dataclasses.replace(selection, delta_rdp=selection.delta).check()
    with pytest.raises(PrivacyConfigError, match="truncation_q"):
        dataclasses.replace(selection, max_trials=selection.max_trials // 4).check()


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"radii": ()}, InvalidParameterError, r"radii must be a non-empty sequence"),
        (
            {"radii": (0.1, -0.2)},
            PrivacyConfigError,
            r"radii\[\*\] must be in \(0, inf\), got radii\[\*\]=-0\.2",
        ),
        (
            {"radii": (0.1, 0.1)},
            InvalidParameterError,
            r"radii must hold distinct values",
        ),
        (
            {"iteration_grid": (0, 1)},
            InvalidParameterError,
            r"iteration_grid\[\*\] must be >= 1",
        ),
        (
            {"expected_trials": 0.5},
            InvalidParameterError,
            r"expected_trials must be in \[1, inf\)",
        ),
        (
            {"max_trials": 10},
            PrivacyConfigError,
            r"max_trials must make the truncation mass",
        ),
        ({"n_rows": 0}, InvalidParameterError, r"n_rows must be >= 1"),
        ({"rank": 64}, InvalidParameterError, r"rank must be in \[1, n_features - 1\]"),
        ({"beta": 0.0}, InvalidParameterError, r"beta must be in \(0, 1\)"),
        ({"delta": 2.0}, PrivacyConfigError, r"delta must be in \(0, 1\)"),
    ],
)
def test_selection_validation(
    kw: dict[str, object], error: type[Exception], match: str
) -> None:
    args: dict[str, object] = {"epsilon": 1.0, "delta": 1e-6, "rank": K, "n_rows": 4096, "n_features": D,
                               "radii": (0.1, 0.2), "iteration_grid": (1, 2)}  # fmt: skip
    args.update(kw)
    with pytest.raises(error, match=match):
        calibrate_selection(**args)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Ledger: selection runs are approx records, composed by basic composition
# --------------------------------------------------------------------------
def test_ledger_selection_record_and_composition(
    ledger_path: pathlib.Path, small_selection: SelectionCalibration
) -> None:
    eps_b, delta_b = 2.0, 1e-5
    led = Ledger.create(ledger_path, dataset="d", epsilon=eps_b, delta=delta_b)
    rec = led.charge(
        small_selection,
        contract=_con(small_selection),
        release_id="sel",
        algorithm="pca-select",
        details=small_selection.to_dict(),
    )
    assert set(rec) == RECORD_KEYS | {"kind", "epsilon_approx", "delta_approx"}
    assert rec["kind"] == "approx"
    assert rec["noise_multiplier_total"] is None
    assert (rec["epsilon_approx"], rec["delta_approx"]) == (1.0, 1e-6)
    eps_used, delta_used = Ledger.open(ledger_path).spent()
    assert (eps_used, delta_used) == (1.0, 1e-6)

    pca = _power(epsilon=0.5)
    led.charge(
        pca, contract=_con(pca), release_id="pca", algorithm="power-pca", details={}
    )
    again = Ledger.open(ledger_path)
    eps_used, delta_used = again.spent()
    # Basic composition: the Gaussian part gets epsilon_B - 1 and delta_B - 1e-6.
    np.testing.assert_allclose(
        delta_used, _gdp_profile(pca.mu, eps_b - 1.0) + 1e-6, rtol=1e-8, atol=0
    )
    assert _gdp_profile(pca.mu, eps_used - 1.0) <= (delta_b - 1e-6) * (1 + 1e-9)
    assert _gdp_profile(pca.mu, (eps_used - 1.0) * 0.999) > delta_b - 1e-6
    summary = again.remaining_summary()
    assert summary["n_releases"] == 2
    assert (summary["epsilon_approx_total"], summary["delta_approx_total"]) == (
        1.0,
        1e-6,
    )
    assert summary["noise_multiplier_total"] == 1.0 / pca.mu


def test_ledger_refuses_what_does_not_fit_after_selection(
    ledger_path: pathlib.Path, small_selection: SelectionCalibration
) -> None:
    led = Ledger.create(ledger_path, dataset="d", epsilon=1.5, delta=1e-5)
    led.charge(
        small_selection,
        contract=_con(small_selection),
        release_id="sel",
        algorithm="pca-select",
        details={},
    )
    before = ledger_path.read_bytes()
    # A Gaussian (1, 1e-6) release alone fits (1.5, 1e-5), but only 0.5 is left.
    Ledger.check_against_budget(
        _power(), contract=_con(_power()), epsilon=1.5, delta=1e-5
    )
    with pytest.raises(
        BudgetExceededError, match=r"; 0\.50 of epsilon = 1\.50 is left after 1 earlier"
    ):
        led.charge(
            _power(),
            contract=_con(_power()),
            release_id="pca",
            algorithm="power-pca",
            details={},
        )
    # A second selection exceeds epsilon even with no Gaussian part at all.
    with pytest.raises(BudgetExceededError, match="would exceed"):
        led.check(small_selection, contract=_con(small_selection))
    assert ledger_path.read_bytes() == before
    # Negative control: a small Gaussian release still fits in what is left.
    led.check(_power(epsilon=0.25), contract=_con(_power(epsilon=0.25)))


def test_ledger_refuses_tampered_selection(
    ledger_path: pathlib.Path, small_selection: SelectionCalibration
) -> None:
    led = Ledger.create(ledger_path, dataset="d", epsilon=10.0, delta=1e-3)
    bad = dataclasses.replace(
        small_selection, noise_init=small_selection.noise_init / 3
    )
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        led.charge(
            bad, contract=_con(bad), release_id="x", algorithm="pca-select", details={}
        )
    assert Ledger.open(ledger_path).releases == ()


def test_old_ledgers_stay_readable_and_bad_approx_records_are_refused(
    ledger_path: pathlib.Path,
) -> None:
    old = {
        "format": "dplr-ledger/1",
        "dataset": "d",
        "budget": {"epsilon": 4.0, "delta": 1e-5},
        "releases": [
            {"release_id": "r1", "time": "t", "algorithm": "spectral", "epsilon": 1.0, "delta": 1e-6,
             "delta_jl": 5e-7, "noise_multiplier_total": 4.5, "details": {}},
        ],
    }  # fmt: skip
    ledger_path.write_text(json.dumps(old))
    _, delta_used = Ledger.open(ledger_path).spent()
    # A dplr-ledger/1 file is read at (row, replace) and its records as row
    # add/remove releases: mu = 1/4.5 counts twice (group privacy of size 2).
    np.testing.assert_allclose(
        delta_used, _gdp_profile(2 / 4.5, 4.0) + 5e-7, rtol=1e-8, atol=0
    )
    approx = {"release_id": "s", "time": "t", "algorithm": "sel", "epsilon": 1.0, "delta": 1e-6, "delta_jl": 0.0,
              "noise_multiplier_total": None, "details": {}, "kind": "approx", "epsilon_approx": 1.0,
              "delta_approx": 1e-6}  # fmt: skip
    for bad, match in (
        ({**approx, "noise_multiplier_total": 3.0}, "invalid approx record"),
        ({**approx, "epsilon_approx": -1.0}, "invalid approx record"),
        ({**approx, "kind": "laplace"}, "must have kind 'approx'"),
        (
            {k: v for k, v in approx.items() if k != "delta_approx"},
            "must have kind 'approx' and the keys",
        ),
    ):
        ledger_path.write_text(json.dumps({**old, "releases": [*old["releases"], bad]}))
        with pytest.raises(StoreLayoutError, match=match):
            Ledger.open(ledger_path)
    ledger_path.write_text(json.dumps({**old, "releases": [*old["releases"], approx]}))
    assert Ledger.open(ledger_path).spent()[0] > 1.0


def test_default_trial_cap_works_for_large_epsilon() -> None:
    # The spec's cap ceil(20/theta) leaves e^eps * e^-20 > delta at eps = 8,
    # delta = 1e-6 (no delta left for the mechanism); the default cap keeps the
    # truncation cost e^eps q at <= 1% of delta for any epsilon.
    for eps in (1.0, 8.0):
        sel = calibrate_selection(
            epsilon=eps,
            delta=1e-6,
            rank=2,
            n_rows=4096,
            n_features=16,
            radii=(0.05, 0.1),
            iteration_grid=(1, 2),
        )
        assert math.exp(eps) * sel.truncation_q <= 0.01 * 1e-6 * (1 + 1e-9)
        sel.check()


def test_defaults_are_tight_and_add_remove() -> None:
    """The default calibration uses the exact sensitivities under add/remove
    (as factorize): M and H 1, Z R; [P]'s replacement constants stay available."""
    cal = pca_accounting.calibrate_pca(
        PcaParams(rank=K, epsilon=EPS, delta=DELTA, method="power", iterations=10,
                  clip_radius=0.05),
        n_features=D,
    )  # fmt: skip
    assert (cal.sensitivity_mode, cal.neighboring) == ("tight", "add-remove")
    sens = {m.label: m.sensitivity for m in cal.mechanisms}
    r = cal.clip_radius
    assert sens == {"M": 1.0, "H": 1.0, "Z": pytest.approx(r, rel=1e-15)}
    paper = calibrate_pca(iterations=10, clip_radius=0.05, epsilon=EPS, delta=DELTA,
                          rank=K, n_features=D)  # fmt: skip
    # the same mu, so the noise scales with the sensitivity: half of [P]'s
    assert cal.mu == pytest.approx(paper.mu, rel=1e-12)
    assert cal.noise_init == pytest.approx(paper.noise_init / 2.0, rel=1e-12)
    assert cal.to_dict()["neighboring"] == "add-remove"
    cal.check()
    tight_replace = pca_accounting.calibrate_pca(
        PcaParams(rank=K, epsilon=EPS, delta=DELTA, method="analyze-gauss",
                  neighboring="replace"),
        n_features=D,
    )  # fmt: skip
    assert tight_replace.mechanisms[0].sensitivity == pytest.approx(math.sqrt(2.0))
    sel = pca_accounting.calibrate_selection(
        PcaParams(rank=K, epsilon=EPS, delta=DELTA), n_rows=2**12, n_features=D,
        radii=[0.05], iteration_grid=[2],
    )  # fmt: skip
    assert (sel.sensitivity_mode, sel.neighboring) == ("tight", "add-remove")
    assert sel.sensitivities.clip == 1.0


def test_check_refuses_replace_noise_declared_as_add_remove() -> None:
    """Negative control: add/remove noise relabelled as replace is under-noised."""
    cal = pca_accounting.calibrate_pca(
        PcaParams(rank=K, epsilon=EPS, delta=DELTA, method="power", iterations=3,
                  clip_radius=0.05),
        n_features=D,
    )  # fmt: skip
    with pytest.raises(PrivacyConfigError, match="below the bound"):
        dataclasses.replace(cal, neighboring="replace").check()
