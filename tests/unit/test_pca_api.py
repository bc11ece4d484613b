"""``pipeline.pca``: budget before data, the executed ledger equals the plan, resume.

In-memory inputs (no cluster); the Dask paths are in tests/distributed and
tests/cli.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms import pca as power_pca
from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import power
from pipeline.errors import BudgetExceededError, InvalidParameterError
from pipeline.io import default_journal_path, read_group
from pipeline.jobs import pca as pca_job
from pipeline.linalg.synthetic import coherent_matrix
from pipeline.params import PcaParams

N, D, K = 4096, 16, 2


@pytest.fixture
def data() -> np.ndarray:
    return coherent_matrix(N, D, K, support=N, top=300, bottom=60, rng=7).A


@pytest.fixture
def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every band pass reads the data: count them."""
    reads: list[int] = []
    real = power.band_pass

    def counting(*args: object, **kw: object) -> np.ndarray:
        reads.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(power, "band_pass", counting)
    return reads


def _ledger(tmp_path: os.PathLike[str], eps: float = 2.0) -> Ledger:
    return Ledger.create(
        os.path.join(tmp_path, "d.dplr-ledger.json"),
        dataset="d",
        epsilon=eps,
        delta=1e-5,
    )


def test_executed_ledger_equals_the_plan(
    data: np.ndarray, tmp_path: os.PathLike[str]
) -> None:
    book = _ledger(tmp_path)
    rel = api.pca(
        data, K, epsilon=1.0, delta=1e-6, iterations=3, clip_radius=0.05, ledger=book
    )
    plan = power_pca.plan_pca(
        PcaParams(
            rank=K, epsilon=1.0, delta=1e-6, iterations=3, clip_radius=0.05
        ),
        data.shape,
    )
    (rec,) = book.releases
    # one record, whose Gaussian cost is exactly the planned mu (the run is mu-GDP)
    assert rec["noise_multiplier_total"] == pytest.approx(
        1.0 / plan.calibration.mu, rel=1e-12
    )
    # every planned mechanism was released, T times for H and Z, and nothing else
    planned = {m.label: m.count for m in plan.calibration.mechanisms}
    done = rel.report["releases"]
    assert planned == {"M": 1, "H": 3, "Z": 3}
    assert done == ["M", "H0", "Z0", "H1", "Z1", "H2", "Z2"]
    assert rel.report["n_passes"] == rel.report["n_passes_planned"] == 4


def test_over_budget_is_refused_before_any_read(
    data: np.ndarray, tmp_path: os.PathLike[str], count_reads: list[int]
) -> None:
    book = _ledger(tmp_path, eps=0.5)
    with pytest.raises(BudgetExceededError):
        api.pca(
            data,
            K,
            epsilon=1.0,
            delta=1e-6,
            iterations=3,
            clip_radius=0.05,
            ledger=book,
        )
    assert count_reads == []  # refused before the first read
    assert book.releases == ()
    # negative control: the same counter sees the reads of an accepted run (1 + T)
    api.pca(
        data, K, epsilon=0.25, delta=1e-6, iterations=3, clip_radius=0.05, ledger=book
    )
    assert len(count_reads) == 4


def test_selection_parameters_are_exclusive(data: np.ndarray) -> None:
    with pytest.raises(InvalidParameterError, match="select=True"):
        api.pca(data, K, epsilon=1.0, delta=1e-6, select=True, iterations=3)
    with pytest.raises(InvalidParameterError, match="select=True only"):
        api.pca(
            data,
            K,
            epsilon=1.0,
            delta=1e-6,
            iterations=3,
            clip_radius=0.1,
            radius_grid=[0.1],
        )


def test_selection_report_withholds_the_number_of_trials(data: np.ndarray) -> None:
    rel = api.pca(
        data,
        K,
        epsilon=4.0,
        delta=1e-6,
        select=True,
        radius_grid=[0.02, 0.04],
        iterations_grid=[1, 2],
        expected_trials=6,
        insecure_noise_seed=1,
    )
    rep = rel.report
    assert rep["n_passes"] is None
    assert rep["releases"] is None
    assert "n_graph_tasks" not in (rep["cluster"] or {})
    assert rep["selection"]["selected_clip_radius"] in (
        0.02,
        0.04,
    )
    assert rep["epsilon"] == 4.0
    assert rep["realised_epsilon"] <= 4.0
    np.testing.assert_allclose(rel.components.T @ rel.components, np.eye(K), atol=1e-12)


def test_resume_from_a_journal_draws_and_charges_nothing_twice(
    data: np.ndarray,
    tmp_path: os.PathLike[str],
    monkeypatch: pytest.MonkeyPatch,
    count_reads: list[int],
) -> None:
    book = _ledger(tmp_path)
    out = os.path.join(tmp_path, "rel.zarr")
    kw = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "iterations": 3,
        "clip_radius": 0.05,
        "insecure_noise_seed": 5,
    }
    clean = api.pca(data, K, **kw)  # type: ignore[arg-type]
    count_reads.clear()

    # crash right after the second Z release was journaled
    real_qr = power.qr_pos
    calls: list[int] = []

    def crashing_qr(Z: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated crash")
        return real_qr(Z)

    monkeypatch.setattr(power, "qr_pos", crashing_qr)
    with pytest.raises(KeyboardInterrupt):
        api.pca(data, K, out=out, ledger=book, **kw)  # type: ignore[arg-type]
    journal = default_journal_path(out)
    assert sorted(os.listdir(journal)) == sorted(
        ["header.json", "charged.json"]  # the charge marker, as for every release
        + [
            f"{x}{ext}"
            for x in ("M", "H0", "Z0", "H1", "Z1")
            for ext in (".npy", ".npy.sha256")
        ]
    )
    assert oct(os.stat(journal).st_mode & 0o777) == "0o700"
    assert oct(os.stat(os.path.join(journal, "header.json")).st_mode & 0o777) == "0o600"
    assert len(book.releases) == 1
    reads_before = len(count_reads)
    monkeypatch.setattr(power, "qr_pos", real_qr)

    resumed = api.pca(data, K, out=out, ledger=book, **kw)  # type: ignore[arg-type]
    assert len(book.releases) == 1  # charged once
    assert resumed.report["resumed_releases"] == ["M", "H0", "Z0", "H1", "Z1"]
    # the Gram pass is redone for H2 (it needs A^T A), then one pass for Z2
    assert len(count_reads) - reads_before == resumed.report["n_passes"] == 2
    np.testing.assert_array_equal(resumed.components, clean.components)
    arrays, report = read_group(out, ("components", "eigenvalues"))
    np.testing.assert_array_equal(arrays["components"], clean.components)
    assert report["release_id"] == book.releases[0]["release_id"]
    assert not os.path.exists(journal)  # it held the noise key


def test_journal_of_another_job_is_refused(
    data: np.ndarray, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.errors import StoreLayoutError

    out = os.path.join(tmp_path, "rel.zarr")
    monkeypatch.setattr(
        power, "qr_pos", lambda Z: (_ for _ in ()).throw(KeyboardInterrupt())
    )
    with pytest.raises(KeyboardInterrupt):
        api.pca(
            data, K, epsilon=1.0, delta=1e-6, iterations=3, clip_radius=0.05, out=out
        )
    monkeypatch.undo()
    with pytest.raises(StoreLayoutError, match=r"iterations|parameters"):
        api.pca(
            data, K, epsilon=1.0, delta=1e-6, iterations=4, clip_radius=0.05, out=out
        )


def _numbers(x: object) -> list[float]:
    if isinstance(x, dict):
        return [v for item in x.values() for v in _numbers(item)]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _numbers(item)]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return [float(x)]
    return []


def test_report_carries_no_data_values() -> None:
    # a generic matrix (no round-number spectrum that public parameters could match)
    A = np.random.default_rng(3).normal(size=(3000, D)) / (2 * math.sqrt(D))
    rel = api.pca(A, K, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.05)
    exact = np.linalg.svd(power_pca.prep_rows(A), compute_uv=False) ** 2
    reported = np.array(_numbers(rel.report))
    assert reported.size > 20  # the scan sees the report's numbers
    for v in exact:  # no exact eigenvalue of A^T A, to 6 significant digits
        assert not np.any(np.isclose(reported, v, rtol=1e-6, atol=0))
    # negative control: the released (noisy) eigenvalues are public and do differ
    assert not np.allclose(rel.eigenvalues[:K], exact[:K], rtol=1e-6)
    assert math.isfinite(rel.report["realised_epsilon"])


def test_selection_trials_share_passes_in_lockstep(data: np.ndarray) -> None:
    """Spec 4.6: one pass per iteration step for all trials of a batch, not per trial."""
    from pipeline.accounting.pca import calibrate_selection
    from pipeline.mechanisms.noise import NoiseKey

    cal = calibrate_selection(
        PcaParams(rank=K, epsilon=8.0, delta=1e-6), n_rows=N, n_features=D,
        radii=(0.02, 0.04), iteration_grid=(1, 2, 4), expected_trials=12,
    )  # fmt: skip
    key = NoiseKey.insecure_from_seed(11)
    one_batch = power_pca.run_selection(
        power_pca.ArrayRowSource(data),
        cal,
        ReleaseHooks(noise_key=key),
        max_concurrent_trials=10_000,
    )
    assert one_batch.iterations > 0  # the warm-start gap test passed: trials ran
    assert one_batch.n_passes <= 1 + 4  # Gram + T_max steps
    # negative control: one trial per batch reads the data once per trial step
    serial = power_pca.run_selection(
        power_pca.ArrayRowSource(data),
        cal,
        ReleaseHooks(noise_key=key),
        max_concurrent_trials=1,
    )
    assert serial.n_passes > one_batch.n_passes
    # same trials, same noise: batching changes the passes, not the release
    np.testing.assert_allclose(serial.components, one_batch.components, atol=1e-10)


def test_pipeline_pca_is_exported_lazily() -> None:
    """``pipeline.pca`` is the README's entry point, loaded on first use (PEP 562)."""
    import subprocess
    import sys

    code = (
        "import sys, pipeline; assert 'pipeline.api' not in sys.modules; "
        "from pipeline.api import pca; assert pipeline.pca is pca; "
        "assert 'pca' in pipeline.__all__; print('ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("method", ["analyze-gauss", "power"])
def test_rank_equal_to_d_gives_a_full_orthonormal_basis(
    data: np.ndarray, method: str
) -> None:
    """k = d is a PCA too: every component, ordered by the released eigenvalues."""
    fixed = {"iterations": 2, "clip_radius": 0.5} if method == "power" else {}
    rel = api.pca(
        data, D, epsilon=1.0, delta=1e-6, method=method, insecure_noise_seed=3, **fixed
    )
    X = rel.components
    assert X.shape == (D, D)
    np.testing.assert_allclose(X.T @ X, np.eye(D), atol=1e-10)
    assert rel.eigenvalues.shape == (D,)
    assert np.all(np.diff(rel.eigenvalues) <= 0)


def test_selection_refuses_rank_equal_to_d(data: np.ndarray) -> None:
    with pytest.raises(InvalidParameterError, match="select=True needs rank < n_features"):
        api.pca(data, D, epsilon=1.0, delta=1e-6, select=True)


def test_auto_is_the_default_and_records_its_public_choice(data: np.ndarray) -> None:
    """``pca(A, k, epsilon=, delta=)`` runs with no T or R: the rule picks Analyze
    Gauss here (n / d is below 8 eigenvalue floors) and says why in the report."""
    rel = api.pca(data, K, epsilon=1.0, delta=1e-6, insecure_noise_seed=1)
    auto = rel.report["auto"]
    assert auto["chosen"] == rel.report["parameters"]["method"] == "analyze-gauss"
    assert auto["n_over_d_gamma"] == pytest.approx(N / (D * auto["gamma"]))
    assert auto["n_over_d_gamma"] < auto["margin"]
    ag = api.pca(data, K, epsilon=1.0, delta=1e-6, method="analyze-gauss",
                 insecure_noise_seed=1)  # fmt: skip
    np.testing.assert_array_equal(rel.components, ag.components)


def test_auto_picks_the_power_method_when_n_over_d_is_large() -> None:
    """Negative control of the test above: the same rule at n = 2^19, d = 64."""
    from pipeline.algorithms.pca import AUTO_ITERATIONS, auto_radius

    plan = power_pca.plan_pca(
        PcaParams(rank=2, epsilon=1.0, delta=1e-6), (2**19, 64)
    )
    assert plan.params.method == "power"
    assert plan.auto["chosen"] == "power"
    assert plan.iterations == AUTO_ITERATIONS
    assert plan.params.clip_radius == pytest.approx(auto_radius(2**19, 2))
    assert plan.auto["n_over_d_gamma"] >= plan.auto["margin"]
    # the rule reads public values only: it is the same for any data of that shape
    given = power_pca.plan_pca(
        PcaParams(rank=2, epsilon=1.0, delta=1e-6, iterations=5), (4096, 16)
    )
    assert given.params.method == "power"
    assert given.iterations == 5


def test_default_selection_runs_every_candidate_once_composed_exactly(
    data: np.ndarray, tmp_path: os.PathLike[str]
) -> None:
    """``select=True``: Analyze Gauss and the auto rule's power candidate, each run
    once, charged to the ledger as one mu-GDP composition at exactly (epsilon, delta)."""
    from pipeline.accounting.pca_selection import CandidateSelection
    from pipeline.algorithms.pca import AUTO_ITERATIONS, auto_radius

    book = _ledger(tmp_path)
    rel = api.pca(data, K, epsilon=1.0, delta=1e-6, select=True, ledger=book,
                  insecure_noise_seed=4)  # fmt: skip
    cal = rel.report["calibration"]
    assert [(c["clip_radius"], c["iterations"]) for c in cal["candidates"]] == [
        (None, 0), (pytest.approx(auto_radius(N, K)), AUTO_ITERATIONS)
    ]
    assert rel.report["realised_epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert [m["label"] for m in rel.report["mechanisms"]] == ["M", "H[1]", "Z[1]", "s"]
    (record,) = book.releases
    assert record["contract"]["accountant"] == "gdp"
    sel = rel.report["selection"]
    assert sel["selected_iterations"] in (0, AUTO_ITERATIONS)
    plan = pca_job.pca_plan(
        PcaParams(rank=K, epsilon=1.0, delta=1e-6), (N, D), api.Selection()
    )
    assert isinstance(plan.calibration, CandidateSelection)


def test_selection_check_catches_an_under_noised_candidate() -> None:
    """Negative control: a candidate whose Z noise is below its accounted sigma."""
    import dataclasses

    from pipeline.accounting.pca_selection import calibrate_candidates
    from pipeline.errors import PrivacyConfigError

    cal = calibrate_candidates(PcaParams(rank=2, epsilon=1.0, delta=1e-6), n_rows=N,
                               n_features=D, candidates=[(None, 0), (0.05, 3)])  # fmt: skip
    cal.check()
    low = dataclasses.replace(cal, chi_z=(0.0, cal.chi_z[1] * 0.9))
    with pytest.raises(PrivacyConfigError, match=r"'Z\[1\]'"):
        low.check()
    fewer = dataclasses.replace(cal, mechanisms=cal.mechanisms[:-1])
    with pytest.raises(PrivacyConfigError, match="releases"):
        fewer.check()


def test_selection_returns_the_candidate_with_the_smallest_noisy_score(
    data: np.ndarray,
) -> None:
    """Every candidate runs once (M released once, shared); the winner is the
    arg-min of the journaled noisy scores, a power candidate's raised by the
    public margin, for several noise keys."""
    from pipeline.accounting.pca_selection import calibrate_candidates
    from pipeline.mechanisms.noise import NoiseKey

    cal = calibrate_candidates(PcaParams(rank=K, epsilon=2.0, delta=1e-6), n_rows=N,
                               n_features=D, candidates=[(None, 0), (0.05, 2), (0.4, 1)])  # fmt: skip
    winners = set()
    for seed in range(6):
        journal = power_pca.MemoryJournal()
        res = power_pca.run_selection(
            power_pca.ArrayRowSource(data),
            cal,
            ReleaseHooks(noise_key=NoiseKey.insecure_from_seed(seed), journal=journal),
        )  # fmt: skip
        assert res.releases.count("M") == 1
        assert {"H1_0", "Z1_0", "H1_1", "Z1_1", "H2_0", "Z2_0"} <= set(res.releases)
        # a power candidate must win by `margin` std of a difference of two scores
        penalty = cal.margin * math.sqrt(2.0) * cal.score_noise(res.gap)
        scores = [float(journal.load(f"s{i}")[0, 0]) + penalty * (i > 0) for i in range(3)]
        win = int(np.argmin(scores))
        assert (res.clip_radius, res.iterations) == cal.candidates[win]
        winners.add(win)
    assert len(winners) >= 1
