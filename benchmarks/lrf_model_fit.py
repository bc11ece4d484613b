"""The simulations behind the public error model of the one-pass private release.

Usage::

    python benchmarks/lrf_model_fit.py                       # 20000 x 400 and 4000 x 2000
    python benchmarks/lrf_model_fit.py --shapes 20000x400 --epsilons 2 4 16 \
        --sizes 40:160 100:200 160:320 --weights 0.8 0.9 0.95

For each shape, epsilon, sizes (t, v) and range weight w it releases a strong rank-5
signal (random sign factors, singular values 1 .. 0.4, plus a uniform background,
scaled to entries in [-1, 1]; unit entry, C = 1, delta = 1e-6) with Spectral-LRF in
memory (``pipeline.algorithms.lrf.run_lrf`` on an ``ArraySource``, the denoised
range basis), and prints the median over 3 noise draws of its additive spectral
error ``||A - U S V^T||_2 - sigma_{k+1}`` over that of the full-matrix Gaussian
mechanism (``A + N(0, (s Delta_F)^2)`` per entry, truncated SVD), next to the
model's ratio (:func:`pipeline.algorithms.lrf.model.sketch_ratio`).
``pipeline/algorithms/lrf/model.py`` states the constants fitted from these rows
(``C_CORANGE``, ``KAPPA_ONE_PASS``) and the split rule they support. Noise comes
from seeded test-only keys, so a run is reproducible. No timing here.

``--noise-factors F ...`` instead checks the model above the one-shot noise (a
continual release carries ``f`` times it, model.py "Noise above the one-shot
release's") on the stream benchmark's matrices (bench_stream_mechanism.py:
bench_utility's 10000 x 500 low-rank matrix, k = 5, and the real source
bag-of-words, k = 8; unit entry, epsilon = 2): for each ``f``, the one-shot
release's plan with every sigma times ``f`` (``plan_stream`` of one epoch with
sensitivity factor ``f``), with the one-shot split and with the split the model
gives at ``f``, measured and predicted::

    python benchmarks/lrf_model_fit.py --noise-factors 1.69 2.87 --draws 3
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK = 5
DELTA = 1e-6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["20000x400", "4000x2000"])
    p.add_argument("--epsilons", type=float, nargs="+", default=[4.0])
    p.add_argument("--sizes", nargs="+", default=["40:160", "128:256", "160:320"],
                   help="t:v pairs")  # fmt: skip
    p.add_argument("--weights", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9, 0.95])
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--noise-factors", type=float, nargs="+", default=None,
                   help="check the split above the one-shot noise instead")  # fmt: skip
    return p.parse_args(argv)


def signal(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """A strong rank-5 signal with bounded entries (unit entry, C = 1)."""
    U = rng.choice([-1.0, 1.0], size=(m, RANK))
    V = rng.choice([-1.0, 1.0], size=(n, RANK))
    A = (U * np.array([1.0, 0.8, 0.6, 0.5, 0.4])) @ V.T
    A += 0.05 * rng.uniform(-1.0, 1.0, size=(m, n))
    return A / np.abs(A).max()


def additive_error(A: np.ndarray, U: np.ndarray, s: np.ndarray, V: np.ndarray, tail: float) -> float:
    return float(np.linalg.norm(A - (U * s) @ V.T, 2)) - tail


def full_gm_error(A: np.ndarray, eps: float, tail: float, seed: int) -> float:
    from pipeline.accounting.gaussian import gaussian_noise_multiplier

    noisy = A + np.random.default_rng(seed).normal(
        scale=gaussian_noise_multiplier(eps, DELTA), size=A.shape
    )
    U, s, Vt = np.linalg.svd(noisy, full_matrices=False)
    return additive_error(A, U[:, :RANK], s[:RANK], Vt[:RANK].T, tail)


def one_pass_error(A: np.ndarray, eps: float, t: int, v: int, w: float, tail: float, seed: int) -> tuple[float, float]:
    """(measured error, model ratio) of one Spectral-LRF release."""
    from pipeline.algorithms.base import ArraySource, ReleaseHooks
    from pipeline.algorithms.lrf import model as lrf_model
    from pipeline.algorithms.lrf import plan_lrf, run_lrf
    from pipeline.mechanisms.noise import NoiseKey
    from pipeline.params import LrfParams

    params = LrfParams.of(
        RANK, epsilon=eps, delta=DELTA, unit="entry", algorithm="spectral",
        sketch_size=t, core_size=v, range_weight=w,
    )  # fmt: skip
    plan = plan_lrf(params, A.shape)
    f = run_lrf(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=1000 + seed, noise_key=NoiseKey.insecure_from_seed(seed)),
    )
    return additive_error(A, f.U, f.S, f.V, tail), lrf_model.predict(plan).ratio


def noisy_error(A: np.ndarray, k: int, f: float, split_f: float, seed: int) -> tuple[float, float, float]:
    """(measured error, weight, model error) of one release at ``f`` times the one-shot noise."""
    from pipeline.algorithms.base import ArraySource, ReleaseHooks
    from pipeline.algorithms.continual import StreamUnit, plan_stream
    from pipeline.algorithms.lrf import model as lrf_model
    from pipeline.algorithms.lrf import run_lrf
    from pipeline.mechanisms.noise import NoiseKey
    from pipeline.params import LrfParams

    p = LrfParams.of(k, epsilon=2.0, delta=DELTA, unit="entry", algorithm="spectral")
    plan = plan_stream(p, A.shape, 1, unit=StreamUnit.ENTRY, sensitivity_factor=f,
                       noise_factor=split_f).lrf  # fmt: skip
    out = run_lrf(ArraySource(A), plan,
                  ReleaseHooks(sketch_seed=1000 + seed, noise_key=NoiseKey.insecure_from_seed(seed)))  # fmt: skip
    model = lrf_model.predict(plan, noise_factor=f).error
    return additive_error(A, out.U, out.S, out.V, 0.0), float(plan.range_weight), model


def noise_factor_rows(args: argparse.Namespace) -> None:
    import bench_stream_mechanism as bsm
    from bench_utility import make_matrix

    synth = make_matrix("low-rank", "entry", 10000, 500, bsm.K, bsm.C, np.random.default_rng(7))
    real = bsm.real_matrix("source_bow", "entry", bsm.C)
    real = np.ascontiguousarray(real[:: max(1, -(-real.shape[0] // 10000))])
    print("| matrix | f | split for | w | measured error | model |")
    print("|---|---|---|---|---|---|")
    for name, A, k in (("low-rank", synth, bsm.K), ("source_bow", real, bsm.REAL_K)):
        tail = float(np.linalg.svd(A, compute_uv=False)[k])
        for f in args.noise_factors:
            for label, split_f in (("one shot", 1.0), ("f", f)):
                runs = [noisy_error(A, k, f, split_f, s) for s in range(args.draws)]
                err = float(np.median([r[0] for r in runs])) - tail
                print(f"| {name} {A.shape[0]} x {A.shape[1]} | {f:g} | {label} | "
                      f"{runs[0][1]:.3f} | {err:.1f} | {runs[0][2]:.1f} |", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.noise_factors:
        noise_factor_rows(args)
        return 0
    print("| m x n | eps | t | v | w | measured / full GM | model |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        m, n = (int(x) for x in shape.split("x"))
        A = signal(m, n, np.random.default_rng(0))
        tail = float(np.linalg.svd(A, compute_uv=False)[RANK])
        for eps in args.epsilons:
            gm = np.median([full_gm_error(A, eps, tail, s) for s in range(args.draws)])
            for size in args.sizes:
                t, v = (int(x) for x in size.split(":"))
                for w in args.weights:
                    runs = [one_pass_error(A, eps, t, v, w, tail, s) for s in range(args.draws)]
                    measured = float(np.median([r[0] for r in runs])) / gm
                    print(f"| {m} x {n} | {eps:g} | {t} | {v} | {w:g} | {measured:.3f} | {runs[0][1]:.3f} |",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
