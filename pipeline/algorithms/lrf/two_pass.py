"""Two-pass differentially private low-rank factorization with exact sensitivities.

Problem. Given ``A`` (n_rows, n_cols), a rank ``k`` and a budget ``(epsilon,
delta)``, release ``U_k`` (n_rows, k), ``s_k`` (k,), ``V_k`` (n_cols, k) whose
additive spectral error is close to that of the full-matrix Gaussian mechanism
(``A + N`` with ``N_ij ~ N(0, (s Delta_F)^2)``, then its truncated SVD), reading
the stored matrix twice and holding only sketches in memory.

Method [spec private-lrf-2, section 6]. Orient ``X`` = ``A`` or ``A.T`` (M x N)
so that one individual is one row of ``X`` (row unit: ``A``; column unit:
``A.T``; entry unit: by shape, ``M >= N``, as the one-pass algorithms do).

1. Pass 1: ``Z = S X + N_Z`` (v x N) with ``S`` a sparse sign operator whose
   columns have norm exactly 1 (:class:`~pipeline.sketches.sparse.SparseSignOperator`).
   ``V_k`` = the top-k right singular vectors of the noisy ``Z`` (client).
2. Pass 2: ``Y = X V_k + N_Y`` (M x k, tall, on the cluster); ``V_k`` travels to
   the workers as a public :class:`~pipeline.sketches.dense.DenseOperator`.
3. Release: ``Y = Q R`` (TSQR), ``R = P diag(s) W^T``; ``U = Q P``, ``V = V_k W``,
   with the sign convention of the other algorithms, and ``S_i = sqrt(max(s_i^2 -
   M sigma_Y^2, 0))``, the singular values without the noise's energy
   (:func:`debiased_singular_values`; post-processing with public values only).

Privacy. For neighbours that differ in one row ``d`` of the clipped ``X``
(``||d|| <= Delta_F``): ``||S e_i d^T||_F = ||S[:, i]|| ||d|| = ||d||`` and
``||e_i d^T V_k||_F = ||V_k^T d|| <= ||d||`` (orthonormal columns); for one
entry ``delta e_i e_j^T``: ``|delta| ||S[:, i]||`` and ``|delta| ||V_k[j, :]|| <=
|delta|``. Both sensitivities are exactly ``Delta_F`` for every draw of ``S``
(so a public sketch seed costs nothing, and no delta is set aside for tail
events). The second mechanism is chosen from the first one's output; adaptive
composition of Gaussian mechanisms is exact in GDP,
``mu^2 = (Delta_F / sigma_Z)^2 + (Delta_F / sigma_Y)^2`` [DRS22, Cor. 3.3], which
:func:`~pipeline.accounting.calibration.calibrate_release` with ``J = 0`` gives:
``sigma_i = Delta_F s(epsilon, delta) / sqrt(w_i)``, ``w_Z + w_Y = 1``.

Defaults, measured with ``python benchmarks/two_pass_defaults.py --epsilon 2 4 8
--v 45 100 200 400 --w 0.1 0.15 0.2 0.3``: additive spectral error ``||A - U S
V^T||_2 - ||A - A_k||_2`` over that of the full GM, median of 5 noise draws,
4000 x 500, a random-sign rank-5 signal (``sigma_1..5`` = 365 .. 145) on a
uniform background (``sigma_6`` = 4.9), entry unit, C = 1, delta = 1e-6, with
the debiased singular values of step 3:

=====  =====  ======  ======  ======  ======
eps    w_Z    v = 45  v = 100 v = 200 v = 400
=====  =====  ======  ======  ======  ======
2      0.10   1.099   1.071   1.042   1.096
2      0.15   0.986   0.965   0.943   0.961
2      0.20   0.963   0.950   0.940   0.951
2      0.30   0.993   0.993   0.983   0.991
4      0.10   1.364   1.258   1.193   1.217
4      0.15   1.166   1.089   1.058   1.077
4      0.20   1.097   1.078   1.073   1.078
4      0.30   1.147   1.145   1.139   1.140
8      0.10   1.520   1.354   1.257   1.268
8      0.15   1.264   1.130   1.105   1.106
8      0.20   1.150   1.128   1.122   1.124
8      0.30   1.206   1.206   1.203   1.201
=====  =====  ======  ======  ======  ======

(Before the debiasing, w_Z = 0.15 and v = 100 gave 0.987, 1.078 and 1.107: on
this matrix, whose tail is almost nothing, the debiasing changes the error by
-2% to +2%; on the heavier tails of ``bench_utility.py`` it lowers it by up to
half.)

(full GM error 154, 74, 37 at epsilon 2, 4, 8; at epsilon = 1 it is 353, about
``sigma_1``, and both methods lose the signal). Hence ``w_Z = 0.15`` (0.2 is 0.2-1.5%
better here at v = 100 with the debiasing; not re-tuned) and ``v = max(10k, 100)``: beyond
100 the gain is at most 3% here, and ``Z`` (v x N) is held on the client. Keeping ``p`` more columns of ``V`` in pass 2 (``oversample``)
gained at most 3% (2000 x 300, epsilon 4 and 8, p = 10), so the default is 0.

Passes over A: 2 (plus one norm pass per pass when rows of a column-split store
are clipped). The budget of both passes is checked before the first read and
charged once, after pass 1 has read the data and before any noise is drawn
(the noise of ``Z`` decides what pass 2 computes), as a one-pass release is
charged after its pass: a bad chunk found by pass 1 costs nothing.

References
----------
.. [DRS22] J. Dong, A. Roth, W. Su, "Gaussian differential privacy", JRSS B 84(1),
   2022, arXiv:1905.02383.
.. [BW18] B. Balle, Y.-X. Wang, ICML 2018, arXiv:1805.06530.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline._types import FloatArray, Shape2D
from pipeline._validation import check_float_in_interval, check_int_in_range
from pipeline.accounting.calibration import (
    ReleaseCalibration,
    SketchRequest,
    calibrate_release,
)
from pipeline.algorithms.base import Factorization, MatrixSource, ReleaseHooks
from pipeline.algorithms.lrf.kernels import gram_svd, row_noise
from pipeline.errors import InvalidParameterError
from pipeline.linalg.core import one_blas_thread, sign_convention
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Algorithm, LrfParams, OperatorKind, PrivacyUnit
from pipeline.sketches.apply import PassRequest
from pipeline.sketches.dense import DenseOperator
from pipeline.sketches.gaussian import OperatorCode
from pipeline.sketches.operators import SketchOperator, make_operator, seed_fingerprint

__all__ = [
    "DEFAULT_OVERSAMPLE",
    "DEFAULT_WEIGHT_Z",
    "SKETCHES",
    "TwoPassPlan",
    "default_core_size",
    "plan_two_pass",
    "run_two_pass",
]

#: The journal label of a factorization's exact sketches (one pass or two): a
#: dict of name to sketch, recorded after each pass, before the charge.
SKETCHES = "sketches"

#: Budget share of the co-range sketch ``Z`` (measured: module docstring).
DEFAULT_WEIGHT_Z = 0.15

#: Columns of ``V`` beyond the rank that pass 2 keeps (measured: module docstring).
DEFAULT_OVERSAMPLE = 0


def default_core_size(rank: int) -> int:
    """Default co-range size ``v = max(10k, 100)`` (measured: module docstring).

    Examples
    --------
    >>> default_core_size(5), default_core_size(20)
    (100, 200)
    """
    return max(10 * rank, 100)


@dataclass(frozen=True, kw_only=True, slots=True)
class TwoPassPlan:
    """A validated two-pass plan: orientation, sizes, budget split, calibration.

    ``t`` is the width of the range sketch ``Y``: the rank plus the
    oversampling (``width``, 0 meaning the rank). No data.
    """

    params: LrfParams
    shape: Shape2D
    transpose: bool
    v: int
    weight_z: float
    calibration: ReleaseCalibration | None
    width: int = 0
    public_seed_fingerprint: str | None = None
    operator: OperatorKind = OperatorKind.SPARSE_SIGN
    reach: None = None

    @property
    def t(self) -> int:
        """Width of the range sketch ``Y``: the rank plus the oversampling."""
        return self.width or self.params.rank

    @property
    def weight_y(self) -> float:
        return 1.0 - self.weight_z

    @property
    def public_sketch_seed(self) -> bool:
        """True when the sketch seed was given (its calibration is the same)."""
        return self.public_seed_fingerprint is not None

    @property
    def oriented_shape(self) -> Shape2D:
        m, n = self.shape
        return (n, m) if self.transpose else (m, n)

    @property
    def entry_reads(self) -> tuple[str, ...]:
        """Units of ``A`` an entry-unit release may be read at by a ledger.

        ``Y``'s bound ``||D V_k||_F <= ||D||_F`` holds for every ``D``; the sparse
        ``S`` of ``Z`` is exact for a difference within one row of ``X`` only, so
        the release converts to that axis of ``A`` alone (as in one pass:
        :attr:`pipeline.algorithms.lrf.plan.LrfPlan.entry_reads`).
        """
        if self.calibration is None:
            return ("row", "column")
        return ("column",) if self.transpose else ("row",)

    def sigma(self, name: str) -> float:
        """Noise std of released statistic ``name`` (0.0 when not private)."""
        if self.calibration is None:
            return 0.0
        return next(s.sigma for s in self.calibration.sketches if s.name == name)


def _check_params(params: LrfParams) -> None:
    if params.algorithm is not Algorithm.TWO_PASS:
        raise InvalidParameterError(
            f"plan_two_pass plans algorithm='two-pass', got algorithm={params.algorithm.value!r}."
        )
    if params.sketch_size is not None:
        raise InvalidParameterError(
            "sketch_size does not apply to algorithm='two-pass' (its range sketch "
            "has exactly rank columns); drop it."
        )
    if params.padded:
        raise InvalidParameterError(
            "padded=True applies to algorithm='low-space' only."
        )
    if params.operator not in (None, OperatorKind.SPARSE_SIGN):
        raise InvalidParameterError(
            "algorithm='two-pass' uses a sparse sign co-range sketch (its exact "
            "sensitivity rests on it); drop operator or pass operator='sparse-sign'."
        )


def _transpose(params: LrfParams, m: int, n: int) -> bool:
    """``X = A.T``? One individual along the rows of ``X`` [private-lrf-2, 6]."""
    unit = params.clip.unit
    if params.private and unit is PrivacyUnit.ROW:
        return False
    if params.private and unit is PrivacyUnit.COLUMN:
        return True
    return m < n  # entry unit, or non-private: the tall sketch on the longer side


def plan_two_pass(
    params: LrfParams,
    shape: Shape2D,
    *,
    public_seed: int | None = None,
    weight_z: float = DEFAULT_WEIGHT_Z,
    oversample: int | None = None,
) -> TwoPassPlan:
    """Validate ``params`` for a matrix of ``shape`` and calibrate both sketches.

    Reads no data: everything here is public (plan-then-execute).

    Parameters
    ----------
    params : LrfParams
        ``algorithm`` two-pass; ``core_size`` is ``v`` (None: :func:`default_core_size`,
        at most M); ``sketch_size`` and ``padded`` are refused.
    shape : tuple (n_rows, n_cols)
    public_seed : int or None
        The sketch seed when the user gave it. The calibration does not change
        (the sensitivities are exact for every operator); the plan records
        the seed's fingerprint.
    weight_z : float
        Budget share ``w_Z`` of ``Z`` in (0, 1); ``Y`` gets ``1 - w_Z``. A
        ``params.range_weight`` (the share of ``Y``) overrides it.
    oversample : int or None
        ``p``: pass 2 multiplies by ``k + p`` columns of ``V`` (at most ``v`` and
        N) and the release keeps the top k; None: :data:`DEFAULT_OVERSAMPLE`.

    Returns
    -------
    TwoPassPlan

    Raises
    ------
    InvalidParameterError
        If rank, ``v`` or the weight do not fit the shape, or a one-pass
        parameter is given.

    Notes
    -----
    Privacy. Emits two Gaussian mechanisms, ``Z`` (v x N) and ``Y`` (M x k), each
    of sensitivity exactly ``Delta_F`` (module docstring), composed in GDP:
    ``calibrate_release`` with ``jl_dims=()`` and ``J = 0``, so
    ``delta_JL = 0`` and ``sigma_i = Delta_F s(epsilon, delta) / sqrt(w_i)``.

    Examples
    --------
    >>> p = LrfParams.of(3, epsilon=1.0, delta=1e-6, algorithm="two-pass", unit="column")
    >>> plan = plan_two_pass(p, (500, 300))
    >>> plan.transpose, plan.oriented_shape, plan.v, plan.calibration.sensitivity
    (True, (300, 500), 100, 'exact')
    """
    _check_params(params)
    m, n = (
        check_int_in_range(x, nm, 1)
        for x, nm in zip(shape, ("n_rows", "n_cols"), strict=True)
    )
    transpose = _transpose(params, m, n)
    M, N = (n, m) if transpose else (m, n)
    k = check_int_in_range(
        params.rank, "rank", 1, min(M, N) - 1, what="[1, min(n_rows, n_cols) - 1]"
    )
    v = min(default_core_size(k), M) if params.core_size is None else params.core_size
    v = check_int_in_range(
        v, "core_size", k + 1, M, what="[rank + 1, the oriented row count]"
    )
    if params.range_weight is not None:  # the range side is Y = X V_k here
        weight_z = 1.0 - params.range_weight
    w = check_float_in_interval(weight_z, "weight_z", 0.0, 1.0)
    p = DEFAULT_OVERSAMPLE if oversample is None else oversample
    width = min(k + check_int_in_range(p, "oversample", 0), v, N)
    fingerprint = None
    if public_seed is not None:
        public_seed = check_int_in_range(public_seed, "seed", 0, 2**128 - 1)
        fingerprint = seed_fingerprint(public_seed)
    plan = TwoPassPlan(
        params=params, shape=(m, n), transpose=transpose, v=v, weight_z=w,
        calibration=None, public_seed_fingerprint=fingerprint, width=width,
    )  # fmt: skip
    if not params.private:
        return plan
    assert params.epsilon is not None
    assert params.delta is not None
    calibration = calibrate_release(
        [
            SketchRequest(name="Z", shape=(v, N), jl_dims=(), weight=w),
            SketchRequest(name="Y", shape=(M, plan.t), jl_dims=(), weight=1.0 - w),
        ],
        epsilon=params.epsilon,
        delta=params.delta,
        frobenius_bound=params.neighboring.frobenius_bound(params.clip.clip_norm),
        n_sketch_matrices=0,  # exact sensitivities: no tail event to pay for
    )
    calibration.check()
    return dataclasses.replace(plan, calibration=calibration)


def co_range_operator(plan: TwoPassPlan, root: Any) -> SketchOperator:
    """The sparse sign ``S`` (as ``G = S^T``, M x v) of pass 1 for sketch seed ``root``."""
    M, _ = plan.oriented_shape
    return make_operator(
        OperatorKind.SPARSE_SIGN, root=root, code=OperatorCode.S, length=M,
        dim=plan.v, tile_size=plan.params.tile_size,
    )  # fmt: skip


def _request(plan: TwoPassPlan, input_dtype: Any, **sketches: Any) -> PassRequest:
    p = plan.params
    dtype: type = np.float64  # DP sketches are float64 [spec 4.6, item 7]
    if not p.private and np.dtype(input_dtype) == np.float32:
        dtype = np.float32
    clip = p.clip if p.private else None
    return PassRequest(
        transpose=plan.transpose, clip=clip, compute_dtype=dtype, **sketches
    )


def top_right_vectors(Z: FloatArray, rank: int) -> FloatArray:
    """The top ``rank`` right singular vectors of the wide ``Z`` (v x N), as
    columns (N x rank).

    From the v x v Gram matrix ``Z Z^T`` (:func:`gram_svd` of the tall ``Z^T``):
    ``Z^T B`` are the vectors, orthonormal up to about ``eps s_1^2 / s_r^2``, in
    ``O(v^2 N)`` flops of matrix products. An SVD of ``Z`` itself spends
    about 25 times longer on one thread (100 x 20000: 0.20 s against 8 ms) and
    is kept for a ``Z`` too ill-conditioned for the Gram matrix (``gram_svd``
    None: a noise-free ``Z`` of rank below ``rank``); a noisy ``Z`` never is.

    Each vector is signed by :func:`~pipeline.linalg.core.sign_convention`:
    the noise of ``Y = X V_k + N_Y`` meets ``X V_k`` column by column, so a
    flipped vector would give another (equally private) release; with the
    convention both routes give the same one, up to rounding.
    """
    Z = np.asarray(Z, dtype=np.float64)
    svd = gram_svd(Z @ Z.T, rank)
    if svd is not None:
        V = Z.T @ svd[0]
    else:
        V = np.linalg.svd(Z, full_matrices=False)[2][:rank].T
    return np.ascontiguousarray(V * sign_convention(V))


def _noise(
    plan: TwoPassPlan,
    key: NoiseKey | None,
    name: str,
    code: NoiseCode,
    length: int,
    dim: int,
) -> GaussianNoise | None:
    if plan.calibration is None or key is None:
        return None
    return GaussianNoise(
        key=key.derive(int(code)), sigma=plan.sigma(name), length=length, dim=dim,
        tile_size=plan.params.tile_size,
    )  # fmt: skip


def run_two_pass(
    source: MatrixSource,
    plan: TwoPassPlan,
    hooks: ReleaseHooks,
    *,
    input_dtype: Any = np.float64,
) -> Factorization:
    """Execute ``plan`` on ``source``: charge, pass 1, ``V_k``, pass 2, release.

    Parameters
    ----------
    source : MatrixSource of shape (n_rows, n_cols)
    plan : TwoPassPlan
    hooks : ReleaseHooks
        ``sketch_seed``: the root of ``S`` (required; data-independent).
        ``noise_key``: the secret key of this release (required when private).
        ``journal``: exact sketches journaled under :data:`SKETCHES` by an
        interrupted run of this plan with this seed and key (``{"Z"}`` skips
        pass 1, ``{"Z", "Y"}`` both passes; the result is bit for bit the
        uninterrupted one); every exact sketch so far is recorded there after
        each pass. ``charge``: the ledger charge of the whole job, called once
        per run, after pass 1 (or its journaled result) and before the noise
        of ``Z``, which pass 2 depends on (a rerun calls it again; the charge
        is idempotent by release id).
    input_dtype : numpy dtype

    Returns
    -------
    Factorization
        ``U`` (n_rows, k), ``S`` (k,), ``V`` (n_cols, k); an empty report.

    Notes
    -----
    Privacy. Noise is added once to each entry of ``Z`` and of ``Y``, after
    their global sums [design 3.1]; ``V_k`` and everything after read only
    noisy statistics. The journal receives noise-free sketches (trusted zone).
    Emits ``plan.calibration``.

    Passes over A: 2, fewer when the journal holds sketches.
    """
    sketch_seed, noise_key, journal = hooks.sketch_seed, hooks.noise_key, hooks.journal
    if sketch_seed is None:
        raise InvalidParameterError("a factorization needs a sketch seed.")
    if plan.calibration is not None and noise_key is None:
        raise InvalidParameterError("a private release needs a noise key.")
    seal = getattr(source, "seal", None) or (lambda value: value)
    exact = dict((None if journal is None else journal.load(SKETCHES)) or {})
    z_exact = exact.get("Z")
    if z_exact is None:
        S = co_range_operator(plan, seal(sketch_seed))
        z_exact = source.sketch(_request(plan, input_dtype, left=(("Z", S),)))["Z"]
        if journal is not None:
            journal.record(SKETCHES, {"Z": z_exact})
    if hooks.charge is not None:
        # the whole job, both passes, is charged once: after pass 1 has read
        # (and so validated) the data and before any noise exists, as a
        # one-pass release is charged after its pass [design 3]
        hooks.charge()
    with one_blas_thread():  # the same bits on any client
        Vk = _co_range_basis(plan, z_exact, noise_key)
    y_exact = exact.get("Y")
    if y_exact is None:
        right = (("Y", DenseOperator(Vk)),)
        y_exact = source.sketch(_request(plan, input_dtype, right=right))["Y"]
        if journal is not None:
            # the manifest names both; Z's file, written after pass 1, is kept
            journal.record(SKETCHES, {"Z": z_exact, "Y": y_exact})
    del z_exact, exact
    with one_blas_thread():
        return _release(source, plan, Vk, y_exact, noise_key)


def _co_range_basis(
    plan: TwoPassPlan, z_exact: Any, key: NoiseKey | None
) -> FloatArray:
    """``V_k``: top-k right singular vectors of ``Z = S X + N_Z`` [private-lrf-2, 6.1]."""
    _, N = plan.oriented_shape
    Z = np.array(z_exact, dtype=np.float64)
    nz = _noise(plan, key, "Z", NoiseCode.Z, N, plan.v)
    if nz is not None:
        Z += nz.dense().T  # noise tiled along the columns of Z, as in one pass
    return top_right_vectors(Z, plan.t)


def _release(
    source: MatrixSource,
    plan: TwoPassPlan,
    Vk: FloatArray,
    y_exact: Any,
    key: NoiseKey | None,
) -> Factorization:
    """``Y + N_Y = Q R``, ``R = P diag(s) W^T``: ``U = Q P``, ``V = V_k W`` [6.3]."""
    M, _ = plan.oriented_shape
    k = plan.params.rank
    Y, svd = y_exact, None
    ny = _noise(plan, key, "Y", NoiseCode.Y, M, plan.t)
    if ny is not None:
        # Y = X V_k + N_Y, and its Gram matrix in the same step: its SVD, unless
        # too ill-conditioned for that (then TSQR)
        Y, gram, _ = source.tall_noise_gram(Y, row_noise(ny, source), None)
        svd = gram_svd(gram, k)
    if svd is None:
        Q, R = source.tall_qr(Y, with_r=True)
        P, s, Wt = np.linalg.svd(R)
        P, s, W = P[:, :k], s[:k], Wt[:k].T  # rank-k truncation of the noisy Y [6.3]
    else:
        (P, s, W), Q = svd, Y  # U = Y W diag(1/s)
    del Y
    Vx = Vk @ W
    signs = sign_convention(Vx)
    Ux = source.tall_matmul(Q, P * signs)
    Vx = Vx * signs
    U, V = (Vx, Ux) if plan.transpose else (Ux, Vx)
    return Factorization(U=U, S=debiased_singular_values(s, M, plan.sigma("Y")), V=V)


def debiased_singular_values(s: FloatArray, n_rows: int, sigma: float) -> FloatArray:
    """``sqrt(max(s_i^2 - n_rows sigma^2, 0))``: the singular values of a noisy
    ``Y = X V_k + N`` (``n_rows`` x k) without the noise's share.

    ``N`` has i.i.d. ``N(0, sigma^2)`` entries and ``V_k`` was fixed before it
    was drawn, so ``E[Y^T Y] = V_k^T X^T X V_k + n_rows sigma^2 I``: the
    eigenvalues of ``Y^T Y - n_rows sigma^2 I``, which has the eigenvectors
    ``W`` of ``Y^T Y``, are ``s_i^2 - n_rows sigma^2``: estimates of the
    singular values of ``X V_k``, what the data hold in the released right
    subspace (less than ``X``'s own when ``V_k`` is noisy). Without this the
    released ``s`` carries the noise's energy, ``sqrt(n_rows) sigma`` in
    quadrature (about sqrt(111^2 + 115650 * 0.40^2) = 176 for a sigma_1 of
    111 on a 115650-row bag of words at epsilon = 16, row unit), and so does the error of ``U diag(s) V^T``. A component
    below the noise is released as 0. Post-processing of the noisy ``Y`` with
    the public ``sigma`` and shape only; ``sigma = 0`` (a non-private run)
    changes nothing.

    Examples
    --------
    >>> debiased_singular_values(np.array([5.0, 3.0, 1.0]), 4, 1.0)
    array([4.58257569, 2.23606798, 0.        ])
    """
    s = np.asarray(s, dtype=np.float64)
    return np.sqrt(np.maximum(s * s - n_rows * sigma * sigma, 0.0))
