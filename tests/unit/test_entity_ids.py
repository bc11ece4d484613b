"""String entity ids of a stream map to keys without collisions (spec sketch-lrf 1.3, 6.4).

Per-entity clipping bounds each *key*'s contribution by C; the calibration needs
each *entity*'s contribution bounded by C, which holds only if distinct ids never
share a key. Format-1 states hashed string ids to 64 bits with a key derived from
the public stream id, so an adversary who knows the stream id can construct two
ids that share a key. The pair below was found that way: a distinguished-point
rho search (about 7e9 evaluations of the old keyed BLAKE2b-64 on ids ``"e"`` +
16 hex digits, one hour of two cores) against :data:`STREAM_ID`. The tests check that it
really collides under the old hash, then that a stream clips the two entities
separately.

The regression test imports only functions that existed before the id table, so
it runs against the code before it too, and fails there (the change is 2 C).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.io.batches import read_batch, write_batch
from pipeline.jobs.stream import (
    DuplicateBatchError,
    epoch_cells,
    open_stream,
    stream_ingest,
    stream_init,
    stream_status,
)

#: A stream id (public: printed by ``dplr stream status`` and in every report).
STREAM_ID = "3e3e7ddc9c274b93b0902cf1cb4ded60"
#: Two ids whose old keys are equal (see the module docstring).
COLLIDING = ("ec010c966225902d4", "ec7556cc52574e8f7")
SHAPE = (6, 5)
C = 1.0
# Clipping targets (1 - 1e-9) C and adds a few ulps of rounding (entities.py).
_ULPS = 1e-12


def _old_key(stream_id: str, value: str) -> int:
    """The key a format-1 state gave a string id: BLAKE2b-64 keyed from the stream id."""
    key = hashlib.sha256(f"dplr-entity-ids:{stream_id}".encode()).digest()[:16]
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little", signed=True)


def _new_stream(path: Path, *, stream_id: str | None = None, private: bool = True, unit: str = "general") -> Path:
    # a private stream is charged to its population's ledger, created here
    kw = {"epsilon": 1.0, "delta": 1e-6, "ledger": path.with_suffix(".ledger.json"),
          "budget": (10.0, 1e-3)} if private else {}  # fmt: skip
    stream_init(path, n_rows=SHAPE[0], n_cols=SHAPE[1], rank=1, horizon=2, private=private,
                clip_norm=C, unit=unit, **kw)
    if stream_id is not None:  # the id an adversary read from the stream's status
        st = open_stream(path)
        with st.lock():
            st.commit(changes={"stream_id": stream_id})
    return path


def _cell_sum(state: Path, epoch: int = 1) -> np.ndarray:
    """The clipped matrix of one epoch's batches (as sensitive as the data)."""
    rows, cols, vals = epoch_cells(open_stream(state), epoch)
    out = np.zeros(SHAPE)
    np.add.at(out, (rows, cols), vals)
    return out


# -- (1) the collision of the old scheme, and the clip per entity ---------------------


def test_the_pair_collides_under_the_old_hash_of_this_stream_id() -> None:
    a, b = COLLIDING
    assert a != b
    assert _old_key(STREAM_ID, a) == _old_key(STREAM_ID, b)
    # negative control: the same pair under another stream id does not collide
    assert _old_key("0" * 32, a) != _old_key("0" * 32, b)


def test_colliding_ids_are_clipped_separately(tmp_path: Path) -> None:
    """Add/remove: removing either entity moves the clipped output by at most C.

    Entities a (+10) and b (-20) write one cell. Clipped separately, the cell holds
    +C - C = 0, and without a (without b) it holds -C (+C): a change of C. Under one
    shared key the net -10 is clipped once to -C, and without b the cell holds +C:
    a change of 2 C, twice what the calibration assumes.
    """
    a, b = COLLIDING
    updates = {a: 10.0, b: -20.0}
    cells = {}
    for name, present in (("both", (a, b)), ("without_a", (b,)), ("without_b", (a,))):
        state = _new_stream(tmp_path / f"{name}.stream", stream_id=STREAM_ID)
        path = tmp_path / f"{name}.parquet"
        write_batch(path, {"entity": list(present), "i": [2] * len(present), "j": [3] * len(present),
                           "s": [updates[e] for e in present]})
        stream_ingest(state, path, epoch=1)
        cells[name] = _cell_sum(state)
    for without in ("without_a", "without_b"):
        change = np.linalg.norm(cells["both"] - cells[without])
        assert change <= C * (1 + _ULPS), (without, change / C)
    # and the clip of each is its own: +C and -C (within the clipping margin)
    assert abs(cells["both"][2, 3]) <= 2 * C * 1e-9
    assert cells["without_b"][2, 3] == pytest.approx(C, rel=1e-8)


# -- the table itself ------------------------------------------------------------------


def test_ids_get_positions_in_order_of_first_appearance_in_every_format(tmp_path: Path) -> None:
    from pipeline.io.entity_ids import EntityIds

    cols = {"entity": ["bo", "ann", "bo", "", "cy"], "i": [0, 1, 2, 3, 4], "j": [0] * 5, "s": [1.0] * 5}
    for suffix in (".parquet", ".csv", ".npz", ".zarr"):
        if suffix == ".csv":  # CSV reads a missing field as null: no empty id there
            got = read_batch(_write(tmp_path, suffix, cols | {"entity": ["bo", "ann", "bo", "dee", "cy"]}),
                             shape=SHAPE, entity_ids=EntityIds.empty())
        else:
            got = read_batch(_write(tmp_path, suffix, cols), shape=SHAPE, entity_ids=EntityIds.empty())
        assert got.entity.tolist() == [0, 1, 0, 2, 3], suffix
        assert len(got.id_table) == 4
    # known ids keep their positions; new ones follow, in order of first appearance
    first = read_batch(_write(tmp_path, ".npz", cols), shape=SHAPE, entity_ids=EntityIds.empty())
    again = {"entity": ["zed", "cy", "ann", "yo", "zed"], "i": [0] * 5, "j": [0] * 5, "s": [1.0] * 5}
    got = read_batch(_write(tmp_path, ".parquet", again, "again"), shape=SHAPE, entity_ids=first.id_table)
    assert got.entity.tolist() == [4, 3, 1, 5, 4]
    assert len(got.id_table) == 6
    assert len(first.id_table) == 4


def _write(tmp_path: Path, suffix: str, cols: dict, name: str = "b") -> Path:
    path = tmp_path / f"{name}{suffix}"
    write_batch(path, cols, overwrite=True)
    return path


def test_a_string_and_its_bytes_are_one_id_and_repeated_dictionary_entries_one_key() -> None:
    import pyarrow as pa

    from pipeline.io.batches import entity_indices
    from pipeline.io.entity_ids import EntityIds

    keys, kind, table = entity_indices(pa.array(["ann", "bo"]), ids=EntityIds.empty())
    same, kind2, table2 = entity_indices(pa.array([b"bo", b"ann"]), ids=table)
    assert (kind, kind2) == ("str", "str")
    assert same.tolist() == [1, 0]
    assert len(table2) == 2
    # a dictionary that lists one value twice (Arrow allows it) still gives one key
    # (and a value no row holds, "unused", does not enter the table)
    dup = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1], pa.int32()), pa.array(["x", "y", "x", "unused"]))
    keys, _, table = entity_indices(dup, ids=EntityIds.empty())
    assert keys.tolist() == [0, 1, 0, 1]
    assert table.ids.to_pylist() == [b"x", b"y"]
    # integer ids are their own keys; the table is not touched
    keys, kind, same_table = entity_indices(np.array([7, -3]), ids=table)
    assert kind == "int"
    assert keys.tolist() == [7, -3]
    assert same_table is table


def test_distinct_ids_always_get_distinct_keys_and_equal_ids_equal_keys() -> None:
    """A property over random batches: the map id -> key is injective and stable."""
    from pipeline.io.batches import entity_indices
    from pipeline.io.entity_ids import EntityIds

    rng = np.random.default_rng(13)
    alphabet = np.array(list("ab\u00e9\u4e2d0"))
    table = EntityIds.empty()
    seen: dict[str, int] = {}
    for _ in range(30):
        ids = ["".join(rng.choice(alphabet, rng.integers(0, 4))) for _ in range(rng.integers(0, 40))]
        keys, _, table = entity_indices(np.array(ids, dtype=object) if ids else np.array([], "U1"), ids=table)
        for value, key in zip(ids, keys.tolist(), strict=True):
            assert seen.setdefault(value, key) == key
    assert len(set(seen.values())) == len(seen) == len(table)
    assert sorted(seen.values()) == list(range(len(seen)))


def test_table_round_trip_and_damage_is_refused() -> None:
    from pipeline.io.batches import entity_indices
    from pipeline.io.entity_ids import EntityIds

    _, _, table = entity_indices(["ann", "", "b\u00e9", "ann"], ids=EntityIds.empty())
    data, offsets = table.to_arrays()
    assert data.dtype == np.uint8
    assert offsets.tolist() == [0, 3, 3, 6]
    back = EntityIds.from_arrays(data, offsets)
    assert back.ids.equals(table.ids)
    assert EntityIds.from_arrays(*EntityIds.empty().to_arrays()).ids.equals(EntityIds.empty().ids)
    assert "ann" not in repr(table)
    assert repr(table) == "EntityIds(<3 ids>)"
    for bad_data, bad_offsets, what in (
        (data, offsets[:-1], "offsets"),
        (data, np.array([0, 4, 3, 6]), "offsets"),
        (np.frombuffer(b"annann", np.uint8).copy(), np.array([0, 3, 6]), "repeated"),
        (data.astype(np.int64), offsets, "types"),
    ):
        with pytest.raises(StoreLayoutError, match=what) as exc:
            EntityIds.from_arrays(bad_data, bad_offsets)
        assert "ann" not in str(exc.value)
    with pytest.raises(InvalidParameterError, match="exclude each other"):
        read_batch("absent.parquet", shape=SHAPE, entity_key=b"k", entity_ids=EntityIds.empty())
    with pytest.raises(InvalidParameterError, match="EntityIds"):
        read_batch("absent.parquet", shape=SHAPE, entity_ids={"ann": 0})


# -- (2) a crashed or replayed ingest gives the same keys -------------------------------


def _entity_state(state: Path) -> dict[str, list]:
    st = open_stream(state)
    names = ("entities/ids_data", "entities/ids_offsets", "entities/keys", "entities/spent", "entities/anchor")
    out = {n: st.read(n).tolist() for n in names if st.has(n)}
    out["cells"] = _cell_sum(state).tolist()
    out["batches"] = [(r["fingerprint"], r["epoch"]) for r in st.manifest["batches"]]
    return out


def _two_batches(tmp_path: Path) -> tuple[Path, Path]:
    first = _write(tmp_path, ".parquet", {"entity": ["bo", "ann", "bo"], "i": [0, 1, 0], "j": [1, 1, 2],
                                          "s": [0.5, 0.25, 0.5]}, "first")
    second = _write(tmp_path, ".csv", {"entity": ["cy", "bo", "dee"], "i": [3, 0, 4], "j": [0, 1, 4],
                                       "s": [2.0, 0.5, -0.125]}, "second")
    return first, second


_KILL_IN_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import pipeline.io.stream_state as ss
    real = ss.write_private
    def kill_before_manifest(path, data):
        if path.endswith("zarr.json"):  # the new arrays are on disk, the manifest not yet
            os.kill(os.getpid(), signal.SIGKILL)
        real(path, data)
    ss.write_private = kill_before_manifest
    from pipeline.jobs.stream import stream_ingest
    stream_ingest(sys.argv[1], sys.argv[2], epoch=1)
""")


def test_an_ingest_killed_in_its_commit_then_rerun_gives_the_same_keys(tmp_path: Path) -> None:
    first, second = _two_batches(tmp_path)
    reference = _new_stream(tmp_path / "reference.stream")
    for path in (first, second):
        stream_ingest(reference, path, epoch=1)
    state = _new_stream(tmp_path / "killed.stream")
    stream_ingest(state, first, epoch=1)
    before = _entity_state(state)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", _KILL_IN_COMMIT, str(state), str(second)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # the kill landed in the commit
    # the new arrays of the killed commit are on disk, unreferenced
    stored = set(open_stream(state).manifest["arrays"].values())
    assert any(e.startswith("g") and e not in stored for e in os.listdir(state))
    assert _entity_state(state) == before
    stream_ingest(state, second, epoch=1)
    after, ref = _entity_state(state), _entity_state(reference)
    assert after == ref
    assert open_stream(state).read("entities/keys").tolist() == [0, 1, 2, 3]


def test_a_replayed_batch_is_recognised_and_changes_no_key(tmp_path: Path) -> None:
    first, second = _two_batches(tmp_path)
    state = _new_stream(tmp_path / "s.stream")
    stream_ingest(state, first, epoch=1)
    stream_ingest(state, second, epoch=1)
    before = _entity_state(state)
    # the same content in another format is the same batch
    copy = _write(tmp_path, ".npz", {"entity": np.array(["bo", "ann", "bo"]), "i": np.array([0, 1, 0]),
                                     "j": np.array([1, 1, 2]), "s": np.array([0.5, 0.25, 0.5])}, "copy")
    for path in (first, second, copy):
        with pytest.raises(DuplicateBatchError):
            stream_ingest(state, path, epoch=1)
        assert stream_ingest(state, path, epoch=2, skip_known=True)["skipped"]
    assert _entity_state(state) == before
    # negative control: a batch with one new id is not a replay
    other = _write(tmp_path, ".parquet", {"entity": ["bo", "ann", "eve"], "i": [0, 1, 0], "j": [1, 1, 2],
                                          "s": [0.5, 0.25, 0.5]}, "other")
    stream_ingest(state, other, epoch=1)
    assert open_stream(state).read("entities/keys").tolist() == [0, 1, 2, 3, 4]


# -- (3) the mapping survives reopening the state ----------------------------------------


def test_a_reopened_state_keeps_each_ids_key_and_budget(tmp_path: Path) -> None:
    """Batch 2 runs as ``dplr stream ingest`` in a new process: bo's budget goes on."""
    state = _new_stream(tmp_path / "s.stream")
    stream_ingest(state, _write(tmp_path, ".parquet", {"entity": ["ann", "bo"], "i": [0, 1], "j": [0, 0],
                                                       "s": [0.5, 0.75]}, "one"), epoch=1)
    two = _write(tmp_path, ".csv", {"entity": ["cy", "bo"], "i": [2, 1], "j": [0, 1], "s": [0.5, 0.75]}, "two")
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run([sys.executable, "-m", "pipeline", "stream", "ingest", str(state), str(two),
                           "--epoch", "1"], capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    st = open_stream(state)
    assert st.manifest["format"] == "dplr-stream/2"
    ids = st.read("entities/ids_data").tobytes()
    assert ids == b"annbocy"
    spent = dict(zip(st.read("entities/keys").tolist(), st.read("entities/spent").tolist(), strict=True))
    assert spent[1] == pytest.approx(C * (1 - 1e-9), rel=1e-12)  # bo: 0.75, then 0.25 of the next 0.75
    cells = _cell_sum(state)
    assert cells[1, 1] == pytest.approx(C * (1 - 1e-9) - 0.75, rel=1e-8)
    # negative control: under a fresh table (the mapping lost) bo would get a new budget
    fresh = _new_stream(tmp_path / "fresh.stream")
    stream_ingest(fresh, two, epoch=1)
    assert _cell_sum(fresh)[1, 1] == pytest.approx(0.75)


def test_a_non_private_stream_keeps_its_table_too(tmp_path: Path) -> None:
    """The fingerprints use the keys: different ids must never look like a replay."""
    state = _new_stream(tmp_path / "np.stream", private=False)
    one = _write(tmp_path, ".parquet", {"entity": ["ann"], "i": [0], "j": [0], "s": [1.0]}, "one")
    two = _write(tmp_path, ".parquet", {"entity": ["bo"], "i": [0], "j": [0], "s": [1.0]}, "two")
    stream_ingest(state, one, epoch=1)
    stream_ingest(state, two, epoch=1)  # same cells and values, another entity: not a replay
    assert _cell_sum(state)[0, 0] == 2.0
    assert open_stream(state).read("entities/ids_data").tobytes() == b"annbo"


# -- states of format 1 ---------------------------------------------------------------------


def _as_format_1(state: Path, *, entity_kind: str | None, batch: Path | None = None) -> None:
    """Rewrite a new state's manifest as the earlier version wrote it."""
    st = open_stream(state)
    m = st.manifest
    changes: dict = {"format": "dplr-stream/1", "entity_kind": entity_kind}
    if batch is not None:  # a batch that version ingested, recorded under its hashed keys
        key = hashlib.sha256(f"dplr-entity-ids:{m['stream_id']}".encode()).digest()[:16]
        fp = read_batch(batch, shape=SHAPE, entity_key=key).fingerprint()
        changes["batches"] = [{"fingerprint": fp, "epoch": 1, "file": batch.name, "batch": 0, "applied": "x"}]
        changes["next_batch"] = 1
    with st.lock():
        st.commit(changes=changes)


def test_a_format_1_state_with_string_ids_opens_but_takes_no_more(tmp_path: Path) -> None:
    first, second = _two_batches(tmp_path)
    state = _new_stream(tmp_path / "old.stream")
    _as_format_1(state, entity_kind="str", batch=first)
    assert stream_status(state).n_batches == 1
    # its own batches are still recognised (a nightly rerun skips them)
    assert stream_ingest(state, first, epoch=1, skip_known=True)["skipped"]
    with pytest.raises(DuplicateBatchError):
        stream_ingest(state, first, epoch=1)
    meta = (state / "zarr.json").read_bytes()
    with pytest.raises(StoreLayoutError, match="create a new stream") as exc:
        stream_ingest(state, second, epoch=1)
    assert "\n" not in str(exc.value)
    assert "dplr-stream/1" in str(exc.value)
    assert (state / "zarr.json").read_bytes() == meta  # nothing applied
    # an integer batch is refused as another kind, as before
    ints = _write(tmp_path, ".npz", {"entity": np.array([1]), "i": np.array([0]), "j": np.array([0]),
                                     "s": np.array([1.0])}, "ints")
    with pytest.raises(InvalidParameterError, match="kind"):
        stream_ingest(state, ints, epoch=1)


def test_a_format_1_state_without_string_ids_takes_them_by_table(tmp_path: Path) -> None:
    first, _ = _two_batches(tmp_path)
    state = _new_stream(tmp_path / "old.stream")
    _as_format_1(state, entity_kind=None)
    stream_ingest(state, first, epoch=1)
    st = open_stream(state)
    assert st.manifest["format"] == "dplr-stream/2"  # an earlier dplr now refuses it
    assert st.read("entities/ids_data").tobytes() == b"boann"
    # an integer stream of format 1 stays as it is
    ints = _new_stream(tmp_path / "ints.stream")
    _as_format_1(ints, entity_kind=None)
    path = _write(tmp_path, ".npz", {"entity": np.array([5]), "i": np.array([0]), "j": np.array([0]),
                                     "s": np.array([1.0])}, "ints")
    stream_ingest(ints, path, epoch=1)
    assert json.loads((ints / "zarr.json").read_text())["attributes"]["dplr_stream"]["format"] == "dplr-stream/1"
