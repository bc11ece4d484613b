"""A centred private PCA: the DP mean, then the PCA of the rows centred with it.

Problem. Centring with the exact mean would not be private (spec power-pca 1.5).
``DPPCA(centre=True)`` releases the mean of the clipped rows with the Gaussian
mechanism, centres the rows with that *released* mean, re-clips them and runs
the PCA on them; the two releases are composed exactly as Gaussian mechanisms
(mu-GDP) so that together they satisfy the requested ``(epsilon, delta)``, and
they are one release of :mod:`pipeline.jobs.engine` (one id, one charge, one
journal). This module holds that job; the estimator only hands off to
:func:`centred_pca` (spec power-pca 7, D8).

References
----------
.. [DRS22] Dong, Roth, Su. Gaussian differential privacy. JRSS-B 84(1), 2022,
   arXiv:1905.02383 (Cor. 3.3: composition of Gaussian mechanisms).
.. [BW18] Balle, Wang. Improving the Gaussian mechanism for differential
   privacy. ICML 2018, arXiv:1805.06530 (Thm 8).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline._types import FloatArray
from pipeline._validation import check_float_in_interval, check_privacy_pair
from pipeline.accounting.calibration import ReleaseCalibration, SketchNoise
from pipeline.accounting.contract import Accountant, PrivacyContract
from pipeline.accounting.gaussian import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
)
from pipeline.algorithms.base import ReleaseHooks
from pipeline.algorithms.pca import Secret, plan_pca, prep_rows
from pipeline.errors import InvalidParameterError, PrivacyConfigError
from pipeline.io.objectstore import redact
from pipeline.jobs.engine import InputRef, ReleaseJob, ReleaseSpec, run_release
from pipeline.jobs.hooks import release_hooks
from pipeline.jobs.pca import (
    PCA_BAND_BYTES,
    JobJournal,
    PcaJob,
    pca_release_spec,
    relation_text,
)
from pipeline.jobs.reports import CentredPcaReport, PcaPrivacy, PcaReport
from pipeline.mechanisms.noise import GaussianNoise, NoiseKey
from pipeline.params import (
    Neighboring,
    PcaParams,
    PrivacyUnit,
    ReleaseOptions,
    Runtime,
)

__all__ = ["MEAN_SENSITIVITY", "centred_pca", "release_mean", "split_mean_budget"]

#: L2 sensitivity of the sum of rows of norm <= 1 under replacement of one row
#: (spec power-pca 7, D8: ``||a_i - a'_i|| <= 2``); 1 under add/remove.
MEAN_SENSITIVITY = 2.0


def _gaussian_release_calibration(
    name: str,
    shape: tuple[int, int],
    *,
    sensitivity: float,
    sigma: float,
    epsilon: float,
    delta: float,
) -> ReleaseCalibration:
    """One plain Gaussian release in the ledger's terms (no sketch, ``delta_JL = 0``)."""
    return ReleaseCalibration(
        epsilon=epsilon,
        delta=delta,
        delta_mechanism=delta,
        delta_jl=0.0,
        n_sketch_matrices=0,
        beta=0.0,
        frobenius_bound=sensitivity,
        noise_multiplier=sigma / sensitivity,
        tree_levels=1,
        sketches=(
            SketchNoise(
                name=name,
                shape=shape,
                sensitivity=sensitivity,
                jl_factor=1.0,
                weight=1.0,
                sigma=sigma,
            ),
        ),
    )


def split_mean_budget(
    epsilon: float, delta: float, mean_fraction: float
) -> tuple[float, float]:
    """Split ``(epsilon, delta)`` between a DP mean and a PCA, in mu-GDP.

    Parameters
    ----------
    epsilon, delta : float
        Budget of the two releases together.
    mean_fraction : float
        Share of ``mu^2`` given to the mean, in (0, 1).

    Returns
    -------
    mu_total : float
        ``1 / s(epsilon, delta)``: the largest ``mu`` such that a ``mu``-GDP
        mechanism is ``(epsilon, delta)``-DP [BW18, Thm 8].
    epsilon_pca : float
        The epsilon at ``delta`` of a ``sqrt(1 - mean_fraction) mu_total``-GDP
        mechanism: the budget to calibrate the PCA with.

    Examples
    --------
    >>> mu, eps_pca = split_mean_budget(1.0, 1e-6, 0.1)
    >>> 0 < eps_pca < 1.0
    True
    """
    eps, dlt = check_privacy_pair(epsilon, delta)
    f = check_float_in_interval(mean_fraction, "mean_fraction", 0.0, 1.0)
    mu_total = 1.0 / gaussian_noise_multiplier(eps, dlt)
    # [DRS22, Cor. 3.3]: mu^2 of composed Gaussians add, so shares split mu^2
    mu_pca = math.sqrt(1.0 - f) * mu_total
    return mu_total, gaussian_epsilon(1.0 / mu_pca, dlt)


def _mean_mu(
    mu_total: float, mu_pca: float, mean_fraction: float, epsilon: float, delta: float
) -> float:
    """The mean's ``mu``: its share, lowered until the composition fits exactly.

    Returns ``mu_m <= sqrt(mean_fraction) mu_total`` with
    ``gaussian_delta(1 / sqrt(mu_m^2 + mu_pca^2), epsilon) <= delta``: the PCA's
    ``mu`` comes from its own calibration (rounded up there, and far below its
    share under ``accounting="paper"``), so the check is done on the actual
    values rather than assumed.

    Raises
    ------
    PrivacyConfigError
        If the PCA alone already uses the whole budget (a calibration bug).
    """
    mu_m = math.sqrt(mean_fraction) * mu_total

    def fits(m: float) -> bool:
        return gaussian_delta(1.0 / math.hypot(m, mu_pca), epsilon) <= delta

    step = 1e-15
    while mu_m > 0.0 and not fits(mu_m):
        # the shortfall is rounding in the calibrations: shrink by growing steps
        mu_m *= 1.0 - step
        step *= 2.0
        if step > 0.5:
            mu_m = 0.0
    if mu_m <= 0.0:
        raise PrivacyConfigError(
            "the PCA's calibration leaves no budget for the DP mean "
            f"(mu_pca={mu_pca!r}, mu_total={mu_total!r})."
        )
    return mu_m


def _block_centre(
    block: Any, mean: FloatArray, row_norm_bound: float, clip: bool
) -> FloatArray:
    """Prepared rows minus the released mean (in the scaled units of ``prep_rows``)."""
    return prep_rows(block, row_norm_bound, clip=clip) - mean


def _row_total(array: Any, client: Any, row_norm_bound: float, clip: bool) -> Secret:
    """``sum_i prep(a_i)``, the exact sum of the prepared rows, shape (d,)."""
    if client is None:
        return Secret(prep_rows(array, row_norm_bound, clip=clip).sum(axis=0))
    rows = array.map_blocks(prep_rows, row_norm_bound, clip=clip, dtype=np.float64)
    total = client.compute(rows.sum(axis=0), sync=True)
    return Secret(np.asarray(total, dtype=np.float64))


def release_mean(
    total: Secret, n_rows: int, sigma: float, noise_key: NoiseKey | None
) -> FloatArray:
    """DP mean of the prepared rows: ``(sum_i a_i + N(0, sigma^2 I_d)) / n``.

    Parameters
    ----------
    total : Secret
        ``sum_i a_i`` of rows clipped to norm 1 (L2 sensitivity 2 under
        replacement of one row).
    n_rows : int
        The public ``n``.
    sigma : float
        Noise std from the calibration (``2 / mu_mean``).
    noise_key : NoiseKey or None
        The release's key (its ``"pca-dp-mean"`` stream); None only for a
        non-private baseline (no noise).

    Returns
    -------
    ndarray of shape (d,)
        Released; centring with it is a per-row map that is the same for
        neighbouring datasets (spec power-pca 7, D8).
    """
    s = total.value
    if noise_key is None:
        return s / n_rows
    d = s.shape[0]
    noise = GaussianNoise(
        key=noise_key.derive("pca-dp-mean"), sigma=sigma, length=d, dim=1
    ).dense()[:, 0]
    return (s + noise) / n_rows


def centred_pca(
    X: Any,
    params: PcaParams,
    options: ReleaseOptions,
    runtime: Runtime,
    *,
    mean_fraction: float,
) -> tuple[Any, FloatArray, dict[str, Any]]:
    """DP mean, centre, re-clip, PCA (spec power-pca D8): one release.

    Parameters
    ----------
    X : numpy array, dask array or Zarr path (validated by the caller)
    params : PcaParams
        The fit's parameters (a fixed run: no selection); ``rank`` is ``k``,
        ``row_norm_bound`` the public ``C``, ``epsilon`` and ``delta`` the
        budget of the two releases together.
    options : ReleaseOptions
        The ledger, budget, dataset and test-only noise seed (nothing is
        published).
    runtime : Runtime
        The scheduler.
    mean_fraction : float
        Share of ``mu^2`` spent on the mean, in (0, 1).

    Returns
    -------
    release, mean, report
        The PCA release, the released mean in the units of ``X``, and the
        report extended by the mean release and the composition.

    Notes
    -----
    Privacy. The mean's L2 sensitivity is 1 (add/remove) or 2 (replace); the
    PCA of the centred rows is calibrated with its replacement sensitivities
    (centring turns a removed zero row into ``-mean``); together
    ``sqrt(mu_m^2 + mu_pca^2)``-GDP, charged once [DRS22, Cor. 3.3].
    """
    from pipeline.io.inputs import open_input  # heavy: zarr, dask

    # a sparse input is refused below from metadata: its indices need no check
    array, info = open_input(
        X, unit=None, band_bytes=PCA_BAND_BYTES, check_indices=False
    )
    if sp.issparse(array) or sp.issparse(getattr(array, "_meta", None)):
        # metadata only: refused before any data is read or charged
        raise InvalidParameterError(
            "centre=True takes a dense input: the centred rows of a sparse matrix "
            "are dense; fit with centre=False (the uncentred PCA keeps it sparse)."
        )
    shape = (int(info.shape[0]), int(info.shape[1]))
    extra: dict[str, Any] = {
        "path": None if info.path is None else redact(info.path),
        "n": shape[0],
        "plan": None,
    }
    if not isinstance(array, np.ndarray) and array.numblocks[1] > 1:
        array = array.rechunk({1: -1})  # a row's norm needs all its columns
    C, f = float(params.row_norm_bound), float(mean_fraction)
    if not params.private:
        rel, mean, extra = _fit_centred_exactly(
            array, C, params, (options, runtime), extra
        )
        return rel, mean, centring_report(dict(rel.report), extra)
    # public values only: refused by the job (bad split, over budget) before any read
    plan = extra["plan"] = centred_plan(params, shape, f)
    contract = PrivacyContract(
        unit=PrivacyUnit.ROW, neighboring=Neighboring(params.neighboring), clip_norm=C,
        epsilon=plan["epsilon"], delta=plan["delta"], accountant=Accountant.GDP,
        shape=shape, secret_noise=options.insecure_noise_seed is None,
    )  # fmt: skip
    parameters = dataclasses.asdict(plan["pca_plan"].params)
    spec = ReleaseSpec(
        kind="pca-centred", contract=contract,
        calibration=plan["joint_calibration"],
        parameters={**parameters, "mean_fraction": f, "row_norm_bound": C},
        input=InputRef.of(info, array), ledger=options.ledger, budget=options.budget,
        insecure_noise_seed=options.insecure_noise_seed, dataset=options.dataset,
    )  # fmt: skip
    job = _CentredPca(array=array, info=info, plan=plan, row_norm_bound=C,
                      mean_fraction=f)  # fmt: skip
    rel = run_release(spec, job, runtime)
    extra["mean_release_id"] = rel.report["release_id"]
    assert job.mean is not None
    return rel, job.mean * C, centring_report(dict(rel.report), extra)


def _fit_centred_exactly(
    array: Any,
    C: float,
    params: PcaParams,
    run: tuple[ReleaseOptions, Runtime],
    extra: dict[str, Any],
) -> tuple[Any, FloatArray, dict[str, Any]]:
    """The non-private baseline: the exact mean of the raw rows."""
    n, (options, runtime) = extra["n"], run
    if isinstance(array, np.ndarray):
        mean = _row_total(array, None, C, clip=False).value / n
        centred = _centred_rows(array, mean, C, clip=False)
        return _pca(centred, params, options, runtime), mean, extra
    from pipeline.execution import cluster_client  # heavy: distributed, dask

    with cluster_client(runtime.scheduler) as (client, cinfo):
        if cinfo.kind == "local":
            # the embedded cluster is not the default client: point pca at it
            runtime = dataclasses.replace(runtime, scheduler=cinfo.address)
        mean = _row_total(array, client, C, clip=False).value / n
        centred = _centred_rows(array, mean, C, clip=False)
        return _pca(centred, params, options, runtime), mean, extra


def _pca(
    source: Any, params: PcaParams, options: ReleaseOptions, runtime: Runtime
) -> Any:
    """A fixed PCA release of ``source`` through the PCA job."""
    spec, job = pca_release_spec(params, source, None, options)
    return run_release(spec, job, runtime)


def centred_plan(params: PcaParams, shape: tuple[int, int], f: float) -> dict[str, Any]:
    """Budget split, the PCA's calibration, the ledger -- public values only."""
    eps, dlt = check_privacy_pair(params.epsilon, params.delta)
    mu_total, eps_pca = split_mean_budget(eps, dlt, f)
    pca_params = dataclasses.replace(
        params,
        epsilon=eps_pca,
        # centred with the released mean, a zero row becomes -mean: the PCA
        # of the centred rows sees one row *replaced*, whatever the relation
        neighboring="replace",
        row_norm_bound=1.0,
    )
    pca_plan = plan_pca(pca_params, shape)
    mu_pca = float(pca_plan.calibration.mu)
    mu_m = _mean_mu(mu_total, mu_pca, f, eps, dlt)
    s_mean = MEAN_SENSITIVITY if params.neighboring == "replace" else 1.0
    sigma_m = s_mean / mu_m
    mu_joint = math.hypot(mu_m, mu_pca)
    mean_cal = _gaussian_release_calibration(
        "dp-mean",
        (1, shape[1]),
        sensitivity=s_mean,
        sigma=sigma_m,
        epsilon=gaussian_epsilon(1.0 / mu_m, dlt),
        delta=dlt,
    )
    # the two releases as one unit-sensitivity Gaussian, for the ledger check
    joint_cal = _gaussian_release_calibration(
        "dp-mean+pca", (1, 1), sensitivity=1.0, sigma=1.0 / mu_joint,
        epsilon=eps, delta=dlt,
    )  # fmt: skip
    return {
        "epsilon": eps,
        "delta": dlt,
        "epsilon_pca": eps_pca,
        "mu_pca": mu_pca,
        "mu_mean": mu_m,
        "mu_joint": mu_joint,
        "sigma_mean": sigma_m,
        "sensitivity_mean": s_mean,
        "pca_plan": pca_plan,
        "mean_calibration": mean_cal,
        "joint_calibration": joint_cal,
    }


def _centred_rows(array: Any, mean: FloatArray, C: float, *, clip: bool) -> Any:
    if isinstance(array, np.ndarray):
        return _block_centre(array, mean, C, clip)
    return array.map_blocks(_block_centre, mean, C, clip, dtype=np.float64)


class _CentredPca:
    """A centred DPPCA fit as one release: the DP mean, then the PCA of the centred rows.

    One release id, one charge (the two Gaussian releases composed exactly,
    ``sqrt(mu_m^2 + mu_pca^2)``-GDP [DRS22, Cor. 3.3]), one journal: a retry
    of a failed fit reuses the journaled mean and PCA releases, the same noise,
    and is not charged again.

    Notes
    -----
    Privacy. The exact sum of the clipped rows stays a :class:`Secret`: only
    ``sum + N(0, sigma_m^2 I)`` is used afterwards (L2 sensitivity 1 under
    add/remove, 2 under replacement of a row of norm <= 1). The centring map uses that released
    mean only, so it is the same per-row map for neighbouring datasets and the
    PCA's guarantee holds for the centred, re-clipped rows.
    """

    def __init__(
        self,
        *,
        array: Any,
        info: Any,
        plan: dict[str, Any],
        row_norm_bound: float,
        mean_fraction: float,
    ) -> None:
        self.array, self.info, self.plan = array, info, plan
        self.C, self.mean_fraction = row_norm_bound, mean_fraction
        self.local = isinstance(array, np.ndarray)
        self.client: Any = None
        self.cluster: dict[str, Any] | None = None
        self.mean: FloatArray | None = None

    @contextlib.contextmanager
    def open_source(
        self, job: ReleaseJob, client: Any, cluster: dict[str, Any] | None
    ) -> Iterator[None]:
        self.client, self.cluster = client, cluster
        yield None

    def _released_mean(self, hooks: ReleaseHooks) -> FloatArray:
        assert hooks.journal is not None
        old = hooks.journal.load("dp-mean")
        if old is not None:
            # the one row of the (1, n_cols) record below
            journaled: FloatArray = old[0]
            return journaled
        C, n = self.C, int(self.info.shape[0])
        total = _row_total(self.array, self.client, C, clip=True)
        assert hooks.charge is not None
        hooks.charge()
        # spec power-pca D8: the released sum divided by the public n
        mean = release_mean(total, n, self.plan["sigma_mean"], hooks.noise_key)
        hooks.journal.record("dp-mean", mean[None, :])
        return mean

    def compute(self, job: ReleaseJob, _: None) -> Any:
        hooks = release_hooks(
            job, algorithm="pca-centred", journal=JobJournal(job),
            details={"mean_fraction": self.mean_fraction,
                     "sigma_mean": self.plan["sigma_mean"]},
        )  # fmt: skip
        self.mean = self._released_mean(hooks)
        centred = _centred_rows(self.array, self.mean, self.C, clip=True)
        pca_job = PcaJob(
            plan=self.plan["pca_plan"], array=centred, info=self.info, select=False
        )
        with pca_job.open_source(job, self.client, self.cluster) as src:
            return pca_job.compute(job, src)  # charged already: no second charge

    def publish(self, job: ReleaseJob, rel: Any, client: Any) -> Any:
        job.publish(None)
        return rel

    def read(self, out: str) -> Any:  # pragma: no cover - a fit publishes nothing
        raise AssertionError("a DPPCA fit has no output to read")


def centring_report(report: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The PCA's report extended by the mean release and the composed guarantee
    (a :class:`~pipeline.jobs.reports.CentredPcaReport`, serialised)."""
    pca = PcaReport.from_dict(report)
    # the PCA ran on centred rows derived from the input: name the input itself
    pca = dataclasses.replace(
        pca,
        parameters=dict(pca.parameters, centred=True),
        input=dict(pca.input, path=extra["path"]),
    )
    plan = extra["plan"]
    if plan is None:
        centring = {"mechanism": None, "note": "exact mean; NOT PRIVATE"}
        return CentredPcaReport(pca=pca, centring=centring).to_dict()
    return _private_centring(pca, plan, extra).to_dict()


def _private_centring(
    pca: PcaReport, plan: dict[str, Any], extra: dict[str, Any]
) -> CentredPcaReport:
    """A private centred PCA's report: the PCA part restated for the whole
    release (its relation is the contract's; its PCA part is calibrated for a
    replaced row, since centring turns a zero row into -mean)."""
    dlt = plan["delta"]
    private = pca.privacy
    assert isinstance(private, PcaPrivacy)
    whole = dataclasses.replace(
        private,
        neighboring=relation_text(pca.core.contract["neighboring"]),  # type: ignore[index]
        epsilon=plan["epsilon"],
        delta=dlt,
        realised_epsilon=gaussian_epsilon(1.0 / plan["mu_joint"], dlt),
        mechanism=(
            f"DP mean (Gaussian), then {private.mechanism}; the two composed "
            "exactly as Gaussian mechanisms (mu-GDP)"
        ),
    )
    return CentredPcaReport(
        pca=dataclasses.replace(pca, privacy=whole),
        pca_release={
            "neighboring": relation_text("replace"),
            "epsilon": plan["epsilon_pca"],
            "delta": dlt,
            "mu": plan["mu_pca"],
            "realised_epsilon": private.realised_epsilon,
        },
        centring={
            "mechanism": "Gaussian mean of the clipped rows, divided by the public "
            "n; rows centred with it and re-clipped to norm 1",
            "sensitivity": plan["sensitivity_mean"],
            "sigma": plan["sigma_mean"],
            "mu": plan["mu_mean"],
            "epsilon": plan["mean_calibration"].epsilon,
            "delta": dlt,
            "n": extra["n"],
            "ledger_release_id": extra["mean_release_id"],
        },
        mu_total=plan["mu_joint"],
    )
