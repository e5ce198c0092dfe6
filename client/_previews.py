"""The still images an encode may ask for beside its video: a thumbnail and a sprite
sheet (docs/previews.md). Checked here for what a request field can hold; the daemon
judges ranges and limits, naming the request's field.

A stream's length is known only at its end, so there the daemon picks a thumbnail by
index, time, or as the first or last frame, and a sprite sheet's frames by `interval_s`.
A whole video the client sends as a stream (too large for the pool, or inline) knows its
length: its previews are put into the stream's header as the frames a whole request
would show (`previews_proto`'s `known`), so the way an encode travels never changes them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import FRAME_PICKS, IMAGE_FORMATS

from ._checks import UINT32, finite, one_of, whole
from ._errors import InvalidArgument, OutOfRange

FORMATS = tuple(IMAGE_FORMATS)  # jpeg, webp
PICKS = tuple(FRAME_PICKS)  # first, middle, last
# The daemon's (sidecar.proto): a sheet's `tiles` when left 0, and their most.
TILES_DEFAULT = 10
TILES_MAX = 100
STREAM_LENGTH = "which a stream learns only at its end"


@dataclass(frozen=True)
class Thumbnail:
    """One frame as a still image, scaled to fit `max_width` x `max_height` (its aspect
    kept, never enlarged).

    `at`: "first", "middle" or "last", a frame index (an int, from 0) or a time in
    seconds (a float: the frame shown then). None leaves a field to the daemon's
    default (640x360, quality 85). `format`: "jpeg" or "webp"; `quality`: 1-100.
    """

    at: str | int | float = "middle"
    max_width: int | None = None
    max_height: int | None = None
    format: str = "jpeg"
    quality: int | None = None

    def __post_init__(self) -> None:
        _check_at(self.at)
        for name in ("max_width", "max_height", "quality"):
            _counted(f"Thumbnail.{name}", getattr(self, name))
        one_of("Thumbnail.format", self.format, FORMATS)

    def proto(self) -> pb.Thumbnail:
        made = pb.Thumbnail(
            max_width=self.max_width or 0,  # 0 on the wire: the daemon's default
            max_height=self.max_height or 0,
            format=cast("pb.ImageFormat", IMAGE_FORMATS[self.format]),
            quality=self.quality or 0,
        )
        if isinstance(self.at, str):
            made.pick = cast("pb.FramePick", FRAME_PICKS[self.at])
        elif isinstance(self.at, numbers.Integral):
            made.index = int(self.at)
        else:
            made.time_s = float(self.at)
        return made


@dataclass(frozen=True)
class SpriteSheet:
    """Frames of the video as tiles in one image, `tile_width` pixels wide, `columns` to
    a row, for a player's seek bar.

    `tiles`: that many frames, evenly spread; or `interval_s`: a frame every that many
    seconds from the first (a stream's only way: its length is known only at its end).
    None leaves a field to the daemon's default (10 tiles, or 1 s in a stream; 160
    pixels; 5 columns; quality 85). `format`: "jpeg" or "webp"; `quality`: 1-100.
    """

    tiles: int | None = None
    interval_s: float | None = None
    tile_width: int | None = None
    columns: int | None = None
    format: str = "jpeg"
    quality: int | None = None

    def __post_init__(self) -> None:
        for name in ("tiles", "tile_width", "columns", "quality"):
            _counted(f"SpriteSheet.{name}", getattr(self, name))
        if self.interval_s is not None and finite("SpriteSheet.interval_s", self.interval_s) <= 0:
            raise InvalidArgument(
                f"SpriteSheet.interval_s must be above 0 seconds (None: the daemon's "
                f"default), got {self.interval_s!r}"
            )
        one_of("SpriteSheet.format", self.format, FORMATS)

    def proto(self) -> pb.SpriteSheet:
        return pb.SpriteSheet(  # 0 on the wire: the daemon's default
            tiles=self.tiles or 0,
            interval_s=float(self.interval_s or 0.0),
            tile_width=self.tile_width or 0,
            columns=self.columns or 0,
            format=cast("pb.ImageFormat", IMAGE_FORMATS[self.format]),
            quality=self.quality or 0,
        )


def _counted(name: str, value: Any) -> None:
    """A count or size: None for the daemon's default, else at least 1 (0 of something
    is not a preview)."""
    if value is not None:
        whole(name, value, 1, UINT32[1])


def _check_at(at: Any) -> None:
    if isinstance(at, str):
        if at not in PICKS:
            raise InvalidArgument(
                f"Thumbnail.at must be one of {', '.join(PICKS)}, a frame index or a time "
                f"in seconds, got {at!r}"
            )
    elif isinstance(at, numbers.Integral) and not isinstance(at, bool):
        whole("Thumbnail.at (a frame index)", at, 0, 2**64 - 1)
    elif isinstance(at, numbers.Real) and not isinstance(at, bool):
        finite("Thumbnail.at (a time in seconds)", at)
    else:
        raise InvalidArgument(
            f"Thumbnail.at must be {', '.join(PICKS)}, a frame index (int) or a time in "
            f"seconds (float), got {at!r}"
        )


def check_asked(thumbnail: Any, sprite_sheet: Any) -> None:
    """`thumbnail=` and `sprite_sheet=`: an instance, True (the defaults), False or None."""
    for name, value, kind in (
        ("thumbnail", thumbnail, Thumbnail),
        ("sprite_sheet", sprite_sheet, SpriteSheet),
    ):
        if value is not None and not isinstance(value, bool | kind):
            raise InvalidArgument(
                f"{name} must be a {kind.__name__}, True (the defaults), False or None, "
                f"got {value!r}"
            )


def check_for_stream(thumbnail: Any, sprite_sheet: Any) -> None:
    """What `stream()` cannot ask for: a choice that needs the video's length."""
    if isinstance(thumbnail, Thumbnail) and thumbnail.at == "middle":
        raise InvalidArgument(
            f"thumbnail: at='middle' needs the video's length, {STREAM_LENGTH}: use "
            "at='first' or 'last', a frame index or a time in seconds (thumbnail=True "
            "takes the first frame)"
        )
    if isinstance(sprite_sheet, SpriteSheet) and sprite_sheet.tiles:
        raise InvalidArgument(
            f"sprite_sheet: tiles={sprite_sheet.tiles} needs the video's length, "
            f"{STREAM_LENGTH}: set interval_s, a tile every that many seconds, instead"
        )


def previews_proto(
    thumbnail: Thumbnail | bool | None,
    sprite_sheet: SpriteSheet | bool | None,
    known: tuple[int, pb.Rational] | None = None,
) -> pb.Previews | None:
    """The request's previews; None when none is asked for. `known`: the frame count and
    rate of a whole video sent as a stream."""
    asked: dict[str, Any] = {}
    if thumbnail:
        asked["thumbnail"] = pb.Thumbnail() if thumbnail is True else thumbnail.proto()
    if sprite_sheet:
        asked["sprite_sheet"] = pb.SpriteSheet() if sprite_sheet is True else sprite_sheet.proto()
    if not asked:
        return None
    previews = pb.Previews(**asked)
    if known is not None:
        frames, rate = known
        fps = Fraction(rate.num, rate.den)
        if "thumbnail" in asked:
            _thumbnail_of_known(previews.thumbnail, frames, fps)
        if "sprite_sheet" in asked:
            _sheet_of_known(previews.sprite_sheet, frames, fps)
    return previews


def _thumbnail_of_known(thumb: pb.Thumbnail, frames: int, fps: Fraction) -> None:
    """The middle frame (also the default) by its index; an index or time past the end
    refused, as a whole request's is (a stream would take its last frame)."""
    at = thumb.WhichOneof("at")
    if at is None or (at == "pick" and thumb.pick == pb.FRAME_PICK_MIDDLE):
        thumb.index = (frames - 1) // 2
    elif at == "index" and thumb.index >= frames:
        raise OutOfRange(
            f"previews.thumbnail.index: frame {thumb.index} is past the video's {frames} frames"
        )
    elif at == "time_s" and math.isfinite(thumb.time_s) and thumb.time_s >= 0:
        index = math.floor(thumb.time_s * fps)  # as the daemon reckons it
        if index >= frames:
            raise OutOfRange(
                f"previews.thumbnail.time_s: frame {index} is past the video's {frames} frames"
            )


def _sheet_of_known(sheet: pb.SpriteSheet, frames: int, fps: Fraction) -> None:
    """`tiles` as the interval between them: the frames floor(i * frames / tiles) a whole
    request shows. A tile count over the limit is left for the daemon to refuse."""
    if sheet.tiles > TILES_MAX:
        return
    if not sheet.interval_s:
        tiles = min(sheet.tiles or TILES_DEFAULT, frames)
        sheet.interval_s = _interval(Fraction(frames, tiles) / fps)
    sheet.tiles = 0


def _interval(seconds: Fraction) -> float:
    """`seconds` as the nearest double not below it: tile k then falls on frame
    floor(k * frames / tiles) exactly, and tile `tiles` past the last frame."""
    near = float(seconds)
    return near if Fraction(near) >= seconds else math.nextafter(near, math.inf)
