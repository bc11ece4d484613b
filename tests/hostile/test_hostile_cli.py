"""Hostile Zarr stores through ``dplr factorize`` and ``dplr pca`` as subprocesses.

Cases 1, 2, 3 and 5 of the hostile input suite, where a user meets them: hostile
values in a store (released and checked, or refused with exit 2), damaged chunks
and edited ``zarr.json`` metadata. Every successful run is checked for finite
factors with orthonormal columns, a report that states the ledger charge, and a
ledger file with exactly one more record; every refused run for exit code 2, one
line on stderr naming the problem and no data value, nothing at OUT and a ledger
that is byte-identical (or not created).

Decided behaviours (documented in docs/privacy.md, "Hostile inputs"):

* a truncated or overwritten chunk is refused with exit 2 and names the rows and
  columns that cannot be read (pipeline/io/inputs.py);
* a **deleted** chunk file reads as the array's fill value: zarr defines an absent
  chunk as "all fill value" (sparse arrays rely on it), so dplr cannot tell a lost
  chunk from an empty one and releases the matrix with those rows at the fill
  value. Privacy is unaffected (the rows read are clipped like any other; a zero
  row is a legal "absent" individual); correctness is the store owner's concern.
  The same holds for a ``shape`` edited larger than the data, and for a dtype
  edited to another of the same width (the bytes are reinterpreted, then clipped).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import LocalCluster
from hostile_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    run_dplr,
    run_in_process,
)

from pipeline.accounting.ledger import Ledger
from pipeline.api import factorize
from pipeline.io import read_group
from pipeline.io.release import read_release

pytestmark = [pytest.mark.cli, pytest.mark.timeout(180)]

M, N, CHUNKS, C = 60, 20, (20, 20), 0.5
PRIVACY = ("--epsilon", "1", "--delta", "1e-6", "--quiet")
PLANTED = 123456.789  # planted in every store: it must never reach stderr


_SCHEDULER: list[str] = []  # the module's cluster (fixture below), when running


def dplr(*args: Any) -> Any:
    """:func:`run_dplr` with numbers given as numbers, on the module's cluster.

    ``factorize`` and ``pca`` would each start an embedded LocalCluster (seconds
    per run); the embedded cluster itself is tested in tests/cli.
    """
    sched = (
        ("--scheduler", _SCHEDULER[0])
        if _SCHEDULER and args[0] in ("factorize", "pca")
        else ()
    )
    return run_dplr(*(f"{a!r}" if isinstance(a, float) else a for a in args), *sched)


@pytest.fixture(scope="module", autouse=True)
def scheduler() -> Iterator[str]:
    """One single-threaded worker process on loopback for every run of this module."""
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster:
        _SCHEDULER.append(cluster.scheduler_address)
        yield cluster.scheduler_address
        _SCHEDULER.clear()


def _in_process(capsys: pytest.CaptureFixture[str]) -> Any:
    return lambda *args: run_in_process(capsys, *args)


def _base(seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, N)) / np.sqrt(N) * rng.uniform(0.4, 2.0, (M, 1))
    A[59, 0] = PLANTED
    return A


def _write(path: Path, A: np.ndarray, chunks: tuple[int, int] = CHUNKS) -> Path:
    z = zarr.create_array(store=path, shape=A.shape, chunks=chunks, dtype=A.dtype)
    z[...] = A
    return path


def _direction(n: int) -> np.ndarray:
    d = np.random.default_rng(11).standard_normal(n)
    return d / np.abs(d).max()


def _hostile(A: np.ndarray) -> np.ndarray:
    """Rows at 1e6 C, 1e300, -1.7e308 (float max), subnormal and -0.0."""
    H = A.copy()
    d = _direction(N)
    H[5], H[25], H[45] = 1e6 * C * d, 1e300 * d, -1.7e308 * d
    H[6], H[7] = 5e-324, -0.0
    return H


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


def _new_ledger(path: Path, unit: str = "row") -> Path:
    """A ledger whose individuals are the releases' ``unit`` (a column release is
    refused on a row ledger: no conversion between the two)."""
    Ledger.create(path, dataset="hostile", epsilon=100.0, delta=1e-3, unit=unit)
    return path


def _assert_orthonormal(X: np.ndarray) -> None:
    assert np.isfinite(X).all()
    # round-off of QR/SVD on at most 60 x 20 (and a float32 cast for float32 input)
    np.testing.assert_allclose(X.T @ X, np.eye(X.shape[1]), rtol=0, atol=1e-6)


def _released(proc: Any, out: Path, ledger: Path, n_records: int) -> Any:
    """Exit 0; checked factors; the report and the ledger both hold n_records."""
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rel = read_release(out)
    assert rel.report["ledger"]["n_releases"] == n_records
    assert len(_records(ledger)) == n_records
    assert f"{n_records} release(s) compose" in proc.stdout
    assert str(PLANTED)[:6] not in proc.stdout + proc.stderr
    return rel


def _refused(
    proc: Any, out: Path, ledger: Path, before: bytes | None, phrase: str
) -> str:
    line = assert_one_line_error(proc, 2, "dplr: error: ")
    assert phrase in line, line
    assert "123456" not in line
    assert_nothing_at(out)
    assert file_state(ledger) == before
    return line


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stores")
    A = _base()
    H = _hostile(A)
    clipped = A.copy()  # the hostile rows clipped by hand (and the tiny ones zeroed)
    clipped[[5, 25]] = C * _direction(N) / np.linalg.norm(_direction(N))
    clipped[45] = -clipped[5]
    clipped[[6, 7]] = 0.0
    nan = A.copy()
    nan[30, 4] = np.nan  # row 30: chunk (1, 0)
    f32 = A.astype(np.float32)
    f32[10] = np.finfo(np.float32).max
    f32[11] = -np.finfo(np.float32).max
    return {
        "good": _write(d / "good.zarr", A),
        "hostile": _write(d / "hostile.zarr", H),
        "clipped": _write(d / "clipped.zarr", clipped),
        "nan": _write(d / "nan.zarr", nan),
        "float32": _write(d / "float32.zarr", f32),
    }


# -- cases 1 and 2 on the cluster ---------------------------------------------------
@pytest.mark.parametrize(
    ("store", "args"),
    [
        ("hostile", ("--unit", "row", "--algorithm", "spectral")),
        ("hostile", ("--unit", "column", "--algorithm", "low-space")),
        ("float32", ("--unit", "entry")),  # the default: two-pass
    ],
    ids=["row-spectral", "column-low-space", "entry-float32"],
)
def test_hostile_values_release(
    stores: dict[str, Path], tmp_path: Path, store: str, args: tuple[str, ...]
) -> None:
    ledger = _new_ledger(tmp_path / "ledger.json", unit=args[1])
    out = tmp_path / "out.zarr"
    proc = dplr(
        "factorize",
        stores[store],
        "--rank",
        3,
        "--out",
        out,
        "--clip-norm",
        C,
        "--ledger",
        ledger,
        *args,
        *PRIVACY,
    )
    rel = _released(proc, out, ledger, 1)
    _assert_orthonormal(rel.U)
    _assert_orthonormal(rel.V)
    assert np.isfinite(rel.S).all()
    assert rel.report["clip_norm"] == C
    assert rel.report["private"] is True
    # Delta_F = C (add-remove): every sketch's sensitivity is C times its factor: a
    # Gaussian operator's JL factor (> 1), or exactly 1 for a sparse S (one pass)
    # and for both sketches of the two-pass algorithm
    for s in rel.report["sketches"]:
        exact = rel.report["algorithm"] == "two-pass" or (
            s["name"] == "Z" and rel.report["parameters"]["operator"] == "sparse-sign"
        )
        assert s["sensitivity"] == pytest.approx(C) if exact else s["sensitivity"] > C


def test_neighbours_differing_in_a_hostile_row_release_alike(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """Seeded sketch and noise: the store with rows at 1e6 C, 1e300 and -1.7e308 (and
    subnormal / -0 rows) releases exactly what the store with those rows clipped to
    C by hand (and zeroed) releases, up to round-off. A hostile row that escaped
    clipping would move the release by orders of magnitude."""
    ledger = _new_ledger(tmp_path / "ledger.json")
    rels = []
    for k, name in enumerate(("hostile", "clipped")):
        out = tmp_path / f"{name}.zarr"
        proc = dplr(
            "factorize",
            stores[name],
            "--rank",
            3,
            "--out",
            out,
            "--clip-norm",
            C,
            "--seed",
            17,
            "--insecure-noise-seed",
            23,
            "--ledger",
            ledger,
            *PRIVACY,
        )
        rels.append(_released(proc, out, ledger, k + 1))
    a, b = rels
    assert a.report["private"] is False  # seeded noise is stamped NOT PRIVATE
    np.testing.assert_allclose(a.S, b.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(a.U, b.U, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.V, b.V, rtol=0, atol=1e-9)


def test_pca_hostile_and_non_finite_rows(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """PCA clips the hostile rows to norm 1 and reads a NaN row as a zero row: the
    store with a NaN in row 30 and the hostile rows releases what the store with
    row 30 zeroed and the rows rescaled by hand releases (seeded noise)."""
    H = _hostile(_base())
    H[30, 4] = np.nan
    fixed = _base()
    fixed[30] = 0.0
    d = _direction(N) / np.linalg.norm(_direction(N))
    fixed[[5, 25]], fixed[45], fixed[[6, 7]] = d, -d, 0.0
    fixed[59] /= np.linalg.norm(fixed[59])  # the planted row is clipped too
    ledger = _new_ledger(tmp_path / "ledger.json")
    rels = []
    for k, A in enumerate((H, fixed)):
        store = _write(tmp_path / f"in{k}.zarr", A)
        out = tmp_path / f"out{k}.zarr"
        proc = dplr(
            "pca",
            store,
            "--rank",
            2,
            "--out",
            out,
            "--iterations",
            2,
            "--clip-radius",
            0.5,
            "--insecure-noise-seed",
            5,
            "--ledger",
            ledger,
            *PRIVACY,
        )
        assert proc.returncode == 0, proc.stderr
        arrays, rep = read_group(out, ("components", "eigenvalues"))
        assert rep["ledger"]["n_releases"] == k + 1
        assert len(_records(ledger)) == k + 1
        assert f"{k + 1} release(s) compose" in proc.stdout
        assert "123456" not in proc.stdout + proc.stderr
        rels.append(arrays)
    comps = [r["components"] for r in rels]
    _assert_orthonormal(comps[0])
    # prep_rows rescales by ROW_CLIP / ||a||: the same rows up to the last bits
    np.testing.assert_allclose(comps[0], comps[1], rtol=0, atol=1e-9)


# -- case 3 -------------------------------------------------------------------------
def test_non_finite_value_is_a_zero_column_on_low_space(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """Low-Space at unit column: the column holding the NaN is a zero column
    (docs/privacy.md, "Non-finite values"), so the store releases what the store
    with that column zeroed releases, bit for bit (same bytes, seeded noise)."""
    ledger = _new_ledger(tmp_path / "ledger.json", unit="column")
    zeroed = _base()
    zeroed[:, 4] = 0.0  # the NaN is at (30, 4)
    rels = []
    for k, store in enumerate((stores["nan"], _write(tmp_path / "zeroed.zarr", zeroed))):
        out = tmp_path / f"out{k}.zarr"
        proc = dplr(
            "factorize", store, "--rank", 3, "--out", out, "--algorithm", "low-space",
            "--unit", "column", "--seed", 3, "--insecure-noise-seed", 5,
            "--ledger", ledger, *PRIVACY,
        )
        rels.append(_released(proc, out, ledger, k + 1))
    for a, b in ((rels[0].U, rels[1].U), (rels[0].S, rels[1].S), (rels[0].V, rels[1].V)):
        np.testing.assert_array_equal(a, b)


# -- case 5: damaged chunks ---------------------------------------------------------
def _damage(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    chunk = dst / "c" / "1" / "0"  # rows 20:40
    data = chunk.read_bytes()
    if how == "truncated":
        chunk.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        chunk.write_bytes(np.random.default_rng(0).bytes(len(data)))
    else:
        chunk.unlink()
    return dst


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_chunk_is_refused(
    stores: dict[str, Path], tmp_path: Path, how: str
) -> None:
    store = _damage(stores["good"], tmp_path / "A.zarr", how)
    out = tmp_path / "out.zarr"
    # a ledger created by this run's budget flags: a refused run must not create it
    ledger = tmp_path / "ledger.json"
    proc = dplr(
        "factorize",
        store,
        "--rank",
        3,
        "--out",
        out,
        "--ledger",
        ledger,
        "--budget-epsilon",
        10,
        "--budget-delta",
        "1e-4",
        *PRIVACY,
    )
    _refused(proc, out, ledger, None, "cannot be read at rows 20:40, columns 0:20")
    assert not Path(f"{ledger}.lock").exists()


def test_deleted_chunk_reads_as_fill_value(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """Decided behaviour (module docstring): released, equal to the release of the
    matrix with those rows at the fill value (0), and charged once."""
    store = _damage(stores["good"], tmp_path / "A.zarr", "deleted")
    ledger = _new_ledger(tmp_path / "ledger.json")
    out = tmp_path / "out.zarr"
    proc = dplr(
        "factorize",
        store,
        "--rank",
        3,
        "--out",
        out,
        "--seed",
        3,
        "--insecure-noise-seed",
        4,
        "--ledger",
        ledger,
        *PRIVACY,
    )
    rel = _released(proc, out, ledger, 1)
    A = _base()
    A[20:40] = 0.0
    ref = factorize(A, 3, epsilon=1.0, delta=1e-6, seed=3, insecure_noise_seed=4)
    # in memory vs on the cluster: same release up to summation order
    # (tests/distributed/test_chunking_invariance.py)
    np.testing.assert_allclose(rel.S, ref.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(rel.U, ref.U, rtol=0, atol=1e-9)


# -- case 5: edited metadata ---------------------------------------------------------
def _edit(doc: dict[str, Any], name: str) -> None:
    if name == "3-D shape":
        doc["shape"] = [M, N, 1]
    elif name == "dtype not a dtype":
        doc["data_type"] = "float65"
    elif name == "dtype string":
        doc["data_type"], doc["fill_value"] = "string", ""
    elif name == "dtype bool":
        doc["data_type"], doc["fill_value"] = "bool", False
    elif name == "group":
        doc.clear()
        doc.update(zarr_format=3, node_type="group", attributes={})
    elif name == "zero rows":
        doc["shape"] = [0, N]
    elif name == "dtype narrower":
        doc["data_type"] = "float32"  # chunks hold float64 bytes: decode fails
    else:  # pragma: no cover
        raise AssertionError(name)


METADATA = {
    "3-D shape": "is not a readable Zarr store",
    "dtype not a dtype": "is not a readable Zarr store",
    "dtype string": "is not a readable Zarr store",
    "dtype bool": "must hold real numbers (int or float), got dtype bool",
    "group": "is a Zarr group, not an array",
    "zero rows": "must have at least one row and one column, got shape (0, 20)",
    "not JSON": "is not a readable Zarr store (JSONDecodeError)",
}


@pytest.mark.parametrize("name", [*METADATA, "dtype narrower"])
def test_edited_metadata_is_refused(
    stores: dict[str, Path],
    tmp_path: Path,
    name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused when opened (before any cluster starts); ``group`` and ``dtype
    narrower`` (refused during the pass) run as subprocesses, the others through
    ``pipeline.cli.main`` in this process (same parser, exit codes and message)."""
    store = tmp_path / "A.zarr"
    shutil.copytree(stores["good"], store)
    meta = store / "zarr.json"
    if name == "not JSON":
        meta.write_text("{not json")
    else:
        doc = json.loads(meta.read_text())
        _edit(doc, name)
        meta.write_text(json.dumps(doc))
    ledger = _new_ledger(tmp_path / "ledger.json")
    before = file_state(ledger)
    out = tmp_path / "out.zarr"
    run = dplr if name in ("group", "dtype narrower") else _in_process(capsys)
    proc = run(
        "factorize", store, "--rank", 3, "--out", out, "--ledger", ledger, *PRIVACY
    )
    phrase = METADATA.get(name, "cannot be read at rows")
    _refused(proc, out, ledger, before, phrase)
    if name == "group":  # pca opens stores through the same open_input
        proc = dplr(
            "pca",
            store,
            "--rank",
            2,
            "--out",
            out,
            "--iterations",
            1,
            "--clip-radius",
            0.5,
            "--ledger",
            ledger,
            *PRIVACY,
        )
        _refused(proc, out, ledger, before, phrase)


def test_edited_shape_and_same_width_dtype_release(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """Decided behaviour (module docstring): a shape edited larger reads the missing
    rows as the fill value, a float64 store relabelled int64 is reinterpreted; both
    are released (clipped like any input) and charged once each."""
    ledger = _new_ledger(tmp_path / "ledger.json")
    for k, (field, value) in enumerate(
        (("shape", [M + 20, N]), ("data_type", "int64"))
    ):
        store = tmp_path / f"A{k}.zarr"
        shutil.copytree(stores["good"], store)
        doc = json.loads((store / "zarr.json").read_text())
        doc[field] = value
        (store / "zarr.json").write_text(json.dumps(doc))
        out = tmp_path / f"out{k}.zarr"
        proc = dplr(
            "factorize", store, "--rank", 3, "--out", out, "--ledger", ledger, *PRIVACY
        )
        rel = _released(proc, out, ledger, k + 1)
        _assert_orthonormal(rel.U)
        _assert_orthonormal(rel.V)


# -- case 4 through the CLI: ranks the parser or the planner refuse -----------------
@pytest.mark.parametrize(
    ("rank", "text"),
    [
        ("0", "rank must be >= 1"),
        ("-2", "rank must be >= 1"),
        ("20", "got rank=20"),
        ("2.5", "invalid int value"),
    ],
)
def test_bad_rank_exits_2(
    stores: dict[str, Path],
    tmp_path: Path,
    rank: str,
    text: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``dplr factorize --rank 0`` runs as a subprocess; the other ranks and
    ``dplr pca`` are refused by the same parser and planner in this process."""
    ledger = _new_ledger(tmp_path / "ledger.json")
    before = file_state(ledger)
    out = tmp_path / "out.zarr"
    runs = [("factorize", ())]
    if rank == "2.5":  # pca parses it the same way (k = d = 20 is a valid PCA)
        runs.append(("pca", ("--iterations", "1", "--clip-radius", "0.5")))
    for cmd, extra in runs:
        run = dplr if (rank, cmd) == ("0", "factorize") else _in_process(capsys)
        proc = run(
            cmd,
            stores["good"],
            f"--rank={rank}",
            "--out",
            out,
            "--ledger",
            ledger,
            *extra,
            *PRIVACY,
        )
        if rank == "2.5":  # argparse: usage line + one error line, exit 2, no traceback
            assert proc.returncode == 2
            assert "Traceback" not in proc.stderr
            assert text in proc.stderr.strip().splitlines()[-1]
            assert_nothing_at(out)
            assert file_state(ledger) == before
        else:
            _refused(proc, out, ledger, before, text)
