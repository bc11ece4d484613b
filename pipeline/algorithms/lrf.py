"""One-pass differentially private low-rank factorization: Spectral-LRF and Low-Space-LRF.

Problem. Given ``A`` (n_rows, n_cols), a rank ``k`` and a budget ``(epsilon, delta)``,
release ``U_k`` (n_rows, k), ``s_k`` (k,), ``V_k`` (n_cols, k) such that
``||A - U_k diag(s_k) V_k^T||_2`` is close to ``sigma_{k+1}(A)`` plus an additive
noise term of order ``(sqrt(n_rows) + sqrt(n_cols)) / epsilon``, reading ``A`` once.

Method [Upa18, Fig. 1 and Fig. 2], as corrected by spec sketch-lrf.md:

* Spectral-LRF (default): ``Y = X Phi + N_1`` (M x t), ``Z = S X + N_2`` (v x N) with
  ``X`` = ``A`` oriented so that M >= N; ``U = orth(Y)``; core solve
  ``(S U)^+ [P Z]_k`` [spec 3.2].
* Low-Space-LRF: ``Y_c = X Phi_c + N``, ``Y_r = Psi X + N``, ``Z = S X T + N``;
  two-sided core solve [spec 3.3]. ``padded=True`` reproduces the paper's
  ``(A, sigma_min I)`` construction with the padding block drawn from the secret
  noise stream (the paper's public padding would carry no noise at all).

Privacy [spec 4.4]: all noisy sketches of a release form ONE Gaussian mechanism,
calibrated with the analytic Gaussian mechanism [BW18]. (epsilon, delta)-DP for
neighbours with ``||A - A'||_F <= Delta_F`` (Priv1, hence Priv2). A Gaussian
operator's sensitivity factor is ``Delta_JL(d, beta)`` from the actual sizes
[spec 4.2], its failure probability charged to delta; that tail bound is for a
pair fixed before the operators are drawn, so it needs a secret sketch seed. With
a public seed (``plan_lrf(..., public_seed=seed)``) the factors are the exact
worst case of the actual operators instead (spec private-lrf-2 section 3;
:func:`worst_case_factors`). A sparse sign ``S`` has the exact factor 1, and a
range sketch clipped in sketch space (:func:`clips_range`, :class:`ClippedNoise`:
its rows to ``rho(t) C`` after the pass, before the noise) the exact factor
``rho``, for any seed. The plan (:mod:`pipeline.algorithms.lrf_plan`) reads only
public values; this module runs it.

Passes over A: 1 (plus one norm pass when clipping rows of a column-split store).

References
----------
.. [Upa18] J. Upadhyay, "The price of privacy for low-rank factorization",
   NeurIPS 2018, arXiv:1612.04740 (v5).
.. [BW18] B. Balle, Y.-X. Wang, ICML 2018, arXiv:1805.06530.
.. [TYUC17] Tropp, Yurtsever, Udell, Cevher, SIMAX 2017, arXiv:1609.00048.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline._types import FloatArray
from pipeline.algorithms.base import Factorization, MatrixSource, complete_from_pass
from pipeline.algorithms.lrf_plan import (
    AUTO,
    Algorithm,
    LrfParams,
    LrfPlan,
    Reach,
    calibrate_plan,
    choose_private_sizes,
    clips_range,
    default_operator,
    default_sketch_sizes,
    plan_lrf,
    plan_operators,
    reach_of,
    seed_fingerprint,
    sparse_is_exact,
    worst_case_factors,
)
from pipeline.errors import InvalidParameterError
from pipeline.linalg.core import (
    core_one_sided,
    core_two_sided,
    one_blas_thread,
    orth,
    sign_convention,
)
from pipeline.mechanisms.clipping import clip_rows
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.sketches.apply import PassRequest
from pipeline.sketches.operators import SketchOperator

# the plan's names (pipeline.algorithms.lrf_plan) are re-exported: callers plan and
# run through this module
__all__ = [
    "AUTO",
    "Algorithm",
    "ClippedNoise",
    "LrfParams",
    "LrfPlan",
    "Reach",
    "calibrate_plan",
    "choose_private_sizes",
    "clips_range",
    "default_operator",
    "default_sketch_sizes",
    "gram_basis",
    "gram_svd",
    "pass_request",
    "plan_lrf",
    "plan_operators",
    "reach_of",
    "run_lrf",
    "seed_fingerprint",
    "sparse_is_exact",
    "top_singular_vectors",
    "worst_case_factors",
]


def pass_request(
    plan: LrfPlan, root: int, input_dtype: Any = np.float64
) -> PassRequest:
    """The single pass over ``A`` that ``plan`` needs, for sketch seed ``root``."""
    ops = plan_operators(plan, root)
    p = plan.params
    clip = p.clip if p.private else None
    # DP sketches are float64 [spec 4.6, item 7]; a non-private float32 input keeps
    # float32 block products (partials are still summed in float64)
    dtype: type = np.float64
    if not p.private and np.dtype(input_dtype) == np.float32:
        dtype = np.float32
    common: dict[str, Any] = {
        "transpose": plan.transpose,
        "clip": clip,
        "compute_dtype": dtype,
    }
    if p.algorithm is Algorithm.SPECTRAL:
        # non-private: Y needs no noise, so each chunk may start its TSQR and
        # apply S to its Q block while S is at hand [spec 6.2]
        local = (("Y", "Z"),) if not p.private else ()
        return PassRequest(
            right=(("Y", ops["Phi"]),),
            left=(("Z", ops["S"]),),
            local_qr=local,
            **common,
        )
    return PassRequest(
        right=(("Yc", ops["PhiC"]),),
        left=(("Yr", ops["Psi"]),),
        two_sided=(("Z", ops["S"], ops["T"]),),
        **common,
    )


def _row_noise(
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


def run_lrf(
    source: MatrixSource,
    plan: LrfPlan,
    *,
    sketch_seed: int,
    noise_key: NoiseKey | None,
    before_noise: Callable[[], None] | None = None,
    request: PassRequest | None = None,
    input_dtype: Any = np.float64,
    exact: dict[str, Any] | None = None,
    after_pass: Callable[[dict[str, Any]], None] | None = None,
) -> Factorization:
    """Execute ``plan`` on ``source``: one pass, noise once, post-processing.

    Parameters
    ----------
    source : MatrixSource of shape (n_rows, n_cols)
    plan : LrfPlan
        From :func:`plan_lrf` for this shape.
    sketch_seed : int
        Root of the sketch operators (data-independent, confidential unless
        the plan was made with this ``public_seed``).
    noise_key : NoiseKey or None
        Secret key of this release (required when private).
    before_noise : callable or None
        Called after the pass and before any noise is drawn: the ledger charge.
    request : PassRequest or None
        Override of :func:`pass_request`.
    input_dtype : numpy dtype
        Dtype of ``A``; a float32 input keeps float32 block products in the
        non-private mode (DP mode always computes in float64).
    exact : dict or None
        The exact sketches of an earlier pass of this plan with this
        ``sketch_seed`` (from a release journal): the pass is skipped when they
        are all there; when the journal kept only the small ones, the pass runs
        again and must reproduce them bit for bit (:func:`complete_from_pass`).
        They must be the values :meth:`MatrixSource.sketch` returned, with the
        same chunks, for the release to be bit for bit the same.
    after_pass : callable or None
        Called with the exact sketches right after the pass (not when
        ``exact`` is given) and before ``before_noise``: the journal write.

    Returns
    -------
    Factorization
        ``U`` (n_rows, k) and ``V`` (n_cols, k), one of them tall in the source's
        array type; ``S`` (k,); an empty report (the caller fills it).

    Notes
    -----
    Privacy. Noise is added exactly once to each entry of each globally reduced
    sketch [design 3.1]; the factorization reads only the noisy sketches
    [spec 3.2, R2]. Emits ``plan.calibration`` (one Gaussian mechanism).
    ``after_pass`` receives noise-free sketches, as sensitive as ``A``: it
    may only keep them in the trusted zone. With ``exact`` and the same
    ``noise_key`` the noise is the same, not a second draw [design 3.2].

    Passes over A: 1, or 0 when ``exact`` holds every sketch.
    """
    if plan.params.algorithm is Algorithm.TWO_PASS:
        from pipeline.algorithms.two_pass import run_two_pass

        return run_two_pass(
            source, plan, sketch_seed=sketch_seed, noise_key=noise_key,  # type: ignore[arg-type]
            before_noise=before_noise, input_dtype=input_dtype, exact=exact, after_pass=after_pass,
        )  # fmt: skip
    _check_keys(plan, sketch_seed, noise_key)
    # tasks carry a sealed reference to the seed, never the seed [spec 4.6, item 3]
    seal = getattr(source, "seal", None) or (lambda value: value)
    root = seal(sketch_seed)
    request = request or pass_request(plan, root, input_dtype)
    if exact is None:
        exact = source.sketch(request)
        if after_pass is not None:
            after_pass(exact)
    else:  # a resumed job: the tall sketches not journaled come from the pass again
        exact = complete_from_pass(source, request, exact)  # a copy: the post pops
    if before_noise is not None:
        before_noise()
    ops = plan_operators(plan, root)
    post = (
        _spectral_post
        if plan.params.algorithm is Algorithm.SPECTRAL
        else _low_space_post
    )
    with one_blas_thread():  # the same bits on any client
        Ux, s, Vx = post(source, plan, exact, ops, noise_key)
    U, V = (Vx, Ux) if plan.transpose else (Ux, Vx)
    return Factorization(U=U, S=s, V=V)


def _check_keys(plan: LrfPlan, sketch_seed: int, noise_key: NoiseKey | None) -> None:
    if plan.calibration is not None and noise_key is None:
        raise InvalidParameterError("a private release needs a noise key.")
    if (
        plan.public_sketch_seed
        and seed_fingerprint(sketch_seed) != plan.public_seed_fingerprint
    ):
        raise InvalidParameterError(
            "the plan is calibrated for the operators of another public sketch seed; "
            "plan with public_seed set to the seed the release runs with."
        )


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


def _spectral_post(
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


def _low_space_post(
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
        row_noise = _row_noise(noise, source, plan.range_clip_bound)
        Y, gram, SY = source.tall_noise_gram(Y, row_noise, S)
        B = gram_basis(gram, plan.basis_rank)
        if B is not None:
            return Y, SY @ B, B
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
