"""A stream of rows composes with batch releases on one row ledger (and of cells on an entry ledger).

A stream declared ``--exclusive`` binds each entity to one row (``--unit row``) or
one cell (``--unit entry``) that no other entity touches: removing one row's
individual removes exactly one entity, so the stream is a release at the matrix
unit and is charged there. It then composes, in either order, with ``dplr
factorize`` and ``dplr pca`` releases charged to the same ledger.

The composed epsilon is recomputed independently of the ledger's code by
dp_accounting's PLD accountant over the same Gaussian events (each record's noise
multiplier ``z``; the sketches' failure probabilities ``delta_JL`` taken from the
budget's delta first, as the ledger's basic composition does).

The entity-per-row rule is checked at ingest: a batch that breaks it, in itself or
against what the state already holds, is refused in one line (exit 2) before
anything changes, and the refusal names no id, row, value or count.
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from cli_util import assert_one_line_error, run_dplr
from dp_accounting.pld import pld_privacy_accountant

from pipeline.accounting.ledger import Ledger
from pipeline.errors import PrivacyUnitError
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    continue_command,
    open_stream,
    stream_ingest,
    stream_init,
)

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("cli_cluster")

ROWS, COLS = 120, 30
BUDGET = ("--budget-epsilon", "6", "--budget-delta", "1e-5")


def _store(root: Path) -> Path:
    path = root / "A.zarr"
    proc = run_dplr("generate", path, "--rows", ROWS, "--cols", COLS, "--chunks", "60,-1",
                    "--seed", 3)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return path


def _factorize(store: Path, out: Path, ledger: Path, *extra: str):
    return run_dplr("factorize", store, "--rank", 3, "--out", out, "--epsilon", "1",
                    "--delta", "1e-6", "--ledger", ledger, *extra)  # fmt: skip


def _stream_init(state: Path, ledger: Path, *extra: str, unit: str = "row"):
    return run_dplr("stream", "init", state, "--rows", ROWS, "--cols", COLS, "--rank", 3,
                    "--horizon", 4, "--epsilon", "1.5", "--delta", "1e-6", "--unit", unit,
                    "--ledger", ledger, *extra)  # fmt: skip


def _rows_batch(path: Path, rows: np.ndarray, entity: np.ndarray, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    write_batch(path, {"entity": entity, "i": rows, "j": rng.integers(0, COLS, rows.size),
                       "s": rng.normal(size=rows.size) * 0.1})  # fmt: skip
    return path


def _pld_epsilon(ledger: Path) -> float:
    """dp_accounting's PLD epsilon of the ledger's Gaussian records at the budget's
    delta less the records' delta_JL (basic composition with the failure events)."""
    data = json.loads(ledger.read_text())
    recs = data["releases"]
    acc = pld_privacy_accountant.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    acc.compose(dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(r["noise_multiplier_total"]) for r in recs]
    ))  # fmt: skip
    delta = data["budget"]["delta"] - sum(r["delta_jl"] for r in recs)
    return float(acc.get_epsilon(delta))


def _assert_composed(ledger: Path, n: int) -> None:
    book = Ledger.open(ledger)
    assert (book.unit.value, book.neighboring.value) == ("row", "add-remove")
    recs = book.releases
    assert len(recs) == n
    assert {r["contract"]["unit"] for r in recs} == {"row"}
    assert any(r["algorithm"].startswith("continual-") for r in recs)  # the stream
    # the PLD accountant rounds each privacy loss up to its grid (interval 1e-4, the
    # default value_discretization_interval), so its epsilon of n composed Gaussians
    # is at most n intervals above the exact composition and never below it
    exact, pld = book.spent()[0], _pld_epsilon(ledger)
    assert exact - 1e-9 <= pld <= exact + n * 1e-4, (pld, exact)
    # negative control: the stream alone is not the composition
    assert exact > max(r["epsilon"] for r in recs) * 1.0001


def test_row_stream_then_factorize_compose_on_one_row_ledger(tmp_path: Path) -> None:
    store, ledger = _store(tmp_path), tmp_path / "people.dplr-ledger.json"
    proc = _stream_init(tmp_path / "s.stream", ledger, "--exclusive", *BUDGET)
    assert proc.returncode == 0, proc.stderr
    assert Ledger.open(ledger).unit.value == "row"  # created at the stream's unit
    rows = np.arange(ROWS)
    batch = _rows_batch(tmp_path / "b.parquet", rows, rows)
    assert run_dplr("stream", "ingest", tmp_path / "s.stream", batch, "--epoch", 1).returncode == 0
    proc = _factorize(store, tmp_path / "f.zarr", ledger)
    assert proc.returncode == 0, proc.stderr
    rel = run_dplr("stream", "release", tmp_path / "s.stream", "--epoch", 1,
                   "--out", tmp_path / "r1.zarr")  # fmt: skip
    assert rel.returncode == 0, rel.stderr
    _assert_composed(ledger, 2)  # a release charges nothing


def test_factorize_then_row_stream_compose_on_one_row_ledger(tmp_path: Path) -> None:
    store, ledger = _store(tmp_path), tmp_path / "people.dplr-ledger.json"
    proc = _factorize(store, tmp_path / "f.zarr", ledger, *BUDGET)
    assert proc.returncode == 0, proc.stderr
    proc = _stream_init(tmp_path / "s.stream", ledger, "--exclusive")
    assert proc.returncode == 0, proc.stderr
    rows = np.arange(0, ROWS, 2)
    batch = _rows_batch(tmp_path / "b.parquet", rows, rows + 1000)  # ids need not be rows
    assert run_dplr("stream", "ingest", tmp_path / "s.stream", batch, "--epoch", 1).returncode == 0
    rel = run_dplr("stream", "release", tmp_path / "s.stream", "--epoch", 1,
                   "--out", tmp_path / "r1.zarr")  # fmt: skip
    assert rel.returncode == 0, rel.stderr
    _assert_composed(ledger, 2)


def _pca(store: Path, out: Path, ledger: Path, *extra: str):
    return run_dplr("pca", store, "--rank", 2, "--out", out, "--epsilon", "1",
                    "--delta", "1e-6", "--ledger", ledger, *extra)  # fmt: skip


def test_row_stream_and_pca_compose_on_one_row_ledger_in_both_orders(tmp_path: Path) -> None:
    """A PCA release (Analyze Gauss, unit row) is the other batch release of a
    population: an exclusive row stream composes with it in either order."""
    store = _store(tmp_path)
    rows = np.arange(ROWS)
    for order in ("stream-first", "pca-first"):
        d = tmp_path / order
        d.mkdir()
        ledger, state = d / "people.dplr-ledger.json", d / "s.stream"
        if order == "pca-first":
            assert _pca(store, d / "p.zarr", ledger, *BUDGET).returncode == 0
            assert _stream_init(state, ledger, "--exclusive").returncode == 0
        else:
            assert _stream_init(state, ledger, "--exclusive", *BUDGET).returncode == 0
        batch = _rows_batch(d / "b.parquet", rows, rows)
        assert run_dplr("stream", "ingest", state, batch, "--epoch", 1).returncode == 0
        if order == "stream-first":
            proc = _pca(store, d / "p.zarr", ledger)
            assert proc.returncode == 0, proc.stderr
        _assert_composed(ledger, 2)
        kinds = [r["algorithm"] for r in Ledger.open(ledger).releases]
        assert any(k.startswith("pca-") for k in kinds), kinds


def test_a_stream_of_entities_is_still_refused_on_a_row_ledger(tmp_path: Path) -> None:
    """Negative control: without --exclusive several entities may share a row, so the
    stream protects entities, not rows; nothing is charged or created."""
    store, ledger = _store(tmp_path), tmp_path / "people.dplr-ledger.json"
    assert _factorize(store, tmp_path / "f.zarr", ledger, *BUDGET).returncode == 0
    before = ledger.read_bytes()
    proc = _stream_init(tmp_path / "s.stream", ledger)
    assert_one_line_error(proc, 2, "dplr: error:")
    assert ledger.read_bytes() == before
    assert not (tmp_path / "s.stream").exists()


def test_exclusive_needs_a_matrix_unit(tmp_path: Path) -> None:
    proc = _stream_init(tmp_path / "s.stream", tmp_path / "l.json", "--exclusive", *BUDGET,
                        unit="general")  # fmt: skip
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert "exclusive" in line
    assert not (tmp_path / "s.stream").exists()
    assert not (tmp_path / "l.json").exists()


def test_exclusive_is_refused_on_a_non_private_stream(tmp_path: Path) -> None:
    # a non-private stream has no ledger and clips nothing: the flag would be unchecked
    proc = run_dplr("stream", "init", tmp_path / "s.stream", "--rows", ROWS, "--cols", COLS,
                    "--rank", 3, "--horizon", 4, "--unit", "row", "--non-private",
                    "--exclusive")  # fmt: skip
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert "exclusive" in line
    assert "non-private" in line
    assert not (tmp_path / "s.stream").exists()


def test_an_entry_stream_composes_on_an_entry_ledger_only(tmp_path: Path) -> None:
    """A stream of cells is an entry release: it composes with entry releases, and
    (its sensitivity across epochs being a sum over them) is not read at rows."""
    store, ledger = _store(tmp_path), tmp_path / "cells.dplr-ledger.json"
    proc = _factorize(store, tmp_path / "f.zarr", ledger, "--unit", "entry", *BUDGET)
    assert proc.returncode == 0, proc.stderr
    proc = _stream_init(tmp_path / "s.stream", ledger, "--exclusive", unit="entry")
    assert proc.returncode == 0, proc.stderr
    book = Ledger.open(ledger)
    assert book.unit.value == "entry"
    assert [r["contract"]["unit"] for r in book.releases] == ["entry", "entry"]
    rows = tmp_path / "rows.dplr-ledger.json"
    assert _factorize(store, tmp_path / "g.zarr", rows, *BUDGET).returncode == 0
    before = rows.read_bytes()
    proc = _stream_init(tmp_path / "t.stream", rows, "--exclusive", unit="entry")
    assert_one_line_error(proc, 2, "dplr: error:")
    assert rows.read_bytes() == before
    assert not (tmp_path / "t.stream").exists()


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}  # fmt: skip


def _bad_batch(tmp_path: Path, case: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """A batch of fresh rows and ids, broken as ``case`` says, after ``_first``."""
    e, r = np.arange(60, 90) + 500, np.arange(60, 90)
    if case == "two entities share a row in the batch":
        r[5] = r[6]
    elif case == "an entity touches two rows in the batch":
        e, r = np.append(e, e[3]), np.append(r, 95)
    elif case == "a new entity takes a row held by an earlier one":
        r[0] = 7  # row 7 belongs to entity 507
    else:
        e[0] = 510  # entity 510 holds row 10
    return _rows_batch(tmp_path / "bad.parquet", r, e, seed=1), e, r


def _first(tmp_path: Path) -> Path:
    rows = np.arange(0, 40)
    return _rows_batch(tmp_path / "a.parquet", rows, rows + 500)


def _assert_no_data(line: str, e: np.ndarray, r: np.ndarray) -> None:
    words = set(line.replace(",", " ").replace(".", " ").replace(";", " ").split())
    assert not words & {*map(str, e.tolist()), *map(str, r.tolist()), str(e.size)}


CASES = ("two entities share a row in the batch", "an entity touches two rows in the batch",
         "a new entity takes a row held by an earlier one", "a known entity moves to another row")  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_batch_that_breaks_one_entity_per_row_is_refused_before_anything(
    tmp_path: Path, case: str
) -> None:
    ledger, state = tmp_path / "people.dplr-ledger.json", tmp_path / "s.stream"
    kw = {"n_rows": ROWS, "n_cols": COLS, "rank": 3, "horizon": 4, "epsilon": 1.5,
          "delta": 1e-6, "unit": "row", "budget": (6.0, 1e-5)}  # fmt: skip
    stream_init(state, **kw, exclusive=True, ledger=ledger)
    first = _first(tmp_path)
    stream_ingest(state, first, epoch=1)
    bad, e, r = _bad_batch(tmp_path, case)
    before, book = _tree_bytes(state), ledger.read_bytes()
    with pytest.raises(PrivacyUnitError, match="row") as err:
        stream_ingest(state, bad, epoch=1)
    _assert_no_data(str(err.value), e, r)
    assert "Nothing was applied" in str(err.value)
    assert _tree_bytes(state) == before
    assert ledger.read_bytes() == book
    # negative control: the same batches go into a stream of entities (the new rule,
    # not the batch, is refused there); an entity bound to two rows is refused there too
    if "share" in case or "takes" in case:
        other = tmp_path / "t.stream"
        stream_init(other, **kw, ledger=tmp_path / "o.json")
        stream_ingest(other, first, epoch=1)
        stream_ingest(other, bad, epoch=1)


def test_the_command_refuses_it_in_one_line_exit_2(tmp_path: Path) -> None:
    ledger, state = tmp_path / "people.dplr-ledger.json", tmp_path / "s.stream"
    assert _stream_init(state, ledger, "--exclusive", *BUDGET).returncode == 0
    assert run_dplr("stream", "ingest", state, _first(tmp_path), "--epoch", 1).returncode == 0
    bad, e, r = _bad_batch(tmp_path, CASES[2])
    before, book = _tree_bytes(state), ledger.read_bytes()
    proc = run_dplr("stream", "ingest", state, bad, "--epoch", 1)
    _assert_no_data(assert_one_line_error(proc, 2, "dplr: error:"), e, r)
    assert _tree_bytes(state) == before
    assert ledger.read_bytes() == book


def test_the_stream_that_continues_an_exclusive_one_is_exclusive(tmp_path: Path) -> None:
    """The horizon refusal's command creates the same contract on the same ledger."""
    ledger = tmp_path / "people.dplr-ledger.json"
    stream_init(tmp_path / "s.stream", n_rows=ROWS, n_cols=COLS, rank=3, horizon=4,
                epsilon=1.5, delta=1e-6, unit="row", exclusive=True, ledger=ledger,
                budget=(6.0, 1e-5))  # fmt: skip
    words = continue_command(open_stream(tmp_path / "s.stream").manifest).split()
    assert "--exclusive" in words
    assert words[words.index("--ledger") + 1] == str(ledger)


@pytest.mark.parametrize(("extra", "protects"), [(("--exclusive",), "row"), ((), "entity")])
def test_status_says_what_the_stream_protects(
    tmp_path: Path, extra: tuple[str, ...], protects: str
) -> None:
    """``dplr stream status`` names the unit each entity is bound to, whether the
    stream is exclusive, and the privacy unit its one charge protects (the ledger's
    record says the same)."""
    ledger = tmp_path / "l.json"
    assert _stream_init(tmp_path / "s.stream", ledger, *extra, *BUDGET).returncode == 0
    status = json.loads(run_dplr("stream", "status", tmp_path / "s.stream").stdout)
    assert status["unit"] == "row"
    assert status["exclusive"] is bool(extra)
    assert status["privacy_unit"] == protects
    (record,) = Ledger.open(ledger).releases
    assert record["contract"]["unit"] == protects
