"""Non-private sparse factorization against scikit-learn, in memory, one process.

The anchor a user would pick for a truncated SVD of a ``scipy.sparse`` matrix is
scikit-learn: ``sklearn.utils.extmath.randomized_svd`` and
``sklearn.decomposition.TruncatedSVD``, each with its defaults (randomized, 10
oversamples; ``n_iter="auto"`` = 7 power iterations for k < 0.1 min(m, n), and
``n_iter=5``). Against them, on the same CSR matrix in memory:
``pipeline.factorize(X, k, private=False)`` (non-private Spectral-LRF, one pass,
its default sizes and sparse sign co-range operator).

For each matrix, the methods run in turn ``--repeat`` times (interleaved, BLAS on
``--blas-threads`` threads for all of them); the table gives the best time of each
and dplr's time over it (the target: <= 0.5 against each scikit-learn method),
and the accuracy of its rank-k approximation
``A_hat = U diag(S) V^T`` (TruncatedSVD: ``fit_transform`` gives ``U diag(S)``, so
``A_hat = A V V^T``) against the best rank-k approximation ``A_k``:

* spectral: ``||A - A_hat||_2 / sigma_{k+1}`` (ARPACK on the implicit residual);
* Frobenius: ``||A - A_hat||_F / ||A - A_k||_F`` (exact traces; ``A_k`` from
  ``scipy.sparse.linalg.svds``).

Matrices: ``random`` (``--rows`` x ``--cols``, ``--density`` uniform positions,
N(0, 1) values: a flat spectrum, the hardest case for a sketch) and
``tfidf_docs`` (the real TF-IDF of ``sparse_real_data.py``, 42724 x 1000).

    python benchmarks/bench_sparse_sklearn.py
    python benchmarks/bench_sparse_sklearn.py --matrices random --rows 50000 --cols 20000 --density 0.002

A measurement, not a test; writes ``benchmarks/results/sparse_sklearn.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from threadpoolctl import threadpool_limits

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common as C

import pipeline


def random_matrix(m: int, n: int, density: float, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    x = sp.random(m, n, density=density, format="csr", rng=rng)
    x.data = rng.standard_normal(x.nnz)
    return x


def methods(k: int) -> dict[str, Any]:
    """name -> f(X) returning (U, S, V) of a rank-k approximation."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.utils.extmath import randomized_svd

    def dplr(X: Any) -> Any:
        f = pipeline.factorize(X, k, private=False)
        return f.U, f.S, f.V

    def rsvd(X: Any) -> Any:
        U, S, Vt = randomized_svd(X, k, random_state=0)
        return U, S, Vt.T

    def tsvd(X: Any) -> Any:
        t = TruncatedSVD(k, random_state=0)
        US = t.fit_transform(X)
        return US, np.ones(k), t.components_.T

    return {
        "dplr factorize, non-private": dplr,
        "sklearn randomized_svd": rsvd,
        "sklearn TruncatedSVD": tsvd,
    }


def spectral_residual(X: Any, U: Any, S: Any, V: Any) -> float:
    m, n = X.shape
    US = U * S
    op = spla.LinearOperator(
        (m, n),
        matvec=lambda x: X @ x - US @ (V.T @ x),
        rmatvec=lambda y: X.T @ y - V @ (US.T @ y),
        dtype=np.float64,
    )
    return float(spla.svds(op, k=1, return_singular_vectors=False, tol=1e-6)[0])


def frobenius_residual(X: Any, U: Any, S: Any, V: Any) -> float:
    US = U * S
    cross = float(np.sum((X @ V) * US))
    own = float(np.sum((US.T @ US) * (V.T @ V)))
    total = float(X.multiply(X).sum())
    return float(np.sqrt(max(total - 2 * cross + own, 0.0)))


def truth(X: Any, k: int) -> tuple[float, float]:
    """``sigma_{k+1}`` and ``||A - A_k||_F``."""
    s = np.sort(spla.svds(X, k=k + 1, return_singular_vectors=False, tol=1e-10))[::-1]
    total = float(X.multiply(X).sum())
    return float(s[k]), float(np.sqrt(max(total - float(np.sum(s[:k] ** 2)), 0.0)))


def run_matrix(name: str, X: Any, k: int, repeat: int) -> list[dict[str, Any]]:
    fs = methods(k)
    best: dict[str, float] = {}
    out: dict[str, Any] = {}
    for _ in range(repeat):
        for label, f in fs.items():
            t0 = time.perf_counter()
            out[label] = f(X)
            best[label] = min(best.get(label, np.inf), time.perf_counter() - t0)
    tail, frob = truth(X, k)
    rows = []
    for label in fs:
        U, S, V = (np.asarray(a, dtype=np.float64) for a in out[label])
        rows.append(
            {
                "matrix": name,
                "shape": X.shape,
                "nnz": int(X.nnz),
                "method": label,
                "seconds": best[label],
                "ratio": best["dplr factorize, non-private"] / best[label],
                "spectral": spectral_residual(X, U, S, V) / tail,
                "frobenius": frobenius_residual(X, U, S, V) / frob,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        f"`{' '.join(['python benchmarks/bench_sparse_sklearn.py', *sys.argv[1:]])}`",
        "",
        (
            f"{time.strftime('%Y-%m-%d')}; {os.cpu_count()} CPUs, BLAS threads "
            f"{args.blas_threads}, one process; k = {args.rank}; best of {args.repeat} "
            f"(interleaved); wall {wall:.0f} s."
        ),
        "",
        (
            "| matrix | method | seconds | dplr's time / this | "
            "spectral error / sigma_k+1 | Frobenius error / best rank-k's |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, n = r["shape"]
        dens = r["nnz"] / (m * n)
        lines.append(
            f"| {r['matrix']} {m} x {n}, density {dens:.2g} | {r['method']} | "
            f"{r['seconds']:.3f} | {r['ratio']:.2f} | {r['spectral']:.3f} | "
            f"{r['frobenius']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrices", nargs="+", default=["random", "tfidf_docs"])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--cols", type=int, default=2_000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--blas-threads", type=int, default=1)
    p.add_argument("--name", default="sparse_sklearn")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with threadpool_limits(limits=args.blas_threads):
        for name in args.matrices:
            if name == "random":
                X = random_matrix(args.rows, args.cols, args.density, 0)
            else:
                import sparse_real_data

                X = sparse_real_data.load_sparse_real(name, cache_dir=C.WORK)["A"]
            rows += run_matrix(name, X, args.rank, args.repeat)
            print(markdown(rows, args, time.perf_counter() - t0), flush=True)
    text = markdown(rows, args, time.perf_counter() - t0)
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, f"{args.name}.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
