"""Public parameters and the calibrated plan of one private PCA run.

Problem. Validate the public parameters against the public shape before the
data is read, resolve ``method="auto"`` (:mod:`pipeline.algorithms.pca.auto`),
choose the route (Gram matrix on the client, or two passes per iteration) and
calibrate the noise (:func:`pipeline.accounting.pca.calibrate_pca`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline._types import Shape2D
from pipeline._validation import check_float_in_interval, check_int_in_range
from pipeline.accounting.pca import calibrate_pca
from pipeline.algorithms.pca.auto import choose_method
from pipeline.errors import InvalidParameterError, PrivacyConfigError

#: Eigenvalue floor of the non-private variant (only keeps B finite).
NONPRIVATE_GAMMA = 1e-12
#: Client memory allowed for the d x d Gram matrix before the two-pass route is used.
GRAM_CLIENT_BYTES = 4 * 2**30

METHODS = ("auto", "power", "analyze-gauss")
ROUTES = ("auto", "gram", "two-pass")


# --------------------------------------------------------------------------
# Parameters and plan
# --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PcaParams:
    """Public parameters of one private PCA (all fixed before the data is read).

    Attributes
    ----------
    rank : int
        ``k``, ``1 <= k <= d``.
    epsilon, delta : float or None
        Budget (None only when ``private`` is False).
    method : {"auto", "power", "analyze-gauss"}
        ``"auto"`` picks one of the two (and ``T``, ``R``) from public
        quantities (:mod:`pipeline.algorithms.pca.auto`).
    iterations : int or None
        ``T`` for the power method (required; never chosen from the data).
    clip_radius : float or None
        ``R`` for the power method (required when private).
    accounting : {"gdp", "paper"}
        Exact Gaussian (GDP) calibration, or the paper's literal constants.
    sensitivity : {"tight", "paper"}
        The exact sensitivities (default) or [P]'s (Gram and ``H``: 2 instead
        of sqrt(2) under replacement; the same under add/remove).
    neighboring : {"add-remove", "replace"}
        One row present or zero (default, as ``factorize``), or replaced.
    init_fraction, h_fraction : float
        Budget split: initialisation vs iterations, ``H`` vs ``Z`` (spec 3.4).
    beta : float
        Failure probability of the utility analysis (sets ``gamma`` only).
    gamma_scale : float
        Public multiplier of the eigenvalue floor ``gamma``.
    row_norm_bound : float
        Public ``C``: rows are divided by it, then clipped to norm 1.
    route : {"auto", "gram", "two-pass"}
    private : bool
        False: no clipping, no noise, ``gamma`` tiny, ``R`` infinite unless
        given -- the classical block power method, for comparison only.
    """

    rank: int
    epsilon: float | None = None
    delta: float | None = None
    method: str = "auto"
    iterations: int | None = None
    clip_radius: float | None = None
    accounting: str = "gdp"
    sensitivity: str = "tight"
    neighboring: str = "add-remove"
    init_fraction: float = 0.5
    h_fraction: float = 0.5
    beta: float = 0.1
    gamma_scale: float = 1.0
    row_norm_bound: float = 1.0
    route: str = "auto"
    private: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class PcaPlan:
    """Calibrated plan of a PCA run over an (n, d) matrix.

    ``calibration`` is None for the non-private variant. ``n_passes`` counts
    reads of A: 1 + T (Gram route) or 1 + 2T (two-pass route).
    """

    params: PcaParams
    shape: Shape2D
    route: str
    calibration: Any
    noise_init: float
    noise_H: float
    noise_Z: float
    gamma: float
    clip_radius: float
    n_passes: int
    auto: dict[str, Any] | None = None

    @property
    def iterations(self) -> int:
        return (
            0
            if self.params.method == "analyze-gauss"
            else int(self.params.iterations or 0)
        )


def _choice(value: Any, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidParameterError(
            f"{name} must be one of {', '.join(map(repr, allowed))}, got {name}={value!r}."
        )
    return str(value)


def _iterations(method: str, iterations: Any) -> int:
    """``T`` of a fixed run: required for the power method, none for Analyze Gauss."""
    if method == "power":
        if iterations is None:
            raise InvalidParameterError(
                "iterations must be given for method='power' (a public T, e.g. 3 to 10); "
                "it is never chosen from the data."
            )
        return check_int_in_range(iterations, "iterations", 1, 10_000)
    if iterations not in (None, 0):
        raise InvalidParameterError(
            f"iterations applies to method='power' only, got iterations={iterations!r} "
            "with method='analyze-gauss'."
        )
    return 0


def plan_pca(params: PcaParams, shape: Shape2D) -> PcaPlan:
    """Validate ``params`` against the public ``shape`` and calibrate the noise.

    Raises
    ------
    InvalidParameterError
        Bad rank, method, iterations, clip radius or fractions.
    PrivacyConfigError
        Bad budget, or a paper-mode precondition that does not hold.
    """
    n, d = int(shape[0]), int(shape[1])
    if d < 2:
        raise InvalidParameterError(
            f"PCA needs at least 2 columns, got shape ({n}, {d})."
        )
    # k = d is allowed: the components are then an orthonormal basis ordered
    # by the released eigenvalues (eigenvalues has d entries, not k + 1)
    k = check_int_in_range(params.rank, "rank", 1, d, what="[1, n_features]")
    if _choice(params.method, "method", METHODS) == "auto":
        params, auto = _resolve_auto(params, (n, d))
        return dataclasses.replace(plan_pca(params, shape), auto=auto)
    method = params.method
    route = _choice(params.route, "route", ROUTES)
    _choice(params.neighboring, "neighboring", ("add-remove", "replace"))
    check_float_in_interval(params.row_norm_bound, "row_norm_bound", 0.0, math.inf)
    if route == "auto":
        route = "gram" if 8 * d * d <= GRAM_CLIENT_BYTES else "two-pass"
    T = _iterations(method, params.iterations)
    passes = 1 + (T if route == "gram" else 2 * T)
    if not params.private and (params.epsilon is not None or params.delta is not None):
        raise PrivacyConfigError(
            "a non-private run takes no epsilon or delta; drop them or drop non-private "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    if not params.private:
        R = (
            math.inf
            if params.clip_radius is None
            else check_float_in_interval(
                params.clip_radius, "clip_radius", 0.0, math.inf
            )
        )
        return PcaPlan(
            params=params,
            shape=(n, d),
            route=route,
            calibration=None,
            noise_init=0.0,
            noise_H=0.0,
            noise_Z=0.0,
            gamma=NONPRIVATE_GAMMA,
            clip_radius=R,
            n_passes=passes,
        )
    if params.epsilon is None or params.delta is None:
        raise InvalidParameterError(
            "epsilon and delta are required for a private PCA "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    cal = calibrate_pca(
        epsilon=params.epsilon,
        delta=params.delta,
        rank=k,
        n_features=d,
        method=method,
        iterations=T if method == "power" else None,
        clip_radius=params.clip_radius if method == "power" else None,
        accounting=params.accounting,
        sensitivity=params.sensitivity,
        neighboring=params.neighboring,
        init_fraction=params.init_fraction,
        h_fraction=params.h_fraction,
        beta=params.beta,
        gamma_scale=params.gamma_scale,
    )
    return PcaPlan(
        params=params,
        shape=(n, d),
        route=route,
        calibration=cal,
        noise_init=cal.noise_init,
        noise_H=cal.noise_H or 0.0,
        noise_Z=cal.noise_Z or 0.0,
        gamma=cal.gamma if cal.gamma is not None else NONPRIVATE_GAMMA,
        clip_radius=cal.clip_radius if cal.clip_radius is not None else math.inf,
        n_passes=passes,
    )


def _resolve_auto(
    params: PcaParams, shape: Shape2D
) -> tuple[PcaParams, dict[str, Any]]:
    """``method="auto"`` replaced by the rule's method, ``T`` and ``R``."""
    if not params.private:
        # the exact eigenvectors of A^T A, unless T is given for a power run
        method = "analyze-gauss" if params.iterations is None else "power"
        out = dataclasses.replace(params, method=method)
        return out, {"chosen": method, "rule": "non-private run"}
    if params.epsilon is None or params.delta is None:
        raise InvalidParameterError(
            "epsilon and delta are required for a private PCA "
            f"(got epsilon={params.epsilon!r}, delta={params.delta!r})."
        )
    choice = choose_method(params, shape)
    out = dataclasses.replace(
        params, method=choice.method, iterations=choice.iterations,
        clip_radius=choice.clip_radius,
    )  # fmt: skip
    return out, choice.to_dict()
