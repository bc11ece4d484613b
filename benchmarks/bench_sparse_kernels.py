"""One band's partial statistics, sparse (CSR) against the same band densified.

Times :func:`~pipeline.sketches.apply.block_partials` and the PCA band kernels
(:func:`~pipeline.algorithms.pca.band_pass`) on one CSR band and on its
``toarray()``, side by side in one run (best of ``--repeat``), and prints the
ratios. Then the sparse sign products alone, on the operator's block (its
generation not timed): scipy's sparse-sparse product, densified, against
:func:`~pipeline.sketches.sparse_band.sign_left` / ``sign_right``, which write the
dense result directly (interleaved runs, and whether their bits agree). A
measurement, not a test: these machines are noisy.

    python benchmarks/bench_sparse_kernels.py --rows 10000 --cols 2000 --density 0.01
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from pipeline.algorithms.pca import band_pass
from pipeline.mechanisms.clipping import ClipSpec
from pipeline.params import PrivacyUnit
from pipeline.sketches import GaussianOperator, OperatorCode, SparseSignOperator
from pipeline.sketches.apply import PassRequest, block_partials
from pipeline.sketches.dense import DenseOperator
from pipeline.sketches.sparse_band import sign_left, sign_right


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--cols", type=int, default=2_000)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    m, n = args.rows, args.cols
    rng = np.random.default_rng(0)
    x = sp.random(m, n, density=args.density, format="csr", rng=rng)
    dense = x.toarray()
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)
    t, v = 20, 121
    phi = GaussianOperator(root=1, code=OperatorCode.PHI, length=n, dim=t)
    s_sp = SparseSignOperator(root=1, code=OperatorCode.S_SPARSE, length=m, dim=v)
    s_g = GaussianOperator(root=1, code=OperatorCode.S, length=m, dim=v)
    vk = DenseOperator(np.linalg.qr(rng.standard_normal((n, 10)))[0])
    X = np.linalg.qr(rng.standard_normal((n, 10)))[0]
    cases: dict[str, Callable[[Any], Any]] = {
        "X Phi (Gaussian, t=20)": lambda a: block_partials(
            a, 0, 0, PassRequest(transpose=False, clip=clip, right=(("y", phi),))
        ),
        "S X (sparse sign, v=121)": lambda a: block_partials(
            a, 0, 0, PassRequest(transpose=False, clip=clip, left=(("z", s_sp),))
        ),
        "S X (Gaussian, v=121)": lambda a: block_partials(
            a, 0, 0, PassRequest(transpose=False, clip=clip, left=(("z", s_g),))
        ),
        "X V_k (k=10)": lambda a: block_partials(
            a, 0, 0, PassRequest(transpose=False, clip=clip, right=(("y", vk),))
        ),
        "PCA Gram X^T X": lambda a: band_pass(a, "gram", None, 1.0, True),
        "PCA update X^T clip(X B) (k=10)": lambda a: band_pass(
            a, "update", (X, [(np.eye(10), 0.5)]), 1.0, True
        ),
    }
    print(
        f"band {m} x {n}, density {args.density}, nnz {x.nnz}, {args.threads} thread(s)"
    )
    print(f"{'kernel':34s} {'dense s':>9s} {'sparse s':>9s} {'dense/sparse':>12s}")
    with threadpool_limits(args.threads):
        for name, fn in cases.items():
            fn(x)  # warm-up: operator generation caches, allocations
            fn(dense)
            td = best(lambda fn=fn: fn(dense), args.repeat)
            ts = best(lambda fn=fn: fn(x), args.repeat)
            print(f"{name:34s} {td:9.4f} {ts:9.4f} {td / ts:12.1f}")
        sign_products(x, s_sp, v, args.repeat)


def sign_products(x: Any, s_sp: SparseSignOperator, v: int, repeat: int) -> None:
    """Sparse-sparse products against the direct sparse sign kernels."""
    m, n = x.shape
    g_t = s_sp.left_block(0, m)
    right_op = SparseSignOperator(root=1, code=OperatorCode.T, length=n, dim=v)
    cols, vals = right_op.structure(0, n)
    g_r = right_op.left_block(0, n).T.tocsr()
    pairs = {
        f"S X (sparse sign, v={v})": (
            lambda: np.asarray((g_t.asformat("csr") @ x).toarray()),
            lambda: sign_left(g_t, x),
        ),
        f"X G (sparse sign, d={v})": (
            lambda: np.asarray((x @ g_r).toarray()),
            lambda: sign_right(cols, vals, x, v),
        ),
    }
    print(
        f"{'product alone':34s} {'sp x sp s':>9s} {'direct s':>9s} {'ratio':>12s} bits"
    )
    for name, (old, new) in pairs.items():
        times = {"old": np.inf, "new": np.inf}
        for _ in range(repeat):
            times["old"] = min(times["old"], best(old, 1))
            times["new"] = min(times["new"], best(new, 1))
        same = bool(np.array_equal(old(), new()))
        print(
            f"{name:34s} {times['old']:9.4f} {times['new']:9.4f} "
            f"{times['old'] / times['new']:12.1f} {'equal' if same else 'differ'}"
        )


if __name__ == "__main__":
    main()
