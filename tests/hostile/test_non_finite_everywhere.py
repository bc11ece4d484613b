"""One rule for non-finite values at every entry point (docs/privacy.md, "Non-finite values").

The rule: an individual whose data holds NaN, +Inf or -Inf counts as an individual
whose data is zero -- a zero row (a zero column or cell under ``unit="column"`` /
``"entry"``; for a stream, an entity's updates of that batch), silently, before
clipping. A huge *finite* value (1e308) is clipped like any other value, along its
row's direction, never zeroed or overflowed to Inf.

Each entry point -- ``factorize`` (every unit), ``pca`` (plain and centred), the two
estimators' ``fit``, a stream batch, and ``dplr factorize`` / ``pca`` / ``stream
ingest`` as subprocesses -- runs once on data holding the value and once on the
reference: the same data with the affected individual zeroed (non-finite) or
rescaled by a public factor to a finite norm far above the clip norm (1e308, same
direction). Seeded noise and a fixed sketch seed make the two runs the same
computation, so:

* for NaN and ±Inf the zeroed input reaches the sketches as the very bytes of the
  reference: the releases are equal bit for bit;
* for 1e308 the row takes the overflow-safe clipping path while the reference takes
  the plain one: both give ``C x / ||x||`` up to a few ulps per entry of one row, so
  the releases agree to ``1e-9`` (the tolerance of tests/hostile for the same paths:
  ulp-level changes of one row amplified by the QR / eigen-solve conditioning of
  these 40 x 12 matrices, measured below 1e-12).

Negative control: the reference rows are not what the release would be without the
rule (a zero row is a different matrix from the clipped 1e308 row, and from the
unmodified row): ``test_the_reference_is_not_the_input`` checks that each reference
changes the release.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hostile_util import run_dplr

from pipeline.accounting.ledger import Ledger
from pipeline.api import factorize, pca
from pipeline.estimators import DPPCA, DPLowRank
from pipeline.io.batches import write_batch
from pipeline.io.release import read_release
from pipeline.jobs.stream import stream_ingest, stream_init, stream_release

M, N, RANK = 40, 12, 2
C = 1.0
SEED, NOISE = 20250601, 17
PRIV: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": NOISE}
VALUES = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf, "1e308": 1e308}
ROW, COL = 7, 3
#: the reference of a 1e308 entry: the same direction at a finite norm far above C
HUGE_TO_FINITE = 1e-302
#: ulp-level changes of one clipped row, amplified by the solves (see the module doc)
HUGE_ATOL = 1e-9


def _matrix(seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, N)) / np.sqrt(N) * rng.uniform(0.5, 2.0, (M, 1))


def _planted(value: float, unit: str = "row") -> tuple[np.ndarray, np.ndarray]:
    """``(A with value at (ROW, COL), the reference)`` for the individual of ``unit``."""
    A = _matrix()
    ref = A.copy()
    A[ROW, COL] = value
    if np.isfinite(value):
        ref[ROW, COL] = value
        if unit == "row":
            ref[ROW] *= HUGE_TO_FINITE
        elif unit == "column":
            ref[:, COL] *= HUGE_TO_FINITE
        else:
            ref[ROW, COL] = 1e6 * C  # a cell is clipped to +-C
    elif unit == "row":
        ref[ROW] = 0.0
    elif unit == "column":
        ref[:, COL] = 0.0
    else:
        ref[ROW, COL] = 0.0
    return A, ref


def _same(a: np.ndarray, b: np.ndarray, value: float) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert np.isfinite(a).all()
    if np.isfinite(value):
        np.testing.assert_allclose(a, b, rtol=0, atol=HUGE_ATOL)
    else:
        np.testing.assert_array_equal(a, b)


Run = Callable[[np.ndarray, Path], list[np.ndarray]]


def _factorize(unit: str) -> Run:
    def run(A: np.ndarray, ledger: Path) -> list[np.ndarray]:
        f = factorize(A, RANK, unit=unit, clip_norm=C, seed=SEED, ledger=ledger, **PRIV)
        return [f.U, f.S, f.V]

    return run


def _pca(A: np.ndarray, ledger: Path) -> list[np.ndarray]:
    r = pca(
        A, RANK, row_norm_bound=C, method="power", iterations=2, clip_radius=0.5,
        ledger=ledger, **PRIV,
    )
    return [r.components, r.eigenvalues]


def _dppca(centre: bool) -> Run:
    def run(A: np.ndarray, ledger: Path) -> list[np.ndarray]:
        est = DPPCA(
            RANK, centre=centre, ledger=ledger, random_state=NOISE, insecure_noise=True
        ).fit(A)
        return [est.components_]

    return run


def _dplowrank(A: np.ndarray, ledger: Path) -> list[np.ndarray]:
    est = DPLowRank(
        RANK, clip_norm=C, ledger=ledger, random_state=NOISE, insecure_noise=True
    ).fit(A)
    return [est.components_, est.S_]


def _ledger(tmp_path: Path, unit: str) -> Path:
    """A ledger of the entry point's unit, with room for both runs."""
    path = tmp_path / "ledger.json"
    Ledger.create(path, dataset="non-finite", epsilon=100.0, delta=1e-3, unit=unit)
    return path


ENTRY_POINTS: dict[str, tuple[Run, str]] = {
    "factorize-row": (_factorize("row"), "row"),
    "factorize-column": (_factorize("column"), "column"),
    "factorize-entry": (_factorize("entry"), "entry"),
    "pca": (_pca, "row"),
    "DPPCA.fit": (_dppca(False), "row"),
    "DPPCA.fit-centred": (_dppca(True), "row"),
    "DPLowRank.fit": (_dplowrank, "row"),
}


@pytest.mark.parametrize("value", list(VALUES.values()), ids=list(VALUES))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_python_entry_points(tmp_path: Path, entry: str, value: float) -> None:
    run, unit = ENTRY_POINTS[entry]
    A, ref = _planted(value, unit)
    ledger = _ledger(tmp_path, unit)
    for got, want in zip(run(A, ledger), run(ref, ledger), strict=True):
        _same(got, want, value)


@pytest.mark.parametrize("entry", ["factorize-row", "pca", "factorize-entry"])
def test_the_reference_is_not_the_input(tmp_path: Path, entry: str) -> None:
    """Negative control: zeroing the individual changes the release (so equality
    above is the rule at work, not an individual the release ignores)."""
    run, unit = ENTRY_POINTS[entry]
    ledger = _ledger(tmp_path, unit)
    _, ref = _planted(np.nan, unit)
    assert not np.array_equal(run(_matrix(), ledger)[0], run(ref, ledger)[0])


# -- streams -----------------------------------------------------------------------
STREAM_SHAPE = (30, 8)
BAD_ENTITY = 4


def _stream_cols(value: float | None) -> dict[str, np.ndarray]:
    """Entities 0..9 (unit general), each a few updates; entity 4's include ``value``
    (None: the reference -- its updates zeroed, or rescaled for a finite value)."""
    rng = np.random.default_rng(9)
    n = 40
    entity = np.repeat(np.arange(10), n // 10)
    i = rng.integers(0, STREAM_SHAPE[0], n)
    j = rng.integers(0, STREAM_SHAPE[1], n)
    s = rng.normal(size=n) * 0.3
    mine = np.flatnonzero(entity == BAD_ENTITY)
    return {"entity": entity, "i": i, "j": j, "s": s, "mine": mine}


def _stream_batch(path: Path, value: float, reference: bool) -> Path:
    cols = _stream_cols(value)
    mine = cols.pop("mine")
    s = cols["s"]
    s[mine[1]] = value
    if reference:
        s[mine] = s[mine] * HUGE_TO_FINITE if np.isfinite(value) else 0.0
    write_batch(path, cols)
    return path


def _new_stream(state: Path) -> Path:
    stream_init(
        state, n_rows=STREAM_SHAPE[0], n_cols=STREAM_SHAPE[1], rank=RANK, horizon=2,
        epsilon=1.0, delta=1e-6, unit="general", clip_norm=C, seed=SEED,
        insecure_noise_seed=NOISE, ledger=state.with_suffix(".ledger.json"), budget=(1.0, 1e-6),
    )
    return state


def _stream_release(state: Path, out: Path) -> list[np.ndarray]:
    f, _ = stream_release(state, epoch=1, out=out)
    return [f.U, f.S, f.V]


@pytest.mark.parametrize("value", list(VALUES.values()), ids=list(VALUES))
def test_stream_batches(tmp_path: Path, value: float) -> None:
    got = []
    for k, reference in enumerate((False, True)):
        state = _new_stream(tmp_path / f"s{k}.stream")
        batch = _stream_batch(tmp_path / f"b{k}.npz", value, reference)
        stream_ingest(state, batch, epoch=1)
        got.append(_stream_release(state, tmp_path / f"r{k}.zarr"))
    for a, b in zip(*got, strict=True):
        _same(a, b, value)


# -- the CLI: one store per verb, every value in a row (or entity) of its own --------
CLI_ROWS = {"nan": 3, "+inf": 11, "-inf": 19, "1e308": 27}


def _cli_matrices() -> tuple[np.ndarray, np.ndarray]:
    A = _matrix(8)
    ref = A.copy()
    for name, row in CLI_ROWS.items():
        A[row, row % N] = VALUES[name]
        if name == "1e308":
            ref[row, row % N] = 1e308
            ref[row] *= HUGE_TO_FINITE
        else:
            ref[row] = 0.0
    return A, ref


def _store(path: Path, A: np.ndarray) -> Path:
    # 10 x 6 chunks: rows span two column chunks, so row norms come from the
    # pre-pass over column chunks, and a band joins several row chunks
    z = zarr.create_array(store=path, shape=A.shape, chunks=(10, 6), dtype=A.dtype)
    z[...] = A
    return path


CLI_VERBS = {
    "factorize": ("--rank", "2", "--seed", str(SEED)),
    "pca": ("--rank", "2", "--iterations", "2", "--clip-radius", "0.5"),
}


@pytest.mark.cli
@pytest.mark.usefixtures("cli_cluster")
@pytest.mark.parametrize("verb", list(CLI_VERBS))
def test_cli_store_with_every_value(tmp_path: Path, verb: str) -> None:
    A, ref = _cli_matrices()
    ledger = _ledger(tmp_path, "row")
    outs = []
    for k, matrix in enumerate((A, ref)):
        out = tmp_path / f"out{k}.zarr"
        proc = run_dplr(
            verb, _store(tmp_path / f"in{k}.zarr", matrix), *CLI_VERBS[verb],
            "--epsilon", "1", "--delta", "1e-6", "--insecure-noise-seed", str(NOISE),
            "--ledger", ledger, "--out", out, "--quiet",
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    if verb == "factorize":
        a, b = (read_release(o) for o in outs)
        pairs = [(a.U, b.U), (a.S, b.S), (a.V, b.V)]
    else:
        a, b = (zarr.open_group(o, mode="r") for o in outs)
        pairs = [(a["components"][...], b["components"][...])]
    for x, y in pairs:
        # one store holds the 1e308 row as well: the tolerance of that value
        _same(x, y, 1e308)


@pytest.mark.cli
def test_cli_stream_ingest_every_value(tmp_path: Path) -> None:
    """``dplr stream ingest`` of one batch holding every value (one entity each)."""
    got = []
    for k, reference in enumerate((False, True)):
        cols = _stream_cols(0.0)
        cols.pop("mine")
        for e, value in zip((1, 4, 6, 8), VALUES.values(), strict=True):
            mine = np.flatnonzero(cols["entity"] == e)
            cols["s"][mine[1]] = value
            if reference:
                cols["s"][mine] = cols["s"][mine] * HUGE_TO_FINITE if np.isfinite(value) else 0.0
        write_batch(tmp_path / f"b{k}.npz", cols)
        state = _new_stream(tmp_path / f"s{k}.stream")
        proc = run_dplr("stream", "ingest", state, tmp_path / f"b{k}.npz", "--epoch", 1)
        assert proc.returncode == 0, proc.stderr
        got.append(_stream_release(state, tmp_path / f"r{k}.zarr"))
    for a, b in zip(*got, strict=True):
        _same(a, b, 1e308)
