"""The dense band kernel on one thread: the two-pass release's two per-band steps.

Usage::

    python benchmarks/bench_band_kernel.py --repeat 7 --out benchmarks/results/band_kernel.json

One band of the README's benchmark store's shape (10000 x 1000 float32, rows of
norms around and above the clip norm, so some rows are clipped), one BLAS thread
(as a dplr worker runs), the minimum over ``--repeat`` runs after a warm-up:

* ``pass1``  ``block_partials`` of the first pass's request (row unit, C = 1, the
  sparse sign ``S`` of v = 100 rows, zeta = 8: ``Z = S X``);
* ``pass2``  the second pass's (``Y = X V_k``, k = 10);
* ``pass1_one_piece``, ``pass2_one_piece``: the same with the whole band as one
  piece (``PIECE_BYTES`` above the band's float64 size): what the pieces save;
* the floor: the products alone on the prepared float64 band held in memory --
  ``S X`` through scipy's CSC x dense product, the same ``S`` as a dense matrix
  through BLAS (another summation order), and ``X V_k``;
* ``cast``: ``astype(float64)`` of the whole band, for scale.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def best_ms(f: Callable[[], Any], repeat: int) -> float:
    """Minimum wall time of ``f`` over ``repeat`` runs after one warm-up, in ms."""
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return round(1e3 * min(times), 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import numpy as np
    from threadpoolctl import threadpool_limits

    from pipeline.params import ClipSpec, PrivacyUnit
    from pipeline.sketches import apply
    from pipeline.sketches.apply import PassRequest, block_partials
    from pipeline.sketches.dense import DenseOperator
    from pipeline.sketches.gaussian import OperatorCode
    from pipeline.sketches.sparse import SparseSignOperator

    threadpool_limits(1)
    n, d = args.rows, args.cols
    rng = np.random.default_rng(0)
    band = (rng.standard_normal((n, d)) * rng.choice([0.01, 0.05], size=(n, 1))).astype(
        np.float32
    )
    clip = ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0)
    S = SparseSignOperator(root=1, code=OperatorCode.S_SPARSE, length=n, dim=100)
    V = DenseOperator(np.linalg.qr(rng.standard_normal((d, 10)))[0])
    req1 = PassRequest(transpose=False, clip=clip, left=(("Z", S),))
    req2 = PassRequest(transpose=False, clip=clip, right=(("Y", V),))
    r = args.repeat
    out: dict[str, Any] = {"band": [n, d], "piece_rows": apply.piece_rows(d)}
    ms: dict[str, float] = {}
    ms["pass1"] = best_ms(lambda: block_partials(band, 0, 0, req1), r)
    ms["pass2"] = best_ms(lambda: block_partials(band, 0, 0, req2), r)
    piece = apply.PIECE_BYTES
    apply.PIECE_BYTES = 8 * n * d + 1
    try:
        ms["pass1_one_piece"] = best_ms(lambda: block_partials(band, 0, 0, req1), r)
        ms["pass2_one_piece"] = best_ms(lambda: block_partials(band, 0, 0, req2), r)
    finally:
        apply.PIECE_BYTES = piece
    x = band.astype(np.float64)
    g_t = S.left_block(0, n)
    g_dense = g_t.toarray()
    ms["floor_SX_scipy"] = best_ms(lambda: g_t @ x, r)
    ms["floor_SX_dense_blas"] = best_ms(lambda: g_dense @ x, r)
    ms["floor_XV"] = best_ms(lambda: x @ V.matrix, r)
    ms["cast"] = best_ms(lambda: band.astype(np.float64), r)
    out["ms"] = ms
    out["ratios"] = {
        "pass1 / (S X scipy)": round(ms["pass1"] / ms["floor_SX_scipy"], 2),
        "pass2 / (X V)": round(ms["pass2"] / ms["floor_XV"], 2),
        "pass1 / one piece": round(ms["pass1"] / ms["pass1_one_piece"], 2),
        "pass2 / one piece": round(ms["pass2"] / ms["pass2_one_piece"], 2),
    }
    out["machine"], out["versions"] = C.machine(), C.versions()
    for k, v in ms.items():
        print(f"{k:>22}: {v:7.2f} ms")
    for k, v in out["ratios"].items():
        print(f"{k:>22}: {v:.2f}")
    if args.out:
        C.dump_json(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
