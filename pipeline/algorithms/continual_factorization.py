"""Factorization mechanisms for continual release: square root, BLT, the tree as one.

Problem. Epoch ``s = 1..T`` adds an exact statistic ``x_s`` (a sketch of the
epoch's clipped updates, :mod:`pipeline.algorithms.continual`); after epoch
``tau`` release the prefix sum ``sum_{s <= tau} x_s`` with Gaussian noise, the
whole sequence of releases costing one (epsilon, delta). Stack the ``x_s`` as the
rows of ``X`` (T x d): the releases are ``A X`` for the T x T lower-triangular
all-ones matrix ``A``.

Method. A factorization ``A = L R`` with ``L``, ``R`` lower triangular gives the
mechanism ``L (R X + sigma Z)`` = ``A X + sigma L Z`` [HUU23, FHU23]: the
Gaussian mechanism on ``R X`` followed by post-processing. Its release at
``tau`` is the running exact sum plus ``sigma sum_s L[tau, s] z_s``, where
``z_s`` -- one standard normal array of the statistic's shape per column of
``L`` -- is regenerated from the stream's noise key and a label (keyed noise,
:mod:`pipeline.mechanisms.noise`), so a retried release draws the same noise and
the square root stores none. A :class:`ContinualMechanism` describes one
factorization:

* ``"sqrt-factorization"`` (default): ``L = R = A^{1/2}``, the lower-triangular
  Toeplitz matrix of ``c_j = binom(2j, j) / 4^j`` (the coefficients of
  ``(1 - x)^{-1/2}``; ``sum_{j=0}^{n} c_j c_{n-j} = 1`` for every n, so
  ``R R = A``). The noise at ``tau`` is ``sigma sum_{s <= tau} c_{tau-s} z_s``,
  of variance ``sigma^2 sum_{j < tau} c_j^2`` per entry.
* ``"blt"``: a buffered linear Toeplitz decoder [DMRS+24],
  ``l_j = sum_i omega_i theta_i^(j-1)`` (j >= 1, ``l_0 = 1``) with 3 buffers
  fitted to T (:func:`fit_blt`): within 1 % of the square root's noise at
  T <= 4096 (7 % at T = 2^20), and its release noise
  ``z_tau + sum_i omega_i b_i`` needs one draw per epoch and 3 running noise
  arrays ``b_i <- theta_i b_i + z_tau`` instead of tau draws.
* ``"tree"`` (comparison): the binary tree [DNPR10, CSS11] as a factorization:
  ``R`` has one row per tree node (level j, odd node q with ``q 2^j <= T``),
  summing epochs ``(q-1) 2^j + 1 .. q 2^j``; ``L[tau, node] = 1`` for the
  popcount(tau) nodes of :func:`~pipeline.algorithms.continual.tree_nodes`.
  Its noise terms are the nodes' keyed noise of the current tree, bit for bit
  (:func:`~pipeline.algorithms.continual.node_noise`).

Privacy. Streams differ in one entity; the stream's clipping contract (per-entity
net contributions clipped against a budget that spans every batch and epoch,
:mod:`pipeline.mechanisms.entities`) gives the continual relation
``sum_s ||E_s||_F <= Delta_F`` for the per-epoch differences ``E_s = D_s - D'_s``
[spec sketch-lrf 1.4]. The released Gaussian mechanism is ``R X``; its
sensitivity is :attr:`ContinualMechanism.sensitivity_factor` ``= max_s ||R e_s||``
times the one-shot sensitivity. For a sketch ``F`` (linear), row tau of
``R (X - X')`` is ``F(M_tau)`` with ``M_tau = sum_s R[tau, s] E_s``; stacked over
tau the ``M_tau`` form one matrix ``M`` (for a right operator ``Phi``: ``M`` on
top of each other, ``M Phi``; for a left one ``S``: side by side,
``S [M_1 .. M_T]``), and

    ||M||_F = ||sum_s (R e_s) (x) E_s||_F <= sum_s ||R e_s|| ||E_s||_F
            <= max_s ||R e_s|| sum_s ||E_s||_F <= max_s ||R e_s|| Delta_F.

``M`` is fixed before the operators are drawn, and every ``M_tau`` lies in the
entity's row (cell) when it keeps to one; so each sketch's one-shot bound -- the
JL factor for a fixed difference, the worst case of public operators, the exact
norm of a sparse sign column -- applies once, to ``M``. The bound is attained:
an entity that spends its whole budget in the epoch ``s*`` maximising
``||R e_s||`` gives ``||M||_F = ||R e_{s*}|| Delta_F``. Hence the mechanism's
noise is ``sigma_i = sensitivity_factor * sigma_i^(1)`` with ``sigma_i^(1)`` the
one-shot joint calibration of the same (epsilon, delta) and sketches [spec 4.5]:
exact, since every sigma of a joint Gaussian calibration scales with the
sensitivity.

* Toeplitz ``L`` (square root, BLT): ``R = L^{-1} A`` is Toeplitz too, so its
  first column is the longest: ``sensitivity_factor = ||R e_1||``.
* Square root: ``||R e_s||^2 = sum_{j <= T-s} c_j^2``, largest at s = 1:
  ``sensitivity_factor = sqrt(sum_{j < T} c_j^2)`` (1.72 at T = 366; the sums
  grow like ``ln(T) / pi``).
* Tree: epoch s lies in at most one node per level, and in one node of each of
  the L = floor(log2 T) + 1 levels when s = 1 (node 1 of level j covers epochs
  1..2^j <= T): ``sensitivity_factor = sqrt(L)``, the tree's calibration.

The per-entry noise at ``tau``, in units of the one-shot sigma, is
:meth:`ContinualMechanism.noise_factor`:
``sqrt(sum_{j < T} c_j^2 * sum_{j < tau} c_j^2)`` for the square root against
``sqrt(L popcount(tau))`` for the tree. Every mechanism here releases a
lower-triangular factorization, so each release depends on the epochs up to it
only; data that adapt to earlier releases are outside the analysis (as for the
tree).

References
----------
.. [HUU23] M. Henzinger, J. Upadhyay, S. Upadhyay. Almost tight error bounds on
   differentially private continual counting. SODA 2023, arXiv:2211.05006.
.. [FHU23] H. Fichtenberger, M. Henzinger, J. Upadhyay. Constant matters:
   fine-grained error bound on differentially private continual observation.
   ICML 2023, arXiv:2202.11205.
.. [DMRS+24] K. Dvijotham, H. B. McMahan, K. Pillutla, T. Steinke, A. Thakurta.
   Efficient and near-optimal noise generation for streaming differential
   privacy. FOCS 2024, arXiv:2404.16706.
.. [DNPR10] Dwork, Naor, Pitassi, Rothblum. Differential privacy under continual
   observation. STOC 2010.
.. [CSS11] Chan, Shi, Song. Private and continual release of statistics. ACM
   TISSEC 14(3), 2011.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

from pipeline._types import FloatArray
from pipeline._validation import check_int_in_range
from pipeline.algorithms.continual import (
    StreamPlan,
    noise_code,
    tree_levels,
    tree_nodes,
)
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey

__all__ = [
    "BLT",
    "DEFAULT_MECHANISM",
    "MECHANISMS",
    "SQRT",
    "TREE",
    "ContinualMechanism",
    "NoiseTerm",
    "blt_advance",
    "blt_noise",
    "continual_mechanism",
    "fit_blt",
    "mechanism_noise",
    "prefix_matrix",
    "released_sketches",
    "sqrt_coefficients",
    "toeplitz_lower",
]

#: The square-root factorization of the prefix-sum matrix [HUU23, FHU23].
SQRT = "sqrt-factorization"
#: A buffered linear Toeplitz decoder fitted to the horizon [DMRS+24].
BLT = "blt"
#: The binary tree [DNPR10, CSS11], kept for comparison.
TREE = "tree"
MECHANISMS = (SQRT, BLT, TREE)
DEFAULT_MECHANISM = SQRT

# first label of every noise sub-key: the tree keeps the labels of its nodes
_KEY_PREFIX = {SQRT: "epoch", BLT: "epoch", TREE: "tree"}
_U = 2.0**-53  # unit roundoff of float64


@functools.lru_cache(maxsize=8)
def _coefficients(n: int) -> FloatArray:
    out = np.empty(n)
    out[0] = 1.0
    c = 1.0
    for j in range(1, n):
        c = c * (2 * j - 1) / (2 * j)  # two roundings per step
        out[j] = c
    out.flags.writeable = False
    return out


def sqrt_coefficients(n: int) -> FloatArray:
    """``c_0 .. c_{n-1}``, ``c_j = binom(2j, j) / 4^j``, by ``c_j = c_{j-1} (2j-1) / (2j)``.

    The recurrence never forms the binomial (which overflows float64 beyond
    j ~ 500); each step rounds twice, so ``c_j`` carries a relative error of at
    most ``gamma_{2j} = 2j u / (1 - 2j u)``, u = 2^-53.

    Examples
    --------
    >>> sqrt_coefficients(4).tolist()
    [1.0, 0.5, 0.375, 0.3125]
    """
    return _coefficients(int(check_int_in_range(n, "n", 1)))


def toeplitz_lower(coefficients: FloatArray) -> FloatArray:
    """The T x T lower-triangular Toeplitz matrix ``M[i, j] = coefficients[i - j]``."""
    c = np.asarray(coefficients, dtype=np.float64)
    T = c.size
    idx = np.arange(T)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, c[np.clip(diff, 0, T - 1)], 0.0)


def prefix_matrix(horizon: int) -> FloatArray:
    """``A``: the T x T lower-triangular all-ones matrix (prefix sums)."""
    return np.tril(np.ones((horizon, horizon)))


def _blt_polynomials(
    theta: Sequence[float] | FloatArray,
    omega: Sequence[float] | FloatArray,
    dtype: type = np.longdouble,
) -> tuple[FloatArray, FloatArray]:
    """``(P, Q)`` with ``l(x) = 1 + sum_i omega_i x / (1 - theta_i x) = P(x) / Q(x)``."""
    Q: FloatArray = np.ones(1, dtype=dtype)
    for t in theta:
        Q = np.convolve(Q, np.array([1.0, -t], dtype=dtype))
    P = Q.copy()
    for i, w in enumerate(omega):
        term: FloatArray = np.array([0.0, w], dtype=dtype)
        for k, t in enumerate(theta):
            if k != i:
                term = np.convolve(term, np.array([1.0, -t], dtype=dtype))
        P[: term.size] += term
    return P, Q


def _blt_series(
    theta: Sequence[float] | FloatArray,
    omega: Sequence[float] | FloatArray,
    n: int,
    dtype: type = np.longdouble,
) -> tuple[FloatArray, FloatArray]:
    """The first n coefficients of ``l(x)`` and of ``1 / l(x)`` (decoder, its inverse)."""
    P, Q = _blt_polynomials(theta, omega, dtype)
    impulse: FloatArray = np.zeros(n, dtype=dtype)
    impulse[0] = 1.0
    return lfilter(P, Q, impulse), lfilter(Q, P, impulse)


@dataclass(frozen=True, slots=True)
class NoiseTerm:
    """One standard normal array of a release's noise, with its coefficient.

    ``labels`` name the noise in the stream key: ``(s,)`` for the noise of epoch
    s of a factorization, ``(level, node)`` for a tree node.
    """

    labels: tuple[int, ...]
    coefficient: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ContinualMechanism:
    """A factorization mechanism for continual release over ``horizon`` epochs.

    Public and small (a name, a horizon and, for ``"blt"``, the decoder's
    parameters ``theta``, ``omega``): a stream records it when it is created and
    keeps it for its life. Build it with :func:`continual_mechanism` or
    :func:`fit_blt`.
    """

    name: str
    horizon: int
    theta: tuple[float, ...] = ()
    omega: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in MECHANISMS:
            raise InvalidParameterError(
                f"mechanism must be one of {', '.join(MECHANISMS)}; got {self.name!r}."
            )
        check_int_in_range(self.horizon, "horizon", 1)
        if self.name != BLT and (self.theta or self.omega):
            raise InvalidParameterError(f"mechanism {self.name!r} takes no parameters.")
        if self.name == BLT and not (
            len(self.theta) == len(self.omega) >= 1
            and all(0.0 <= t < 1.0 for t in self.theta)
            and all(0.0 <= w < math.inf for w in self.omega)
        ):
            raise InvalidParameterError(
                "mechanism 'blt' needs as many buffers' theta in [0, 1) as finite "
                "omega >= 0."
            )

    def decoder(self, n: int | None = None) -> FloatArray:
        """``l_0 .. l_{n-1}``: the coefficients of the Toeplitz ``L`` (not the tree)."""
        n = self.horizon if n is None else n
        if self.name == SQRT:
            return sqrt_coefficients(n)
        if self.name == BLT:
            return np.asarray(_blt_series(self.theta, self.omega, n)[0], np.float64)
        raise InvalidParameterError("the tree's L is not Toeplitz; see factors().")

    def encoder(self) -> FloatArray:
        """``r_0 .. r_{T-1}``: the first column of ``R = L^{-1} A``."""
        if self.name == SQRT:
            return sqrt_coefficients(self.horizon)
        if self.name == BLT:
            inverse = _blt_series(self.theta, self.omega, self.horizon)[1]
            return np.asarray(np.cumsum(inverse), np.float64)
        return self.factors()[1][:, 0]

    @property
    def sensitivity_factor(self) -> float:
        """``max_s ||R e_s||``, rounded up: the mechanism's sigma over the one-shot sigma.

        ``sqrt(L)`` for the tree, exactly. For a Toeplitz ``L`` the first column
        of ``R`` is the longest: ``||r||`` (``sqrt(sum_{j < T} c_j^2)`` for the
        square root), times ``1 + 4 ||g||_1 T^1.5 u``, with ``g`` the coefficients
        of ``1 / l(x)`` (``||g||_1 <= 2`` for the square root). This bounds the
        relative gap between ``||r||`` computed here and the exact
        ``||L^{-1} A e_1||`` of the float decoder the noise uses, since
        ``||L^{-1}||_2 <= ||g||_1``: the square root's float ``L r`` is within
        ``sqrt(T) gamma_{3T+1}`` of ``A e_1`` (its coefficients' rounding); a
        BLT's ``r`` is computed in extended precision from its parameters and its
        float decoder rounds each ``l_j <= sum_i omega_i`` once.
        """
        return _sensitivity(self)

    def noise_terms(self, tau: int) -> tuple[NoiseTerm, ...]:
        """Row ``tau`` of ``L``: the keyed noises and coefficients of release ``tau``.

        ``((s,), l_{tau-s})`` for s = 1..tau (``l = c`` for the square root);
        ``((j, q), 1.0)`` for the popcount(tau) tree nodes.
        """
        tau = int(check_int_in_range(tau, "tau", 1, self.horizon))
        if self.name == TREE:
            return tuple(NoiseTerm((j, q), 1.0) for j, q in tree_nodes(tau))
        c = self.decoder(tau)
        return tuple(NoiseTerm((s,), float(c[tau - s])) for s in range(1, tau + 1))

    def variance_factor(self, tau: int) -> float:
        """``||L[tau, :]||^2``: the noise variance at ``tau`` over the mechanism's sigma^2."""
        tau = int(check_int_in_range(tau, "tau", 1, self.horizon))
        if self.name == TREE:
            return float(tau.bit_count())
        c = self.decoder(tau)
        return math.fsum(c * c)

    def noise_factor(self, tau: int) -> float:
        """Per-entry noise std at ``tau`` over the one-shot sigma of the same budget.

        ``sensitivity_factor * ||L[tau, :]||``: ``sqrt(L popcount(tau))`` for the
        tree, ``sqrt(sum_{j < T} c_j^2 sum_{j < tau} c_j^2)`` for the square root.
        """
        return self.sensitivity_factor * math.sqrt(self.variance_factor(tau))

    @property
    def rms_noise_factor(self) -> float:
        """``sqrt(mean_tau noise_factor(tau)^2)`` over tau = 1..T: the noise a stream
        plans its budget split for (:func:`pipeline.algorithms.continual.plan_stream`).

        Examples
        --------
        >>> round(continual_mechanism("sqrt-factorization", 366).rms_noise_factor, 3)
        2.782
        >>> [continual_mechanism(m, 1).rms_noise_factor for m in MECHANISMS]
        [1.0, 1.0, 1.0]
        """
        return _rms_noise_factor(self)

    def key(self, key: NoiseKey, code: int, term: NoiseTerm) -> NoiseKey:
        """The sub-key of one noise term of statistic ``code``."""
        return key.derive(_KEY_PREFIX[self.name], int(code), *term.labels)

    def factors(self) -> tuple[FloatArray, FloatArray]:
        """``(L, R)`` as dense matrices with ``L R = A`` (for tests and small T).

        Toeplitz mechanisms: T x T, from :meth:`decoder` and :meth:`encoder`
        (``L = R = A^{1/2}`` for the square root). Tree: ``R`` (nodes x T) sums
        each node's epochs, ``L`` (T x nodes) selects each release's nodes.
        """
        T = self.horizon
        if self.name != TREE:
            return toeplitz_lower(self.decoder()), toeplitz_lower(self.encoder())
        nodes = [
            (j, q)
            for j in range(tree_levels(T))
            for q in range(1, (T >> j) + 1, 2)  # the odd nodes are the ones released
        ]
        col = {node: i for i, node in enumerate(nodes)}
        R = np.zeros((len(nodes), T))
        for (j, q), i in col.items():
            R[i, (q - 1) << j : q << j] = 1.0
        L = np.zeros((T, len(nodes)))
        for tau in range(1, T + 1):
            for node in tree_nodes(tau):
                L[tau - 1, col[node]] = 1.0
        return L, R


@functools.lru_cache(maxsize=32)
def _rms_noise_factor(mech: ContinualMechanism) -> float:
    # a planning quantity, not a calibration: ||R e_1|| as computed, without the
    # rounding guard of sensitivity_factor, so that one epoch gives exactly 1
    T = mech.horizon
    if mech.name == TREE:
        variance = math.fsum(tau.bit_count() for tau in range(1, T + 1))
        norm = math.sqrt(tree_levels(T))
    else:
        c2 = mech.decoder() ** 2
        variance = math.fsum(np.cumsum(c2))  # sum over tau of ||L[tau, :]||^2
        norm = math.sqrt(math.fsum(mech.encoder() ** 2))
    return norm * math.sqrt(variance / T)


@functools.lru_cache(maxsize=32)
def _sensitivity(mech: ContinualMechanism) -> float:
    T = mech.horizon
    if mech.name == TREE:
        return math.sqrt(tree_levels(T))
    if mech.name == SQRT:
        c = sqrt_coefficients(T)
        norm, g1 = math.sqrt(math.fsum(c * c)), 2.0
    else:
        inverse = _blt_series(mech.theta, mech.omega, T)[1]
        r = np.cumsum(inverse)
        norm = float(np.sqrt(np.sum(r * r)))
        g1 = float(np.sum(np.abs(inverse)))
    return float(norm * (1.0 + 4.0 * g1 * T**1.5 * _U))


def continual_mechanism(name: str, horizon: int) -> ContinualMechanism:
    """The mechanism ``name`` (``"sqrt-factorization"``, ``"tree"``) over T epochs.

    ``"blt"`` is fitted to the horizon: :func:`fit_blt`.

    Examples
    --------
    >>> m = continual_mechanism("sqrt-factorization", 366)
    >>> round(m.sensitivity_factor, 4), round(m.noise_factor(255), 4)
    (1.7161, 2.8868)
    >>> round(continual_mechanism("tree", 366).noise_factor(255), 4)
    8.4853
    """
    if name == BLT:
        return fit_blt(horizon)
    return ContinualMechanism(name=name, horizon=int(horizon))


def _blt_loss(x: FloatArray, horizon: int) -> float:
    """``(max_tau + mean_tau) / 2`` of the noise std, in one-shot sigmas, of the BLT ``x``."""
    d = x.size // 2
    theta, omega = 1.0 / (1.0 + np.exp(-x[:d])), np.exp(x[d:])
    with np.errstate(all="ignore"):
        ell, inverse = _blt_series(theta, omega, horizon, np.float64)
        r = np.cumsum(inverse)
        std = math.sqrt(float(r @ r)) * np.sqrt(np.cumsum(ell * ell))
    if not np.all(np.isfinite(std)):
        return math.inf
    return 0.5 * float(std[-1]) + 0.5 * float(std.mean())


def fit_blt(horizon: int, buffers: int = 3) -> ContinualMechanism:
    """A buffered linear Toeplitz decoder for T epochs, fitted to the noise std [DMRS+24].

    ``l_0 = 1``, ``l_j = sum_i omega_i theta_i^(j-1)``: the noise of release tau
    is ``z_tau + sum_i omega_i b_i`` with ``buffers`` running arrays
    ``b_i <- theta_i b_i + z_tau`` (:func:`blt_noise`, :func:`blt_advance`), so a
    release draws one array and the state holds ``buffers`` noise arrays instead
    of regenerating tau of them. ``(theta, omega)`` minimise the mean of the
    largest and the average noise std over tau (Nelder-Mead from a fixed start:
    the same parameters on every run); any parameters are private, the fit only
    decides utility: the sensitivity is computed from the parameters chosen.

    Examples
    --------
    >>> m = fit_blt(64)
    >>> len(m.theta), m.noise_factor(64) / continual_mechanism(SQRT, 64).noise_factor(64) < 1.02
    (3, True)
    """
    T = int(check_int_in_range(horizon, "horizon", 1))
    d = int(check_int_in_range(buffers, "buffers", 1))
    theta0 = 1.0 - np.maximum(float(T), 2.0) ** (-np.arange(1, d + 1) / d)
    x0 = np.concatenate([np.log(theta0 / (1.0 - theta0)), np.full(d, math.log(0.1))])
    res = minimize(
        _blt_loss, x0, args=(T,), method="Nelder-Mead",
        options={"maxiter": 2000 * d, "xatol": 1e-8, "fatol": 1e-10},
    )  # fmt: skip
    theta = 1.0 / (1.0 + np.exp(-res.x[:d]))
    omega = np.exp(res.x[d:])
    return ContinualMechanism(
        name=BLT,
        horizon=T,
        theta=tuple(float(t) for t in np.clip(theta, 0.0, 1.0 - 1e-12)),
        omega=tuple(float(w) for w in omega),
    )


def blt_noise(
    mechanism: ContinualMechanism, buffers: Sequence[FloatArray], z: FloatArray
) -> FloatArray:
    """The BLT noise of release tau in units of sigma: ``z_tau + sum_i omega_i b_i``.

    ``buffers`` hold ``b_i = sum_{s < tau} theta_i^(tau-1-s) z_s`` (zeros before
    epoch 1); ``z`` is epoch tau's keyed standard normal array.
    """
    out = np.array(z, dtype=np.float64)
    for w, b in zip(mechanism.omega, buffers, strict=True):
        out += w * b
    return out


def blt_advance(
    mechanism: ContinualMechanism, buffers: Sequence[FloatArray], z: FloatArray
) -> list[FloatArray]:
    """The buffers after epoch tau: ``b_i <- theta_i b_i + z_tau``."""
    return [t * b + z for t, b in zip(mechanism.theta, buffers, strict=True)]


def mechanism_noise(
    mechanism: ContinualMechanism,
    key: NoiseKey,
    code: int,
    tau: int,
    *,
    sigma: float,
    shape: tuple[int, int],
    tile_size: int,
) -> FloatArray:
    """The noise of release ``tau`` of one statistic: ``sigma sum_terms coef z_term``.

    Parameters
    ----------
    mechanism : ContinualMechanism
    key : NoiseKey
        The stream's noise key.
    code : int
        The statistic's noise code.
    tau : int
        The release's epoch, ``1 <= tau <= horizon``.
    sigma : float
        The mechanism's sigma of this statistic (``sensitivity_factor`` times the
        one-shot sigma).
    shape : (length, dim)
        The statistic as stored (data axis first), tiled like its operators.
    tile_size : int

    Notes
    -----
    Privacy. Each ``z_term`` is regenerated from its own sub-key, so every
    release of the stream uses the same ``z_s`` with the coefficients of its row
    of ``L``: the releases are ``A X + sigma L Z``, a post-processing of the
    Gaussian mechanism ``R X + sigma Z`` [HUU23]. Cost: one draw of the
    statistic's size per term (tau terms for the square root, popcount(tau) for
    the tree).
    """
    out = np.zeros(shape)
    for term in mechanism.noise_terms(tau):
        out += GaussianNoise(
            key=mechanism.key(key, code, term),
            sigma=sigma * term.coefficient,
            length=shape[0],
            dim=shape[1],
            tile_size=tile_size,
        ).dense()
    return out


def released_sketches(
    mechanism: ContinualMechanism,
    plan: StreamPlan,
    running: Mapping[str, FloatArray],
    epoch: int,
    key: NoiseKey,
    sigmas: Mapping[str, float],
) -> dict[str, FloatArray]:
    """The released sketches of ``A(epoch)``: the running exact sums plus their noise.

    ``running`` holds ``sum_{s <= epoch} x_s`` per statistic (the only state a
    keyed factorization mechanism needs); ``sigmas`` the mechanism's sigma per
    statistic. Noise is added once to each entry, after the sum.
    """
    plan.check_epoch(epoch)
    if epoch > mechanism.horizon:
        raise InvalidParameterError(
            "the mechanism's horizon is shorter than the epoch."
        )
    shapes = plan.shapes()
    return {
        name: np.asarray(running[name], dtype=np.float64)
        + mechanism_noise(
            mechanism,
            key,
            noise_code(plan, name),
            epoch,
            sigma=float(sigmas[name]),
            shape=shapes[name],
            tile_size=plan.lrf.params.tile_size,
        )
        for name in plan.names
    }
