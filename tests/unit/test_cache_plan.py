"""The cache decision (:mod:`pipeline.execution.cache`) from public sizes alone,
and ``--cache`` from the command line to the job's ``Runtime``."""

from __future__ import annotations

import argparse

import pytest

from pipeline.cli import factorize, pca
from pipeline.cli.common import runtime_of
from pipeline.errors import InvalidParameterError
from pipeline.execution.cache import CACHE_FRACTION, plan_cache
from pipeline.params import Runtime

MIB = 2**20
LIMIT = 1000 * MIB  # each of two workers
BUDGET = int(CACHE_FRACTION * LIMIT)


def test_bands_that_fit_are_held_and_the_plan_states_public_sizes() -> None:
    # 10 bands over 2 workers: 5 each at the largest band's size
    fits = [BUDGET // 5] * 10
    plan = plan_cache("auto", fits, [LIMIT, LIMIT])
    assert plan.used
    assert (plan.n_bands, plan.n_workers) == (10, 2)
    assert plan.per_worker_bytes == 5 * (BUDGET // 5) <= plan.budget_bytes == BUDGET
    assert plan.to_dict()["fraction"] == CACHE_FRACTION
    # the boundary: one byte more per band does not fit (negative control)
    over = plan_cache("auto", [BUDGET // 5 + 1] * 10, [LIMIT, LIMIT])
    assert not over.used
    assert "above 0.5 of the smallest worker memory limit" in over.reason


def test_the_smallest_worker_and_the_largest_band_decide() -> None:
    sizes = [BUDGET // 5] * 9 + [BUDGET // 5 + 1]  # one band a byte larger
    assert not plan_cache("auto", sizes, [LIMIT, LIMIT]).used
    small = [BUDGET // 5] * 10
    assert not plan_cache("auto", small, [LIMIT, LIMIT - 2]).used
    assert plan_cache("auto", small, [LIMIT, 3 * LIMIT]).used


def test_unknown_limits_are_not_held() -> None:
    for limits in ([0, LIMIT], []):
        plan = plan_cache("auto", [MIB] * 4, limits)
        assert not plan.used
        assert "no memory limit" in plan.reason
        with pytest.raises(InvalidParameterError, match="no memory limit"):
            plan_cache("always", [MIB] * 4, limits)


def test_a_sparse_inputs_decision_is_taken_and_withheld() -> None:
    """Its stored sizes decide (they fit or not, as a dense input's would), the
    report states none of it, and ``always`` holds without a check (a refusal
    would be a data-dependent message); unknown sizes are held under ``always``
    only. Negative control: a dense plan of the same sizes publishes them."""
    fit, over = [MIB] * 4, [BUDGET] * 4
    published = []
    for sizes, held in ((fit, True), (over, False), (None, False)):
        plan = plan_cache("auto", sizes, [LIMIT, LIMIT], dense=False)
        assert plan.used is held
        assert plan_cache("always", sizes, [LIMIT, LIMIT], dense=False).used
        assert plan_cache("always", sizes, [], dense=False).used
        assert not plan_cache("never", sizes, [LIMIT, LIMIT], dense=False).used
        published.append(plan.to_dict())
    assert published[0] == published[1] == published[2]
    assert published[0]["used"] is None
    assert set(published[0]) == {"mode", "used", "reason", "fraction"}
    assert "withheld" in published[0]["reason"]
    dense = plan_cache("auto", fit, [LIMIT, LIMIT]).to_dict()
    assert dense["used"] is True
    assert dense["band_bytes"] == sum(fit)


def test_always_refuses_what_cannot_fit_and_never_holds_nothing() -> None:
    assert plan_cache("always", [MIB] * 4, [LIMIT, LIMIT]).used
    with pytest.raises(
        InvalidParameterError, match=r"cache='always' cannot hold .* Nothing was read"
    ):
        plan_cache("always", [BUDGET] * 4, [LIMIT, LIMIT])
    never = plan_cache("never", [MIB] * 4, [LIMIT, LIMIT])
    assert not never.used
    assert never.reason.startswith("not asked")


@pytest.mark.parametrize("verb", [["factorize", "in.zarr", "--out", "o.zarr", "--rank", "3"],
                                  ["pca", "in.zarr", "--rank", "3"]])  # fmt: skip
def test_cache_flag_reaches_the_runtime(verb: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="dplr")
    sub = parser.add_subparsers()
    factorize.add_parser(sub)
    pca.add_parser(sub)
    assert runtime_of(parser.parse_args(verb)).cache == "auto"  # the default
    for mode in ("never", "always"):
        assert runtime_of(parser.parse_args([*verb, "--cache", mode])).cache == mode
    with pytest.raises(SystemExit):  # argparse: invalid choice
        parser.parse_args([*verb, "--cache", "sometimes"])
    with pytest.raises(InvalidParameterError, match="cache must be one of"):
        Runtime(cache="sometimes")
