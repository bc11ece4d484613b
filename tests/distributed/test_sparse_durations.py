"""A sparse input's release publishes no durations (docs/privacy.md, "Times").

A pass over a dense input covers a public shape; a pass over a sparse one does
work that grows with its stored entries, a count of the data. So a release of a
sparse input (a CSR store, a scipy.sparse matrix, a dask array of sparse chunks)
states no ``timings_seconds`` in its report or stored report, and its progress
bars are untimed: the empty bar when a pass starts, the full bar when it ends,
no elapsed time and no redraw in between (the number of redraws of a timed bar
grows with the pass's duration). The negative controls are the same matrix
stored dense, whose reports and bars keep their times.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from dist_util import write_matrix
from distributed import Client

from pipeline.api import factorize, pca
from pipeline.execution.progress import PassProgressBar
from pipeline.io import read_group
from pipeline.io.csr import write_csr

pytestmark = pytest.mark.distributed

M, N, RANK = 240, 30, 3
PRIVACY = {"epsilon": 1.0, "delta": 1e-6, "budget": (100.0, 1e-3)}
#: dask's format_time as the timed bar ends with it: "| 1.23s", "| 12.3 ms"
TIME = re.compile(r"\|\s*\d+(\.\d+)?\s*(s|ms|us|hr|m)\s*$")


def _matrix(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = rng.random((M, N)) < 0.2
    return np.where(mask, rng.standard_normal((M, N)), 0.0)


def _bars(text: str) -> list[str]:
    """Every state a bar drew (each ``\\r`` starts one), in order."""
    return [
        s.strip() for line in text.splitlines() for s in line.split("\r") if "[" in s
    ]


def _assert_untimed(text: str) -> None:
    bars = _bars(text)
    assert bars, "no progress bar was drawn"
    assert not [b for b in bars if TIME.search(b)], bars
    # each pass: its empty bar, then its full bar, nothing between
    assert len(bars) % 2 == 0, bars
    for start, end in zip(bars[0::2], bars[1::2], strict=True):
        assert "#" not in start, start
        assert " 0% |" in start, start
        assert " " not in end.split("]")[0], end
        assert "100% |" in end, end
        assert start.split("|", 1)[1] == end.split("|", 1)[1]  # the same pass


def _run(
    kind: str, source: Any, out: Path
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """One release of ``source`` to ``out``: its report, stored report, progress."""
    stream = io.StringIO()
    if kind == "factorize":
        rel = factorize(source, RANK, **PRIVACY, seed=1, out=out, progress=stream)
    else:
        rel = pca(source, RANK, **PRIVACY, method="power", iterations=2, clip_radius=0.5,
                  out=out, progress=stream)  # fmt: skip
    _, stored = read_group(out, ())
    return rel.report, stored, stream.getvalue()


def _shown_timings(release: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The timings line of ``dplr show RELEASE``."""
    from pipeline.cli import main

    capsys.readouterr()
    assert main(["show", str(release)]) == 0
    return next(ln for ln in capsys.readouterr().out.splitlines() if "timings" in ln)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["factorize", "pca"])
def test_a_csr_store_publishes_no_durations(
    client: Client,
    tmp_path: Path,
    global_seed: int,
    kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    A = _matrix(global_seed)
    sparse = tmp_path / "sparse.zarr"
    write_csr(sparse, sp.csr_matrix(A))
    report, stored, progress = _run(kind, str(sparse), tmp_path / "s.zarr")
    assert report["timings_seconds"] == {}
    assert stored["timings_seconds"] == {}
    _assert_untimed(progress)
    assert "withheld" in _shown_timings(tmp_path / "s.zarr", capsys)
    # negative control: the same matrix stored dense keeps its durations
    dense = write_matrix(tmp_path / "dense.zarr", A, (60, N))
    report, stored, progress = _run(kind, dense, tmp_path / "d.zarr")
    assert report["timings_seconds"]["total"] > 0
    assert stored["timings_seconds"]
    assert [b for b in _bars(progress) if TIME.search(b)]
    assert re.search(r"pass \d+\.\d\d s", _shown_timings(tmp_path / "d.zarr", capsys))


@pytest.mark.timeout(240)
def test_in_memory_and_dask_sparse_inputs_publish_no_durations(
    client: Client, global_seed: int
) -> None:
    A = _matrix(global_seed)
    forms = {
        "csr": sp.csr_matrix(A),
        "coo array": sp.coo_array(A),
        "dask of csr chunks": da.from_array(A, chunks=(80, N)).map_blocks(
            sp.csr_matrix
        ),
    }
    for name, source in forms.items():
        rel = factorize(source, RANK, **PRIVACY, seed=1)
        assert rel.report["timings_seconds"] == {}, name
    rel = factorize(A, RANK, **PRIVACY, seed=1)  # negative control: dense
    assert rel.report["timings_seconds"]["total"] > 0


def test_an_untimed_bar_draws_the_same_text_however_long_its_pass() -> None:
    """Updates stand in for time: a longer pass gets more of them."""

    def drawn(updates: list[int], *, timed: bool) -> str:
        stream = io.StringIO()
        bar = PassProgressBar([], label="pass", stream=stream, timed=timed, start=False)
        for remaining in updates:
            bar._draw_bar(remaining=remaining, all=8)
        bar._draw_stop(status="finished", remaining=0, all=8)
        return stream.getvalue()

    short, long = [8, 0], [8, 7, 7, 5, 3, 3, 1, 0]
    assert drawn(short, timed=False) == drawn(long, timed=False)
    _assert_untimed(drawn(long, timed=False))
    # negative control: the timed bar's text grows with the pass
    assert drawn(short, timed=True) != drawn(long, timed=True)
