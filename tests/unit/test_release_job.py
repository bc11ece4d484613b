"""The one release job: the drifts between the old copies of the release steps.

Each test is the regression test of one finding of the release-path review;
it uses only the public functions, so it can be run against older code (the
test's docstring says what that code did).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.io
from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms.pca import power as power_pca
from pipeline.errors import StoreLayoutError
from pipeline.estimators import DPPCA
from pipeline.io import FileJournal, default_journal_path, read_group
from pipeline.jobs.engine import ReleaseSpec
from pipeline.linalg.synthetic import coherent_matrix

N, D, K = 4096, 12, 2
PCA = {"epsilon": 1.0, "delta": 1e-6, "iterations": 2, "clip_radius": 0.1}


class SimulatedCrash(Exception):
    """Stands for the client process dying at the injection point."""


@pytest.fixture
def data() -> np.ndarray:
    return coherent_matrix(N, D, K, support=N, top=300, bottom=60, rng=3).A


def _ledger(tmp_path: Path, eps: float = 4.0) -> Ledger:
    return Ledger.create(tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=eps,
                         delta=1e-5)  # fmt: skip


def _fail_publication(mp: pytest.MonkeyPatch) -> None:
    def failing(*a: Any, **kw: Any) -> None:
        raise SimulatedCrash("publication failed")

    mp.setattr(pipeline.io, "write_group", failing)


# ---------------------------------------------------------------------------
# Finding 1: a PCA resume could switch from a public-seed noise key to "private"
# ---------------------------------------------------------------------------
def test_a_public_seed_journal_is_never_resumed_as_a_private_release(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: the PCA journal header omitted ``insecure_noise_seed``, so run 2
    resumed every label of run 1 and reported ``"private": true`` with the
    public-seed components bit for bit."""
    book, out = _ledger(tmp_path), tmp_path / "rel.zarr"
    with monkeypatch.context() as mp:
        _fail_publication(mp)
        with pytest.raises(SimulatedCrash):
            api.pca(data, K, **PCA, out=out, ledger=book, insecure_noise_seed=0)
    journal = Path(default_journal_path(out))
    assert (journal / "M.npy").exists()  # the fault landed after the releases
    with pytest.raises(StoreLayoutError) as info:
        api.pca(data, K, **PCA, out=out, ledger=book)
    msg = str(info.value)
    assert "contract" in msg
    assert "insecure_noise_seed" in msg
    assert "\n" not in msg
    assert not out.exists()
    assert (journal / "M.npy").exists()
    # the rerun with the run's own arguments finishes it, still NOT PRIVATE
    rel = api.pca(data, K, **PCA, out=out, ledger=book, insecure_noise_seed=0)
    assert rel.report["private"] is False
    assert rel.report["insecure_noise_seed"] is True
    assert len(book.releases) == 1


def test_the_header_holds_the_whole_contract() -> None:
    """Every field of the contract and the noise kind change the header."""
    from pipeline.accounting.contract import PrivacyContract
    from pipeline.jobs.engine import InputRef
    from pipeline.sketches.operators import seed_fingerprint

    contract = PrivacyContract(unit="row", neighboring="replace", clip_norm=1.0,
                               epsilon=1.0, delta=1e-6, accountant="gdp", shape=(9, 3))  # fmt: skip
    ref = InputRef(path=None, fingerprint="f", shape=(9, 3), dtype="float64",
                   chunks=((9,), (3,)))  # fmt: skip
    base = ReleaseSpec(kind="pca", contract=contract, calibration=object(),
                       parameters={"rank": 1}, input=ref)  # fmt: skip
    variants = [
        {"insecure_noise_seed": 0},
        {"sketch_seed": 7, "sketch_seed_fingerprint": seed_fingerprint(7)},
        {"ledger": "/elsewhere/ledger.json"},
        *({"contract": PrivacyContract(**{**contract.to_dict(), **c, "shape": (9, 3)})}
          for c in ({"unit": "entry"}, {"neighboring": "add-remove"}, {"clip_norm": 2.0},
                    {"epsilon": 2.0}, {"secret_noise": False},
                    {"public_operators": True})),
    ]  # fmt: skip
    from dataclasses import replace

    headers = [
        json.dumps(replace(base, **v).header(), sort_keys=True) for v in variants
    ]
    assert (
        len({json.dumps(base.header(), sort_keys=True), *headers}) == len(variants) + 1
    )


# ---------------------------------------------------------------------------
# Finding 4: a private selection must not reveal the number of trials
# ---------------------------------------------------------------------------
def test_selection_reports_and_prints_nothing_that_depends_on_the_trials(
    data: np.ndarray,
) -> None:
    """Old code: the report kept ``timings_seconds`` and the progress printed
    "selection batch b/B: step t/T_max"."""
    progress = io.StringIO()
    # a budget at which the warm-start gap test passes, so trials really run
    rel = api.pca(data, K, epsilon=4.0, delta=1e-6, select=True, expected_trials=4.0,
                  insecure_noise_seed=4, progress=progress)  # fmt: skip
    assert rel.report["selection"]["selected_iterations"] > 0
    text = progress.getvalue()
    assert "selection" in text  # the run did speak: the check below can fail
    assert "batch" not in text
    assert "step" not in text
    assert "/" not in text
    assert rel.report["timings_seconds"] == {}
    assert rel.report["n_passes"] is None
    assert rel.report["releases"] is None


def test_negative_control_a_fixed_run_does_report_its_steps(data: np.ndarray) -> None:
    progress = io.StringIO()
    rel = api.pca(data, K, **PCA, insecure_noise_seed=4, progress=progress)
    assert "power iteration 1/2" in progress.getvalue()
    assert rel.report["timings_seconds"]["total"] > 0


# ---------------------------------------------------------------------------
# Finding 8: the crash windows of every kind of release
# ---------------------------------------------------------------------------
def test_pca_crash_after_publication_is_finished_by_the_rerun(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: no ``_published_by`` check in ``pca``; the rerun failed with
    "output exists" and left the journal (with the noise key) on disk."""
    book, out = _ledger(tmp_path), tmp_path / "rel.zarr"
    journal = Path(default_journal_path(out))
    with monkeypatch.context() as mp:

        def crash(self: FileJournal) -> None:
            raise SimulatedCrash("after publication, before removing the journal")

        mp.setattr(FileJournal, "remove", crash)
        with pytest.raises(SimulatedCrash):
            api.pca(data, K, **PCA, out=out, ledger=book)
    assert out.exists()
    assert journal.exists()
    rel = api.pca(data, K, **PCA, out=out, ledger=book)
    _, report = read_group(out, ())
    assert rel.report["release_id"] == report["release_id"]
    assert not journal.exists()
    assert len(book.releases) == 1


def test_a_failed_centred_fit_is_retried_without_a_second_charge(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: the DP mean was charged under a fresh id with no journal, so
    the retry charged it again (two "pca-dp-mean" records)."""
    book = _ledger(tmp_path)
    kw = {"method": "analyze-gauss", "centre": True, "epsilon": 1.0, "delta": 1e-6,
          "ledger": str(book.path)}  # fmt: skip
    real = power_pca.topk_eig
    with monkeypatch.context() as mp:

        def crash(*a: Any, **k: Any) -> Any:
            raise SimulatedCrash("in the PCA, after the mean was released")

        mp.setattr(power_pca, "topk_eig", crash)
        with pytest.raises(SimulatedCrash):
            DPPCA(K, **kw).fit(data)
    book.reload()
    assert len(book.releases) == 1  # the fault landed after the charge
    assert power_pca.topk_eig is real
    est = DPPCA(K, **kw).fit(data)
    book.reload()
    assert len(book.releases) == 1
    assert est.privacy_report_["release_id"] == book.releases[0]["release_id"]
    assert not list(tmp_path.glob(".*dplr-journal"))  # gone once the fit succeeded


def test_a_refused_job_leaves_nothing(data: np.ndarray, tmp_path: Path) -> None:
    book = _ledger(tmp_path, eps=0.5)
    with pytest.raises(Exception, match="budget"):
        api.pca(data, K, **PCA, out=tmp_path / "r.zarr", ledger=book)
    left = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock")
    assert left == ["d.dplr-ledger.json"]


# ---------------------------------------------------------------------------
# Finding 7: every private release is recorded somewhere
# ---------------------------------------------------------------------------
def test_in_memory_and_estimator_releases_charge_the_process_accountant(
    data: np.ndarray,
) -> None:
    """Old code: numpy inputs and the estimators got no ledger unless one was
    passed (``report["ledger"] is None``): the releases were charged nowhere.

    Both go to the process's one accountant of in-memory inputs, which other
    tests of this process may have charged before: counts are relative, and
    the exact composition of a fresh accountant is checked in
    ``tests/unit/test_in_process_accountant.py``."""
    from pipeline.accounting.ledger import IN_MEMORY_DATASET, in_process_ledger

    A = data[:1500]
    first = api.pca(A, K, **PCA)
    where = first.report["ledger"]
    assert where is not None
    assert where["kind"] == "in-process"
    assert where["path"] is None
    assert where["dataset"] == IN_MEMORY_DATASET
    est = DPPCA(K, method="analyze-gauss", epsilon=1.0, delta=1e-6).fit(A)
    after = est.privacy_report_["ledger"]
    assert after["n_releases"] == where["n_releases"] + 1
    book = in_process_ledger(None, None)  # type: ignore[arg-type]  # exists by now
    ids = [r["release_id"] for r in book.releases]
    assert ids[-2:] == [first.report["release_id"], est.privacy_report_["release_id"]]
    # the second release composes with the first: more epsilon at more delta
    assert after["epsilon_used"] > where["epsilon_used"]
    assert after["delta_used"] == pytest.approx(where["delta_used"] + 1e-6, rel=1e-12)


def test_a_persistent_ledger_takes_the_charge_instead(
    data: np.ndarray, tmp_path: Path
) -> None:
    book = _ledger(tmp_path)
    rel = api.pca(data, K, **PCA, ledger=book)
    assert rel.report["ledger"]["kind"] == "file"
    assert rel.report["ledger"]["path"] == str(book.path)
    assert len(book.releases) == 1


def test_an_in_memory_input_is_digested_only_for_a_journal(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint of an in-memory array (a digest of all its bytes) is made
    only when a journal needs it: not for a run without one, once for a run
    that keeps one (a persistent ledger)."""
    from pipeline.io import journal

    digested: list[int] = []
    real = journal.array_fingerprint

    def counting(array: Any) -> str:
        digested.append(1)
        return real(array)

    monkeypatch.setattr(journal, "array_fingerprint", counting)
    api.factorize(data, K, private=False)
    assert digested == []
    api.pca(data, K, **PCA, ledger=_ledger(tmp_path))
    assert digested == [1]  # negative control: the journal's header holds it


# ---------------------------------------------------------------------------
# A stream's creation goes through the job: a crash between its charge and its
# state is finished by the same command, not charged again
# ---------------------------------------------------------------------------
def _stream_init(state: Path, ledger: Path, crash: str | None) -> Any:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DPLR_CRASH_AT"}
    if crash is not None:
        env["DPLR_CRASH_AT"] = crash
    argv = [sys.executable, "-m", "pipeline", "stream", "init", str(state), "--rows", "40",
            "--cols", "10", "--rank", "2", "--horizon", "4", "--epsilon", "1",
            "--delta", "1e-6", "--ledger", str(ledger), "--budget-epsilon", "4",
            "--budget-delta", "1e-5"]  # fmt: skip
    return subprocess.run(
        argv, check=False, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_stream_init_killed_after_its_charge_is_finished_without_a_second(
    tmp_path: Path,
) -> None:
    """Old code: the charge came before the state was written, with nothing that
    remembered it: a rerun charged the stream again (and the first charge was lost)."""
    state, ledger = tmp_path / "s.stream", tmp_path / "pop.json"
    killed = _stream_init(state, ledger, "after-charge")
    assert killed.returncode == -9  # SIGKILL at the seam, after the charge
    assert not state.exists()
    (record,) = json.loads(ledger.read_text())["releases"]  # charged once
    (journal,) = tmp_path.glob(".pop.json.stream-*.dplr-journal")  # key and seed kept
    assert oct(journal.stat().st_mode & 0o777) == "0o700"
    rerun = _stream_init(state, ledger, None)
    assert rerun.returncode == 0, rerun.stderr
    assert len(json.loads(ledger.read_text())["releases"]) == 1
    from pipeline.jobs.stream import open_stream

    assert open_stream(state).manifest["stream_id"] == record["release_id"]
    assert not list(tmp_path.glob(".*dplr-journal"))


def test_a_stream_init_killed_after_its_state_leaves_no_journal_after_the_rerun(
    tmp_path: Path,
) -> None:
    """The journal (with the noise key) outlives a crash between the state and
    its removal; the same command then finishes the clean-up, charging nothing."""
    state, ledger = tmp_path / "s.stream", tmp_path / "pop.json"
    killed = _stream_init(state, ledger, "after-state")
    assert killed.returncode == -9
    assert state.exists()
    assert len(list(tmp_path.glob(".pop.json.stream-*.dplr-journal"))) == 1
    rerun = _stream_init(state, ledger, None)
    assert rerun.returncode == 0, rerun.stderr
    assert not list(tmp_path.glob(".*dplr-journal"))
    assert len(json.loads(ledger.read_text())["releases"]) == 1
    # another command on that state is still refused: it is not that job's stream
    other = _stream_init(state, tmp_path / "other.json", None)
    assert other.returncode == 2
    assert "already exists" in other.stderr


def test_negative_control_a_second_stream_is_charged_again(tmp_path: Path) -> None:
    """The same command on another state path is another stream: charged again."""
    ledger = tmp_path / "pop.json"
    assert _stream_init(tmp_path / "a.stream", ledger, None).returncode == 0
    assert _stream_init(tmp_path / "b.stream", ledger, None).returncode == 0
    assert len(json.loads(ledger.read_text())["releases"]) == 2
