"""scikit-learn estimators DPPCA and DPLowRank.

sklearn's common checks (reproducible test-only configurations, and the real
private configuration with its expected failures), fidelity to the functional
API, the three input kinds, centring with a DP mean and its exact budget split,
parameters and their validation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import (
    check_methods_sample_order_invariance,
    check_methods_subset_invariance,
    parametrize_with_checks,
)

import pipeline
from pipeline import DPPCA, DPLowRank
from pipeline.accounting.gaussian import gaussian_delta
from pipeline.algorithms.pca import prep_rows
from pipeline.api import factorize, pca
from pipeline.errors import BudgetExceededError, InvalidParameterError

# ---------------------------------------------------------------------------
# sklearn's common checks
# ---------------------------------------------------------------------------
#: Checks that fail for a private run (fresh secret noise on every fit).
PRIVATE_RUN_FAILS = {
    "check_fit_idempotent": "two fits are two releases with independent secret "
    "noise (and a refit is charged again), so they differ by design",
}
#: Checks sklearn skips for non-deterministic estimators (tag set by a private run).
NON_DETERMINISTIC_SKIPS = {
    "check_pipeline_consistency": "compares two separate fits (fresh noise each)",
    "check_transformer_general": "compares fit_transform with a second fit",
    "check_transformer_data_not_an_array": "compares fits on two input types",
    "check_methods_sample_order_invariance": "holds (one fit, linear transform); "
    "run directly below",
    "check_methods_subset_invariance": "holds (one fit, linear transform); run "
    "directly below",
}

#: Test-only configurations: noise from a public seed, so fits are deterministic.
REPRODUCIBLE = [
    DPPCA(insecure_noise=True, random_state=0),  # the defaults: auto, k = d
    DPPCA(1, method="analyze-gauss", insecure_noise=True, random_state=0),
    DPPCA(1, n_iter=2, clip_radius=0.5, insecure_noise=True, random_state=0),
    DPPCA(1, method="analyze-gauss", centre=True, insecure_noise=True, random_state=0),
    DPLowRank(1, insecure_noise=True, random_state=0),
]
#: The real thing: secret noise.
PRIVATE = [DPPCA(), DPPCA(1, method="analyze-gauss"), DPLowRank(1)]


def _expected_failures(est: Any) -> dict[str, str]:
    return PRIVATE_RUN_FAILS if get_tags(est).non_deterministic else {}


@parametrize_with_checks(
    REPRODUCIBLE + PRIVATE,
    expected_failed_checks=_expected_failures,
    xfail_strict=True,
)
def test_sklearn_common_checks(estimator: Any, check: Any) -> None:
    check(estimator)


@pytest.mark.parametrize("est", PRIVATE, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize(
    "check",
    [check_methods_sample_order_invariance, check_methods_subset_invariance],
    ids=lambda c: c.__name__,
)
def test_invariances_hold_for_a_private_fit(est: Any, check: Any) -> None:
    """Skipped by sklearn for non-deterministic estimators, but they hold."""
    assert get_tags(est).non_deterministic
    check(type(est).__name__, clone(est))


@pytest.mark.parametrize("cls", [DPPCA, DPLowRank])
def test_docstring_lists_the_failing_and_skipped_checks(cls: type) -> None:
    notes = cls.__doc__.split("Notes\n")[1]
    for name in {**PRIVATE_RUN_FAILS, **NON_DETERMINISTIC_SKIPS}:
        assert name in notes, f"{cls.__name__} Notes do not mention {name}"


def test_exported_from_the_package() -> None:
    assert {"DPPCA", "DPLowRank"} <= set(pipeline.__all__)
    assert pipeline.DPPCA is DPPCA
    assert pipeline.DPLowRank is DPLowRank


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------
N, D, K = 3000, 8, 2


def _matrix(rng: np.random.Generator, n: int = N, offset: float = 0.0) -> np.ndarray:
    """Rows with a clear top-2 subspace; norms mostly below 1 (some clipped)."""
    scales = np.array([3.0, 2.0] + [0.7] * (D - 2)) / 8.0
    return rng.normal(size=(n, D)) * scales + offset


@pytest.fixture
def X(rng: np.random.Generator) -> np.ndarray:
    return _matrix(rng)


def _estimators(global_seed: int) -> list[Any]:
    return [
        DPPCA(K, method="analyze-gauss", insecure_noise=True, random_state=global_seed),
        DPPCA(K, n_iter=3, clip_radius=0.5, insecure_noise=True, random_state=1),
        DPPCA(K, method="analyze-gauss", centre=True),
        DPLowRank(K, random_state=global_seed),
    ]


# ---------------------------------------------------------------------------
# Fidelity to the functional API
# ---------------------------------------------------------------------------
def test_dppca_is_pca(X: np.ndarray, global_seed: int) -> None:
    est = DPPCA(
        K, n_iter=3, clip_radius=0.5, insecure_noise=True, random_state=global_seed
    )
    est.fit(X)
    rel = pca(
        X, K, epsilon=1.0, delta=1e-6, iterations=3, clip_radius=0.5,
        insecure_noise_seed=global_seed,
    )  # fmt: skip
    np.testing.assert_array_equal(est.components_, rel.components.T)
    np.testing.assert_array_equal(est.explained_variance_, rel.eigenvalues[:K] / N)
    assert est.n_components_ == K
    assert est.n_features_in_ == D
    assert est.n_iter_ == 3
    assert est.mean_ is None
    assert est.privacy_report_["private"] is False
    assert "NOT PRIVATE" in est.privacy_report_["note"]


def test_dppca_explained_variance_in_units_of_x(X: np.ndarray) -> None:
    """Rows are divided by C before the release; the variances are scaled back."""
    C = 2.0
    est = DPPCA(K, method="analyze-gauss", row_norm_bound=C, insecure_noise=True,
                random_state=3).fit(X)  # fmt: skip
    rel = pca(X, K, epsilon=1.0, delta=1e-6, method="analyze-gauss",
              row_norm_bound=C, insecure_noise_seed=3)  # fmt: skip
    np.testing.assert_allclose(
        est.explained_variance_, rel.eigenvalues[:K] * C**2 / N, rtol=1e-15, atol=0
    )


def test_private_fit_is_private(X: np.ndarray) -> None:
    est = DPPCA(K, method="analyze-gauss").fit(X)
    assert est.privacy_report_["private"] is True
    assert "note" not in est.privacy_report_
    assert get_tags(est).non_deterministic


def test_dplowrank_is_factorize(X: np.ndarray, global_seed: int) -> None:
    est = DPLowRank(K, insecure_noise=True, random_state=global_seed).fit(X)
    f = factorize(X, K, epsilon=1.0, delta=1e-6, seed=global_seed,
                  insecure_noise_seed=global_seed)  # fmt: skip
    for got, want in ((est.U_, f.U), (est.S_, f.S), (est.V_, f.V)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(est.components_, f.V.T)
    np.testing.assert_array_equal(est.transform(X), X @ f.V)
    assert est.U_.shape == (N, K)


@pytest.mark.parametrize("which", range(4))
def test_components_shapes_and_transforms(
    X: np.ndarray, global_seed: int, which: int
) -> None:
    est = _estimators(global_seed)[which].fit(X)
    Vt = est.components_
    assert Vt.shape == (K, D)
    # orthonormal rows: QR / eigh output, exact up to rounding (d * eps scale)
    np.testing.assert_allclose(Vt @ Vt.T, np.eye(K), rtol=0, atol=1e-12)
    Z = est.transform(X)
    assert Z.shape == (N, K)
    assert Z.dtype == np.float64
    assert est.inverse_transform(Z).shape == (N, D)
    prefix = type(est).__name__.lower()
    assert list(est.get_feature_names_out()) == [f"{prefix}{i}" for i in range(K)]


def test_transform_on_a_dask_array_is_lazy_and_equal(X: np.ndarray) -> None:
    da = pytest.importorskip("dask.array")
    est = DPPCA(K, method="analyze-gauss", centre=True, insecure_noise=True,
                random_state=0).fit(X)  # fmt: skip
    out = est.transform(da.from_array(X, chunks=(700, D)))
    assert isinstance(out, da.Array)
    # same products, blocked differently: rounding only
    np.testing.assert_allclose(
        out.compute(scheduler="synchronous"), est.transform(X), rtol=1e-12, atol=1e-12
    )


# ---------------------------------------------------------------------------
# Centring with a DP mean (spec power-pca D8)
# ---------------------------------------------------------------------------
def test_centring_budget_split_is_exact(X: np.ndarray, tmp_path: Any) -> None:
    eps, delta = 1.0, 1e-6
    ledger = tmp_path / "data.dplr-ledger.json"
    est = DPPCA(K, method="analyze-gauss", centre=True, epsilon=eps, delta=delta,
                ledger=str(ledger), budget=(eps, delta)).fit(X)  # fmt: skip
    rep = est.privacy_report_
    assert rep["epsilon"] == eps
    assert rep["parameters"]["centred"] is True
    # the two Gaussian releases compose to mu_total-GDP [DRS22, Cor. 3.3]
    mu = np.hypot(rep["centring"]["mu"], rep["pca_release"]["mu"])
    np.testing.assert_allclose(rep["mu_total"], mu, rtol=1e-15, atol=0)
    assert gaussian_delta(1.0 / rep["mu_total"], eps) <= delta
    # the budget is used up to root-finding precision, not under-used
    assert gaussian_delta(1.0 / rep["mu_total"], eps) >= delta * (1 - 1e-6)
    assert rep["centring"]["mu"] <= np.sqrt(0.1) * rep["mu_total"] * (1 + 1e-12)
    records = json.loads(ledger.read_text())["releases"]
    # one release: the mean and the PCA composed exactly, charged once
    assert [r["algorithm"] for r in records] == ["pca-centred"]
    # the ledger sees the whole budget spent: a second fit is refused before a read
    with pytest.raises(BudgetExceededError):
        clone(est).fit(X)
    assert len(json.loads(ledger.read_text())["releases"]) == 1


def test_centring_releases_a_noisy_clipped_mean(rng: np.random.Generator) -> None:
    offset = 0.3
    X = _matrix(rng, offset=offset)
    C = 2.0
    est = DPPCA(K, method="analyze-gauss", centre=True, row_norm_bound=C,
                insecure_noise=True, random_state=5).fit(X)  # fmt: skip
    sigma = est.privacy_report_["centring"]["sigma"]
    target = prep_rows(X, C).mean(axis=0) * C  # the clipped mean, units of X
    # N(0, sigma^2) per coordinate of the sum: 6 sigma fails w.p. ~2e-9 per entry
    np.testing.assert_allclose(est.mean_, target, rtol=0, atol=6 * sigma * C / N)
    Z = est.transform(X)
    np.testing.assert_allclose(Z, (X - est.mean_) @ est.components_.T, rtol=1e-15,
                               atol=1e-15)  # fmt: skip


def test_centring_finds_the_variance_not_the_mean(rng: np.random.Generator) -> None:
    """With a large common offset the uncentred top component is the mean
    direction (negative control); the centred one is the top variance axis."""
    X = _matrix(rng)
    X[:, :2] *= 0.4  # std 0.15 and 0.1
    X[:, 2:] *= 0.5  # std 0.044
    X[:, 2:] += 0.25  # a shared offset along the trailing coordinates
    axes = np.eye(D)[:K]

    def overlap(est: DPPCA) -> float:
        # sigma_min of axes @ components^T: cosine of the largest principal angle
        return float(np.linalg.svd(axes @ est.components_.T, compute_uv=False)[-1])

    kw: dict[str, Any] = {"method": "analyze-gauss", "private": False}
    assert overlap(DPPCA(K, **kw).fit(X)) < 0.5
    assert overlap(DPPCA(K, centre=True, **kw).fit(X)) > 0.99


# ---------------------------------------------------------------------------
# sklearn conventions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "est",
    [
        DPPCA(3, n_iter=4, clip_radius=0.3, centre=True, mean_fraction=0.2),
        DPLowRank(3, algorithm="low-space", sketch_size=5, random_state=4),
    ],
    ids=lambda e: type(e).__name__,
)
def test_clone_get_params_set_params(est: Any, X: np.ndarray) -> None:
    params = est.get_params()
    twin = clone(est)
    assert twin is not est
    assert twin.get_params() == params
    assert twin.set_params(n_components=2) is twin
    assert twin.n_components == 2
    assert est.n_components == 3
    type(est)(**twin.get_params()).fit(X)
    assert not hasattr(clone(twin), "components_")


def test_pipeline_with_a_classifier(rng: np.random.Generator, global_seed: int) -> None:
    """DP projection, then a classifier trained on the projected features."""
    n = 2000
    y = rng.integers(0, 2, size=n)
    X = rng.normal(scale=0.05, size=(n, 10))
    X[:, 0] += 0.4 * (2 * y - 1)  # the class signal is the top second-moment axis
    pipe = Pipeline([
        ("pca", DPPCA(2, method="analyze-gauss", insecure_noise=True,
                      random_state=global_seed)),
        ("clf", LogisticRegression()),
    ])  # fmt: skip
    pipe.fit(X[:1500], y[:1500])
    # signal 0.4 vs noise 0.05 per class: the Bayes accuracy is ~1 - 1e-15, and
    # the top eigenvalue (~80 per 1000 rows) dwarfs the Gram noise (~5 sigma_init)
    assert pipe.score(X[1500:], y[1500:]) > 0.95
    assert pipe.named_steps["pca"].components_.shape == (2, 10)


class _Untouchable:
    """Raises if anything reads it: parameters must be refused first."""

    shape = (N, D)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise AssertionError("the data was read before the parameters were checked")


@pytest.mark.parametrize(
    ("est", "match"),
    [
        (DPPCA(0, method="analyze-gauss"), "n_components"),
        (DPPCA(2, method="svd"), "method"),
        (DPPCA(2, method="power"), "n_iter and clip_radius must be given"),
        (DPPCA(2, method="power", n_iter=3), "clip_radius must be given"),
        (DPPCA(2, method="analyze-gauss", n_iter=3), "method='power' only"),
        (DPPCA(2, n_iter=0, clip_radius=0.5), "n_iter"),
        (DPPCA(2, n_iter=3, clip_radius=-1.0), "clip_radius"),
        (DPPCA(2, method="analyze-gauss", accounting="rdp"), "accounting"),
        (
            DPPCA(2, method="analyze-gauss", centre=True, mean_fraction=1.5),
            "mean_fraction",
        ),
        (DPPCA(2, method="analyze-gauss", row_norm_bound=0.0), "row_norm_bound"),
        (DPPCA(2, method="analyze-gauss", epsilon=-1.0), "epsilon"),
        (DPPCA(2, method="analyze-gauss", insecure_noise=True), "random_state"),
        (DPPCA(2, method="analyze-gauss", random_state=-3), "random_state"),
        (DPPCA(2, method="analyze-gauss", centre="yes"), "centre"),
        (DPPCA(2, select=True, n_iter=3), "select=True"),
        (DPPCA(2, select=True, centre=True), "centre=False"),
        (DPPCA(2, select=True, private=False), "private=True"),
        (DPLowRank(0), "n_components"),
        (DPLowRank(2, algorithm="exact"), "algorithm"),
        (DPLowRank(2, unit="person"), "unit"),
        (DPLowRank(2, delta=2.0), "delta"),
        (DPLowRank(2, insecure_noise=True), "random_state"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_invalid_parameters_raise_at_fit_before_any_read(est: Any, match: str) -> None:
    # construction never validates (sklearn rule); fit does, before reading X
    with pytest.raises(InvalidParameterError, match=match):
        est.fit(_Untouchable())


def test_select_without_selection_support(
    X: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pca_without_select(source: Any, rank: int, *, epsilon: Any = None) -> Any:
        raise AssertionError("must not be called")

    monkeypatch.setattr("pipeline.estimators.pca", pca_without_select)
    with pytest.raises(InvalidParameterError, match="not available yet"):
        DPPCA(K, select=True).fit(X)


def test_select_chooses_r_and_t_privately(X: np.ndarray) -> None:
    import inspect

    if "select" not in inspect.signature(pca).parameters:
        pytest.skip("pipeline.api.pca has no private selection")
    est = DPPCA(K, select=True, insecure_noise=True, random_state=2).fit(X)
    sel = est.privacy_report_["selection"]
    assert est.n_iter_ == sel["selected_iterations"]
    assert est.clip_radius_ == sel["selected_clip_radius"]
    assert est.components_.shape == (K, D)


# ---------------------------------------------------------------------------
# numpy == dask array == Zarr path, on a real cluster
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.wait_for_workers(2, timeout=60)
        yield c


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "make",
    [
        # one configuration covers the power method and the DP-mean pass
        lambda: DPPCA(K, n_iter=1, clip_radius=0.5, centre=True, insecure_noise=True,
                      random_state=9),
        lambda: DPLowRank(K, insecure_noise=True, random_state=9),
    ],
    ids=["DPPCA-centred-power", "DPLowRank"],
)  # fmt: skip
def test_numpy_dask_and_zarr_path_agree(
    client: Any, tmp_path: Any, global_seed: int, make: Any
) -> None:
    da = pytest.importorskip("dask.array")
    zarr = pytest.importorskip("zarr")
    X = _matrix(np.random.default_rng(global_seed), n=2000)
    path = str(tmp_path / "a.zarr")
    z = zarr.create_array(store=path, shape=X.shape, chunks=(500, 4), dtype=X.dtype)
    z[...] = X
    ref = make().fit(X)
    on_dask = make().fit(da.from_array(X, chunks=(700, 4)))
    # a Zarr path is a dataset with a ledger beside the store: declare its budget
    on_zarr = make().set_params(budget=(10.0, 1e-5)).fit(path)
    for est in (on_dask, on_zarr):
        assert est.privacy_report_["cluster"]["kind"] == "active"
        assert est.n_features_in_ == D
        # same releases and noise; only the order of the band sums differs
        # (float64 rounding of sums of 2000 rows: far below 1e-12)
        np.testing.assert_allclose(est.components_, ref.components_, rtol=0, atol=1e-12)
        if getattr(ref, "mean_", None) is not None:
            np.testing.assert_allclose(est.mean_, ref.mean_, rtol=0, atol=1e-12)
    assert on_zarr.privacy_report_["ledger"]["n_releases"] >= 1
    assert on_zarr.privacy_report_["input"]["path"] == path


def test_dppca_fits_with_its_defaults() -> None:
    """``DPPCA(n_components)`` fits with no T or R (method="auto"); ``DPPCA()`` keeps
    every component, as scikit-learn's PCA."""
    X = _matrix(np.random.default_rng(3))
    est = DPPCA(2).fit(X)
    assert est.components_.shape == (2, D)
    assert est.privacy_report_["auto"]["chosen"] == "analyze-gauss"
    assert est.privacy_report_["parameters"]["neighboring"] == "add-remove"
    full = DPPCA().fit(X)
    assert full.components_.shape == (D, D)
    np.testing.assert_allclose(full.components_ @ full.components_.T, np.eye(D), atol=1e-10)
