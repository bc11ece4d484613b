"""The private selection run: Analyze Gauss and power-method trials, the best noisy score.

Problem. Given a selection calibration -- every candidate once
(:class:`pipeline.accounting.pca_selection.CandidateSelection`, the default) or
random stopping ([P, App. C]; :class:`pipeline.accounting.pca.SelectionCalibration`)
-- release ``M`` once, derive the public score gap from its eigenvalues, run the
trials in lockstep (trials with equal ``T`` share passes, each trial's block
clipped on its own), release each trial's noisy score and return the winner.
The trials' releases go through the same journaled, charged-once releases as
:func:`pipeline.algorithms.pca.power.run_pca`.

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline._types import FloatArray
from pipeline._validation import check_int_in_range
from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca.linalg import (
    Secret,
    eig_floor_inv_sqrt,
    qr_pos,
    released,
    sym,
    topk_eig,
)
from pipeline.algorithms.pca.power import Releases, RowSource
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import NoiseKey, secret_generator

# --------------------------------------------------------------------------
# Private selection of (R, T) [P, Algorithms 4 and 5; spec 2.4, 2.5, 4.6]
# --------------------------------------------------------------------------
#: Trials advanced together in one pass (memory: r x k x this many doubles per task).
MAX_CONCURRENT_TRIALS = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectionResult:
    """Output of :func:`run_selection` (the winner only; nothing else about trials).

    Attributes
    ----------
    components : ndarray of shape (d, k)
    eigenvalues : ndarray of shape (k + 1,)
        Top eigenvalues of the released ``M``.
    clip_radius : float or None
        The selected ``R`` (from the public grid; None when Analyze Gauss, a
        candidate of the exhaustive selection, is selected).
    iterations : int
        The selected ``T`` (0 for Analyze Gauss: when it is selected, or when
        the released eigenvalues show no gap above the noise, ``h <= 0``, and
        ``X0`` is returned).
    gap : float
        The public score gap ``h`` (from released values only).
    n_passes : int
        Reads of A (trusted-zone information: it reveals the number of trials).
    releases, resumed : tuple of str
        Journal labels (trusted zone, for the same reason).
    """

    components: FloatArray
    eigenvalues: FloatArray
    clip_radius: float | None
    iterations: int
    gap: float
    n_passes: int
    releases: tuple[str, ...]
    resumed: tuple[str, ...]


def score_setup(
    eigenvalues: Any, noise_init: float, k: int, d: int, beta: float
) -> tuple[float, float, float]:
    """Public ``(a, b, h)`` of the score function from the released eigenvalues.

    ``eps_w = noise_init (2 sqrt(d) + sqrt(2 log(8 / beta)))`` bounds the noise
    of ``M`` in spectral norm w.p. ``1 - beta/8`` (Lemma 5);
    ``a = lam_{k+1} + eps_w``, ``b = lam_k - eps_w``, ``h = b - a`` [P, Alg. 4].
    """
    lam = released(eigenvalues, "eigenvalues")
    eps_w = noise_init * (2.0 * math.sqrt(d) + math.sqrt(2.0 * math.log(8.0 / beta)))
    a = float(lam[k]) + eps_w
    b = float(lam[k - 1]) - eps_w
    return a, b, b - a


def score_basis(S: Secret, a: float, h: float) -> Secret:
    """``(W_+, D_+)`` with ``f_{a,b}(S) = W_+ diag(D_+) W_+^T`` (exact; a Secret).

    ``f(x) = min(1, max(0, (x - a) / h))`` by spectral calculus; only the
    eigenvectors with ``f > 0`` are kept (about k of them).
    """
    lam, W = np.linalg.eigh(S.value)
    f = np.clip((lam - a) / h, 0.0, 1.0)
    keep = f > 0.0
    return Secret(np.vstack([W[:, keep], f[keep][None, :]]))


def exact_score(X: FloatArray, basis: Secret) -> Secret:
    """``s(X) = ||(I - X X^T) f_{a,b}(S)||_2`` (exact; a Secret), in O(d r_F^2)."""
    packed = basis.value
    if packed.shape[1] == 0:
        return Secret(np.array(0.0))
    W, D = packed[:-1], packed[-1]
    R = (W - X @ (X.T @ W)) * D
    return Secret(np.array(np.linalg.norm(R, 2)))


def _draw_trials(key: NoiseKey | None, cal: Any) -> list[tuple[int, int]]:
    """Number of trials and each trial's grid point, before any data is read.

    ``N`` is geometric(theta) on {1, 2, ...} conditioned on ``N <= N_max`` (the
    cap is charged in the calibration, spec 3.5), drawn by inversion from the
    secret stream; grid points are uniform. All of it is data-independent.
    """
    if key is None:
        raise InvalidParameterError("private selection needs a noise key.")
    rng = secret_generator(key.derive("pca", "select"))
    theta, q = cal.theta, cal.truncation_q
    u = rng.random()
    n_trials = math.ceil(math.log1p(-u * (1.0 - q)) / math.log1p(-theta))
    n_trials = min(max(n_trials, 1), cal.max_trials)
    J, L = len(cal.radii), len(cal.iteration_grid)
    return [(int(rng.integers(J)), int(rng.integers(L))) for _ in range(n_trials)]


@dataclass(frozen=True, slots=True)
class _Trial:
    """One trial's public settings: requested and effective R, T, noises, floor."""

    radius: float | None
    r_eff: float
    T: int
    h_sigma: float
    z_sigma: float
    gamma: float


def _trials(key: NoiseKey | None, cal: Any) -> list[_Trial]:
    """The trials of a selection, fixed before any data is read.

    An exhaustive selection (a ``CandidateSelection``) runs each candidate
    once, in order; a random-stopping one (a ``SelectionCalibration``) draws
    ``N`` and the grid points from the secret stream (:func:`_draw_trials`).
    """
    if hasattr(cal, "candidates"):
        out = []
        for j, (R, T) in enumerate(cal.candidates):
            r = cal.radius_of(j)
            out.append(
                _Trial(R, r or 0.0, T, cal.h_noise(j),
                       cal.z_noise(j, r) if r else 0.0, cal.gamma_of(j) if T else 0.0)
            )  # fmt: skip
        return out
    out = []
    for j, l in _draw_trials(key, cal):
        R, T = float(cal.radii[j]), int(cal.iteration_grid[l])
        r = cal.effective_clip_radius(R, T)
        out.append(
            _Trial(R, r, T, cal.noise_iter(T), cal.noise_iter(T) * r, cal.gamma(T))
        )
    return out


def _lockstep_step(
    rel: Any,
    source: RowSource,
    trials: list[_Trial],
    Xs: dict[int, FloatArray],
    active: list[int],
    t: int,
    shape: tuple[int, int],
) -> None:
    """Step ``t`` of every active trial: release ``H``, one shared pass, release ``Z``.

    Each trial's ``H`` comes from the client's Gram matrix; one pass computes
    every active trial's clipped sum (each block clipped on its own), unless
    its ``Z`` is already journaled; ``Xs`` is updated in place.
    """
    d, k = shape
    exact_gram = rel.gram
    Bs = {}
    for i in active:
        Xi = Xs[i]
        H = rel.release(
            f"H{i}_{t}",
            lambda Xi=Xi: Secret(sym(Xi.T @ exact_gram().value @ Xi)),
            trials[i].h_sigma,
            (k, k),
            True,
        )
        Bs[i] = eig_floor_inv_sqrt(H, trials[i].gamma)
    todo = [i for i in active if rel.journal.load(f"Z{i}_{t}") is None]
    exact_Z: dict[int, FloatArray] = {}
    if todo:  # one pass for every active trial (each block clipped on its own)
        Xcat = np.hstack([Xs[i] for i in todo])
        Zcat = source.power_step(Xcat, [(Bs[i], trials[i].r_eff) for i in todo]).value
        for j, i in enumerate(todo):
            exact_Z[i] = Zcat[:, j * k : (j + 1) * k]
    for i in active:
        Z = rel.release(
            f"Z{i}_{t}",
            lambda i=i, ez=exact_Z: Secret(ez[i]),
            trials[i].z_sigma,
            (d, k),
            False,
        )
        Xs[i] = qr_pos(Z)


def run_selection(
    source: RowSource,
    cal: Any,
    hooks: ReleaseHooks,
    *,
    max_concurrent_trials: int = MAX_CONCURRENT_TRIALS,
) -> SelectionResult:
    """Private PCA with private selection of ``(R, T)`` over public grids.

    Parameters
    ----------
    source : RowSource
    cal : SelectionCalibration
        From :func:`pipeline.accounting.pca.calibrate_selection`.
    hooks : ReleaseHooks
        As in :func:`run_pca` (``noise_key`` required). The journal of a
        selection run is secret (it holds non-selected trials, whose
        publication would void the analysis), and so is its progress: a job
        gives it none (the steps would reveal the number of trials).
    max_concurrent_trials : int
        Trials advanced together in one pass. Trials are sorted by ``T`` and
        cut into batches of this size; a batch runs in lockstep (each trial
        leaves after its own ``T``), so passes = 1 + sum over batches of their
        largest ``T`` (1 + T_max when all trials fit one batch).

    Returns
    -------
    SelectionResult

    Notes
    -----
    Algorithm [P, App. C; spec 2.5, 4.6]: release ``M`` once (shared warm
    start); derive the public score gap ``h`` from its eigenvalues; if
    ``h <= 0`` return ``X0`` (post-processing only). Otherwise draw ``N`` and
    the trials' grid points, run every trial's power method in lockstep (per
    band, each trial block is clipped separately), release each trial's
    noisy score ``s(X) + score_noise(h) g`` and return the arg-min. The cost is
    the Papernot-Steinke random-stopping bound accounted in ``cal``.
    """
    noise_key = hooks.noise_key
    if noise_key is None:
        raise InvalidParameterError("private selection needs a noise key.")
    max_concurrent_trials = check_int_in_range(
        max_concurrent_trials, "max_concurrent_trials", 1
    )
    d = source.shape[1]
    k = cal.rank
    rel = Releases(source, hooks)
    release, exact_gram, say = rel.release, rel.gram, rel.say

    M = release("M", exact_gram, cal.noise_init, (d, d), True)
    X0, lam = topk_eig(M, k)
    a, _b, h = score_setup(lam, cal.noise_init, k, d, cal.beta)
    if not h > 0.0:
        say(
            "no eigengap above the noise between the k-th and (k+1)-th released "
            "eigenvalues: the candidates cannot be compared; releasing the "
            "Analyze Gauss estimate"
        )
        return SelectionResult(
            components=X0,
            eigenvalues=lam,
            clip_radius=None,
            iterations=0,
            gap=h,
            n_passes=rel.n_passes,
            releases=tuple(rel.labels),
            resumed=tuple(rel.resumed),
        )
    basis: list[Secret] = []

    def score_of(X: FloatArray) -> Callable[[], Secret]:
        def f() -> Secret:
            if not basis:
                basis.append(score_basis(exact_gram(), a, h))
            return Secret(np.atleast_2d(exact_score(X, basis[0]).value))

        return f

    trials = _trials(noise_key, cal)
    best = _run_trials(
        rel, source, cal, trials, X0, score_of, h, max_concurrent_trials, (d, k)
    )
    assert best is not None
    _, win, X = best
    return SelectionResult(
        components=X,
        eigenvalues=lam,
        clip_radius=trials[win].radius,
        iterations=trials[win].T,
        gap=h,
        n_passes=rel.n_passes,
        releases=tuple(rel.labels),
        resumed=tuple(rel.resumed),
    )


def _run_trials(
    rel: Any,
    source: RowSource,
    cal: Any,
    trials: Any,
    X0: FloatArray,
    score_of: Callable[[FloatArray], Callable[[], Secret]],
    h: float,
    max_concurrent_trials: int,
    dk: tuple[int, int],
) -> tuple[float, int, FloatArray] | None:
    """Every trial's power method in lockstep batches, then its noisy score.

    Returns ``(score, index, X)`` of the lowest noisy score (post-processing).
    """
    # Lockstep (spec 4.6): a batch's trials start together and each leaves after
    # its own T, so a batch costs max T passes; sorting by T keeps equal T together.
    # A trial with T = 0 is Analyze Gauss: X0, scored like the others.
    T_of = {i: trials[i].T for i in range(len(trials))}
    order = sorted(range(len(trials)), key=lambda i: (T_of[i], i))
    batches = [
        order[j : j + max_concurrent_trials]
        for j in range(0, len(order), max_concurrent_trials)
    ]
    best: tuple[float, int, FloatArray] | None = None
    for bno, batch in enumerate(batches):
        Xs = {i: X0 for i in batch}
        T_max = max(T_of[i] for i in batch)
        for t in range(T_max):
            rel.say(f"selection batch {bno + 1}/{len(batches)}: step {t + 1}/{T_max}")
            active = [i for i in batch if T_of[i] > t]
            _lockstep_step(rel, source, trials, Xs, active, t, dk)
        for i in batch:
            noisy = rel.release(
                f"s{i}", score_of(Xs[i]), cal.score_noise(h), (1, 1), False
            )
            s = float(noisy[0, 0])
            # post-processing of the noisy scores: a power trial must beat Analyze
            # Gauss by `margin` standard deviations of a difference of two scores
            s += (
                getattr(cal, "margin", 0.0)
                * math.sqrt(2.0)
                * cal.score_noise(h)
                * (T_of[i] > 0)
            )
            if best is None or (s, i) < (best[0], best[1]):
                best = (s, i, Xs[i])
    return best


def default_selection_grids(
    n_rows: int, rank: int
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Public default grids of the selection (spec 7, D6), from ``n`` and ``k`` only.

    Radii: powers of two from [P]'s ``R_min = sqrt(k / n)`` up to the first one
    ``>= 1`` (at most 11 values; whitened rows rarely exceed norm 1 once ``B``
    is floored). Iterations: 1, 2, 4, 8, 16.
    """
    r_min = math.sqrt(rank / n_rows)
    J = min(10, max(0, math.ceil(math.log2(1.0 / r_min))))
    return tuple(r_min * 2.0**j for j in range(J + 1)), (1, 2, 4, 8, 16)
