"""Calibration of the default private selection: every candidate once, composed exactly.

Problem. ``select=True`` must choose privately between Analyze Gauss and a few
public ``(R, T)`` power-method candidates, inside one ``(epsilon, delta)``,
and the choice must cost little: its result should never be much worse than
that of the best candidate run alone with the whole budget.

Method. With a handful of candidates the cheapest stopping rule is to run each
candidate once (``N = m`` with probability 1) and release only the candidate
with the smallest noisy score. Everything the procedure computes from the data
is a Gaussian release -- the shared Analyze Gauss matrix ``M``, each power
candidate's ``H_t`` and ``Z_t``, each candidate's score ``s(X) + noise`` -- so
its output is post-processing of an adaptive composition of Gaussian
mechanisms, exactly ``mu``-GDP with ``mu^2 = sum_i count_i (s_i / sigma_i)^2``
[DRS22, Cor. 3.3] and ``(epsilon, delta)``-DP by the analytic Gaussian profile
[BW18, Thm 8]. Random stopping [PS22] pays a constant factor in RDP plus the
RDP-to-DP conversion (together a noise factor of 1.3 or more on ``M`` alone at
``(1, 1e-6)``); for ``m <= 4`` candidates the exhaustive composition is cheaper,
and its accounting is exact. The non-selected candidates stay secret all the
same (their releases are in the trusted journal); publishing them would not
change the guarantee, which already counts them.

Budget split of ``rho = mu^2 / 2``: ``init_fraction`` to ``M`` (the warm start
of every power candidate and the Analyze Gauss candidate itself),
``score_fraction`` to the ``m`` scores (equally), the rest equally to the
power candidates; within a candidate with ``T`` iterations, ``h_fraction`` to
the ``T`` releases of ``H`` and the rest to the ``T`` releases of ``Z``.

References
----------
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS-B 2022.
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018.
.. [PS22] Papernot, Steinke. Hyperparameter tuning with Renyi differential
   privacy. ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.accounting.gaussian import gaussian_delta, gaussian_noise_multiplier
from pipeline.accounting.pca import PcaCalibration, PcaMechanism
from pipeline.accounting.pca_sensitivity import pca_sensitivities
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.params import PcaParams

__all__ = ["CandidateSelection", "calibrate_candidates"]

#: LEDGER_CHECK slack (rounding in mu only), as for the fixed runs.
_CHECK_RTOL = 1e-9
#: Default shares of rho: the shared M, and all the scores together.
INIT_FRACTION = 0.6
SCORE_FRACTION = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CandidateSelection(PcaCalibration):
    """Noise of an exhaustive private selection (a :class:`PcaCalibration`).

    ``method`` is ``"select"``; ``mechanisms`` list ``M``, per power candidate
    ``j`` its ``H[j]`` and ``Z[j]`` (count ``T_j``), and the scores ``s``
    (count ``m``). The ledger composes it like any PCA run (``mu``-GDP).

    Attributes
    ----------
    candidates : tuple of (float or None, int)
        ``(R, T)`` per candidate; ``(None, 0)`` is Analyze Gauss (``X0``).
    n_rows : int
        The public ``n``.
    chi_h, chi_z : tuple of float
        Per candidate: std of ``H`` (``sym`` noise) and of ``Z`` per unit of
        radius (0 for Analyze Gauss).
    zeta : float
        The score's noise std is ``s_score zeta`` with ``s_score = s_gram / h``.
    score_fraction : float
    gamma_scale : float
    margin : float
        Public: a power candidate is selected only if its noisy score is below
        Analyze Gauss's by ``margin`` standard deviations of the difference of
        two scores (post-processing; Analyze Gauss is the safer candidate on
        data the scores cannot tell apart).
    """

    candidates: tuple[tuple[float | None, int], ...]
    n_rows: int
    chi_h: tuple[float, ...]
    chi_z: tuple[float, ...]
    zeta: float
    score_fraction: float
    gamma_scale: float
    margin: float = 2.0

    # -- the interface of the selection run (shared with SelectionCalibration)
    def h_noise(self, j: int) -> float:
        """Std of candidate ``j``'s ``H`` releases."""
        return self.chi_h[j]

    def z_noise(self, j: int, radius: float) -> float:
        """Std of candidate ``j``'s ``Z`` releases at the (capped) ``radius``."""
        return self.chi_z[j] * radius

    def gamma_of(self, j: int) -> float:
        """Eigenvalue floor of candidate ``j`` ([P, Alg. 2] with its ``H`` noise)."""
        T = self.candidates[j][1]
        return (
            self.gamma_scale
            * 4.0
            * self.chi_h[j]
            * (
                2.0 * math.sqrt(self.rank)
                + math.sqrt(2.0 * math.log(16.0 * T / self.beta))
            )
        )

    def radius_of(self, j: int) -> float | None:
        """``R_eff = min(R, gamma^(-1/2))`` of candidate ``j`` (None: Analyze Gauss)."""
        R = self.candidates[j][0]
        return None if R is None else min(R, self.gamma_of(j) ** -0.5)

    def score_noise(self, h: float) -> float:
        """Std of each score for the public gap ``h > 0`` (cost ``1/(2 zeta^2)``)."""
        gap = check_float_in_interval(h, "h", 0.0, math.inf)
        return self.sensitivities.score(gap) * self.zeta

    # -- the ledger's interface ---------------------------------------------
    def _want(self) -> dict[str, tuple[float, float, int]]:
        """Per label: (sensitivity bound, std applied, count), from the fields."""
        sens = self.sensitivities
        want = {"M": (sens.gram, self.noise_init, 1)}
        for j, (_, T) in enumerate(self.candidates):
            r = self.radius_of(j)
            if r is not None:
                want[f"H[{j}]"] = (sens.gram, self.chi_h[j], T)
                want[f"Z[{j}]"] = (sens.clip * r, self.chi_z[j] * r, T)
        # the score's sensitivity is s_gram / h for the public h: unit-free here
        want["s"] = (sens.gram, sens.gram * self.zeta, len(self.candidates))
        return want

    def check(self) -> None:
        """LEDGER_CHECK: the mechanisms match the candidates and give ``(epsilon, delta)``.

        Raises
        ------
        PrivacyConfigError
            If a mechanism is missing or has another count, a sensitivity
            below its bound, or a std below the one applied; or if
            ``gaussian_delta(1/mu, epsilon)`` exceeds ``delta (1 + 1e-9)``.
        """
        want = self._want()
        got = {m.label: m for m in self.mechanisms}
        if sorted(got) != sorted(want):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: the selection releases {sorted(want)}, the "
                f"calibration records {sorted(got)}."
            )
        for label, (bound, applied, count) in want.items():
            m = got[label]
            ok = (
                m.count == count
                and m.sensitivity >= bound * (1 - _CHECK_RTOL)
                and applied >= m.sigma * (1 - _CHECK_RTOL)
            )
            if not ok:
                raise PrivacyConfigError(
                    f"LEDGER_CHECK failed: mechanism {label!r} records (count, "
                    f"sensitivity, sigma)={(m.count, m.sensitivity, m.sigma)}, "
                    f"expected {(count, bound, applied)} or more noise."
                )
        used = gaussian_delta(1.0 / self.mu, self.epsilon)
        if not used <= self.delta * (1 + _CHECK_RTOL):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: the recorded noise gives delta={used!r} at "
                f"epsilon={self.epsilon!r}, above the release's delta={self.delta!r}."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable privacy report (public values only)."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "accountant": "gdp",
            "stopping": "every candidate once (N = m), composed exactly (mu-GDP)",
            "sensitivity_mode": self.sensitivity_mode,
            "neighboring": self.neighboring,
            "rank": self.rank,
            "n_features": self.n_features,
            "n_rows": self.n_rows,
            "candidates": [
                {"clip_radius": r, "iterations": t} for r, t in self.candidates
            ],
            "init_fraction": self.init_fraction,
            "h_fraction": self.h_fraction,
            "score_fraction": self.score_fraction,
            "noise_init": self.noise_init,
            "noise_H": list(self.chi_h),
            "noise_Z_per_radius": list(self.chi_z),
            "zeta": self.zeta,
            "margin": self.margin,
            "beta": self.beta,
            "gamma_scale": self.gamma_scale,
            "mechanisms": [m.to_dict() for m in self.mechanisms],
            "mu": self.mu,
            "rho_total": self.rho_total,
            "realised_epsilon": self.realised_epsilon(),
        }


def _check_candidates(candidates: object) -> tuple[tuple[float | None, int], ...]:
    items = tuple(candidates) if isinstance(candidates, Sequence) else ()
    out: list[tuple[float | None, int]] = []
    for c in items:
        if not isinstance(c, Sequence) or len(c) != 2:
            out = []
            break
        r, t = c
        if r is None and t == 0:
            out.append((None, 0))
            continue
        out.append(
            (
                check_float_in_interval(
                    r, "candidate clip radius", 0.0, math.inf, privacy=True
                ),
                check_int_in_range(t, "candidate iterations", 1, 10_000),
            )
        )
    if not out or len(set(out)) != len(out):
        raise InvalidParameterError(
            "candidates must be a non-empty sequence of distinct (R, T) pairs, "
            f"(None, 0) for Analyze Gauss, got candidates={candidates!r}."
        )
    return tuple(out)


def calibrate_candidates(
    params: PcaParams,
    *,
    n_rows: int,
    n_features: int,
    candidates: Sequence[tuple[float | None, int]],
    init_fraction: float = INIT_FRACTION,
    score_fraction: float = SCORE_FRACTION,
) -> CandidateSelection:
    """Calibrate an exhaustive selection over ``candidates`` (see the module notes).

    Parameters
    ----------
    params : PcaParams
        ``epsilon``, ``delta`` (the guarantee of the whole selection), ``rank``
        ``k`` (``1 <= k < d``), ``sensitivity``, ``neighboring``, ``h_fraction``
        (see the module notes), ``beta`` and ``gamma_scale`` (eigenvalue floor
        and score gap; utility only). Its ``init_fraction`` is a fixed run's:
        the selection's is the argument below.
    n_rows, n_features : int
        ``n >= 1``; ``d >= 2``.
    candidates : sequence of (float or None, int)
        Public ``(R, T)`` pairs; ``(None, 0)`` is Analyze Gauss.
    init_fraction, score_fraction : float, optional
        Shares of the budget (see the module notes), each in (0, 1).

    Returns
    -------
    CandidateSelection

    Examples
    --------
    >>> from pipeline.params import PcaParams
    >>> sel = calibrate_candidates(PcaParams(rank=2, epsilon=1.0, delta=1e-6),
    ...     n_rows=10**4, n_features=64, candidates=[(None, 0), (0.06, 3)])
    >>> [m.label for m in sel.mechanisms], round(sel.realised_epsilon(), 6)
    (['M', 'H[1]', 'Z[1]', 's'], 1.0)
    >>> round(sel.noise_init * 0.2367, 2)  # 1/sqrt(0.6) of Analyze Gauss's noise
    1.29
    """
    eps, dlt = check_privacy_pair(params.epsilon, params.delta)
    d = check_int_in_range(n_features, "n_features", 2)
    k = check_int_in_range(params.rank, "rank", 1, d - 1, what="[1, n_features - 1]")
    n = check_int_in_range(n_rows, "n_rows", 1)
    mode, relation = params.sensitivity, params.neighboring
    f0 = check_float_in_interval(init_fraction, "init_fraction", 0.0, 1.0)
    fs = check_float_in_interval(score_fraction, "score_fraction", 0.0, 1.0)
    fh, b, g = float(params.h_fraction), float(params.beta), float(params.gamma_scale)
    cands = _check_candidates(candidates)
    n_power = sum(t > 0 for _, t in cands)
    if f0 + fs >= 1.0 and n_power:
        raise InvalidParameterError(
            "init_fraction + score_fraction must leave budget for the power "
            f"candidates, got {f0!r} + {fs!r} >= 1."
        )
    sens = pca_sensitivities(mode, relation)
    mu = 1.0 / gaussian_noise_multiplier(eps, dlt)
    rho = mu * mu / 2.0
    rho_power = (1.0 - f0 - fs) * rho / n_power if n_power else 0.0
    if not n_power:  # Analyze Gauss alone: M gets everything but the score
        f0 = 1.0 - fs
    # rho = s^2 / (2 sigma^2) per release (spec 3.4)
    noise_init = sens.gram / math.sqrt(2.0 * f0 * rho)
    zeta = 1.0 / math.sqrt(2.0 * fs * rho / len(cands))
    chi_h = tuple(
        sens.gram / math.sqrt(2.0 * fh * rho_power / t) if t else 0.0 for _, t in cands
    )
    chi_z = tuple(
        sens.clip / math.sqrt(2.0 * (1.0 - fh) * rho_power / t) if t else 0.0
        for _, t in cands
    )
    base = CandidateSelection(
        epsilon=eps, delta=dlt, method="select", accounting="gdp",
        sensitivity_mode=mode, neighboring=relation, rank=k, n_features=d,
        iterations=max(t for _, t in cands), clip_radius=None,
        requested_clip_radius=None, beta=b, init_fraction=f0, h_fraction=fh,
        noise_init=noise_init, noise_H=None, noise_Z=None, gamma=None,
        mechanisms=(), candidates=cands, n_rows=n, chi_h=chi_h, chi_z=chi_z,
        zeta=zeta, score_fraction=fs, gamma_scale=g,
    )  # fmt: skip
    mechanisms = tuple(
        PcaMechanism(
            label=label,
            shape=_shape(label, d, k),
            symmetric=label[0] in "MH",
            sensitivity=bound,
            sigma=applied,
            count=count,
        )
        for label, (bound, applied, count) in base._want().items()
    )
    out = dataclasses.replace(base, mechanisms=mechanisms)
    out.check()
    return out


def _shape(label: str, d: int, k: int) -> tuple[int, int]:
    return {"M": (d, d), "H": (k, k), "Z": (d, k), "s": (1, 1)}[label[0]]
