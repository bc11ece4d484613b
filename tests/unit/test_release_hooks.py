"""One hook value between a job and an algorithm, the same for every kind of release.

Every run entry point of the algorithm layer (:func:`run_lrf` for Spectral-LRF,
Low-Space-LRF and two passes; :func:`run_pca` for the power method and Analyze
Gauss; :func:`run_selection`) takes one :class:`ReleaseHooks`: the noise key,
the sketch seed, the journal (save and restore of pass state), the charge and
the progress. Checked here on in-memory sources, for each entry point:

* the charge is called exactly once, after the data was read and before the
  first noise draw (every noise tile and secret choice comes from
  ``pipeline.mechanisms.noise._tile_generator``);
* the journal the run filled resumes it bit for bit (the same computation on
  the same bytes) with no new noise draw before the charge and no pass at all
  when every release is journaled;
* the engine of the release job imports no algorithm and no sketch: what its
  journal header needs of a sketch seed (its fingerprint) comes from the job.

Negative controls: a recorder that sees a draw before the charge is caught; a
journal emptied between the runs makes the resumed run read the data again;
the import check catches a synthetic engine that imports an algorithm.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.mechanisms.noise as noise_module
from pipeline.accounting.pca import calibrate_selection
from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import plan_lrf, run_lrf
from pipeline.algorithms.pca import ArrayRowSource, plan_pca, run_pca, run_selection
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import LrfParams, PcaParams

M, N, RANK = 240, 10, 2
ENGINE = Path(__file__).parents[2] / "pipeline" / "jobs" / "engine.py"


class DictJournal:
    """A journal in memory that keeps a deep copy of whatever it is given."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def load(self, label: str) -> Any:
        return copy.deepcopy(self.values.get(label))

    def record(self, label: str, value: Any) -> None:
        self.values[label] = copy.deepcopy(value)


@pytest.fixture
def data(global_seed: int) -> np.ndarray:
    rng = np.random.default_rng(global_seed)
    return rng.standard_normal((M, N)) / np.sqrt(N)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``read`` and ``draw`` events in order (the charge hook appends ``charge``)."""
    events: list[str] = []

    def record(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            events.append(name)
            return real(*a, **kw)

        return wrapped

    monkeypatch.setattr(ArraySource, "sketch", record("read", ArraySource.sketch))
    for name in ("gram", "products", "power_step"):
        real = getattr(ArrayRowSource, name)
        monkeypatch.setattr(ArrayRowSource, name, record("read", real))
    monkeypatch.setattr(
        noise_module, "_tile_generator", record("draw", noise_module._tile_generator)
    )
    return events


def _lrf(algorithm: str) -> Callable[[np.ndarray, ReleaseHooks], Any]:
    params = LrfParams.of(RANK, epsilon=1.0, delta=1e-6, algorithm=algorithm)

    def run(A: np.ndarray, hooks: ReleaseHooks) -> Any:
        f = run_lrf(ArraySource(A), plan_lrf(params, A.shape), hooks)
        return np.asarray(f.U), f.S, np.asarray(f.V)

    return run


def _pca(method: str) -> Callable[[np.ndarray, ReleaseHooks], Any]:
    extra = {"iterations": 2, "clip_radius": 0.3} if method == "power" else {}
    params = PcaParams(rank=RANK, epsilon=1.0, delta=1e-6, method=method, **extra)

    def run(A: np.ndarray, hooks: ReleaseHooks) -> Any:
        r = run_pca(ArrayRowSource(A), plan_pca(params, A.shape), hooks)
        return r.components, r.eigenvalues

    return run


def _selection(A: np.ndarray, hooks: ReleaseHooks) -> Any:
    cal = calibrate_selection(
        PcaParams(rank=RANK, epsilon=1.0, delta=1e-6, beta=0.1), n_rows=M, n_features=N,
        radii=(0.2, 0.4), iteration_grid=(1, 2), expected_trials=2.0,
    )  # fmt: skip
    r = run_selection(ArrayRowSource(A), cal, hooks)
    return r.components, r.eigenvalues, r.iterations


ENTRY_POINTS: dict[str, Callable[[np.ndarray, ReleaseHooks], Any]] = {
    "lrf-spectral": _lrf("spectral"),
    "lrf-low-space": _lrf("low-space"),
    "lrf-two-pass": _lrf("two-pass"),
    "pca-power": _pca("power"),
    "pca-analyze-gauss": _pca("analyze-gauss"),
    "pca-select": _selection,
}


def _hooks(log: list[str], journal: DictJournal, said: list[str]) -> ReleaseHooks:
    return ReleaseHooks(
        noise_key=NoiseKey.insecure_from_seed(7),
        sketch_seed=2**100 + 3,
        journal=journal,
        charge=lambda: log.append("charge"),
        progress=said.append,
    )


def _same(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_charged_once_before_any_draw(log: list[str]) -> None:
    assert "read" in log, log
    assert log.count("charge") == 1, log
    assert "draw" in log, log
    assert log.index("read") < log.index("charge") < log.index("draw"), (
        f"noise drawn before the charge: {log}"
    )


@pytest.mark.parametrize("kind", list(ENTRY_POINTS))
def test_one_hook_value_charges_once_before_the_first_draw_and_resumes(
    data: np.ndarray, log: list[str], kind: str
) -> None:
    run = ENTRY_POINTS[kind]
    journal, said = DictJournal(), []
    first = run(data, _hooks(log, journal, said))
    assert_charged_once_before_any_draw(log)
    assert journal.values, "the run journaled nothing"
    # resumed from the journal it filled: the same bits, no new draw before a charge
    log.clear()
    again = run(data, _hooks(log, journal, []))
    _same(first, again)
    if "charge" in log and "draw" in log:
        assert log.index("charge") < log.index("draw"), log
    if kind.startswith("pca"):  # every release journaled: no pass and no charge
        assert "read" not in log, log
        assert "charge" not in log, log
    # negative control: without the journal the data is read again
    log.clear()
    run(data, _hooks(log, DictJournal(), []))
    assert "read" in log


def test_progress_names_the_steps_of_a_power_run(
    data: np.ndarray, log: list[str]
) -> None:
    said: list[str] = []
    ENTRY_POINTS["pca-power"](data, _hooks(log, DictJournal(), said))
    assert said == [
        "Gram pass: A^T A of the clipped rows",
        "power iteration 1/2",
        "power iteration 2/2",
    ]


def test_a_run_that_draws_before_its_charge_is_caught(
    data: np.ndarray, log: list[str]
) -> None:
    """Negative control: the charge called after the run, as a late hook would."""
    hooks = ReleaseHooks(noise_key=NoiseKey.insecure_from_seed(7), sketch_seed=5)
    ENTRY_POINTS["lrf-spectral"](data, hooks)  # no charge hook: it comes too late
    log.append("charge")
    with pytest.raises(AssertionError, match="noise drawn before the charge"):
        assert_charged_once_before_any_draw(log)


def _imported(source: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _knows_an_algorithm(source: str) -> set[str]:
    prefixes = ("pipeline.algorithms", "pipeline.sketches")
    return {m for m in _imported(source) if m.startswith(prefixes)}


def test_the_engine_imports_no_algorithm_and_no_sketch() -> None:
    assert _knows_an_algorithm(ENGINE.read_text()) == set()
    # negative control: a synthetic engine that imports one is caught
    bad = "from pipeline.sketches.operators import seed_fingerprint\n"
    assert _knows_an_algorithm(bad) == {"pipeline.sketches.operators"}
