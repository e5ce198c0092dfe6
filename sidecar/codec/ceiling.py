"""The daemon's ceiling on encoder cost: the slowest preset and the longest lookahead a
request may ask for, whatever the allow-list takes; an operator raises them with
--max-preset and --max-lookahead."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import InvalidRequest
from .codec_options import LOOKAHEAD
from .codec_rules import split_params

# x264's and x265's presets, fastest first: the rungs `CostCeiling.max_preset` names one of.
PRESET_LADDER = (
    "ultrafast", "superfast", "veryfast", "faster", "fast",
    "medium", "slow", "slower", "veryslow", "placebo",
)  # fmt: skip
# Each encoder's presets on that ladder, by what they cost. SVT-AV1's run from 13
# (fastest) to -1; its research presets 0 and -1, and 1, cost more than x264's placebo.
# VP9's `deadline` best is its slowest mode whatever cpu-used says.
PRESET_RUNGS: dict[str, dict[str, int]] = {
    "libx264": {name: rung for rung, name in enumerate(PRESET_LADDER)},
    "libx265": {name: rung for rung, name in enumerate(PRESET_LADDER)},
    "libsvtav1": {
        "13": 0, "12": 1, "11": 2, "10": 3, "9": 4, "8": 5, "7": 6, "6": 6, "5": 7,
        "4": 7, "3": 8, "2": 8, "1": 9, "0": 9, "-1": 9,
    },
    "libvpx-vp9": {"realtime": 0, "good": 5, "best": 9},
}  # fmt: skip
# The options that make an encoder hold frames back to look ahead: (option, params key).
LOOKAHEAD_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "libx264": (("rc-lookahead", ""), ("x264-params", "rc-lookahead")),
    "libx265": (("x265-params", "rc-lookahead"),),
    "libsvtav1": (("svtav1-params", "lookahead"),),
    "libvpx-vp9": (("lag-in-frames", ""),),
}
# The slowest preset every test and known client asks for; x264's own presets look at
# most 60 frames ahead (placebo, veryslow, slower), x265's as far (placebo).
DEFAULT_MAX_PRESET = "veryslow"
DEFAULT_MAX_LOOKAHEAD = 60
MAX_LOOKAHEAD = LOOKAHEAD.hi  # what the allow-list takes anyway


def parse_max_preset(text: str) -> str:
    """`--max-preset`: a name on `PRESET_LADDER`."""
    name = str(text).strip().lower()
    if name not in PRESET_LADDER:
        raise ValueError(f"not a preset: {text!r} (use one of {', '.join(PRESET_LADDER)})")
    return name


def parse_max_lookahead(text: str) -> int:
    """`--max-lookahead`: frames, 0 to `MAX_LOOKAHEAD`."""
    try:
        frames = int(str(text).strip())
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None
    if not 0 <= frames <= MAX_LOOKAHEAD:
        raise ValueError(f"{frames} is outside 0..{MAX_LOOKAHEAD} frames")
    return frames


@dataclass(frozen=True)
class CostCeiling:
    """The most an encode may ask its encoder to spend, whatever the allow-list takes.

    A slow preset and a long lookahead cost CPU all through an encode, and most of all in
    its final drain: x264 at placebo with rc-lookahead=250 drained 200 frames of 256x144
    noise for 46-70 s on two cores, holding an encode slot all along. The drain stops
    between packets when its client leaves (`encoder.drain`), but one packet's wait grows
    with the preset, the lookahead and the frame size, and nothing on an encoder thread
    cuts it short (an encoder process is killed instead). On the 2-core machine the first
    packet of 640x480 noise took 3.1 s at placebo with rc-lookahead=250 and 1.0 s at
    veryslow with 60; of 1280x720 at veryslow with 60, 3.1 s. Requests over the ceiling
    are refused, naming the field and the flag that raises it."""

    max_preset: str = DEFAULT_MAX_PRESET
    max_lookahead: int = DEFAULT_MAX_LOOKAHEAD

    def __post_init__(self) -> None:
        parse_max_preset(self.max_preset)
        parse_max_lookahead(str(self.max_lookahead))

    def check(self, encoder: str, preset: str, options: Mapping[str, str]) -> None:
        """InvalidRequest if `preset` or `options` (checked already) go over the ceiling."""
        self._check_preset(encoder, preset)
        for name, key in LOOKAHEAD_OPTIONS.get(encoder, ()):
            value = options.get(name)
            if value is None:
                continue
            where = f"codec.extra[{name}]"
            if key:
                value, where = split_params(value).get(key), f"{where}.{key}"
            if value is not None and int(value) > self.max_lookahead:
                raise InvalidRequest(
                    where,
                    f"{value} frames is over this daemon's lookahead ceiling of "
                    f"{self.max_lookahead}; use at most that, or have the operator raise "
                    "--max-lookahead",
                )

    def _check_preset(self, encoder: str, preset: str) -> None:
        rungs = PRESET_RUNGS.get(encoder, {})
        most = PRESET_LADDER.index(self.max_preset)
        if rungs.get(preset, 0) <= most:
            return
        allowed = [name for name, rung in rungs.items() if rung <= most]
        raise InvalidRequest(
            "codec.preset",
            f"{preset!r} is slower than this daemon's ceiling ({self.max_preset}); use one "
            f"of {', '.join(allowed)}, or have the operator raise --max-preset",
        )
