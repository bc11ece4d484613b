"""The defaults of the two-pass factorization: budget share w_Z and co-range size v.

Additive spectral error ``||A - U S V^T||_2 - ||A - A_k||_2`` of the two-pass
release over that of the full-matrix Gaussian mechanism (``A + N(0, (s
Delta_F)^2)`` per entry, truncated SVD), median over noise draws, in memory.

The matrix has a strong rank-k signal with bounded entries (random signs, so
``max |a_ij| <= 1`` with the entry unit and C = 1), on a weak dense background.

Run: ``python benchmarks/two_pass_defaults.py [--draws 5]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from pipeline.accounting.gaussian import gaussian_noise_multiplier
from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf.two_pass import plan_two_pass, run_two_pass
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import LrfParams


def strong_low_rank(m: int, n: int, k: int, seed: int) -> np.ndarray:
    """Rank-k signal of random signs with decaying weights, max |entry| <= 1."""
    rng = np.random.default_rng(seed)
    w = np.linspace(1.0, 0.4, k)
    U = rng.choice([-1.0, 1.0], size=(m, k))
    V = rng.choice([-1.0, 1.0], size=(n, k))
    A = (U * w) @ V.T / w.sum() * 0.9 + 0.1 * rng.uniform(-1, 1, size=(m, n))
    return np.clip(A, -1.0, 1.0)


def additive_error(A: np.ndarray, U: np.ndarray, S: np.ndarray, V: np.ndarray, tail: float) -> float:
    return float(np.linalg.norm(A - (U * S) @ V.T, 2) - tail)


def full_gm(A: np.ndarray, k: int, sigma: float, seed: int) -> tuple[np.ndarray, ...]:
    noisy = A + np.random.default_rng(seed).normal(scale=sigma, size=A.shape)
    u, s, vt = np.linalg.svd(noisy, full_matrices=False)
    return u[:, :k], s[:k], vt[:k].T


def two_pass(A: np.ndarray, k: int, eps: float, delta: float, v: int, w: float, seed: int) -> tuple[np.ndarray, ...]:
    params = LrfParams.of(k, epsilon=eps, delta=delta, algorithm="two-pass", unit="entry", core_size=v)
    plan = plan_two_pass(params, A.shape, weight_z=w)
    f = run_two_pass(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=seed, noise_key=NoiseKey.insecure_from_seed(seed)),
    )
    return f.U, f.S, f.V


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", type=int, nargs=2, default=(4000, 500))
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--epsilon", type=float, nargs="+", default=(1.0, 4.0))
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--v", type=int, nargs="+", default=(20, 45, 100, 200))
    ap.add_argument("--w", type=float, nargs="+", default=(0.1, 0.15, 0.2, 0.3))
    args = ap.parse_args()
    m, n = args.shape
    k = args.rank
    A = strong_low_rank(m, n, k, seed=0)
    sv = np.linalg.svd(A, compute_uv=False)
    tail = float(sv[k])
    print(f"A {m}x{n}, rank {k}, sigma_1..k+1 = {np.round(sv[: k + 1], 1).tolist()}")
    for eps in args.epsilon:
        sigma = gaussian_noise_multiplier(eps, args.delta)  # Delta_F = C = 1 (entry unit)
        gm = [additive_error(A, *full_gm(A, k, sigma, 1000 + d), tail) for d in range(args.draws)]
        ref = float(np.median(gm))
        print(f"\nepsilon={eps:g}: full GM additive error (median) {ref:.2f}")
        print("w_Z  " + "  ".join(f"v={v:<5d}" for v in args.v))
        for w in args.w:
            cells = []
            for v in args.v:
                errs = [
                    additive_error(A, *two_pass(A, k, eps, args.delta, v, w, 2000 + d), tail)
                    for d in range(args.draws)
                ]
                cells.append(f"{np.median(errs) / ref:7.3f}")
            print(f"{w:<4g} " + "  ".join(cells))


if __name__ == "__main__":
    main()
