"""End-to-end runs of the ``dplr`` command (style B.6 exit codes, B.10 CLI tests)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cli_util import (
    assert_nothing_at,
    assert_one_line_error,
    file_state,
    leading_json,
    run_dplr,
)

from pipeline.io import read_release
from pipeline.mechanisms.noise import NoiseCode, NoiseKey

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

ROWS, COLS, RANK = 2000, 60, 3
SKETCH_SEED = 987654321  # distinctive, so a leak into the report is findable
NOISE_SEED = 424242
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
BUDGET = ("--budget-epsilon", "10", "--budget-delta", "1e-5")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("generated") / "A.zarr"
    proc = run_dplr(
        "generate",
        path,
        "--rows",
        ROWS,
        "--cols",
        COLS,
        "--chunks",
        "500,-1",
        "--seed",
        3,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {ROWS} x {COLS} float32 matrix" in proc.stdout
    z = zarr.open_array(store=path, mode="r")
    assert z.shape == (ROWS, COLS)
    assert z.chunks == (500, COLS)
    assert z.dtype == np.float32
    return path


def _keys(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return [k for k, v in obj.items() for k in (k, *_keys(v))]
    if isinstance(obj, list):
        return [k for v in obj for k in _keys(v)]
    return []


def _assert_no_secret_or_data(
    text: str, store: Path, seeds: tuple[int, ...] = (SKETCH_SEED,)
) -> None:
    """Neither the seeds, nor a 256-bit key in hex, nor any data value, nor a true
    singular value (a non-private statistic) appears in ``text``."""
    for seed in seeds:
        assert str(seed) not in text
    assert re.search(r"[0-9a-fA-F]{64}", text) is None  # no hex-encoded 32-byte key
    z = zarr.open_array(store=store, mode="r")
    values = {repr(float(x)) for x in np.asarray(z[...]).ravel()}
    values |= {repr(float(s)) for s in z.attrs["dplr_synthetic"]["singular_values"]}
    found = [v for v in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text) if v in values]
    assert found == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args",
    [
        (),
        ("factorize",),
        ("generate",),
        ("demo",),
        ("budget",),
        ("budget", "init"),
        ("budget", "show"),
    ],
    ids=lambda a: " ".join(a) or "dplr",
)
def test_help_exits_0(args: tuple[str, ...]) -> None:
    proc = run_dplr(*args, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: dplr")
    assert proc.stderr == ""


@pytest.mark.timeout(180)
def test_generate_then_factorize_publishes_a_private_release(
    store: Path, tmp_path: Path
) -> None:
    out, ledger = tmp_path / "release.zarr", tmp_path / "A.ledger.json"
    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--ledger",
        ledger,
        "--seed",
        SKETCH_SEED,
        *PRIVACY,
        *BUDGET,
        embedded=True,  # the default cluster (kind "local" below)
    )
    assert proc.returncode == 0, proc.stderr
    assert f"released rank-{RANK} factorization to {out}" in proc.stdout
    assert "[####" in proc.stderr
    assert "100%" in proc.stderr

    rel = read_release(out)
    rep = rel.report
    assert rel.U.shape == (ROWS, RANK)
    assert rel.S.shape == (RANK,)
    assert rel.V.shape == (COLS, RANK)
    assert rep["private"] is True
    assert rep["insecure_noise_seed"] is False
    assert rep["epsilon"] == 1.0
    assert rep["delta"] == 1e-6
    # the default private algorithm: two passes, Z = S A then Y = A V_k
    assert rep["algorithm"] == "two-pass"
    assert rep["n_passes"] == 2
    assert rep["cluster"]["kind"] == "local"
    t, v = rep["parameters"]["sketch_size"], rep["parameters"]["core_size"]
    assert t == RANK
    assert [s["name"] for s in rep["sketches"]] == ["Z", "Y"]
    assert [s["shape"] for s in rep["sketches"]] == [[v, COLS], [ROWS, t]]
    for s in rep["sketches"]:
        assert s["sensitivity"] > 0
        assert s["sigma"] > 0

    # no seed, no key, no data value in anything the run wrote or printed
    seed_keys = [
        k for k in _keys(rep) if re.search("seed|key|secret|entropy", k, re.IGNORECASE)
    ]
    # (the public-seed flags are booleans: --seed makes the operators public; the
    # contract's secret_noise says whether the noise key is secret, not the key)
    assert sorted(seed_keys) == [
        "insecure_noise_seed", "public_sketch_seed", "public_sketch_seed", "secret_noise",
        "sketch_seed_fingerprint",
    ]
    assert rep["contract"]["secret_noise"] is True
    assert rep["public_sketch_seed"] is True
    # two-pass: exact for every operator, a public seed included (a one-pass
    # release would say "worst-case")
    assert rep["sensitivity"] == "exact"
    for text in (json.dumps(rep), ledger.read_text(), proc.stdout, proc.stderr):
        _assert_no_secret_or_data(text, store)

    book = json.loads(ledger.read_text())
    assert book["budget"] == {"epsilon": 10.0, "delta": 1e-5}
    assert [r["release_id"] for r in book["releases"]] == [rep["release_id"]]


@pytest.mark.timeout(180)
def test_insecure_noise_seed_stamps_not_private(store: Path, tmp_path: Path) -> None:
    out, ledger = tmp_path / "release.zarr", tmp_path / "A.ledger.json"
    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--ledger",
        ledger,
        "--seed",
        SKETCH_SEED,
        "--insecure-noise-seed",
        NOISE_SEED,
        "--json",
        "--quiet",
        *PRIVACY,
        *BUDGET,
    )
    assert proc.returncode == 0, proc.stderr
    printed = leading_json(proc.stdout)
    rep = read_release(out).report
    assert printed["release_id"] == rep["release_id"]
    assert rep["private"] is False
    assert printed["private"] is False
    assert rep["insecure_noise_seed"] is True
    assert "NOT PRIVATE" in rep["note"]
    # the key derived from the public seed is not written anywhere either
    key = NoiseKey.insecure_from_seed(NOISE_SEED)
    derived = [key, *(key.derive(int(c)) for c in NoiseCode)]
    for text in (json.dumps(rep), ledger.read_text(), proc.stdout, proc.stderr):
        _assert_no_secret_or_data(text, store, seeds=(SKETCH_SEED, NOISE_SEED))
        for k in derived:
            assert k.secret.hex() not in text
    (record,) = json.loads(ledger.read_text())["releases"]
    assert record["details"]["noise_reproducible_not_private"] is True


@pytest.mark.timeout(180)
def test_non_private_run_is_stamped_and_not_accounted(
    store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "release.zarr"
    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--non-private",
        "--seed",
        1,
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    assert "NOT PRIVATE" in proc.stdout
    rep = read_release(out).report
    assert rep["private"] is False
    assert rep["epsilon"] is None
    assert rep["delta"] is None
    assert "NOT PRIVATE" in rep["note"]
    assert not Path(
        f"{store}.dplr-ledger.json"
    ).exists()  # non-private runs are not charged


@pytest.mark.timeout(120)
def test_over_budget_exits_3_and_changes_nothing(store: Path, tmp_path: Path) -> None:
    ledger, out = tmp_path / "A.ledger.json", tmp_path / "release.zarr"
    init = run_dplr(
        "budget", "init", store, "--epsilon", "1", "--delta", "1e-6", "--ledger", ledger
    )
    assert init.returncode == 0, init.stderr
    before = file_state(ledger)
    listing = sorted(p.name for p in tmp_path.iterdir())

    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--ledger",
        ledger,
        "--epsilon",
        "2",
        "--delta",
        "1e-7",
    )
    line = assert_one_line_error(proc, 3, "dplr: refused: ")
    assert "exceed" in line
    assert "budget" in line
    assert_nothing_at(out)
    assert file_state(ledger) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


@pytest.mark.timeout(120)
def test_over_budget_with_a_new_ledger_creates_no_ledger(
    store: Path, tmp_path: Path
) -> None:
    ledger, out = tmp_path / "A.ledger.json", tmp_path / "release.zarr"
    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--ledger",
        ledger,
        *PRIVACY,
        "--budget-epsilon",
        "0.5",
        "--budget-delta",
        "1e-6",
    )
    line = assert_one_line_error(proc, 3, "dplr: refused: ")
    assert "exceed" in line
    assert_nothing_at(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no ledger, no lock file


@pytest.mark.timeout(240)
def test_demo_runs_and_prints_the_report(tmp_path: Path) -> None:
    # a smaller matrix than the default keeps the test fast; the code path is the same
    proc = run_dplr(
        "demo",
        "--dir",
        tmp_path,
        "--rows",
        "2000",
        "--cols",
        "200",
        "--json",
        timeout=220,
        embedded=True,  # the README's first command, as a new user runs it
    )
    assert proc.returncode == 0, proc.stderr
    rep = leading_json(proc.stdout)
    assert rep["format"] == "dplr-release/1"
    assert rep["private"] is True
    assert rep["epsilon"] > 0
    assert rep["shape"] == [2000, 200]
    assert (
        read_release(tmp_path / "release.zarr").report["release_id"]
        == rep["release_id"]
    )
    assert "nan" not in proc.stdout.lower()
    # the announced algorithm is the one the report says ran (the private default);
    # with --json, stdout holds the report alone and the story goes to stderr
    assert f"factorization ({rep['algorithm']}, unit=entry" in proc.stderr
    assert rep["algorithm"] == "two-pass"
    assert f"the demo's files are in {tmp_path} (kept)" in proc.stderr
    assert (tmp_path / "sample.zarr").is_dir()


def test_demo_refuses_bad_privacy_parameters_before_writing(tmp_path: Path) -> None:
    proc = run_dplr("demo", "--dir", tmp_path / "work", "--epsilon", "-1", timeout=60)
    assert_one_line_error(proc, 2, "dplr: error: ")
    assert not (tmp_path / "work").exists()  # no store generated, no ledger declared


@pytest.mark.timeout(120)
def test_budget_flags_cannot_change_a_declared_budget(
    store: Path, tmp_path: Path
) -> None:
    """A lifetime budget is declared once: contradicting flags exit 2, nothing changes."""
    ledger, out = tmp_path / "A.ledger.json", tmp_path / "release.zarr"
    init = run_dplr(
        "budget", "init", store, "--epsilon", "1", "--delta", "1e-6", "--ledger", ledger
    )
    assert init.returncode == 0, init.stderr
    before = file_state(ledger)
    proc = run_dplr(
        "factorize",
        store,
        "--rank",
        RANK,
        "--out",
        out,
        "--ledger",
        ledger,
        "--epsilon",
        "0.5",
        "--delta",
        "1e-7",
        "--budget-epsilon",
        "5",
        "--budget-delta",
        "1e-6",
    )
    line = assert_one_line_error(proc, 2, "dplr: error: ")
    assert "already declares the lifetime budget" in line
    assert_nothing_at(out)
    assert file_state(ledger) == before
