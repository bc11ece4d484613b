"""The audit through the mechanisms' own code and noise generator, run by run.

``test_audit_mechanisms`` draws the likelihood-ratio projections of the noise
directly. Here every sample is one real run -- ``run_lrf`` (its noisy ``Y, Z``
captured where post-processing starts) or ``run_pca`` (its releases read from
the journal) -- with its own insecure test key ``NoiseKey.insecure_from_seed``,
so the ChaCha noise stream, the key derivation, the calibration and the clipping
are all the production ones. Two things are checked:

* *Fidelity.* The exact statistics the audits use are exactly what the real
  runs add noise to: a release minus its noise (regenerated from the same key:
  the unit-noise streams times the sigma recorded in the calibration) equals
  the audit's reference statistic, for every released statistic of every
  mechanism.
* *The audit end to end.* ``eps_lb <= epsilon`` for the correct mechanisms and
  the clip-after-sum control is caught; the projections of the real releases
  are N(0, 1) under ``D`` and N(||Delta|| / sigma, 1) under ``D'`` (KS tests,
  false failure 1e-4 each in CI), which is the law the direct draws assume.

With ``N_END_TO_END`` = 1500 runs per neighbour the correct mechanisms' bounds
are near 0 (too few samples to certify anything); these tests are about the
path, the large-sample audits are in ``test_audit_mechanisms``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from audit_cases import (
    CONFIDENCE,
    E2E,
    E2E_LRF,
    N_END_TO_END,
    NIGHTLY,
    e2e_row,
    lrf_capture,
    lrf_exact,
    lrf_neighbours,
    lrf_plan,
    lrf_release,
    past_journal,
    pca_exact,
    pca_neighbours,
    pca_plan,
    pca_rows,
    resumed_factorize,
    z_plan,
)
from scipy import stats

from pipeline.algorithms import lrf
from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import MemoryJournal
from pipeline.algorithms.pca import power as power_pca
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Algorithm

pytestmark = pytest.mark.audit

P_FAIL = 1e-6 if NIGHTLY else 1e-4
#: Fidelity tolerance: release - noise recovers the statistic up to the rounding
#: of one addition of numbers of size ~sigma (~1e-16 sigma; 1e-12 leaves room).
FIDELITY_RTOL = 1e-12


def _lrf_noise(plan: lrf.LrfPlan, key: NoiseKey, name: str) -> np.ndarray:
    """The noise of sketch ``name`` regenerated from the key, scaled by the calibration.

    Built from :class:`GaussianNoise` directly (the documented scheme: unit
    normals of stream ``key.derive(code)`` along the data axis, times the
    calibrated sigma), not through run_lrf's own helper, so a wrong sigma or
    stream there would show.
    """
    M, N = plan.oriented_shape
    t, v = plan.t, plan.v
    spectral = plan.params.algorithm is Algorithm.SPECTRAL
    # name -> (stream code, length along the data axis, dim, stored transposed)
    layout = (
        {"Y": (NoiseCode.Y, M, t, False), "Z": (NoiseCode.Z, N, v, True)}
        if spectral
        else {
            "Yc": (NoiseCode.Y_C, M, t, False),
            "Yr": (NoiseCode.Y_R, N, t, True),
            "Z": (NoiseCode.Z_CORE, v, v, False),
        }
    )
    code, length, dim, transposed = layout[name]
    assert plan.calibration is not None
    sigma = next(sk.sigma for sk in plan.calibration.sketches if sk.name == name)
    unit = GaussianNoise(
        key=key.derive(int(code)),
        sigma=1.0,
        length=length,
        dim=dim,
        tile_size=plan.params.tile_size,
    ).dense()
    return sigma * (unit.T if transposed else unit)


@pytest.mark.parametrize("algorithm", [Algorithm.SPECTRAL, Algorithm.LOW_SPACE])
def test_lrf_reference_is_what_run_lrf_noises(algorithm: Algorithm) -> None:
    plan = lrf_plan(algorithm, 1.0)
    A, _ = lrf_neighbours()
    key = NoiseKey.insecure_from_seed(7)
    with lrf_capture() as captured:
        released = lrf_release(A, plan, key, captured)
    exact = lrf_exact(A, plan)
    for name, value in released.items():
        scale = next(sk.sigma for sk in plan.calibration.sketches if sk.name == name)
        np.testing.assert_allclose(
            value - _lrf_noise(plan, key, name),
            exact[name],
            rtol=0.0,
            atol=FIDELITY_RTOL * scale,
            err_msg=name,
        )


def _pca_release(
    A: np.ndarray, plan: power_pca.PcaPlan, key: NoiseKey, journal: MemoryJournal
) -> MemoryJournal:
    power_pca.run_pca(
        power_pca.ArrayRowSource(A), plan, ReleaseHooks(noise_key=key, journal=journal)
    )
    return journal


@pytest.mark.parametrize(
    ("release", "method", "label"),
    [
        ("M", "analyze-gauss", "M"),
        ("M", "power", "M"),
        ("H", "power", "H0"),
        ("Z", "power", "Z0"),
    ],
)
def test_pca_reference_is_what_run_pca_noises(
    release: str, method: str, label: str
) -> None:
    plan = (
        z_plan(1.0) if release == "Z" else pca_plan(1.0, method=method, focus=release)
    )
    A, _ = pca_neighbours(*pca_rows(release, plan))
    key = NoiseKey.insecure_from_seed(11)
    journal = MemoryJournal()
    if release == "H":
        journal.record("M", past_journal().values["M"])
    elif release == "Z":
        journal = past_journal()
    value = _pca_release(A, plan, key, journal).values[label]
    sigma = next(m.sigma for m in plan.calibration.mechanisms if m.label == release)
    symmetric = release != "Z"
    noise = sigma * power_pca._noise(key, label, value.shape, symmetric)
    np.testing.assert_allclose(
        value - noise,
        pca_exact(A, plan, release),
        rtol=0.0,
        atol=FIDELITY_RTOL * sigma,
    )


@pytest.mark.parametrize("key", list(E2E))
def test_end_to_end(
    key: str, global_seed: int, audit_rows: list[dict[str, Any]]
) -> None:
    run = E2E[key](N_END_TO_END, global_seed)
    row = e2e_row(run, CONFIDENCE)
    audit_rows.append(row)
    if run.broken:
        assert row["epsilon_lb"] > run.epsilon, f"{run.key}: control not caught"
        return
    assert row["epsilon_lb"] <= run.epsilon, f"{run.key}: privacy violation found"
    for j, block in enumerate(run.blocks):
        shift = float(np.linalg.norm(block.difference)) / block.sigma
        null, alt = run.null[:, j], run.alt[:, j]
        assert stats.kstest(null, "norm").pvalue > P_FAIL, block.name
        assert stats.kstest(alt - shift, "norm").pvalue > P_FAIL, block.name
        # negative control: half the noise (noise per chunk with P = 4) is
        # visible to the same test at this size (KS distance 0.16, ~6 / sqrt(n))
        assert stats.kstest(null / 2.0, "norm").pvalue < P_FAIL, block.name


def test_a_resumed_release_is_the_uninterrupted_release(tmp_path: Any) -> None:
    """A factorize that crashed after its charge and was resumed from its journal
    releases what an uninterrupted run with the same key and seed releases, bit
    for bit, and that minus its noise is the audit's reference statistic.

    Negative control: a resume that drew a new key instead of the journal's
    (one more draw of noise for one charge) is caught by the same comparison.
    """
    import pipeline.jobs.engine as release_module

    plan = lrf_plan(Algorithm.SPECTRAL, 1.0, **E2E_LRF)
    data = lrf_neighbours(E2E_LRF["shape"])
    keys = [NoiseKey.insecure_from_seed(s) for s in (3, 4)]
    with resumed_factorize(str(tmp_path)) as release:
        resumed = [release(A, k) for A, k in zip(data, keys, strict=True)]
    with lrf_capture() as captured:
        plain = [
            lrf_release(A, plan, k, captured) for A, k in zip(data, keys, strict=True)
        ]

    def check(got: dict[str, Any], want: dict[str, Any], A: Any, key: NoiseKey) -> None:
        exact = lrf_exact(A, plan)
        for name in ("Y", "Z"):
            assert got[name].tobytes() == want[name].tobytes(), name
            scale = next(
                sk.sigma for sk in plan.calibration.sketches if sk.name == name
            )
            np.testing.assert_allclose(
                got[name] - _lrf_noise(plan, key, name), exact[name],
                rtol=0.0, atol=FIDELITY_RTOL * scale, err_msg=name,
            )  # fmt: skip

    for got, want, A, key in zip(resumed, plain, data, keys, strict=True):
        check(got, want, A, key)

    real = release_module.ReleaseJob._resume_or_start

    def resume_with_a_new_key(job: Any) -> None:
        real(job)
        if job.resumed:
            job.noise_key = NoiseKey.insecure_from_seed(99)

    release_module.ReleaseJob._resume_or_start = resume_with_a_new_key
    try:
        with resumed_factorize(str(tmp_path)) as release:
            broken = release(data[0], keys[0])
    finally:
        release_module.ReleaseJob._resume_or_start = real
    with pytest.raises(AssertionError):
        check(broken, plain[0], data[0], keys[0])
