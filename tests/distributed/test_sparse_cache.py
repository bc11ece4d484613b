"""A CSR store's row bands held in worker memory between passes (``cache=``).

A sparse band's size counts its stored entries, so its cache decision is taken
from the store's row pointers inside the trusted zone and withheld from the
report (docs/privacy.md, "Times"; :mod:`pipeline.execution.cache`). Every read
of a chunk of the store's ``data`` array leaves a marker file, so the tests count
what each release read: held, the values are read by the first pass only. The
release is bit for bit the same either way (the same computation on the same
bytes), and the report says the same whatever was decided.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from distributed import Client, LocalCluster
from test_cache import _nothing_left
from test_fault_tolerance import SlowStore
from zarr.storage import LocalStore

import pipeline.execution.pca as pca_module
import pipeline.execution.source as source_module
import pipeline.io.inputs
from pipeline.api import factorize, pca
from pipeline.execution.cache import CACHE_FRACTION, SPARSE_REASON
from pipeline.io.csr import write_csr

pytestmark = pytest.mark.distributed

M, N, RANK, T = 300, 40, 3, 3
#: rows per CSR band: not a divisor of M, so bands split the arrays' chunks
BAND_ROWS = 37
PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "budget": (100.0, 1e-3),
           "insecure_noise_seed": 7}  # fmt: skip


class DataReads(SlowStore):
    """A store whose reads of the ``data`` array's chunks leave one marker each."""

    async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def]
        value = await LocalStore.get(self, key, prototype, byte_range)
        if key.startswith("data/c/") and self.marks:
            Path(self.marks, f"{key.replace('/', '_')}-{uuid.uuid4().hex}").touch()
        return value


@pytest.fixture
def store(tmp_path: Path, global_seed: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    rng = np.random.default_rng(global_seed)
    A = np.where(rng.random((M, N)) < 0.15, rng.standard_normal((M, N)), 0.0)
    path = tmp_path / "A.zarr"
    write_csr(path, sp.csr_matrix(A), chunk_nnz=97)
    monkeypatch.setattr(pipeline.io.inputs, "CSR_BAND_CELLS", BAND_ROWS * N)
    monkeypatch.setattr(pca_module, "BAND_BYTES", 1)  # one PCA band per CSR band
    marks = tmp_path / "marks"
    marks.mkdir()

    def open_counted() -> tuple[zarr.Group, Path]:
        return zarr.open_group(store=DataReads(path, marks=str(marks)), mode="r"), marks

    return open_counted


def _reads(marks: Path) -> int:
    n = len(os.listdir(marks))
    for f in os.listdir(marks):
        os.remove(marks / f)
    return n


@pytest.mark.timeout(180)
def test_a_csr_store_is_read_once_by_a_two_pass_release(
    client: Client, cluster: LocalCluster, tmp_path: Path, store: Any
) -> None:
    runs, reports, clusters = {}, {}, {}
    for mode in ("never", "auto", "always"):
        group, marks = store()
        f = factorize(group, RANK, algorithm="two-pass", seed=3, cache=mode,
                      ledger=tmp_path / "l.json", **PRIVACY)  # fmt: skip
        runs[mode], reports[mode] = (f, _reads(marks)), f.report["cluster"]["cache"]
        clusters[mode] = {k: v for k, v in f.report["cluster"].items() if k != "cache"}
        assert f.report["n_passes"] == 2
        assert _nothing_left(cluster.scheduler_address) == []
    once = runs["never"][1] // 2
    assert once > 0
    assert runs["never"][1] == 2 * once  # each pass reads every value chunk
    assert runs["auto"][1] == runs["always"][1] == once  # held: the first pass only
    for mode in ("auto", "always"):
        np.testing.assert_array_equal(runs[mode][0].S, runs["never"][0].S)
        np.testing.assert_array_equal(np.asarray(runs[mode][0].U),
                                      np.asarray(runs["never"][0].U))  # fmt: skip
        np.testing.assert_array_equal(np.asarray(runs[mode][0].V),
                                      np.asarray(runs["never"][0].V))  # fmt: skip
        # the report tells nothing of the decision nor of the sizes
        assert reports[mode] == {"mode": mode, "used": None, "reason": SPARSE_REASON,
                                 "fraction": CACHE_FRACTION}  # fmt: skip
    assert reports["never"]["used"] is False  # asked not to: public
    # nor does the rest of the report: a pass over held bands has fewer tasks, so
    # their count is withheld too (never holds nothing: public)
    assert clusters["auto"] == clusters["always"]
    assert clusters["auto"]["n_graph_tasks_pass"] is None
    assert clusters["never"]["n_graph_tasks_pass"] > 0


@pytest.mark.timeout(180)
def test_held_or_not_the_report_is_the_same(
    client: Client, tmp_path: Path, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` with bands that fit and with bands that do not (workers of 1 kB):
    the same release, the same progress output and the same report, all of it
    but the release's own id, time and ledger state; the reads show the
    decisions differed. A factorization and a power-method PCA."""
    kw = {**PRIVACY, "cache": "auto", "ledger": tmp_path / "l.json"}
    runs, printed = [], []
    for limit in (None, 1024):
        if limit is not None:
            for module in (source_module, pca_module):
                monkeypatch.setattr(module, "worker_memory_limits",
                                    lambda client, kb=limit: [kb, kb])  # fmt: skip
        group, marks = store()
        shown = io.StringIO()
        f = factorize(group, RANK, algorithm="two-pass", seed=3, progress=shown, **kw)
        n_f = _reads(marks)
        group, marks = store()
        p = pca(group, RANK, method="power", iterations=T, clip_radius=0.5,
                progress=shown, **kw)  # fmt: skip
        runs.append((f, n_f, p, _reads(marks)))
        printed.append(shown.getvalue())
    (f_held, n_held, p_held, m_held), (f_read, n_read, p_read, m_read) = runs
    assert printed[0] == printed[1]  # the progress, untimed, too
    assert "[####" in printed[0]
    assert n_read == 2 * n_held > 0  # not held: read by both passes
    assert m_read == (1 + T) * m_held > 0
    np.testing.assert_array_equal(f_held.S, f_read.S)
    np.testing.assert_array_equal(p_held.components, p_read.components)
    skip = {"release_id", "created", "ledger"}
    for held, read in ((f_held, f_read), (p_held, p_read)):
        assert {k: v for k, v in held.report.items() if k not in skip} == {
            k: v for k, v in read.report.items() if k not in skip
        }


@pytest.mark.timeout(180)
def test_a_csr_store_is_read_once_by_the_power_method(
    client: Client, cluster: LocalCluster, store: Any
) -> None:
    runs = {}
    for mode in ("never", "auto"):
        group, marks = store()
        r = pca(group, RANK, method="power", iterations=T, clip_radius=0.5, cache=mode,
                **PRIVACY)  # fmt: skip
        runs[mode] = (r, _reads(marks))
        assert r.report["n_passes"] == 1 + T
        assert _nothing_left(cluster.scheduler_address) == []
    (never, n_never), (auto, n_auto) = runs["never"], runs["auto"]
    assert n_auto > 0
    assert n_never == (1 + T) * n_auto
    assert auto.report["cluster"]["cache"]["used"] is None
    assert auto.report["cluster"]["n_graph_tasks"] is None
    np.testing.assert_array_equal(auto.components, never.components)
    np.testing.assert_array_equal(auto.eigenvalues, never.eigenvalues)


@pytest.mark.timeout(180)
def test_prepared_bands_serve_only_passes_that_prepare_them_alike(
    client: Client, store: Any, global_seed: int
) -> None:
    """A sparse input's bands are held already clipped for the first pass's
    request: a later pass that clips alike reads nothing and gets the bits of
    a source that holds nothing; a pass that clips otherwise reads its bands
    again (negative control: the held bands, clipped at 0.3, would shrink the
    rows whose norms lie between 0.3 and 1)."""
    from pipeline.execution.source import DaskSource
    from pipeline.io.inputs import open_input
    from pipeline.params import ClipSpec, PrivacyUnit
    from pipeline.sketches.apply import PassRequest
    from pipeline.sketches.dense import DenseOperator

    V = np.linalg.qr(np.random.default_rng(global_seed).standard_normal((N, 4)))[0]

    def request(c: float) -> PassRequest:
        return PassRequest(
            transpose=False, clip=ClipSpec(clip_norm=c, unit=PrivacyUnit.ROW),
            compute_dtype=np.float64, right=(("Y", DenseOperator(V)),),
        )  # fmt: skip

    def run(source: DaskSource, c: float) -> np.ndarray:
        return np.asarray(source.sketch(request(c))["Y"])

    group, marks = store()
    A, info = open_input(group, unit=None)
    held = DaskSource(A, client, reader=info.reader, cache="auto")
    try:
        first = run(held, 0.3)
        assert _reads(marks) > 0
        again = run(held, 0.3)
        assert _reads(marks) == 0  # served by the prepared bands
        other = run(held, 1.0)
        assert _reads(marks) > 0  # clipped otherwise: read again
    finally:
        held.close()
    group, _ = store()
    A, info = open_input(group, unit=None)
    plain = DaskSource(A, client, reader=info.reader, cache="never")
    try:
        want = {c: run(plain, c) for c in (0.3, 1.0)}
    finally:
        plain.close()
    assert first.tobytes() == again.tobytes() == want[0.3].tobytes()
    assert other.tobytes() == want[1.0].tobytes()
    assert not np.allclose(want[0.3], want[1.0])  # the clippings differ here
