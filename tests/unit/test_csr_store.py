"""CSR matrices in AnnData's Zarr layout: read by row bands, validated, written.

The layout is the real one: stores are written by the ``anndata`` package itself
(its default Zarr v2 and Zarr v3) and read back by dplr band by band, with band
boundaries anywhere; our writer's stores are read by ``anndata.read_zarr``.
Malformed stores are written with zarr directly and each refused in one line
naming the rule, with no value, position or count of the data in it.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from pipeline.errors import StoreLayoutError
from pipeline.io import csr
from pipeline.io.csr import CSR_ENCODING, CsrReader, open_csr, write_csr

anndata = pytest.importorskip("anndata")


def _matrix(rng: np.random.Generator, m: int = 37, n: int = 23) -> sp.csr_matrix:
    """Random CSR with empty rows, a full row and float32 data."""
    x = sp.random(m, n, density=0.2, format="csr", rng=rng, dtype=np.float32)
    x = x.tolil()
    x[3, :] = 0  # empty rows
    x[4, :] = 0
    x[5, :] = rng.standard_normal(n).astype(np.float32)  # a full row
    out = sp.csr_matrix(x)
    out.sort_indices()
    return out


def _write_anndata(path: Path, x: sp.csr_matrix, fmt: int) -> None:
    with warnings.catch_warnings():
        # anndata announces its future v3 default when it writes v2
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        anndata.settings.zarr_write_format = fmt
        try:
            anndata.AnnData(x).write_zarr(path)
        finally:
            anndata.settings.zarr_write_format = 2


def _assert_same(a: sp.spmatrix, b: sp.spmatrix) -> None:
    """Identical CSR structure and bits (the same stored bytes, read back)."""
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data, b.data)
    assert a.dtype == b.dtype


@pytest.mark.parametrize("fmt", [2, 3])
def test_anndata_store_read_band_by_band(
    tmp_path: Path, rng: np.random.Generator, fmt: int
) -> None:
    x = _matrix(rng)
    path = tmp_path / "a.zarr"
    _write_anndata(path, x, fmt)
    reader = open_csr(path)  # the AnnData root: X found from its metadata
    assert reader.shape == x.shape
    assert reader.dtype == np.float32
    # bands that split indptr anywhere, incl. empty rows, one row, an empty band
    cuts = [0, 1, 3, 5, 6, 17, 17, 30, 37]
    bands = [reader.band(a, b) for a, b in itertools.pairwise(cuts)]
    for (a, b), band in zip(itertools.pairwise(cuts), bands, strict=True):
        _assert_same(band, x[a:b])
    _assert_same(sp.vstack(bands), x)
    # the X group itself is a CSR group too
    _assert_same(open_csr(path / "X").band(0, 37), x)


def test_reader_reads_only_the_band(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _matrix(rng)
    write_csr(tmp_path / "m.zarr", x, chunk_nnz=16)
    reader = open_csr(tmp_path / "m.zarr")
    reads: list[tuple[str, int, int]] = []
    real = CsrReader._read

    def spy(self: CsrReader, arr: Any, lo: int, hi: int, name: str) -> np.ndarray:
        reads.append((name, lo, hi))
        return real(self, arr, lo, hi, name)

    monkeypatch.setattr(CsrReader, "_read", spy)
    reader.band(10, 20)
    p0, p1 = int(x.indptr[10]), int(x.indptr[20])
    assert reads == [("indptr", 10, 21), ("indices", p0, p1), ("data", p0, p1)]


def test_writer_is_read_by_anndata(tmp_path: Path, rng: np.random.Generator) -> None:
    x = _matrix(rng)
    write_csr(tmp_path / "m.zarr", x)
    back = anndata.io.read_elem(zarr.open_group(tmp_path / "m.zarr", mode="r"))
    _assert_same(back, x)
    # band by band (out of core) writes the same store
    write_csr(
        tmp_path / "b.zarr",
        (x[a : a + 10] for a in range(0, 37, 10)),
        shape=x.shape,
        chunk_nnz=7,
    )
    _assert_same(open_csr(tmp_path / "b.zarr").band(0, 37), x)
    # an AnnData store whose X is ours reads back through anndata.read_zarr
    root = zarr.open_group(tmp_path / "ad.zarr", mode="w", zarr_format=3)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
    write_csr(tmp_path / "ad.zarr" / "X", x)
    _assert_same(open_csr(tmp_path / "ad.zarr").band(0, 37), x)


def test_writer_makes_canonical_form(tmp_path: Path) -> None:
    """Duplicates summed and indices sorted: the store passes validation."""
    x = sp.csr_matrix(
        (np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3])),
        shape=(1, 3),
    )
    write_csr(tmp_path / "m.zarr", x)
    np.testing.assert_array_equal(
        open_csr(tmp_path / "m.zarr").band(0, 1).toarray(), [[2.0, 0.0, 4.0]]
    )


def test_no_anndata_at_run_time(tmp_path: Path, rng: np.random.Generator) -> None:
    """Reading an AnnData store imports neither anndata nor its dependencies."""
    _write_anndata(tmp_path / "a.zarr", _matrix(rng), 3)
    code = textwrap.dedent(f"""
        import sys
        from pipeline.io.csr import open_csr
        r = open_csr({str(tmp_path / "a.zarr")!r})
        r.band(0, r.shape[0])
        bad = sorted(m for m in ("anndata", "h5py", "pandas") if m in sys.modules)
        print(bad)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(csr.__file__).parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.strip() == "[]"


# -- malformed stores ----------------------------------------------------------
def _raw(
    path: Path,
    *,
    indptr: Any = (0, 2, 2, 3),
    indices: Any = (0, 3, 1),
    data: Any = (5.5, 6.5, 7.5),
    attrs: dict[str, Any] | None = None,
    dtypes: dict[str, Any] | None = None,
) -> Path:
    """A 3 x 4 CSR group written with zarr directly (valid by default)."""
    g = zarr.open_group(path, mode="w", zarr_format=3)
    g.attrs.update(attrs or {**CSR_ENCODING, "shape": [3, 4]})
    dtypes = {
        "indptr": np.int64,
        "indices": np.int32,
        "data": np.float64,
        **(dtypes or {}),
    }
    for name, values in (("indptr", indptr), ("indices", indices), ("data", data)):
        if values is None:
            continue
        arr = np.asarray(values, dtype=dtypes[name])
        z = g.create_array(
            name, shape=arr.shape, dtype=arr.dtype, chunks=(2,) * arr.ndim
        )
        z[...] = arr
    return path


_ENC = {**CSR_ENCODING}
MALFORMED = {
    "indptr does not start at 0": ({"indptr": (1, 2, 2, 3)}, "indptr must start at 0"),
    "indptr decreases": ({"indptr": (0, 2, 1, 3)}, "indptr must never decrease"),
    "indptr ends short": ({"indptr": (0, 1, 1, 2)}, "last entry of indptr"),
    "indptr ends past data": ({"indptr": (0, 2, 2, 4)}, "last entry of indptr"),
    "lengths disagree": (
        {"indices": (0, 3)},
        "indices and data must have the same length",
    ),
    "index negative": (
        {"indices": (0, -3, 1)},
        "column indices must be in [0, shape[1]) = [0, 4)",
    ),
    "index too large": ({"indices": (0, 4, 1)}, "column indices must be in"),
    "unsorted in a row": ({"indices": (3, 0, 1)}, "sorted and unique"),
    "duplicate in a row": ({"indices": (3, 3, 1)}, "sorted and unique"),
    "indptr length": (
        {"indptr": (0, 2, 3)},
        "indptr must have shape[0] + 1 = 4 entries",
    ),
    "shape of three": (
        {"attrs": {**_ENC, "shape": [3, 4, 1]}},
        "two positive integers",
    ),
    "negative shape": ({"attrs": {**_ENC, "shape": [-3, 4]}}, "two positive integers"),
    "zero shape": ({"attrs": {**_ENC, "shape": [3, 0]}}, "two positive integers"),
    "boolean shape": ({"attrs": {**_ENC, "shape": [True, 4]}}, "two positive integers"),
    "no shape": ({"attrs": {**_ENC}}, "two positive integers"),
    "complex data": (
        {"dtypes": {"data": np.complex128}},
        "data must hold real numbers",
    ),
    "boolean data": ({"dtypes": {"data": np.bool_}}, "data must hold real numbers"),
    "float indices": (
        {"dtypes": {"indices": np.float64}},
        "indices must hold integers",
    ),
    "missing data": ({"data": None}, "the array 'data' is missing"),
    "unknown version": (
        {"attrs": {**_ENC, "encoding-version": "0.9.0", "shape": [3, 4]}},
        "encoding-version '0.9.0' is not supported",
    ),
    "not a CSR group": (
        {"attrs": {"encoding-type": "csc_matrix", "encoding-version": "0.1.0"}},
        "is not a CSR matrix",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_store_refused_in_one_line(tmp_path: Path, case: str) -> None:
    kwargs, rule = MALFORMED[case]
    path = _raw(tmp_path / "bad.zarr", **kwargs)
    with pytest.raises(StoreLayoutError) as err:
        open_csr(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert rule in msg
    # no stored value, position or count: only the declared shape's numbers
    for shown in ("5.5", "6.5", "7.5", "nnz"):
        assert shown not in msg


@pytest.mark.parametrize(
    "case", [c for c in sorted(MALFORMED) if "index" in c or "in a row" in c]
)
def test_the_compiled_index_check_refuses_alike(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces of at least COMPILED_ENTRIES indices are checked by a compiled
    loop: the same refusal as the numpy check (forced here on every piece)."""
    kwargs, rule = MALFORMED[case]
    path = _raw(tmp_path / "bad.zarr", **kwargs)
    monkeypatch.setattr(csr, "COMPILED_ENTRIES", 1)
    with pytest.raises(StoreLayoutError, match=re.escape(rule)):
        open_csr(path)
    open_csr(_raw(tmp_path / "ok.zarr"))  # negative control: a valid store opens


def test_compiled_and_numpy_index_checks_agree(global_seed: int) -> None:
    """The compiled check of one piece (pipeline.linalg.compiled.index_fault)
    against the numpy one, on 3000 random pieces: indices in and out of
    range, sorted, shuffled and duplicated, row starts anywhere, either
    dtype; both kinds of fault occur (so the comparison can fail)."""
    from pipeline.linalg.compiled import index_fault

    rng = np.random.default_rng(global_seed)
    seen = set()
    for _ in range(3000):
        size, n = int(rng.integers(1, 40)), int(rng.integers(3, 30))
        dtype = np.int32 if rng.random() < 0.5 else np.int64
        idx = np.sort(rng.integers(0, n, size)).astype(dtype)
        starts = np.unique(rng.integers(0, size, int(rng.integers(0, 5))))
        if rng.random() < 0.8:
            starts = np.unique(np.r_[0, starts])
        r = rng.random()
        if r < 0.3:
            idx[rng.integers(0, size)] = rng.integers(-3, n + 3)
        elif r < 0.6:
            idx = rng.permutation(idx)
        prev = int(rng.integers(-1, n))
        got = index_fault(idx, starts, prev, n)
        assert got == csr._index_fault(idx, starts, prev, n)
        seen.add(got)
    assert seen == {0, 1, 2}


def test_valid_store_and_nonfinite_data_open(tmp_path: Path) -> None:
    """Negative control of the refusals, and NaN/Inf in data are no refusal:
    they follow the non-finite rule in the kernels (docs/privacy.md)."""
    path = _raw(tmp_path / "ok.zarr", data=(np.nan, np.inf, 1.0))
    band = open_csr(path).band(0, 3)
    assert band.shape == (3, 4)
    assert np.isnan(band.data[0])


def test_validation_is_streamed(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces of at most the validation chunk; a violation at a piece boundary
    is found, and a valid store split the same way passes."""
    x = _matrix(rng, m=60, n=50)
    write_csr(tmp_path / "m.zarr", x, chunk_nnz=4)
    monkeypatch.setattr(csr, "VALIDATE_CHUNK", 8)
    sizes: list[int] = []
    real = CsrReader._read

    def spy(self: CsrReader, arr: Any, lo: int, hi: int, name: str) -> np.ndarray:
        sizes.append(hi - lo)
        return real(self, arr, lo, hi, name)

    monkeypatch.setattr(CsrReader, "_read", spy)
    open_csr(tmp_path / "m.zarr")
    assert max(sizes) <= 9  # 8 pointers (+1 for the end of the last row)
    # swap two indices of the full row 5 across a piece boundary (positions 7, 8)
    g = zarr.open_group(tmp_path / "m.zarr", mode="r+")
    start = int(x.indptr[5])
    p = start + (8 - start % 8) - 1  # last position of a piece, inside row 5
    idx = np.asarray(g["indices"][:])
    assert x.indptr[5] <= p < p + 1 < x.indptr[6]
    idx[p], idx[p + 1] = idx[p + 1], idx[p]
    g["indices"][:] = idx
    with pytest.raises(StoreLayoutError, match="sorted and unique"):
        open_csr(tmp_path / "m.zarr")


def test_corrupted_chunk_is_one_line(tmp_path: Path, rng: np.random.Generator) -> None:
    write_csr(tmp_path / "m.zarr", _matrix(rng), chunk_nnz=8)
    reader = open_csr(tmp_path / "m.zarr")
    chunk = tmp_path / "m.zarr" / "data" / "c" / "1"
    chunk.write_bytes(b"\x00garbage")
    with pytest.raises(StoreLayoutError, match=r"cannot be read \(data") as err:
        reader.band(0, reader.shape[0])
    assert "\n" not in str(err.value)
