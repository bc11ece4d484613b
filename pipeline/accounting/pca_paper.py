"""[P]'s literal noise constants: the PCA (Alg. 1-3) and the selection (setting (23)).

Problem. Reproduce the calibration of [P] for comparison with the exact GDP
calibration of :mod:`pipeline.accounting.pca`: the classical Gaussian mechanism
(valid for epsilon <= 1) with advanced composition over the iterations, and the
selection's setting (23) with its bound (22). The constants are valid only
under numeric preconditions, which are checked, and are far more conservative
than claimed (realised epsilon about 0.36 at nominal 1, spec power-pca 3.4).

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
"""

from __future__ import annotations

import math
from typing import Any

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.accounting.pca_random_stopping import trial_rho
from pipeline.accounting.pca_sensitivity import pca_sensitivities
from pipeline.errors import PrivacyConfigError

__all__ = [
    "paper_constants",
    "paper_selection_constants",
    "unchecked_paper_constants",
]


def unchecked_paper_constants(
    epsilon: float, delta: float, iterations: int
) -> dict[str, float | None]:
    """[P]'s constants without checking the arguments or [P]'s preconditions.

    Parameters
    ----------
    epsilon, delta : float
        A budget already checked by the caller.
    iterations : int
        ``T >= 0``; 0 is Analyze Gauss alone.

    Returns
    -------
    dict
        As :func:`paper_constants`, which checks the arguments and the
        preconditions first; a report restating a checked plan uses this one.
    """
    if iterations == 0:
        eps_init, delta_init = epsilon, delta
        eps_pow = delta_pow = eps_iter = delta_iter = noise_iter = None
    else:
        # [P, Alg. 3, steps 1-2]: halves for init and power method; Lemma 12.
        eps_init, delta_init = epsilon / 2.0, delta / 2.0
        eps_pow, delta_pow = epsilon / 2.0, delta / 2.0
        t = iterations
        eps_iter = eps_pow / (4.0 * math.sqrt(2.0 * t * math.log((t + 1) / delta_pow)))
        delta_iter = delta_pow / (2.0 * (t + 1))
        # [P, Alg. 2, step 1]; the same Delta for H and for Z (times R).
        noise_iter = 2.0 * math.sqrt(2.0 * math.log(2.0 / delta_iter)) / eps_iter
    # [P, Alg. 1, step 1]
    noise_init = 2.0 * math.sqrt(2.0 * math.log(2.0 / delta_init)) / eps_init
    return {
        "noise_init": noise_init,
        "noise_iter": noise_iter,
        "eps_init": eps_init,
        "delta_init": delta_init,
        "eps_pow": eps_pow,
        "delta_pow": delta_pow,
        "eps_iter": eps_iter,
        "delta_iter": delta_iter,
    }


def _value(c: dict[str, float | None], key: str) -> float:
    value = c[key]
    assert value is not None, key
    return value


def _check_paper_preconditions(c: dict[str, float | None], iterations: int) -> None:
    """Raise unless the classical Gaussian and composition theorems apply."""
    fail = (
        "accounting='paper' requires {cond} ({why}), got {got}; use accounting='gdp'."
    )
    eps_init = _value(c, "eps_init")
    share = "epsilon/2" if iterations else "epsilon"
    if not eps_init <= 1.0:
        raise PrivacyConfigError(
            fail.format(
                cond=f"eps_init = {share} <= 1",
                why="classical Gaussian mechanism, [P] Lemma 11",
                got=f"eps_init={eps_init!r}",
            )
        )
    if iterations == 0:
        return
    eps_iter = _value(c, "eps_iter")
    eps_pow = _value(c, "eps_pow")
    delta_pow = _value(c, "delta_pow")
    checks = (
        (
            eps_iter <= 1.0,
            "eps_iter <= 1",
            "classical Gaussian mechanism, [P] Lemma 12",
        ),
        (2.0 * eps_iter < 1.0, "2 eps_iter < 1", "advanced composition, [P] Lemma 12"),
        (
            eps_pow <= 2.0 * math.log((iterations + 1) / delta_pow),
            "eps_pow <= 2 log((T + 1) / delta_pow)",
            "advanced composition, [P] Lemma 12",
        ),
    )
    for ok, cond, why in checks:
        if not ok:
            raise PrivacyConfigError(
                fail.format(
                    cond=cond,
                    why=why,
                    got=f"eps_iter={eps_iter!r}, eps_pow={eps_pow!r}, T={iterations}",
                )
            )


def paper_constants(epsilon: float, delta: float, iterations: int) -> dict[str, Any]:
    """The literal noise constants of [P, Alg. 1-3] (spec 2.3).

    Parameters
    ----------
    epsilon : float
        Nominal epsilon of the whole run, ``> 0``.
    delta : float
        In ``(0, 1)``.
    iterations : int
        ``T >= 1`` for Algorithm 3; 0 for Analyze Gauss alone with the whole
        budget.

    Returns
    -------
    dict
        ``noise_init`` (``4 sqrt(2 log(4/delta)) / epsilon``, or
        ``2 sqrt(2 log(2/delta)) / epsilon`` for T = 0), ``noise_iter``
        (``Delta = 32 sqrt(T log(8(T+1)/delta) log(2(T+1)/delta)) / epsilon``,
        the std of the ``H`` noise and, times ``R``, of the ``Z`` noise),
        ``eps_init``, ``delta_init``, ``eps_pow``, ``delta_pow``,
        ``eps_iter = epsilon / (8 sqrt(2T log(2(T+1)/delta)))`` and
        ``delta_iter = delta / (4(T+1))`` (None where T = 0).

    Raises
    ------
    PrivacyConfigError
        If ``(epsilon, delta)`` is invalid or a precondition of [P]'s theorems
        fails: ``eps_init <= 1``, ``eps_iter <= 1``, ``2 eps_iter < 1``,
        ``eps_pow <= 2 log((T+1)/delta_pow)``. The message names it.

    Examples
    --------
    >>> c = paper_constants(1.0, 1e-6, 10)
    >>> round(c["noise_init"], 2), round(c["noise_iter"], 1)
    (22.06, 1779.6)
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    t = check_int_in_range(iterations, "iterations", 0)
    c = unchecked_paper_constants(eps, dlt, t)
    _check_paper_preconditions(c, t)
    return c


def paper_selection_constants(
    *, epsilon: float, delta: float, beta: float, n_grid: int
) -> dict[str, float]:
    """[P]'s setting (23) of the selection's noise, and its bound (22).

    Parameters
    ----------
    epsilon : float
        Nominal epsilon, ``> 0`` ([P] claims it for ``epsilon < 1``).
    delta : float
        In ``(0, 1)``.
    beta : float
        In ``(0, 1)``.
    n_grid : int
        ``m >= 1``, the number of ``(R, T)`` grid points.

    Returns
    -------
    dict
        ``theta = beta / (8m)``, ``D = log(1/(theta delta))``,
        ``nu = epsilon^2 / (100 D)``, ``noise_init = sqrt(6/nu)``,
        ``chi = sqrt(12/nu)``, ``zeta = sqrt(3/(2 nu))``, ``rho_total``,
        ``rho_trial`` and ``bound_22``, the epsilon of [P, eq. (22)]:
        ``rho_tot + 2 sqrt(rho_tot D) + 4 sqrt(rho_b log(1/theta))`` (with
        [P]'s sensitivities).

    Examples
    --------
    >>> c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    >>> round(c["noise_init"], 1), round(c["chi"], 1), round(c["zeta"], 1)
    (115.1, 162.7, 57.5)
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    b = check_float_in_interval(beta, "beta", 0.0, 1.0)
    m = check_int_in_range(n_grid, "n_grid", 1)
    # [P, Thm 36, setting (23)]
    theta = b / (8.0 * m)
    log_d = math.log(1.0 / (theta * dlt))
    nu = eps**2 / (100.0 * log_d)
    noise_init, chi, zeta = (math.sqrt(c / nu) for c in (6.0, 12.0, 1.5))
    rho_trial = trial_rho(chi, zeta, pca_sensitivities("paper", "replace"))
    rho_total = 2.0 / noise_init**2 + rho_trial
    bound = (
        rho_total
        + 2.0 * math.sqrt(rho_total * log_d)
        + 4.0 * math.sqrt(rho_trial * math.log(1.0 / theta))
    )
    return {
        "theta": theta,
        "D": log_d,
        "nu": nu,
        "noise_init": noise_init,
        "chi": chi,
        "zeta": zeta,
        "rho_total": rho_total,
        "rho_trial": rho_trial,
        "bound_22": bound,
    }
