"""The post-processing kernels of the private factorizations: noise on the reduced
sketches, range bases, core solves.

They read the noisy sketches only (the noise is added here, once per entry of each
globally reduced sketch) and are shared by the one-pass run
(:mod:`pipeline.algorithms.lrf.run`), the two-pass run
(:mod:`pipeline.algorithms.lrf.two_pass`) and continual release
(:mod:`pipeline.algorithms.continual`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from pipeline._types import FloatArray
from pipeline.algorithms.base import MatrixSource
from pipeline.algorithms.lrf.plan import LrfPlan
from pipeline.linalg.core import (
    core_one_sided,
    core_two_sided,
    orth,
    sign_convention,
)
from pipeline.mechanisms.clipping import clip_rows
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.sketches.operators import SketchOperator

__all__ = [
    "GRAM_MIN_RATIO",
    "ClippedNoise",
    "gram_basis",
    "gram_svd",
    "low_space_post",
    "row_noise",
    "spectral_post",
    "top_singular_vectors",
]


def row_noise(
    noise: GaussianNoise, source: MatrixSource, clip_bound: float | None = None
) -> Callable[[int, FloatArray], FloatArray]:
    """The row-block noise map of a tall sketch, its key sealed for the source's
    tasks; with ``clip_bound`` each row is clipped to that norm first."""
    seal = getattr(source, "seal", None)
    if seal is not None:
        noise = dataclasses.replace(noise, key=seal(noise.key))
    if clip_bound is None:
        return noise.add_to_block
    return ClippedNoise(noise=noise, bound=clip_bound)


@dataclass(frozen=True, slots=True)
class ClippedNoise:
    """``(start, block) -> clip_rows(block, bound) + noise``: a range sketch clipped
    in sketch space, then noised (:func:`clips_range`); cheap to pickle."""

    noise: GaussianNoise
    bound: float

    def __call__(self, start: int, block: FloatArray) -> FloatArray:
        return self.noise.add_to_block(start, clip_rows(block, self.bound))


def _noise(
    plan: LrfPlan,
    key: NoiseKey | None,
    name: str,
    code: NoiseCode,
    length: int,
    dim: int,
) -> GaussianNoise | None:
    if plan.calibration is None or key is None:
        return None
    sigma = plan.sigma(name)
    return GaussianNoise(
        key=key.derive(int(code)),
        sigma=sigma,
        length=length,
        dim=dim,
        tile_size=plan.params.tile_size,
    )


def spectral_post(
    source: MatrixSource,
    plan: LrfPlan,
    exact: dict[str, Any],
    ops: dict[str, SketchOperator],
    key: NoiseKey | None,
) -> tuple[Any, FloatArray, FloatArray]:
    M, N = plan.oriented_shape
    # pop: the noise-free sketches must not outlive the noisy ones (memory, and they
    # are as sensitive as the data)
    Y, Z = exact.pop("Y"), exact.pop("Z")
    ny = _noise(
        plan, key, "Y", NoiseCode.Y, M, plan.t
    )  # [Upa18, Fig. 1, step 3]: Y = A Phi + N_1
    nz = _noise(plan, key, "Z", NoiseCode.Z, N, plan.v)
    if nz is not None:
        Z = Z + nz.dense().T  # Z = S A + N_2, noise tiled along the columns of Z
    if "Y_R" in exact:
        # non-private pass that began the TSQR per block: finish it [spec 3.2, F1]
        Q, SQ = source.finish_local_qr(Y, exact.pop("Y_R"), exact.pop("Y_left"))
        B = None
    else:
        Q, SQ, B = _range_basis(source, plan, Y, ops["S"], ny)
    del Y  # on a cluster the noisy Y may be freed (or unspilled) as soon as Q exists
    W, s, Vx = core_one_sided(SQ, Z, plan.params.rank)  # [spec 3.2, F2]
    signs = sign_convention(Vx)
    W = W * signs if B is None else B @ (W * signs)
    return source.tall_matmul(Q, W), s, Vx * signs  # [spec 3.2, F3]


def low_space_post(
    source: MatrixSource,
    plan: LrfPlan,
    exact: dict[str, Any],
    ops: dict[str, SketchOperator],
    key: NoiseKey | None,
) -> tuple[Any, FloatArray, FloatArray]:
    M, N = plan.oriented_shape
    k, padded = plan.params.rank, plan.params.padded
    Yc, Yr, Z = exact.pop("Yc"), exact.pop("Yr"), exact.pop("Z")
    # [spec 3.3, R1]: explicit noise on Y_c is the paper's sigma_min Phi_bot padding
    # with a SECRET Phi_bot; a public one would leave Y_c noise-free
    nc = _noise(plan, key, "Yc", NoiseCode.Y_C, M, plan.t)
    nr = _noise(plan, key, "Yr", NoiseCode.Y_R, N, plan.t)
    nz = _noise(plan, key, "Z", NoiseCode.Z_CORE, plan.v, plan.v)
    T = ops["T"].dense()  # N x v, regenerated on the client (O(N v))
    if nr is not None and nz is not None:
        Yr = Yr + nr.dense().T
        Z = Z + nz.dense()
    if padded:
        Yr, Z, T = _pad(plan, Yr, Z, T, ops, key)
    U, SU, B = _range_basis(source, plan, Yc, ops["S"], nc)  # [spec 3.3, F1]
    del Yc
    if plan.basis_rank is None:
        V = orth(Yr.T)
    else:  # denoised bases: the top k' singular vectors [private-lrf-2, 4]
        V = top_singular_vectors(Yr.T, plan.basis_rank)
    WL, s, WR = core_two_sided(SU, T.T @ V, Z, k)  # [spec 3.3, F2]
    Vx = V @ WR
    if padded:
        # [spec 3.3, F4]: drop the padding coordinates, re-orthonormalise
        Qv, Rv = np.linalg.qr(Vx[:N])
        P2, s, W2h = np.linalg.svd(s[:, None] * Rv.T)
        WL, Vx = WL @ P2, Qv @ W2h.T
    signs = sign_convention(Vx)
    WL = WL * signs if B is None else B @ (WL * signs)
    return source.tall_matmul(U, WL), s, Vx * signs


#: Smallest ratio ``lambda_r / lambda_1`` of the Gram matrix of a noisy range
#: sketch from which its basis is taken (see :func:`gram_basis`); below it the
#: basis is orthonormalised by TSQR instead.
GRAM_MIN_RATIO = 1e-8


def _range_basis(
    source: MatrixSource,
    plan: LrfPlan,
    Y: Any,
    S: SketchOperator,
    noise: GaussianNoise | None,
) -> tuple[Any, FloatArray, FloatArray | None]:
    """The range basis of the tall ``Y``, after its noise: ``(Q, S^T Q B, B)``.

    The basis is ``Q B`` (``B`` None: ``Q`` itself) and is orthonormal: the top
    ``plan.basis_rank`` left singular vectors of ``Y`` (its whole range when that
    is None) [private-lrf-2, 4]. A private ``Y`` gets its noise, its Gram matrix
    and ``S^T Y`` in one step over its blocks; ``B`` then comes from the Gram
    matrix (:func:`gram_basis`) and ``Q`` is the noisy ``Y`` itself, so no TSQR
    runs. The noise bounds the condition number of ``Y`` from above; if it is
    still too large for the Gram matrix, TSQR on the noisy ``Y`` takes over.
    """
    if noise is not None:
        noise_map = row_noise(noise, source, plan.range_clip_bound)
        Y, gram, SY = source.tall_noise_gram(Y, noise_map, S)
        B = gram_basis(gram, plan.basis_rank)
        if B is not None:
            # S is given, so tall_noise_gram returns S^T Y (None only without op)
            return Y, cast(FloatArray, SY) @ B, B
    if plan.basis_rank is None:
        Q = source.tall_qr(Y)  # [spec 3.2, F1]
        return Q, source.tall_left_sketch(Q, S), None  # v x t, summed over row blocks
    Q, R = source.tall_qr(Y, with_r=True)
    B = top_singular_vectors(R, plan.basis_rank)
    return Q, source.tall_left_sketch(Q, S) @ B, B


def gram_basis(gram: FloatArray, rank: int | None) -> FloatArray | None:
    """``B`` (t, r) such that ``Y B`` holds the top ``r`` left singular vectors of
    ``Y``, from ``gram = Y^T Y`` (post-processing); None when ill-conditioned.

    The first factor of :func:`gram_svd`.

    Examples
    --------
    >>> Y = np.random.default_rng(0).standard_normal((50, 4))
    >>> B = gram_basis(Y.T @ Y, 2)
    >>> np.allclose((Y @ B).T @ (Y @ B), np.eye(2))
    True
    >>> gram_basis(np.diag([1.0, 1e-12]), None) is None
    True
    """
    svd = gram_svd(gram, rank)
    return None if svd is None else svd[0]


def gram_svd(
    gram: FloatArray, rank: int | None
) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """The top ``r`` singular triplets of a tall ``Y`` from ``gram = Y^T Y``.

    With ``Y^T Y = W diag(s^2) W^T``, ``Y = (Y B) diag(s) W^T`` where ``B = W
    diag(1/s)``: returns ``(B, s, W)`` for the top ``r`` (all t when ``rank`` is
    None), so the left singular vectors ``Y B`` are formed where ``Y`` lives.
    They are orthonormal up to about ``eps * s_1^2 / s_r^2``; None when
    ``s_r^2 < GRAM_MIN_RATIO * s_1^2`` (the caller then runs TSQR). A noisy
    sketch is far from that: its noise puts every singular value near or above
    ``sigma sqrt(rows)``.
    """
    lam, W = np.linalg.eigh(gram)
    lam, W = lam[::-1], W[:, ::-1]
    r = gram.shape[0] if rank is None else rank
    if not lam[r - 1] > GRAM_MIN_RATIO * lam[0]:
        return None
    s = np.sqrt(lam[:r])
    W = np.ascontiguousarray(W[:, :r])
    return W / s, s, W


def top_singular_vectors(Y: FloatArray, rank: int) -> FloatArray:
    """The top ``rank`` left singular vectors of the small ``Y`` (post-processing).

    Examples
    --------
    >>> Y = np.diag([1.0, 3.0, 2.0])
    >>> np.abs(top_singular_vectors(Y, 1)).ravel().tolist()
    [0.0, 1.0, 0.0]
    """
    U, _, _ = np.linalg.svd(Y, full_matrices=False)
    return np.ascontiguousarray(U[:, :rank])


def _pad(
    plan: LrfPlan,
    Yr: FloatArray,
    Z: FloatArray,
    T: FloatArray,
    ops: dict[str, SketchOperator],
    key: NoiseKey | None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The paper's padding ``(A, sigma_min I_M)`` as public additions [spec 3.3, R2]."""
    M, _ = plan.oriented_shape
    cal = plan.calibration
    sigma_min = 0.0 if cal is None else float(np.sqrt(plan.t)) * plan.sigma("Yc")
    Psi = ops["Psi"].dense()  # M x t
    pad_cols = sigma_min * Psi.T
    npad = _noise(plan, key, "Yr", NoiseCode.PAD, M, plan.t)
    if npad is not None:
        pad_cols = (
            pad_cols + npad.dense().T
        )  # the paper's N_1 also covers these columns
    Tpad = ops["Tpad"].dense()  # M x v, public
    Z = Z + sigma_min * (ops["S"].dense().T @ Tpad)
    return np.hstack([Yr, pad_cols]), Z, np.vstack([T, Tpad])
