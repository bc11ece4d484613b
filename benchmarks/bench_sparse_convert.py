"""``dplr convert``: COO Parquet batches to a CSR store, time and peak memory.

Writes ``--files`` Parquet batches (columns entity, i, j, s; uniform cells of an
``--rows`` x ``--cols`` matrix, N(0, 1) values, ``--triples`` in all, row groups of
2^20) under ``benchmarks/work/`` (git-ignored, reused), then converts them:

* ``dplr convert`` as a subprocess, at each ``--band-entries`` given;
* the in-memory baseline: every file read whole (``pyarrow.parquet.read_table``),
  scipy's ``coo_matrix((s, (i, j))).tocsr()``, ``write_csr``.

Each run is its own process; the table gives its wall time and its peak resident
memory (``ru_maxrss``), against the size of the triples (24 bytes each). A
measurement, not a test.

    python benchmarks/bench_sparse_convert.py --triples 10000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")

_MAXRSS = (
    "import resource, subprocess, sys; "
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
_IN_MEMORY = """
import sys, pyarrow.parquet as pq, numpy as np, scipy.sparse as sp
from pipeline.io.csr import write_csr
out, m, n, *files = sys.argv[1:]
t = [pq.read_table(f, columns=["i", "j", "s"]) for f in files]
cat = {c: np.concatenate([x[c].to_numpy() for x in t]) for c in ("i", "j", "s")}
del t
x = sp.coo_matrix((cat["s"], (cat["i"], cat["j"])), shape=(int(m), int(n))).tocsr()
write_csr(out, x)
"""


def batches(m: int, n: int, triples: int, files: int) -> list[str]:
    paths = []
    per = triples // files
    for f in range(files):
        path = os.path.join(WORK, f"coo_{m}x{n}_{triples}_{f}.parquet")
        if not os.path.exists(path):
            rng = np.random.default_rng([0, f])
            cols = {
                "entity": rng.integers(0, m, per),
                "i": rng.integers(0, m, per),
                "j": rng.integers(0, n, per),
                "s": rng.standard_normal(per),
            }
            pq.write_table(pa.table(cols), path + ".tmp", row_group_size=2**20)
            os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def measured(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``cmd`` in a process of its own."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _MAXRSS, *cmd],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wall = time.perf_counter() - t0
    if out[0] != "0":
        raise RuntimeError(f"{cmd[:4]} failed")
    return wall, int(out[1]) / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=100_000)
    p.add_argument("--triples", type=int, default=10_000_000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--band-entries", type=int, nargs="+", default=[2**20, 2**22])
    a = p.parse_args()
    os.makedirs(WORK, exist_ok=True)
    files = batches(a.rows, a.cols, a.triples, a.files)
    out = os.path.join(WORK, "coo_converted.zarr")
    size = 24 * a.triples / 2**20
    print(
        f"{a.triples} triples ({size:.0f} MiB as i, j, s) of a {a.rows} x {a.cols} "
        f"matrix in {a.files} Parquet files\n"
    )
    print("| conversion | seconds | peak RSS (MiB) |\n|---|---|---|")
    for budget in a.band_entries:
        shutil.rmtree(out, ignore_errors=True)
        wall, rss = measured([
            sys.executable, "-m", "pipeline", "convert", *files, "--rows", str(a.rows),
            "--cols", str(a.cols), "--out", out, "--band-entries", str(budget),
        ])  # fmt: skip
        print(f"| `dplr convert --band-entries {budget}` | {wall:.1f} | {rss:.0f} |",
              flush=True)  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    wall, rss = measured([sys.executable, "-c", _IN_MEMORY, out, str(a.rows),
                          str(a.cols), *files])  # fmt: skip
    print(f"| in memory: read_table, scipy tocsr, write_csr | {wall:.1f} | {rss:.0f} |")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
