"""Secrets and the post-processing of released PCA statistics.

Problem. Exact aggregates must not leak and post-processing must read released
values only (spec power-pca 1.4, rule 3): :class:`Secret` wraps an exact
aggregate (redacted ``repr``, refuses to be pickled); ``sym``, ``topk_eig``,
``eig_floor_inv_sqrt`` and ``qr_pos`` accept released arrays and refuse a
``Secret``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from pipeline._types import FloatArray


# --------------------------------------------------------------------------
# Exact aggregates
# --------------------------------------------------------------------------
class Secret:
    """An exact, non-private aggregate (e.g. ``A^T A``): usable, never shown.

    Its ``repr`` is redacted and it refuses to be pickled, so it cannot reach a
    log, an exception message, a file or a worker by accident (spec 1.4, rule 3).
    Only the mechanisms of :func:`run_pca` read :attr:`value`.
    """

    __slots__ = ("_value",)

    def __init__(self, value: FloatArray) -> None:
        self._value = value

    @property
    def value(self) -> FloatArray:
        return self._value

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value.shape)

    def __repr__(self) -> str:
        return f"Secret(<redacted>, shape={self.shape})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("exact aggregates are not serialisable; release them first.")


def released(x: Any, name: str) -> FloatArray:
    """Guard for post-processing functions: they accept released values only."""
    if isinstance(x, Secret):
        raise TypeError(
            f"{name} must be a released (noisy) value; got an exact aggregate. "
            "Pass it through its Gaussian release first."
        )
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------
# Post-processing (released inputs only)
# --------------------------------------------------------------------------
def sym(G: FloatArray) -> FloatArray:
    """``(G + G^T) / 2``: isotropic noise on symmetric matrices (spec 3.2)."""
    return 0.5 * (G + G.T)


def topk_eig(M: Any, k: int) -> tuple[FloatArray, FloatArray]:
    """Top-k eigenvectors (d, k) and top k+1 eigenvalues of a released symmetric ``M``."""
    M = released(M, "M")
    d = M.shape[0]
    lo = max(d - k - 1, 0)
    lam, Q = scipy.linalg.eigh(M, subset_by_index=[lo, d - 1])
    lam, Q = lam[::-1], Q[:, ::-1]
    return _sign_fix(Q[:, :k]), lam[: k + 1].copy()


def _sign_fix(X: FloatArray) -> FloatArray:
    """Flip columns so the largest-magnitude entry is positive (determinism only)."""
    idx = np.argmax(np.abs(X), axis=0)
    signs: FloatArray = np.sign(X[idx, np.arange(X.shape[1])])
    signs[signs == 0] = 1.0
    return X * signs


def eig_floor_inv_sqrt(H: Any, gamma: float) -> FloatArray:
    """``B = Q diag(max(lambda, gamma))^(-1/2) Q^T`` for the released ``H = Q diag(lambda) Q^T``."""
    H = released(H, "H")
    lam, Q = np.linalg.eigh(H)
    lam = np.maximum(lam, gamma)
    B: FloatArray = (Q / np.sqrt(lam)) @ Q.T
    return B


def qr_pos(Z: Any) -> FloatArray:
    """Orthonormal factor of the reduced QR of a released ``Z``, with ``diag(R) >= 0``."""
    Z = released(Z, "Z")
    Q, R = np.linalg.qr(Z)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs
