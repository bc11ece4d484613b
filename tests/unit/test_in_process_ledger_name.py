"""The in-process accountant of an in-memory dataset never shows the data's digest.

Without a persistent ledger, an in-memory release charges this process's
accountant: the one of every in-memory input, or the one of a dataset the
caller names with a public label (``dataset=``); neither is found by the data.
A digest of the array's bytes (the input fingerprint a resumed job compares)
is a deterministic function of the private data: an adversary who knows every
row but one can test candidate values of the last row against it, so it must
stay in the trusted process. Reports and refusals show the accountant under
its public name; a crash journal kept beside a persistent ledger is named
without the digest too.

Regression: the reports of in-memory ``factorize``, ``pca`` and ``DPPCA`` used
to carry the digest as ``report["ledger"]["dataset"]``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pipeline import api
from pipeline.accounting.ledger import IN_MEMORY_DATASET, Ledger
from pipeline.errors import PipelineError
from pipeline.estimators import DPPCA
from pipeline.io.journal import array_fingerprint

M, N, K = 200, 10, 2


@pytest.fixture
def data(global_seed: int) -> np.ndarray:
    A = np.random.default_rng(global_seed).standard_normal((M, N)) / np.sqrt(N)
    A[0, 0] += 1e-7  # a dataset no other test charges in this process
    return A


def test_reports_and_refusals_never_show_the_digest_of_the_data(
    data: np.ndarray,
) -> None:
    digest = array_fingerprint(data)
    texts = [
        json.dumps(api.factorize(data, K, epsilon=1.0, delta=1e-6).report),
        json.dumps(
            api.pca(
                data, K, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.05
            ).report
        ),
        json.dumps(DPPCA(K, method="analyze-gauss").fit(data).privacy_report_),
    ]
    # a release an accountant refuses (a column unit on a row accountant) says so;
    # a named one, whose first release is a row's whatever ran before in the process
    rows = f"rows-{os.getpid()}"
    api.factorize(data, K, epsilon=1.0, delta=1e-6, dataset=rows)
    with pytest.raises(PipelineError) as refused:
        api.factorize(data, K, epsilon=1.0, delta=1e-6, unit="column", dataset=rows)
    texts.append(str(refused.value))
    for text in texts:
        assert digest not in text
        assert digest[:16] not in text
    assert "column" in texts[-1]
    assert rows in texts[-1]
    # the three releases went to the process's one accountant, named publicly
    # (counts relative: other tests of this process may have charged it before)
    ledgers = [json.loads(t)["ledger"] for t in texts[:3]]
    first = ledgers[0]["n_releases"]
    assert [x["n_releases"] for x in ledgers] == [first, first + 1, first + 2]
    assert {x["dataset"] for x in ledgers} == {IN_MEMORY_DATASET}
    # negative control: the scan finds the digest where it is
    assert digest in json.dumps({"dataset": array_fingerprint(data)})


def test_a_journal_beside_the_ledger_is_not_named_after_the_data(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-memory release with a persistent ledger and no output journals
    beside the ledger; the journal's name (visible to whoever lists that
    directory) depends on the public parameters only, not on the data."""
    import shutil

    from pipeline.errors import StoreLayoutError

    book = Ledger.create(
        tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=9.0, delta=1e-4
    )
    kw = {"epsilon": 1.0, "delta": 1e-6, "ledger": book, "seed": 5}

    class Crash(Exception):
        pass

    def crash(*a: object, **k: object) -> None:
        raise Crash

    def crashed_journal(A: np.ndarray) -> str:
        with monkeypatch.context() as mp:
            mp.setattr(Ledger, "charge", crash)  # the journal exists by then
            with pytest.raises(Crash):
                api.factorize(A, K, **kw)
        (name,) = [p for p in os.listdir(tmp_path) if p.endswith(".dplr-journal")]
        return name

    first = crashed_journal(data)
    shutil.rmtree(tmp_path / first)
    second = crashed_journal(data + 1.0)
    assert first == second
    # the same job on the other data finds that journal and is refused, naming
    # the field that differs, not its value
    with pytest.raises(StoreLayoutError, match="input_fingerprint") as refused:
        api.factorize(data, K, **kw)
    assert array_fingerprint(data) not in str(refused.value)
    assert array_fingerprint(data + 1.0) not in str(refused.value)
    assert book.releases == ()
    # and the interrupted job itself still resumes from it
    rel = api.factorize(data + 1.0, K, **kw)
    assert rel.report["resumed_from_journal"] is True
    assert len(book.releases) == 1
    assert not (tmp_path / second).exists()


def test_no_journal_without_out_or_a_persistent_ledger(
    data: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/faults.md: a private release with neither ``out``, ``journal`` nor a
    persistent ledger keeps nothing on disk (its accountant is in-process)."""
    from pipeline.io import FileJournal

    created: list[object] = []
    real = FileJournal.create.__func__  # type: ignore[attr-defined]

    def spying(cls: type, *a: object, **kw: object) -> object:
        created.append(a[0])
        return real(cls, *a, **kw)

    monkeypatch.setattr(FileJournal, "create", classmethod(spying))
    rel = api.factorize(data, K, epsilon=1.0, delta=1e-6)
    assert rel.report["ledger"]["kind"] == "in-process"
    assert created == []
