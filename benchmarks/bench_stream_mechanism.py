"""A stream's continual-release mechanism: error and release time, BLT / square root / tree.

Usage::

    python benchmarks/bench_stream_mechanism.py            # 2000 x 200 and source_bow, 3 draws
    python benchmarks/bench_stream_mechanism.py --quick    # 400 x 60 and digits, 1 draw: a smoke run
    python benchmarks/bench_stream_mechanism.py --rows 10000 --cols 500 --draws 1

On each matrix -- bench_utility's ``low-rank`` spectrum (rank k = 5, ±1 factors)
and one real matrix built from data installed here (``--real``, default
``source_bow``, k = 8: bench_utility.real_matrix / pca_real_data.py; every
``ceil(m / --real-rows)``-th row) -- scaled so that |A_ij| <= C = 1, unit
``entry``, epsilon = 2, delta = 1e-6, add/remove, the additive spectral error
``||A - U S V^T||_2 - sigma_{k+1}`` (bench_utility.Residual, exact) of:

* the full-matrix Gaussian mechanism (the yardstick, bench_utility.full_gm);
* the batch one-pass release ``pipeline.factorize(A, k, algorithm="spectral",
  unit="entry")``;
* a stream of each mechanism (``stream_init(mechanism=...)``), every cell one
  entity ingested at epoch 1: horizon 1 released at epoch 1, and horizon 366
  released at epoch 1 and at epoch 255 (popcount 8: the tree's worst epoch);

each as a ratio to the batch one-pass release and to the full GM, with the
error model's prediction of the stream's ratio to the full GM (the report's
``model_error``). Then the per-entry noise std of each mechanism over the
tree's at T = 366, computed exactly from the factorizations
(``ContinualMechanism.noise_factor``) averaged over tau = 1..366 and at the
tree's worst tau, and sampled at tau = 255 from the released sketches of the
streams (released minus exact, std of every entry of ``Z``, in the one-shot
sigma of each stream's own plan: streams split their budget at their own noise,
so their sigmas differ; this leaves the mechanism's noise factor); and (first matrix
only) the wall time of ``stream_release`` at epoch 366 of the horizon-366 stream
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

from bench_utility import Residual, full_gm, gm_noise_std, make_matrix, real_matrix

import pipeline
from pipeline.algorithms.continual_factorization import continual_mechanism
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import (
    mechanism_of,
    noisy_state_sketches,
    open_stream,
    plan_of,
    stream_ingest,
    stream_init,
    stream_release,
)

MECHANISMS = ("blt", "sqrt-factorization", "tree")
EPS, DELTA, K, C = 2.0, 1e-6, 5, 1.0
REAL_K = 8
T_LONG, TAU = 366, 255
BUDGET = (1e6, 0.5)


def _stream(work: str, tag: str, A: np.ndarray, k: int, mech: str, horizon: int) -> str:
    state = os.path.join(work, f"{tag}.stream")
    m, n = A.shape
    stream_init(state, n_rows=m, n_cols=n, rank=k, horizon=horizon, epsilon=EPS,
                delta=DELTA, unit="entry", clip_norm=C, mechanism=mech,
                ledger=os.path.join(work, f"{tag}.json"), budget=BUDGET)  # fmt: skip
    stream_ingest(state, os.path.join(work, "cells.npz"), epoch=1)
    return state


def _release(state: str, epoch: int) -> tuple[Any, float]:
    t0 = time.perf_counter()
    f, _ = stream_release(state, epoch=epoch, out=f"{state}-{epoch}.zarr")
    return f, time.perf_counter() - t0


def _noise_z(state: str, epoch: int) -> np.ndarray:
    """The released ``Z``'s noise at ``epoch``: released minus exact (a benchmark's view)."""
    st = open_stream(state)
    with st.lock():
        noisy = noisy_state_sketches(st, epoch)["Z"]
        if st.has("running/Z"):
            exact = st.read("running/Z")
        else:  # the tree: its p-sums of epoch's set bits
            exact = sum(st.read(n) for n in st.names("tree/") if n.endswith("/Z"))
    return np.asarray(noisy - exact)


def exact_noise_ratios(horizon: int = T_LONG) -> dict[str, dict[str, float]]:
    """Per-entry noise std over the tree's, from the factorizations: mean over tau, at the
    tree's worst tau (the first of the largest popcount), and the worst tau itself."""
    tree = continual_mechanism("tree", horizon)
    taus = range(1, horizon + 1)
    worst = max(taus, key=tree.noise_factor)
    out = {}
    for name in ("blt", "sqrt-factorization"):
        mech = continual_mechanism(name, horizon)
        r = [mech.noise_factor(t) / tree.noise_factor(t) for t in taus]
        out[name] = {"mean": float(np.mean(r)), "at_worst": r[worst - 1], "worst_tau": worst}
    return out


def _streams(work: str, A: np.ndarray, k: int, timed: bool, err: Any, acc: dict) -> None:
    """Every mechanism's streams on ``A`` (cells at epoch 1): errors, sampled noise, times."""
    for mech in MECHANISMS:
        s1 = _stream(work, f"{mech}-1", A, k, mech, 1)
        f, _ = _release(s1, 1)
        err(f"stream {mech} T=1 tau=1", f)
        s = _stream(work, f"{mech}-{T_LONG}", A, k, mech, T_LONG)
        for tau in (1, TAU):
            f, _ = _release(s, tau)
            err(f"stream {mech} T={T_LONG} tau={tau}", f)
        # in the one-shot sigma of the stream's own plan: each stream splits its budget
        # at its own noise, so their sigmas of Z differ; this leaves the mechanism's factor
        manifest = open_stream(s).manifest
        one_shot = plan_of(manifest).lrf.sigma("Z") / mechanism_of(manifest).sensitivity_factor
        acc["noise_z"][mech] = float(np.std(_noise_z(s, TAU))) / one_shot
        if timed:
            _release(s, T_LONG - 1)
            _, secs = _release(s, T_LONG)
            acc["times"].setdefault(mech, []).append(secs)


def run_matrix(label: str, A: np.ndarray, k: int, args: argparse.Namespace,
               timed: bool) -> dict[str, Any]:  # fmt: skip
    """Every release of one matrix, ``args.draws`` times."""
    rng = np.random.default_rng(args.seed)
    res = Residual(A)
    sv = np.linalg.svd(A, compute_uv=False)
    floor = float(sv[k])
    errs: dict[str, list[float]] = {}
    model: dict[str, list[float]] = {}
    acc: dict[str, Any] = {"times": {}, "noise_z": {}}
    sampled: dict[str, list[float]] = {}

    def err(name: str, f: Any) -> None:
        errs.setdefault(name, []).append(res(f.U, f.S, f.V) - floor)
        me = (f.report.get("stream") or {}).get("model_error")
        if me:
            model.setdefault(name, []).append(me["ratio_to_full_gm"])

    for d in range(args.draws):
        U, S, V = full_gm(A, k, gm_noise_std(EPS, DELTA, C, "add-remove"), rng)
        errs.setdefault("full GM", []).append(res(U, S, V) - floor)
        f = pipeline.factorize(A, k, epsilon=EPS, delta=DELTA, unit="entry",
                               algorithm="spectral", dataset=f"bench-{label}-{d}")  # fmt: skip
        err("batch one-pass", f)
        with tempfile.TemporaryDirectory(dir=args.workdir) as work:
            i, j = np.nonzero(A)
            write_batch(os.path.join(work, "cells.npz"), {
                "entity": i * A.shape[1] + j, "i": i, "j": j, "s": A[i, j]})  # fmt: skip
            _streams(work, A, k, timed, err, acc)
        tree_z = acc["noise_z"]["tree"]
        for mech in ("blt", "sqrt-factorization"):
            sampled.setdefault(mech, []).append(acc["noise_z"][mech] / tree_z)
        print(f"{label}: draw {d + 1}/{args.draws} done", file=sys.stderr, flush=True)
    med = {k_: statistics.median(v) for k_, v in errs.items()}
    return {
        "label": label, "shape": list(A.shape), "rank": k, "draws": args.draws,
        "sigma_1": float(sv[0]), "sigma_k+1": floor, "errors": errs, "median_error": med,
        "over_full_gm": {k_: v / med["full GM"] for k_, v in med.items()},
        "over_batch": {k_: v / med["batch one-pass"] for k_, v in med.items()},
        "model_over_full_gm": {k_: statistics.median(v) for k_, v in model.items()},
        "sampled_noise_over_tree_tau255": {k_: statistics.median(v) for k_, v in sampled.items()},
        "release_seconds_tau366": {k_: statistics.median(v) for k_, v in acc["times"].items()},
    }  # fmt: skip


def _real(args: argparse.Namespace) -> np.ndarray:
    """The real matrix (bench_utility.real_matrix, unit entry), every ceil(m / N)-th row."""
    A = real_matrix(args.real, "entry", C)  # cached where bench_utility caches it
    step = max(1, -(-A.shape[0] // args.real_rows))
    return np.ascontiguousarray(A[::step])


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    synth = make_matrix("low-rank", "entry", args.rows, args.cols, K, C, rng)
    out = [run_matrix(f"low-rank {args.rows} x {args.cols}", synth, K, args, timed=True)]
    if args.real:
        out.append(run_matrix(f"real:{args.real}", _real(args), REAL_K, args, timed=False))
    return {
        "epsilon": EPS, "delta": DELTA, "unit": "entry", "draws": args.draws,
        "matrices": out, "exact_noise_over_tree": exact_noise_ratios(),
    }  # fmt: skip


def _matrix_md(r: dict[str, Any]) -> list[str]:
    lines = [
        (f"**{r['label']}** ({r['shape'][0]} x {r['shape'][1]}, rank {r['rank']}, "
        f"sigma_1 = {r['sigma_1']:.4g}, sigma_k+1 = {r['sigma_k+1']:.4g})"),
        "",
        "| release | additive error | / batch one-pass | / full GM | model / full GM |",
        "|---|---:|---:|---:|---:|",
    ]
    mo = r["model_over_full_gm"]
    for k, v in r["median_error"].items():
        pred = f"{mo[k]:.3f}" if k in mo else ""
        lines.append(f"| {k} | {v:.4g} | {r['over_batch'][k]:.3f} | "
                     f"{r['over_full_gm'][k]:.3f} | {pred} |")  # fmt: skip
    s = r["sampled_noise_over_tree_tau255"]
    lines += ["", "sampled noise std of Z at tau = 255 (in each plan's one-shot sigma) over the tree's: "
              + ", ".join(f"{k} {v:.3f}" for k, v in s.items())]  # fmt: skip
    t = r["release_seconds_tau366"]
    if t:
        lines += ["", "| mechanism | release time at tau = 366 (s) | / tree |", "|---|---:|---:|"]
        lines += [f"| {k} | {v:.3f} | {v / t['tree']:.2f} |" for k, v in t.items()]
    return lines


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"unit entry, epsilon={r['epsilon']}, delta={r['delta']}, median of {r['draws']}",
        "",
    ]
    for m in r["matrices"]:
        lines += [*_matrix_md(m), ""]
    lines += ["| mechanism | noise std / tree's, mean over tau = 1..366 | at the tree's worst tau |",
              "|---|---:|---:|"]  # fmt: skip
    for k, v in r["exact_noise_over_tree"].items():
        lines.append(f"| {k} | {v['mean']:.3f} | {v['at_worst']:.3f} (tau = {v['worst_tau']}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--cols", type=int, default=200)
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--real", default="source_bow", help="real matrix ('' for none)")
    p.add_argument("--real-rows", type=int, default=10000)
    p.add_argument("--workdir", default=None)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.cols, args.draws = 400, 60, 1
        args.real = "digits" if args.real == "source_bow" else args.real
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
