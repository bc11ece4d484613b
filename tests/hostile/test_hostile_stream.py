"""Hostile turnstile batches through ``dplr stream`` (case 7 of the hostile input suite).

``test_hostile_batches_through_the_cli`` runs one stream as a user would: every
hostile batch is either applied (exit 0) or refused (exit 2, one line, no id or
value, state and ledger byte-identical), and the release after them is finite
and orthonormal, with the stream's single ledger record.

The neighbour pairs below run in process through the public stream API: two
streams with the same sketch seed and seeded noise, whose batches differ only in
what per-entity clipping must absorb, release the same factors. A hostile value
that escaped clipping (or a budget that did not span batches) would move the
release by orders of magnitude.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile_util import assert_one_line_error, file_state, run_dplr, run_in_process

from pipeline.io.batches import write_batch
from pipeline.io.release import read_release
from pipeline.jobs.stream import (
    DuplicateBatchError,
    stream_ingest,
    stream_init,
    stream_release,
)

pytestmark = [pytest.mark.cli, pytest.mark.timeout(180)]

SHAPE = (60, 20)
I64 = np.iinfo(np.int64)
PLANTED = 123456.789  # never echoed


def _ints(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _base_batch(path: Path, seed: int = 1) -> Path:
    """Ordinary updates: entities 100.. own rows 0..59 (unit row holds)."""
    rng = np.random.default_rng(seed)
    i = rng.integers(0, SHAPE[0], 300)
    write_batch(
        path,
        {
            "entity": 100 + i,
            "i": i,
            "j": rng.integers(0, SHAPE[1], 300),
            "s": rng.normal(size=300) * 0.05,
        },
    )
    return path


def _state_bytes(state: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(state)): p.read_bytes()
        for p in sorted(state.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


def _assert_orthonormal(X: np.ndarray) -> None:
    assert np.isfinite(X).all()
    np.testing.assert_allclose(X.T @ X, np.eye(X.shape[1]), rtol=0, atol=1e-9)


# -- the CLI run ----------------------------------------------------------------------
HOSTILE_OK = {
    # one entity, duplicated cells, values near the float max
    "duplicates and huge values": {
        "entity": _ints(1, 1, 1, 1),
        "i": _ints(3, 3, 3, 3),
        "j": _ints(1, 1, 2, 2),
        "s": np.array([0.5, 0.5, 1e308, 1.7e308]),
    },
    # +x and -x from one entity on one cell: net zero
    "plus and minus": {
        "entity": _ints(2, 2),
        "i": _ints(4, 4),
        "j": _ints(1, 1),
        "s": np.array([1.7e308, -1.7e308]),
    },
    # a value beyond the float max (Inf): its entity counts as absent from the
    # batch, silently (the one rule for non-finite values, docs/privacy.md)
    "value beyond float max (Inf)": {
        "entity": _ints(3, 3),
        "i": _ints(1, 1),
        "j": _ints(1, 2),
        "s": np.array([np.inf, 0.5]),
    },
    # one cell updated by two entities
    "one cell, two entities": {
        "entity": _ints(5, 6),
        "i": _ints(7, 7),
        "j": _ints(1, 1),
        "s": np.array([1e300, -1.7e308]),
    },
    # ids at the int64 extremes, subnormal and negative-zero values
    "int64 extreme ids": {
        "entity": _ints(I64.min, I64.max, 0),
        "i": _ints(8, 9, 10),
        "j": _ints(1, 1, 1),
        "s": np.array([5e-324, -0.0, PLANTED]),
    },
}
HOSTILE_REFUSED: dict[str, tuple[Any, str]] = {
    "entity on two rows (unit row)": (
        {
            "entity": _ints(9, 9),
            "i": _ints(1, 2),
            "j": _ints(1, 1),
            "s": np.array([PLANTED, 1.0]),
        },
        "privacy unit 'row'",
    ),
    "entity of an earlier batch on another row": (
        {"entity": _ints(1), "i": _ints(11), "j": _ints(1), "s": np.array([PLANTED])},
        "than in earlier batches",
    ),
    "string ids mixed with int ids (CSV)": (
        "entity,i,j,s\n1,2,3,0.5\nalice,4,5,123456.789\n",
        "kind",
    ),
    "string and int ids in one object column (npz)": (
        {
            "entity": np.array([1, "bob"], dtype=object),
            "i": _ints(1, 2),
            "j": _ints(1, 1),
            "s": np.array([PLANTED, 1.0]),
        },
        "column 'entity'",
    ),
    "id above int64 (uint64)": (
        {
            "entity": np.array([2**63], dtype=np.uint64),
            "i": _ints(1),
            "j": _ints(1),
            "s": np.array([PLANTED]),
        },
        "fit in int64",
    ),
}


def test_hostile_batches_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Subprocesses for init, the applied batches, the first refusal and the
    release; the other refusals through ``pipeline.cli.main`` in this process
    (same parser, handler, exit codes and message; seconds saved per case)."""
    state = tmp_path / "s.stream"
    ledger = tmp_path / "population.dplr-ledger.json"
    proc = run_dplr(
        "stream", "init", state, "--rows", SHAPE[0], "--cols", SHAPE[1], "--rank", 2,
        "--horizon", 4, "--epsilon", "1", "--delta", "1e-6", "--unit", "row",
        "--ledger", ledger, "--budget-epsilon", "1", "--budget-delta", "1e-6",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(_records(ledger)) == 1  # the whole stream is charged once, at init
    ledger_bytes = file_state(ledger)

    # applied: the hostile cases together in one batch (each its own entities), and a
    # CSV with only its header (an empty batch: applied, it adds nothing)
    ok = tmp_path / "hostile.npz"
    write_batch(
        ok,
        {
            c: np.concatenate([b[c] for b in HOSTILE_OK.values()])
            for c in ["entity", "i", "j", "s"]
        },
    )
    (tmp_path / "header.csv").write_text("entity,i,j,s\n")
    for batch in (_base_batch(tmp_path / "base.parquet"), ok, tmp_path / "header.csv"):
        proc = run_dplr("stream", "ingest", state, batch, "--epoch", 1)
        assert proc.returncode == 0, (batch.name, proc.stderr)
        assert "123456" not in proc.stdout + proc.stderr

    # refused: nothing changes
    for k, (name, (batch, phrase)) in enumerate(HOSTILE_REFUSED.items()):
        path = tmp_path / (f"bad{k}.csv" if isinstance(batch, str) else f"bad{k}.npz")
        if isinstance(batch, str):
            path.write_text(batch)
        else:
            write_batch(path, batch)
        before = _state_bytes(state)
        run = run_dplr if k == 0 else (lambda *a: run_in_process(capsys, *a))
        proc = run("stream", "ingest", state, path, "--epoch", 2)
        line = assert_one_line_error(proc, 2, "dplr: error:")
        assert phrase in line, (name, line)
        assert "123456" not in line
        assert "alice" not in line
        assert "bob" not in line
        assert _state_bytes(state) == before, name
        assert file_state(ledger) == ledger_bytes, name

    # an entity far over its budget, batch after batch (same row: unit row holds)
    for epoch in (2, 3):
        path = tmp_path / f"over{epoch}.npz"
        write_batch(
            path,
            {
                "entity": _ints(1),
                "i": _ints(3),
                "j": _ints(epoch + 5),
                "s": np.array([1.7e308]),
            },
        )
        assert (
            run_dplr("stream", "ingest", state, path, "--epoch", epoch).returncode == 0
        )

    out = tmp_path / "r3.zarr"
    proc = run_dplr("stream", "release", state, "--epoch", 3, "--out", out)
    assert proc.returncode == 0, proc.stderr
    rel = read_release(out)
    _assert_orthonormal(rel.U)
    _assert_orthonormal(rel.V)
    assert np.isfinite(rel.S).all()
    assert rel.report["private"] is True
    assert rel.report["epsilon"] == 1.0
    assert file_state(ledger) == ledger_bytes  # releases are post-processing: no charge
    assert "123456" not in json.dumps(rel.report)


# -- neighbour pairs in process -------------------------------------------------------
def _release(
    tmp: Path, name: str, epochs: dict[int, list[dict[str, np.ndarray]]]
) -> Any:
    """A private unit-row stream with fixed seeds; ``epochs`` maps epoch -> batches."""
    state = tmp / f"{name}.stream"
    stream_init(
        state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=2, horizon=4, epsilon=1.0,
        delta=1e-6, unit="row", seed=77, insecure_noise_seed=78,
        # x and y are neighbouring datasets, each its own population
        ledger=tmp / f"{name}.dplr-ledger.json", budget=(1.0, 1e-6),
    )  # fmt: skip
    last = max(epochs)
    for epoch in range(1, last + 1):
        batches = [_base_batch(tmp / f"{name}-base{epoch}.npz", seed=epoch)]
        for k, cols in enumerate(epochs.get(epoch, [])):
            path = tmp / f"{name}-{epoch}-{k}.npz"
            write_batch(path, cols)
            batches.append(path)
        for path in batches:
            stream_ingest(state, path, epoch=epoch)
    f, _ = stream_release(state, epoch=last, out=tmp / f"{name}.zarr")
    return f


def _one(entity: int, i: int, j: int, s: float) -> dict[str, np.ndarray]:
    return {"entity": _ints(entity), "i": _ints(i), "j": _ints(j), "s": np.array([s])}


ZERO = _one(
    999, 50, 0, 0.0
)  # an update of value 0: changes nothing, keeps batches distinct

PAIRS: dict[str, tuple[dict[int, list[Any]], dict[int, list[Any]]]] = {
    # duplicates summing past the float max vs one update at the clip norm's scale
    "duplicated entity and cells near float max": (
        {1: [HOSTILE_OK["duplicates and huge values"]]},
        {
            1: [
                {
                    "entity": _ints(1, 1),
                    "i": _ints(3, 3),
                    "j": _ints(1, 2),
                    "s": np.array([1e-300, 1e6]),
                }
            ]
        },
    ),
    "+x and -x from one entity": ({1: [HOSTILE_OK["plus and minus"]]}, {1: [ZERO]}),
    "one cell, two entities, opposite huge values": (
        {
            1: [
                {
                    "entity": _ints(5, 6),
                    "i": _ints(7, 7),
                    "j": _ints(1, 1),
                    "s": np.array([1e300, -1.7e308]),
                }
            ]
        },
        {1: [ZERO]},
    ),
    "int64 extreme ids": (
        {
            1: [
                {
                    "entity": _ints(I64.min, I64.max),
                    "i": _ints(8, 9),
                    "j": _ints(1, 1),
                    "s": np.array([1e300, -1e300]),
                }
            ]
        },
        {
            1: [
                {
                    "entity": _ints(0, 1),
                    "i": _ints(8, 9),
                    "j": _ints(1, 1),
                    "s": np.array([1e6, -1e6]),
                }
            ]
        },
    ),
    # the budget spans batches and epochs: once spent, later updates add nothing
    "entity over its budget across batches": (
        {
            1: [_one(1, 3, 1, 1e308)],
            2: [_one(1, 3, 2, 1e6), ZERO],
            3: [_one(1, 3, 4, 1.7e308)],
        },
        {1: [_one(1, 3, 1, 1e308)], 2: [ZERO], 3: [_one(2, 40, 4, 0.0)]},
    ),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_neighbour_streams_release_alike(tmp_path: Path, name: str) -> None:
    """Equal up to round-off: per-entity clipping scales by the entity's peak, so the
    clipped cells agree to a relative 1e-15; the release is a smooth function of them."""
    x, y = PAIRS[name]
    f = _release(tmp_path, "x", x)
    g = _release(tmp_path, "y", y)
    _assert_orthonormal(f.U)
    np.testing.assert_allclose(f.S, g.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(f.U, g.U, rtol=0, atol=1e-9)
    np.testing.assert_allclose(f.V, g.V, rtol=0, atol=1e-9)


def test_pair_check_can_fail(tmp_path: Path) -> None:
    """Negative control: two streams differing by one entity's in-budget update do
    release differently, so the equalities above are not vacuous."""
    f = _release(tmp_path, "x", {1: [_one(1, 3, 1, 0.9)]})
    g = _release(tmp_path, "y", {1: [ZERO]})
    assert not np.allclose(f.S, g.S, rtol=1e-9, atol=0)


def test_a_second_empty_batch_is_not_a_replay(tmp_path: Path) -> None:
    state = tmp_path / "e.stream"
    stream_init(
        state, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=2, horizon=4, epsilon=1.0,
        delta=1e-6, unit="row", ledger=tmp_path / "population.dplr-ledger.json",
        budget=(1.0, 1e-6),
    )  # fmt: skip
    write_batch(
        tmp_path / "empty.npz",
        {
            c: np.zeros(0, dtype=np.int64 if c != "s" else float)
            for c in ["entity", "i", "j", "s"]
        },
    )
    (tmp_path / "header.csv").write_text("entity,i,j,s\n")
    first = stream_ingest(state, tmp_path / "empty.npz", epoch=1)
    # the same (empty) content again, in another file and epoch, and in the same
    # epoch: applied, never refused as a replay (it adds nothing)
    second = stream_ingest(state, tmp_path / "header.csv", epoch=2)
    third = stream_ingest(state, tmp_path / "empty.npz", epoch=2)
    assert first["fingerprint"] == second["fingerprint"] == third["fingerprint"]
    assert [r["skipped"] for r in (first, second, third)] == [False, False, False]
    # negative control: a non-empty batch ingested twice is refused as a replay
    write_batch(
        tmp_path / "one.npz",
        {"entity": np.array([7]), "i": np.array([1]), "j": np.array([2]),
         "s": np.array([0.5])},
    )  # fmt: skip
    stream_ingest(state, tmp_path / "one.npz", epoch=2)
    with pytest.raises(DuplicateBatchError, match="replaying it"):
        stream_ingest(state, tmp_path / "one.npz", epoch=3)
