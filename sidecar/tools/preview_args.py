"""`video-sidecar encode`'s flags for previews (a thumbnail and a sprite sheet beside the
output, docs/previews.md): their value types, and the client's options made from them.

A flag that only a thumbnail or a sprite sheet takes asks for it: `--thumbnail-at 2.5s`
is `--thumbnail --thumbnail-at 2.5s`. The daemon judges ranges; its refusals name the
request's fields, which `FIELD_FLAGS` says as this command's flags.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING, Any

from ..vocabulary import IMAGE_SUFFIX, PREVIEW_FILE_INFIX

if TYPE_CHECKING:
    from client import SpriteSheet, Thumbnail

PICKS = ("first", "middle", "last")
IMAGE_FORMATS = ("jpeg", "webp")
# A preview's file beside the output `NAME.EXT`: NAME, its kind's infix, its format's
# extension; as the daemon names them beside a file output.
FILE_INFIX = PREVIEW_FILE_INFIX  # the daemon's naming, from the vocabulary
FILE_SUFFIX = IMAGE_SUFFIX

THUMBNAIL_FLAGS = ("thumbnail_at", "thumbnail_size")
SHEET_FLAGS = ("sprite_tiles", "sprite_interval", "sprite_tile_width", "sprite_columns")
IMAGE_FLAGS = ("image_format", "image_quality")

# The request's fields, in the daemon's refusals, as this command's flags.
FIELD_FLAGS = {
    "previews.thumbnail.max_width": "--thumbnail-size",
    "previews.thumbnail.max_height": "--thumbnail-size",
    "previews.thumbnail.index": "--thumbnail-at",
    "previews.thumbnail.time_s": "--thumbnail-at",
    "previews.thumbnail.pick": "--thumbnail-at",
    "previews.thumbnail.format": "--image-format",
    "previews.thumbnail.quality": "--image-quality",
    "previews.sprite_sheet.tiles": "--sprite-tiles",
    "previews.sprite_sheet.interval_s": "--sprite-interval",
    "previews.sprite_sheet.tile_width": "--sprite-tile-width",
    "previews.sprite_sheet.columns": "--sprite-columns",
    "previews.sprite_sheet.format": "--image-format",
    "previews.sprite_sheet.quality": "--image-quality",
}
_SECONDS = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)s$")


def thumbnail_at(text: str) -> str | int | float:
    """first, middle, last, a frame index (`12`) or a time in seconds (`2.5s`)."""
    if text in PICKS:
        return text
    if text.isdigit():
        return int(text)
    if (seconds := _SECONDS.match(text)) is not None:
        return float(seconds.group(1))
    raise argparse.ArgumentTypeError(
        f"{text!r} is not first, middle, last, a frame index (e.g. 12) or a time in "
        "seconds ending in s (e.g. 2.5s)"
    )


def image_size(text: str) -> tuple[int, int]:
    """`WxH`, each at least 1: the box a thumbnail is fitted into."""
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if match is None or 0 in (size := (int(match.group(1)), int(match.group(2)))):
        raise argparse.ArgumentTypeError(f"{text!r} is not WxH in pixels (e.g. 320x180)")
    return size


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _quality(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"must be 1 to 100, got {text!r}")
    return int(text)


def add_preview_options(encode: argparse.ArgumentParser) -> None:
    """`encode`'s flags for a thumbnail and a sprite sheet beside the output."""
    group = encode.add_argument_group(
        "previews",
        "still images written beside the output: OUT.thumbnail.jpg and OUT.sprites.jpg "
        "(.webp with --image-format webp); --overwrite applies to them too",
    )
    group.add_argument("--thumbnail", action="store_true", help="write a thumbnail")
    group.add_argument(
        "--thumbnail-at",
        type=thumbnail_at,
        metavar="AT",
        help="the thumbnail's frame: first, middle, last, a frame index (12) or a time "
        "(2.5s); implies --thumbnail [default: middle]",
    )
    group.add_argument(
        "--thumbnail-size",
        type=image_size,
        metavar="WxH",
        help="the box the thumbnail is fitted into, aspect kept, never enlarged; implies "
        "--thumbnail [default: 640x360]",
    )
    group.add_argument(
        "--sprite-sheet", action="store_true", help="write a sprite sheet: frames as tiles"
    )
    spread = group.add_mutually_exclusive_group()
    spread.add_argument(
        "--sprite-tiles",
        type=_count,
        metavar="N",
        help="tiles, evenly spread over the video; implies --sprite-sheet [default: 10]",
    )
    spread.add_argument(
        "--sprite-interval",
        type=_seconds,
        metavar="SECONDS",
        help="a tile every SECONDS instead, from the first frame; implies --sprite-sheet",
    )
    group.add_argument(
        "--sprite-tile-width",
        type=_count,
        metavar="PX",
        help="a tile's width in pixels, 16..640; implies --sprite-sheet [default: 160]",
    )
    group.add_argument(
        "--sprite-columns",
        type=_count,
        metavar="N",
        help="tiles to a row; implies --sprite-sheet [default: 5]",
    )
    group.add_argument(
        "--image-format", choices=IMAGE_FORMATS, help="the previews' format [default: jpeg]"
    )
    group.add_argument(
        "--image-quality",
        type=_quality,
        metavar="1-100",
        help="the previews' quality, higher is better and larger [default: 85]",
    )


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> bool:
    return any(getattr(args, name) is not None for name in names)


def asked_previews(args: argparse.Namespace) -> tuple[bool, bool]:
    """Whether a thumbnail and a sprite sheet are asked for, by their flags or by one only
    they take."""
    return (
        args.thumbnail or _given(args, THUMBNAIL_FLAGS),
        args.sprite_sheet or _given(args, SHEET_FLAGS),
    )


def previews_of(args: argparse.Namespace) -> tuple[Thumbnail | None, SpriteSheet | None]:
    """The client's options for the previews the flags ask for."""
    from client import SpriteSheet, Thumbnail

    wants_thumbnail, wants_sheet = asked_previews(args)
    image: dict[str, Any] = {
        "format": args.image_format or "jpeg",
        "quality": args.image_quality,
    }
    thumbnail = sheet = None
    if wants_thumbnail:
        width, height = args.thumbnail_size or (None, None)
        at = args.thumbnail_at if args.thumbnail_at is not None else "middle"
        thumbnail = Thumbnail(at=at, max_width=width, max_height=height, **image)
    if wants_sheet:
        sheet = SpriteSheet(
            tiles=args.sprite_tiles,
            interval_s=args.sprite_interval,
            tile_width=args.sprite_tile_width,
            columns=args.sprite_columns,
            **image,
        )
    return thumbnail, sheet


def image_flags_alone(args: argparse.Namespace) -> bool:
    """`--image-format` or `--image-quality` with no preview asked for."""
    return _given(args, IMAGE_FLAGS) and not any(asked_previews(args))
