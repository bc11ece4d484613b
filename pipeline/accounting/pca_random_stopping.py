"""Calibration of the private selection of ``(R, T)`` by random stopping [P, App. C].

Problem. Choose ``(R, T)`` privately over public grids with [P]'s Algorithm 5:
one Analyze Gauss warm start, then a random number ``N`` of trials, each a power
method at a uniformly drawn grid point plus a noisy score, and only the best
trial released. This is not a composition of Gaussians: it is accounted in
Renyi DP with dp_accounting's ``RepeatAndSelectDpEvent`` [PS22, Thm 2], the
number of trials drawn from a geometric distribution conditioned on
``N <= N_max`` and the truncation charged to delta (spec 2.5, 3.5, decision
D6). ``select=True`` uses it only with an explicit ``expected_trials``; its
default is :mod:`pipeline.accounting.pca_selection`.

dp_accounting is imported lazily, inside the functions that use it.

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
.. [PS22] Papernot, Steinke. Hyperparameter tuning with Renyi differential
   privacy. ICLR 2022, arXiv:2110.03620.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.accounting.events import ApproxDpEvent
from pipeline.accounting.pca_sensitivity import PcaSensitivities, pca_sensitivities
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.params import PcaParams

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "SelectionCalibration",
    "calibrate_selection",
    "selection_rdp_epsilon",
    "trial_rho",
]

# LEDGER_CHECK slack, as in calibration.py: covers rounding in mu only.
_CHECK_RTOL = 1e-9
# The selection's noise is found by root finding on the RDP epsilon; the
# result is on the safe side, this only bounds the re-evaluated value.
_SELECTION_RTOL = 1e-6
# Default cap N_max = ceil(L / theta) with L = max(20, epsilon + log(100/delta)):
# truncation mass q ~ e^-L. The spec's L = 20 (spec 3.5) makes e^eps q exceed
# delta for epsilon >~ 6 at delta = 1e-6; the second term keeps the cap's cost
# at <= 1% of delta for any epsilon, and equals 20 at (1, 1e-6).
_TRUNCATION_LOG_MASS = 20.0
# Dense Renyi orders, including orders close to 1 (spec 3.5).
_RDP_ORDERS = tuple(
    sorted(
        {1.0 + x / 100.0 for x in range(1, 100)}
        | {round(1.0 + x / 10.0, 10) for x in range(1, 91)}
        | {float(x) for x in range(11, 201)}
        | {256.0, 512.0, 1024.0, 2048.0, 4096.0}
    )
)


def trial_rho(chi: float, zeta: float, sens: PcaSensitivities) -> float:
    """zCDP cost of one selection trial, the same for every ``t`` (spec 2.5, 3.5).

    Parameters
    ----------
    chi : float
        Noise multiplier of the power method's releases ``H``, ``Z`` (all ``t``).
    zeta : float
        Noise multiplier of the trial's score.
    sens : PcaSensitivities
        ``gram`` (of ``H``) and ``clip`` (of ``Z``, per unit of clip radius).

    Returns
    -------
    float
        ``rho`` of one trial: ``(gram^2 + clip^2) / (2 chi^2) + 1 / (2 zeta^2)``
        (the score's noise is ``zeta`` times its sensitivity).
    """
    # t iterations x (H: s_gram^2 / (2 chi^2 t) + Z: (c R)^2 / (2 chi^2 t R^2)),
    # plus the score: std s_score zeta for sensitivity s_score.
    return (sens.gram**2 + sens.clip**2) / (2.0 * chi**2) + 1.0 / (2.0 * zeta**2)


def _selection_event(
    noise_init: float, chi: float, zeta: float, theta: float, sens: PcaSensitivities
) -> dp_accounting.ComposedDpEvent:
    import dp_accounting  # heavy: dp_accounting, 2-3 s to import
    from dp_accounting import dp_event  # heavy: dp_accounting

    base = dp_accounting.GaussianDpEvent(
        noise_multiplier=1.0 / math.sqrt(2.0 * trial_rho(chi, zeta, sens))
    )
    return dp_accounting.ComposedDpEvent(
        events=[
            dp_accounting.GaussianDpEvent(noise_multiplier=noise_init / sens.gram),
            # shape=1: the number of trials is geometric with mean 1/theta.
            dp_event.RepeatAndSelectDpEvent(event=base, mean=1.0 / theta, shape=1.0),
        ]
    )


def _rdp_epsilon_and_order(
    noise_init: float,
    chi: float,
    zeta: float,
    theta: float,
    sens: PcaSensitivities,
    delta: float,
) -> tuple[float, float]:
    from dp_accounting import rdp  # heavy: dp_accounting, 2-3 s to import

    accountant = rdp.RdpAccountant(orders=list(_RDP_ORDERS))
    accountant.compose(_selection_event(noise_init, chi, zeta, theta, sens))
    eps, order = accountant.get_epsilon_and_optimal_order(delta)
    return float(eps), float(order)


def selection_rdp_epsilon(
    *,
    noise_init: float,
    chi: float,
    zeta: float,
    theta: float,
    delta: float,
    sensitivity: str = "paper",
    neighboring: str = "replace",
) -> float:
    """RDP epsilon of the (untruncated) selection procedure by dp_accounting.

    Parameters
    ----------
    noise_init : float
        ``Delta_init > 0``, std of the noise on ``M``.
    chi : float
        ``> 0``: ``H`` and ``Z`` of a trial with ``t`` iterations get std
        ``chi sqrt(t)`` (``Z``: times ``R``).
    zeta : float
        ``> 0``: the score's std is ``s_score zeta``.
    theta : float
        In ``(0, 1]``: the number of trials is geometric with mean ``1/theta``.
    delta : float
        In ``(0, 1)``.
    sensitivity : {"paper", "tight"}, optional
        ``s_gram`` of ``M`` and ``H``.
    neighboring : {"replace", "add-remove"}, optional
        The relation of the sensitivities ([P]'s replacement by default here).

    Returns
    -------
    float
        ``RdpAccountant`` epsilon at ``delta`` of ``ComposedDpEvent([Gaussian
        init, RepeatAndSelectDpEvent(trial, mean=1/theta, shape=1)])`` on a
        dense order grid [PS22, Thm 2] (spec 3.5).

    Examples
    --------
    >>> from pipeline.accounting.pca_paper import paper_selection_constants
    >>> c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    >>> round(selection_rdp_epsilon(noise_init=c["noise_init"], chi=c["chi"],
    ...     zeta=c["zeta"], theta=c["theta"], delta=1e-6), 3)
    0.369
    """
    dlt = check_float_in_interval(delta, "delta", 0.0, 1.0, privacy=True)
    th = check_float_in_interval(theta, "theta", 0.0, 1.0, high_open=False)
    sig_init, sig_chi, sig_zeta = (
        check_float_in_interval(v, name, 0.0, math.inf, privacy=True)
        for v, name in ((noise_init, "noise_init"), (chi, "chi"), (zeta, "zeta"))
    )
    sens = pca_sensitivities(sensitivity, neighboring)
    return _rdp_epsilon_and_order(sig_init, sig_chi, sig_zeta, th, sens, dlt)[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectionCalibration:
    """Noise of the private selection of ``(R, T)`` and its accounting.

    Attributes
    ----------
    epsilon, delta : float
        The guarantee claimed for the selection (approximate DP; it is not a
        composition of Gaussians, so a ledger composes it by basic
        composition).
    rank, n_features, n_rows : int
        ``k``, ``d``, ``n`` (shapes are public under both relations).
    sensitivity_mode : {"tight", "paper"}
    neighboring : {"add-remove", "replace"}
    beta : float
        Utility failure probability; sets ``theta`` (by default) and ``gamma``.
    radii : tuple of float
        The public grid of clip radii.
    iteration_grid : tuple of int
        The public grid of iteration counts.
    theta : float
        The number of trials ``N`` is geometric on {1, 2, ...} with parameter
        ``theta``.
    expected_trials : float
        ``1 / theta``.
    max_trials : int
        ``N_max``: ``N`` is drawn conditioned on ``N <= N_max``.
    truncation_q : float
        ``q = (1 - theta)^N_max``, the mass removed by the cap.
    noise_init : float
        Std of the noise on ``M`` (shared by all trials).
    chi : float
        A trial with ``t`` iterations uses ``Delta(t) = chi sqrt(t)`` for
        ``H`` (sym noise) and for ``Z`` (times ``R_eff``).
    zeta : float
        The score's noise std is ``s_score zeta`` with ``s_score = s_gram/h``;
        see :meth:`score_noise`.
    rdp_epsilon : float
        dp_accounting RDP epsilon of the untruncated procedure at
        ``delta_rdp``; ``<= epsilon``.
    delta_rdp : float
        ``delta (1 - q) - e^epsilon q``, so that the truncated procedure is
        ``(epsilon, (delta_rdp + e^epsilon q) / (1 - q)) = (epsilon, delta)``.
    rdp_order : float
        The Renyi order attaining ``rdp_epsilon``.
    gamma_scale : float
        Public multiplier of [P]'s eigenvalue floor.
    """

    epsilon: float
    delta: float
    rank: int
    n_features: int
    n_rows: int
    sensitivity_mode: str
    beta: float
    radii: tuple[float, ...]
    iteration_grid: tuple[int, ...]
    theta: float
    expected_trials: float
    max_trials: int
    truncation_q: float
    noise_init: float
    chi: float
    zeta: float
    rdp_epsilon: float
    delta_rdp: float
    rdp_order: float
    gamma_scale: float = 1.0
    neighboring: str = "add-remove"

    @property
    def sensitivities(self) -> PcaSensitivities:
        """The bounds of ``sensitivity_mode`` under ``neighboring``."""
        return pca_sensitivities(self.sensitivity_mode, self.neighboring)

    @property
    def n_grid(self) -> int:
        """``m``, the number of ``(R, T)`` grid points."""
        return len(self.radii) * len(self.iteration_grid)

    @property
    def rho_init(self) -> float:
        """zCDP cost of ``M``."""
        return self.sensitivities.gram**2 / (2.0 * self.noise_init**2)

    @property
    def rho_trial(self) -> float:
        """zCDP cost of one trial (its ``H``, ``Z`` and score), whatever its ``t``."""
        return trial_rho(self.chi, self.zeta, self.sensitivities)

    def noise_iter(self, t: int) -> float:
        """``Delta(t) = chi sqrt(t)``, the std of ``H`` (and of ``Z`` over ``R``).

        Parameters
        ----------
        t : int
            Iterations of the trial, ``>= 1``.

        Returns
        -------
        float
        """
        t = check_int_in_range(t, "t", 1)
        return self.chi * math.sqrt(t)

    def gamma(self, t: int) -> float:
        """Eigenvalue floor of a trial with ``t`` iterations.

        Returns
        -------
        float
            ``gamma_scale 4 Delta(t) (2 sqrt(k) + sqrt(2 log(4t / beta_0)))``
            with ``beta_0 = beta / 2`` [P, App. C] (decision D4).
        """
        beta0 = self.beta / 2.0
        return (
            self.gamma_scale
            * 4.0
            * self.noise_iter(t)
            * (2.0 * math.sqrt(self.rank) + math.sqrt(2.0 * math.log(4.0 * t / beta0)))
        )

    def effective_clip_radius(self, radius: float, t: int) -> float:
        """``R_eff = min(R, gamma(t)^(-1/2))``: larger radii never clip (spec 2.2)."""
        r = check_float_in_interval(radius, "radius", 0.0, math.inf, privacy=True)
        # typeshed types float ** float as Any (a negative base gives a complex)
        unclipped: float = self.gamma(t) ** -0.5
        return min(r, unclipped)

    def score_noise(self, h: float) -> float:
        """Std of the score's noise for the public gap ``h > 0`` [P, Alg. 4, step 5].

        Returns
        -------
        float
            ``s_score zeta`` with ``s_score = 2/h`` (paper) or ``sqrt(2)/h``
            (tight): the score's cost ``1 / (2 zeta^2)`` does not depend on
            ``h`` or the mode.
        """
        gap = check_float_in_interval(h, "h", 0.0, math.inf)
        # Lemma 35: f_{a,b} is 1/h-Lipschitz, so the score moves by s_gram / h.
        return self.sensitivities.score(gap) * self.zeta

    def truncated_delta(self, delta_rdp: float | None = None) -> float:
        """``(delta_rdp + e^epsilon q) / (1 - q)``: delta of the capped procedure."""
        d = self.delta_rdp if delta_rdp is None else delta_rdp
        # spec 3.5: N is data-independent; conditioning on N <= N_max scales
        # every output probability by at most 1/(1 - q).
        return (d + math.exp(self.epsilon) * self.truncation_q) / (
            1.0 - self.truncation_q
        )

    def to_dp_event(self) -> dp_accounting.ComposedDpEvent:
        """The untruncated procedure as a dp_accounting event (RDP only)."""
        return _selection_event(
            self.noise_init, self.chi, self.zeta, self.theta, self.sensitivities
        )

    def check(self) -> None:
        """Re-account the recorded noise: an internal bug guard.

        Raises
        ------
        PrivacyConfigError
            If ``truncation_q`` or ``expected_trials`` does not match
            ``theta`` and ``max_trials``, if the truncated delta exceeds
            ``delta (1 + 1e-9)``, or if dp_accounting's RDP epsilon of the
            recorded noise at ``delta_rdp`` exceeds ``epsilon (1 + 1e-6)``.
        """
        q = _truncation_mass(self.theta, self.max_trials)
        if not (
            self.truncation_q >= q * (1 - _CHECK_RTOL)
            and math.isclose(self.expected_trials * self.theta, 1.0, rel_tol=1e-12)
        ):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: truncation_q={self.truncation_q!r} and "
                f"expected_trials={self.expected_trials!r} do not match "
                f"theta={self.theta!r}, max_trials={self.max_trials}."
            )
        if not (
            self.delta_rdp > 0.0
            and self.truncated_delta() <= self.delta * (1 + _CHECK_RTOL)
        ):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: delta_rdp={self.delta_rdp!r} with the cap "
                f"gives delta={self.truncated_delta()!r}, above delta={self.delta!r}."
            )
        eps, _ = _rdp_epsilon_and_order(
            self.noise_init,
            self.chi,
            self.zeta,
            self.theta,
            self.sensitivities,
            self.delta_rdp,
        )
        if not eps <= self.epsilon * (1 + _SELECTION_RTOL):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: the recorded selection noise gives RDP "
                f"epsilon={eps!r} at delta={self.delta_rdp!r}, above "
                f"epsilon={self.epsilon!r}."
            )

    def privacy_event(self) -> ApproxDpEvent:
        """The selection as a ledger event: ``(epsilon, delta)``-DP, not a Gaussian.

        Composed with the rest by basic composition; the ledger runs
        :meth:`check` (the RDP re-accounting) before it charges.
        """
        return ApproxDpEvent(self.epsilon, self.delta)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable privacy report (spec 3.6; public values only)."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": "rdp",
            "rank": self.rank,
            "n_features": self.n_features,
            "n_rows": self.n_rows,
            "sensitivity_mode": self.sensitivity_mode,
            "neighboring": self.neighboring,
            "beta": self.beta,
            "radii": list(self.radii),
            "iteration_grid": list(self.iteration_grid),
            "n_grid": self.n_grid,
            "theta": self.theta,
            "expected_trials": self.expected_trials,
            "max_trials": self.max_trials,
            "truncation_q": self.truncation_q,
            "noise_init": self.noise_init,
            "chi": self.chi,
            "zeta": self.zeta,
            "gamma_scale": self.gamma_scale,
            "rho_init": self.rho_init,
            "rho_trial": self.rho_trial,
            "rdp_epsilon": self.rdp_epsilon,
            "rdp_order": self.rdp_order,
            "delta_rdp": self.delta_rdp,
        }


def _truncation_mass(theta: float, max_trials: int) -> float:
    """``(1 - theta)^N_max``, computed without cancellation for small theta."""
    if theta >= 1.0:
        return 0.0
    return math.exp(max_trials * math.log1p(-theta))


def _check_grids(
    radii: object, iteration_grid: object
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    grids = []
    for name, value in (("radii", radii), ("iteration_grid", iteration_grid)):
        values = tuple(value) if isinstance(value, Iterable) else ()
        if isinstance(value, str) or not values:
            raise InvalidParameterError(
                f"{name} must be a non-empty sequence, got {name}={value!r}."
            )
        if name == "radii":
            items: tuple[Any, ...] = tuple(
                check_float_in_interval(r, "radii[*]", 0.0, math.inf, privacy=True)
                for r in values
            )
        else:
            items = tuple(check_int_in_range(t, "iteration_grid[*]", 1) for t in values)
        if len(set(items)) != len(items):
            raise InvalidParameterError(
                f"{name} must hold distinct values, got {name}={list(items)}."
            )
        grids.append(items)
    return grids[0], grids[1]


def _solve_nu(
    target: float,
    nu0: float,
    theta: float,
    sens: PcaSensitivities,
    delta_rdp: float,
) -> tuple[float, float, float]:
    """Largest ``nu`` (to ~1e-10 relative) whose RDP epsilon is ``<= target``.

    Returns ``(nu, epsilon, order)``. Each evaluation runs dp_accounting's
    accountant (tens of ms), so evaluations are cached and the bracket starts
    near the answer.
    """
    from scipy import optimize  # heavy: scipy.optimize, 0.27 s to import

    cache: dict[float, tuple[float, float]] = {}

    def eps_of(log_nu: float) -> tuple[float, float]:
        if log_nu not in cache:
            nu = math.exp(log_nu)
            sig = (math.sqrt(6.0 / nu), math.sqrt(12.0 / nu), math.sqrt(1.5 / nu))
            cache[log_nu] = _rdp_epsilon_and_order(*sig, theta, sens, delta_rdp)
        return cache[log_nu]

    def excess(log_nu: float) -> float:
        return eps_of(log_nu)[0] - target

    # eps grows with nu (less noise), roughly like sqrt(nu) [PS22, Thm 2]:
    # aim from [P]'s setting (23), then widen a small bracket until it holds.
    x0 = math.log(nu0)
    e0 = eps_of(x0)[0]
    x1 = x0 + 2.0 * math.log(target / e0) if e0 > 0.0 else x0
    step = 0.05
    lo, hi = x1 - step, x1 + step
    while excess(hi) <= 0.0:
        lo, hi, step = hi, hi + 2.0 * step, 2.0 * step
    while excess(lo) > 0.0:
        lo, hi, step = lo - 2.0 * step, lo, 2.0 * step
    xtol, rtol = 1e-10, 1e-12
    root = float(optimize.brentq(excess, lo, hi, xtol=xtol, rtol=rtol))
    # brentq's point is within xtol + rtol |root| of the root, on either side;
    # one step of twice that is below it, and lo always is.
    below = root - 2.0 * (xtol + rtol * abs(root))
    best = next(x for x in (root, below, lo) if excess(x) <= 0.0)
    return (math.exp(best), *eps_of(best))


def calibrate_selection(
    params: PcaParams,
    *,
    n_rows: int,
    n_features: int,
    radii: Sequence[float],
    iteration_grid: Sequence[int],
    expected_trials: float | None = None,
    max_trials: int | None = None,
) -> SelectionCalibration:
    """Calibrate the noise of the private selection of ``(R, T)`` [P, Alg. 5].

    Parameters
    ----------
    params : PcaParams
        ``epsilon`` (``> 0``) and ``delta`` (in ``(0, 1)``); ``rank`` ``k``,
        ``1 <= k < n_features``; ``beta`` in ``(0, 1)`` (``theta = beta / (8m)``
        by default, ``m`` the grid size); ``sensitivity`` (``s_gram`` of ``M``
        and ``H`` and ``s_score = s_gram / h``); ``gamma_scale`` (public
        ``> 0`` multiplier of the eigenvalue floor); ``neighboring`` (the
        relation of the sensitivities). Its other fields are a fixed run's.
    n_rows : int
        ``n >= 1`` (public under replacement adjacency).
    n_features : int
        ``d >= 2``.
    radii : sequence of float
        Public grid of clip radii, distinct, each ``> 0``.
    iteration_grid : sequence of int
        Public grid of iteration counts, distinct, each ``>= 1``.
    expected_trials : float or None, optional
        ``E[N] >= 1``; overrides the default ``theta`` with ``1/E[N]``.
    max_trials : int or None, optional
        ``N_max >= 1``; default ``ceil(L / theta)`` with
        ``L = max(20, epsilon + log(100 / delta))`` (``q ~ e^-L``; the cap then
        costs at most 1% of delta, for any epsilon).

    Returns
    -------
    SelectionCalibration
        With [P]'s ratios ``noise_init^2 = 6/nu``, ``chi^2 = 12/nu``,
        ``zeta^2 = 3/(2 nu)`` and the largest ``nu`` whose dp_accounting RDP
        epsilon at ``delta_rdp`` is at most ``epsilon``.

    Raises
    ------
    PrivacyConfigError
        For an invalid ``(epsilon, delta)`` or radius, or a cap so small that
        its truncation mass alone exceeds ``delta``.
    InvalidParameterError
        For any other parameter out of range.

    Notes
    -----
    Privacy. Replacement adjacency on rows with norm <= 1. ``M`` is released
    once (``rho_init = s_gram^2 / (2 noise_init^2)``); a trial with ``t``
    iterations releases ``t`` pairs ``(H, Z)`` with std ``chi sqrt(t)`` and a
    score, so its cost ``rho_b = s_gram^2/(2 chi^2) + 2/chi^2 + 1/(2 zeta^2)``
    does not depend on ``(R, t)``. Only the best trial is released: RDP of
    random stopping with a geometric number of trials [PS22, Thm 2], via
    dp_accounting's ``RepeatAndSelectDpEvent``. Capping ``N`` at ``N_max``
    costs ``delta = (delta_rdp + e^epsilon q) / (1 - q)`` (spec 3.5). The
    trials other than the winner must stay secret.

    Examples
    --------
    >>> from pipeline.params import PcaParams
    >>> sel = calibrate_selection(PcaParams(rank=2, epsilon=1.0, delta=1e-6),
    ...     n_rows=2**16, n_features=64, radii=[0.01, 0.02, 0.04, 0.08],
    ...     iteration_grid=[1, 2, 4])
    >>> sel.n_grid, sel.max_trials, sel.rdp_epsilon <= 1.0
    (12, 19200, True)
    """
    eps, dlt = check_privacy_pair(params.epsilon, params.delta)
    d = check_int_in_range(n_features, "n_features", 2)
    k = check_int_in_range(params.rank, "rank", 1, d - 1, what="[1, n_features - 1]")
    n = check_int_in_range(n_rows, "n_rows", 1)
    b, g_scale = float(params.beta), float(params.gamma_scale)
    mode, relation = params.sensitivity, params.neighboring
    rs, ts = _check_grids(radii, iteration_grid)
    m = len(rs) * len(ts)
    if expected_trials is None:
        theta = b / (8.0 * m)  # [P, App. C]: Pr[no good trial] <= beta / 4
    else:
        theta = 1.0 / check_float_in_interval(
            expected_trials, "expected_trials", 1.0, math.inf, low_open=False
        )
    if max_trials is None:
        log_mass = max(_TRUNCATION_LOG_MASS, eps + math.log(100.0 / dlt))
        n_max = math.ceil(log_mass / theta)
    else:
        n_max = check_int_in_range(max_trials, "max_trials", 1)
    q = _truncation_mass(theta, n_max)
    # spec 3.5: (delta_rdp + e^eps q) / (1 - q) == delta.
    delta_rdp = dlt * (1.0 - q) - math.exp(eps) * q
    if not delta_rdp > 0.0:
        # A cap whose truncation costs 1% of delta: e^eps q = delta / 100.
        hint = math.ceil((math.log(dlt / 100.0) - eps) / math.log1p(-theta))
        raise PrivacyConfigError(
            f"max_trials must make the truncation mass q = (1 - theta)^max_trials "
            f"smaller than delta / (e^epsilon + delta), got max_trials={n_max} "
            f"(q={q:.3g}, theta={theta:.3g}); e.g. max_trials={hint} costs 1% "
            "of delta."
        )
    sens = pca_sensitivities(mode, relation)
    # Start from [P]'s setting (23); keep its ratios, scale the common nu.
    nu0 = eps**2 / (100.0 * math.log(1.0 / (theta * dlt)))
    nu, rdp_eps, order = _solve_nu(eps, nu0, theta, sens, delta_rdp)
    if not rdp_eps <= eps * (1 + _SELECTION_RTOL):  # pragma: no cover - a bug
        raise PrivacyConfigError(
            f"selection calibration failed: RDP epsilon={rdp_eps!r} > {eps!r}."
        )
    return SelectionCalibration(
        epsilon=eps,
        delta=dlt,
        rank=k,
        n_features=d,
        n_rows=n,
        sensitivity_mode=mode,
        beta=b,
        radii=rs,
        iteration_grid=ts,
        theta=theta,
        expected_trials=1.0 / theta,
        max_trials=n_max,
        truncation_q=q,
        noise_init=math.sqrt(6.0 / nu),
        chi=math.sqrt(12.0 / nu),
        zeta=math.sqrt(1.5 / nu),
        rdp_epsilon=rdp_eps,
        delta_rdp=delta_rdp,
        rdp_order=order,
        gamma_scale=g_scale,
        neighboring=relation,
    )
