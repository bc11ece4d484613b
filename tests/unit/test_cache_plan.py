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


@pytest.mark.parametrize(
    ("limits", "dense", "why"),
    [([0, LIMIT], True, "no memory limit"), ([], True, "no memory limit"),
     ([LIMIT, LIMIT], False, "sparse input")],
)  # fmt: skip
def test_unknown_limits_and_sparse_input_are_not_held(
    limits: list[int], dense: bool, why: str
) -> None:
    plan = plan_cache("auto", [MIB] * 4, limits, dense=dense)
    assert not plan.used
    assert why in plan.reason
    with pytest.raises(InvalidParameterError, match=why):
        plan_cache("always", [MIB] * 4, limits, dense=dense)


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
