"""Public parameters and the calibrated plan of one private PCA run.

Problem. Validate the public parameters against the public shape before the
data is read, resolve ``method="auto"`` (:mod:`pipeline.algorithms.pca.auto`),
choose the route (Gram matrix on the client, or two passes per iteration) and
calibrate the noise (:func:`pipeline.accounting.pca.calibrate_pca`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pipeline._types import Shape2D
from pipeline._validation import check_int_in_range
from pipeline.accounting.pca import calibrate_pca
from pipeline.algorithms.pca.auto import choose_method
from pipeline.errors import InvalidParameterError
from pipeline.params import PcaParams

#: Eigenvalue floor of the non-private variant (only keeps B finite).
NONPRIVATE_GAMMA = 1e-12
#: Client memory allowed for the d x d Gram matrix before the two-pass route is used.
GRAM_CLIENT_BYTES = 4 * 2**30


# --------------------------------------------------------------------------
# Parameters and plan
# --------------------------------------------------------------------------


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
    # the fields on their own (choices, bounds, budget) are PcaParams' checks
    if params.method == "auto":
        params, auto = _resolve_auto(params, (n, d))
        return dataclasses.replace(plan_pca(params, shape), auto=auto)
    method, route = params.method, params.route
    if route == "auto":
        route = "gram" if 8 * d * d <= GRAM_CLIENT_BYTES else "two-pass"
    T = _iterations(method, params.iterations)
    passes = 1 + (T if route == "gram" else 2 * T)
    if not params.private:
        R = math.inf if params.clip_radius is None else float(params.clip_radius)
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
    # the accounting sees T and R of the power method only (none for Analyze Gauss)
    power = method == "power"
    cal = calibrate_pca(
        dataclasses.replace(
            params, rank=k, iterations=T if power else None,
            clip_radius=params.clip_radius if power else None,
        ),
        n_features=d,
    )  # fmt: skip
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
    choice = choose_method(params, shape)
    out = dataclasses.replace(
        params, method=choice.method, iterations=choice.iterations,
        clip_radius=choice.clip_radius,
    )  # fmt: skip
    return out, choice.to_dict()
