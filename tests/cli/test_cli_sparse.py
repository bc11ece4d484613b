"""CSR stores through the CLI: ``dplr generate --sparse``, ``dplr factorize`` and
``dplr pca`` on them, and bad sparse stores refused (docs/sparse.md).

A bad store exits 2 with one line on stderr naming the rule, no data value in it,
nothing at OUT and the ledger byte-identical (style B.6, as
tests/cli/test_cli_bad_input.py for dense stores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from cli_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    leading_json,
    run_dplr,
    run_in_process,
)

from pipeline.accounting.ledger import Ledger
from pipeline.io.csr import CSR_ENCODING, open_csr, write_csr
from pipeline.io.synthetic import synthetic_truth

pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
#: stored values with many digits: a message that printed one would show it
VALUES = (123.456789, 234.567891, 345.678912)


def _raw(path: Path, **change: Any) -> Path:
    """A 3 x 4 CSR group written with zarr directly (valid unless ``change``d)."""
    parts = {
        "indptr": np.array([0, 2, 2, 3], dtype=np.int64),
        "indices": np.array([0, 3, 1], dtype=np.int32),
        "data": np.array(VALUES),
        **{k: np.asarray(v) for k, v in change.items() if k != "attrs"},
    }
    g = zarr.open_group(path, mode="w", zarr_format=3)
    g.attrs.update(change.get("attrs", {**CSR_ENCODING, "shape": [3, 4]}))
    for name, arr in parts.items():
        z = g.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=(2,))
        z[...] = arr
    return path


BAD = {
    "indptr not from 0": ({"indptr": [1, 2, 2, 3]}, "indptr must start at 0"),
    "indptr decreasing": ({"indptr": [0, 2, 1, 3]}, "indptr must never decrease"),
    "indptr past data": ({"indptr": [0, 2, 2, 4]}, "last entry of indptr"),
    "index out of range": ({"indices": [0, 4, 1]}, "column indices must be in"),
    "unsorted indices": ({"indices": [3, 0, 1]}, "sorted and unique"),
    "lengths disagree": ({"indices": [0, 3]}, "indices and data must have the same"),
    "shape does not match": (
        {"attrs": {**CSR_ENCODING, "shape": [4, 4]}},
        "indptr must have shape[0] + 1 = 5 entries",
    ),
    "negative shape": (
        {"attrs": {**CSR_ENCODING, "shape": [-3, 4]}},
        "two positive integers",
    ),
}
#: run as the command a user types; the others in process (same parsing and line)
SUBPROCESS = {"unsorted indices", "negative shape"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_sparse_store_exits_2_in_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, phrase = BAD[name]
    store = _raw(tmp_path / "bad.zarr", **change)
    ledger = tmp_path / "ledger.json"
    Ledger.create(ledger, dataset="d", epsilon=10.0, delta=1e-4)
    before = file_state(ledger)
    out = tmp_path / "out.zarr"
    run = run_dplr if name in SUBPROCESS else lambda *a: run_in_process(capsys, *a)
    for verb in ("factorize", "pca"):
        proc = run(
            verb, store, "--rank", "1", "--out", out, "--quiet", *PRIVACY,
            "--ledger", ledger,
        )  # fmt: skip
        line = assert_one_line_error(proc, 2, "dplr: error: ")
        assert phrase in line, (verb, line)
        assert not any(f"{v:.4g}" in line or repr(v) in line for v in VALUES), line
        assert_nothing_at(out)
        assert file_state(ledger) == before


@pytest.mark.timeout(120)
def test_valid_store_is_a_negative_control(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store the bad cases alter opens: each refusal is the alteration's."""
    store = _raw(tmp_path / "ok.zarr")
    assert open_csr(store).shape == (3, 4)


@pytest.mark.timeout(240)
def test_generate_sparse_then_factorize_and_pca(tmp_path: Path) -> None:
    store = tmp_path / "s.zarr"
    proc = run_dplr(
        "generate", store, "--rows", "1200", "--cols", "80", "--sparse", "0.05",
        "--max-rank", "30", "--dtype", "float64", "--seed", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sparse CSR, density 0.05 in 20 blocks" in proc.stdout
    reader = open_csr(store)
    x = reader.band(0, reader.shape[0]).toarray()
    assert reader.nnz == 1200 * 80 // 20  # 20 dense blocks of 60 x 4
    truth = synthetic_truth(store)
    assert truth is not None
    assert truth["shape"] == [1200, 80]
    s = np.linalg.svd(x, compute_uv=False)
    k = truth["rank"]
    # float64 products of orthonormal factors: a few ulps of sigma_1
    np.testing.assert_allclose(s[:k], truth["singular_values"], atol=1e-12 * s[0])
    assert s[k] < 1e-12 * s[0]
    assert np.sqrt((x**2).sum(axis=1)).max() == pytest.approx(1.0, rel=1e-12)

    budget = ("--budget-epsilon", "10", "--budget-delta", "1e-4")
    out = tmp_path / "f.zarr"
    proc = run_dplr(
        "factorize", store, "--rank", "2", *PRIVACY, *budget, "--out", out,
        "--json", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = leading_json(proc.stdout)
    assert report["shape"] == [1200, 80]
    assert report["input"]["store_chunks"] is None
    proc = run_dplr(
        "pca", store, "--rank", "2", *PRIVACY, "--out", tmp_path / "p.zarr",
        "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_sparse_matrix_written_by_write_csr_has_no_truth(tmp_path: Path) -> None:
    """Negative control of synthetic_truth: a CSR store of any other writer."""
    path = tmp_path / "plain.zarr"
    write_csr(path, sp.eye(3, 2, format="csr"))
    assert synthetic_truth(path) is None
