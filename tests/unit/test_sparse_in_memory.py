"""In-memory scipy.sparse input against the same matrix as a numpy array.

The in-memory sparse source orthonormalises its tall sketch by CholeskyQR2
where the sketch's Gram matrix is well-conditioned, Householder QR otherwise
(pipeline.linalg.core.cholesky_qr2); a dense input keeps Householder QR. Both
are QR factorizations of the same Y to O(m t u), so the releases agree to the
chunking-invariance bound (rtol 1e-10, docs/sparse.md) on both branches.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import pipeline
from pipeline.algorithms.base import ArraySource
from pipeline.linalg.core import cholesky_qr2

#: two QR factorizations of one Y, both backward stable: U, V agree to O(m t u
#: kappa) and S to O(m t u) relative; 1e-10 is the chunking-invariance bound
RTOL = 1e-10


def _sparse(rng: np.random.Generator, rank: int | None) -> sp.csr_matrix:
    x = sp.random(400, 120, density=0.05, format="csr", rng=rng)
    x.data = rng.standard_normal(x.nnz)
    if rank is not None:  # rank < t: the sketch is rank-deficient
        x = sp.csr_matrix(x[:, :rank] @ sp.csr_matrix(rng.standard_normal((rank, 120))))
    return x


@pytest.mark.parametrize("rank", [None, 3], ids=["full-rank", "rank-3"])
def test_sparse_in_memory_release_equals_dense(
    rng: np.random.Generator, rank: int | None
) -> None:
    x = _sparse(rng, rank)
    # which QR runs: CholeskyQR2 (accepted) on a full-rank Y, Householder on a
    # rank-deficient one (the negative control: the branch is really taken)
    Y = np.asarray(x @ rng.standard_normal((120, 20)))
    assert (cholesky_qr2(Y) is None) == (rank is not None)
    Q = ArraySource(x).tall_qr(Y)
    np.testing.assert_allclose(Q.T @ Q, np.eye(20), rtol=0, atol=1e-12)
    if rank is None:  # the range of Y, to O(m t u) relative
        np.testing.assert_allclose(
            Q @ (Q.T @ Y), Y, rtol=0, atol=1e-12 * np.abs(Y).max()
        )
    for kw in (
        {"private": False},
        {"epsilon": 1.0, "delta": 1e-6, "insecure_noise_seed": 5},
    ):
        a = pipeline.factorize(x, 2, seed=3, dataset="sparse", **kw)
        b = pipeline.factorize(x.toarray(), 2, seed=3, dataset="dense", **kw)
        for got, want in ((a.S, b.S), (a.U, b.U), (a.V, b.V)):
            np.testing.assert_allclose(
                got, want, rtol=RTOL, atol=RTOL * np.abs(want).max()
            )


def test_the_pass_makes_s_once_and_the_basis_takes_it(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-memory sparse input generates the sparse sign S once: the pass's
    block of S serves S^T Q after it (the same float64 block: the same bits as
    making it again, which the negative control does)."""
    from pipeline.sketches.sparse import SparseSignOperator

    x = _sparse(rng, None)
    made: list[tuple[int, int]] = []
    original = SparseSignOperator.left_block

    def counting(
        self: SparseSignOperator, start: int, stop: int, dtype: type = np.float64
    ) -> object:
        made.append((start, stop))
        return original(self, start, stop, dtype)

    monkeypatch.setattr(SparseSignOperator, "left_block", counting)
    once = pipeline.factorize(x, 2, seed=3, private=False)
    assert made == [(0, 400)]
    # negative control: a source that keeps nothing makes S a second time
    monkeypatch.setattr(
        ArraySource, "_left", lambda self, op, y: op.left(y, 0, op.length)
    )
    made.clear()
    twice = pipeline.factorize(x, 2, seed=3, private=False)
    assert made == [(0, 400), (0, 400)]
    for got, want in ((once.S, twice.S), (once.U, twice.U), (once.V, twice.V)):
        np.testing.assert_array_equal(got, want)
