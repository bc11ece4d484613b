"""Continual release: the noise of the square-root factorization against the binary tree's.

Usage::

    python benchmarks/bench_continual_noise.py            # T = 366, 4096, 2^20
    python benchmarks/bench_continual_noise.py --quick    # T = 366 only, fewer samples

Per horizon T (results in benchmarks/results/continual_noise[_quick].json|md):

* **exact**, from the factorizations (``pipeline.algorithms.continual_factorization``):
  the per-entry noise std at each tau = 1..T in units of the one-shot sigma of the same
  (epsilon, delta), ``sqrt(sum_{j<T} c_j^2 sum_{j<tau} c_j^2)`` for the square root and
  ``sqrt(L popcount(tau))`` for the tree; their ratio averaged over tau, at the tree's
  worst tau (largest popcount; the largest ratio if several tau tie) and at tau = T.
  The vectorised prefix sums are checked against ``ContinualMechanism.noise_factor`` at
  a few tau.
* **sampled** (T = 366): every epoch's keyed noise ``z_s`` (and every tree node's) drawn
  by the real generator for a statistic of ``--entries`` entries, combined with the rows
  of L; the sample std at each tau over the exact one (the ratio should be 1 within
  ``6 / sqrt(2 n)``), and the sampled sqrt/tree ratios as above. Two releases are also
  drawn by ``mechanism_noise`` itself and compared with the L-combination.
* **blt**: the 3-buffer buffered linear Toeplitz decoder fitted to T (``fit_blt``):
  its noise std over the square root's (largest and mean over tau) and the tree's,
  and the time of the fit.
* **cost** (T = 366): time of ``mechanism_noise`` at tau = 366 and 255 for the square
  root and the tree, and of one BLT release from its buffers (one draw, ``blt_noise``,
  ``blt_advance``), for the sketches of a 10000 x 500 Spectral-LRF stream (Y: 10000 x
  25, Z: 500 x 100); and the state each needs: the running exact sketches (1 copy) for
  a keyed factorization, 1 + 3 copies for the BLT, up to L p-sums for the tree as
  stored today.

Nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

import numpy as np

from pipeline.algorithms.continual import tree_levels
from pipeline.algorithms.continual_factorization import (
    BLT,
    SQRT,
    TREE,
    NoiseTerm,
    blt_advance,
    blt_noise,
    continual_mechanism,
    fit_blt,
    mechanism_noise,
    sqrt_coefficients,
)
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey

CODE = 101  # the noise code of Y (any code: the keys differ per statistic only)
TILE = 4096  # rows per noise tile (the noise depends on it: one value throughout)


def exact_factors(T: int) -> tuple[np.ndarray, np.ndarray]:
    """Noise std at tau = 1..T over the one-shot sigma: (square root, tree)."""
    c2 = sqrt_coefficients(T) ** 2
    prefix = np.cumsum(c2)
    sqrt = np.sqrt(prefix[-1] * prefix)
    pop = np.array([t.bit_count() for t in range(1, T + 1)], dtype=np.float64)
    tree = np.sqrt(tree_levels(T) * pop)
    return sqrt, tree


def blt_exact(T: int, sqrt: np.ndarray, tree: np.ndarray) -> dict[str, Any]:
    """The 3-buffer BLT fitted to T: its noise std over the square root's and the tree's."""
    t0 = time.perf_counter()
    m = fit_blt(T)
    fit_s = time.perf_counter() - t0
    ell = m.decoder()
    blt = m.sensitivity_factor * np.sqrt(np.cumsum(ell * ell))
    return {
        "theta": list(m.theta),
        "omega": list(m.omega),
        "fit_s": fit_s,
        "max_over_sqrt_max": float(blt.max() / sqrt.max()),
        "mean_over_sqrt_mean": float(blt.mean() / sqrt.mean()),
        "largest_ratio_to_sqrt": float(np.max(blt / sqrt)),
        "vs_tree": summary(blt, tree),
    }


def summary(sqrt: np.ndarray, tree: np.ndarray) -> dict[str, Any]:
    ratio = sqrt / tree
    worst = np.flatnonzero(tree == tree.max())
    at = int(worst[np.argmax(ratio[worst])])
    return {
        "mean_ratio": float(ratio.mean()),
        "tree_worst_tau": at + 1,
        "tree_worst_taus": len(worst),
        "ratio_at_tree_worst": float(ratio[at]),
        "ratio_at_T": float(ratio[-1]),
        "max_ratio": float(ratio.max()),
        "sqrt_factor_at_T": float(sqrt[-1]),
        "tree_factor_at_worst": float(tree[at]),
    }


def check_against_mechanism(T: int, sqrt: np.ndarray, tree: np.ndarray) -> float:
    """Largest relative gap between the vectorised factors and noise_factor (a few tau)."""
    ms, mt = continual_mechanism(SQRT, T), continual_mechanism(TREE, T)
    gap = 0.0
    for tau in sorted({1, 2, min(255, T), T // 2 + 1, T}):
        gap = max(gap, abs(ms.noise_factor(tau) / sqrt[tau - 1] - 1))
        gap = max(gap, abs(mt.noise_factor(tau) / tree[tau - 1] - 1))
    return gap


def _draw(
    mech: Any, key: NoiseKey, labels: tuple[int, ...], entries: int
) -> np.ndarray:
    term = NoiseTerm(labels, 1.0)
    g = GaussianNoise(
        key=mech.key(key, CODE, term), sigma=1.0, length=entries, dim=1, tile_size=TILE
    )
    return g.dense().ravel()


def sampled(T: int, entries: int, seed: int) -> dict[str, Any]:
    """The keyed noise of every epoch / node, combined by the rows of L; sample stds."""
    key = NoiseKey.insecure_from_seed(seed)
    out: dict[str, Any] = {
        "entries": entries,
        "tolerance_6se": 6 / math.sqrt(2 * entries),
    }
    stds = {}
    for name in (SQRT, BLT, TREE):
        mech = fit_blt(T) if name == BLT else continual_mechanism(name, T)
        L, _ = mech.factors()
        if name != TREE:
            labels = [(s,) for s in range(1, T + 1)]
        else:
            labels = [
                (j, q) for j in range(tree_levels(T)) for q in range(1, (T >> j) + 1, 2)
            ]
        Z = np.stack([_draw(mech, key, lab, entries) for lab in labels])
        # (T, entries): release tau's noise in units of the mechanism's sigma
        noise = L @ Z
        std = noise.std(axis=1) * mech.sensitivity_factor  # in one-shot sigmas
        exact = np.array([mech.noise_factor(t) for t in range(1, T + 1)])
        out[name] = {
            "max_abs_std_error": float(np.max(np.abs(std / exact - 1))),
            "mean_std_error": float(np.mean(std / exact - 1)),
        }
        # the release function itself gives the same noise as the L-combination
        gaps = []
        for tau in (min(255, T), T):
            direct = mechanism_noise(
                mech, key, CODE, tau, sigma=1.0, shape=(entries, 1), tile_size=TILE
            ).ravel()
            gaps.append(float(np.max(np.abs(direct - noise[tau - 1]))))
        out[name]["max_gap_release_vs_L_combination"] = max(gaps)
        stds[name] = std
    out["summary"] = summary(stds[SQRT], stds[TREE])
    out["summary_blt"] = summary(stds[BLT], stds[TREE])
    return out


def cost(T: int, repeat: int) -> dict[str, Any]:
    """Time of mechanism_noise for a 10000 x 500 Spectral-LRF stream's Y and Z."""
    key = NoiseKey.insecure_from_seed(1)
    shapes = {"Y": (10000, 25), "Z": (500, 100)}
    out: dict[str, Any] = {"shapes": {k: list(v) for k, v in shapes.items()}}
    for name in (SQRT, TREE):
        mech = continual_mechanism(name, T)
        for tau in (min(255, T), T):
            best = math.inf
            for _ in range(repeat):
                t0 = time.perf_counter()
                for code, shape in enumerate(shapes.values(), start=CODE):
                    mechanism_noise(
                        mech, key, code, tau, sigma=1.0, shape=shape, tile_size=TILE
                    )
                best = min(best, time.perf_counter() - t0)
            out[f"{name}@{tau}_s"] = best
    blt = fit_blt(T)
    buffers = {k: [np.zeros(v) for _ in blt.theta] for k, v in shapes.items()}
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        for code, (k, shape) in enumerate(shapes.items(), start=CODE):
            term = NoiseTerm((T,), 1.0)
            z = GaussianNoise(
                key=blt.key(key, code, term), sigma=1.0, length=shape[0],
                dim=shape[1], tile_size=TILE,
            ).dense()  # fmt: skip
            blt_noise(blt, buffers[k], z)
            buffers[k] = blt_advance(blt, buffers[k], z)
        best = min(best, time.perf_counter() - t0)
    out[f"{BLT}-buffered@any_s"] = best
    floats = sum(a * b for a, b in shapes.values())
    out["state_bytes_running_sum"] = 8 * floats
    out["state_bytes_blt"] = 8 * floats * (1 + len(blt.theta))
    out["state_bytes_tree_max"] = 8 * floats * tree_levels(T)
    for tau in (min(255, T), T):
        out[f"time_ratio_sqrt_over_tree@{tau}"] = (
            out[f"{SQRT}@{tau}_s"] / out[f"{TREE}@{tau}_s"]
        )
        out[f"time_ratio_blt_buffered_over_tree@{tau}"] = (
            out[f"{BLT}-buffered@any_s"] / out[f"{TREE}@{tau}_s"]
        )
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Continual release: noise std of the square-root factorization over the tree's",
        "",
        "Per-entry noise std at tau in units of the one-shot sigma of the same (epsilon, delta).",
        "",
        (
            "| T | mean over tau of sqrt/tree | tree's worst tau | ratio there | "
            "ratio at T | sqrt std at T | tree std at worst tau |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for T, r in res["exact"].items():
        lines.append(
            f"| {T} | {r['mean_ratio']:.4f} | {r['tree_worst_tau']} | "
            f"{r['ratio_at_tree_worst']:.4f} | {r['ratio_at_T']:.4f} | "
            f"{r['sqrt_factor_at_T']:.4f} | {r['tree_factor_at_worst']:.4f} |"
        )
    lines += [
        "",
        "3-buffer BLT fitted to T (its noise std over the square root's and the tree's):",
        "",
        (
            "| T | max over sqrt max | mean over sqrt mean | largest ratio to sqrt | "
            "mean over tau of blt/tree | ratio at the tree's worst tau | fit (s) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for T, r in res["exact"].items():
        b = r["blt"]
        lines.append(
            f"| {T} | {b['max_over_sqrt_max']:.4f} | {b['mean_over_sqrt_mean']:.4f} | "
            f"{b['largest_ratio_to_sqrt']:.4f} | {b['vs_tree']['mean_ratio']:.4f} | "
            f"{b['vs_tree']['ratio_at_tree_worst']:.4f} | {b['fit_s']:.1f} |"
        )
    s = res.get("sampled")
    if s:
        m = s["summary"]
        lines += [
            "",
            (
                f"Sampled (T = 366, {s['entries']} entries per release, real keyed "
                f"noise): mean ratio {m['mean_ratio']:.4f}, at tau = "
                f"{m['tree_worst_tau']} {m['ratio_at_tree_worst']:.4f}; largest "
                f"|sample std / exact - 1| {s[SQRT]['max_abs_std_error']:.4f} (sqrt), "
                f"{s[BLT]['max_abs_std_error']:.4f} (blt), "
                f"{s[TREE]['max_abs_std_error']:.4f} (tree), 6 standard errors = "
                f"{s['tolerance_6se']:.4f}. BLT over the tree, sampled: mean "
                f"{s['summary_blt']['mean_ratio']:.4f}, at tau = "
                f"{s['summary_blt']['tree_worst_tau']} "
                f"{s['summary_blt']['ratio_at_tree_worst']:.4f}."
            ),
        ]
    c = res.get("cost")
    if c:
        lines += [
            "",
            "Cost at T = 366 (Y 10000 x 25, Z 500 x 100; best of repeats):",
            "",
        ]
        lines += [f"* {k}: {v:.4g}" for k, v in c.items() if isinstance(v, float | int)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--entries", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    horizons = (366,) if args.quick else (366, 4096, 2**20)
    res: dict[str, Any] = {"benchmark": "bench_continual_noise", "exact": {}}
    for T in horizons:
        sq, tr = exact_factors(T)
        res["exact"][T] = summary(sq, tr) | {
            "check_gap": check_against_mechanism(T, sq, tr),
            "blt": blt_exact(T, sq, tr),
        }
    entries = 4000 if args.quick else args.entries
    res["sampled"] = sampled(366, entries, args.seed)
    res["cost"] = cost(366, 1 if args.quick else args.repeat)
    tag = "_quick" if args.quick else ""
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"continual_noise{tag}.json"), "w") as f:
        json.dump(res, f, indent=2)
    md = markdown(res)
    with open(os.path.join(args.out, f"continual_noise{tag}.md"), "w") as f:
        f.write(md)
    print(md)
    return res


if __name__ == "__main__":
    main()
