"""What an encode asks for besides the frames, and the request messages built from it.

`EncodeOptions` is the parameter set `encode`, `stream` and `encode_leased` share, defined
once here and built by one function, `EncodeOptions.of`. The public methods list the same
parameters explicitly (for signatures, IDEs and mypy); tests/test_api.py checks that they
agree with these fields: names, defaults and types.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import numbers
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import (
    CONTAINERS,
    DEFAULT_CONTAINER,
    PIXEL_FORMATS,
    FileNameError,
    extension,
    file_container,
)

from ._checks import of_type, whole
from ._errors import InvalidArgument, OutOfRange
from ._live import Live, live_of, live_proto
from ._previews import SpriteSheet, Thumbnail, check_asked, previews_proto
from ._types import FrameRange, Lease

Fps = float | Fraction | tuple[int, int]
INT64 = (-(2**63), 2**63 - 1)  # what the request's int64 fields hold; the daemon judges more


def new_request_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class EncodeOptions:
    """Everything about an encode except the frames; see `SidecarClient.encode`."""

    fps: Fps = 24
    path: str | os.PathLike[str] | None = None  # a str once made (`__post_init__`)
    overwrite: bool = False
    # mp4, fmp4 (fragmented, streamed back) or webm; "": a file's extension says, else
    # mp4 (`wire_container`)
    container: str = ""
    codec: str = ""  # empty: the container's default (h264, or vp9 in WebM)
    crf: int | None = None
    preset: str | None = None
    # a named set of settings: "fast", "balanced", "small"; None: the daemon's default
    profile: str | None = None
    bitrate: int | None = None  # bits per second, instead of crf's constant quality
    gop: int | None = None
    threads: int = 0
    extra: Mapping[str, Any] | None = None
    request_id: str = ""  # empty: one made up here, so a retried request keeps its id
    # Still images beside the video (`_previews`); True: the daemon's defaults.
    thumbnail: Thumbnail | bool | None = None
    sprite_sheet: SpriteSheet | bool | None = None
    # A live LL-HLS/CMAF package beside the output (`_live`): a folder, or a `Live`.
    live: Live | str | os.PathLike[str] | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> EncodeOptions:
        """The options among a public method's arguments (its `locals()` on entry)."""
        return cls(**{f.name: arguments[f.name] for f in dataclasses.fields(cls)})

    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):  # pathlib.Path and friends, as a string
            object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "live", live_of(self.live))
        self.check()
        if not self.request_id:
            object.__setattr__(self, "request_id", new_request_id())

    def check(self) -> None:
        """Refuse, naming the parameter, what cannot even be put into a request (a wrong
        type, NaN, a number the field cannot hold); the daemon judges the rest."""
        fps_rational(self.fps)
        for name in ("container", "codec", "request_id"):
            of_type(name, getattr(self, name), str, "a string")
        for name in ("path", "preset", "profile"):
            if getattr(self, name) is not None:
                of_type(name, getattr(self, name), str, "a string or None")
        of_type("overwrite", self.overwrite, bool, "True or False")
        for name in ("crf", "gop"):
            if getattr(self, name) is not None:
                whole(name, getattr(self, name), -(2**31), 2**31 - 1)
        whole("threads", self.threads, 0, 2**32 - 1)
        if self.bitrate is not None:
            whole("bitrate", self.bitrate, 1, 2**64 - 1)
        if self.extra is not None:
            of_type("extra", self.extra, Mapping, "a mapping of option names to values")
        check_asked(self.thumbnail, self.sprite_sheet)
        self.wire_container()

    @property
    def file_path(self) -> str | None:
        """`path` as the request carries it: a str (a path-like one was made one)."""
        return None if self.path is None else os.fspath(self.path)

    def wire_container(self) -> str:
        """The container the request names: `container`, where a file's name agrees with
        it; none given, the file's extension says (`path="x.webm"` is WebM), and bytes are
        MP4. "" names none: a file without extension, which the daemon refuses once it
        has looked at what is in the way (a directory of that name, say)."""
        if self.container and self.container not in CONTAINERS:
            raise InvalidArgument(f"container {self.container!r}: use {', '.join(CONTAINERS)}")
        path = self.file_path
        if path is None:
            return self.container or DEFAULT_CONTAINER
        named = self.container
        if not extension(path):
            return named
        try:
            return file_container(path, named)
        except FileNameError as exc:
            raise InvalidArgument(str(exc)) from None

    def request(
        self,
        token: str,
        frames: VideoGeometry,
        ranges: Sequence[FrameRange],
        *,
        next_lease_bytes: int = 0,
        audio: pb.AudioSpec | None = None,
        audio_data: list[pb.AudioData] | None = None,
    ) -> pb.EncodeRequest:
        """An Encode request for frames already in leases."""
        return pb.EncodeRequest(
            client_token=token,
            request_id=self.request_id,
            video=pb.VideoDescriptor(
                width=frames.width,
                height=frames.height,
                pixel_format=pixel_format_proto(frames.pixel_format),
                fps=fps_rational(self.fps),
                ranges=[
                    pb.FrameRange(
                        lease_id=r.lease_id,
                        offset=r.offset,
                        frame_count=r.frame_count,
                        row_stride=r.row_stride,
                        frame_stride=r.frame_stride,
                    )
                    for r in ranges
                ],
            ),
            codec=self.codec_proto(),
            output=self.output_proto(),
            next_lease_bytes=next_lease_bytes,
            audio=audio,
            audio_data=audio_data or [],
            previews=previews_proto(self.thumbnail, self.sprite_sheet),
            live=live_proto(live_of(self.live)),
        )

    def header(
        self,
        token: str,
        frames: VideoGeometry,
        audio: pb.AudioSpec | None = None,
        audio_data: list[pb.AudioData] | None = None,
        frames_total: int = 0,
    ) -> pb.StreamRequest:
        """The first message of a stream; `frames_total`: the length of a whole video sent
        as one (0: unknown until its end)."""
        fps = fps_rational(self.fps)
        known = (frames_total, fps) if frames_total else None
        return pb.StreamRequest(
            header=pb.StreamHeader(
                client_token=token,
                request_id=self.request_id,
                width=frames.width,
                height=frames.height,
                pixel_format=pixel_format_proto(frames.pixel_format),
                fps=fps,
                codec=self.codec_proto(),
                output=self.output_proto(),
                audio=audio,
                audio_data=audio_data or [],
                previews=previews_proto(self.thumbnail, self.sprite_sheet, known),
                live=live_proto(live_of(self.live)),
            )
        )

    def codec_proto(self) -> pb.CodecOptions:
        options = pb.CodecOptions(
            codec=self.codec,
            preset=self.preset or "",
            profile=self.profile or "",
            threads=self.threads,
            extra={str(k): str(v) for k, v in (self.extra or {}).items()},
        )
        if self.crf is not None:
            options.crf = self.crf
        if self.gop is not None:
            options.gop = self.gop
        if self.bitrate is not None:
            options.bitrate = self.bitrate
        return options

    def output_proto(self) -> pb.OutputSpec:
        named = self.wire_container()
        container = cast("pb.Container", CONTAINERS[named] if named else 0)
        if self.file_path is not None:
            return pb.OutputSpec(
                file=pb.FileOutput(path=self.file_path, overwrite=self.overwrite),
                container=container,
            )
        return pb.OutputSpec(bytes=pb.BytesOutput(), container=container)


@dataclass(frozen=True)
class VideoGeometry:
    """The size and wire format of every frame of one request."""

    width: int
    height: int
    pixel_format: str


@dataclass(frozen=True)
class VideoFormat:
    """How to read the caller's frames: see `prepare_video`."""

    pixel_format: str | None = None
    layout: str | None = None
    value_range: tuple[float, float] = (0, 1)


def pixel_format_proto(name: str) -> pb.PixelFormat:
    """The proto value of a pixel format; an unknown name is left for the daemon to refuse."""
    known = PIXEL_FORMATS.get(name)
    return cast("pb.PixelFormat", known.proto if known is not None else 0)


def fps_rational(fps: Fps) -> pb.Rational:
    """`fps` as the request's rational; InvalidArgument for what cannot be one. Any real
    number goes (int, float, `Fraction`, `Decimal`, numpy's scalars), or (num, den)."""
    if isinstance(fps, tuple):
        if len(fps) != 2:
            raise InvalidArgument(f"fps as a tuple is (numerator, denominator), got {fps!r}")
        num, den = (whole("fps", part, *INT64) for part in fps)
        return pb.Rational(num=num, den=den)
    if isinstance(fps, bool) or not isinstance(fps, (numbers.Real, decimal.Decimal)):
        raise InvalidArgument(f"fps must be a number or (num, den), got {fps!r}"[:200])
    if isinstance(fps, numbers.Rational):  # int, Fraction, numpy's integers: exact
        rate = Fraction(int(fps.numerator), int(fps.denominator))
    elif isinstance(fps, decimal.Decimal):
        rate = Fraction(fps) if fps.is_finite() else Fraction(0)
    else:  # float, numpy's floats: the nearest rate of a small denominator (30000/1001)
        value = float(fps)
        if not math.isfinite(value):
            raise InvalidArgument(f"fps must be a finite positive number, got {fps!r}")
        rate = Fraction(value)
    if rate <= 0:
        raise InvalidArgument(f"fps must be a finite positive number, got {fps!r}")
    rate = rate.limit_denominator(1001 * 1000)
    if rate.numerator == 0:
        raise InvalidArgument(f"fps {fps!r} is too small to encode")
    if rate.numerator > INT64[1]:
        raise InvalidArgument(f"fps {fps!r} is too large to encode")
    return pb.Rational(num=rate.numerator, den=rate.denominator)


def check_timeout(timeout: Any, name: str = "timeout") -> None:
    """None (the client's default), or a finite number of seconds over 0."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidArgument(f"{name} must be a number of seconds or None, got {timeout!r}")
    if not (math.isfinite(seconds := float(timeout)) and seconds > 0):
        raise InvalidArgument(f"{name} must be a finite number of seconds over 0, got {timeout!r}")


def check_leased(ranges: Any, width: Any, height: Any) -> None:
    """`encode_leased`'s frames: FrameRanges of whole numbers, and a whole size."""
    if not isinstance(ranges, Sequence):
        raise InvalidArgument(f"ranges must be a list of FrameRange, got {ranges!r}")
    for r in ranges:
        if not isinstance(r, FrameRange) or not isinstance(r.lease, Lease | str):
            raise InvalidArgument(f"ranges must hold FrameRange(lease, frame_count), got {r!r}")
        for name in ("frame_count", "offset", "row_stride", "frame_stride"):
            whole(f"FrameRange.{name}", getattr(r, name), *INT64)
    whole("width", width, *INT64)
    whole("height", height, *INT64)


def check_lease(nbytes: Any, wait: Any) -> None:
    """`lease(nbytes, wait=)`: a whole number of bytes over 0 (OutOfRange, as the daemon
    says it, for 0 and less), a wait of seconds (0: do not wait) or None."""
    if whole("nbytes", nbytes, INT64[0], 2**64 - 1) <= 0:
        raise OutOfRange(f"lease size must be positive, got {nbytes}")
    if wait is not None and wait != 0:
        check_timeout(wait, "wait")


def check_callbacks(timeout: Any = None, **callbacks: Any) -> None:
    """A public call's `timeout` and its callbacks (each None or callable)."""
    check_timeout(timeout)
    for name, callback in callbacks.items():
        if callback is not None and not callable(callback):
            raise InvalidArgument(f"{name} must be callable or None, got {callback!r}")
