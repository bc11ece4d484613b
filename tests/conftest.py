"""Shared fixtures: seeds, hypothesis profiles, tolerances."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None)
settings.register_profile("nightly", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Round-off tolerances by dtype (float32 looser), for results that are exact in
#: exact arithmetic; anything else states its own source.
RTOL = {np.dtype("float64"): 1e-10, np.dtype("float32"): 1e-5}

_SEEDS = list(range(100)) if os.environ.get("PIPELINE_TEST_SEEDS") == "all" else [42]


@pytest.fixture(params=_SEEDS)
def global_seed(request: pytest.FixtureRequest) -> int:
    """42 by default; ``PIPELINE_TEST_SEEDS=all`` runs 0..99 (tests must pass for all)."""
    return int(request.param)


@pytest.fixture
def rng(global_seed: int) -> np.random.Generator:
    return np.random.default_rng(global_seed)
