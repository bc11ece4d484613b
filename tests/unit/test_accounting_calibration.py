"""Joint calibration of a release (spec sections 4.4, 4.5; T2 LEDGER_CHECK)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchRequest,
    calibrate_release,
    pld_epsilon,
    to_dp_event,
)
from pipeline.accounting.gaussian import gaussian_delta
from pipeline.errors import InvalidParameterError, PrivacyConfigError

# Worked example of spec section 4.4: eps=1, delta=1e-6, Delta_F=1, t=40, v=160.
T, V, M, N = 40, 160, 500, 300
BUDGET = {"epsilon": 1.0, "delta": 1e-6, "frobenius_bound": 1.0}


def _spectral(tree_levels: int = 1) -> ReleaseCalibration:
    return calibrate_release(
        [
            SketchRequest(name="Y", shape=(M, T), jl_dims=(T,), weight=0.5),
            SketchRequest(name="Z", shape=(V, N), jl_dims=(V,), weight=0.5),
        ],
        n_sketch_matrices=2,
        tree_levels=tree_levels,
        **BUDGET,
    )


def _low_space() -> ReleaseCalibration:
    w = 1.0 / 3.0
    return calibrate_release(
        [
            SketchRequest(name="Yc", shape=(M, T), jl_dims=(T,), weight=w),
            SketchRequest(name="Yr", shape=(T, N), jl_dims=(T,), weight=w),
            SketchRequest(name="Z", shape=(V, V), jl_dims=(V, V), weight=w),
        ],
        n_sketch_matrices=4,
        **BUDGET,
    )


def _sigmas(cal: ReleaseCalibration) -> dict[str, float]:
    return {sk.name: sk.sigma for sk in cal.sketches}


def _assert_printed(actual: float, printed: float, decimals: int) -> None:
    # Spec figures are rounded to the printed digits, so the tolerance is half a
    # unit in the last printed place. (A 5e-4 relative tolerance would reject
    # the correct 35.42 against the printed 35.4.)
    np.testing.assert_allclose(actual, printed, rtol=0, atol=0.5 * 10.0**-decimals)


def test_spectral_worked_example() -> None:
    cal = _spectral()
    _assert_printed(cal.noise_multiplier, 4.365, 3)
    _assert_printed(cal.sketches[0].jl_factor, 1.730, 3)
    _assert_printed(cal.sketches[1].jl_factor, 1.344, 3)
    _assert_printed(_sigmas(cal)["Y"], 10.68, 2)
    _assert_printed(_sigmas(cal)["Z"], 8.30, 2)
    assert cal.delta_mechanism == cal.delta_jl == 5e-7
    assert cal.beta == 2.5e-7


def test_low_space_worked_example() -> None:
    cal = _low_space()
    sig = _sigmas(cal)
    _assert_printed(cal.sketches[0].jl_factor, 1.748, 3)
    _assert_printed(cal.sketches[2].jl_factor, 1.829, 3)
    _assert_printed(sig["Yc"], 13.22, 2)
    _assert_printed(sig["Yr"], 13.22, 2)
    _assert_printed(sig["Z"], 13.83, 2)
    # sigma_min = sqrt(t) sigma_c (spec section 2.2) = 83.6.
    _assert_printed(math.sqrt(T) * sig["Yc"], 83.6, 1)


def test_continual_worked_example() -> None:
    # T = 1024 epochs: L = floor(log2 T) + 1 = 11 (spec section 4.5).
    cal = _spectral(tree_levels=11)
    _assert_printed(_sigmas(cal)["Y"], 35.4, 1)
    # Noise is sqrt(L) times one-shot (spec section 4.5); float rounding only.
    np.testing.assert_allclose(
        _sigmas(cal)["Y"], math.sqrt(11) * _sigmas(_spectral())["Y"], rtol=1e-14, atol=0
    )


@pytest.mark.parametrize("make", [_spectral, _low_space, lambda: _spectral(11)])
def test_effective_sensitivity_and_check(make: object) -> None:
    cal = make()  # type: ignore[operator]
    # Delta_eff = 1/s exactly in real arithmetic (spec section 4.4); a few ulps.
    np.testing.assert_allclose(
        cal.effective_sensitivity, 1.0 / cal.noise_multiplier, rtol=1e-14, atol=0
    )
    cal.check()
    for sk in cal.sketches:
        assert sk.sensitivity == cal.frobenius_bound * sk.jl_factor


@pytest.mark.parametrize("factor", [0.0, 0.5, 0.99])
def test_check_rejects_tampered_sigma(factor: float) -> None:
    # Negative control: less noise on one sketch than calibrated must fail.
    cal = _spectral()
    small = dataclasses.replace(cal.sketches[0], sigma=factor * cal.sketches[0].sigma)
    tampered = dataclasses.replace(cal, sketches=(small, cal.sketches[1]))
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        tampered.check()


def test_check_rejects_tampered_sensitivity() -> None:
    cal = _spectral()
    bad = dataclasses.replace(
        cal.sketches[1], sensitivity=0.5 * cal.sketches[1].sensitivity
    )
    with pytest.raises(PrivacyConfigError, match="LEDGER_CHECK failed"):
        dataclasses.replace(cal, sketches=(cal.sketches[0], bad)).check()


def test_frobenius_bound_scales_sigma() -> None:
    c = 3.5
    scaled = calibrate_release(
        [SketchRequest(name="Y", shape=(M, T), jl_dims=(T,), weight=1.0)],
        epsilon=1.0,
        delta=1e-6,
        frobenius_bound=c,
        n_sketch_matrices=1,
    )
    unit = calibrate_release(
        [SketchRequest(name="Y", shape=(M, T), jl_dims=(T,), weight=1.0)],
        epsilon=1.0,
        delta=1e-6,
        frobenius_bound=1.0,
        n_sketch_matrices=1,
    )
    # sigma is linear in Delta_F (spec section 2.2); float rounding only.
    np.testing.assert_allclose(
        scaled.sketches[0].sigma, c * unit.sketches[0].sigma, rtol=1e-14, atol=0
    )
    scaled.check()


@pytest.mark.parametrize("make", [_spectral, _low_space, lambda: _spectral(11)])
def test_pld_agrees_with_analytic(make: object) -> None:
    cal = make()  # type: ignore[operator]
    eps = pld_epsilon([to_dp_event(cal).noise_multiplier], cal.delta_mechanism)
    # 1e-3 absolute: PLD discretisation with interval 1e-4 is pessimistic by a
    # few intervals at most (dp_accounting's PLD accuracy guarantee).
    np.testing.assert_allclose(eps, cal.epsilon, rtol=0, atol=1e-3)


def test_pld_composition_matches_closed_form() -> None:
    # Two Gaussians compose into one with z_tot^-2 = z1^-2 + z2^-2 [BW18].
    z1, z2 = 4.0, 6.0
    z_tot = (z1**-2 + z2**-2) ** -0.5
    dlt = 1e-6
    from pipeline.accounting.gaussian import gaussian_epsilon

    # Same 1e-3 absolute PLD tolerance as above.
    np.testing.assert_allclose(
        pld_epsilon([z1, z2], dlt), gaussian_epsilon(z_tot, dlt), rtol=0, atol=1e-3
    )


def test_to_dp_event() -> None:
    import dp_accounting

    cal = _low_space()
    event = to_dp_event(cal)
    assert isinstance(event, dp_accounting.GaussianDpEvent)
    assert event.noise_multiplier == 1.0 / cal.effective_sensitivity
    assert gaussian_delta(
        event.noise_multiplier, cal.epsilon
    ) + cal.delta_jl <= cal.delta * (1 + 1e-9)


def test_to_dict_is_json() -> None:
    cal = _low_space()
    d = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    assert d["n_sketch_matrices"] == 4
    assert [s["name"] for s in d["sketches"]] == ["Yc", "Yr", "Z"]
    assert d["sketches"][2]["shape"] == [V, V]
    # no seed or key value: the only such field is the public-seed flag
    assert not any(("seed" in k or "key" in k) and not isinstance(v, bool) for k, v in d.items())
    assert d["public_sketch_seed"] is False
    assert d["sensitivity"] == "jl-fixed-neighbour"


def _req(name: str = "Y", weight: float = 1.0, **kw: object) -> SketchRequest:
    args: dict[str, object] = {"shape": (M, T), "jl_dims": (T,)}
    args.update(kw)
    return SketchRequest(name=name, weight=weight, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("requests", "kwargs", "match"),
    [
        (
            [_req(weight=0.6)],
            {},
            r"weights of requests must sum to 1, got sum\(weight\)=0\.6",
        ),
        ([_req("Y", 0.5), _req("Z", 0.6)], {}, r"weights of requests must sum to 1"),
        ([_req(weight=0.0)], {}, r"requests\[0\]\.weight must be in \(0, 1\], got"),
        ([_req(weight=-0.5), _req("Z", 1.5)], {}, r"requests\[0\]\.weight must be in"),
        ([_req("Y", 0.5), _req("Y", 0.5)], {}, r"requests must have distinct names"),
        ([], {}, r"requests must be a non-empty sequence"),
        ([_req(jl_dims=(0,))], {}, r"requests\[0\]\.jl_dims\[\*\] must be >= 1"),
        ([_req(shape=(5,))], {}, r"requests\[0\]\.shape must be \(n_rows, n_cols\)"),
        (
            [_req()],
            {"frobenius_bound": 0.0},
            r"frobenius_bound must be in \(0, inf\), got frobenius_bound=0\.0\.",
        ),
        (
            [_req()],
            {"tree_levels": 0},
            r"tree_levels must be >= 1, got tree_levels=0\.",
        ),
        ([_req()], {"n_sketch_matrices": 0}, r"n_sketch_matrices must be in \[1, inf\)"),
        ([_req()], {"n_sketch_matrices": -1}, r"n_sketch_matrices must be >= 0"),
        (
            [_req(jl_dims=(V, V))],
            {"n_sketch_matrices": 1},
            r"n_sketch_matrices must be in \[2, inf\)",
        ),
    ],
)
def test_invalid_requests(
    requests: list[SketchRequest], kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "frobenius_bound": 1.0,
        "n_sketch_matrices": 1,
    }
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        calibrate_release(requests, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": 0.0}, r"epsilon must be in \(0, inf\), got epsilon=0\.0\."),
        ({"delta": 0.0}, r"delta must be in \(0, 1\), got delta=0\.0\."),
        ({"delta_jl_fraction": 1.0}, r"delta_jl_fraction must be in \(0, 1\)"),
    ],
)
def test_invalid_privacy(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "frobenius_bound": 1.0,
        "n_sketch_matrices": 1,
    }
    args.update(kwargs)
    with pytest.raises(PrivacyConfigError, match=match):
        calibrate_release([_req()], **args)  # type: ignore[arg-type]


def test_a_sketch_clipped_in_sketch_space_has_the_factor_rho_for_any_operator() -> None:
    """clip_factor rho: sensitivity rho Delta_F, no tail bound (J = 0, no delta_JL),
    public operators or not; it takes no jl_dims and is never below 1."""
    reqs = [
        SketchRequest(name="Y", shape=(100, 20), jl_dims=(), weight=0.9, clip_factor=1.37),
        SketchRequest(name="Z", shape=(181, 50), jl_dims=(), weight=0.1),
    ]
    secret = calibrate_release(reqs, epsilon=1.0, delta=1e-6, frobenius_bound=2.0, n_sketch_matrices=0)
    public = calibrate_release(
        reqs, epsilon=1.0, delta=1e-6, frobenius_bound=2.0, n_sketch_matrices=0,
        public_operator_factors={"Y": 99.0, "Z": 1.0},
    )
    for cal in (secret, public):
        y, z = cal.sketches
        assert (y.jl_factor, y.sensitivity) == (1.37, 2.0 * 1.37)
        assert (z.jl_factor, z.sensitivity) == (1.0, 2.0)
        assert cal.delta_jl == 0.0
        assert y.sigma == pytest.approx(2.0 * 1.37 * cal.noise_multiplier / math.sqrt(0.9), rel=1e-12)
        cal.check()
    assert (secret.sensitivity, public.sensitivity) == ("exact", "worst-case")
    with pytest.raises(InvalidParameterError, match="needs no tail bound"):
        calibrate_release(
            [dataclasses.replace(reqs[0], jl_dims=(20,)), reqs[1]],
            epsilon=1.0, delta=1e-6, frobenius_bound=1.0, n_sketch_matrices=1,
        )
    with pytest.raises(InvalidParameterError, match="clip_factor"):
        calibrate_release(
            [dataclasses.replace(reqs[0], clip_factor=0.5), reqs[1]],
            epsilon=1.0, delta=1e-6, frobenius_bound=1.0, n_sketch_matrices=0,
        )
