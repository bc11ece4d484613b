"""A stream's continual-release mechanism: error and release time, BLT / square root / tree.

Usage::

    python benchmarks/bench_stream_mechanism.py            # 2000 x 200, 3 draws
    python benchmarks/bench_stream_mechanism.py --quick    # 400 x 60, 1 draw: a smoke run

On ONE matrix (bench_utility's ``low-rank`` spectrum, rank k = 5, ±1 factors,
scaled so that |A_ij| <= C = 1; unit ``entry``, epsilon = 2, delta = 1e-6,
add/remove), the additive spectral error ``||A - U S V^T||_2 - sigma_{k+1}``
(bench_utility.Residual, exact) of:

* the full-matrix Gaussian mechanism (the yardstick, bench_utility.full_gm);
* the batch one-pass release ``pipeline.factorize(A, k, algorithm="spectral",
  unit="entry")``;
* a stream of each mechanism (``stream_init(mechanism=...)``), every cell one
  entity ingested at epoch 1: horizon 1 released at epoch 1, and horizon 366
  released at epoch 255 (popcount 8: the tree's worst epoch).

Then the wall time of ``stream_release`` at epoch 366 of the horizon-366 stream
(epochs up to 365 closed and released first; the release at 366 closes one empty
epoch, draws the noise, factorizes and writes), per mechanism. Medians over
``--draws`` draws of secret noise (fresh streams each draw). Nothing here is an
assertion; the machine is shared, so times are indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

from bench_utility import Residual, full_gm, gm_noise_std, make_matrix

import pipeline
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import stream_ingest, stream_init, stream_release

MECHANISMS = ("blt", "sqrt-factorization", "tree")
EPS, DELTA, K, C = 2.0, 1e-6, 5, 1.0
BUDGET = (1e6, 0.5)


def _stream(work: str, tag: str, A: np.ndarray, mech: str, horizon: int) -> str:
    state = os.path.join(work, f"{tag}.stream")
    m, n = A.shape
    stream_init(state, n_rows=m, n_cols=n, rank=K, horizon=horizon, epsilon=EPS,
                delta=DELTA, unit="entry", clip_norm=C, mechanism=mech,
                ledger=os.path.join(work, f"{tag}.json"), budget=BUDGET)  # fmt: skip
    stream_ingest(state, os.path.join(work, "cells.npz"), epoch=1)
    return state


def _release(state: str, work: str, epoch: int) -> tuple[Any, float]:
    t0 = time.perf_counter()
    f, _ = stream_release(state, epoch=epoch, out=f"{state}-{epoch}.zarr")
    return f, time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    A = make_matrix("low-rank", "entry", args.rows, args.cols, K, C, rng)
    res = Residual(A)
    sv = np.linalg.svd(A, compute_uv=False)
    floor = float(sv[K])
    errs: dict[str, list[float]] = {}
    times: dict[str, list[float]] = {}

    def err(name: str, f: Any) -> None:
        errs.setdefault(name, []).append(res(f[0], f[1], f[2]) - floor)

    for d in range(args.draws):
        gm = full_gm(A, K, gm_noise_std(EPS, DELTA, C, "add-remove"), rng)
        err("full GM", gm)
        f = pipeline.factorize(A, K, epsilon=EPS, delta=DELTA, unit="entry",
                               algorithm="spectral", dataset=f"bench-{d}")  # fmt: skip
        err("batch one-pass", (f.U, f.S, f.V))
        with tempfile.TemporaryDirectory(dir=args.workdir) as work:
            i, j = np.nonzero(A)
            write_batch(os.path.join(work, "cells.npz"), {
                "entity": i * A.shape[1] + j, "i": i, "j": j, "s": A[i, j]})  # fmt: skip
            for mech in MECHANISMS:
                s1 = _stream(work, f"{mech}-1", A, mech, 1)
                f, _ = _release(s1, work, 1)
                err(f"stream {mech} T=1 tau=1", (f.U, f.S, f.V))
                s = _stream(work, f"{mech}-366", A, mech, 366)
                f, _ = _release(s, work, 255)
                err(f"stream {mech} T=366 tau=255", (f.U, f.S, f.V))
                _release(s, work, 365)
                _, secs = _release(s, work, 366)
                times.setdefault(mech, []).append(secs)
            print(f"draw {d + 1}/{args.draws} done", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in errs.items()}
    return {
        "shape": list(A.shape), "rank": K, "epsilon": EPS, "delta": DELTA,
        "unit": "entry", "draws": args.draws, "sigma_1": float(sv[0]), "sigma_k+1": floor,
        "errors": errs, "median_error": med,
        "over_full_gm": {k: v / med["full GM"] for k, v in med.items()},
        "over_batch": {k: v / med["batch one-pass"] for k, v in med.items()},
        "release_seconds_tau366": {k: statistics.median(v) for k, v in times.items()},
    }  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    lines = [
        (
            f"{r['shape'][0]} x {r['shape'][1]}, rank {r['rank']}, unit entry, "
            f"epsilon={r['epsilon']}, delta={r['delta']}, median of {r['draws']}; "
            f"sigma_1 = {r['sigma_1']:.4g}, sigma_k+1 = {r['sigma_k+1']:.4g}"
        ),
        "",
        "| release | additive error | / full GM | / batch one-pass |",
        "|---|---:|---:|---:|",
    ]
    for k, v in r["median_error"].items():
        lines.append(
            f"| {k} | {v:.4g} | {r['over_full_gm'][k]:.3f} | {r['over_batch'][k]:.3f} |"
        )
    lines += [
        "",
        "| mechanism | release time at tau = 366 (s) | / tree |",
        "|---|---:|---:|",
    ]
    t = r["release_seconds_tau366"]
    lines += [f"| {k} | {v:.3f} | {v / t['tree']:.2f} |" for k, v in t.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--cols", type=int, default=200)
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workdir", default=None)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.cols, args.draws = 400, 60, 1
    r = run(args)
    os.makedirs(args.results, exist_ok=True)
    stem = os.path.join(
        args.results, "stream_mechanism" + ("_quick" if args.quick else "")
    )
    with open(stem + ".json", "w") as fh:
        json.dump(r, fh, indent=2)
    md = markdown(r)
    with open(stem + ".md", "w") as fh:
        fh.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
