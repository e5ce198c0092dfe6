"""Checks of what a caller passes, shared by the option types: a value that cannot even
be put into a request field is refused here, naming the parameter; the daemon judges the
rest (ranges, limits)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from ._errors import InvalidArgument

UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)


def whole(name: str, value: Any, low: int, high: int) -> int:
    """`value` as an int in [low, high], numpy's integers too; InvalidArgument naming
    `name` otherwise (a float, a bool, a string...)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be a whole number, got {value!r}")
    if not low <= int(value) <= high:
        raise InvalidArgument(f"{name} must be {low} to {high}, got {value}")
    return int(value)


def finite(name: str, value: Any) -> float:
    """`value` as a float: a real number (numpy's too), never a bool, NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    if not math.isfinite(number := float(value)):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
    return number


def one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """`value`, one of the names `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise InvalidArgument(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def of_type(name: str, value: Any, kind: Any, what: str) -> None:
    if not isinstance(value, kind):
        raise InvalidArgument(f"{name} must be {what}, got {value!r}")
