"""``dplr convert``: the COO Parquet files of a stream batch to a CSR store
(docs/sparse.md, "Converting COO batches").

The converter runs as a subprocess; its store is read back by the ``anndata``
package and must equal scipy's own COO -> CSR conversion of the same triples
(duplicates summed) in every stored bit: per row, both sum the same values in the
same order, whatever the row bands the converter used. Bad input exits 2 with
one line naming the file, the column and the rule, no value in it and nothing
written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import zarr
from cli_util import assert_nothing_at, assert_one_line_error, run_dplr, run_in_process

from pipeline.io.csr import open_csr

pytestmark = pytest.mark.cli
anndata = pytest.importorskip("anndata")

M, N = 300, 40
#: a value with many digits: a message that printed one would show it
ODD = 123.456789


def _triples(rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
    """Random (i, j, s) on rows [0, M) but for an empty stretch, many duplicates."""
    i = rng.integers(0, M, count)
    i[(i >= 100) & (i < 140)] = 7  # rows 100-139 empty; row 7 long
    return {
        "entity": rng.integers(0, 50, count),
        "i": i.astype(np.int32),
        "j": rng.integers(0, 15, count),  # 15 of 40 columns: many duplicates
        "s": rng.standard_normal(count),
    }


def _write(path: Path, cols: dict[str, Any], row_group: int = 500) -> Path:
    pq.write_table(pa.table(cols), path, row_group_size=row_group)
    return path


def _scipy(parts: list[dict[str, np.ndarray]]) -> sp.csr_matrix:
    i, j, s = (np.concatenate([p[c] for p in parts]) for c in ("i", "j", "s"))
    return sp.coo_matrix((s, (i, j)), shape=(M, N)).tocsr()


def _read_anndata(path: Path) -> sp.csr_matrix:
    x = anndata.io.read_elem(zarr.open_group(path, mode="r"))
    assert sp.issparse(x)
    assert x.format == "csr"
    return sp.csr_matrix(x)


def _assert_same(got: sp.csr_matrix, want: sp.csr_matrix) -> None:
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    # the same additions in the same order per row: the same bits (NaN included)
    np.testing.assert_array_equal(got.data, want.data)


def test_convert_equals_scipy_coo_to_csr(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    parts = [_triples(rng, 3000), _triples(rng, 1000)]
    parts[1]["s"][:3] = [np.nan, np.inf, 0.0]  # kept as stored (zero-individual rule)
    files = [_write(tmp_path / f"b{k}.parquet", p) for k, p in enumerate(parts)]
    want = _scipy(parts)
    for budget in (64, 10**6):  # ~70 row bands, and one
        out = tmp_path / f"m{budget}.zarr"
        proc = run_dplr(
            "convert", *files, "--rows", M, "--cols", N, "--out", out,
            "--band-entries", budget,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "duplicates summed" in proc.stdout
        _assert_same(_read_anndata(out), want)
        # no spill files or temporary store left beside the store
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        assert leftovers == []
    # the store is a dplr input: opened, validated and read like any CSR store
    _assert_same(open_csr(tmp_path / "m64.zarr").band(0, M), want)


def test_an_existing_store_needs_overwrite(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _write(tmp_path / "b.parquet", _triples(rng, 200))
    out = tmp_path / "m.zarr"
    args = ("convert", f, "--rows", M, "--cols", N, "--out", out)
    assert run_in_process(capsys, *args).returncode == 0
    before = sorted(p.name for p in out.rglob("*"))
    proc = run_in_process(capsys, *args)
    assert "exists" in assert_one_line_error(proc, 2, "dplr: error:")
    assert sorted(p.name for p in out.rglob("*")) == before
    assert run_in_process(capsys, *args, "--overwrite").returncode == 0


def _bad_cases(rng: np.random.Generator) -> dict[str, tuple[dict[str, Any], str]]:
    good = _triples(rng, 50)
    good["s"][:] = ODD
    i_out, j_out, i_float, s_text = (dict(good) for _ in range(4))
    i_out["i"] = good["i"].copy()
    i_out["i"][-1] = M  # one past the last row
    j_out["j"] = good["j"].copy()
    j_out["j"][0] = -1
    i_float["i"] = good["i"].astype(np.float64)
    s_text["s"] = np.array([f"{ODD}"] * 50)
    no_s = {k: v for k, v in good.items() if k != "s"}
    nulls = dict(good)
    nulls["s"] = pa.array([ODD] * 49 + [None])
    return {
        "row out of range": (i_out, "column 'i' must lie in [0, n_rows) = [0, 300)"),
        "column out of range": (j_out, "column 'j' must lie in [0, n_cols) = [0, 40)"),
        "float row index": (i_float, "column 'i' must hold integers"),
        "text values": (s_text, "column 's' must hold real numbers"),
        "missing column": (no_s, "lacks the column(s) 's'"),
        "nulls": (nulls, "column 's' contains nulls"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "row out of range",
        "column out of range",
        "float row index",
        "text values",
        "missing column",
        "nulls",
    ],
)
def test_bad_batch_exits_2_in_one_line_with_nothing_written(
    tmp_path: Path,
    rng: np.random.Generator,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    cols, rule = _bad_cases(rng)[case]
    good = _write(tmp_path / "a.parquet", _triples(rng, 100))
    bad = _write(tmp_path / "z.parquet", cols)
    out = tmp_path / "m.zarr"
    # the bad file comes second: refused although the first was fine
    proc = run_in_process(
        capsys, "convert", good, bad, "--rows", M, "--cols", N, "--out", out,
        "--band-entries", 16,
    )  # fmt: skip
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert rule in line
    assert "z.parquet" in line
    assert "123.45" not in line
    assert_nothing_at(out)


def test_bad_files_and_shapes_exit_2(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write(tmp_path / "a.parquet", _triples(rng, 100))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "b.csv").write_text("entity,i,j,s\n0,0,0,1\n")
    out = tmp_path / "m.zarr"
    cases = [
        ((tmp_path / "none.parquet", "--rows", M), "does not exist"),
        ((tmp_path / "junk.parquet", "--rows", M), "not a readable Parquet file"),
        ((tmp_path / "b.csv", "--rows", M), "Parquet"),
        ((good, "--rows", 0), "rows"),
        ((good, "--rows", M, "--band-entries", 0), "band-entries"),
    ]
    for args, rule in cases:
        proc = run_in_process(capsys, "convert", *args, "--cols", N, "--out", out)
        line = assert_one_line_error(proc, 2, "dplr: error:")
        assert rule in line, line
        assert_nothing_at(out)
    nowhere = tmp_path / "no" / "m.zarr"
    proc = run_in_process(
        capsys, "convert", good, "--rows", M, "--cols", N, "--out", nowhere
    )
    assert "does not exist" in assert_one_line_error(proc, 2, "dplr: error:")
    assert not nowhere.parent.exists()


def test_a_bad_batch_exits_2_as_a_subprocess(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    cols, rule = _bad_cases(rng)["row out of range"]
    bad = _write(tmp_path / "z.parquet", cols)
    out = tmp_path / "m.zarr"
    proc = run_dplr("convert", bad, "--rows", M, "--cols", N, "--out", out)
    assert rule in assert_one_line_error(proc, 2, "dplr: error:")
    assert_nothing_at(out)
