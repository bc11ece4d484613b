"""`dplr stream ingest` loads only what an ingest needs: no dask, distributed or pandas.

An ingest reads a batch, clips it and commits its cells; the ingest throughput target
(10^6 updates/s-scale batches through the whole command, process start included,
docs/streams.md) is dominated by start-up for such batches, and dask.array (via the lock
error's module) and pandas (via pyarrow's ``to_numpy`` and ``pa.array`` of a list) once
added about 0.4 s of imports to every run. Checked by module names, not by time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeline.io.batches import write_batch
from pipeline.jobs.stream import stream_init

UNWANTED = ("dask", "distributed", "pandas")
PROBE = (
    "import json, sys\n"
    "from pipeline.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    f"print(json.dumps([code, sorted(m for m in {UNWANTED!r} if m in sys.modules)]))\n"
)


def _ingest_modules(state: Path, batch: Path) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "stream", "ingest", str(state), str(batch), "--epoch", "1"],
        capture_output=True, text=True, timeout=120, check=False, cwd=state.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    code, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, loaded


def test_an_ingest_imports_neither_dask_nor_pandas(tmp_path: Path) -> None:
    state = tmp_path / "s.stream"
    stream_init(state, n_rows=50, n_cols=20, rank=2, horizon=4, epsilon=1.0, delta=1e-6,
                unit="row", ledger=tmp_path / "l.json", budget=(4.0, 1e-5))  # fmt: skip
    rng = np.random.default_rng(0)
    i = rng.integers(0, 50, 200)
    batch = tmp_path / "b.parquet"
    write_batch(batch, {"entity": i, "i": i, "j": rng.integers(0, 20, 200), "s": rng.normal(size=200)})
    assert _ingest_modules(state, batch) == (0, [])
    # negative control: the probe sees a module the command did import
    again = tmp_path / "c.parquet"
    write_batch(again, {"entity": i, "i": i, "j": rng.integers(0, 20, 200), "s": rng.normal(size=200)})
    proc = subprocess.run(
        [sys.executable, "-c", "import pandas\n" + PROBE, "stream", "ingest", str(state),
         str(again), "--epoch", "1"],
        capture_output=True, text=True, timeout=120, check=False, cwd=state.parent,
    )  # fmt: skip
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, ["pandas"]]
