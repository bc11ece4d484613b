"""The order of a private release: budget before the first read, charge before the first draw.

docs/privacy.md section 7 states two orderings of the release job:

* a plan that exceeds the remaining budget is refused **before any data is
  read** and nothing is charged;
* the ledger is charged **once, before the first noise draw**.

Both are checked here by recording what happens, in order, through the
primitives every release uses: the reads of the input (``ArraySource.sketch``
for factorize, ``power_pca.band_pass`` for PCA and the DP mean), the ledger
charge (``Ledger.charge``, which the in-process accountant inherits) and the
noise draws (every noise tile, and every secret random choice of a selection,
comes from ``pipeline.mechanisms.noise._tile_generator``). The over-budget
refusal on a Zarr store is counted per chunk read on the workers in
``tests/distributed/test_factorize_resume.py``.

Negative controls: the same recorder catches a release that draws its noise
before the charge (the hook moved after the draw, by a wrapper around the real
code), and sees the reads of an accepted run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.mechanisms.noise as noise_module
from pipeline import api
from pipeline.accounting.ledger import Ledger
from pipeline.algorithms.base import ArraySource
from pipeline.algorithms.pca import power as power_pca
from pipeline.errors import BudgetExceededError
from pipeline.estimators import DPPCA
from pipeline.jobs import factorize as lrf_job

M, N, RANK = 300, 12, 2


@pytest.fixture
def data(global_seed: int) -> np.ndarray:
    rng = np.random.default_rng(global_seed)
    return rng.standard_normal((M, N)) / np.sqrt(N)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``read``, ``charge`` and ``draw`` events, in the order they happen."""
    log: list[str] = []

    def record(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            log.append(name)
            return real(*a, **kw)

        return wrapped

    monkeypatch.setattr(ArraySource, "sketch", record("read", ArraySource.sketch))
    monkeypatch.setattr(power_pca, "band_pass", record("read", power_pca.band_pass))
    monkeypatch.setattr(Ledger, "charge", record("charge", Ledger.charge))
    monkeypatch.setattr(
        noise_module, "_tile_generator", record("draw", noise_module._tile_generator)
    )
    return log


def assert_charged_once_before_any_draw(log: list[str]) -> None:
    """The release read its data, was charged exactly once, and only then drew noise."""
    assert "read" in log, log
    assert log.count("charge") == 1, log
    assert "draw" in log, log
    assert log.index("charge") < log.index("draw"), (
        f"noise drawn before the charge: {log}"
    )


def _ledger(tmp_path: Path, eps: float = 50.0) -> Ledger:
    tmp_path.mkdir(exist_ok=True)
    return Ledger.create(
        tmp_path / "d.dplr-ledger.json", dataset="d", epsilon=eps, delta=1e-4
    )


RELEASES: dict[str, Callable[[np.ndarray, Any], Any]] = {
    "factorize-spectral": lambda A, book: api.factorize(
        A, RANK, epsilon=1.0, delta=1e-6, ledger=book
    ),
    "factorize-low-space": lambda A, book: api.factorize(
        A, RANK, epsilon=1.0, delta=1e-6, algorithm="low-space", ledger=book
    ),
    "pca-power": lambda A, book: api.pca(
        A, RANK, epsilon=1.0, delta=1e-6, iterations=2, clip_radius=0.05, ledger=book
    ),
    "pca-analyze-gauss": lambda A, book: api.pca(
        A, RANK, epsilon=1.0, delta=1e-6, method="analyze-gauss", ledger=book
    ),
    "pca-select": lambda A, book: api.pca(
        A, RANK, epsilon=1.0, delta=1e-6, select=True, ledger=book
    ),
    "dppca-centred": lambda A, book: DPPCA(
        RANK,
        epsilon=1.0,
        delta=1e-6,
        n_iter=2,
        clip_radius=0.05,
        centre=True,
        ledger=book,
    ).fit(A),
}


@pytest.mark.parametrize("kind", list(RELEASES))
@pytest.mark.parametrize("ledger", ["file", "in-process"])
def test_every_release_is_charged_once_before_its_first_noise_draw(
    data: np.ndarray, tmp_path: Path, events: list[str], kind: str, ledger: str
) -> None:
    book = _ledger(tmp_path) if ledger == "file" else None
    RELEASES[kind](data, book)
    assert_charged_once_before_any_draw(events)
    if book is not None:
        assert len(book.releases) == 1


def test_a_release_that_draws_before_its_charge_is_caught(
    data: np.ndarray,
    tmp_path: Path,
    events: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative controls: the ledger hook moved after the noise, for both algorithms."""
    real_run_lrf = lrf_job.run_lrf

    def run_lrf_charging_late(src: Any, plan: Any, hooks: Any, **kw: Any) -> Any:
        late = dataclasses.replace(hooks, charge=None)
        out = real_run_lrf(src, plan, late, **kw)  # the noise is drawn in here
        hooks.charge()
        return out

    with monkeypatch.context() as mp:
        mp.setattr(lrf_job, "run_lrf", run_lrf_charging_late)
        RELEASES["factorize-spectral"](data, _ledger(tmp_path / "lrf"))
    with pytest.raises(AssertionError, match="noise drawn before the charge"):
        assert_charged_once_before_any_draw(events)

    def release_charging_late(
        self: Any, label: str, exact: Any, sigma: float, shape: Any, symmetric: bool
    ) -> Any:
        # the old order: noise first, then the hook
        self.labels.append(label)
        value = exact().value
        noisy = value + sigma * power_pca._noise(
            self.noise_key, label, shape, symmetric
        )
        if not self.charged and self.hooks.charge is not None:
            self.hooks.charge()
        self.charged = True
        self.journal.record(label, noisy)
        return noisy

    events.clear()
    with monkeypatch.context() as mp:
        mp.setattr(power_pca.Releases, "release", release_charging_late)
        RELEASES["pca-power"](data, _ledger(tmp_path / "pca"))
    with pytest.raises(AssertionError, match="noise drawn before the charge"):
        assert_charged_once_before_any_draw(events)


@pytest.mark.parametrize("kind", list(RELEASES))
def test_over_budget_is_refused_before_any_read(
    data: np.ndarray, tmp_path: Path, events: list[str], kind: str
) -> None:
    """In memory: nothing read, charged or drawn; the ledger file is unchanged."""
    book = _ledger(tmp_path, eps=0.5)  # every release above asks for epsilon = 1
    before = book.path.read_bytes()
    with pytest.raises(BudgetExceededError):
        RELEASES[kind](data, book)
    assert events == []
    assert book.path.read_bytes() == before
    # negative control: the same counter sees the reads of an accepted run
    RELEASES[kind](data, _ledger(tmp_path / "roomy"))
    assert "read" in events
