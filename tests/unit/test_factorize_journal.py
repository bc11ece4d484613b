"""``factorize`` survives a client crash: the journal of its single pass.

A crash between any two durable steps -- pass, journal of the exact sketches
(with the noise key and sketch seed), ledger charge, charge marker, noise and
publication, removal of the journal -- followed by a rerun of the same call
publishes bit for bit the release of an undisturbed run, charged once, and
reads the data again only if the crash came before the sketches were committed.

In-memory inputs (no cluster); the Dask paths, with real Zarr stores and a
SIGKILLed ``dplr factorize``, are in tests/distributed/test_factorize_resume.py.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest

from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.errors import StoreLayoutError
from pipeline.io import FileJournal, default_journal_path, read_release
from pipeline.mechanisms.noise import NoiseKey

M, N, RANK = 400, 60, 3
SKETCH_SEED = 1234
NOISE_SEED = 77
PRIVACY = {"epsilon": 1.0, "delta": 1e-6}


class SimulatedCrash(Exception):
    """Stands for the client process dying at the injection point."""


@pytest.fixture
def data(global_seed: int) -> np.ndarray:
    rng = np.random.default_rng(global_seed)
    return rng.standard_normal((M, N)) / np.sqrt(N) * rng.uniform(0.2, 2.0, (M, 1))


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per pass over the in-memory input."""
    calls: list[int] = []
    real = ArraySource.sketch

    def counting(self: ArraySource, request: Any) -> dict[str, Any]:
        calls.append(1)
        return real(self, request)

    monkeypatch.setattr(ArraySource, "sketch", counting)
    return calls


def _ledger(tmp_path: Path, eps: float = 10.0) -> Ledger:
    return Ledger.create(
        tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=eps, delta=1e-5
    )


def _kw(private: bool, algorithm: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"algorithm": algorithm, "seed": SKETCH_SEED}
    if private:
        kw.update(PRIVACY, insecure_noise_seed=NOISE_SEED)
    else:
        kw["private"] = False
    return kw


def _assert_private_tree(root: Path) -> None:
    """The journal is trusted zone: directories 0700, files 0600, all the way down."""
    for dirpath, _, files in os.walk(root):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for f in files:
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode)
            assert mode == 0o600, os.path.join(dirpath, f)


def _assert_same_arrays(a: Any, b: Any) -> None:
    for name in ("U", "S", "V"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        assert x.tobytes() == y.tobytes(), name  # bit for bit, not allclose


# ---------------------------------------------------------------------------
# the journal's sketch store
# ---------------------------------------------------------------------------
def test_sketch_journal_round_trip_keeps_bits_dtypes_and_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    small64 = rng.standard_normal((7, 5))
    small32 = rng.standard_normal((3, 4)).astype(np.float32)
    tall = da.from_array(rng.standard_normal((103, 6)), chunks=((40, 40, 23), (6,)))
    odd = da.from_array(rng.standard_normal((50, 2)), chunks=((10, 30, 10), (2,)))
    j = FileJournal.create(
        tmp_path / "j", {"kind": "t"}, noise_key=None, sketch_seed=2**100 + 5
    )
    assert j.load_sketches() is None  # nothing committed yet
    with dask.config.set(scheduler="synchronous"):
        j.record_sketches({"Z": small64, "W": small32, "Y": tall, "Yo": odd}, tall="write")
    _assert_private_tree(tmp_path / "j")

    again = FileJournal.find(tmp_path / "j", {"kind": "t"}, strict=True)
    assert again is not None
    assert again.sketch_seed == 2**100 + 5
    got = again.load_sketches()
    assert got is not None
    assert sorted(got) == ["W", "Y", "Yo", "Z"]
    for name, want in (("Z", small64), ("W", small32)):
        assert isinstance(got[name], np.ndarray)
        assert got[name].dtype == want.dtype
        assert got[name].tobytes() == want.tobytes()
    for name, want in (("Y", tall), ("Yo", odd)):
        assert isinstance(got[name], da.Array)
        assert (
            got[name].chunks == want.chunks
        )  # irregular chunks come back as they were
        with dask.config.set(scheduler="synchronous"):
            assert got[name].compute().tobytes() == want.compute().tobytes()


def test_tall_sketches_are_named_for_recomputation_by_default(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    small = rng.standard_normal((4, 3))
    tall = da.from_array(rng.standard_normal((60, 3)), chunks=(20, 3))
    j = FileJournal.create(tmp_path / "j", {"kind": "t"}, noise_key=None)
    j.record_sketches({"Z": small, "Y": tall})  # nothing computed: Y is not written
    assert not list((tmp_path / "j").glob("exact-Y*"))
    manifest = json.loads((tmp_path / "j" / "sketches.json").read_text())["sketches"]
    assert manifest["Y"] == {"kind": "recompute", "shape": [60, 3], "dtype": "<f8"}
    got = j.load_sketches()
    assert got is not None
    assert sorted(got) == ["Y", "Z"]
    assert got["Y"] is None  # the resumed pass makes it again
    assert got["Z"].tobytes() == small.tobytes()
    # negative control: with tall="write" the same call keeps Y
    j2 = FileJournal.create(tmp_path / "j2", {"kind": "t"}, noise_key=None)
    with dask.config.set(scheduler="synchronous"):
        j2.record_sketches({"Z": small, "Y": tall}, tall="write")
    got2 = j2.load_sketches()
    assert got2 is not None
    assert sorted(got2) == ["Y", "Z"]
    with pytest.raises(ValueError, match="recompute"):
        j2.record_sketches({"Z": small}, tall="never")


def test_damaged_sketches_are_refused(tmp_path: Path) -> None:
    j = FileJournal.create(tmp_path / "j", {"kind": "t"}, noise_key=None)
    tall = da.from_array(np.arange(40.0).reshape(20, 2), chunks=(5, 2))
    with dask.config.set(scheduler="synchronous"):
        j.record_sketches({"Z": np.ones((2, 3)), "Y": tall}, tall="write")
    npy = tmp_path / "j" / "exact-Z.npy"
    raw = bytearray(npy.read_bytes())
    raw[-1] ^= 1
    npy.write_bytes(bytes(raw))
    with pytest.raises(StoreLayoutError, match="checksum"):
        j.load_sketches()
    npy.unlink()
    with pytest.raises(StoreLayoutError, match=r"missing|damaged"):
        j.load_sketches()

    j2 = FileJournal.create(tmp_path / "j2", {"kind": "t"}, noise_key=None)
    with dask.config.set(scheduler="synchronous"):
        j2.record_sketches({"Y": tall}, tall="write")
        chunk = next(
            p
            for p in (tmp_path / "j2" / "exact-Y.zarr" / "c").rglob("*")
            if p.is_file()
        )
        raw = bytearray(chunk.read_bytes())
        raw[3] ^= 1
        chunk.write_bytes(bytes(raw))
        loaded = j2.load_sketches()
        assert loaded is not None
        with pytest.raises(Exception, match=r"(?i)checksum|crc"):  # zarr's CRC32C check
            loaded["Y"].compute()


def test_journal_of_another_kind_is_a_mismatch_with_its_release_id(
    tmp_path: Path,
) -> None:
    FileJournal.create(
        tmp_path / "j", {"kind": "pca", "release_id": "r1"}, noise_key=None
    )
    from pipeline.io.journal import JournalMismatchError

    with pytest.raises(JournalMismatchError) as info:
        FileJournal.find(
            tmp_path / "j", {"kind": "factorize", "release_id": "r2"}, strict=True
        )
    assert info.value.differences == ["kind"]
    assert info.value.release_id == "r1"
    assert info.value.charged is None
    # not strict (the PCA behaviour): a journal that recorded nothing is replaceable
    assert FileJournal.find(tmp_path / "j", {"kind": "factorize"}) is None


# ---------------------------------------------------------------------------
# crash points
# ---------------------------------------------------------------------------
def _crash_in_pass(mp: pytest.MonkeyPatch) -> None:
    def crashing(self: ArraySource, request: Any) -> dict[str, Any]:
        raise SimulatedCrash("in the pass")

    mp.setattr(ArraySource, "sketch", crashing)


def _after(
    cls: Any, name: str, *, uncommit: bool = False, instead: bool = False
) -> Callable[[pytest.MonkeyPatch], None]:
    """Crash right after ``cls.name`` ran (``instead``: in place of running it)."""

    def install(mp: pytest.MonkeyPatch) -> None:
        real = getattr(cls, name)

        def crashing(self: Any, *a: Any, **kw: Any) -> Any:
            if not instead:
                real(self, *a, **kw)
            if uncommit:  # died after the sketch files, before the manifest
                os.unlink(os.path.join(self.path, "sketches.json"))
            raise SimulatedCrash(f"after {name}")

        mp.setattr(cls, name, crashing)

    return install


def _before_publish(mp: pytest.MonkeyPatch) -> None:
    import pipeline.io

    def crashing(*a: Any, **kw: Any) -> None:
        raise SimulatedCrash("before publishing")

    mp.setattr(pipeline.io, "write_release", crashing)


# name -> (injection, journal committed at the crash, charged at the crash, passes on rerun)
CRASHES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], bool, bool, int]] = {
    "in the pass": (_crash_in_pass, False, False, 1),
    "sketches written, manifest not": (
        _after(FileJournal, "record_sketches", uncommit=True),
        False,
        False,
        1,
    ),
    "sketches committed, not charged": (
        _after(FileJournal, "record_sketches"),
        True,
        False,
        0,
    ),
    "charged, marker not written": (_after(Ledger, "charge"), True, True, 0),
    "charge marker written, before noise": (
        _after(FileJournal, "mark_charged"),
        True,
        True,
        0,
    ),
    "noise drawn, not published": (_before_publish, True, True, 0),
    "published, journal not removed": (
        _after(FileJournal, "remove", instead=True),
        True,
        True,
        0,
    ),
}


@pytest.mark.parametrize("algorithm", ["spectral", "low-space"])
@pytest.mark.parametrize("case", list(CRASHES))
def test_rerun_after_a_crash_gives_the_undisturbed_release_charged_once(
    data: np.ndarray,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    passes: list[int],
    case: str,
    algorithm: str,
) -> None:
    install, committed, charged, rerun_passes = CRASHES[case]
    kw = _kw(True, algorithm)
    clean = api.factorize(data, RANK, **kw)
    book = _ledger(tmp_path)
    out = tmp_path / "rel.zarr"
    journal = Path(default_journal_path(out))
    passes.clear()

    with monkeypatch.context() as mp:
        install(mp)
        with pytest.raises(SimulatedCrash):
            api.factorize(data, RANK, **kw, out=out, ledger=book)
    assert len(book.releases) == int(charged)
    published = case.startswith("published")
    assert os.path.isdir(out) is published
    if case == "in the pass":
        assert not os.path.lexists(journal)  # nothing durable before the pass ends
    else:
        _assert_private_tree(journal)
        assert (journal / "sketches.json").exists() is committed
    passes.clear()

    rel = api.factorize(data, RANK, **kw, out=out, ledger=book)
    assert len(passes) == rerun_passes  # the committed pass is not read again
    _assert_same_arrays(rel, clean)
    _assert_same_arrays(read_release(out), clean)
    (record,) = book.releases  # exactly one charge
    assert record["release_id"] == rel.report["release_id"]
    assert not os.path.lexists(journal)  # it held the key and the exact sketches
    if not published:
        assert rel.report["resumed_from_journal"] is (rerun_passes == 0)
        assert rel.report["n_passes"] == rerun_passes


@pytest.mark.parametrize("algorithm", ["spectral", "low-space"])
def test_non_private_rerun_reuses_the_pass(
    data: np.ndarray,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    passes: list[int],
    algorithm: str,
) -> None:
    kw = _kw(False, algorithm)
    clean = api.factorize(data, RANK, **kw)
    out = tmp_path / "rel.zarr"
    with monkeypatch.context() as mp:
        _before_publish(mp)
        with pytest.raises(SimulatedCrash):
            api.factorize(data, RANK, **kw, out=out)
    journal = Path(default_journal_path(out))
    header = json.loads((journal / "header.json").read_text())
    assert header["noise_key"] is None  # no noise in this mode, so no key
    passes.clear()
    rel = api.factorize(data, RANK, **kw, out=out)
    assert passes == []
    assert rel.report["resumed_from_journal"] is True
    _assert_same_arrays(rel, clean)
    assert not os.path.lexists(journal)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel.zarr"]  # no ledger


def test_secret_sketch_seed_and_fresh_key_are_kept_across_the_crash(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passes: list[int]
) -> None:
    """Without --seed and --insecure-noise-seed both are secret: the rerun takes them
    from the journal (the same noise), and the release equals the one the first run
    would have published."""
    out = tmp_path / "rel.zarr"
    captured: dict[str, Any] = {}
    real = FileJournal.create.__func__  # type: ignore[attr-defined]

    def spying(
        cls: Any, path: Any, header: Any, *, noise_key: Any, sketch_seed: Any = None
    ) -> Any:
        captured.update(key=noise_key, seed=sketch_seed)
        return real(cls, path, header, noise_key=noise_key, sketch_seed=sketch_seed)

    monkeypatch.setattr(FileJournal, "create", classmethod(spying))
    with monkeypatch.context() as mp:
        _before_publish(mp)
        with pytest.raises(SimulatedCrash):
            api.factorize(data, RANK, **PRIVACY, out=out, ledger=_ledger(tmp_path))
    key = captured["key"]
    assert isinstance(key, NoiseKey)
    assert not key.insecure
    rel = api.factorize(
        data,
        RANK,
        **PRIVACY,
        out=out,
        ledger=Ledger.open(tmp_path / "d.dplr-ledger.json"),
    )
    # the crashed run's passes only (the default private algorithm reads twice);
    # the rerun reads nothing
    assert len(passes) == 2
    assert rel.report["private"] is True
    from pipeline.algorithms.lrf import plan_lrf, run_lrf

    params = api.make_params(RANK, **PRIVACY)
    ref = run_lrf(
        ArraySource(data),
        plan_lrf(params, data.shape),
        ReleaseHooks(sketch_seed=captured["seed"], noise_key=key),
    )
    _assert_same_arrays(rel, ref)


# ---------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------
def _crashed_job(
    data: np.ndarray, out: Path, book: Ledger, mp: pytest.MonkeyPatch, when: str
) -> Path:
    with mp.context() as m:
        (
            _after(FileJournal, "record_sketches")
            if when == "before charge"
            else _before_publish
        )(m)
        with pytest.raises(SimulatedCrash):
            api.factorize(data, RANK, **_kw(True, "spectral"), out=out, ledger=book)
    return Path(default_journal_path(out))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("when", ["before charge", "after charge"])
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rank": RANK + 1}, "parameters"),
        ({"algorithm": "low-space"}, "parameters"),
        ({"insecure_noise_seed": NOISE_SEED + 1}, "insecure_noise_seed"),
        ({"seed": SKETCH_SEED + 1}, "sketch_seed"),
        ({"data": "other"}, "input_fingerprint"),
    ],
)
def test_journal_of_another_job_or_input_is_refused_with_what_removing_it_costs(
    data: np.ndarray,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
    change: dict[str, Any],
    field: str,
) -> None:
    book = _ledger(tmp_path)
    out = tmp_path / "rel.zarr"
    journal = _crashed_job(data, out, book, monkeypatch, when)
    before, ledger_before = _snapshot(journal), book.path.read_bytes()
    kw = {**_kw(True, "spectral"), **change}
    A = data
    if kw.pop("data", None) is not None:
        A = data.copy()
        A[0, 0] += 1.0
    rank = kw.pop("rank", RANK)
    with pytest.raises(StoreLayoutError) as info:
        api.factorize(A, rank, **kw, out=out, ledger=book)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(journal) in msg
    assert field in msg
    if when == "before charge":
        assert "nothing was charged" in msg.lower()
        assert "costs no privacy budget" in msg
    else:
        assert "already charged" in msg
        assert "charge stays spent" in msg
    # refused before anything is read, written or charged
    assert _snapshot(journal) == before
    assert book.path.read_bytes() == ledger_before
    assert not os.path.lexists(out)
    # the original job still finishes from its journal
    rel = api.factorize(data, RANK, **_kw(True, "spectral"), out=out, ledger=book)
    assert rel.report["resumed_from_journal"] is True
    assert len(book.releases) == 1


def test_a_charge_missing_from_the_ledger_is_refused(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = _ledger(tmp_path)
    out = tmp_path / "rel.zarr"
    journal = _crashed_job(data, out, book, monkeypatch, "after charge")
    assert (journal / "charged.json").exists()
    book.path.unlink()  # the ledger was lost: its budget would silently reset
    fresh = _ledger(tmp_path)
    with pytest.raises(StoreLayoutError, match="does not hold it"):
        api.factorize(data, RANK, **_kw(True, "spectral"), out=out, ledger=fresh)
    assert fresh.releases == ()


def test_custom_journal_path_and_no_journal_without_out(
    data: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom = tmp_path / "elsewhere" / "j"
    custom.parent.mkdir()
    out = tmp_path / "rel.zarr"
    with monkeypatch.context() as mp:
        _before_publish(mp)
        with pytest.raises(SimulatedCrash):
            api.factorize(data, RANK, **_kw(False, "spectral"), out=out, journal=custom)
    assert (custom / "sketches.json").exists()
    assert not os.path.lexists(default_journal_path(out))
    api.factorize(data, RANK, **_kw(False, "spectral"), out=out, journal=custom)
    assert not os.path.lexists(custom)

    # without out (and without journal=) nothing is journaled: arrays only
    with monkeypatch.context() as mp:
        mp.setattr(FileJournal, "create", lambda *a, **k: pytest.fail("journaled"))
        api.factorize(data, RANK, **_kw(False, "spectral"))


def test_over_budget_run_leaves_no_journal(data: np.ndarray, tmp_path: Path) -> None:
    from pipeline.errors import BudgetExceededError

    book = _ledger(tmp_path, eps=0.5)
    out = tmp_path / "rel.zarr"
    with pytest.raises(BudgetExceededError):
        api.factorize(data, RANK, **_kw(True, "spectral"), out=out, ledger=book)
    assert not os.path.lexists(default_journal_path(out))
    assert book.releases == ()


def test_a_sketch_recorded_again_as_the_same_array_is_not_rewritten(
    tmp_path: Path,
) -> None:
    """A two-pass job records Z after pass 1 and again with Y: Z's file stays
    (the same inode, never replaced); an equal-valued *new* array is written
    again (negative control: identity, not a guess from the values, decides)."""
    rng = np.random.default_rng(2)
    z = rng.standard_normal((5, 7))
    tall = da.from_array(rng.standard_normal((60, 3)), chunks=(20, 3))
    j = FileJournal.create(tmp_path / "j", {"kind": "t"}, noise_key=None)
    j.record_sketches({"Z": z})
    path = tmp_path / "j" / "exact-Z.npy"
    first = path.stat().st_ino
    j.record_sketches({"Z": z, "Y": tall})
    assert path.stat().st_ino == first
    got = j.load_sketches()
    assert got is not None
    assert got["Z"].tobytes() == z.tobytes()
    assert set(got) == {"Z", "Y"}
    j.record_sketches({"Z": z.copy(), "Y": tall})
    assert path.stat().st_ino != first  # write_private replaces the file


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(12.0).reshape(3, 4),
        lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4)),  # layout kept
        lambda: np.arange(24.0).reshape(2, 3, 4)[:, ::2],  # strided: C order
        lambda: np.asarray(3.5),
        lambda: np.zeros((0, 3)),
    ],
)
def test_a_recorded_array_is_the_bytes_np_save_writes(tmp_path: Path, make: Any) -> None:
    """The journal writes a .npy from the array's own memory (no serialised
    copy): the same bytes as np.save, so a resumed job reads the same values in
    the same layout (BLAS rounds by layout)."""
    value = make()
    j = FileJournal.create(tmp_path / "j", {"kind": "t"}, noise_key=None)
    j.record("x", value)
    want = tmp_path / "want.npy"
    np.save(want, value)
    assert (tmp_path / "j" / "x.npy").read_bytes() == want.read_bytes()
    back = j.load("x")
    assert back is not None
    assert back.flags.f_contiguous == np.load(want).flags.f_contiguous
    np.testing.assert_array_equal(back, value)
