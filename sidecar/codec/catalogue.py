"""The codecs the daemon offers and what a request may ask of them: a `CodecSpec` as the
client sent it, checked and completed into a `ResolvedCodec`. No PyAV here: the planner
and the face read the catalogue without loading the encoder."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import InvalidRequest
from ..vocabulary import DEFAULT_PROFILE, H264_PROFILE_CRF, PROFILES, h264_profile_crf
from .ceiling import PRESET_LADDER, CostCeiling
from .codec_options import merge_options
from .codec_rules import join_params, split_params

X26X_PRESETS = PRESET_LADDER


SVT_AV1_PRESETS = tuple(str(n) for n in range(-1, 14))


VP9_DEADLINES = ("realtime", "good", "best")


@dataclass(frozen=True)
class Profile:
    """A codec's settings under one profile's name: the preset, the CRF and the encoder
    options a request that names none of them gets (each one it names wins)."""

    preset: str
    crf: int
    extra: Mapping[str, str] = field(default_factory=dict)
    # Over `extra`, for a video whose first frame is grainy (see codec/grain.py).
    grain: Mapping[str, str] = field(default_factory=dict)


# "balanced" is the default (`--profile`): chosen by the rate-distortion-time suite
# (`bench/rdt.py`, docs/performance.md) to make files no larger than 1.25x what diffusers'
# export_to_video makes of the same frames, at its PSNR within 0.3 dB, in the least time.
# "fast" is the speed of old, at several times the size; "small" spends more time for
# files smaller than export_to_video's. The names and H.264's CRFs are the vocabulary's.
# H.265, AV1 and VP9 were not calibrated so: "fast" and "balanced" keep the settings they
# always had, and "small" takes a slower preset at the same CRF.


@dataclass(frozen=True)
class CodecChoice:
    name: str
    encoder: str
    presets: tuple[str, ...]
    profiles: Mapping[str, Profile]
    max_crf: int
    quiet: Mapping[str, str] = field(default_factory=dict)
    preset_option: str = "preset"
    containers: tuple[str, ...] = ("mp4", "fmp4")
    min_size: int = 2  # the smallest width and height it is given


def _profiles(fast: Profile, balanced: Profile, small: Profile) -> dict[str, Profile]:
    return dict(zip(PROFILES, (fast, balanced, small), strict=True))


CODECS: dict[str, CodecChoice] = {
    "h264": CodecChoice(
        "h264",
        "libx264",
        X26X_PRESETS,
        _profiles(
            Profile("ultrafast", H264_PROFILE_CRF["fast"]),
            # aq-strength below x264's 1.0: fewer bits moved into flat areas, which on
            # generated video bought size at no cost in PSNR or SSIM (bench/rdt.py).
            # Grain takes x264's full strength and a finer motion search instead: with
            # the others' settings it lost 0.5-0.6 dB to export_to_video at its size.
            Profile(
                "veryfast",
                H264_PROFILE_CRF["balanced"],
                {"aq-strength": "0.7"},
                {"aq-strength": "1.0", "x264-params": "subme=6"},
            ),
            Profile("slow", H264_PROFILE_CRF["small"]),
        ),
        51,
    ),
    # x265 corrupts its heap now and then on frames narrower than its 64-pixel coding
    # tree unit (40 and 48 pixels wide, at every preset: glibc aborts the process).
    "h265": CodecChoice(
        "h265",
        "libx265",
        X26X_PRESETS,
        _profiles(Profile("ultrafast", 20), Profile("ultrafast", 20), Profile("medium", 20)),
        51,
        {"x265-params": "log-level=error"},
        min_size=64,
    ),
    # SVT-AV1 refuses a side of 2 pixels when it opens; said up front, it names the side.
    "av1": CodecChoice(
        "av1",
        "libsvtav1",
        SVT_AV1_PRESETS,
        _profiles(Profile("10", 30), Profile("10", 30), Profile("7", 30)),
        63,
        min_size=4,
    ),
    # Constant quality needs b=0 (a bitrate replaces it); row-mt and cpu-used 8 keep
    # realtime VP9 fast.
    "vp9": CodecChoice(
        "vp9",
        "libvpx-vp9",
        VP9_DEADLINES,
        _profiles(
            Profile("realtime", 32, {"cpu-used": "8"}),
            Profile("realtime", 32, {"cpu-used": "8"}),
            Profile("good", 32, {"cpu-used": "4"}),
        ),
        63,
        {"b": "0", "row-mt": "1"},
        preset_option="deadline",
        containers=("webm",),
    ),
}

MIN_BITRATE, MAX_BITRATE = 10_000, 2_000_000_000  # bits per second


CONTAINERS = {"mp4": "mp4", "fmp4": "mp4", "webm": "webm"}


AUDIO_CODECS = {"mp4": "aac", "fmp4": "aac", "webm": "libopus"}


DEFAULT_CODEC = {"mp4": "h264", "fmp4": "h264", "webm": "vp9"}


ALIASES = {
    "libvpx-vp9": "vp9",
    "avc": "h264",
    "x264": "h264",
    "libx264": "h264",
    "hevc": "h265",
    "x265": "h265",
    "libx265": "h265",
    "libsvtav1": "av1",
    "svtav1": "av1",
}


@dataclass(frozen=True)
class CodecSpec:
    """What the client asked for; `resolve()` checks it and fills in defaults."""

    codec: str = ""  # empty: the container's default (h264 in MP4, vp9 in WebM)
    crf: int | None = None
    preset: str = ""
    gop: int | None = None
    threads: int = 0
    extra: tuple[tuple[str, str], ...] = ()
    bitrate: int | None = None  # bits per second, instead of constant quality
    profile: str = ""  # empty: the daemon's default profile

    def resolve(
        self,
        container: str = "mp4",
        ceiling: CostCeiling | None = None,
        default_profile: str = DEFAULT_PROFILE,
        video: tuple[int, int, int] = (0, 0, 0),
    ) -> ResolvedCodec:
        """The settings, checked; and, with a `ceiling` (the daemon's), within it. What the
        request leaves unsaid, its profile (else `default_profile`) says, for a `video` of
        (width, height, frames) (0: not known)."""
        key = self.codec.strip().lower() or DEFAULT_CODEC[container]
        choice = CODECS.get(ALIASES.get(key, key))
        if choice is None:
            raise InvalidRequest(
                "codec.codec", f"unknown codec {self.codec[:32]!r}; use one of {', '.join(CODECS)}"
            )
        if container not in choice.containers:
            raise InvalidRequest(
                "codec.codec",
                f"{choice.name} does not go in {container}; use {DEFAULT_CODEC[container]}",
            )
        named = self.profile or default_profile
        if named not in PROFILES:
            raise InvalidRequest(
                "codec.profile", f"unknown profile {named[:32]!r}; use one of {', '.join(PROFILES)}"
            )
        profile = choice.profiles[named]
        crf = profile.crf if self.crf is None else self.crf
        if self.crf is None and choice.name == "h264":
            crf = h264_profile_crf(named, *video)
        if not 0 <= crf <= choice.max_crf:
            raise InvalidRequest(
                "codec.crf", f"{crf} is outside 0..{choice.max_crf} for {choice.name}"
            )
        if self.bitrate is not None:
            if self.crf is not None:
                raise InvalidRequest("codec.bitrate", "give crf or bitrate, not both")
            if not MIN_BITRATE <= self.bitrate <= MAX_BITRATE:
                raise InvalidRequest(
                    "codec.bitrate", f"{self.bitrate} is outside {MIN_BITRATE}..{MAX_BITRATE}"
                )
        preset = self.preset or profile.preset
        if preset not in choice.presets:
            raise InvalidRequest(
                "codec.preset",
                f"{preset[:40]!r} is not a {choice.encoder} preset; use one of "
                + ", ".join(choice.presets),
            )
        if self.gop is not None and not 1 <= self.gop <= 100_000:
            raise InvalidRequest("codec.gop", f"{self.gop} is outside 1..100000")
        if not 0 <= self.threads <= 256:
            raise InvalidRequest("codec.threads", f"{self.threads} is outside 0..256")
        # Only allow-listed options, checked and rewritten: see codec_options. The
        # profile's own options come under the request's.
        rate = {"crf": str(crf)} if self.bitrate is None else {"b": str(self.bitrate)}
        options = {
            choice.preset_option: preset,
            **beneath(merge_options(choice.encoder, choice.quiet, self.extra), profile.extra),
            **rate,  # after VP9's b=0, which a bitrate replaces
        }
        # The grain settings fill in only what the request left to the profile (a preset
        # it names has its own motion search).
        own = {key for key, _ in self.extra}
        grain = {} if self.preset else {k: v for k, v in profile.grain.items() if k not in own}
        if ceiling is not None:
            ceiling.check(choice.encoder, preset, options)
            if grain:
                ceiling.check(choice.encoder, preset, under_grain(options, grain))
        return ResolvedCodec(choice, options, self.gop, self.threads, grain)


def under_grain(options: Mapping[str, str], grain: Mapping[str, str]) -> dict[str, str]:
    """`options` with the grain settings over them; a params string's keys that `options`
    already name (the request's own) stay as they are."""
    merged = {**options, **grain}
    for key in grain:
        if key.endswith("-params") and key in options:
            merged[key] = join_params({**split_params(grain[key]), **split_params(options[key])})
    return merged


def beneath(options: dict[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """`options` over `defaults`: a params string merged key by key, the options' winning."""
    merged = dict(defaults)
    for key, value in options.items():
        if key in merged and key.endswith("-params"):
            merged[key] = join_params({**split_params(merged[key]), **split_params(value)})
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True)
class ResolvedCodec:
    choice: CodecChoice
    options: dict[str, str]
    gop: int | None
    threads: int
    grain: Mapping[str, str] = field(default_factory=dict)  # see measured

    def measured(self, grainy: bool) -> ResolvedCodec:
        """These settings once the video's first frame was measured (codec/grain.py): for
        grain, the profile's grain settings over them, where the request left those to it."""
        if not self.grain:
            return self
        options = under_grain(self.options, self.grain) if grainy else self.options
        return dataclasses.replace(self, options=options, grain={})

    def check_size(self, width: int, height: int) -> None:
        """InvalidRequest if the encoder is not to be given frames of this size."""
        least = self.choice.min_size
        for name, value in (("video.width", width), ("video.height", height)):
            if value < least:
                raise InvalidRequest(
                    name, f"{width}x{height}: {self.choice.name} needs {least}x{least} at least"
                )

    def for_frames(self, frames: int) -> ResolvedCodec:
        """These settings for a video of `frames` frames (0: not known yet). x265 with
        B-frames gives a clip of a few frames timestamps FFmpeg's MP4 muxer cannot
        write ("not yet implemented"): such clips are encoded without B-frames."""
        if self.choice.encoder != "libx265" or not 0 < frames <= SHORT_CLIP_FRAMES:
            return self
        params = split_params(self.options.get("x265-params", ""))
        options = {**self.options, "x265-params": join_params({**params, "bframes": "0"})}
        return dataclasses.replace(self, options=options)

    def for_live(self, keyframe_every: int) -> ResolvedCodec:
        """These settings for a live package: a keyframe exactly every `keyframe_every`
        frames, each segment starting with one (no scene-cut keyframes between; GOPs
        closed, as x264 makes them by default). B-frames and the profile's lookahead
        stay: without B-frames a grainy 832x480 stream was 2.5x the bytes at the same
        CRF, and without the lookahead (x264's zerolatency tune) 7.6x (2-core machine).
        A part is named as soon as its last packet leaves the encoder, which holds the
        lookahead's frames until more come."""
        options = {
            **self.options,
            "sc_threshold": "0",
            "keyint_min": str(keyframe_every),
        }
        return dataclasses.replace(self, options=options, gop=keyframe_every)


SHORT_CLIP_FRAMES = 8
