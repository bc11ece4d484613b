"""Empirical privacy auditing of Gaussian mechanisms: lower confidence bounds on epsilon.

Problem. A mechanism claims ``(epsilon, delta)``-DP. Run it many times on two
neighbouring inputs ``D`` and ``D'``, apply a distinguishing test to every output
and turn the test's error rates into a number ``eps_lb`` that, with probability at
least ``confidence``, is at most the mechanism's true epsilon. If
``eps_lb > epsilon`` the claim is refuted. A correct mechanism audited with a
finite number of samples gives ``eps_lb`` well below ``epsilon``; the audit is
meant to catch gross errors (noise too small by a constant factor, noise added to
partial sums, missing clipping), not to certify the claim [JUO20, NST+21].

Method.

1. *Test.* For ``(epsilon, delta)``-DP and any set ``S`` of outputs,
   ``P[M(D') in S] <= e^eps P[M(D) in S] + delta`` and the same with ``D, D'``
   exchanged. For the threshold test "reject ``D`` when ``T > tau``", with false
   positive rate ``FPR = P[T > tau | D]`` and false negative rate
   ``FNR = P[T <= tau | D']``, this gives
   ``eps >= log((1 - delta - FNR) / FPR)`` and
   ``eps >= log((1 - delta - FPR) / FNR)`` [KOV15; JUO20].
2. *Confidence.* Replacing FPR and FNR by one-sided Clopper-Pearson upper bounds
   [CP34] keeps both inequalities valid whenever the bounds hold. Four bounds are
   used (FPR and FNR at one threshold per direction); each is taken at level
   ``alpha = (1 - confidence) / 4``, so by the union bound the reported
   ``eps_lb`` exceeds the true epsilon with probability at most
   ``1 - confidence``.
3. *Selection.* Each sample is split in halves. Everything the test needs is
   chosen on the first halves (the weights of step 4, then one threshold per
   direction, maximising the same bound computed there) and the bound is
   evaluated on the second halves only, so the choices do not bias the
   interval [JUO20; NST+21].
4. *Statistic.* A release of independent Gaussian blocks
   ``y_i = f_i(D) + N(0, sigma_i^2 I)`` is reduced to one projection per block,

       T_i = <y_i - f_i(D), Delta_i> / (sigma_i ||Delta_i||),
       Delta_i = f_i(D') - f_i(D),

   which is N(0, 1) under ``D`` and N(||Delta_i|| / sigma_i, 1) under ``D'``.
   The log-likelihood ratio of ``D'`` against ``D`` is
   ``sum_i (<y_i - f_i(D), Delta_i> - ||Delta_i||^2 / 2) / sigma_i^2``, an
   increasing affine function of ``sum_i (||Delta_i|| / sigma_i) T_i``: the
   residual orthogonal to ``Delta_i`` has the same law under both neighbours and
   carries no information. By the Neyman-Pearson lemma threshold tests on the
   likelihood ratio are the most powerful tests at every level, so this
   reduction loses nothing: its trade-off curve *is* the mechanism's on this pair
   [DRS22, Sec. 2]. The weights are not taken from the declared sigmas but
   fitted on the selection half (Fisher's discriminant of the ``T_i``), so a bug
   that changes one block's noise is still met by the optimal test. Symmetric statistics released with ``sigma sym(G)`` noise are handled in
   the orthonormal coordinates of :func:`coordinates`, where that noise is
   isotropic (spec power-pca 3.2).
5. *Sampling.* A linear functional of Gaussian noise is Gaussian,
   ``<N, Delta> ~ N(0, sum_c std_c^2 Delta_c^2)`` for independent coordinates,
   so the ``T_i`` can be drawn directly (:func:`draw_statistic`) instead of
   drawing whole releases and projecting them; :func:`statistic` projects real
   releases for the audits that run a mechanism's own noise generator end to end
   and so check that its noise follows the law assumed here.

References
----------
.. [JUO20] Jagielski, Ullman, Oprea. Auditing differentially private machine
   learning: how private is private SGD? NeurIPS 2020, arXiv:2006.07709.
.. [NST+21] Nasr, Song, Thakurta, Papernot, Carlini. Adversary instantiation:
   lower bounds for differentially private machine learning. IEEE S&P 2021,
   arXiv:2101.04535.
.. [KOV15] Kairouz, Oh, Viswanath. The composition theorem for differential
   privacy. ICML 2015, arXiv:1311.0776 (hypothesis-testing view of DP).
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS-B 84(1), 2022,
   arXiv:1905.02383.
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530.
.. [CP34] Clopper, Pearson. The use of confidence or fiducial limits illustrated
   in the case of the binomial. Biometrika 26(4), 1934.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from pipeline._types import FloatArray, IntArray
from pipeline.accounting.gaussian import gaussian_epsilon

__all__ = [
    "N_CANDIDATES",
    "AuditResult",
    "GaussianBlock",
    "clopper_pearson",
    "clopper_pearson_upper",
    "coordinates",
    "declared_mu",
    "draw_statistic",
    "effective_mu",
    "epsilon_lower_bound",
    "fisher_weights",
    "markdown_table",
    "pair_epsilon",
    "statistic",
]

#: Candidate thresholds tried on the selection half (logit-spaced quantiles).
N_CANDIDATES = 2001


def clopper_pearson_upper(k: Any, n: int, alpha: float) -> FloatArray:
    """One-sided Clopper-Pearson upper bound on a binomial proportion.

    Parameters
    ----------
    k : int or array_like of int
        Observed successes, ``0 <= k <= n``.
    n : int
        Trials, ``n >= 1``.
    alpha : float
        ``P[p > bound] <= alpha`` for every true proportion ``p`` [CP34].

    Returns
    -------
    ndarray of the shape of ``k``
        ``Beta(1 - alpha; k + 1, n - k)`` quantile, and 1 where ``k = n``.

    Examples
    --------
    >>> round(float(clopper_pearson_upper(0, 1000, 0.05)), 5)
    0.00299
    """
    k = np.asarray(k, dtype=np.float64)
    # k = n makes the second shape parameter 0; the bound is then 1
    safe = np.minimum(k, n - 1)
    hi = stats.beta.ppf(1.0 - alpha, safe + 1.0, n - safe)
    return np.where(k >= n, 1.0, hi)


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a binomial proportion [CP34].

    Parameters
    ----------
    k, n : int
        Successes and trials, ``0 <= k <= n``, ``n >= 1``.
    confidence : float
        Coverage, e.g. 0.999; each tail gets ``(1 - confidence) / 2``.

    Returns
    -------
    (lower, upper) : tuple of float

    Examples
    --------
    >>> lo, hi = clopper_pearson(50, 100, 0.95)
    >>> round(lo, 4), round(hi, 4)
    (0.3983, 0.6017)
    """
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    return lo, float(clopper_pearson_upper(k, n, a))


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditResult:
    """Outcome of a threshold audit (:func:`epsilon_lower_bound`).

    Attributes
    ----------
    epsilon_lb : float
        The lower confidence bound on epsilon (0 if no threshold gives a
        positive bound: epsilon >= 0 is always true).
    direction : str
        ``"high"`` (reject ``D`` when ``T > tau``, bound
        ``log((1 - delta - FNR) / FPR)``) or ``"low"`` (bound
        ``log((1 - delta - FPR) / FNR)``): the one that gave ``epsilon_lb``.
    threshold : float
        The threshold of that direction, chosen on the selection half.
    fpr, fnr : float
        Empirical rates at that threshold on the evaluation half.
    fpr_upper, fnr_upper : float
        Their one-sided Clopper-Pearson upper bounds.
    n_per_neighbour : int
        Samples per neighbour (selection plus evaluation).
    n_eval : int
        Evaluation samples per neighbour.
    delta, confidence : float
    bounds : dict
        Both directions' bounds on the evaluation half.
    """

    epsilon_lb: float
    direction: str
    threshold: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    n_per_neighbour: int
    n_eval: int
    delta: float
    confidence: float
    bounds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable copy."""
        return {
            "epsilon_lb": self.epsilon_lb,
            "direction": self.direction,
            "threshold": self.threshold,
            "fpr": self.fpr,
            "fnr": self.fnr,
            "fpr_upper": self.fpr_upper,
            "fnr_upper": self.fnr_upper,
            "n_per_neighbour": self.n_per_neighbour,
            "n_eval": self.n_eval,
            "delta": self.delta,
            "confidence": self.confidence,
            "bounds": dict(self.bounds),
        }


def _log_ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    """``log(num / den)`` with ``-inf`` where ``num <= 0`` (no bound)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(num > 0.0, np.log(np.maximum(num, 1e-300) / den), -np.inf)


def _rates(
    null: FloatArray, alt: FloatArray, taus: FloatArray
) -> tuple[IntArray, IntArray]:
    """Counts of false positives (``null > tau``) and false negatives (``alt <= tau``)."""
    n0, n1 = np.sort(null), np.sort(alt)
    fp = n0.size - np.searchsorted(n0, taus, side="right")
    fn = np.searchsorted(n1, taus, side="right")
    return fp, fn


def _bounds(
    fp: IntArray, fn: IntArray, n: int, delta: float, alpha: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    fpr_hi = clopper_pearson_upper(fp, n, alpha)
    fnr_hi = clopper_pearson_upper(fn, n, alpha)
    high = _log_ratio(1.0 - delta - fnr_hi, fpr_hi)  # S = {T > tau}, D' vs D
    low = _log_ratio(1.0 - delta - fpr_hi, fnr_hi)  # S = {T <= tau}, D vs D'
    return high, low, fpr_hi, fnr_hi


def fisher_weights(null: FloatArray, alt: FloatArray) -> FloatArray:
    """Linear discriminant ``Sigma^-1 (mean(alt) - mean(null))`` of two samples.

    Parameters
    ----------
    null, alt : ndarray of shape (n, p)

    Returns
    -------
    ndarray of shape (p,)
        For two Gaussians with a common covariance the log-likelihood ratio is
        linear with exactly these weights (Fisher's discriminant).
    """
    diff = alt.mean(axis=0) - null.mean(axis=0)
    cov = np.atleast_2d(0.5 * (np.cov(null, rowvar=False) + np.cov(alt, rowvar=False)))
    return np.linalg.solve(cov, diff)


def epsilon_lower_bound(
    null: Any,
    alt: Any,
    *,
    delta: float,
    confidence: float = 0.999,
    n_candidates: int = N_CANDIDATES,
) -> AuditResult:
    """Lower confidence bound on epsilon from threshold tests on a statistic.

    Parameters
    ----------
    null : array_like of shape (n,) or (n, p)
        The statistic of ``n`` independent runs on ``D`` (``p`` columns, e.g. one
        projection per released block).
    alt : array_like of the same shape
        The statistic of ``n`` independent runs on the neighbour ``D'``.
    delta : float
        The delta the mechanism declares, in ``[0, 1)``.
    confidence : float
        The returned bound exceeds the true epsilon with probability at most
        ``1 - confidence`` (union bound over four one-sided Clopper-Pearson
        bounds of level ``(1 - confidence) / 4``).
    n_candidates : int
        Thresholds tried on the selection half: quantiles of the pooled
        selection samples at logit-spaced levels, dense in both tails.

    Returns
    -------
    AuditResult

    Notes
    -----
    The first half of each sample chooses everything the test needs: the
    weights of the columns' linear combination (:func:`fisher_weights`; for one
    column only its sign, so that ``D'`` has the larger mean), then one
    threshold per direction (the one maximising the bound computed on that
    half). The second half only evaluates it, so the interval is not biased by
    the choices. Valid for any statistic and any mechanism; only the
    independence of the runs is used [JUO20; NST+21].

    Examples
    --------
    >>> g = np.random.default_rng(0)
    >>> res = epsilon_lower_bound(g.normal(0, 1, 20000), g.normal(6, 1, 20000),
    ...                           delta=1e-5)
    >>> res.n_eval, res.epsilon_lb > 3
    (10000, True)
    """
    t0 = np.asarray(null, dtype=np.float64)
    t1 = np.asarray(alt, dtype=np.float64)
    if t0.shape != t1.shape or t0.ndim not in (1, 2) or t0.shape[0] < 4:
        raise ValueError(
            "null and alt must have the same shape (n,) or (n, p) with n >= 4, got "
            f"{t0.shape} and {t1.shape}."
        )
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got delta={delta!r}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"confidence must be in (0, 1), got confidence={confidence!r}."
        )
    alpha = (1.0 - confidence) / 4.0
    half = t0.shape[0] // 2
    t0, t1 = t0.reshape(t0.shape[0], -1), t1.reshape(t1.shape[0], -1)
    sel0, sel1, ev0, ev1 = t0[:half], t1[:half], t0[half:], t1[half:]
    # one column or several: orient (and combine) them so that D' has the larger
    # mean, which the two bounds below assume
    w = fisher_weights(sel0, sel1)
    sel0, sel1, ev0, ev1 = sel0 @ w, sel1 @ w, ev0 @ w, ev1 @ w
    n_ev = ev0.size

    # candidate thresholds: quantiles at logit-spaced levels reaching ~1/n in each tail
    pooled = np.sort(np.concatenate([sel0, sel1]))
    span = math.log(pooled.size)
    levels = 1.0 / (1.0 + np.exp(-np.linspace(-span, span, n_candidates)))
    # order statistics at those levels (np.quantile's multi-kth partition is slow)
    taus = np.unique(pooled[np.rint(levels * (pooled.size - 1)).astype(np.int64)])

    fp, fn = _rates(sel0, sel1, taus)
    high, low, _, _ = _bounds(fp, fn, half, delta, alpha)
    tau = {"high": float(taus[np.argmax(high)]), "low": float(taus[np.argmax(low)])}

    fp_e, fn_e = _rates(ev0, ev1, np.array([tau["high"], tau["low"]]))
    high_e, low_e, fpr_hi, fnr_hi = _bounds(fp_e, fn_e, n_ev, delta, alpha)
    bounds = {"high": float(high_e[0]), "low": float(low_e[1])}
    best = max(bounds, key=lambda key: bounds[key])
    i = 0 if best == "high" else 1
    return AuditResult(
        epsilon_lb=max(bounds[best], 0.0),
        direction=best,
        threshold=tau[best],
        fpr=float(fp_e[i]) / n_ev,
        fnr=float(fn_e[i]) / n_ev,
        fpr_upper=float(fpr_hi[i]),
        fnr_upper=float(fnr_hi[i]),
        n_per_neighbour=int(t0.shape[0]),
        n_eval=int(n_ev),
        delta=float(delta),
        confidence=float(confidence),
        bounds=bounds,
    )


def coordinates(x: Any, symmetric: bool) -> FloatArray:
    """Coordinates of a statistic in an orthonormal basis of its space.

    Parameters
    ----------
    x : array_like
        A released statistic (or a difference of two).
    symmetric : bool
        True for symmetric matrices released with ``sigma sym(G)`` noise: the
        basis ``{E_ii} u {(E_ij + E_ji) / sqrt(2)}_{i<j}`` (spec power-pca 3.2),
        coordinates ``x_ii`` and ``sqrt(2) x_ij``, in which that noise is i.i.d.
        N(0, sigma^2) and Frobenius inner products are Euclidean.

    Returns
    -------
    ndarray of shape (size,)
        ``x.ravel()``, or ``m (m + 1) / 2`` coordinates for an (m, m) symmetric
        ``x`` (diagonal first).

    Examples
    --------
    >>> coordinates(np.array([[1.0, 2.0], [2.0, 3.0]]), True).round(4)
    array([1.    , 3.    , 2.8284])
    """
    a = np.asarray(x, dtype=np.float64)
    if not symmetric:
        return a.ravel()
    iu = np.triu_indices(a.shape[0], k=1)
    return np.concatenate([np.diag(a), math.sqrt(2.0) * a[iu]])


@dataclass(frozen=True, kw_only=True, slots=True)
class GaussianBlock:
    """One released statistic ``f(D) + noise`` as the auditor sees it.

    Attributes
    ----------
    name : str
        Label of the release (``"Y"``, ``"Z"``, ``"M"``, ...).
    difference : ndarray of shape (size,)
        ``coordinates(f(D') - f(D))``, from the mechanism's own code.
    sigma : float
        The noise std the mechanism *declares* (from its calibration); the
        projection ``T_i`` is normalised by it, so that it is N(0, 1) under
        ``D`` when the noise is as declared.
    noise_std : float or ndarray of shape (size,)
        Std per coordinate of each noise share actually added; equals ``sigma``
        for a correct mechanism.
    shares : int
        Independent noise shares summed into each coordinate (1 for a correct
        mechanism; ``P`` for noise added to each of ``P`` partial sums).
    symmetric : bool
        Whether the statistic is a symmetric matrix (see :func:`coordinates`).
    """

    name: str
    difference: FloatArray
    sigma: float
    noise_std: float | FloatArray
    shares: int = 1
    symmetric: bool = False

    @classmethod
    def from_pair(
        cls,
        name: str,
        exact: Any,
        exact_neighbour: Any,
        sigma: float,
        *,
        symmetric: bool = False,
        noise_std: float | FloatArray | None = None,
        shares: int = 1,
    ) -> GaussianBlock:
        """Block from the exact statistics ``f(D)`` and ``f(D')`` of one release."""
        diff = np.asarray(exact_neighbour, dtype=np.float64) - np.asarray(
            exact, dtype=np.float64
        )
        return cls(
            name=name,
            difference=coordinates(diff, symmetric),
            sigma=float(sigma),
            noise_std=float(sigma) if noise_std is None else noise_std,
            shares=int(shares),
            symmetric=symmetric,
        )


def declared_mu(blocks: Sequence[GaussianBlock]) -> float:
    """``sqrt(sum_i ||Delta_i||^2 / sigma_i^2)``: the pair's mu under the declared noise."""
    return math.sqrt(
        math.fsum(float(b.difference @ b.difference) / b.sigma**2 for b in blocks)
    )


def _shift_and_spread(b: GaussianBlock) -> tuple[float, float]:
    """Mean of ``T_i`` under ``D'`` and the std of one noise share's part of it."""
    norm = float(np.linalg.norm(b.difference))
    if norm == 0.0:
        raise ValueError(f"block {b.name!r}: the neighbours give identical statistics.")
    std = np.broadcast_to(np.asarray(b.noise_std, dtype=np.float64), b.difference.shape)
    # <N, Delta> ~ N(0, sum_c std_c^2 Delta_c^2) for independent coordinates
    spread = math.sqrt(float(np.sum(std**2 * b.difference**2))) / (b.sigma * norm)
    return norm / b.sigma, spread


def statistic(
    blocks: Sequence[GaussianBlock],
    release: Mapping[str, Any],
    reference: Mapping[str, Any],
) -> FloatArray:
    """Per-block likelihood-ratio projections ``T_i`` of one real release.

    Parameters
    ----------
    blocks : sequence of GaussianBlock
    release : mapping name -> ndarray
        The noisy released statistics of one run.
    reference : mapping name -> ndarray
        The exact statistics ``f(D)`` of the first neighbour.

    Returns
    -------
    ndarray of shape (len(blocks),)
        ``T_i = <y_i - f_i(D), Delta_i> / (sigma_i ||Delta_i||)``: N(0, 1) under
        ``D`` and N(||Delta_i|| / sigma_i, 1) under ``D'`` when the noise is as
        declared. :func:`epsilon_lower_bound` combines the columns.
    """
    out = np.empty(len(blocks))
    for i, b in enumerate(blocks):
        resid = np.asarray(release[b.name], dtype=np.float64) - np.asarray(
            reference[b.name], dtype=np.float64
        )
        norm = float(np.linalg.norm(b.difference))
        out[i] = float(coordinates(resid, b.symmetric) @ b.difference) / (
            b.sigma * norm
        )
    return out


def effective_mu(blocks: Sequence[GaussianBlock]) -> float:
    """mu of the pair under the noise actually added (the optimal test's separation).

    Blocks are independent, so the optimal statistic's squared separation is
    the sum over blocks of ``(shift / std)^2`` [DRS22, Cor. 3.3]; equals
    :func:`declared_mu` for a correct mechanism.
    """
    total = 0.0
    for b in blocks:
        shift, spread = _shift_and_spread(b)
        total += shift**2 / (b.shares * spread**2)
    return math.sqrt(total)


def draw_statistic(
    blocks: Sequence[GaussianBlock], n: int, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """``n`` draws of the projections ``T_i`` under each neighbour, without whole releases.

    Parameters
    ----------
    blocks : sequence of GaussianBlock
    n : int
        Samples per neighbour.
    rng : numpy.random.Generator
        Manages all randomness in this call.

    Returns
    -------
    (null, alt) : tuple of ndarray of shape (n, len(blocks))

    Notes
    -----
    ``T_i`` is a linear functional of the block's Gaussian noise, hence Gaussian
    with variance ``sum_c std_c^2 Delta_c^2 / (sigma ||Delta||)^2`` per share; every
    share of every block contributes its own independent normal draw, so a
    per-share scheme (noise on partial sums) is simulated share by share. This is
    exact for Gaussian noise with the stated per-coordinate stds; the audits that
    run a mechanism's own noise generator check that its projections follow this
    law.
    """
    out = []
    for neighbour in (0, 1):
        cols = []
        for b in blocks:
            shift, spread = _shift_and_spread(b)
            noise = spread * rng.standard_normal((n, b.shares)).sum(axis=1)
            cols.append(noise + (shift if neighbour else 0.0))
        out.append(np.column_stack(cols))
    return out[0], out[1]


def pair_epsilon(blocks: Sequence[GaussianBlock], delta: float) -> float:
    """Exact epsilon at ``delta`` of the mechanism restricted to this pair.

    The optimal test separates N(0, 1) from N(mu, 1) with ``mu`` =
    :func:`effective_mu`: the Gaussian mechanism with noise multiplier
    ``1 / mu``, whose exact epsilon [BW18, Thm 8] is what an audit with unlimited
    samples converges to.
    """
    return gaussian_epsilon(1.0 / effective_mu(blocks), delta)


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of audit rows (keys of the first row are the columns)."""
    if not rows:
        return ""
    cols = list(rows[0])

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 and v != 0.0 else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
