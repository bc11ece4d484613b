"""Argument checks run at the public boundary, before any data is read.

Messages follow one template: the parameter, the constraint, the value received.
"""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, TypeVar

from pipeline.errors import InvalidParameterError, PrivacyConfigError

EnumT = TypeVar("EnumT", bound=enum.Enum)


def check_int_in_range(
    value: Any, name: str, low: int, high: int | None = None, *, what: str = ""
) -> int:
    """Return ``value`` as an int if ``low <= value <= high``, else raise.

    ``what`` optionally spells the bound symbolically, e.g. ``"[1, t - 1]"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(f"{name} must be an integer, got {name}={value!r}.")
    number = int(value)
    if number < low or (high is not None and number > high):
        if high is None and not what:
            text = f"{name} must be >= {low}"
        else:
            bound = f"[{low}, {high}]" if high is not None else f">= {low}"
            text = f"{name} must be in {what + ' = ' if what else ''}{bound}"
        raise InvalidParameterError(f"{text}, got {name}={number}.")
    return number


def check_float_in_interval(
    value: Any,
    name: str,
    low: float,
    high: float,
    *,
    low_open: bool = True,
    high_open: bool = True,
    privacy: bool = False,
) -> float:
    """Return ``value`` as a float if it lies in the interval, else raise."""
    error = PrivacyConfigError if privacy else InvalidParameterError
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a real number, got {name}={value!r}.")
    number = float(value)
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if math.isnan(number) or too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        high_txt = "inf" if math.isinf(high) else f"{high:g}"
        raise error(
            f"{name} must be in {left}{low:g}, {high_txt}{right}, got {name}={number!r}."
        )
    return number


def check_privacy_pair(epsilon: Any, delta: Any) -> tuple[float, float]:
    """Validate an (epsilon, delta) pair of a private release."""
    eps = check_float_in_interval(epsilon, "epsilon", 0.0, math.inf, privacy=True)
    dlt = check_float_in_interval(delta, "delta", 0.0, 1.0, privacy=True)
    return eps, dlt


def check_enum(cls: type[EnumT], value: Any, name: str) -> EnumT:
    """Return ``value`` as a member of the enum ``cls`` (by member or by value), else raise.

    The message lists the allowed values, e.g. ``algorithm must be one of
    'spectral', 'low-space', got algorithm='fast'.``
    """
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise InvalidParameterError(
            f"{name} must be one of {allowed}, got {name}={value!r}."
        ) from None
