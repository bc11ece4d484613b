"""Streams charge the ledger of their population, and compose there (spec sketch-lrf 9.18).

A stream is created against a named ledger: a second stream on it composes with
the first, and the stream that continues one after its horizon is created with
the command the horizon refusal prints, on the same ledger. Before, a stream
without ``ledger`` got a fresh ledger of its own beside its state, whose budget
was the stream's own (epsilon, delta), so every new stream of one population
started from a full budget.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from pipeline.accounting.ledger import Ledger, default_ledger_path
from pipeline.errors import (
    BudgetExceededError,
    HorizonExceededError,
    InvalidParameterError,
    PrivacyConfigError,
)
from pipeline.io.batches import write_batch
from pipeline.jobs.nightly import run_nightly
from pipeline.jobs.stream import (
    stream_ingest,
    stream_init,
    stream_release,
    stream_status,
)

SHAPE = (60, 40)
BUDGET = (1.0, 1e-6)
EACH = (0.8, 1e-7)  # two of these do not fit in BUDGET (see the first test)


def _init(state: Path, eps_delta: tuple[float, float] = EACH, **kw):
    return stream_init(
        state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=2, horizon=kw.pop("horizon", 2),
        epsilon=eps_delta[0], delta=eps_delta[1], unit="row", **kw,
    )  # fmt: skip


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (lock files included: a refusal takes none)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _dplr(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip


def _gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of a mu-GDP Gaussian mechanism [Balle-Wang 2018, Thm 8], from scipy."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def test_two_streams_on_one_population_ledger_compose(tmp_path: Path) -> None:
    ledger = tmp_path / "ratings.dplr-ledger.json"
    info = _init(tmp_path / "a.stream", ledger=ledger, budget=BUDGET)
    (rec,) = Ledger.open(ledger).releases
    before = _files(tmp_path)

    # the second stream of the population: refused by the composition, nothing written
    with pytest.raises(BudgetExceededError, match="1 earlier release"):
        _init(tmp_path / "b.stream", ledger=ledger)
    assert _files(tmp_path) == before
    # nor can it escape to a ledger of its own: without one it is refused (the old
    # default created b.stream.dplr-ledger.json with b's own (0.8, 1e-7) and accepted it)
    with pytest.raises(PrivacyConfigError, match="--ledger PATH"):
        _init(tmp_path / "b.stream")
    assert _files(tmp_path) == before

    # independent check that the refusal is right: the whole tree of each stream is one
    # Gaussian with delta_JL = delta / 2 (delta_jl_fraction) and mu solving
    # delta(0.8; mu) = delta / 2; two compose to sqrt(2) mu [BW18, Thm 8; Dong-Roth-Su Cor 3.3]
    assert rec["delta_jl"] == pytest.approx(EACH[1] / 2, rel=1e-12)
    mu = brentq(lambda m: _gaussian_delta(m, EACH[0]) - EACH[1] / 2, 1e-3, 10.0, xtol=1e-14)
    assert 1 / rec["noise_multiplier_total"] == pytest.approx(mu, rel=1e-9)
    one = _gaussian_delta(mu, BUDGET[0]) + EACH[1] / 2
    two = _gaussian_delta(math.sqrt(2) * mu, BUDGET[0]) + EACH[1]
    assert one <= BUDGET[1] < two  # 5.0e-8 <= 1e-6 < 1.24e-6

    # the state names its ledger; the charge states the stream's contract
    assert info.ledger == str(ledger)
    contract = rec["contract"]  # the individual is an entity, whatever its unit binds
    assert {k: contract[k] for k in ("unit", "neighboring", "clip_norm", "epsilon", "delta")} == {
        "unit": "entity", "neighboring": "add-remove", "clip_norm": 1.0, "epsilon": 0.8, "delta": 1e-7,
    }  # fmt: skip
    assert Ledger.open(ledger).dataset == "ratings"


def test_the_old_default_ledger_let_both_streams_through(tmp_path: Path) -> None:
    """Negative control: each stream with a fresh ledger of its own, budgeted at the
    stream's own (epsilon, delta) as the old default did, accepts both; the same two
    charges on the population's ledger do not fit, so that default understated the
    population's epsilon."""
    for name in ("a", "b"):
        state = tmp_path / f"{name}.stream"
        _init(state, ledger=default_ledger_path(state), budget=EACH)  # accepted, both
    charges = [Ledger.open(default_ledger_path(tmp_path / f"{n}.stream")).releases[0] for n in "ab"]
    assert [c["epsilon"] for c in charges] == [0.8, 0.8]
    population = tmp_path / "population.dplr-ledger.json"
    _init(tmp_path / "a2.stream", ledger=population, budget=BUDGET)
    with pytest.raises(BudgetExceededError):
        _init(tmp_path / "b2.stream", ledger=population)


def test_after_the_horizon_the_printed_command_continues_on_the_same_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ratings.dplr-ledger.json"
    _init(tmp_path / "a.stream", (1.0, 1e-7), ledger=ledger, budget=(4.0, 1e-5))
    spent_one = Ledger.open(ledger).spent()[0]
    write_batch(tmp_path / "b.npz", {k: np.array([1]) for k in ("entity", "i", "j")} | {"s": np.array([0.1])})
    with pytest.raises(HorizonExceededError) as exc:
        stream_ingest(tmp_path / "a.stream", tmp_path / "b.npz", epoch=3)
    message = str(exc.value)
    assert "\n" not in message
    assert f"same ledger {str(ledger)!r}" in message
    with pytest.raises(HorizonExceededError) as again:
        stream_release(tmp_path / "a.stream", epoch=3, out=tmp_path / "r3.zarr")
    assert str(again.value) == message
    # the nightly job's refusal gives the same command (a dry run: nothing is read)
    (tmp_path / "job.toml").write_text(
        '[stream]\nstate = "a.stream"\nstart_date = 2027-01-01\n'
        '[input]\ninbox = "inbox/{date}"\n[output]\nreleases = "releases"\n'
    )
    with pytest.raises(HorizonExceededError, match="start_date 2027-01-03") as night:
        run_nightly(tmp_path / "job.toml", dt.date(2027, 1, 3), dry_run=True, say=lambda s: None)
    command = message[message.index("dplr stream init"):]
    assert str(night.value).endswith(command)

    # the command, as printed, with the new state's path: the new tree composes
    words = shlex.split(command)
    assert words[:4] == ["dplr", "stream", "init", "NEW_STATE"]
    assert words[-2:] == ["--ledger", str(ledger)]
    proc = _dplr(*words[1:3], tmp_path / "c.stream", *words[4:])
    assert proc.returncode == 0, proc.stderr
    assert f"charged to the ledger {ledger}: 2 release(s)" in proc.stdout
    book = Ledger.open(ledger)
    assert [r["details"]["stream"] for r in book.releases] == [str(tmp_path / s) for s in ("a.stream", "c.stream")]
    assert book.spent()[0] > spent_one
    # the two equal trees are one Gaussian with sqrt(2) times the mu of one [BW18, Thm 8]
    z = [r["noise_multiplier_total"] for r in book.releases]
    assert z[0] == pytest.approx(z[1], rel=1e-12)
    assert book.remaining_summary()["noise_multiplier_total"] == pytest.approx(z[0] / math.sqrt(2), rel=1e-12)
    status = json.loads(_dplr("stream", "status", tmp_path / "c.stream").stdout)
    assert status["ledger"] == str(ledger)
    assert stream_status(tmp_path / "c.stream").horizon == 2


def test_a_non_private_stream_is_continued_without_a_ledger(tmp_path: Path) -> None:
    stream_init(tmp_path / "n.stream", n_rows=5, n_cols=4, rank=1, horizon=1, private=False)
    assert stream_status(tmp_path / "n.stream").ledger is None
    write_batch(tmp_path / "b.npz", {k: np.array([1]) for k in ("entity", "i", "j")} | {"s": np.array([0.1])})
    with pytest.raises(HorizonExceededError) as exc:
        stream_ingest(tmp_path / "n.stream", tmp_path / "b.npz", epoch=2)
    assert str(exc.value).endswith(
        "To continue, create a new stream: dplr stream init NEW_STATE --rows 5 --cols 4 --rank 1 "
        "--horizon 1 --non-private --algorithm spectral --clip-norm 1.0 --unit general "
        "--neighboring add-remove --mechanism blt"
    )
    with pytest.raises(InvalidParameterError, match="charged to no ledger"):
        stream_init(tmp_path / "m.stream", n_rows=5, n_cols=4, rank=1, horizon=1, private=False,
                    ledger=tmp_path / "x.dplr-ledger.json")
    assert not (tmp_path / "m.stream").exists()


def test_a_private_stream_without_a_ledger_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    proc = _dplr("stream", "init", tmp_path / "s.stream", "--rows", 60, "--cols", 40, "--rank", 2,
                 "--horizon", 2, "--epsilon", 1, "--delta", 1e-6)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line
    assert line.startswith("dplr: error:")
    assert "--ledger PATH" in line
    assert "--budget-epsilon/--budget-delta" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("case", "kw", "error", "text"),
    [
        ("a new ledger without a budget", {}, PrivacyConfigError, "no privacy ledger at"),
        ("a new ledger the stream alone exceeds", {"budget": (0.5, 1e-6)}, BudgetExceededError, "0 earlier"),
        ("a budget that is not a pair", {"budget": (1.0,)}, InvalidParameterError, "pair"),
        ("a ledger in a missing directory", {"budget": BUDGET, "at": "no/such/dir/l.json"}, PrivacyConfigError, "directory"),
    ],
)
def test_a_new_ledger_is_created_only_with_a_stream_that_fits(tmp_path: Path, case, kw, error, text) -> None:
    where = tmp_path / kw.pop("at", "ratings.dplr-ledger.json")
    with pytest.raises(error, match=text):
        _init(tmp_path / "s.stream", ledger=where, **kw)
    # the old code created the ledger before checking the stream against it
    assert os.listdir(tmp_path) == [], case


def test_a_declared_budget_is_never_changed(tmp_path: Path) -> None:
    ledger = tmp_path / "ratings.dplr-ledger.json"
    _init(tmp_path / "a.stream", (0.3, 1e-7), ledger=ledger, budget=BUDGET)
    before = _files(tmp_path)
    with pytest.raises(PrivacyConfigError, match="declared once and never changed"):
        _init(tmp_path / "b.stream", (0.3, 1e-7), ledger=ledger, budget=(2.0, 1e-6))
    assert _files(tmp_path) == before
    # restating the declared budget is not a change: the second stream fits and composes
    _init(tmp_path / "b.stream", (0.3, 1e-7), ledger=ledger, budget=BUDGET)
    assert len(Ledger.open(ledger).releases) == 2
