"""End-to-end runs of ``dplr pca`` (style B.6 exit codes, B.10 CLI tests).

The input is the committed sample ``data/pca_sample.zarr`` (2048 x 16 float32,
chunks (512, 8): the columns are split, rows are joined into full-width bands),
copied per module so that no ledger or journal is ever written beside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cli_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    run_dplr,
)

from pipeline.accounting.ledger import Ledger
from pipeline.io import default_journal_path, read_group

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "pca_sample.zarr"
ROWS, COLS, RANK, T = 2048, 16, 2, 3
# about 2 sqrt(k log(n) / n), the public guess for incoherent rows (pipeline.api.pca)
RADIUS = "0.17"
POWER = ("--rank", str(RANK), "--iterations", str(T), "--clip-radius", RADIUS)
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
BUDGET = ("--budget-epsilon", "10", "--budget-delta", "1e-4")
# Householder QR is backward stable: ||Q^T Q - I||_2 <= c d u [Higham, Accuracy and
# Stability of Numerical Algorithms, Thm 19.4], about 16 * 1.1e-16 here.
ORTHONORMAL_ATOL = 1e-12


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sample") / "pca_sample.zarr"
    shutil.copytree(SAMPLE, path)
    z = zarr.open_array(store=path, mode="r")
    assert z.shape == (ROWS, COLS)
    assert z.chunks == (512, 8)
    return path


@pytest.fixture
def scheduler(shared_scheduler: str) -> str:
    """The session's cluster (tests/conftest.py), for runs that name it with
    ``--scheduler``; the embedded one is tested once."""
    return shared_scheduler


def _sample_values(store: Path) -> tuple[np.ndarray, dict[str, Any]]:
    z = zarr.open_array(store=store, mode="r")
    return np.asarray(z[...], dtype=np.float64), dict(z.attrs["dplr_synthetic"])


def _strip_timings(text: str) -> str:
    return re.sub(r"\d+(?:\.\d+)?\s?(?:ms|us|s)\b", "", text)


def _assert_no_data_value(text: str, store: Path, eigenvalues: np.ndarray) -> None:
    """No data entry, no norm of the data, no true or released eigenvalue in ``text``."""
    A, truth = _sample_values(store)
    s = np.array(truth["singular_values"])
    norms = [np.linalg.norm(A), np.linalg.norm(A, axis=1).max(), truth["max_row_norm"]]
    numbers = [*np.ravel(eigenvalues), *s, *s**2, *norms]
    forbidden = {
        form.format(float(v))
        for v in numbers
        for form in ("{!r}", "{:.6g}", "{:.4g}", "{:.2f}")
    }
    forbidden |= {repr(float(x)) for x in A.ravel()}
    printed = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", _strip_timings(text))
    assert [v for v in printed if v in forbidden] == []


def _group_files(path: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(path)), p.read_bytes())
        for p in path.rglob("*")
        if p.is_file()
    )


@pytest.mark.timeout(180)
def test_pca_publishes_a_private_release(store: Path, tmp_path: Path) -> None:
    """The default path: no --scheduler, so the embedded LocalCluster runs it."""
    out, ledger = tmp_path / "pca.zarr", tmp_path / "ledger.json"
    proc = run_dplr(
        "pca",
        store,
        *POWER,
        *PRIVACY,
        *BUDGET,
        "--out",
        out,
        "--ledger",
        ledger,
        embedded=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"released rank-{RANK} PCA subspace (power) to {out}" in proc.stdout
    assert "[####" in proc.stderr
    assert "100%" in proc.stderr

    arrays, rep = read_group(out, ("components", "eigenvalues"))
    X, lam = arrays["components"], arrays["eigenvalues"]
    assert X.shape == (COLS, RANK)
    assert X.dtype == np.float64
    np.testing.assert_allclose(X.T @ X, np.eye(RANK), rtol=0, atol=ORTHONORMAL_ATOL)
    assert lam.shape == (RANK + 1,)
    assert np.all(np.diff(lam) <= 0)  # top eigenvalues of the released M, descending

    assert rep["format"] == "dplr-pca-release/1"
    assert rep["private"] is True
    assert rep["insecure_noise_seed"] is False
    assert rep["algorithm"] == "pca-power"
    assert (rep["rank"], rep["shape"]) == (RANK, [ROWS, COLS])
    assert (rep["epsilon"], rep["delta"]) == (1.0, 1e-6)
    # the GDP calibration solves delta_mu(epsilon) = delta exactly [BW18, Thm 8]: the
    # noise spends the budget up to the root finder's tolerance, and never more
    assert rep["realised_epsilon"] <= 1.0 + 1e-9
    assert rep["realised_epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert rep["n_passes"] == rep["n_passes_planned"] == 1 + T
    assert rep["releases"] == ["M", *(f"{x}{t}" for t in range(T) for x in "HZ")]
    assert rep["resumed_releases"] == []
    assert rep["cluster"]["kind"] == "local"
    assert rep["input"]["store_chunks"] == [512, 8]
    mech = {m["label"]: m for m in rep["mechanisms"]}
    assert list(mech) == ["M", "H", "Z"]
    assert mech["M"]["shape"] == [COLS, COLS]
    assert mech["H"]["shape"] == [RANK, RANK]
    assert mech["Z"]["shape"] == [COLS, RANK]
    assert [m["count"] for m in mech.values()] == [1, T, T]
    for m in mech.values():
        assert m["sensitivity"] > 0
        assert m["sigma"] > 0
    # Z = sum_i a_i Clip_R(...) has sensitivity R under add/remove, the default
    # relation (2R under replacement, spec 3.1); M and H have 1
    assert rep["parameters"]["neighboring"] == "add-remove"
    assert mech["Z"]["sensitivity"] == pytest.approx(
        rep["parameters"]["clip_radius"], rel=1e-12
    )
    assert mech["M"]["sensitivity"] == mech["H"]["sensitivity"] == 1.0
    assert {"dplr", "numpy", "scipy", "dask", "distributed", "zarr"} <= set(
        rep["versions"]
    )

    book = json.loads(ledger.read_text())
    assert [r["release_id"] for r in book["releases"]] == [rep["release_id"]]
    assert book["releases"][0]["algorithm"] == "pca-power"
    assert rep["ledger"]["n_releases"] == 1
    assert not Path(default_journal_path(out)).exists()
    # the summary and the bars: public parameters, counts and times only
    _assert_no_data_value(proc.stdout + proc.stderr, store, lam)


@pytest.mark.timeout(120)
def test_json_prints_the_report(store: Path, tmp_path: Path, scheduler: str) -> None:
    out, ledger = tmp_path / "ag.zarr", tmp_path / "ledger.json"
    proc = run_dplr(
        "pca", store, "--rank", RANK, "--method", "analyze-gauss", *PRIVACY,
        *BUDGET, "--out", out, "--ledger", ledger, "--scheduler", scheduler,
        "--json", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)  # nothing but the report on stdout
    _, stored = read_group(out, ("components",))
    assert printed == stored
    assert printed["n_passes"] == 1
    assert printed["releases"] == ["M"]
    assert [m["label"] for m in printed["mechanisms"]] == ["M"]
    assert printed["cluster"]["kind"] == "scheduler"


def _corrupt_chunks(path: Path) -> None:
    """Garbage in every chunk: any read of the data fails to decode."""
    for chunk in (path / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(b"\xff" * chunk.stat().st_size)


@pytest.mark.timeout(120)
def test_over_budget_is_refused_before_any_read(
    store: Path, tmp_path: Path, scheduler: str
) -> None:
    """Exit 3 on a store whose chunks cannot be decoded: the data was never read.

    The positive control shows that the same store fails as soon as it is read.
    """
    corrupt = tmp_path / "corrupt.zarr"
    shutil.copytree(store, corrupt)
    _corrupt_chunks(corrupt)
    ledger, out = tmp_path / "ledger.json", tmp_path / "pca.zarr"
    Ledger.create(ledger, dataset="pca_sample", epsilon=0.5, delta=1e-6)
    before = file_state(ledger)

    proc = run_dplr(
        "pca", corrupt, *POWER, *PRIVACY, "--out", out, "--ledger", ledger,
        "--scheduler", scheduler,
    )  # fmt: skip
    line = assert_one_line_error(proc, 3, "dplr: refused: ")
    assert "exceed" in line
    assert "budget" in line
    assert not os.path.lexists(out)
    # no temporary group either (and no journal: test_over_budget_leaves_no_journal)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.tmp-")]
    assert file_state(ledger) == before

    # positive control: within budget, the run reads the store and fails there
    roomy = tmp_path / "roomy.json"
    control = run_dplr(
        "pca", corrupt, *POWER, *PRIVACY, "--out", tmp_path / "control.zarr",
        "--ledger", roomy, *BUDGET, "--scheduler", scheduler, "--quiet",
    )  # fmt: skip
    # a chunk that cannot be decoded is a clear error naming its rows (exit 2)
    line = assert_one_line_error(control, 2, "dplr: error: ")
    assert "cannot be read at rows" in line
    assert "truncated or corrupted" in line
    assert not (tmp_path / "control.zarr").exists()


@pytest.mark.timeout(60)
def test_over_budget_leaves_no_journal(store: Path, tmp_path: Path) -> None:
    ledger, out = tmp_path / "ledger.json", tmp_path / "pca.zarr"
    Ledger.create(ledger, dataset="pca_sample", epsilon=0.5, delta=1e-6)
    listing = sorted(p.name for p in tmp_path.iterdir())
    proc = run_dplr("pca", store, *POWER, *PRIVACY, "--out", out, "--ledger", ledger)
    assert_one_line_error(proc, 3, "dplr: refused: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


# ---------------------------------------------------------------------------
# bad input: exit 2, one line naming the problem, nothing written or charged
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    grp = zarr.open_group(store=d / "group.zarr", mode="w", zarr_format=3)
    grp.create_array("matrix", shape=(ROWS, COLS), chunks=(512, 8), dtype="float64")
    vec = zarr.create_array(store=d / "vector.zarr", shape=(ROWS,), dtype="float64")
    vec[...] = 0.5
    flags = zarr.create_array(store=d / "bool.zarr", shape=(64, 4), dtype="bool")
    flags[...] = True
    with warnings.catch_warnings():
        # zarr may flag variable-length strings as not yet in the v3 spec; irrelevant here
        warnings.simplefilter("ignore")
        text = zarr.create_array(store=d / "strings.zarr", shape=(4, 3), dtype=str)
        text[...] = np.array([["a", "b", "c"]] * 4)
    return {
        "good": store,
        "group": d / "group.zarr",
        "1-D": d / "vector.zarr",
        "bool": d / "bool.zarr",
        "string": d / "strings.zarr",
    }


@dataclass(frozen=True)
class Case:
    input: str
    phrase: str
    # flags replacing the defaults (None drops the flag), then extra arguments
    set: dict[str, str | None] = field(default_factory=dict)
    extra: tuple[str, ...] = ()
    out: str = "out"  # "out": a fresh path, "existing": a prior release, "input"


DEFAULTS: dict[str, str | None] = {
    "--rank": str(RANK),
    "--iterations": str(T),
    "--clip-radius": RADIUS,
    "--epsilon": "1",
    "--delta": "1e-6",
}

CASES = {
    "rank > d": Case("good", "rank must be in [1, n_features] = [1, 16], got rank=17", {"--rank": "17"}),
    "power without --iterations": Case(
        "good", "iterations must be given for --method power", {"--iterations": None},
        ("--method", "power"),
    ),
    "power without --clip-radius": Case(
        "good", "--clip-radius must be given for --method power", {"--clip-radius": None},
        ("--method", "power"),
    ),
    "--iterations with analyze-gauss": Case(
        "good",
        "iterations applies to --method power only, got iterations=3",
        {"--clip-radius": None},
        ("--method", "analyze-gauss"),
    ),
    "negative epsilon": Case(
        "good", "epsilon must be in (0, inf), got epsilon=-1.0", {"--epsilon": "-1"}
    ),
    "delta = 1": Case(
        "good", "delta must be in (0, 1), got delta=1.0", {"--delta": "1"}
    ),
    "zarr group": Case("group", "is a Zarr group, not an array"),
    "1-D array": Case("1-D", "must be a 2-D matrix, got 1-D"),
    "bool dtype": Case("bool", "must hold real numbers (int or float), got dtype bool"),
    "string dtype": Case("string", "must hold real numbers (int or float), got dtype"),
    "existing OUT": Case("good", "already exists; pass --overwrite", out="existing"),
    "OUT = INPUT": Case("good", "is the input store; choose another path", out="input"),
    # [P]'s classical Gaussian mechanism needs eps_init = epsilon / 2 <= 1 (spec 2.3)
    "paper accounting, epsilon 4": Case(
        "good",
        "--accounting paper requires eps_init = epsilon/2 <= 1",
        {"--epsilon": "4"},
        ("--accounting", "paper"),
    ),
}


def _args(case: Case) -> list[str]:
    flags = {**DEFAULTS, **case.set}
    return [f"{k}={v}" for k, v in flags.items() if v is not None] + list(case.extra)


@dataclass
class BadRun:
    dir: Path
    out: Path
    ledger_before: bytes | None
    out_before: list[tuple[str, bytes]] | None
    listing: list[str]
    proc: subprocess.CompletedProcess[str] | None = None


def _prepare(case: Case, d: Path, inputs: dict[str, Path]) -> BadRun:
    ledger = d / "ledger.json"
    Ledger.create(ledger, dataset="d", epsilon=10.0, delta=1e-4)
    out = inputs[case.input] if case.out == "input" else d / "pca.zarr"
    if case.out == "existing":
        out.mkdir()
        (out / "keep.txt").write_text("an earlier release\n")
    return BadRun(
        dir=d,
        out=out,
        ledger_before=file_state(ledger),
        out_before=_group_files(out) if out.exists() else None,
        listing=sorted(p.name for p in d.iterdir()),
    )


@pytest.fixture(scope="module")
def bad_runs(
    inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, BadRun]:
    """Every case in its own directory, run concurrently: each run is an
    interpreter start-up plus metadata checks, so they mostly import."""
    runs = {
        name: _prepare(case, tmp_path_factory.mktemp("bad"), inputs)
        for name, case in CASES.items()
    }

    def run(name: str) -> subprocess.CompletedProcess[str]:
        case, r = CASES[name], runs[name]
        return run_dplr(
            "pca", inputs[case.input], *_args(case), "--out", r.out,
            "--ledger", r.dir / "ledger.json", "--quiet", timeout=120,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=4) as pool:
        for name, proc in zip(runs, pool.map(run, list(runs)), strict=True):
            runs[name].proc = proc
    return runs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_and_writes_nothing(
    name: str, bad_runs: dict[str, BadRun]
) -> None:
    r = bad_runs[name]
    assert r.proc is not None
    line = assert_one_line_error(r.proc, 2, "dplr: error: ")
    assert CASES[name].phrase in line
    # the ledger is byte-identical, no file appeared, no journal beside OUT
    assert file_state(r.dir / "ledger.json") == r.ledger_before
    assert sorted(p.name for p in r.dir.iterdir()) == r.listing
    assert not Path(default_journal_path(r.out)).exists()
    if r.out_before is None:
        assert_nothing_at(r.out)
    else:  # the existing group (or the input store) is untouched
        assert _group_files(r.out) == r.out_before


@pytest.mark.timeout(120)
def test_non_private_with_epsilon_is_refused(
    store: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "pca.zarr"
    proc = run_dplr(
        "pca", store, "--rank", RANK, "--iterations", T, "--non-private",
        "--epsilon", "1", "--out", out, "--scheduler", scheduler, "--quiet",
    )  # fmt: skip
    line = assert_one_line_error(proc, 2, "dplr: error: ")
    assert "a non-private run takes no epsilon or delta" in line
    assert_nothing_at(out)


# ---------------------------------------------------------------------------
# non-finite rows: zeroed silently (spec 1.4, rule 2), never an error
# ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_nan_row_counts_as_a_zero_row(
    store: Path, tmp_path: Path, scheduler: str
) -> None:
    A = np.asarray(zarr.open_array(store=store, mode="r")[...])
    bad, zero = A.copy(), A.copy()
    bad[700, 3] = np.nan  # row band 1 of the (512, 8) store chunks
    bad[1500, 11] = np.inf
    zero[[700, 1500]] = 0.0
    releases = {}
    for name, data in (("bad", bad), ("zero", zero)):
        path = tmp_path / f"{name}.zarr"
        z = zarr.create_array(
            store=path, shape=data.shape, chunks=(512, 8), dtype=data.dtype
        )
        z[...] = data
        out = tmp_path / f"{name}-pca.zarr"
        proc = run_dplr(
            "pca", path, *POWER, *PRIVACY, *BUDGET, "--out", out,
            "--ledger", tmp_path / f"{name}-ledger.json", "--insecure-noise-seed", "5",
            "--scheduler", scheduler,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        # silently: no word about non-finite values (their count would leak)
        text = (proc.stdout + proc.stderr).replace(str(tmp_path), "").lower()
        assert re.search(r"\bnan\b|\binf\b|non-finite", text) is None, text
        releases[name] = read_group(out, ("components", "eigenvalues"))[0]
    # the NaN/Inf rows were replaced by zero rows, bit for bit
    for key in ("components", "eigenvalues"):
        np.testing.assert_array_equal(releases["bad"][key], releases["zero"][key])
        assert np.isfinite(releases["bad"][key]).all()


@pytest.mark.timeout(180)
def test_the_default_command_needs_no_iterations_or_radius(
    store: Path, tmp_path: Path, scheduler: str
) -> None:
    """``dplr pca INPUT -k K --epsilon E --delta D --out OUT``: method auto picks from
    public quantities (here Analyze Gauss: n / d is below 8 eigenvalue floors)."""
    out = tmp_path / "auto.zarr"
    proc = run_dplr(
        "pca", store, "-k", str(RANK), *PRIVACY, "--out", out, "--json",
        "--ledger", tmp_path / "ledger.json", *BUDGET, "--scheduler", scheduler,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rep = read_group(out, ("components",))[1]
    assert rep["auto"]["chosen"] == rep["parameters"]["method"] == "analyze-gauss"
    assert rep["parameters"]["neighboring"] == "add-remove"
    assert rep["n_passes"] == 1
