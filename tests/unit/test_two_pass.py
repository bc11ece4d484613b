"""The two-pass private factorization (spec private-lrf-2, section 6), in memory.

Calibration (exact GDP composition, cross-checked by dp_accounting's PLD),
orientation and refusals, the charge after pass 1 and before any noise, the resume from
journaled sketches, the report, and utility against the full-matrix Gaussian
mechanism.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pipeline.accounting.calibration import pld_epsilon
from pipeline.accounting.gaussian import gaussian_noise_multiplier
from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import SKETCHES, plan_lrf, run_lrf
from pipeline.algorithms.lrf.two_pass import (
    DEFAULT_WEIGHT_Z,
    TwoPassPlan,
    debiased_singular_values,
    plan_two_pass,
    run_two_pass,
)
from pipeline.api import factorize
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import LrfParams

EPS, DELTA = 2.0, 1e-6


def _params(rank: int = 3, **kw: Any) -> LrfParams:
    kw.setdefault("epsilon", EPS)
    kw.setdefault("delta", DELTA)
    return LrfParams.of(rank, algorithm="two-pass", **kw)


# ---------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("neighboring", ["add-remove", "replace"])
@pytest.mark.parametrize("weight_z", [0.1, DEFAULT_WEIGHT_Z, 0.5])
def test_calibration_is_the_exact_gdp_composition_of_two_gaussians(
    neighboring: str, weight_z: float
) -> None:
    plan = plan_two_pass(
        _params(clip_norm=0.7, neighboring=neighboring), (600, 200), weight_z=weight_z
    )
    cal = plan.calibration
    assert cal is not None
    delta_f = 0.7 * (2.0 if neighboring == "replace" else 1.0)
    s = gaussian_noise_multiplier(EPS, DELTA)  # the whole delta: no tail event
    assert cal.delta_jl == 0.0
    assert cal.n_sketch_matrices == 0
    assert cal.sensitivity == "exact"
    by = {sk.name: sk for sk in cal.sketches}
    assert by["Z"].shape == (plan.v, 200)
    assert by["Y"].shape == (600, 3)
    for name, w in (("Z", weight_z), ("Y", 1.0 - weight_z)):
        assert by[name].sensitivity == pytest.approx(delta_f, rel=1e-15)
        # sigma_i = Delta_F s / sqrt(w_i) (spec private-lrf-2, section 5)
        assert by[name].sigma == pytest.approx(delta_f * s / math.sqrt(w), rel=1e-12)
    # mu^2 = (Delta_F / sigma_Z)^2 + (Delta_F / sigma_Y)^2 = 1 / s^2
    mu = math.hypot(delta_f / by["Z"].sigma, delta_f / by["Y"].sigma)
    assert mu == pytest.approx(1.0 / s, rel=1e-12)
    assert cal.effective_sensitivity == pytest.approx(mu, rel=1e-12)
    # dp_accounting's PLD accountant of the two mechanisms composed: epsilon to
    # 1e-3 (its discretisation interval is 1e-4; a few intervals at most)
    z = [by["Z"].sigma / delta_f, by["Y"].sigma / delta_f]
    assert pld_epsilon(z, DELTA) == pytest.approx(EPS, abs=1e-3)


def test_pld_check_catches_a_budget_counted_once_negative_control() -> None:
    """If only one mechanism were accounted, the composed PLD epsilon exceeds it."""
    cal = plan_two_pass(_params(), (600, 200)).calibration
    assert cal is not None
    by = {sk.name: sk.sigma for sk in cal.sketches}
    # each sketch calibrated alone to the whole budget: too little noise
    s = gaussian_noise_multiplier(EPS, DELTA)
    assert pld_epsilon([s, s], DELTA) > EPS + 0.1
    assert pld_epsilon([by["Z"], by["Y"]], DELTA) == pytest.approx(EPS, abs=1e-3)


def test_a_public_seed_keeps_the_exact_calibration() -> None:
    secret = plan_two_pass(_params(), (600, 200))
    public = plan_two_pass(_params(), (600, 200), public_seed=12345)
    assert public.public_sketch_seed
    assert not secret.public_sketch_seed
    assert public.calibration == secret.calibration
    assert public.calibration is not None
    assert public.calibration.sensitivity == "exact"


# ---------------------------------------------------------------------------
# orientation, sizes, refusals
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("unit", "shape", "transpose"),
    [
        ("row", (300, 500), False),  # the unit lies along the rows of X = A
        ("row", (500, 300), False),
        ("column", (500, 300), True),  # X = A.T
        ("column", (300, 500), True),
        ("entry", (300, 500), True),  # by shape: M >= N
        ("entry", (500, 300), False),
    ],
)
def test_orientation_puts_the_privacy_unit_on_the_rows_of_x(
    unit: str, shape: tuple[int, int], transpose: bool
) -> None:
    plan = plan_lrf(_params(unit=unit), shape)
    assert isinstance(plan, TwoPassPlan)
    assert plan.transpose is transpose


@pytest.mark.parametrize(("shape", "reads"), [((500, 300), ("row",)), ((300, 500), ("column",))])
def test_an_entry_release_converts_only_along_the_rows_of_x(
    shape: tuple[int, int], reads: tuple[str, ...]
) -> None:
    """The sparse S of Z is exact for a difference within one row of X only."""
    plan = plan_two_pass(_params(unit="entry"), shape)
    assert plan.entry_reads == reads
    f = factorize(np.zeros(shape), 2, epsilon=EPS, delta=DELTA, algorithm="two-pass",
                  unit="entry", insecure_noise_seed=1)  # fmt: skip
    assert f.report["contract"]["entry_reads"] == list(reads)


def test_default_core_size_is_clamped_to_the_rows_of_x() -> None:
    assert plan_two_pass(_params(rank=5), (2000, 300)).v == 100
    assert plan_two_pass(_params(rank=12), (2000, 300)).v == 120
    assert plan_two_pass(_params(rank=5), (30, 300)).v == 30  # row unit: M = 30


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"sketch_size": 10}, "sketch_size does not apply"),
        ({"padded": True}, "padded=True applies"),
        ({"operator": "gaussian"}, "sparse sign co-range"),
        ({"core_size": 3}, "core_size"),
        ({"core_size": 1000}, "core_size"),
        ({"rank": 200}, "rank"),
    ],
)
def test_bad_parameters_are_refused_with_one_sentence(kw: dict[str, Any], match: str) -> None:
    rank = kw.pop("rank", 3)
    with pytest.raises(InvalidParameterError, match=match) as info:
        plan_lrf(_params(rank=rank, **kw), (600, 200))
    assert "\n" not in str(info.value)


def test_a_stream_refuses_two_pass_before_anything_is_written(tmp_path: Any) -> None:
    from pipeline.params import StreamParams

    with pytest.raises(InvalidParameterError, match="a stream is read once") as info:
        StreamParams(n_rows=50, n_cols=20, rank=2, horizon=4, epsilon=1.0, delta=1e-6,
                     algorithm="two-pass")  # fmt: skip
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# the run: charge first, resume, non-private exactness
# ---------------------------------------------------------------------------
class _Recording(ArraySource):
    def __init__(self, A: np.ndarray, events: list[str]) -> None:
        super().__init__(A)
        self.events = events

    def sketch(self, request: Any) -> dict[str, Any]:
        self.events.append("read")
        return super().sketch(request)


def _matrix(seed: int = 0, m: int = 400, n: int = 120, k: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(m, k)))
    V, _ = np.linalg.qr(rng.normal(size=(n, k)))
    return (U * np.array([60.0, 40.0, 25.0][:k])) @ V.T + 0.01 * rng.normal(size=(m, n))


def test_the_job_is_charged_once_after_pass_1_and_before_any_noise() -> None:
    """Both passes are charged together, once pass 1 has read (and validated) the
    data and before the noise of Z, which pass 2 depends on, is drawn."""
    events: list[str] = []
    A = _matrix()
    plan = plan_lrf(_params(unit="entry"), A.shape)
    journal = _ListJournal(lambda sk: events.append("journal " + ",".join(sorted(sk))))
    hooks = ReleaseHooks(
        sketch_seed=5, noise_key=NoiseKey.insecure_from_seed(1), journal=journal,
        charge=lambda: events.append("charge"),
    )  # fmt: skip
    run_lrf(_Recording(A, events), plan, hooks)
    assert events == ["read", "journal Z", "charge", "read", "journal Y,Z"]


class _ListJournal:
    """A factorization's journal that hands each record to ``on_record``; it
    loads ``saved`` (None: nothing journaled)."""

    def __init__(
        self, on_record: Any = None, saved: dict[str, Any] | None = None
    ) -> None:
        self.on_record, self.saved = on_record, saved

    def load(self, label: str) -> dict[str, Any] | None:
        assert label == SKETCHES
        return None if self.saved is None else dict(self.saved)

    def record(self, label: str, sketches: dict[str, Any]) -> None:
        assert label == SKETCHES
        if self.on_record is not None:
            self.on_record(sketches)


@pytest.mark.parametrize("resume_with", [("Z",), ("Z", "Y")])
def test_a_resume_from_the_journaled_sketches_is_bit_for_bit_the_same(
    resume_with: tuple[str, ...],
) -> None:
    A = _matrix(1)
    plan = plan_lrf(_params(unit="row"), A.shape)
    key = NoiseKey.insecure_from_seed(3)
    journal: list[dict[str, Any]] = []
    ref = run_two_pass(ArraySource(A), plan, ReleaseHooks(
        sketch_seed=9, noise_key=key,
        journal=_ListJournal(lambda sk: journal.append(dict(sk)))))  # fmt: skip
    saved = journal[len(resume_with) - 1]
    assert sorted(saved) == sorted(resume_with)
    src = ArraySource(A)
    got = run_two_pass(src, plan, ReleaseHooks(
        sketch_seed=9, noise_key=key, journal=_ListJournal(saved=saved)))  # fmt: skip
    assert src.n_passes == 2 - len(resume_with)
    for name in ("U", "S", "V"):
        assert getattr(got, name).tobytes() == getattr(ref, name).tobytes(), name
    # negative control: another noise key gives another release
    other = run_two_pass(ArraySource(A), plan, ReleaseHooks(
        sketch_seed=9, noise_key=NoiseKey.insecure_from_seed(4),
        journal=_ListJournal(saved=saved)))  # fmt: skip
    assert other.S.tobytes() != ref.S.tobytes()


def test_non_private_two_pass_recovers_an_exactly_low_rank_matrix() -> None:
    rng = np.random.default_rng(2)
    A = rng.normal(size=(300, 4)) @ rng.normal(size=(4, 80))
    f = factorize(A, 4, private=False, algorithm="two-pass", seed=1)
    # float64 round-off of two products and an SVD of a 300 x 80 matrix
    np.testing.assert_allclose((f.U * f.S) @ f.V.T, A, atol=1e-9 * np.abs(A).max())
    np.testing.assert_allclose(f.U.T @ f.U, np.eye(4), atol=1e-12)
    np.testing.assert_allclose(f.V.T @ f.V, np.eye(4), atol=1e-12)
    assert f.report["n_passes"] == 2


def test_the_report_records_the_algorithm_sizes_split_and_noise() -> None:
    A = _matrix(3)
    f = factorize(A, 3, epsilon=EPS, delta=DELTA, algorithm="two-pass", unit="entry",
                  seed=4, insecure_noise_seed=2)  # fmt: skip
    r = f.report
    assert r["algorithm"] == "two-pass"
    assert r["rank"] == 3
    assert r["n_passes"] == 2
    assert r["n_passes_planned"] == 2
    p = r["parameters"]
    assert p["core_size"] == 100
    assert p["sketch_size"] == 3
    assert p["weight_z"] == DEFAULT_WEIGHT_Z
    assert p["weight_y"] == pytest.approx(1 - DEFAULT_WEIGHT_Z)
    assert p["operator"] == "sparse-sign"
    assert r["sensitivity"] == "exact"
    assert r["calibration"]["delta_jl"] == 0.0
    assert r["public_sketch_seed"] is True
    sig = {s["name"]: s["sigma"] for s in r["sketches"]}
    s = gaussian_noise_multiplier(EPS, DELTA)
    assert sig["Z"] == pytest.approx(s / math.sqrt(DEFAULT_WEIGHT_Z), rel=1e-12)
    assert sig["Y"] == pytest.approx(s / math.sqrt(1 - DEFAULT_WEIGHT_Z), rel=1e-12)
    assert "GDP" in r["mechanism"]
    assert f.U.shape == (400, 3)
    assert f.V.shape == (120, 3)


# ---------------------------------------------------------------------------
# utility against the full-matrix Gaussian mechanism
# ---------------------------------------------------------------------------
def _strong_low_rank(m: int, n: int, k: int, seed: int) -> np.ndarray:
    """Random-sign rank-k signal with weights 1..0.4 on a weak background, |a_ij| <= 1."""
    rng = np.random.default_rng(seed)
    w = np.linspace(1.0, 0.4, k)
    U = rng.choice([-1.0, 1.0], size=(m, k))
    V = rng.choice([-1.0, 1.0], size=(n, k))
    A = (U * w) @ V.T / w.sum() * 0.9 + 0.1 * rng.uniform(-1, 1, size=(m, n))
    return np.clip(A, -1.0, 1.0)


def test_utility_is_within_1_15_of_the_full_gaussian_mechanism() -> None:
    """Median over 5 noise draws of the additive spectral error, entry unit, C = 1.

    Tolerance 1.15: the target bound for the two-pass algorithm
    (spec private-lrf-2 section 6 measured 1.03-1.10 for w_Z in 0.1-0.2).
    Measured here 0.92 at epsilon 2 (the full GM error, 122, is below
    sigma_1 = 202); at epsilon 4 and 8 this case gives 1.17 and 1.21 (0.89,
    1.12 and 1.19 before the released singular values were debiased). The
    negative control (w_Z = 0.9: 1.56; 0.6 now gives 1.05, the debiasing
    making up for much of a poor split) shows the check can fail.
    """
    m, n, k, eps = 2000, 300, 5, 2.0
    A = _strong_low_rank(m, n, k, seed=0)
    sv = np.linalg.svd(A, compute_uv=False)
    tail = sv[k]
    s = gaussian_noise_multiplier(eps, DELTA)

    def err(U: np.ndarray, S: np.ndarray, V: np.ndarray) -> float:
        return float(np.linalg.norm(A - (U * S) @ V.T, 2) - tail)

    gm = []
    for d in range(5):
        u, sg, vt = np.linalg.svd(A + np.random.default_rng(100 + d).normal(scale=s, size=A.shape),
                                  full_matrices=False)  # fmt: skip
        gm.append(err(u[:, :k], sg[:k], vt[:k].T))
    ref = float(np.median(gm))
    assert ref < sv[0]  # a regime where the full GM keeps the signal

    def ratio(weight_z: float) -> float:
        plan = plan_two_pass(_params(rank=k, epsilon=eps, unit="entry"), A.shape, weight_z=weight_z)
        errs = [
            err(*_factors(run_two_pass(
                ArraySource(A),
                plan,
                ReleaseHooks(sketch_seed=d, noise_key=NoiseKey.insecure_from_seed(200 + d)),
            )))
            for d in range(5)
        ]  # fmt: skip
        return float(np.median(errs)) / ref

    assert ratio(DEFAULT_WEIGHT_Z) <= 1.15
    assert ratio(0.9) > 1.15  # negative control: a poor split fails the bound


def _factors(f: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return f.U, f.S, f.V


def test_debiased_singular_values_remove_the_noise_energy() -> None:
    """E[Y^T Y] = X_k^T X_k + m sigma^2 I for Y = X_k + N (m x k, V_k fixed before N):
    over 400 draws the mean debiased s_i^2 is x_i^2 within 5 standard errors (the
    eigenvalues' spreading adds O(k sigma^2) = 0.75 here, far below them); the raw
    s_i^2 are m sigma^2 = 1000 too large (negative control)."""
    m, sigma, x = 4000, 0.5, np.array([60.0, 40.0, 20.0])
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((m, 3)))
    raw, debiased = [], []
    for _ in range(400):
        s = np.linalg.svd(Q * x + sigma * rng.standard_normal((m, 3)), compute_uv=False)
        raw.append(s**2)
        debiased.append(debiased_singular_values(s, m, sigma) ** 2)
    raw_a, deb = np.array(raw), np.array(debiased)
    se = deb.std(axis=0) / math.sqrt(len(deb))
    assert np.all(np.abs(deb.mean(axis=0) - x**2) < 5 * se), (deb.mean(axis=0), x**2, se)
    assert np.all(raw_a.mean(axis=0) - x**2 > 100 * se)  # the bias the debiasing removes
    # below the noise: 0; no noise (a non-private run): unchanged
    assert debiased_singular_values(np.array([10.0]), m, sigma)[0] == 0.0
    np.testing.assert_array_equal(debiased_singular_values(x, m, 0.0), x)


def test_two_pass_singular_values_are_those_of_a_in_the_released_subspace() -> None:
    """The released S estimates the singular values of ``A V`` (V the released right
    factor, whose span is V_k's): the best S for a factorization with this V.

    Strong rank-5 signal, entry unit, epsilon 2, where the noise energy ``M sigma_Y^2``
    is 13600 against ``sigma_5^2`` = 6200. Tolerance per component: 5 standard
    deviations of ``s_i^2``, ``sqrt(4 x_i^2 sigma_Y^2 + 2 M sigma_Y^4)`` for ``Y`` =
    ``X V_k + N`` (M x k). Negative control: the noisy Y's own singular values, which
    the release used to return, are ``M sigma_Y^2`` too large in their squares.
    ``A V`` itself holds less than ``A``'s top singular values when V_k comes from a
    noisy Z (here 179-36 against 202-78), which no estimate from Y can see.
    """
    m, n, k, eps = 2000, 300, 5, 2.0
    A = _strong_low_rank(m, n, k, seed=0)
    plan = plan_two_pass(_params(rank=k, epsilon=eps, unit="entry"), A.shape)
    M, sy = plan.oriented_shape[0], plan.sigma("Y")
    for d in range(3):
        f = run_two_pass(
            ArraySource(A),
            plan,
            ReleaseHooks(sketch_seed=d, noise_key=NoiseKey.insecure_from_seed(10 + d)),
        )
        x = np.linalg.svd(A @ f.V, compute_uv=False)
        tol = 5 * np.sqrt(4 * x**2 * sy**2 + 2 * M * sy**4)
        assert np.all(np.abs(f.S**2 - x**2) <= tol), (f.S, x)
        raw = f.S**2 + M * sy**2
        assert np.all(raw - x**2 > tol), (raw, x**2, tol)
