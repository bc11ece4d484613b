"""Noise calibration and privacy accounting of the coherence-adaptive DP PCA.

Problem. The private PCA of [P] releases a sequence of Gaussian mechanisms on
an (n, d) matrix whose rows have norm at most 1, under replacement adjacency
(spec power-pca sections 1.2 and 3.1):

* ``M = A^T A + noise_init sym(G)`` (d x d), Frobenius sensitivity ``s_gram``;
* for ``t < T``: ``H_t = X^T A^T A X + noise_H sym(G_t)`` (k x k), sensitivity
  ``s_gram``, and ``Z_t = sum_i a_i Clip_R(a_i^T X B) + noise_Z R G~_t``
  (d x k), sensitivity ``2 R``,

with ``s_gram = 2`` as in [P] or ``sqrt(2)``, the true supremum (spec 3.1,
decision D2). Given ``(epsilon, delta)``, choose ``noise_init``, ``noise_H``,
``noise_Z`` so that the whole run is ``(epsilon, delta)``-DP, and record the
mechanisms so that the claim can be re-checked and charged to a ledger.

Two calibrations (spec 2.3, 3.4, decision D1):

* ``"gdp"`` (default): the adaptive composition of Gaussian mechanisms with
  sensitivities ``s_i`` and noise ``sigma_i`` is exactly ``mu``-GDP with
  ``mu^2 = sum_i s_i^2 / sigma_i^2`` [DRS22, Cor. 3.3]; ``mu`` is solved from
  the analytic Gaussian profile ``delta_mu(epsilon) = delta`` [BW18, Thm 8] and
  the zCDP budget ``rho = mu^2 / 2`` is split between the releases;
* ``"paper"``: the literal constants of [P, Alg. 1-3] (classical Gaussian
  mechanism plus advanced composition), kept for reproduction. They are valid
  only under numeric preconditions, which are checked, and are far more
  conservative than claimed (realised epsilon about 0.36 at nominal 1).

The selection of ``(R, T)`` by random stopping [P, App. C, Alg. 5] is not a
composition of Gaussians: it is accounted in Renyi DP with dp_accounting's
``RepeatAndSelectDpEvent`` [PS22, Thm 2], with the number of trials drawn from
a geometric distribution conditioned on ``N <= N_max`` and the truncation
charged to delta (spec 2.5, 3.5, decision D6).

dp_accounting is imported lazily, inside the functions that use it.

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy: analytical calibration and optimal denoising. ICML 2018,
   arXiv:1805.06530.
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS-B 84(1), 2022,
   arXiv:1905.02383.
.. [BS16] Bun, Steinke. Concentrated differential privacy: simplifications,
   extensions, and lower bounds. TCC 2016, arXiv:1605.02065.
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
from pipeline.accounting.gaussian import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
)
from pipeline.accounting.pca_sensitivity import (
    NEIGHBORINGS,
    SENSITIVITIES,
    PcaSensitivities,
    pca_sensitivities,
)
from pipeline.accounting.pca_sensitivity import check_choice as _check_choice
from pipeline.errors import InvalidParameterError, PrivacyConfigError

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "ACCOUNTINGS",
    "METHODS",
    "NEIGHBORINGS",
    "SENSITIVITIES",
    "PcaCalibration",
    "PcaMechanism",
    "SelectionCalibration",
    "calibrate_pca",
    "calibrate_selection",
    "gram_sensitivity",
    "paper_constants",
    "paper_selection_constants",
    "pld_epsilon_of",
    "selection_rdp_epsilon",
]

ACCOUNTINGS = ("gdp", "paper")
METHODS = ("power", "analyze-gauss")

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


def gram_sensitivity(mode: str, neighboring: str = "replace") -> float:
    """Frobenius sensitivity of ``sum_i u_i u_i^T`` with ``||u_i|| <= 1``.

    Parameters
    ----------
    mode : {"tight", "paper"}
        ``"tight"``: the supremum (``sqrt(2)`` under replacement, spec 3.1);
        ``"paper"``: 2, the triangle inequality used by [P, Lemma 11].
    neighboring : {"replace", "add-remove"}, optional
        Under add/remove both modes give 1 (one summand).

    Returns
    -------
    float

    Examples
    --------
    >>> gram_sensitivity("paper"), round(gram_sensitivity("tight"), 4)
    (2.0, 1.4142)
    >>> gram_sensitivity("tight", "add-remove")
    1.0
    """
    return pca_sensitivities(mode, neighboring).gram


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaMechanism:
    """One Gaussian release of the PCA, possibly repeated.

    Attributes
    ----------
    label : str
        ``"M"`` (Analyze Gauss Gram, d x d), ``"H"`` (k x k) or ``"Z"`` (d x k).
    shape : tuple of int
        Shape of one release.
    symmetric : bool
        True for ``M`` and ``H``: the noise is ``sigma sym(G)``, isotropic with
        std ``sigma`` in an orthonormal basis of symmetric matrices (spec 3.2).
    sensitivity : float
        L2 (Frobenius) sensitivity under the calibration's relation.
    sigma : float
        Noise std per orthonormal coordinate (for ``Z``: ``noise_Z R_eff``).
    count : int
        Number of identical releases (``T`` for ``H`` and ``Z``, 1 for ``M``).
    """

    label: str
    shape: tuple[int, int]
    symmetric: bool
    sensitivity: float
    sigma: float
    count: int

    @property
    def rho(self) -> float:
        """zCDP cost ``count s^2 / (2 sigma^2)`` of all releases [BS16, Prop. 1.6]."""
        if self.sigma <= 0.0:
            return math.inf
        return self.count * self.sensitivity**2 / (2.0 * self.sigma**2)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (public parameters only)."""
        return {
            "label": self.label,
            "shape": list(self.shape),
            "symmetric": self.symmetric,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "rho": self.rho,
            "count": self.count,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaCalibration:
    """Noise of one private PCA run and the parameters that justify it.

    Attributes
    ----------
    epsilon, delta : float
        The guarantee claimed for the release.
    method : {"power", "analyze-gauss"}
    accounting : {"gdp", "paper"}
    sensitivity_mode : {"tight", "paper"}
    neighboring : {"add-remove", "replace"}
        The neighbouring relation the sensitivities hold for.
    rank : int
        ``k``.
    n_features : int
        ``d``.
    iterations : int
        ``T`` (0 for Analyze Gauss).
    clip_radius : float or None
        ``R_eff``, the radius actually used (None for Analyze Gauss).
    requested_clip_radius : float or None
        ``R`` as given.
    beta : float
        Failure probability of the utility analysis (sets ``gamma`` only).
    init_fraction, h_fraction : float
        Budget split (``init_fraction = 1`` for Analyze Gauss).
    noise_init : float
        ``Delta_init``, std of the noise on ``M``'s symmetric coordinates.
    noise_H, noise_Z : float or None
        ``Delta_H``; ``Delta_Z`` (the noise on ``Z`` is ``noise_Z R_eff``).
    gamma : float or None
        Eigenvalue floor of ``B = (H floored at gamma)^(-1/2)``.
    mechanisms : tuple of PcaMechanism
        ``M`` (and ``H``, ``Z`` for the power method).
    """

    epsilon: float
    delta: float
    method: str
    accounting: str
    sensitivity_mode: str
    rank: int
    n_features: int
    iterations: int
    clip_radius: float | None
    requested_clip_radius: float | None
    beta: float
    init_fraction: float
    h_fraction: float
    noise_init: float
    noise_H: float | None
    noise_Z: float | None
    gamma: float | None
    mechanisms: tuple[PcaMechanism, ...]
    neighboring: str = "add-remove"

    @property
    def sensitivities(self) -> PcaSensitivities:
        """The bounds of ``sensitivity_mode`` under ``neighboring``."""
        return pca_sensitivities(self.sensitivity_mode, self.neighboring)

    @property
    def mu(self) -> float:
        """``sqrt(sum_i count_i (s_i / sigma_i)^2)``: the run is exactly mu-GDP.

        Recomputed from the recorded mechanisms, so it reflects the noise
        actually accounted [DRS22, Cor. 3.3].
        """
        if any(m.sigma <= 0.0 for m in self.mechanisms):
            return math.inf
        return math.sqrt(
            math.fsum(m.count * (m.sensitivity / m.sigma) ** 2 for m in self.mechanisms)
        )

    @property
    def effective_sensitivity(self) -> float:
        """``mu``: the run is a unit-noise Gaussian with this sensitivity."""
        return self.mu

    @property
    def rho_total(self) -> float:
        """Total zCDP cost ``mu^2 / 2``."""
        return math.fsum(m.rho for m in self.mechanisms)

    @property
    def delta_jl(self) -> float:
        """Always 0: the PCA has no sketch matrices (ledger interface)."""
        return 0.0

    def realised_epsilon(self) -> float:
        """Exact epsilon at ``delta`` of the noise actually used.

        Returns
        -------
        float
            ``gaussian_epsilon(1/mu, delta)`` [BW18, Thm 8]; below ``epsilon``
            in paper mode (the paper's calibration is loose, spec 3.4).
        """
        return gaussian_epsilon(1.0 / self.mu, self.delta)

    def _expected(self) -> dict[str, tuple[tuple[int, int], bool, int]]:
        d, k, t = self.n_features, self.rank, self.iterations
        want = {"M": ((d, d), True, 1)}
        if self.method == "power":
            want |= {"H": ((k, k), True, t), "Z": ((d, k), False, t)}
        return want

    def _check_structure(self) -> None:
        want = self._expected()
        labels = sorted(m.label for m in self.mechanisms)
        if labels != sorted(want):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: method={self.method!r} releases "
                f"{sorted(want)}, the calibration records {labels}."
            )
        for m in self.mechanisms:
            shape, symmetric, count = want[m.label]
            if (tuple(m.shape), m.symmetric, m.count) != (shape, symmetric, count):
                raise PrivacyConfigError(
                    f"LEDGER_CHECK failed: mechanism {m.label!r} records "
                    f"(shape, symmetric, count)={(tuple(m.shape), m.symmetric, m.count)}"
                    f", expected {(shape, symmetric, count)}."
                )

    def _bounds(self) -> dict[str, tuple[float, float | None]]:
        """Per label: the mode's sensitivity bound and the std actually applied."""
        sens = self.sensitivities
        s_gram = sens.gram
        out: dict[str, tuple[float, float | None]] = {"M": (s_gram, self.noise_init)}
        if self.method == "power":
            r = self.clip_radius if self.clip_radius is not None else math.inf
            applied_z = None if self.noise_Z is None else self.noise_Z * r
            # spec 3.1: Clip_R bounds each summand by R (2R under replacement).
            out |= {"H": (s_gram, self.noise_H), "Z": (sens.clip * r, applied_z)}
        return out

    def check(self) -> None:
        """LEDGER_CHECK: an internal bug guard run before anything is charged.

        Raises
        ------
        PrivacyConfigError
            If the mechanisms do not match ``method`` (labels, shapes,
            counts); if a recorded sensitivity is below the mode's bound
            (``s_gram`` for ``M`` and ``H``, ``2 R_eff`` for ``Z``); if
            ``gaussian_delta(1/mu, epsilon)`` exceeds ``delta (1 + 1e-9)``; or
            if a noise field (``noise_init``, ``noise_H``, ``noise_Z R_eff``)
            is below the std recorded in its mechanism. Each means that the
            run would add less noise than the claim needs.
        """
        self._check_structure()
        bounds = self._bounds()
        for m in self.mechanisms:
            bound, _ = bounds[m.label]
            if not m.sensitivity >= bound * (1 - _CHECK_RTOL):
                raise PrivacyConfigError(
                    f"LEDGER_CHECK failed: mechanism {m.label!r} records "
                    f"sensitivity={m.sensitivity!r}, below the bound {bound!r} of "
                    f"sensitivity={self.sensitivity_mode!r}."
                )
        mu = self.mu
        used = gaussian_delta(1.0 / mu, self.epsilon) if mu > 0 else 0.0
        if not used <= self.delta * (1 + _CHECK_RTOL):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: the recorded noise gives delta={used!r} at "
                f"epsilon={self.epsilon!r}, above the release's delta={self.delta!r}."
            )
        for m in self.mechanisms:
            _, applied = bounds[m.label]
            if applied is None or not applied >= m.sigma * (1 - _CHECK_RTOL):
                raise PrivacyConfigError(
                    f"LEDGER_CHECK failed: the noise applied to {m.label!r} "
                    f"({applied!r}) is below its accounted sigma={m.sigma!r}."
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable privacy report (spec 3.6; public values only)."""
        report: dict[str, Any] = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "accounting": self.accounting,
            "accountant": self.accounting,
            "sensitivity_mode": self.sensitivity_mode,
            "neighboring": self.neighboring,
            "rank": self.rank,
            "n_features": self.n_features,
            "iterations": self.iterations,
            "clip_radius": self.clip_radius,
            "requested_clip_radius": self.requested_clip_radius,
            "beta": self.beta,
            "init_fraction": self.init_fraction,
            "h_fraction": self.h_fraction,
            "noise_init": self.noise_init,
            "noise_H": self.noise_H,
            "noise_Z": self.noise_Z,
            "gamma": self.gamma,
            "mechanisms": [m.to_dict() for m in self.mechanisms],
            "mu": self.mu,
            "rho_total": self.rho_total,
            "realised_epsilon": self.realised_epsilon(),
        }
        if self.accounting == "paper":
            c = _paper_constants(self.epsilon, self.delta, self.iterations)
            report["paper_nominal"] = {
                "epsilon": self.epsilon,
                "delta": self.delta,
                "eps_iter": c["eps_iter"],
                "delta_iter": c["delta_iter"],
            }
        return report

    def to_dp_event(self) -> dp_accounting.ComposedDpEvent:
        """The run as a dp_accounting event.

        Returns
        -------
        dp_accounting.ComposedDpEvent
            One ``GaussianDpEvent(sigma / s)`` per mechanism, wrapped in a
            ``SelfComposedDpEvent`` when ``count > 1``. The sensitivity of the
            calibration's relation is folded into the noise multiplier:
            dp_accounting does not rescale a plain Gaussian event (spec 3.4).
        """
        import dp_accounting  # lazy: importing it costs 2-3 s

        events: list[dp_accounting.DpEvent] = []
        for m in self.mechanisms:
            ev = dp_accounting.GaussianDpEvent(noise_multiplier=m.sigma / m.sensitivity)
            if m.count > 1:
                ev = dp_accounting.SelfComposedDpEvent(event=ev, count=m.count)
            events.append(ev)
        return dp_accounting.ComposedDpEvent(events=events)


def _paper_constants(
    epsilon: float, delta: float, iterations: int
) -> dict[str, float | None]:
    """[P]'s constants, unvalidated; ``iterations = 0`` is Analyze Gauss alone."""
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
    c = _paper_constants(eps, dlt, t)
    _check_paper_preconditions(c, t)
    return c


def _gdp_noise(
    mu: float,
    sens: PcaSensitivities,
    t: int,
    init_fraction: float,
    h_fraction: float,
) -> tuple[float, float | None, float | None]:
    """``(noise_init, noise_H, noise_Z)`` of the zCDP split of ``mu^2 / 2``."""
    rho_total = mu * mu / 2.0
    s_gram = sens.gram
    if t == 0:
        # Analyze Gauss alone: the whole budget on M (spec 3.4).
        return s_gram / mu, None, None
    # spec 3.4, calibration steps 2-3: rho = s^2 / (2 sigma^2) per release.
    rho_init = init_fraction * rho_total
    rho_iter = (1.0 - init_fraction) * rho_total / t
    rho_h = h_fraction * rho_iter
    rho_z = (1.0 - h_fraction) * rho_iter
    return (
        s_gram / math.sqrt(2.0 * rho_init),
        s_gram / math.sqrt(2.0 * rho_h),
        sens.clip / math.sqrt(2.0 * rho_z),
    )


def _check_pca_args(
    *,
    rank: object,
    n_features: object,
    method: object,
    iterations: object,
    clip_radius: object,
    accounting: object,
    sensitivity: object,
    neighboring: object,
    init_fraction: object,
    h_fraction: object,
    beta: object,
    gamma_scale: object,
    cap_radius: object,
) -> dict[str, Any]:
    d = check_int_in_range(n_features, "n_features", 2)
    args: dict[str, Any] = {
        "n_features": d,
        "rank": check_int_in_range(rank, "rank", 1, d, what="[1, n_features]"),
        "method": _check_choice(method, "method", METHODS),
        "accounting": _check_choice(accounting, "accounting", ACCOUNTINGS),
        "sensitivity": _check_choice(sensitivity, "sensitivity", SENSITIVITIES),
        "neighboring": _check_choice(neighboring, "neighboring", NEIGHBORINGS),
        "init_fraction": check_float_in_interval(init_fraction, "init_fraction", 0, 1),
        "h_fraction": check_float_in_interval(h_fraction, "h_fraction", 0.0, 1.0),
        "beta": check_float_in_interval(beta, "beta", 0.0, 1.0),
        "gamma_scale": check_float_in_interval(
            gamma_scale, "gamma_scale", 0.0, math.inf
        ),
    }
    if cap_radius is not None and not isinstance(cap_radius, bool):
        raise InvalidParameterError(
            f"cap_radius must be None, True or False, got cap_radius={cap_radius!r}."
        )
    args["cap_radius"] = (
        args["accounting"] != "paper" if cap_radius is None else cap_radius
    )
    if args["method"] == "power":
        if iterations is None:
            raise InvalidParameterError(
                "iterations must be given for method='power' (a public T >= 1, "
                "e.g. 3 to 10); it is never chosen from the data, got "
                "iterations=None."
            )
        args["iterations"] = check_int_in_range(iterations, "iterations", 1)
        if clip_radius is None:
            raise PrivacyConfigError(
                "clip_radius must be given for method='power' (a public R > 0; "
                "for near-i.i.d. rows 2 sqrt(k log(n) / n) is a reasonable "
                "guess), got clip_radius=None."
            )
    elif iterations not in (None, 0) or isinstance(iterations, bool):
        raise InvalidParameterError(
            "iterations must be None or 0 for method='analyze-gauss', got "
            f"iterations={iterations!r}."
        )
    else:
        args["iterations"] = 0
    args["clip_radius"] = (
        None
        if clip_radius is None
        else check_float_in_interval(
            clip_radius, "clip_radius", 0.0, math.inf, privacy=True
        )
    )
    if args["accounting"] == "paper" and args["method"] == "power":
        for name in ("init_fraction", "h_fraction"):
            if args[name] != 0.5:
                raise InvalidParameterError(
                    f"{name} must be 0.5 with accounting='paper' ([P, Alg. 3] "
                    f"splits the budget in halves), got {name}={args[name]!r}."
                )
    return args


def calibrate_pca(
    *,
    epsilon: float,
    delta: float,
    rank: int,
    n_features: int,
    method: str = "power",
    iterations: int | None = None,
    clip_radius: float | None = None,
    accounting: str = "gdp",
    sensitivity: str = "tight",
    neighboring: str = "add-remove",
    init_fraction: float = 0.5,
    h_fraction: float = 0.5,
    beta: float = 0.1,
    gamma_scale: float = 1.0,
    cap_radius: bool | None = None,
) -> PcaCalibration:
    """Calibrate the noise of a private PCA run with public ``(R, T)``.

    Parameters
    ----------
    epsilon : float
        ``> 0``; any value in ``"gdp"`` mode, ``<= 2`` (power) or ``<= 1``
        (Analyze Gauss) in ``"paper"`` mode.
    delta : float
        In ``(0, 1)``.
    rank : int
        ``k``, ``1 <= k <= n_features``.
    n_features : int
        ``d >= 2``.
    method : {"power", "analyze-gauss"}, optional
        [P, Alg. 3] (Analyze Gauss then T power iterations) or [P, Alg. 1]
        alone with the whole budget.
    iterations : int or None, optional
        ``T >= 1``, required for ``"power"`` (a public constant, never chosen
        from the data); None or 0 for ``"analyze-gauss"``.
    clip_radius : float or None, optional
        Public clip radius ``R > 0``, required for ``"power"``.
    accounting : {"gdp", "paper"}, optional
        Exact GDP calibration (default) or [P]'s literal constants.
    sensitivity : {"tight", "paper"}, optional
        Under replacement ``s_gram = sqrt(2)`` (the supremum) or [P]'s 2 for
        ``M`` and ``H``; ``Z`` has ``2 R`` in both modes. Under add/remove
        both modes give 1 and ``R`` (:mod:`pipeline.accounting.pca_sensitivity`).
    neighboring : {"add-remove", "replace"}, optional
        The neighbouring relation (default add/remove, as ``factorize``).
    init_fraction : float, optional
        ``f0`` in ``(0, 1)``: share of ``rho = mu^2/2`` spent on ``M``
        (must be 0.5 in paper mode; unused by Analyze Gauss).
    h_fraction : float, optional
        ``fH`` in ``(0, 1)``: share of each iteration's ``rho`` spent on ``H``
        (must be 0.5 in paper mode).
    beta : float, optional
        In ``(0, 1)``: failure probability of the utility analysis; it sets
        ``gamma`` only, never the privacy.
    gamma_scale : float, optional
        Public ``> 0`` multiplier of [P]'s eigenvalue floor (decision D4).
    cap_radius : bool or None, optional
        Use ``R_eff = min(R, gamma^(-1/2))``; None means True except in
        paper mode.

    Returns
    -------
    PcaCalibration
        In gdp mode ``mu`` solves ``delta_mu(epsilon) = delta``, so
        ``realised_epsilon() == epsilon`` up to rounding.

    Raises
    ------
    PrivacyConfigError
        For an invalid ``(epsilon, delta)`` or ``clip_radius``, or a paper-mode
        precondition that does not hold (the message names it).
    InvalidParameterError
        For any other parameter out of range; the message names it.

    Notes
    -----
    Privacy. Rows with norm <= 1, add/remove or replacement of one row.
    ``M`` and ``H`` have Frobenius sensitivity ``s_gram`` and isotropic
    ``sym`` noise (spec 3.2); ``Z`` has sensitivity ``R_eff`` (add/remove) or
    ``2 R_eff`` (replacement) [P, Lemma 12]. In gdp mode
    ``rho = mu^2 / 2`` is split as ``rho_init = f0 rho``, per iteration
    ``rho_H = fH (1 - f0) rho / T``, ``rho_Z = (1 - fH) (1 - f0) rho / T``,
    and ``sigma = s / sqrt(2 rho)`` per release (spec 3.4). Capping ``R``
    never changes clipping, since ``||a^T X B|| <= gamma^(-1/2)``, nor the
    cost, since ``rho_Z`` does not depend on ``R`` (spec 2.2). Emits the
    event of :meth:`PcaCalibration.to_dp_event`.

    Examples
    --------
    >>> cal = calibrate_pca(epsilon=1.0, delta=1e-6, rank=2, n_features=64,
    ...     iterations=10, clip_radius=0.05, sensitivity="paper", neighboring="replace")
    >>> [(m.label, m.shape, m.count) for m in cal.mechanisms]
    [('M', (64, 64), 1), ('H', (2, 2), 10), ('Z', (64, 2), 10)]
    >>> round(cal.mu, 4), round(cal.noise_init, 2), round(cal.noise_H, 1)
    (0.2367, 11.95, 53.4)
    >>> tight = calibrate_pca(epsilon=1.0, delta=1e-6, rank=2, n_features=64,
    ...     iterations=10, clip_radius=0.05)
    >>> round(tight.noise_init, 2), tight.neighboring
    (5.97, 'add-remove')
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    a = _check_pca_args(
        rank=rank,
        n_features=n_features,
        method=method,
        iterations=iterations,
        clip_radius=clip_radius,
        accounting=accounting,
        sensitivity=sensitivity,
        neighboring=neighboring,
        init_fraction=init_fraction,
        h_fraction=h_fraction,
        beta=beta,
        gamma_scale=gamma_scale,
        cap_radius=cap_radius,
    )
    t, d, k = a["iterations"], a["n_features"], a["rank"]
    sens = pca_sensitivities(a["sensitivity"], a["neighboring"])
    s_gram = sens.gram
    if a["accounting"] == "paper":
        c = paper_constants(eps, dlt, t)
        noise_init, noise_h = float(c["noise_init"]), c["noise_iter"]
        noise_z = noise_h
    else:
        mu = 1.0 / gaussian_noise_multiplier(eps, dlt)
        noise_init, noise_h, noise_z = _gdp_noise(
            mu, sens, t, a["init_fraction"], a["h_fraction"]
        )
    mechanisms = [
        PcaMechanism(
            label="M",
            shape=(d, d),
            symmetric=True,
            sensitivity=s_gram,
            sigma=noise_init,
            count=1,
        )
    ]
    gamma = r_eff = None
    if t > 0:
        assert noise_h is not None
        assert noise_z is not None
        # [P, Alg. 2, step 1] with beta/2 from [P, Alg. 3, step 3] (decision D4).
        gamma = (
            a["gamma_scale"]
            * 4.0
            * noise_h
            * (2.0 * math.sqrt(k) + math.sqrt(2.0 * math.log(16.0 * t / a["beta"])))
        )
        r_eff = a["clip_radius"]
        if a["cap_radius"]:
            r_eff = min(r_eff, gamma**-0.5)
        mechanisms += [
            PcaMechanism(
                label="H",
                shape=(k, k),
                symmetric=True,
                sensitivity=s_gram,
                sigma=noise_h,
                count=t,
            ),
            PcaMechanism(
                label="Z",
                shape=(d, k),
                symmetric=False,
                sensitivity=sens.clip * r_eff,
                sigma=noise_z * r_eff,
                count=t,
            ),
        ]
    return PcaCalibration(
        epsilon=eps,
        delta=dlt,
        method=a["method"],
        accounting=a["accounting"],
        sensitivity_mode=a["sensitivity"],
        rank=k,
        n_features=d,
        iterations=t,
        clip_radius=r_eff,
        requested_clip_radius=a["clip_radius"],
        beta=a["beta"],
        init_fraction=a["init_fraction"] if t > 0 else 1.0,
        h_fraction=a["h_fraction"],
        noise_init=noise_init,
        noise_H=noise_h,
        noise_Z=noise_z,
        gamma=gamma,
        mechanisms=tuple(mechanisms),
        neighboring=a["neighboring"],
    )


def pld_epsilon_of(calibration: PcaCalibration) -> float:
    """Epsilon of a PCA run by dp_accounting's PLD accountant (a cross-check).

    Parameters
    ----------
    calibration : PcaCalibration

    Returns
    -------
    float
        ``PLDAccountant(value_discretization_interval=1e-4)`` epsilon of
        :meth:`PcaCalibration.to_dp_event` at ``calibration.delta``. The
        discretisation is pessimistic, so this is slightly above
        :meth:`PcaCalibration.realised_epsilon` (spec 5.2 P5: within 1e-3).
    """
    import dp_accounting  # lazy: importing it costs 2-3 s

    if not isinstance(calibration, PcaCalibration):
        raise InvalidParameterError(
            "calibration must be a PcaCalibration, got "
            f"calibration={type(calibration).__name__}."
        )
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(calibration.to_dp_event())
    return float(accountant.get_epsilon(calibration.delta))


# --------------------------------------------------------------------------
# Private selection of (R, T) [P, App. C, Alg. 5]
# --------------------------------------------------------------------------
def _trial_rho(chi: float, zeta: float, sens: PcaSensitivities) -> float:
    """zCDP cost of one trial, the same for every ``t`` (spec 2.5, 3.5)."""
    # t iterations x (H: s_gram^2 / (2 chi^2 t) + Z: (c R)^2 / (2 chi^2 t R^2)),
    # plus the score: std s_score zeta for sensitivity s_score.
    return (sens.gram**2 + sens.clip**2) / (2.0 * chi**2) + 1.0 / (2.0 * zeta**2)


def _selection_event(
    noise_init: float, chi: float, zeta: float, theta: float, sens: PcaSensitivities
) -> dp_accounting.ComposedDpEvent:
    import dp_accounting  # lazy: importing it costs 2-3 s
    from dp_accounting import dp_event

    base = dp_accounting.GaussianDpEvent(
        noise_multiplier=1.0 / math.sqrt(2.0 * _trial_rho(chi, zeta, sens))
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
    from dp_accounting import rdp  # lazy: importing it costs 2-3 s

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
    >>> c = paper_selection_constants(epsilon=1.0, delta=1e-6, beta=0.1, n_grid=48)
    >>> round(selection_rdp_epsilon(noise_init=c["noise_init"], chi=c["chi"],
    ...     zeta=c["zeta"], theta=c["theta"], delta=1e-6), 3)
    0.369
    """
    dlt = check_float_in_interval(delta, "delta", 0.0, 1.0, privacy=True)
    th = check_float_in_interval(theta, "theta", 0.0, 1.0, high_open=False)
    sig = [
        check_float_in_interval(v, name, 0.0, math.inf, privacy=True)
        for v, name in ((noise_init, "noise_init"), (chi, "chi"), (zeta, "zeta"))
    ]
    sens = pca_sensitivities(sensitivity, neighboring)
    return _rdp_epsilon_and_order(*sig, th, sens, dlt)[0]


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
    rho_trial = _trial_rho(chi, zeta, pca_sensitivities("paper", "replace"))
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
        return self.sensitivities.gram ** 2 / (2.0 * self.noise_init**2)

    @property
    def rho_trial(self) -> float:
        """zCDP cost of one trial (its ``H``, ``Z`` and score), whatever its ``t``."""
        return _trial_rho(self.chi, self.zeta, self.sensitivities)

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
        return min(r, self.gamma(t) ** -0.5)

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
    from scipy import optimize

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
    *,
    epsilon: float,
    delta: float,
    rank: int,
    n_rows: int,
    n_features: int,
    radii: Sequence[float],
    iteration_grid: Sequence[int],
    beta: float = 0.1,
    expected_trials: float | None = None,
    max_trials: int | None = None,
    sensitivity: str = "tight",
    gamma_scale: float = 1.0,
    neighboring: str = "add-remove",
) -> SelectionCalibration:
    """Calibrate the noise of the private selection of ``(R, T)`` [P, Alg. 5].

    Parameters
    ----------
    epsilon : float
        ``> 0``.
    delta : float
        In ``(0, 1)``.
    rank : int
        ``k``, ``1 <= k < n_features``.
    n_rows : int
        ``n >= 1`` (public under replacement adjacency).
    n_features : int
        ``d >= 2``.
    radii : sequence of float
        Public grid of clip radii, distinct, each ``> 0``.
    iteration_grid : sequence of int
        Public grid of iteration counts, distinct, each ``>= 1``.
    beta : float, optional
        In ``(0, 1)``; ``theta = beta / (8m)`` by default, ``m`` the grid size.
    expected_trials : float or None, optional
        ``E[N] >= 1``; overrides the default ``theta`` with ``1/E[N]``.
    max_trials : int or None, optional
        ``N_max >= 1``; default ``ceil(L / theta)`` with
        ``L = max(20, epsilon + log(100 / delta))`` (``q ~ e^-L``; the cap then
        costs at most 1% of delta, for any epsilon).
    sensitivity : {"tight", "paper"}, optional
        ``s_gram`` of ``M`` and ``H`` and ``s_score = s_gram / h``.
    gamma_scale : float, optional
        Public ``> 0`` multiplier of the eigenvalue floor.
    neighboring : {"add-remove", "replace"}, optional
        The neighbouring relation of the sensitivities.

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
    >>> sel = calibrate_selection(epsilon=1.0, delta=1e-6, rank=2, n_rows=2**16,
    ...     n_features=64, radii=[0.01, 0.02, 0.04, 0.08], iteration_grid=[1, 2, 4])
    >>> sel.n_grid, sel.max_trials, sel.rdp_epsilon <= 1.0
    (12, 19200, True)
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    d = check_int_in_range(n_features, "n_features", 2)
    k = check_int_in_range(rank, "rank", 1, d - 1, what="[1, n_features - 1]")
    n = check_int_in_range(n_rows, "n_rows", 1)
    b = check_float_in_interval(beta, "beta", 0.0, 1.0)
    mode = _check_choice(sensitivity, "sensitivity", SENSITIVITIES)
    relation = _check_choice(neighboring, "neighboring", NEIGHBORINGS)
    g_scale = check_float_in_interval(gamma_scale, "gamma_scale", 0.0, math.inf)
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
