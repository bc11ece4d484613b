"""Parameter sets declared once: the CLI flags and the estimators' checks come from
the fields of the value objects in :mod:`pipeline.params`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from pipeline._validation import check_int_in_range
from pipeline.cli.common import add_params, add_privacy, params_of
from pipeline.errors import InvalidParameterError
from pipeline.params import (
    Flag,
    LrfParams,
    PcaParams,
    Runtime,
    StreamParams,
    check_param,
    flag_fields,
    meta,
)


def _with_throwaway(cls: type, section: str) -> type:
    """``cls`` with one more field, declared with the metadata convention only."""
    flag = Flag(names=("--throwaway",), section=section, parse=int, default=7,
                help="a parameter added for this test")  # fmt: skip
    extra = dataclasses.field(default=7, metadata=meta(
        check=lambda v, n: check_int_in_range(v, n, 1, 9), flag=flag))  # fmt: skip
    return dataclasses.make_dataclass(
        f"{cls.__name__}Plus", [("throwaway", int, extra)], bases=(cls,),
        frozen=True, kw_only=True,
    )  # fmt: skip


def _parser(cls: type, sections: tuple[str, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    for section in sections:
        add_params(p, cls, section)
    add_privacy(p, cls)
    return p


LRF_SECTIONS = ("target", "method")
PCA_SECTIONS = ("target", "method", "input", "model")
BUDGET = ["--epsilon", "1", "--delta", "1e-6"]


@pytest.mark.parametrize(
    ("base", "sections"), [(LrfParams, LRF_SECTIONS), (PcaParams, PCA_SECTIONS)]
)
def test_a_new_field_gets_its_flag_its_check_and_round_trips(
    base: type, sections: tuple[str, ...]
) -> None:
    """Adding a field (with metadata) to LrfParams or PcaParams needs no edit of
    the parser code: the flag appears, parses back into the value object, and the
    field's check runs in ``__post_init__``."""
    plus = _with_throwaway(base, "method")
    parser = _parser(plus, sections)
    assert "--throwaway THROWAWAY" in parser.format_help()
    args = parser.parse_args(["--rank", "2", "--throwaway", "5", *BUDGET])
    made = params_of(plus, args)
    assert (made.throwaway, made.rank, made.epsilon) == (5, 2, 1.0)
    # absent: the flag's default; the other fields as the unmodified class makes them
    default = params_of(plus, parser.parse_args(["--rank", "2", *BUDGET]))
    same = params_of(base, _parser(base, sections).parse_args(["--rank", "2", *BUDGET]))
    assert default.throwaway == 7
    assert {f.name: getattr(default, f.name) for f in dataclasses.fields(base)} == {
        f.name: getattr(same, f.name) for f in dataclasses.fields(base)
    }
    with pytest.raises(InvalidParameterError, match=r"throwaway must be in \[1, 9\]"):
        params_of(plus, parser.parse_args(["--rank", "2", "--throwaway", "12", *BUDGET]))
    # negative control: the unmodified class has no such flag
    with pytest.raises(SystemExit):  # argparse: unrecognized arguments
        _parser(base, sections).parse_args(["--rank", "2", "--throwaway", "5", *BUDGET])


def test_every_flag_is_in_a_section_its_verb_adds() -> None:
    """A flag in a section no verb lists would silently not exist."""
    listed = {LrfParams: {*LRF_SECTIONS, "privacy"}, PcaParams: {*PCA_SECTIONS, "privacy"},
              StreamParams: {"stream"}, Runtime: {"runtime"}}  # fmt: skip
    for cls, sections in listed.items():
        found = {flag.section for _, flag, _ in flag_fields(cls)}
        assert found == sections, cls


def test_nested_clip_spec_and_negated_flag_round_trip() -> None:
    parser = _parser(LrfParams, LRF_SECTIONS)
    args = parser.parse_args(
        ["--rank", "3", "--clip-norm", "2.5", "--unit", "column", "--non-private"]
    )
    p = params_of(LrfParams, args)
    assert (p.clip.clip_norm, p.clip.unit.value, p.private) == (2.5, "column", False)
    assert p == LrfParams.of(3, clip_norm=2.5, unit="column", private=False)


def test_check_param_names_the_callers_parameter() -> None:
    """The estimators check ``n_components`` with the check of ``rank``."""
    with pytest.raises(InvalidParameterError, match=r"^n_components must be >= 1, got n_components=0\.$"):
        check_param(LrfParams, "rank", 0, label="n_components")
    with pytest.raises(InvalidParameterError, match="method must be one of 'auto', 'power'"):
        check_param(PcaParams, "method", "fast")
    assert check_param(PcaParams, "accounting", "paper") == "paper"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"method": "fast"}, "method must be one of"),
        ({"route": "x"}, "route must be one of 'auto', 'gram', 'two-pass'"),
        ({"neighboring": "swap"}, "neighboring must be one of 'add-remove', 'replace'"),
        ({"row_norm_bound": 0.0}, r"row_norm_bound must be in \(0, inf\)"),
        ({"private": 1}, "private must be True or False"),
        ({"epsilon": None}, "epsilon and delta are required for a private PCA"),
    ],
)
def test_pca_params_validate_themselves(kw: dict[str, Any], message: str) -> None:
    """PcaParams refuses a bad field when it is made, before any shape or data."""
    with pytest.raises(InvalidParameterError, match=message):
        PcaParams(**{"rank": 2, "epsilon": 1.0, "delta": 1e-6, **kw})
    PcaParams(rank=2, epsilon=1.0, delta=1e-6)  # negative control: valid as made
