"""Joint calibration of all noisy sketches of one release as one Gaussian mechanism.

Problem. A release publishes K noisy sketches ``f_i(A) + N(0, sigma_i^2)``,
i = 1..K, built from J data-independent Gaussian sketch matrices. Given the
budget ``(epsilon, delta)``, the per-individual Frobenius bound ``Delta_F``,
the sketch dimensions and budget weights ``w_i`` (``sum w_i = 1``), find noise
levels ``sigma_i`` such that the whole release is ``(epsilon, delta)``-DP
(spec sections 4.4 and 4.5):

* ``delta = delta_M + delta_JL``; each sketch matrix fails its norm bound with
  probability ``beta = delta_JL / J`` (spec section 4.2);
* sketch i has L2 sensitivity ``Delta_F * Delta_i`` on the good event, with
  ``Delta_i`` the product of ``Delta_JL(d, beta)`` over its sketch matrices;
* scaling block i by ``1/sigma_i`` makes the concatenation a Gaussian mechanism
  with unit noise and sensitivity
  ``Delta_eff = sqrt(sum_i L (Delta_F Delta_i)^2 / sigma_i^2)``, where ``L`` is
  the number of tree levels of a continual release (1 for one-shot);
* ``sigma_i = Delta_F Delta_i s sqrt(L / w_i)`` with ``s = s(epsilon,
  delta_M)`` gives ``Delta_eff = 1/s``, hence (epsilon, delta_M)-DP on the
  good event and (epsilon, delta_M + delta_JL)-DP overall.

This replaces the paper's per-sketch calibration, whose basic composition
gives (2 epsilon, 4 delta) or (3 epsilon, 6 delta) [Upa18, Lemma 16, Lemma 26].

Public operators (spec private-lrf-2 section 3). The ``Delta_JL`` tail bound is
for a pair of neighbours fixed before the operators are drawn. When the sketch
seed is public an adversary picks the pair after seeing them, so the caller
passes the exact worst-case factors of the actual operators
(``public_operator_factors``, e.g. ``||Phi||_2``); they hold for every pair,
so ``delta_JL = 0`` and the whole delta goes to the mechanism.

References
----------
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530.
.. [LM00] Laurent, Massart. Adaptive estimation of a quadratic functional by
   model selection. Ann. Statist. 28(5), 2000.
.. [Upa18] Upadhyay. On low-space differentially private low-rank
   factorization in the spectral norm (seed paper).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline._validation import (
    check_float_in_interval,
    check_int_in_range,
    check_privacy_pair,
)
from pipeline.accounting.events import GaussianEvent
from pipeline.accounting.gaussian import (
    gaussian_delta,
    gaussian_noise_multiplier,
    jl_sensitivity_factor,
)
from pipeline.errors import InvalidParameterError, PrivacyConfigError

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "ReleaseCalibration",
    "SketchNoise",
    "SketchRequest",
    "calibrate_release",
    "pld_epsilon",
    "to_dp_event",
]

# Weights are fractions of one budget; sums of a few thirds miss 1 by ~1e-16.
_WEIGHT_SUM_TOL = 1e-12
# LEDGER_CHECK slack (spec section 4.4): covers rounding in Delta_eff only.
_CHECK_RTOL = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class SketchRequest:
    """A noisy sketch an algorithm asks to release.

    Attributes
    ----------
    name : str
        Identifier, e.g. ``"Y"``, ``"Z"``, ``"Yc"``, ``"Yr"``.
    shape : tuple of int
        (n_rows, n_cols) of the released sketch.
    jl_dims : tuple of int
        Dimensions of the Gaussian sketch matrices applied to A in this sketch;
        their ``Delta_JL`` factors multiply. ``Y = A Phi`` -> ``(t,)``,
        ``Z = S A`` -> ``(v,)``, two-sided ``Z = S A T`` -> ``(v, v)``.
    weight : float
        Budget weight ``w_i > 0``; the weights of one release sum to 1.
    clip_factor : float
        ``rho >= 1`` when the sketch's rows are clipped to norm ``rho Delta_F``
        before the noise (a range sketch in sketch-space clipping, see
        :mod:`pipeline.mechanisms.clipping`): one individual's row then moves
        the sketch by at most ``rho Delta_F`` for every operator, so it takes no
        ``jl_dims``. 1.0 otherwise.
    """

    name: str
    shape: tuple[int, int]
    jl_dims: tuple[int, ...]
    weight: float
    clip_factor: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SketchNoise:
    """One calibrated released statistic.

    Attributes
    ----------
    name : str
        As in the request.
    shape : tuple of int
        (n_rows, n_cols) of the released sketch.
    sensitivity : float
        ``Delta_F * Delta_i``, L2 sensitivity of the noise-free sketch on the
        good event (spec section 4.2).
    jl_factor : float
        ``Delta_i``, product of ``Delta_JL(d, beta)`` over ``jl_dims``; for
        public operators the exact worst-case factor of the actual operators;
        ``rho`` for a sketch clipped in sketch space (its ``clip_factor``).
    weight : float
        Budget weight ``w_i``.
    sigma : float
        Noise standard deviation per entry,
        ``sigma_i = Delta_F Delta_i s sqrt(L / w_i)`` (spec section 2.2).
    """

    name: str
    shape: tuple[int, int]
    sensitivity: float
    jl_factor: float
    weight: float
    sigma: float

    def summary(self) -> dict[str, Any]:
        """The statistic as a release report lists it (name, shape, sensitivity,
        sigma, weight): public calibration values only."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "weight": self.weight,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseCalibration:
    """Noise levels of one release and the parameters that justify them.

    Attributes
    ----------
    epsilon, delta : float
        Total budget of the release (of the whole stream if continual).
    delta_mechanism : float
        ``delta_M``, the Gaussian mechanism's share of delta.
    delta_jl : float
        ``delta_JL``, total failure probability of the sketch norm bounds.
    n_sketch_matrices : int
        ``J``, number of distinct Gaussian sketch matrices.
    beta : float
        ``delta_JL / J``, failure probability per sketch matrix.
    frobenius_bound : float
        ``Delta_F``.
    noise_multiplier : float
        ``s = s(epsilon, delta_M)`` for unit sensitivity.
    tree_levels : int
        ``L`` (1 for one-shot).
    sketches : tuple of SketchNoise
        One entry per released sketch.
    public_sketch_seed : bool
        True when the operators come from a public seed: then the factors are
        the worst case over all neighbours of the actual operators and
        ``delta_JL = 0`` (spec private-lrf-2 section 3).
    """

    epsilon: float
    delta: float
    delta_mechanism: float
    delta_jl: float
    n_sketch_matrices: int
    beta: float
    frobenius_bound: float
    noise_multiplier: float
    tree_levels: int
    sketches: tuple[SketchNoise, ...]
    public_sketch_seed: bool = False

    @property
    def sensitivity(self) -> str:
        """Which sensitivity the noise is calibrated to.

        ``"worst-case"``: every neighbour of the actual (public) operators;
        ``"jl-fixed-neighbour"``: the Laurent-Massart tail for a pair fixed
        before secret operators are drawn, ``delta_JL`` charged; ``"exact"``:
        every sensitivity holds for every draw of the operators (sparse sign
        operators, sketch-space clipping, or no operator at all).
        """
        if self.public_sketch_seed:
            return "worst-case"
        return "jl-fixed-neighbour" if self.n_sketch_matrices > 0 else "exact"

    @property
    def effective_sensitivity(self) -> float:
        """``Delta_eff = sqrt(sum_i L sensitivity_i^2 / sigma_i^2)``.

        Recomputed from the recorded ``sigma_i`` (not from ``s``), so that it
        reflects the noise actually used; equals ``1/s`` up to rounding.
        """
        # spec section 4.5: L tree levels each carry up to Delta_F^2 of the
        # squared difference, so the stacked nodes have L times the sensitivity^2.
        if any(sk.sigma <= 0.0 for sk in self.sketches):
            # No noise on a sketch with positive sensitivity: not DP at all.
            return math.inf
        total = math.fsum(
            self.tree_levels * (sk.sensitivity / sk.sigma) ** 2 for sk in self.sketches
        )
        return math.sqrt(total)

    def check(self) -> None:
        """LEDGER_CHECK of spec section 4.4: an internal bug guard.

        Raises
        ------
        PrivacyConfigError
            If ``gaussian_delta(1/Delta_eff, epsilon) + delta_JL`` exceeds
            ``delta (1 + 1e-9)``, or a recorded sensitivity is smaller than
            ``Delta_F * Delta_i``. Either means the noise is too small.
        """
        if self.public_sketch_seed and self.delta_jl != 0.0:
            # a tail bound for fixed neighbours does not hold for public operators
            raise PrivacyConfigError(
                "LEDGER_CHECK failed: public sketch operators are calibrated with a "
                f"fixed-neighbour tail bound (delta_jl={self.delta_jl!r}); they need "
                "their worst-case sensitivity."
            )
        for sk in self.sketches:
            if sk.sensitivity < self.frobenius_bound * sk.jl_factor * (1 - _CHECK_RTOL):
                raise PrivacyConfigError(
                    f"LEDGER_CHECK failed: sketch {sk.name!r} records sensitivity="
                    f"{sk.sensitivity!r} < frobenius_bound * jl_factor="
                    f"{self.frobenius_bound * sk.jl_factor!r}."
                )
        d_eff = self.effective_sensitivity
        mech_delta = gaussian_delta(1.0 / d_eff, self.epsilon) if d_eff > 0 else 0.0
        used = mech_delta + self.delta_jl
        if not used <= self.delta * (1 + _CHECK_RTOL):
            raise PrivacyConfigError(
                f"LEDGER_CHECK failed: the recorded noise gives delta={used!r} at "
                f"epsilon={self.epsilon!r}, above the release's delta={self.delta!r}."
            )

    def privacy_event(self) -> GaussianEvent:
        """The release as a ledger event: one unit-sensitivity Gaussian.

        ``z = 1/Delta_eff`` and the sketch failure probability ``delta_JL``
        (spec section 4.4); the ledger runs :meth:`check` before it charges.
        """
        return GaussianEvent(1.0 / self.effective_sensitivity, self.delta_jl)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary for release reports (no secrets in it)."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_mechanism": self.delta_mechanism,
            "delta_jl": self.delta_jl,
            "n_sketch_matrices": self.n_sketch_matrices,
            "beta": self.beta,
            "frobenius_bound": self.frobenius_bound,
            "noise_multiplier": self.noise_multiplier,
            "tree_levels": self.tree_levels,
            "public_sketch_seed": self.public_sketch_seed,
            "sensitivity": self.sensitivity,
            "effective_sensitivity": self.effective_sensitivity,
            "sketches": [
                {
                    "name": sk.name,
                    "shape": list(sk.shape),
                    "sensitivity": sk.sensitivity,
                    "jl_factor": sk.jl_factor,
                    "weight": sk.weight,
                    "sigma": sk.sigma,
                }
                for sk in self.sketches
            ],
        }


def _check_request(req: object, index: int) -> SketchRequest:
    where = f"requests[{index}]"
    if not isinstance(req, SketchRequest):
        raise InvalidParameterError(
            f"{where} must be a SketchRequest, got {where}={type(req).__name__}."
        )
    if not isinstance(req.name, str) or not req.name:
        raise InvalidParameterError(
            f"{where}.name must be a non-empty string, got name={req.name!r}."
        )
    if not isinstance(req.shape, tuple | list) or len(req.shape) != 2:
        raise InvalidParameterError(
            f"{where}.shape must be (n_rows, n_cols), got shape={req.shape!r}."
        )
    for dim in req.shape:
        check_int_in_range(dim, f"{where}.shape[*]", 1)
    if not isinstance(req.jl_dims, tuple | list):
        raise InvalidParameterError(
            f"{where}.jl_dims must be a tuple of int, got jl_dims={req.jl_dims!r}."
        )
    for dim in req.jl_dims:
        check_int_in_range(dim, f"{where}.jl_dims[*]", 1)
    check_float_in_interval(req.weight, f"{where}.weight", 0.0, 1.0, high_open=False)
    check_float_in_interval(
        req.clip_factor, f"{where}.clip_factor", 1.0, math.inf, low_open=False
    )
    if req.clip_factor != 1.0 and req.jl_dims:
        raise InvalidParameterError(
            f"{where} is clipped in sketch space (clip_factor={req.clip_factor!r}), so "
            f"its sensitivity needs no tail bound; got jl_dims={tuple(req.jl_dims)!r}."
        )
    return req


def _check_requests(
    requests: Sequence[SketchRequest], n_sketch_matrices: int
) -> tuple[SketchRequest, ...]:
    if not isinstance(requests, Sequence) or len(requests) == 0:
        raise InvalidParameterError(
            "requests must be a non-empty sequence of SketchRequest, got "
            f"requests={requests!r}."
        )
    reqs = tuple(_check_request(r, i) for i, r in enumerate(requests))
    names = [r.name for r in reqs]
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"requests must have distinct names, got {names}.")
    total = math.fsum(r.weight for r in reqs)
    if abs(total - 1.0) > _WEIGHT_SUM_TOL:
        raise InvalidParameterError(
            f"weights of requests must sum to 1, got sum(weight)={total!r}."
        )
    # Each jl_dims entry is a distinct matrix with its own failure event; fewer
    # events than matrices in one sketch would under-charge delta_JL.
    most = max(len(r.jl_dims) for r in reqs)
    if n_sketch_matrices < most:
        raise InvalidParameterError(
            f"n_sketch_matrices must be in [{most}, inf) (the largest len(jl_dims)), "
            f"got n_sketch_matrices={n_sketch_matrices}."
        )
    return reqs


def calibrate_release(
    requests: Sequence[SketchRequest],
    *,
    epsilon: float,
    delta: float,
    frobenius_bound: float,
    n_sketch_matrices: int,
    tree_levels: int = 1,
    delta_jl_fraction: float = 0.5,
    public_operator_factors: Mapping[str, float] | None = None,
) -> ReleaseCalibration:
    """Calibrate the noise of all sketches of one release jointly.

    Parameters
    ----------
    requests : sequence of SketchRequest
        The K released sketches; names distinct, weights positive, summing to 1.
    epsilon : float
        ``epsilon > 0``, total for the release (or the whole stream).
    delta : float
        In ``(0, 1)``.
    frobenius_bound : float
        ``Delta_F > 0``: ``||A - A'||_F <= Delta_F`` for neighbours.
    n_sketch_matrices : int
        ``J >= 0``, every distinct Gaussian sketch matrix whose norm bound the
        calibration uses (Spectral: 2 with a Gaussian ``S``, 1 with a sparse
        sign ``S``; Low-Space: 4, or 3 with a sparse ``S``). Under-counting J is
        a privacy bug. ``J = 0``: every sensitivity is exact for every draw
        (all ``jl_dims`` empty) and no delta is set aside for tail events.
    tree_levels : int, optional
        ``L = floor(log2 T) + 1`` for continual release, 1 for one-shot.
    delta_jl_fraction : float, optional
        ``f`` in ``(0, 1)``: ``delta_JL = f delta``, ``delta_M = (1 - f) delta``.
        Not used with ``public_operator_factors``.
    public_operator_factors : mapping of str to float, optional
        For operators drawn from a public seed: sketch name -> the exact
        worst-case factor of the actual operators (``Delta_i`` with
        ``||f_i(A) - f_i(A')||_F <= Delta_F Delta_i`` for EVERY neighbouring
        pair), one per request. Then ``delta_JL = 0`` and ``jl_dims`` are not
        used (spec private-lrf-2 section 3).

    Returns
    -------
    ReleaseCalibration
        With ``sketches[i].sigma = Delta_F Delta_i s sqrt(L / w_i)`` and
        ``effective_sensitivity == 1/s`` up to rounding.

    Raises
    ------
    PrivacyConfigError
        If ``epsilon``, ``delta`` or ``delta_jl_fraction`` is out of range.
    InvalidParameterError
        If a request, the weights, ``frobenius_bound``, ``n_sketch_matrices``
        or ``tree_levels`` is invalid; the message names the parameter.

    Notes
    -----
    Privacy. Neighbouring pairs with ``||A - A'||_F <= Delta_F`` (Priv1, hence
    Priv2). Sensitivity of sketch i is ``Delta_F Delta_i`` except with
    probability ``beta`` per matrix [LM00, Lemma 1] (spec section 4.2); the
    release is one Gaussian mechanism with ``Delta_eff = 1/s``, exact via
    [BW18, Thm 8]; spec section 4.4 (theorem) and 4.5 (tree).

    Examples
    --------
    >>> cal = calibrate_release(
    ...     [SketchRequest(name="Y", shape=(100, 40), jl_dims=(40,), weight=0.5),
    ...      SketchRequest(name="Z", shape=(160, 80), jl_dims=(160,), weight=0.5)],
    ...     epsilon=1.0, delta=1e-6, frobenius_bound=1.0, n_sketch_matrices=2)
    >>> [(sk.name, sk.shape, round(sk.sigma, 2)) for sk in cal.sketches]
    [('Y', (100, 40), 10.68), ('Z', (160, 80), 8.3)]
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    frac = check_float_in_interval(
        delta_jl_fraction, "delta_jl_fraction", 0.0, 1.0, privacy=True
    )
    bound = check_float_in_interval(frobenius_bound, "frobenius_bound", 0.0, math.inf)
    n_mat = check_int_in_range(n_sketch_matrices, "n_sketch_matrices", 0)
    levels = check_int_in_range(tree_levels, "tree_levels", 1)
    reqs = _check_requests(requests, n_mat)
    public = public_operator_factors is not None
    factors = _check_factors(public_operator_factors, reqs) if public else {}

    # spec section 2.2: delta = delta_M + delta_JL, beta_j = delta_JL / J; a worst
    # case over all neighbours never fails, so public operators spend no delta_JL,
    # and neither does a release whose sensitivities are exact for every draw
    # (sparse sign operators, public matrices: J = 0) [private-lrf-2, 2 and 6]
    delta_jl = 0.0 if public or n_mat == 0 else frac * dlt
    delta_m = dlt - delta_jl
    beta = delta_jl / n_mat if n_mat else 0.0
    s = gaussian_noise_multiplier(eps, delta_m)
    sketches = []
    for r in reqs:
        if r.clip_factor != 1.0:
            # clipped in sketch space: rho for every operator, public or secret
            jl = r.clip_factor
        elif public:
            jl = factors[r.name]
        else:
            jl = math.prod(jl_sensitivity_factor(d, beta) for d in r.jl_dims)
        sketches.append(
            SketchNoise(
                name=r.name,
                shape=(int(r.shape[0]), int(r.shape[1])),
                sensitivity=bound * jl,
                jl_factor=jl,
                weight=float(r.weight),
                # spec section 4.4/4.5: sum_i L (Delta_F Delta_i)^2 / sigma_i^2 = 1/s^2
                sigma=bound * jl * s * math.sqrt(levels / r.weight),
            )
        )
    return ReleaseCalibration(
        epsilon=eps,
        delta=dlt,
        delta_mechanism=delta_m,
        delta_jl=delta_jl,
        n_sketch_matrices=n_mat,
        beta=beta,
        frobenius_bound=bound,
        noise_multiplier=s,
        tree_levels=levels,
        sketches=tuple(sketches),
        public_sketch_seed=public,
    )


def _check_factors(
    factors: Mapping[str, float] | None, reqs: tuple[SketchRequest, ...]
) -> dict[str, float]:
    names = sorted(r.name for r in reqs)
    if not isinstance(factors, Mapping) or sorted(factors) != names:
        got = (
            sorted(factors) if isinstance(factors, Mapping) else type(factors).__name__
        )
        raise InvalidParameterError(
            f"public_operator_factors must name each sketch once ({names}), got {got}."
        )
    return {
        name: check_float_in_interval(
            value, f"public_operator_factors[{name!r}]", 0.0, math.inf
        )
        for name, value in factors.items()
    }


def to_dp_event(calibration: ReleaseCalibration) -> dp_accounting.GaussianDpEvent:
    """Express the release as a dp_accounting event.

    Parameters
    ----------
    calibration : ReleaseCalibration
        A calibrated release.

    Returns
    -------
    dp_accounting.GaussianDpEvent
        ``GaussianDpEvent(noise_multiplier=1/Delta_eff)``: the whole release
        is one Gaussian mechanism with unit sensitivity (spec section 4.4).
        ``delta_JL`` is not part of the event and must be added to any delta
        an accountant reports.
    """
    import dp_accounting  # heavy: dp_accounting, 2-3 s to import

    return dp_accounting.GaussianDpEvent(
        noise_multiplier=1.0 / calibration.effective_sensitivity
    )


def pld_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Epsilon of composed unit-sensitivity Gaussians by dp_accounting's PLD.

    Parameters
    ----------
    noise_multipliers : sequence of float
        One positive noise multiplier per composed Gaussian mechanism.
    delta : float
        In ``(0, 1)``.

    Returns
    -------
    float
        ``PLDAccountant(value_discretization_interval=1e-4)`` epsilon. A
        cross-check of the closed form used here; not used for calibration.
    """
    import dp_accounting  # heavy: dp_accounting, 2-3 s to import

    dlt = check_float_in_interval(delta, "delta", 0.0, 1.0, privacy=True)
    zs = [
        check_float_in_interval(z, "noise_multipliers[*]", 0.0, math.inf, privacy=True)
        for z in noise_multipliers
    ]
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for z in zs:
        accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=z))
    return float(accountant.get_epsilon(dlt))
