"""The two-pass factorization on a real cluster: chunking invariance, and a
``dplr factorize --algorithm two-pass`` process SIGKILLed between (and after)
its passes, then the same command rerun.

The job is charged once, after pass 1 and before any noise; each pass's exact sketches are
journaled (the tall ``Y`` by the workers, as a Zarr array); a rerun reads only
the passes that were not journaled, draws the same noise (the journal's key)
and charges nothing more, and its release is bit for bit the undisturbed one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dist_util import low_rank_product, rel_diff, seeded_matrix, write_matrix
from distributed import Client, LocalCluster

from pipeline.api import factorize
from pipeline.io import default_journal_path, read_release

pytestmark = pytest.mark.distributed

M, N, RANK = 400, 150, 5
SKETCH_SEED, NOISE_SEED = 20240611, 7
BUDGET = (10.0, 1e-4)
PRIVACY = {"epsilon": 1.0, "delta": 1e-6}
# as in test_chunking_invariance.py: two chunkings differ only in the summation
# order of the per-block partials (~1e-16 relative), amplified by the rank-k
# truncations; a genuine chunk dependence shows at O(1) (negative control below)
RTOL_CHUNKING = 1e-10


def _kw(**extra: Any) -> dict[str, Any]:
    return {**PRIVACY, "algorithm": "two-pass", "seed": SKETCH_SEED,
            "insecure_noise_seed": NOISE_SEED, "budget": BUDGET, **extra}  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("unit", ["row", "entry", "column"])
def test_same_release_for_two_chunkings_and_in_memory(
    client: Client, tmp_path: Path, global_seed: int, unit: str
) -> None:
    A = seeded_matrix(global_seed, M, N)
    mem = tmp_path / "in-memory-ledger.json"  # the in-memory runs' own ledger
    ref = factorize(A, RANK, unit=unit, ledger=mem, **_kw())
    assert ref.report["n_passes"] == 2
    ref_L = low_rank_product(ref.U, ref.S, ref.V)
    for chunks in ((64, N), (100, 37)):
        path = write_matrix(tmp_path / f"A-{chunks[0]}x{chunks[1]}.zarr", A, chunks)
        out = tmp_path / f"rel-{chunks[0]}.zarr"
        f = factorize(path, RANK, unit=unit, out=out, **_kw())
        rel = read_release(out)
        np.testing.assert_array_equal(rel.S, f.S)  # returned = published
        assert rel.report["cluster"]["n_workers"] == 2
        assert rel.report["n_passes_planned"] == 2
        assert rel.U.shape == (M, RANK)
        assert rel.V.shape == (N, RANK)
        assert rel_diff(low_rank_product(rel.U, rel.S, rel.V), ref_L) < RTOL_CHUNKING, chunks
        np.testing.assert_allclose(rel.S, ref.S, rtol=RTOL_CHUNKING, atol=0.0)
    # negative control: another noise seed is far outside the tolerance
    other = factorize(A, RANK, unit=unit, ledger=mem, **{**_kw(), "insecure_noise_seed": NOISE_SEED + 1})
    assert rel_diff(low_rank_product(other.U, other.S, other.V), ref_L) > 1e-3


@pytest.mark.timeout(180)
def test_a_release_returned_in_memory_is_the_published_one(
    client: Client, tmp_path: Path, global_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an output store the tall ``U`` comes back to the client, where the
    last product (``U = Y W``, block by block) is made from the gathered blocks
    of the noisy ``Y`` instead of in a round of worker tasks: the same products
    of the same blocks, so the same bits as the release written by the workers
    to a store (this machine, one BLAS thread on both sides)."""
    from pipeline.execution import source

    A = seeded_matrix(global_seed, M, N)
    path = write_matrix(tmp_path / "A.zarr", A, (64, N))
    ledger = tmp_path / "ledger.json"
    out = tmp_path / "rel.zarr"
    stored = factorize(path, RANK, out=out, ledger=ledger, **_kw())
    rel = read_release(out)
    gathered = []
    real = source.gather_blocks

    def spy(client_: Any, arrays: Any, *, persisted: bool = False) -> Any:
        gathered.append(persisted)
        return real(client_, arrays, persisted=persisted)

    monkeypatch.setattr(source, "gather_blocks", spy)
    returned = factorize(path, RANK, ledger=ledger, **_kw())
    for name in ("U", "S", "V"):
        np.testing.assert_array_equal(getattr(returned, name), getattr(rel, name))
    np.testing.assert_array_equal(stored.S, rel.S)
    # the client-side product ran: its gather of the kept noisy Y is the job's last
    assert gathered[-1] is True
    # negative control: another noise seed moves U
    other = factorize(path, RANK, ledger=ledger, **{**_kw(), "insecure_noise_seed": NOISE_SEED + 1})
    assert not np.array_equal(other.U, rel.U)


# ---------------------------------------------------------------------------
# a real process killed at a crash point between the passes
# ---------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DASK_SCHEDULER_ADDRESS", "DPLR_CRASH_AT")}
    return {**env, **extra}


def _dplr(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], check=False, capture_output=True,
        text=True, timeout=150, env=_env(**env),
    )  # fmt: skip


def _argv(path: str, out: Path, ledger: Path, scheduler: str) -> list[str]:
    return [
        "factorize", path, "--rank", str(RANK), "--algorithm", "two-pass",
        "--epsilon", "1", "--delta", "1e-6", "--seed", str(SKETCH_SEED),
        "--insecure-noise-seed", str(NOISE_SEED), "--out", str(out), "--ledger", str(ledger),
        "--budget-epsilon", str(BUDGET[0]), "--budget-delta", str(BUDGET[1]),
        "--scheduler", scheduler, "--quiet",
    ]  # fmt: skip


def _records(ledger: Path) -> list[dict[str, Any]]:
    return list(json.loads(ledger.read_text())["releases"])


@pytest.mark.cli
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("crash", "journaled", "rerun_passes", "charged_at_kill"), [
    ("after-pass#1", ["Z"], 1, False),  # Z journaled, the charge comes next
    ("after-pass#2", ["Y", "Z"], 1, True),  # Y (tall) named only: pass 2 runs again
])  # fmt: skip
def test_sigkilled_between_the_passes_resumes_with_one_charge_and_the_same_release(
    cluster: LocalCluster, client: Client, tmp_path: Path, global_seed: int,
    crash: str, journaled: list[str], rerun_passes: int, charged_at_kill: bool,
) -> None:  # fmt: skip
    path = write_matrix(tmp_path / "A.zarr", seeded_matrix(global_seed, M, N), (50, N))
    ref_out = tmp_path / "clean.zarr"
    factorize(path, RANK, out=ref_out, ledger=tmp_path / "clean-ledger.json", **_kw())

    out, ledger = tmp_path / "release.zarr", tmp_path / "ledger.json"
    journal = Path(default_journal_path(out))
    argv = _argv(path, out, ledger, cluster.scheduler_address)
    killed = _dplr(argv, DPLR_CRASH_AT=crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not os.path.lexists(out)
    # charged once, after pass 1 and before any noise
    # (a new ledger file is created by the first charge)
    assert len(_records(ledger) if ledger.exists() else []) == int(charged_at_kill)
    assert (journal / "charged.json").exists() == charged_at_kill
    manifest = json.loads((journal / "sketches.json").read_text())["sketches"]
    assert sorted(manifest) == journaled
    assert manifest["Z"]["kind"] == "npy"
    if "Y" in journaled:
        assert manifest["Y"]["kind"] == "recompute"  # not written: recomputed on resume
        assert not list(journal.glob("exact-Y.*"))

    again = _dplr(argv)
    assert again.returncode == 0, again.stderr
    assert f"passes={rerun_passes}" in again.stdout
    assert "resumed from the journal" in again.stdout
    a, b = read_release(out), read_release(ref_out)
    for name in ("U", "S", "V"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name  # bit for bit
    (record,) = _records(ledger)  # exactly one charge
    assert record["release_id"] == a.report["release_id"]
    assert not os.path.lexists(journal)
