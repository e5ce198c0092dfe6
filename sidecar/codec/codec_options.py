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

What the allow-list lets through may still cost more than a daemon wants to spend on one
request: `CostCeiling` is the operator's limit on the preset and the lookahead
(`--max-preset`, `--max-lookahead`), checked by the daemon on top of the allow-list.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..errors import InvalidRequest
from .codec_rules import (
    MAX_NAME,
    MAX_OPTIONS,
    Bool,
    Float,
    Int,
    OneOf,
    OptionRule,
    Pair,
    Params,
    SomeOf,
    check_value,
    field_name,
    join_params,
    show,
    split_params,
)

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
