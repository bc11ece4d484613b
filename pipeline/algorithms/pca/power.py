"""Analyze Gauss and the private clipped power method: the row sources, the release
journals, the releases (keyed noise, journal, the one charge) and :func:`run_pca`.

The package docstring (:mod:`pipeline.algorithms.pca`) states the problem, the
method and the privacy of the releases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray, Shape2D
from pipeline.algorithms.base import ReleaseHooks, ReleaseJournal
from pipeline.algorithms.pca.kernels import (
    band_pass,
)
from pipeline.algorithms.pca.linalg import (
    Secret,
    eig_floor_inv_sqrt,
    qr_pos,
    sym,
    topk_eig,
)
from pipeline.algorithms.pca.plan import PcaPlan
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey

__all__ = [
    "ArrayRowSource",
    "MemoryJournal",
    "PcaRelease",
    "PcaResult",
    "ReleaseJournal",
    "Releases",
    "RowSource",
    "run_pca",
]


# --------------------------------------------------------------------------
# Sources and journals
# --------------------------------------------------------------------------
class RowSource(Protocol):
    """A matrix read in full-width row bands; each call is one pass over it.

    Every band is prepared by :func:`prep_rows` inside the task that reads it;
    the sums are reduced in a fixed order, so results are reproducible.
    """

    @property
    def shape(self) -> Shape2D: ...

    n_passes: int

    def gram(self) -> Secret:
        """``sum_i a_i a_i^T`` of the prepared rows, shape (d, d)."""

    def products(self, X: FloatArray) -> Secret:
        """``(A X)^T (A X)``, shape (k', k') for ``X`` of shape (d, k')."""

    def power_step(
        self, X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
    ) -> Secret:
        """``sum_i a_i Clip_R(a_i^T X_j B_j)`` for every trial j, side by side."""


class ArrayRowSource:
    """In-memory reference :class:`RowSource` (one band = the whole matrix;
    numpy, or scipy sparse read from its stored entries by :func:`band_pass`)."""

    def __init__(
        self, A: Any, *, row_norm_bound: float = 1.0, clip: bool = True
    ) -> None:
        self._A = A if sp.issparse(A) else np.asarray(A)
        self.row_norm_bound = float(row_norm_bound)
        self.clip = clip
        self.n_passes = 0

    @property
    def shape(self) -> Shape2D:
        return int(self._A.shape[0]), int(self._A.shape[1])

    def _pass(self, kind: str, payload: Any) -> Secret:
        self.n_passes += 1
        return Secret(band_pass(self._A, kind, payload, self.row_norm_bound, self.clip))

    def gram(self) -> Secret:
        return self._pass("gram", None)

    def products(self, X: FloatArray) -> Secret:
        return self._pass("products", X)

    def power_step(
        self, X: FloatArray, trials: Sequence[tuple[FloatArray, float]]
    ) -> Secret:
        return self._pass("update", (X, list(trials)))


class MemoryJournal:
    """A :class:`~pipeline.algorithms.base.ReleaseJournal` of noisy releases
    held in memory (no crash recovery): a label is drawn and charged once, ever
    (spec 4.9)."""

    def __init__(self) -> None:
        self.values: dict[str, FloatArray] = {}

    def load(self, label: str) -> FloatArray | None:
        v = self.values.get(label)
        return None if v is None else v.copy()

    def record(self, label: str, value: FloatArray) -> None:
        self.values[label] = np.array(value, copy=True)


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PcaResult:
    """Output of :func:`run_pca` (all of it released or derived from releases).

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal estimate of the top-k right singular subspace.
    eigenvalues : ndarray of shape (min(k + 1, d),)
        Top eigenvalues of the released ``M`` (noisy estimates of the top
        eigenvalues of ``A^T A`` of the clipped rows).
    n_passes : int
        Reads of A made by this run (resumed releases need none).
    releases : tuple of str
        Labels of the releases, in order.
    resumed : tuple of str
        Labels taken from the journal instead of being drawn.
    history : tuple of ndarray
        ``X`` after each iteration (``X0`` first); post-processing only.
    """

    components: FloatArray
    eigenvalues: FloatArray
    n_passes: int
    releases: tuple[str, ...]
    resumed: tuple[str, ...]
    history: tuple[FloatArray, ...] = field(repr=False, default=())


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaRelease:
    """A published private PCA.

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal columns spanning the private estimate of the top-k
        principal subspace (uncentred).
    eigenvalues : ndarray of shape (k + 1,)
        Top eigenvalues of the released noisy Gram matrix ``M`` (post-processing
        of a release; noisy estimates of the eigenvalues of ``A^T A``).
    report : dict
        Privacy report and run metadata.
    """

    components: FloatArray
    eigenvalues: FloatArray
    report: dict[str, Any] = field(default_factory=dict)


def _noise(
    key: NoiseKey | None, label: str, shape: tuple[int, int], symmetric: bool
) -> FloatArray:
    """Unit-scale noise of one release from its own keyed stream (zero when key is None)."""
    if key is None:
        return np.zeros(shape)
    G = GaussianNoise(
        key=key.derive("pca", label), sigma=1.0, length=shape[0], dim=shape[1]
    ).dense()
    return sym(G) if symmetric else G


class Releases:
    """The releases of one run: journal lookups, the one charge, keyed noise, the Gram.

    Every data-derived value leaves through :meth:`release`: a label already in
    the journal is reused (no pass, no draw, no charge); otherwise the exact
    value is computed, the charge hook runs once before the first draw, the
    keyed noise is added and the result is journaled before it is used.
    """

    def __init__(self, source: RowSource, hooks: ReleaseHooks) -> None:
        self.source = source
        self.hooks = hooks
        self.noise_key = hooks.noise_key
        self.journal: ReleaseJournal = (
            hooks.journal if hooks.journal is not None else MemoryJournal()
        )
        self.passes0 = source.n_passes
        self.labels: list[str] = []
        self.resumed: list[str] = []
        self.charged = False
        self._gram: Secret | None = None

    def say(self, msg: str) -> None:
        self.hooks.say(msg)

    @property
    def n_passes(self) -> int:
        return self.source.n_passes - self.passes0

    def gram(self) -> Secret:
        """``A^T A`` of the clipped rows, symmetrised; one pass, at most once."""
        if self._gram is None:
            self.say("Gram pass: A^T A of the clipped rows")
            self._gram = Secret(sym(self.source.gram().value))
        return self._gram

    def release(
        self,
        label: str,
        exact: Callable[[], Secret],
        sigma: float,
        shape: tuple[int, int],
        symmetric: bool,
    ) -> FloatArray:
        self.labels.append(label)
        old: FloatArray | None = self.journal.load(label)
        if old is not None:
            self.resumed.append(label)
            return old
        value = exact().value
        if not self.charged and self.hooks.charge is not None:
            self.hooks.charge()
        self.charged = True
        noisy = value + sigma * _noise(self.noise_key, label, shape, symmetric)
        self.journal.record(label, noisy)
        return noisy


def run_pca(source: RowSource, plan: PcaPlan, hooks: ReleaseHooks) -> PcaResult:
    """Run the planned PCA over ``source``.

    Parameters
    ----------
    source : RowSource
    plan : PcaPlan
        From :func:`plan_pca`.
    hooks : ReleaseHooks
        ``noise_key``: the release's secret key; None only for a non-private
        plan. ``journal``: releases already recorded there are reused (never
        redrawn, their passes skipped); new ones are recorded before use (None
        keeps them in memory). ``charge``: called once, before the first new
        noise draw. ``progress``: public step names. ``sketch_seed`` is not
        used (no sketch operator).

    Returns
    -------
    PcaResult

    Notes
    -----
    Privacy. Each release (``M``, ``H_t``, ``Z_t``) gets its keyed noise once,
    on the reduced statistic, after the charge (module docstring of
    :mod:`pipeline.algorithms.pca`).
    """
    if (plan.calibration is None) != (hooks.noise_key is None):
        raise InvalidParameterError(
            "a private plan needs a noise key and a non-private plan must not have one."
        )
    d = plan.shape[1]
    k = plan.params.rank
    rel = Releases(source, hooks)
    release, exact_gram, say = rel.release, rel.gram, rel.say

    M = release("M", exact_gram, plan.noise_init, (d, d), True)
    X, lam = topk_eig(M, k)
    history = [X]
    for t in range(plan.iterations):
        say(f"power iteration {t + 1}/{plan.iterations}")
        Xc = X

        def h_exact(Xc: FloatArray = Xc) -> Secret:
            if plan.route == "gram":
                return Secret(sym(Xc.T @ exact_gram().value @ Xc))
            return Secret(sym(source.products(Xc).value))

        H = release(f"H{t}", h_exact, plan.noise_H, (k, k), True)
        B = eig_floor_inv_sqrt(H, plan.gamma)

        def z_exact(Xc: FloatArray = Xc, B: FloatArray = B) -> Secret:
            return source.power_step(Xc, [(B, plan.clip_radius)])

        Z = release(
            f"Z{t}",
            z_exact,
            plan.noise_Z * plan.clip_radius if plan.noise_Z else 0.0,
            (d, k),
            False,
        )
        X = qr_pos(Z)
        history.append(X)
    return PcaResult(
        components=X,
        eigenvalues=lam,
        n_passes=rel.n_passes,
        releases=tuple(rel.labels),
        resumed=tuple(rel.resumed),
        history=tuple(history),
    )
