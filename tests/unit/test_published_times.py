"""Published times never depend on the number of selection trials.

The random-stopping bound of a private selection [Papernot-Steinke] holds only
while the number of trials ``N`` stays hidden. A time stamped after the trials
(the report's ``created``) next to one stamped before them (the ledger record's
``time``), or a duration that covers them, reveals ``N``. A release therefore
stamps one time, before any data-dependent work, and publishes that same stamp
everywhere (docs/privacy.md, "Times").

The wall clock is replaced by a fake one that stands still except during the
trials, where it advances a fixed step per trial: with ``N`` differing between
two runs, any published time taken after the trials differs too, whatever the
machine's speed. No wall-clock time is asserted.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms.pca import selection as pca_select_run
from pipeline.io import FileJournal, read_group
from pipeline.io.batches import write_batch
from pipeline.jobs import stream
from pipeline.linalg.synthetic import coherent_matrix

N, D, K = 4096, 12, 2
#: Seeds of the secret stream whose random-stopping draws give N = 1 and N = 6
#: trials on the data below (counted by the test, not assumed).
SEEDS = (2, 4)
#: Seconds the fake clock advances per trial: far above the one-second
#: rounding of a published stamp, so one trial more shows in any later stamp.
STEP = 10.0
BASE = datetime.datetime(2001, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")


class FakeClock:
    """The time every clock of the process reads; it moves only in the trials."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.trials = 0

    def advance(self) -> None:
        self.trials += 1
        self.seconds += STEP


def _install(mp: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """Route the wall clock, the performance counter and ``datetime.now`` to ``clock``."""
    epoch = BASE.timestamp()

    class FakeDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            t = BASE + datetime.timedelta(seconds=clock.seconds)
            return t if tz is not None else t.replace(tzinfo=None)

        @classmethod
        def utcnow(cls) -> Any:  # type: ignore[override]
            return cls.now(None)

    mp.setattr(datetime, "datetime", FakeDatetime)
    mp.setattr(time, "time", lambda: epoch + clock.seconds)
    mp.setattr(time, "time_ns", lambda: int((epoch + clock.seconds) * 1e9))
    mp.setattr(time, "perf_counter", lambda: clock.seconds)
    mp.setattr(time, "process_time", lambda: clock.seconds)

    exact_score = pca_select_run.exact_score

    def one_trial(*args: Any, **kwargs: Any) -> Any:
        clock.advance()  # one trial's score: the per-trial work
        return exact_score(*args, **kwargs)

    mp.setattr(pca_select_run, "exact_score", one_trial)


def _journal_texts(mp: pytest.MonkeyPatch, into: list[str]) -> None:
    """Keep the text files of the journal just before the job removes it."""
    remove = FileJournal.remove

    def keep(self: FileJournal) -> None:
        for name in sorted(os.listdir(self.path)):
            if not name.endswith((".npy", ".sha256")):
                into.append(Path(self.path, name).read_text(errors="replace"))
        remove(self)

    mp.setattr(FileJournal, "remove", keep)


def _published(tmp_path: Path, seed: int) -> tuple[dict[str, Any], FakeClock]:
    """One private selection; what it published that could carry a time."""
    A = coherent_matrix(N, D, K, support=N, top=300, bottom=60, rng=3).A
    clock, journal, progress = FakeClock(), [], io.StringIO()
    tmp_path.mkdir()
    ledger = Ledger.create(tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=20.0,
                           delta=1e-5)  # fmt: skip
    out = tmp_path / "rel.zarr"
    with pytest.MonkeyPatch.context() as mp:
        _install(mp, clock)
        _journal_texts(mp, journal)
        rel = api.pca(A, K, epsilon=4.0, delta=1e-6, select=True, expected_trials=4.0,
                      insecure_noise_seed=seed, out=out, ledger=ledger,
                      progress=progress)  # fmt: skip
    assert rel.report["selection"]["warm_start_gap_test_passed"]  # trials did run
    _, stored = read_group(out, ())
    record = Ledger.open(ledger.path).releases[-1]
    texts = {
        "report": json.dumps(rel.report, sort_keys=True),
        "stored report": json.dumps(stored, sort_keys=True),
        "ledger record": json.dumps(record, sort_keys=True),
        "journal": "\n".join(journal),
    }
    published = {k: ISO.findall(v) for k, v in texts.items()}
    published["created"] = [stored["created"]]
    published["ledger time"] = [record["time"]]
    published["durations"] = [sorted(stored["timings_seconds"].items())]
    published["progress"] = [progress.getvalue()]
    return published, clock


def test_published_times_do_not_depend_on_the_number_of_trials(tmp_path: Path) -> None:
    """Old code: ``created`` was stamped after the trials and the ledger's ``time``
    at the charge, before them, so ``created`` moved with N (here by 50 s)."""
    (a, clock_a), (b, clock_b) = (_published(tmp_path / str(s), s) for s in SEEDS)
    # negative control: the runs really differ in N and the fake clock moved
    # through the trials by N steps, so a stamp taken after them would differ
    assert clock_a.trials != clock_b.trials, (clock_a.trials, clock_b.trials)
    assert clock_a.seconds == STEP * clock_a.trials > 0
    assert clock_b.seconds == STEP * clock_b.trials > 0
    # the code read the fake clock (a real one would not give 2001)
    assert a["created"][0].startswith("2001-02-03T")
    assert a == b
    # one stamp for everything published
    assert a["created"] == a["ledger time"]
    assert a["journal"] == []


def test_negative_control_the_checker_sees_a_stamp_taken_after_the_trials(
    tmp_path: Path,
) -> None:
    """The same extraction finds the leak when a time is stamped after the trials."""
    clock = FakeClock()
    with pytest.MonkeyPatch.context() as mp:
        _install(mp, clock)
        before = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        clock.advance()
        after = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    assert ISO.findall(json.dumps({"created": before})) != ISO.findall(
        json.dumps({"created": after})
    )


def test_a_resumed_release_publishes_the_stamp_of_its_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun that resumes a charged release writes the charge's stamp, not its own.

    Old code: the rerun's report said when the rerun ended (here 1000 s after
    the charge), a time with no relation to the record in the ledger.
    """
    import pipeline.io

    A = coherent_matrix(N, D, K, support=N, top=300, bottom=60, rng=3).A
    ledger = Ledger.create(tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=20.0,
                           delta=1e-5)  # fmt: skip
    kw: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "iterations": 2,
                          "clip_radius": 0.1, "insecure_noise_seed": 1,
                          "out": tmp_path / "rel.zarr", "ledger": ledger}  # fmt: skip
    clock = FakeClock()
    _install(monkeypatch, clock)
    with pytest.MonkeyPatch.context() as mp:

        def failing(*a: Any, **k: Any) -> None:
            raise OSError("publication failed")

        mp.setattr(pipeline.io, "write_group", failing)
        with pytest.raises(OSError, match="publication failed"):
            api.pca(A, K, **kw)
    charged = Ledger.open(ledger.path).releases[-1]
    clock.seconds += 1000.0  # the rerun starts later
    rel = api.pca(A, K, **kw)
    assert rel.report["resumed_releases"]  # it did resume, no new charge
    assert len(Ledger.open(ledger.path).releases) == 1
    assert charged["time"] == BASE.isoformat(timespec="seconds")
    assert rel.report["created"] == charged["time"]


def _stream_created(tmp_path: Path, n_batches: int) -> tuple[str, FakeClock]:
    """A private stream whose first epoch holds ``n_batches`` batches; its release's time.

    The fake clock advances one step per batch folded into the tree (the sketching
    of an epoch's updates, whose work grows with their number).
    """
    clock = FakeClock()
    tmp_path.mkdir()
    state = tmp_path / "s.stream"
    stream.stream_init(state, n_rows=30, n_cols=20, rank=2, horizon=2, epsilon=1.0,
                       delta=1e-6, unit="row", ledger=tmp_path / "d.dplr-ledger.json",
                       budget=(2.0, 1e-5))  # fmt: skip
    for b in range(n_batches):
        batch = {"entity": np.array([b]), "i": np.array([b]), "j": np.array([b]),
                 "s": np.array([0.5])}  # fmt: skip
        write_batch(tmp_path / f"b{b}.npz", batch)
        stream.stream_ingest(state, tmp_path / f"b{b}.npz", epoch=1)
    with pytest.MonkeyPatch.context() as mp:
        _install(mp, clock)
        sketch = stream.epoch_sketch

        def one_epoch(store: Any, plan: Any, epoch: int, client: Any = None) -> Any:
            for _ in store.manifest["pending"].get(str(epoch), []):
                clock.advance()  # the work of folding in one batch
            return sketch(store, plan, epoch, client)

        mp.setattr(stream, "epoch_sketch", one_epoch)
        rel, _ = stream.stream_release(state, epoch=1, out=tmp_path / "e1.zarr")
    _, stored = read_group(tmp_path / "e1.zarr", ())
    assert stored["created"] == rel.report["created"]
    return str(rel.report["created"]), clock


def test_a_stream_epochs_time_does_not_depend_on_its_updates(tmp_path: Path) -> None:
    """An epoch's ``created`` is stamped before its batches are sketched."""
    one, clock_one = _stream_created(tmp_path / "one", 1)
    many, clock_many = _stream_created(tmp_path / "many", 5)
    # negative controls: the sketching did run, for longer with more batches, and
    # the stamp is the fake clock's (the code read it)
    assert (clock_one.trials, clock_many.trials) == (1, 5)
    assert one.startswith("2001-02-03T")
    assert one == many
