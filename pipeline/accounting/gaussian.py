"""Exact calibration of the Gaussian mechanism and the Gaussian-sketch sensitivity.

Problem. For ``f(x) + N(0, sigma^2 I)`` with L2 sensitivity 1 and noise
multiplier ``z = sigma / sensitivity``, compute the exact privacy curve
``delta(z, epsilon)`` of the analytic Gaussian mechanism [BW18, Thm 8], and its
two inverses: the smallest ``z`` for a target ``(epsilon, delta)`` and the
smallest ``epsilon`` for a given ``(z, delta)``. Inverses are rounded in the
conservative direction: a returned ``z`` or ``epsilon`` always satisfies the
target when re-evaluated with :func:`gaussian_delta`.

Also provides the per-pair sensitivity factor ``Delta_JL(d, beta)`` of a
JL-normalised Gaussian sketch [LM00, Lemma 1] (spec section 4.2), and two
reference constants kept only for regression tests and cross-checks.

References
----------
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy: analytical calibration and optimal denoising. ICML 2018,
   arXiv:1805.06530.
.. [DR14] Dwork, Roth. The algorithmic foundations of differential privacy,
   Thm A.1.
.. [LM00] Laurent, Massart. Adaptive estimation of a quadratic functional by
   model selection. Ann. Statist. 28(5), 2000.
.. [Upa18] Upadhyay. On low-space differentially private low-rank
   factorization in the spectral norm (seed paper of this package; lemma and
   theorem numbers as used in the spec).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.errors import InvalidParameterError

__all__ = [
    "classical_gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_noise_multiplier",
    "jl_sensitivity_factor",
    "paper_gaussian_sigma",
]

# Stand-in for log(0) inside root finding: brentq needs finite function values,
# and any value far below log(1e-300) keeps the sign (and so the bracket) right.
_LOG_ZERO = -1.0e4


def _check_noise_multiplier(noise_multiplier: object) -> float:
    return check_float_in_interval(
        noise_multiplier,
        "noise_multiplier",
        0.0,
        math.inf,
        low_open=False,
        high_open=False,
        privacy=True,
    )


def _log_gaussian_delta(z: float, epsilon: float) -> float:
    """``log delta(z, epsilon)`` for finite ``z > 0`` and ``epsilon >= 0``."""
    # [BW18, Thm 8]: delta = Phi(a) - e^eps Phi(b) with a = 1/(2z) - eps z,
    # b = -1/(2z) - eps z.  Log space: e^eps overflows for eps > 709.
    a = 1.0 / (2.0 * z) - epsilon * z
    b = -1.0 / (2.0 * z) - epsilon * z
    log_pa = float(special.log_ndtr(a))
    log_ratio = epsilon + float(special.log_ndtr(b)) - log_pa
    if log_ratio >= 0.0:
        # delta is positive in exact arithmetic; here it has cancelled to
        # nothing, so it lies below the resolution of log_ndtr.
        return -math.inf
    return log_pa + math.log(-math.expm1(log_ratio))


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism with unit L2 sensitivity.

    Parameters
    ----------
    noise_multiplier : float
        Noise standard deviation divided by the L2 sensitivity, ``z >= 0``
        (``inf`` allowed).
    epsilon : float
        Privacy loss, ``epsilon >= 0``. ``epsilon = 0`` gives the total
        variation distance of the two output distributions.

    Returns
    -------
    float
        ``Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z)`` in ``[0, 1]``
        [BW18, Thm 8].

    Raises
    ------
    PrivacyConfigError
        If ``noise_multiplier < 0`` or ``epsilon < 0``.

    Notes
    -----
    Evaluated in log space with ``scipy.special.log_ndtr`` so that large
    ``epsilon`` (e.g. 50) does not overflow ``e^eps``. A value that underflows
    is returned as 0.

    Examples
    --------
    >>> round(gaussian_delta(4.365, 1.0), 9) <= 5e-7
    True
    """
    z = _check_noise_multiplier(noise_multiplier)
    eps = check_float_in_interval(
        epsilon, "epsilon", 0.0, math.inf, low_open=False, privacy=True
    )
    # dp_accounting's special cases: no noise leaks everything, infinite noise
    # nothing; both make the main formula 0/0.
    if z == 0.0:
        return 1.0
    if math.isinf(z):
        return 0.0
    return math.exp(_log_gaussian_delta(z, eps))


def _bracketed_root(func: Callable[[float], float], lo: float, hi: float) -> float:
    """Root of a decreasing ``func`` with ``func(lo) > 0 >= func(hi)``."""
    from scipy import optimize  # heavy: scipy.optimize, 0.27 s; only to calibrate

    def finite(x: float) -> float:
        value = func(x)
        return max(value, _LOG_ZERO) if value != -math.inf else _LOG_ZERO

    if finite(hi) == 0.0:
        return hi
    return float(
        optimize.brentq(finite, lo, hi, xtol=1e-15 * hi, rtol=4 * np.finfo(float).eps)
    )


def _nudge_up(x: float, ok: Callable[[float], bool]) -> float:
    """Smallest float of the form ``x + 2^k ulp`` (k = 0, 1, ...) with ``ok``."""
    # brentq returns a point within xtol of the root, on either side; step up
    # by doubling increments so the result is never optimistic.
    step = max(abs(x) * 1e-16, 5e-324)
    while not ok(x):
        x += step
        step *= 2.0
    return x


def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier ``s(epsilon, delta)`` of the Gaussian mechanism.

    Parameters
    ----------
    epsilon : float
        Target epsilon, ``epsilon > 0``.
    delta : float
        Target delta, in ``(0, 1)``.

    Returns
    -------
    float
        The smallest ``z`` (to about 1e-15 relative) with
        ``gaussian_delta(z, epsilon) <= delta``, rounded up so that this
        inequality holds for the returned value [BW18, Thm 8, Alg. 1].

    Raises
    ------
    PrivacyConfigError
        If ``epsilon <= 0`` or ``delta`` is not in ``(0, 1)``.

    Examples
    --------
    >>> round(gaussian_noise_multiplier(1.0, 5e-7), 3)
    4.365
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    log_target = math.log(dlt)

    def excess(z: float) -> float:
        return _log_gaussian_delta(z, eps) - log_target

    # delta(z) decreases in z [BW18, Lemma 7]; bracket by doubling/halving.
    lo, hi = 0.5, 1.0
    while excess(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
    while excess(lo) <= 0.0:
        lo, hi = 0.5 * lo, lo
    root = _bracketed_root(excess, lo, hi)
    return _nudge_up(root, lambda z: gaussian_delta(z, eps) <= dlt)


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """Smallest epsilon at which the Gaussian mechanism is (epsilon, delta)-DP.

    Parameters
    ----------
    noise_multiplier : float
        ``z >= 0`` (``inf`` allowed), unit L2 sensitivity.
    delta : float
        In ``(0, 1)``.

    Returns
    -------
    float
        ``0`` if ``gaussian_delta(z, 0) <= delta``; ``inf`` if ``z = 0``;
        otherwise the smallest ``epsilon`` (to about 1e-15 relative) with
        ``gaussian_delta(z, epsilon) <= delta``, rounded up.

    Raises
    ------
    PrivacyConfigError
        If ``noise_multiplier < 0`` or ``delta`` is not in ``(0, 1)``.

    Examples
    --------
    >>> round(gaussian_epsilon(4.365154941135752, 5e-7), 6)
    1.0
    """
    z = _check_noise_multiplier(noise_multiplier)
    dlt = check_float_in_interval(delta, "delta", 0.0, 1.0, privacy=True)
    if math.isinf(z):
        return 0.0
    if z == 0.0:
        # No noise: delta(0, eps) = 1 for every eps.
        return math.inf
    if gaussian_delta(z, 0.0) <= dlt:
        return 0.0
    log_target = math.log(dlt)

    def excess(eps: float) -> float:
        return _log_gaussian_delta(z, eps) - log_target

    lo, hi = 0.0, 1.0
    while excess(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
    root = _bracketed_root(excess, lo, hi)
    return _nudge_up(root, lambda e: gaussian_delta(z, e) <= dlt)


def jl_sensitivity_factor(d: int, beta: float) -> float:
    """Per-pair L2 sensitivity factor ``Delta_JL(d, beta)`` of a Gaussian sketch.

    Parameters
    ----------
    d : int
        Sketch dimension, ``d >= 1``: the sketch matrix ``Phi`` of shape
        (N, d) has i.i.d. N(0, 1/d) entries.
    beta : float
        Failure probability, in ``(0, 1)``.

    Returns
    -------
    float
        ``sqrt(1 + 2 sqrt(ln(1/beta)/d) + 2 ln(1/beta)/d)``: for any fixed E
        with ``||E||_F <= Delta_F``,
        ``Pr[||E Phi||_F > Delta_F Delta_JL(d, beta)] <= beta``.

    Raises
    ------
    InvalidParameterError
        If ``d < 1``; PrivacyConfigError if ``beta`` is not in ``(0, 1)``.

    Notes
    -----
    ``||E Phi||_F^2 = sum a_jl g_jl^2`` with ``sum a = ||E||_F^2``,
    ``||a||_2 <= ||E||_F^2 / sqrt(d)``, ``||a||_inf <= ||E||_F^2 / d``; the
    chi-square tail [LM00, Lemma 1] with ``x = ln(1/beta)`` gives the bound
    (spec section 4.2). It replaces the paper's ``sqrt(1 + alpha)``
    [Upa18, Lemma 16], which fails at practical sketch sizes.

    Examples
    --------
    >>> round(jl_sensitivity_factor(40, 2.5e-7), 3)
    1.73
    """
    dim = check_int_in_range(d, "d", 1)
    b = check_float_in_interval(beta, "beta", 0.0, 1.0, privacy=True)
    x = math.log(1.0 / b) / dim
    # [LM00, Lemma 1]: sum a (g^2 - 1) >= 2 ||a||_2 sqrt(x) + 2 ||a||_inf x
    return math.sqrt(1.0 + 2.0 * math.sqrt(x) + 2.0 * x)


def paper_gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float = 1.0
) -> float:
    """Return the paper's Gaussian noise ``sensitivity sqrt(ln(1/delta)) / epsilon``.

    UNSAFE: never used for calibration. Kept only so that a regression test
    can show that it violates delta (at epsilon=1, delta=1e-6 its true delta is
    about 1.06e-5) [Upa18, Thm 37]; spec section 4.3.

    Parameters
    ----------
    epsilon : float
        ``epsilon > 0``.
    delta : float
        In ``(0, 1)``.
    sensitivity : float, optional
        L2 sensitivity, ``> 0``.

    Returns
    -------
    float
        The paper's noise standard deviation.

    Examples
    --------
    >>> round(paper_gaussian_sigma(1.0, 1e-6), 3)
    3.717
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    sens = check_float_in_interval(sensitivity, "sensitivity", 0.0, math.inf)
    return sens * math.sqrt(math.log(1.0 / dlt)) / eps


def classical_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Classical Gaussian noise multiplier ``sqrt(2 ln(1.25/delta)) / epsilon``.

    A cross-check only; calibration uses :func:`gaussian_noise_multiplier`,
    which is never larger.

    Parameters
    ----------
    epsilon : float
        In ``(0, 1)``: the classical bound [DR14, Thm A.1] is proved only
        for ``epsilon < 1``.
    delta : float
        In ``(0, 1)``.

    Returns
    -------
    float
        Noise multiplier for unit L2 sensitivity.

    Raises
    ------
    InvalidParameterError
        If ``epsilon >= 1`` (PrivacyConfigError for other invalid values).

    Examples
    --------
    >>> round(classical_gaussian_sigma(0.5, 5e-7), 3)
    10.856
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    if eps >= 1.0:
        raise InvalidParameterError(
            "epsilon must be in (0, 1) for the classical Gaussian bound "
            f"[DR14, Thm A.1], got epsilon={eps!r}."
        )
    return math.sqrt(2.0 * math.log(1.25 / dlt)) / eps
