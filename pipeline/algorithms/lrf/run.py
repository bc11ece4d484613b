"""Plan and run a private low-rank factorization: one pass (Spectral-LRF,
Low-Space-LRF) or two (:mod:`pipeline.algorithms.lrf.two_pass`).

:func:`plan_lrf` reads public values only; :func:`run_lrf` makes the pass, draws
the noise once on the reduced sketches and post-processes them
(:mod:`pipeline.algorithms.lrf.kernels`). The package docstring
(:mod:`pipeline.algorithms.lrf`) states the problem, the method and the privacy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pipeline._types import Shape2D
from pipeline._validation import check_int_in_range
from pipeline.algorithms.base import (
    Factorization,
    MatrixSource,
    ReleaseHooks,
    complete_from_pass,
)
from pipeline.algorithms.lrf.kernels import low_space_post, spectral_post
from pipeline.algorithms.lrf.model import choose_private_sizes
from pipeline.algorithms.lrf.plan import (
    LrfPlan,
    Reach,
    calibrate_plan,
    clips_range,
    operator_of,
    plan_operators,
    reach_of,
    resolve_sizes,
    worst_case_factors,
)
from pipeline.algorithms.lrf.two_pass import (
    SKETCHES,
    TwoPassPlan,
    plan_two_pass,
    run_two_pass,
)
from pipeline.errors import InvalidParameterError
from pipeline.linalg.core import one_blas_thread
from pipeline.params import Algorithm, LrfParams
from pipeline.sketches.apply import PassRequest
from pipeline.sketches.operators import seed_fingerprint

__all__ = ["SKETCHES", "pass_request", "plan_lrf", "run_lrf"]


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


def run_lrf(
    source: MatrixSource,
    plan: LrfPlan | TwoPassPlan,
    hooks: ReleaseHooks,
    *,
    request: PassRequest | None = None,
    input_dtype: Any = np.float64,
) -> Factorization:
    """Execute ``plan`` on ``source``: one pass, noise once, post-processing.

    Parameters
    ----------
    source : MatrixSource of shape (n_rows, n_cols)
    plan : LrfPlan or TwoPassPlan
        From :func:`plan_lrf` for this shape (a two-pass plan runs
        :func:`~pipeline.algorithms.lrf.two_pass.run_two_pass`).
    hooks : ReleaseHooks
        ``sketch_seed``: the root of the sketch operators (required;
        data-independent, confidential unless the plan was made with this
        ``public_seed``). ``noise_key``: the secret key of this release
        (required when private). ``journal``: the exact sketches of an earlier
        pass of this plan with this seed are loaded from it under
        :data:`SKETCHES` (the pass is skipped when they are all there; when
        the journal kept only the small ones, the pass runs again and must
        reproduce them bit for bit, :func:`complete_from_pass`; they must be
        the values :meth:`MatrixSource.sketch` returned, with the same chunks,
        for the release to be bit for bit the same), and a new pass's exact
        sketches are recorded there right after it, before the charge.
        ``charge``: called after the pass and before any noise is drawn.
    request : PassRequest or None
        Override of :func:`pass_request`.
    input_dtype : numpy dtype
        Dtype of ``A``; a float32 input keeps float32 block products in the
        non-private mode (DP mode always computes in float64).

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
    The journal receives noise-free sketches, as sensitive as ``A``: it may
    only keep them in the trusted zone. With journaled sketches and the same
    ``noise_key`` the noise is the same, not a second draw [design 3.2].

    Passes over A: 1, or 0 when the journal holds every sketch.
    """
    if isinstance(plan, TwoPassPlan):  # what plan_lrf returns for algorithm='two-pass'
        return run_two_pass(source, plan, hooks, input_dtype=input_dtype)
    sketch_seed = _check_keys(plan, hooks)
    # tasks carry a sealed reference to the seed, never the seed [spec 4.6, item 3]
    seal = getattr(source, "seal", None) or (lambda value: value)
    root = seal(sketch_seed)
    request = request or pass_request(plan, root, input_dtype)
    journal = hooks.journal
    exact = None if journal is None else journal.load(SKETCHES)
    if exact is None:
        exact = source.sketch(request)
        if journal is not None:
            journal.record(SKETCHES, exact)
    else:  # a resumed job: the tall sketches not journaled come from the pass again
        exact = complete_from_pass(source, request, exact)  # a copy: the post pops
    if hooks.charge is not None:
        hooks.charge()
    ops = plan_operators(plan, root)
    post = (
        spectral_post if plan.params.algorithm is Algorithm.SPECTRAL else low_space_post
    )
    with one_blas_thread():  # the same bits on any client
        Ux, s, Vx = post(source, plan, exact, ops, hooks.noise_key)
    U, V = (Vx, Ux) if plan.transpose else (Ux, Vx)
    return Factorization(U=U, S=s, V=V)


def _check_keys(plan: LrfPlan, hooks: ReleaseHooks) -> int:
    """The sketch seed of ``hooks``, once the keys are known to fit ``plan``."""
    sketch_seed = hooks.sketch_seed
    if sketch_seed is None:
        raise InvalidParameterError("a factorization needs a sketch seed.")
    if plan.calibration is not None and hooks.noise_key is None:
        raise InvalidParameterError("a private release needs a noise key.")
    if (
        plan.public_sketch_seed
        and seed_fingerprint(sketch_seed) != plan.public_seed_fingerprint
    ):
        raise InvalidParameterError(
            "the plan is calibrated for the operators of another public sketch seed; "
            "plan with public_seed set to the seed the release runs with."
        )
    return sketch_seed


def plan_lrf(
    params: LrfParams,
    shape: Shape2D,
    *,
    public_seed: int | None = None,
    reach: Reach | None = None,
) -> LrfPlan | TwoPassPlan:
    """Validate ``params`` for a matrix of ``shape`` and calibrate the noise.

    Reads no data: everything here is public (plan-then-execute, style B.3.1).

    Parameters
    ----------
    params : LrfParams
    shape : tuple (n_rows, n_cols)
    public_seed : int or None
        The sketch seed when it is public (given by the user): the calibration
        then uses the worst-case sensitivity of the operators it generates, and
        the plan may only run with this seed. None: the seed is secret.
    reach : Reach or None
        For a public seed, what one individual's difference may touch in ``X``;
        None derives it from ``params.clip.unit`` (:func:`reach_of`).

    Returns
    -------
    LrfPlan or TwoPassPlan
        A :class:`~pipeline.algorithms.lrf.two_pass.TwoPassPlan` for
        ``algorithm='two-pass'``, else an :class:`LrfPlan`.

    Raises
    ------
    InvalidParameterError
        If rank or sketch sizes are inconsistent with each other or the shape.

    Notes
    -----
    Privacy. One Gaussian mechanism over all released sketches; a Gaussian
    operator's factor is ``Delta_JL(d, beta)``, ``beta = delta_JL / J`` [spec
    3.2-3.3, S3], a sparse ``S``'s exactly 1 [private-lrf-2, 2], a range sketch
    clipped in sketch space (:func:`clips_range`) exactly ``rho(t)``. With
    ``public_seed``: :func:`worst_case_factors`, ``delta_JL = 0`` [private-lrf-2,
    3], and ``O((M + N) d^2)`` flops to generate the operators once.

    Examples
    --------
    >>> plan = plan_lrf(LrfParams(algorithm=Algorithm.SPECTRAL, rank=2, epsilon=1.0,
    ...                           delta=1e-6), (500, 300))
    >>> plan.t, plan.v, plan.transpose, round(plan.range_clip, 3)
    (12, 133, False, 1.478)
    """
    if params.algorithm is Algorithm.TWO_PASS:
        return plan_two_pass(params, shape, public_seed=public_seed)
    m, n = (
        check_int_in_range(x, nm, 1)
        for x, nm in zip(shape, ("n_rows", "n_cols"), strict=True)
    )
    if params.padded and params.algorithm is not Algorithm.LOW_SPACE:
        raise InvalidParameterError(
            "padded=True applies to algorithm='low-space' only."
        )
    if public_seed is not None:
        public_seed = check_int_in_range(public_seed, "seed", 0, 2**128 - 1)
    # Spectral and unpadded Low-Space put the t-sized sketch on the longer side
    # (memory m t + v n, spec 3.2); padded mode follows the paper's m <= n [spec 3.3]
    transpose = (m > n) if params.padded else (m < n)
    M, N = (n, m) if transpose else (m, n)
    operator = operator_of(params, transpose, public_seed is not None, reach)
    plan = LrfPlan(
        params=params,
        shape=(m, n),
        transpose=transpose,
        t=0,
        v=0,
        calibration=None,
        operator=operator,
    )
    if not params.private:
        t, v = resolve_sizes(params, M, N)
        return dataclasses.replace(plan, t=t, v=v)
    plan = choose_private_sizes(
        plan, clipped_range=clips_range(params, transpose, reach)
    )
    if public_seed is None:
        return calibrate_plan(plan)
    reach = reach or reach_of(params.clip.unit, transpose)
    plan = dataclasses.replace(
        plan, public_seed_fingerprint=seed_fingerprint(public_seed), reach=reach
    )
    return calibrate_plan(plan, worst_case_factors(plan, public_seed, reach))
