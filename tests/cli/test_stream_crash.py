"""`dplr stream ingest` and `dplr stream release` killed at each seam, then rerun: same bytes, one charge.

The nightly job's crash test (tests/cli/test_nightly_crash.py) drives the same seams through
``dplr nightly``. Here the two commands are killed directly (SIGKILL at ``DPLR_CRASH_AT``), for
the default mechanism (``blt``: its state holds the running sums and three noise buffers, all
advanced in the commit that closes the epochs) and for the square root (its release regenerates
every epoch's noise), on a release that closes three epochs at once. The noise comes from a
public seed so that releases compare byte for byte with an undisturbed run of the same state.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr
from cli_util import run_dplr

from pipeline.io.batches import write_batch
from pipeline.io.stream_state import StreamStore

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("cli_cluster")

SHAPE = (150, 40)
EPOCHS = (1, 2, 3)


def _run(*args: object, crash: str | None = None):
    old = os.environ.pop("DPLR_CRASH_AT", None)
    try:
        if crash is not None:
            os.environ["DPLR_CRASH_AT"] = crash
        return run_dplr(*args)  # type: ignore[arg-type]
    finally:
        os.environ.pop("DPLR_CRASH_AT", None)
        if old is not None:
            os.environ["DPLR_CRASH_AT"] = old


@pytest.fixture(scope="module", params=["blt", "sqrt-factorization"])
def prepared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stream with batches in epochs 1, 2 (ingested) and the batch of epoch 3 on disk."""
    root = tmp_path_factory.mktemp(f"stream-{request.param}")
    proc = run_dplr("stream", "init", root / "s.stream", "--rows", SHAPE[0], "--cols", SHAPE[1],
                    "--rank", 3, "--horizon", 6, "--epsilon", "1", "--delta", "1e-6",
                    "--unit", "row", "--mechanism", request.param, "--ledger",
                    root / "pop.dplr-ledger.json", "--budget-epsilon", "1", "--budget-delta",
                    "1e-6", "--seed", 5, "--insecure-noise-seed", 11)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(2)
    for epoch in EPOCHS:
        i = rng.integers(0, SHAPE[0], 300)
        write_batch(root / f"b{epoch}.parquet", {"entity": i, "i": i,
                    "j": rng.integers(0, SHAPE[1], 300), "s": rng.normal(size=300) * 0.05})  # fmt: skip
        if epoch < 3:
            proc = run_dplr("stream", "ingest", root / "s.stream", root / f"b{epoch}.parquet",
                            "--epoch", epoch)  # fmt: skip
            assert proc.returncode == 0, proc.stderr
    assert StreamStore.open(root / "s.stream").manifest["params"]["mechanism"] == request.param
    return root


def _ingest_and_release(root: Path, crash_ingest: str | None = None, crash_release: str | None = None):
    ing = _run("stream", "ingest", root / "s.stream", root / "b3.parquet", "--epoch", 3,
               crash=crash_ingest)  # fmt: skip
    rel = _run("stream", "release", root / "s.stream", "--epoch", 3, "--out", root / "r3.zarr",
               crash=crash_release)  # fmt: skip
    return ing, rel


def _release_bytes(root: Path) -> dict[str, bytes]:
    g = zarr.open_group(str(root / "r3.zarr"), mode="r")
    out = {name: np.asarray(g[name][...]).tobytes() for name in ("U", "S", "V")}
    # "created" is when the epochs were closed: the same for a crashed run and its rerun
    # only; the rest of the report must match the undisturbed run
    out["report"] = repr(sorted((k, v) for k, v in g.attrs["report"].items() if k != "created")).encode()
    return out


@pytest.fixture(scope="module")
def reference(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("ref") / "job"
    shutil.copytree(prepared, root)
    ing, rel = _ingest_and_release(root)
    assert ing.returncode == 0, ing.stderr
    assert rel.returncode == 0, rel.stderr
    return _release_bytes(root)


def _charges(root: Path) -> int:
    return len(json.loads((root / "pop.dplr-ledger.json").read_text())["releases"])


@pytest.mark.parametrize("seam", ["after-close", "after-noise", "during-write", "after-write", "after-record"])
def test_a_release_killed_at_a_seam_then_rerun_publishes_the_same_bytes(prepared, reference, tmp_path, seam):
    mech = StreamStore.open(prepared / "s.stream").manifest["params"]["mechanism"]
    if mech != "blt" and seam not in ("after-close", "during-write"):
        pytest.skip("the square root runs at two seams: its other steps are the default's")
    root = tmp_path / "job"
    shutil.copytree(prepared, root)
    ing, rel = _ingest_and_release(root, crash_release=seam)
    assert ing.returncode == 0, ing.stderr
    assert rel.returncode == -signal.SIGKILL, (rel.returncode, rel.stderr)
    rerun = run_dplr("stream", "release", root / "s.stream", "--epoch", 3, "--out", root / "r3.zarr")
    assert rerun.returncode == 0, rerun.stderr
    assert _release_bytes(root) == reference
    assert _charges(root) == 1  # charged once, at creation; no release charges
    assert [p.name for p in root.iterdir() if p.name.startswith(".r3.zarr")] == []


def test_an_ingest_killed_after_its_commit_is_applied_once(prepared, reference, tmp_path):
    if StreamStore.open(prepared / "s.stream").manifest["params"]["mechanism"] != "blt":
        pytest.skip("an ingest does not depend on the mechanism: run once, for the default")
    root = tmp_path / "job"
    shutil.copytree(prepared, root)
    ing = _run("stream", "ingest", root / "s.stream", root / "b3.parquet", "--epoch", 3,
               crash="after-ingest")  # fmt: skip
    assert ing.returncode == -signal.SIGKILL, (ing.returncode, ing.stderr)
    # the rerun of the ingest finds its content applied: refused, nothing applied twice
    again = run_dplr("stream", "ingest", root / "s.stream", root / "b3.parquet", "--epoch", 3)
    assert again.returncode == 2, again.stderr
    assert "already ingested" in again.stderr
    rel = run_dplr("stream", "release", root / "s.stream", "--epoch", 3, "--out", root / "r3.zarr")
    assert rel.returncode == 0, rel.stderr
    assert _release_bytes(root) == reference
    assert len(StreamStore.open(root / "s.stream").manifest["batches"]) == len(EPOCHS)
    assert _charges(root) == 1
