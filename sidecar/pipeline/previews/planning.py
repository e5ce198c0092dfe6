"""A thumbnail and a sprite sheet, made from the frames the video is encoded from.

`plan_previews` checks a request's previews and settles which frames they show: before
any memory is touched, like the rest of a request. `making.PreviewTaker` then
makes them from the frames in the leases, beside the encode.

A stream's length is known only at its end, so there the sprite sheet takes a frame
every `interval_s` seconds and the thumbnail is picked by index, time, or as the first
or last frame; an index or time past the end takes the last frame (the preview's
`frames` says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ...codec.frames import Geometry
from ...codec.images import IMAGE_FORMATS, ImageFormat
from ...errors import InvalidRequest, OutOfRange
from ...vocabulary import PREVIEW_FILE_INFIX
from ..admission.requests import PreviewRequest, SpriteSheetRequest, ThumbnailRequest

# Limits, and the defaults of fields left 0 (docs/previews.md).
THUMBNAIL_MAX_SIDE = 1920
THUMBNAIL_DEFAULT = (640, 360)
TILES_MAX = 100
TILES_DEFAULT = 10
TILE_WIDTH_RANGE = (16, 640)
TILE_WIDTH_DEFAULT = 160
COLUMNS_MAX = 100
COLUMNS_DEFAULT = 5
SHEET_MAX_SIDE = 8192
INTERVAL_DEFAULT_S = 1.0
INTERVAL_MAX_S = 86400.0
QUALITY_DEFAULT = 85
PICKS = ("first", "middle", "last")


@dataclass(frozen=True)
class ThumbnailPlan:
    index: int | None  # None: the last frame (a stream's)
    width: int
    height: int
    format: ImageFormat
    quality: int


@dataclass(frozen=True)
class SheetPlan:
    frames: tuple[int, ...]  # a whole video's tiles' frames; () in a stream
    tiles: int  # how many: a stream's at most
    every: Fraction  # a stream's: a tile every this many frames (may be fractional)
    tile_width: int
    tile_height: int
    columns: int
    format: ImageFormat
    quality: int


# A preview's file beside a file output `NAME.EXT`: NAME + this + its format's suffix.
FILE_INFIX = PREVIEW_FILE_INFIX


@dataclass(frozen=True)
class PreviewPlan:
    thumbnail: ThumbnailPlan | None
    sheet: SheetPlan | None

    def files(self) -> list[tuple[str, str]]:
        """(kind, how its file's name ends) of each preview, beside a file output."""
        asked = [("thumbnail", self.thumbnail), ("sprite_sheet", self.sheet)]
        return [(kind, FILE_INFIX[kind] + p.format.suffix) for kind, p in asked if p is not None]


def plan_previews(
    request: PreviewRequest, geometry: Geometry, frames_total: int
) -> PreviewPlan | None:
    """`request`'s previews, checked; None when none is asked for. `frames_total` is 0
    for a stream."""
    if request.thumbnail is None and request.sprite_sheet is None:
        return None
    thumbnail = sheet = None
    if request.thumbnail is not None:
        thumbnail = _plan_thumbnail(request.thumbnail, geometry, frames_total)
    if request.sprite_sheet is not None:
        sheet = _plan_sheet(request.sprite_sheet, geometry, frames_total)
    return PreviewPlan(thumbnail, sheet)


def _format(name: str, field: str) -> ImageFormat:
    fmt = IMAGE_FORMATS.get(name or "jpeg")
    if fmt is None:
        raise InvalidRequest(field, f"unknown image format; use one of {', '.join(IMAGE_FORMATS)}")
    return fmt


def _quality(quality: int, field: str) -> int:
    if not 0 <= quality <= 100:
        raise InvalidRequest(field, f"{quality} is not 1-100 (0: {QUALITY_DEFAULT})")
    return quality or QUALITY_DEFAULT


def _even(x: float) -> int:
    return max(2, 2 * round(x / 2))


def fit(width: int, height: int, max_width: int, max_height: int) -> tuple[int, int]:
    """`width` x `height` scaled to fit the box, its aspect kept, never enlarged; even."""
    scale = min(1.0, max_width / width, max_height / height)
    return min(_even(width * scale), max(2, width)), min(_even(height * scale), max(2, height))


def _seconds(value: float, field: str, upper: float) -> float:
    if not math.isfinite(value) or not 0 <= value <= upper:
        raise InvalidRequest(field, f"{value!r} is not a time in seconds from 0 to {upper:g}")
    return value


def _plan_thumbnail(req: ThumbnailRequest, geometry: Geometry, total: int) -> ThumbnailPlan:
    field = "previews.thumbnail"
    stream = total == 0
    index: int | None
    if req.index is not None:
        index = req.index
    elif req.time_s is not None:
        index = math.floor(_seconds(req.time_s, f"{field}.time_s", INTERVAL_MAX_S) * geometry.fps)
    else:
        if req.pick not in ("", *PICKS):
            raise InvalidRequest(f"{field}.pick", f"use one of {', '.join(PICKS)}")
        pick = req.pick or ("first" if stream else "middle")
        if pick == "middle" and stream:
            raise InvalidRequest(
                f"{field}.pick",
                "a stream's frame count comes only at its end: pick first or last, an "
                "index or a time",
            )
        index = {"first": 0, "middle": (total - 1) // 2, "last": None if stream else total - 1}[
            pick
        ]
    if index is not None and not stream and index >= total:
        what = "index" if req.index is not None else "time_s"
        raise OutOfRange(f"{field}.{what}: frame {index} is past the video's {total} frames")
    for side, value in (("max_width", req.max_width), ("max_height", req.max_height)):
        if not 0 <= value <= THUMBNAIL_MAX_SIDE:
            raise InvalidRequest(f"{field}.{side}", f"{value} is over {THUMBNAIL_MAX_SIDE}")
    width, height = fit(
        geometry.width,
        geometry.height,
        req.max_width or THUMBNAIL_DEFAULT[0],
        req.max_height or THUMBNAIL_DEFAULT[1],
    )
    fmt = _format(req.format, f"{field}.format")
    return ThumbnailPlan(index, width, height, fmt, _quality(req.quality, f"{field}.quality"))


def _plan_sheet(req: SpriteSheetRequest, geometry: Geometry, total: int) -> SheetPlan:
    field = "previews.sprite_sheet"
    if not 0 <= req.tiles <= TILES_MAX:
        raise InvalidRequest(f"{field}.tiles", f"{req.tiles} is not 1-{TILES_MAX}")
    if req.tiles and total == 0:
        raise InvalidRequest(
            f"{field}.tiles", "a stream's frame count comes only at its end: set interval_s"
        )
    low, high = TILE_WIDTH_RANGE
    if req.tile_width and not low <= req.tile_width <= high:
        raise InvalidRequest(f"{field}.tile_width", f"{req.tile_width} is not {low}-{high}")
    if not 0 <= req.columns <= COLUMNS_MAX:
        raise InvalidRequest(f"{field}.columns", f"{req.columns} is not 1-{COLUMNS_MAX}")
    interval = _seconds(req.interval_s, f"{field}.interval_s", INTERVAL_MAX_S)
    every = Fraction(interval or INTERVAL_DEFAULT_S) * geometry.fps  # frames between tiles
    frames: tuple[int, ...] = ()
    if total:
        if interval:
            frames = tuple(
                f for f in (math.floor(k * every) for k in range(TILES_MAX)) if f < total
            )
        else:
            tiles = min(req.tiles or TILES_DEFAULT, total)
            frames = tuple(i * total // tiles for i in range(tiles))
    tile_width, tile_height = fit(
        geometry.width, geometry.height, req.tile_width or TILE_WIDTH_DEFAULT, 1 << 30
    )
    # A stream's tiles are as many as its length gives, up to what the sheet holds.
    columns = min(req.columns or COLUMNS_DEFAULT, len(frames) if total else TILES_MAX)
    tiles = len(frames) if total else min(TILES_MAX, columns * (SHEET_MAX_SIDE // tile_height))
    rows = -(-tiles // columns)
    if not tiles or tile_width * columns > SHEET_MAX_SIDE or tile_height * rows > SHEET_MAX_SIDE:
        raise InvalidRequest(
            f"{field}.columns",
            f"a sheet of {columns}x{max(rows, 1)} tiles of {tile_width}x{tile_height} is over "
            f"{SHEET_MAX_SIDE} pixels on a side",
        )
    return SheetPlan(
        frames,
        tiles,
        every,
        tile_width,
        tile_height,
        columns,
        _format(req.format, f"{field}.format"),
        _quality(req.quality, f"{field}.quality"),
    )
