"""Which encoder options a client may set through `CodecOptions.extra`, and how.

FFmpeg takes any AVOption by name, and several of them make the encoder read or write
files wherever the daemon can (x264 `stats`, `flags=+pass1`, `x264-params dump-yuv=...`,
x265 `csv=...`). So nothing is passed through: each encoder has an allow-list of named
options with typed, range-checked values, and each `*-params` string is parsed, checked
key by key against its own allow-list and written out again from the checked values.
A value is only ever letters, digits and `.,+-`, so it cannot name a path or smuggle a
further `key=value` past the parser. Values are checked one by one; a combination the
encoder itself refuses (x265: rc-lookahead must exceed bframes) fails when it opens, as
an InvalidRequest on `codec` like any other rejected option.

`ALLOWED` is the whole policy; `KNOWN_DANGEROUS` and `KNOWN_DANGEROUS_PARAMS` list real
option names that must stay refused, for tests and fuzzers to aim at.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .errors import InvalidRequest

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
class Int(OptionRule):
    lo: int
    hi: int

    def check(self, value: str) -> str:
        if not _INT.fullmatch(value) or not self.lo <= int(value) <= self.hi:
            raise self._refuse(value)
        return str(int(value))

    def describe(self) -> str:
        return f"an integer in {self.lo}..{self.hi}"

    def examples(self) -> tuple[str, ...]:
        return (str(self.lo), str(self.hi))


@dataclass(frozen=True)
class Float(OptionRule):
    lo: float
    hi: float

    def check(self, value: str) -> str:
        if not _FLOAT.fullmatch(value) or not self.lo <= float(value) <= self.hi:
            raise self._refuse(value)
        text = f"{float(value):.6f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text

    def describe(self) -> str:
        return f"a number in {self.lo:g}..{self.hi:g}"

    def examples(self) -> tuple[str, ...]:
        return (f"{self.lo:g}", f"{(self.lo + self.hi) / 2:g}", f"{self.hi:g}")


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

    first: Int | Float
    second: Int | Float

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


# -- the policy ----------------------------------------------------------------------------

# Shared shapes. GOP lengths follow CodecOptions.gop's 1..100000.
GOP = Int(1, 100_000)
BFRAMES = Int(0, 16)
REFS = Int(1, 16)
HEVC_REFS = Int(1, 8)  # x265 takes up to 16 but refuses more than HEVC's 8 at open
LOOKAHEAD = Int(0, 250)
DEBLOCK = Pair(Int(-6, 6), Int(-6, 6))
AQ_STRENGTH = Float(0, 3)
VBV_KBPS = Int(1, 2_000_000)
MAXRATE_BPS = Int(10_000, 2_000_000_000)

X264_TUNES = (
    "film", "animation", "grain", "stillimage", "psnr", "ssim", "fastdecode", "zerolatency",
)  # fmt: skip
X264_LEVELS = (
    "1", "1b", "1.1", "1.2", "1.3", "2", "2.1", "2.2", "3", "3.1", "3.2",
    "4", "4.1", "4.2", "5", "5.1", "5.2", "6", "6.1", "6.2",
)  # fmt: skip

X264_PARAMS: dict[str, OptionRule] = {
    "keyint": GOP,
    "min-keyint": GOP,
    "scenecut": Int(0, 100),
    "bframes": BFRAMES,
    "b-adapt": Int(0, 2),
    "b-pyramid": OneOf(("none", "strict", "normal")),
    "ref": REFS,
    "rc-lookahead": LOOKAHEAD,
    "aq-mode": Int(0, 3),
    "aq-strength": AQ_STRENGTH,
    "psy": Bool(),
    "psy-rd": Pair(Float(0, 5), Float(0, 5)),
    "deblock": DEBLOCK,
    "weightb": Bool(),
    "weightp": Int(0, 2),
    "mbtree": Bool(),
    "me": OneOf(("dia", "hex", "umh", "esa", "tesa")),
    "subme": Int(0, 11),
    "merange": Int(4, 1024),
    "trellis": Int(0, 2),
    "8x8dct": Bool(),
    "cabac": Bool(),
    "open-gop": Bool(),
    "intra-refresh": Bool(),
    "vbv-maxrate": VBV_KBPS,
    "vbv-bufsize": VBV_KBPS,
}

X265_PARAMS: dict[str, OptionRule] = {
    "keyint": GOP,
    "min-keyint": GOP,
    "scenecut": Int(0, 100),
    "bframes": BFRAMES,
    "b-adapt": Int(0, 2),
    "b-pyramid": Bool(),
    "ref": HEVC_REFS,
    "rc-lookahead": LOOKAHEAD,
    "aq-mode": Int(0, 4),
    "aq-strength": AQ_STRENGTH,
    "psy-rd": Float(0, 5),
    "psy-rdoq": Float(0, 50),
    "rd": Int(1, 6),
    "subme": Int(0, 7),
    "me": OneOf(("dia", "hex", "umh", "star", "sea", "full")),
    "merange": Int(4, 1024),
    "sao": Bool(),
    "deblock": DEBLOCK,
    "strong-intra-smoothing": Bool(),
    "open-gop": Bool(),
    "weightp": Bool(),
    "weightb": Bool(),
    "limit-refs": Int(0, 3),
    "rect": Bool(),
    "amp": Bool(),
    "tu-intra-depth": Int(1, 4),
    "tu-inter-depth": Int(1, 4),
    "ctu": OneOf(("16", "32", "64")),
    "min-cu-size": OneOf(("8", "16", "32")),
    "cutree": Bool(),
    "vbv-maxrate": VBV_KBPS,
    "vbv-bufsize": VBV_KBPS,
}

SVTAV1_PARAMS: dict[str, OptionRule] = {
    "tune": Int(0, 2),  # 0 visual quality, 1 PSNR, 2 SSIM
    "keyint": GOP,
    "irefresh-type": Int(1, 2),
    "lookahead": Int(0, 120),
    "scd": Bool(),
    "enable-tf": Int(0, 2),
    "enable-overlays": Bool(),
    "film-grain": Int(0, 50),  # synthesised grain; the table-file variant is refused
    "film-grain-denoise": Bool(),
    "enable-qm": Bool(),
    "qm-min": Int(0, 15),
    "qm-max": Int(0, 15),
    "sharpness": Int(-7, 7),
    "aq-mode": Int(0, 2),
    "enable-variance-boost": Bool(),
    "variance-boost-strength": Int(1, 4),
    "fast-decode": Int(0, 2),
    "tile-rows": Int(0, 6),
    "tile-columns": Int(0, 4),
    "enable-cdef": Bool(),
    "enable-dlf": Int(0, 2),
    "enable-restoration": Bool(),
    "hierarchical-levels": Int(2, 5),
    "min-qp": Int(1, 63),
    "max-qp": Int(1, 63),
}

ALLOWED: dict[str, dict[str, OptionRule]] = {
    "libx264": {
        "tune": SomeOf(X264_TUNES),
        "profile": OneOf(("baseline", "main", "high", "high10", "high422", "high444")),
        "level": OneOf(X264_LEVELS),
        "g": GOP,
        "keyint_min": GOP,
        "bf": BFRAMES,
        "refs": REFS,
        "sc_threshold": Int(0, 100),
        "rc-lookahead": LOOKAHEAD,
        "aq-mode": Int(0, 3),
        "aq-strength": AQ_STRENGTH,
        "b-pyramid": OneOf(("none", "strict", "normal")),
        "weightp": OneOf(("none", "simple", "smart")),
        "weightb": Bool(),
        "psy": Bool(),
        "psy-rd": Pair(Float(0, 5), Float(0, 5)),
        "deblock": DEBLOCK,
        "direct-pred": OneOf(("none", "spatial", "temporal", "auto")),
        "motion-est": OneOf(("dia", "hex", "umh", "esa", "tesa")),
        "coder": OneOf(("cavlc", "cabac")),
        "intra-refresh": Bool(),
        "forced-idr": Bool(),
        "maxrate": MAXRATE_BPS,
        "bufsize": MAXRATE_BPS,
        "x264-params": Params(X264_PARAMS),
    },
    "libx265": {
        "tune": OneOf(("psnr", "ssim", "grain", "zerolatency", "fastdecode", "animation")),
        "profile": OneOf(("main", "main-intra", "mainstillpicture", "main10")),
        "g": GOP,
        "keyint_min": GOP,
        "bf": BFRAMES,
        "refs": HEVC_REFS,
        "forced-idr": Bool(),
        "maxrate": MAXRATE_BPS,
        "bufsize": MAXRATE_BPS,
        "x265-params": Params(X265_PARAMS),
    },
    "libsvtav1": {
        "g": GOP,
        "svtav1-params": Params(SVTAV1_PARAMS),
    },
    "libvpx-vp9": {
        "g": GOP,
        "keyint_min": GOP,
        "cpu-used": Int(-8, 8),
        "row-mt": Bool(),
        "tile-columns": Int(0, 6),
        "tile-rows": Int(0, 2),
        "lag-in-frames": Int(0, 25),
        "auto-alt-ref": Int(0, 6),
        "arnr-maxframes": Int(0, 15),
        "arnr-strength": Int(0, 6),
        "aq-mode": Int(0, 4),
        "tune-content": OneOf(("default", "screen", "film")),
        "sharpness": Int(0, 7),
        "enable-tpl": Bool(),
        "frame-parallel": Bool(),
    },
}

# Real option names that stay refused: they name files (stats, logs, dumps, analysis,
# tables), switch on multi-pass, bypass the checks (x264opts, flags), or take over what the
# daemon decides (threads, bitrate, colour tags, log level).
_GENERIC_DANGEROUS = (
    "flags", "flags2", "b", "threads", "thread_type", "debug", "dump_separator",
    "codec_whitelist", "strict", "export_side_data", "color_primaries", "color_trc",
    "colorspace", "color_range", "pixel_format", "video_size", "max_pixels", "crf",
)  # fmt: skip
KNOWN_DANGEROUS: dict[str, tuple[str, ...]] = {
    "libx264": (
        *_GENERIC_DANGEROUS, "preset", "stats", "passlogfile", "x264opts", "fastfirstpass",
        "ssim", "qp",
    ),
    "libx265": (*_GENERIC_DANGEROUS, "preset", "x265-stats", "dolbyvision", "qp"),
    "libsvtav1": (*_GENERIC_DANGEROUS, "preset", "dolbyvision", "qp"),
    "libvpx-vp9": (
        *_GENERIC_DANGEROUS, "deadline", "quality", "speed", "ts-parameters", "vp8flags",
        "error-resilient",
    ),
}  # fmt: skip
KNOWN_DANGEROUS_PARAMS: dict[str, tuple[str, ...]] = {
    "libx264": (
        "stats", "pass", "dump-yuv", "cqmfile", "qpfile", "tcfile-in", "tcfile-out",
        "opencl", "opencl-clbin", "psnr", "ssim", "threads", "lookahead-threads",
        "sliced-threads", "log", "quiet", "verbose", "annexb", "fps", "timebase",
        "colorprim", "transfer", "colormatrix", "input-range", "range",
    ),
    "libx265": (
        "csv", "csv-log-level", "analysis-save", "analysis-load", "analysis-reuse-file",
        "dolby-vision-rpu", "dhdr10-info", "zonefile", "pass", "stats", "qpfile",
        "scaling-list", "lambda-file", "film-grain", "log-level", "frame-threads", "pools",
        "numa-pools", "pme", "pmode", "wpp", "lookahead-threads", "annexb", "repeat-headers",
        "psnr", "ssim", "recon", "colorprim", "transfer", "colormatrix", "range",
    ),
    "libsvtav1": (
        "pass", "stats", "stat-file", "fgs-table", "enable-stat-report", "lp", "pin", "ss",
        "rc", "tbr", "mbr", "crf", "qp", "preset", "color-primaries",
        "transfer-characteristics", "matrix-coefficients", "color-range",
    ),
    "libvpx-vp9": (),
}  # fmt: skip


def allowed_names(encoder: str) -> str:
    return ", ".join(sorted(ALLOWED[encoder]))


def check_extra(encoder: str, extra: Collection[tuple[str, str]]) -> dict[str, str]:
    """The client's extra options for `encoder`, each one allowed, checked and rewritten;
    InvalidRequest naming the first that is not."""
    if len(extra) > MAX_OPTIONS:
        raise InvalidRequest("codec.extra", f"at most {MAX_OPTIONS} options")
    allowed = ALLOWED[encoder]
    checked: dict[str, str] = {}
    for key, value in extra:
        where = f"codec.extra[{field_name(key)}]"
        rule = allowed.get(key) if len(key) <= MAX_NAME else None
        if rule is None:
            raise InvalidRequest(
                where,
                f"{show(key)} is not an allowed {encoder} option; use {allowed_names(encoder)}",
            )
        if key in checked:
            raise InvalidRequest(where, "given twice")
        checked[key] = check_value(rule, value, where)
    return {k: v for k, v in checked.items() if v}  # an empty params string says nothing


def merge_options(
    encoder: str, defaults: Mapping[str, str], extra: Collection[tuple[str, str]]
) -> dict[str, str]:
    """The daemon's `defaults` overlaid with the client's checked options. A client's params
    string is merged with the daemon's own, whose keys win (x265 stays at log-level=error)."""
    options = dict(defaults)
    for key, value in check_extra(encoder, extra).items():
        ours = options.get(key)
        if ours is not None and isinstance(ALLOWED[encoder][key], Params):
            options[key] = join_params({**split_params(value), **split_params(ours)})
        else:
            options[key] = value
    return options
