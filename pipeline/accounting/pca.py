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

Related modules, one problem each (their names are re-exported here):
:mod:`pipeline.accounting.pca_sensitivity` (the sensitivities by relation),
:mod:`pipeline.accounting.pca_paper` ([P]'s literal constants),
:mod:`pipeline.accounting.pca_selection` (the default selection: every candidate
once, composed exactly) and :mod:`pipeline.accounting.pca_random_stopping` (the
selection by random stopping [P, App. C, Alg. 5], accounted in Renyi DP with
dp_accounting's ``RepeatAndSelectDpEvent`` [PS22, Thm 2]).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline._validation import check_int_in_range, check_privacy_pair
from pipeline.accounting.events import GaussianEvent
from pipeline.accounting.gaussian import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
)
from pipeline.accounting.pca_paper import paper_constants, unchecked_paper_constants
from pipeline.accounting.pca_sensitivity import (
    NEIGHBORINGS,
    SENSITIVITIES,
    PcaSensitivities,
    pca_sensitivities,
)
from pipeline.accounting.pca_sensitivity import check_choice as _check_choice
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.params import PcaParams

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
            c = unchecked_paper_constants(self.epsilon, self.delta, self.iterations)
            report["paper_nominal"] = {
                "epsilon": self.epsilon,
                "delta": self.delta,
                "eps_iter": c["eps_iter"],
                "delta_iter": c["delta_iter"],
            }
        return report

    def privacy_event(self) -> GaussianEvent:
        """The run as a ledger event: a unit-sensitivity Gaussian with ``z = 1/mu``.

        No sketch, so no failure probability; the ledger runs :meth:`check`
        before it charges.
        """
        return GaussianEvent(1.0 / self.effective_sensitivity, self.delta_jl)

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
        import dp_accounting  # heavy: dp_accounting, 2-3 s to import

        events: list[dp_accounting.DpEvent] = []
        for m in self.mechanisms:
            ev = dp_accounting.GaussianDpEvent(noise_multiplier=m.sigma / m.sensitivity)
            if m.count > 1:
                ev = dp_accounting.SelfComposedDpEvent(event=ev, count=m.count)
            events.append(ev)
        return dp_accounting.ComposedDpEvent(events=events)


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


def _iterations_of(params: PcaParams, method: str) -> int:
    """``T`` of ``method``, with the checks that depend on it (not ``PcaParams``')."""
    if method == "power":
        if params.iterations is None:
            raise InvalidParameterError(
                "iterations must be given for method='power' (a public T >= 1, "
                "e.g. 3 to 10); it is never chosen from the data, got "
                "iterations=None."
            )
        t = check_int_in_range(params.iterations, "iterations", 1)
        if params.clip_radius is None:
            raise PrivacyConfigError(
                "clip_radius must be given for method='power' (a public R > 0; "
                "for near-i.i.d. rows 2 sqrt(k log(n) / n) is a reasonable "
                "guess), got clip_radius=None."
            )
        return t
    if params.iterations not in (None, 0) or isinstance(params.iterations, bool):
        raise InvalidParameterError(
            "iterations must be None or 0 for method='analyze-gauss', got "
            f"iterations={params.iterations!r}."
        )
    return 0


def _check_paper_split(params: PcaParams, t: int) -> None:
    """[P, Alg. 3] splits a paper-mode power run's budget in halves."""
    if params.accounting != "paper" or t == 0:
        return
    for name in ("init_fraction", "h_fraction"):
        value = float(getattr(params, name))
        if value != 0.5:
            raise InvalidParameterError(
                f"{name} must be 0.5 with accounting='paper' ([P, Alg. 3] "
                f"splits the budget in halves), got {name}={value!r}."
            )


def calibrate_pca(
    params: PcaParams, *, n_features: int, cap_radius: bool | None = None
) -> PcaCalibration:
    """Calibrate the noise of a private PCA run with public ``(R, T)``.

    Parameters
    ----------
    params : PcaParams
        The run's public parameters, each field validated by ``PcaParams``:
        ``epsilon`` (``<= 2`` for the power method, ``<= 1`` for Analyze
        Gauss in ``"paper"`` accounting), ``delta``; ``rank`` ``k`` with
        ``1 <= k <= n_features``; ``method`` ``"power"`` ([P, Alg. 3]:
        Analyze Gauss then T power iterations) or ``"analyze-gauss"`` ([P,
        Alg. 1] alone with the whole budget) -- ``"auto"`` is resolved by the
        plan first; ``iterations`` ``T >= 1`` and ``clip_radius`` ``R > 0``,
        required for ``"power"`` (public constants, never chosen from the
        data; ``iterations`` None or 0 for ``"analyze-gauss"``);
        ``accounting`` (exact GDP or [P]'s literal constants);
        ``sensitivity`` (under replacement ``s_gram = sqrt(2)``, the supremum,
        or [P]'s 2 for ``M`` and ``H``; ``Z`` has ``2 R`` in both modes; under
        add/remove both modes give 1 and ``R``,
        :mod:`pipeline.accounting.pca_sensitivity`); ``neighboring``;
        ``init_fraction`` ``f0``, the share of ``rho = mu^2/2`` spent on
        ``M``, and ``h_fraction`` ``fH``, the share of each iteration's
        ``rho`` spent on ``H`` (both 0.5 in paper mode; ``f0`` unused by
        Analyze Gauss); ``beta``, the failure probability of the utility
        analysis (it sets ``gamma`` only, never the privacy); ``gamma_scale``,
        a public multiplier of [P]'s eigenvalue floor (decision D4).
        ``row_norm_bound``, ``route`` and ``private`` are not the
        accounting's (a non-private run has no calibration).
    n_features : int
        ``d >= 2``.
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
        For a missing ``(epsilon, delta)`` or ``clip_radius``, or a paper-mode
        precondition that does not hold (the message names it).
    InvalidParameterError
        For ``n_features``, a ``rank`` or ``iterations`` out of range, a
        method other than the two, or a paper-mode split other than halves;
        the message names it.

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
    >>> from pipeline.params import PcaParams
    >>> p = PcaParams(rank=2, epsilon=1.0, delta=1e-6, method="power", iterations=10,
    ...     clip_radius=0.05, sensitivity="paper", neighboring="replace")
    >>> cal = calibrate_pca(p, n_features=64)
    >>> [(m.label, m.shape, m.count) for m in cal.mechanisms]
    [('M', (64, 64), 1), ('H', (2, 2), 10), ('Z', (64, 2), 10)]
    >>> round(cal.mu, 4), round(cal.noise_init, 2), round(cal.noise_H, 1)
    (0.2367, 11.95, 53.4)
    >>> tight = calibrate_pca(PcaParams(rank=2, epsilon=1.0, delta=1e-6,
    ...     method="power", iterations=10, clip_radius=0.05), n_features=64)
    >>> round(tight.noise_init, 2), tight.neighboring
    (5.97, 'add-remove')
    """
    eps, dlt = check_privacy_pair(params.epsilon, params.delta)
    d = check_int_in_range(n_features, "n_features", 2)
    k = check_int_in_range(params.rank, "rank", 1, d, what="[1, n_features]")
    method = _check_choice(params.method, "method", METHODS)
    if cap_radius is not None and not isinstance(cap_radius, bool):
        raise InvalidParameterError(
            f"cap_radius must be None, True or False, got cap_radius={cap_radius!r}."
        )
    t = _iterations_of(params, method)
    _check_paper_split(params, t)
    sens = pca_sensitivities(params.sensitivity, params.neighboring)
    noise_init, noise_h, noise_z = _noise_levels(eps, dlt, params, t, sens)
    init = PcaMechanism(
        label="M", shape=(d, d), symmetric=True, sensitivity=sens.gram,
        sigma=noise_init, count=1,
    )  # fmt: skip
    mechanisms = [init]
    gamma = r_eff = None
    if t > 0:
        assert noise_h is not None
        assert noise_z is not None
        cap = params.accounting != "paper" if cap_radius is None else cap_radius
        gamma, r_eff, per_iteration = _iteration_mechanisms(
            params, (d, k, t), cap, sens, (noise_h, noise_z)
        )
        mechanisms += per_iteration
    requested = params.clip_radius
    return PcaCalibration(
        epsilon=eps,
        delta=dlt,
        method=method,
        accounting=params.accounting,
        sensitivity_mode=params.sensitivity,
        rank=k,
        n_features=d,
        iterations=t,
        clip_radius=r_eff,
        requested_clip_radius=None if requested is None else float(requested),
        beta=float(params.beta),
        init_fraction=float(params.init_fraction) if t > 0 else 1.0,
        h_fraction=float(params.h_fraction),
        noise_init=noise_init,
        noise_H=noise_h,
        noise_Z=noise_z,
        gamma=gamma,
        mechanisms=tuple(mechanisms),
        neighboring=params.neighboring,
    )


def _noise_levels(
    eps: float, dlt: float, params: PcaParams, t: int, sens: PcaSensitivities
) -> tuple[float, float | None, float | None]:
    """``(noise_init, noise_H, noise_Z)`` in the paper's or the GDP accounting."""
    if params.accounting == "paper":
        c = paper_constants(eps, dlt, t)
        return float(c["noise_init"]), c["noise_iter"], c["noise_iter"]
    mu = 1.0 / gaussian_noise_multiplier(eps, dlt)
    fractions = float(params.init_fraction), float(params.h_fraction)
    return _gdp_noise(mu, sens, t, *fractions)


def _iteration_mechanisms(
    params: PcaParams,
    dkt: tuple[int, int, int],
    cap: bool,
    sens: PcaSensitivities,
    noise: tuple[float, float],
) -> tuple[float, float, list[PcaMechanism]]:
    """``(gamma, R_eff, [H, Z])``: the eigenvalue floor, the radius, the T-fold releases.

    ``dkt`` is ``(d, k, T)``, ``noise`` is ``(noise_H, noise_Z)``; ``cap`` caps
    the radius at ``gamma^(-1/2)``.
    """
    (d, k, t), (noise_h, noise_z) = dkt, noise
    beta = float(params.beta)
    # [P, Alg. 2, step 1] with beta/2 from [P, Alg. 3, step 3] (decision D4).
    gamma = (
        float(params.gamma_scale)
        * 4.0
        * noise_h
        * (2.0 * math.sqrt(k) + math.sqrt(2.0 * math.log(16.0 * t / beta)))
    )
    assert params.clip_radius is not None  # required for the power method
    r_eff = float(params.clip_radius)
    if cap:
        r_eff = min(r_eff, gamma**-0.5)
    return gamma, r_eff, [
        PcaMechanism(
            label="H", shape=(k, k), symmetric=True, sensitivity=sens.gram,
            sigma=noise_h, count=t,
        ),
        PcaMechanism(
            label="Z", shape=(d, k), symmetric=False, sensitivity=sens.clip * r_eff,
            sigma=noise_z * r_eff, count=t,
        ),
    ]  # fmt: skip


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
    import dp_accounting  # heavy: dp_accounting, 2-3 s to import

    if not isinstance(calibration, PcaCalibration):
        raise InvalidParameterError(
            "calibration must be a PcaCalibration, got "
            f"calibration={type(calibration).__name__}."
        )
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(calibration.to_dp_event())
    return float(accountant.get_epsilon(calibration.delta))


# Re-exported for existing callers (one module per problem, see the docstring).
from pipeline.accounting.pca_paper import paper_selection_constants
from pipeline.accounting.pca_random_stopping import (
    SelectionCalibration,
    calibrate_selection,
    selection_rdp_epsilon,
)
