"""Option value rules: how one encoder option's value is checked and written out again.

A value is only ever letters, digits and `.,+-`, so it cannot name a path or smuggle a
further `key=value` past the parser. `Params` parses a `key=value:key=value` string and
checks each key against its own rules. The policy that uses these is `codec_options`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import InvalidRequest

MAX_OPTIONS = 32
MAX_PARAMS = 32
MAX_NAME = 64
MAX_VALUE = 64
MAX_PARAMS_LENGTH = 1024
SHOW = 40  # at most this much client text goes back in an error

_PLAIN_VALUE = re.compile(r"[A-Za-z0-9.,+-]+")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,40}")
_INT = re.compile(r"[+-]?[0-9]{1,10}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,6}(?:\.[0-9]{0,6})?|\.[0-9]{1,6})")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def show(text: str) -> str:
    """Client text for an error message: repr'd and cut short."""
    return repr(text[:SHOW]) + ("..." if len(text) > SHOW else "")


def field_name(key: str) -> str:
    """An option name as it appears in an error's field: plain if short and tame."""
    return key if _PLAIN_NAME.fullmatch(key) else show(key)


class Refused(ValueError):
    """A value does not fit its rule; the caller names the field."""


class OptionRule:
    """How one option's value is checked and written out."""

    def check(self, value: str) -> str:
        """The canonical form of `value`; Refused if it does not fit."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def examples(self) -> tuple[str, ...]:
        """Valid values, the edges among them: for tests."""
        raise NotImplementedError

    def _refuse(self, value: str) -> Refused:
        return Refused(f"{show(value)} is not {self.describe()}")


@dataclass(frozen=True)
class Number(OptionRule):
    """A number in `lo`..`hi`: an integer, or a decimal written out with at most six
    places (`Int`, `Float`)."""

    lo: float
    hi: float
    integer: bool = False

    def check(self, value: str) -> str:
        pattern, number = (_INT, int) if self.integer else (_FLOAT, float)
        if not pattern.fullmatch(value) or not self.lo <= number(value) <= self.hi:
            raise self._refuse(value)
        if self.integer:
            return str(int(value))
        text = f"{float(value):.6f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text

    def describe(self) -> str:
        if self.integer:
            return f"an integer in {self.lo}..{self.hi}"
        return f"a number in {self.lo:g}..{self.hi:g}"

    def examples(self) -> tuple[str, ...]:
        if self.integer:
            return (str(self.lo), str(self.hi))
        return (f"{self.lo:g}", f"{(self.lo + self.hi) / 2:g}", f"{self.hi:g}")


def Int(lo: int, hi: int) -> Number:  # named as the rule it makes
    return Number(lo, hi, integer=True)


def Float(lo: float, hi: float) -> Number:
    return Number(lo, hi)


@dataclass(frozen=True)
class Bool(OptionRule):
    def check(self, value: str) -> str:
        low = value.lower()
        if low in _TRUE:
            return "1"
        if low in _FALSE:
            return "0"
        raise self._refuse(value)

    def describe(self) -> str:
        return "0 or 1"

    def examples(self) -> tuple[str, ...]:
        return ("0", "1")


@dataclass(frozen=True)
class OneOf(OptionRule):
    choices: tuple[str, ...]

    def check(self, value: str) -> str:
        if value.lower() not in self.choices:
            raise self._refuse(value)
        return value.lower()

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)

    def examples(self) -> tuple[str, ...]:
        return self.choices


@dataclass(frozen=True)
class SomeOf(OptionRule):
    """Up to `most` distinct choices joined by ',' (x264 combines tunes this way)."""

    choices: tuple[str, ...]
    most: int = 3

    def check(self, value: str) -> str:
        picked = value.lower().split(",")
        if (
            len(picked) > self.most
            or len(set(picked)) != len(picked)
            or any(p not in self.choices for p in picked)
        ):
            raise self._refuse(value)
        return ",".join(picked)

    def describe(self) -> str:
        return f"up to {self.most} of {', '.join(self.choices)} joined by ','"

    def examples(self) -> tuple[str, ...]:
        return self.choices


@dataclass(frozen=True)
class Pair(OptionRule):
    """Two values written 'a,b' (x264/x265 deblock and psy-rd read this form too)."""

    first: Number
    second: Number

    def check(self, value: str) -> str:
        parts = value.split(",")
        if len(parts) != 2:
            raise self._refuse(value)
        try:
            return f"{self.first.check(parts[0])},{self.second.check(parts[1])}"
        except Refused:
            raise self._refuse(value) from None

    def describe(self) -> str:
        return f"'a,b' with a {self.first.describe()} and b {self.second.describe()}"

    def examples(self) -> tuple[str, ...]:
        lo = (self.first.examples()[0], self.second.examples()[0])
        hi = (self.first.examples()[-1], self.second.examples()[-1])
        return (",".join(lo), ",".join(hi))


@dataclass(frozen=True)
class Params(OptionRule):
    """A ':'-separated key=value string (x264-params and the like): each key must be on
    `allowed`; the checked pairs are written out again, never the client's string."""

    allowed: Mapping[str, OptionRule]

    def parse(self, value: str, field: str) -> dict[str, str]:
        """The checked pairs, in the order given; InvalidRequest naming the bad one."""
        if len(value) > MAX_PARAMS_LENGTH:
            raise InvalidRequest(field, f"longer than {MAX_PARAMS_LENGTH} characters")
        pieces = [p for p in value.split(":") if p]
        if len(pieces) > MAX_PARAMS:
            raise InvalidRequest(field, f"at most {MAX_PARAMS} key=value pairs")
        pairs: dict[str, str] = {}
        for piece in pieces:
            key, eq, raw = piece.partition("=")
            where = f"{field}.{field_name(key)}"
            if key not in self.allowed:
                raise InvalidRequest(where, f"{show(key)} is not an allowed key; use {self.keys()}")
            if not eq:
                raise InvalidRequest(where, "expected key=value")
            if key in pairs:
                raise InvalidRequest(where, "given twice")
            pairs[key] = check_value(self.allowed[key], raw, where)
        return pairs

    def check(self, value: str) -> str:
        raise NotImplementedError("check_value() parses a params string, naming the field")

    def keys(self) -> str:
        return ", ".join(sorted(self.allowed))

    def describe(self) -> str:
        return f"key=value pairs joined by ':' with keys {self.keys()}"

    def examples(self) -> tuple[str, ...]:
        return tuple(f"{k}={rule.examples()[-1]}" for k, rule in self.allowed.items())


def join_params(pairs: Mapping[str, str]) -> str:
    return ":".join(f"{k}={v}" for k, v in pairs.items())


def split_params(value: str) -> dict[str, str]:
    """A params string the daemon wrote itself (already checked, or its own default)."""
    pairs: dict[str, str] = {}
    for piece in filter(None, value.split(":")):
        key, _, raw = piece.partition("=")
        pairs[key] = raw
    return pairs


def check_value(rule: OptionRule, value: str, field: str) -> str:
    """`value` checked against `rule` and rewritten; InvalidRequest naming `field` if not."""
    if isinstance(rule, Params):
        return join_params(rule.parse(value, field))
    if len(value) > MAX_VALUE or not _PLAIN_VALUE.fullmatch(value):
        raise InvalidRequest(
            field,
            f"{show(value)} is not a plain value: 1..{MAX_VALUE} of letters, digits, '.,+-'",
        )
    try:
        return rule.check(value)
    except Refused as exc:
        raise InvalidRequest(field, str(exc)) from None
