"""A store rewritten while ``factorize`` reads it (case 6 of the hostile input suite).

Deterministic, no timing: zarr's ``LocalStore.get`` and dplr's direct chunk read
(``pipeline.io.inputs._chunk_bytes``) are wrapped in this process (the cluster is a
LocalCluster with in-process workers, so the wrapper runs where the chunks are read). The first chunk read swaps every chunk file of the store, by
atomic renames, for the chunks of a hostile matrix (rows at 1e300 and at the float
max); reads after it see the new chunks. The release is then computed from a mix
of the two matrices.

Decided behaviour: acceptable. Clipping is applied per block to the values the
block read, so whatever mix is read, every row of the matrix actually factorized
is within C, and the release is (epsilon, delta)-DP for that matrix. The test
checks exactly that: the release equals (up to summation order) the in-memory
release of the mix that was read, row block by row block, with the same sketch
seed and seeded noise; it is finite and orthonormal; the ledger holds one record.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline.accounting.ledger import Ledger
from pipeline.api import factorize
from pipeline.io import inputs

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

M, N, ROWS = 60, 20, 20  # three row chunks of full width


def _write(path: Path, A: np.ndarray) -> Path:
    z = zarr.create_array(store=path, shape=A.shape, chunks=(ROWS, N), dtype=A.dtype)
    z[...] = A
    return path


@pytest.fixture
def swapping_store(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Store A at ``store``; the first chunk read replaces all chunks by B's."""
    from zarr.storage import LocalStore

    rng = np.random.default_rng(3)
    A = rng.standard_normal((M, N)) / np.sqrt(N)
    B = A.copy()
    d = rng.standard_normal(N)
    B[0:60:7] = 1e300 * d / np.abs(d).max()
    B[3], B[44] = 1.7e308, -1.7e308
    store, other = _write(tmp_path / "A.zarr", A), _write(tmp_path / "B.zarr", B)
    old = {k: (store / "c" / str(k) / "0").read_bytes() for k in range(3)}
    new = {k: (other / "c" / str(k) / "0").read_bytes() for k in range(3)}
    log: dict[str, Any] = {"A": A, "B": B, "read": {}, "swapped": False}
    lock = threading.Lock()
    real = LocalStore.get
    real_direct = inputs._chunk_bytes
    root = os.path.abspath(store)

    def seen(store_root: Any, key: str, raw: bytes) -> None:
        if key.startswith("c/") and os.path.abspath(str(store_root)) == root:
            block = int(key.split("/")[1])
            with lock:
                log["read"].setdefault(block, []).append(
                    "A" if raw == old[block] else "B" if raw == new[block] else "?"
                )
                if not log["swapped"]:  # the store changes under the reader
                    for k in range(3):
                        tmp = store / "c" / str(k) / ".swap"
                        shutil.copyfile(other / "c" / str(k) / "0", tmp)
                        os.replace(tmp, store / "c" / str(k) / "0")
                    log["swapped"] = True

    async def get(self: Any, key: str, prototype: Any, byte_range: Any = None) -> Any:
        value = await real(self, key, prototype, byte_range)
        seen(self.root, key, value.to_bytes() if value is not None else b"")
        return value

    def direct(zstore: Any, key: str) -> Any:  # the pass tasks' own chunk reads
        value = real_direct(zstore, key)
        seen(zstore.root, key, bytes(value) if value is not None else b"")
        return value

    LocalStore.get = get  # type: ignore[method-assign]
    inputs._chunk_bytes = direct
    try:
        yield store, log
    finally:
        LocalStore.get = real  # type: ignore[method-assign]
        inputs._chunk_bytes = real_direct


def test_release_of_a_store_rewritten_mid_read(
    swapping_store: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, log = swapping_store
    ledger = tmp_path / "ledger.json"
    Ledger.create(ledger, dataset="A", epsilon=10.0, delta=1e-4)
    kw: dict[str, Any] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "clip_norm": 0.5,
        "seed": 11,
        "insecure_noise_seed": 12,
        "algorithm": "spectral",  # one pass: each row block is read once
    }
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster),
    ):
        f = factorize(os.fspath(store), 3, ledger=ledger, **kw)
    assert log["swapped"]
    # each row block was read once (one pass), some from A and, after the swap, from B
    assert sorted(log["read"]) == [0, 1, 2]
    versions = [log["read"][k] for k in range(3)]
    assert all(len(v) == 1 and v[0] in "AB" for v in versions), versions
    assert ["A"] in versions  # the first read saw the old store...
    assert ["B"] in versions  # ...and later reads the new one: a real mix
    mix = np.vstack(
        [log[v[0]][k * ROWS : (k + 1) * ROWS] for k, v in enumerate(versions)]
    )
    ref = factorize(mix, 3, **kw)
    # cluster vs in memory: the same release up to summation order
    # (tests/distributed/test_chunking_invariance.py)
    np.testing.assert_allclose(f.S, ref.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(f.U, ref.U, rtol=0, atol=1e-9)
    np.testing.assert_allclose(f.V, ref.V, rtol=0, atol=1e-9)
    for X in (f.U, f.V):
        assert np.isfinite(X).all()
        np.testing.assert_allclose(X.T @ X, np.eye(3), rtol=0, atol=1e-12)
    assert len(json.loads(ledger.read_text())["releases"]) == 1
    assert f.report["ledger"]["n_releases"] == 1


def test_rows_spanning_column_chunks_are_clipped_not_zeroed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a full-width band is too wide to read at once, row norms come from a
    pre-pass over the column chunks (pipeline/execution/source.py). Rows whose
    squares overflow float64 are clipped there by their norm too: the release
    equals the in-memory release of the matrix with those rows clipped by hand."""
    import pipeline.io.inputs

    monkeypatch.setattr(pipeline.io.inputs, "ROW_BAND_LIMIT", 0)  # force the pre-pass
    rng = np.random.default_rng(5)
    A = rng.standard_normal((M, N)) / np.sqrt(N)
    d = rng.standard_normal(N)
    d /= np.abs(d).max()
    H, ref = A.copy(), A.copy()
    H[4], H[33], H[50] = 1e300 * d, 1.7e308 * d, -1.7e308 * d
    ref[4] = ref[33] = 0.5 * d / np.linalg.norm(d)
    ref[50] = -ref[4]
    z = zarr.create_array(
        store=tmp_path / "H.zarr", shape=H.shape, chunks=(ROWS, 5), dtype=H.dtype
    )
    z[...] = H
    kw: dict[str, Any] = {
        "epsilon": 1.0,
        "delta": 1e-6,
        "clip_norm": 0.5,
        "seed": 11,
        "insecure_noise_seed": 12,
        "algorithm": "spectral",  # one pass: each row block is read once
    }
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster),
    ):
        f = factorize(
            os.fspath(tmp_path / "H.zarr"), 3, private=True, **kw, budget=(10.0, 1e-4)
        )
    assert f.report["n_passes"] == 2  # the norm pre-pass ran
    g = factorize(ref, 3, **kw)
    np.testing.assert_allclose(f.S, g.S, rtol=1e-9, atol=0)
    np.testing.assert_allclose(f.U, g.U, rtol=0, atol=1e-9)
    np.testing.assert_allclose(f.V, g.V, rtol=0, atol=1e-9)
