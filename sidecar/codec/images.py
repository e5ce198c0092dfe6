"""Still images from borrowed frames: one frame scaled to RGB, and RGB encoded as JPEG or
WebP, with PyAV's own image encoders (mjpeg, libwebp).

A frame is read where it lies (a lease) in its wire format and scaled straight to the
image's size, in one swscale call: a thumbnail or a tile costs one small conversion, not a
full-size RGB copy. The 4:2:0 formats are BT.709 limited range (as the client writes
them); the packed RGB formats full range.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

import av
import numpy as np
from av.video.codeccontext import VideoCodecContext
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from ..vocabulary import IMAGE_SUFFIX
from .frames import PixelLayout


@dataclass(frozen=True)
class ImageFormat:
    name: str  # as the wire says it
    codec: str  # PyAV's encoder
    pixel_format: str  # what the encoder takes
    mime_type: str
    suffix: str  # a file's extension


IMAGE_FORMATS: dict[str, ImageFormat] = {
    # 4:4:4 JPEG: no chroma loss on small images, and every browser shows it.
    "jpeg": ImageFormat("jpeg", "mjpeg", "yuvj444p", "image/jpeg", IMAGE_SUFFIX["jpeg"]),
    "webp": ImageFormat("webp", "libwebp", "yuv420p", "image/webp", IMAGE_SUFFIX["webp"]),
}


# swscale's set-up for one conversion (sizes, formats) costs about as much as a small
# image's conversion itself, so the set-up reformatters are kept between requests, each
# used by one thread at a time. Keyed by what they convert; a few of each at most.
_Key = tuple[str, int, int, str, int, int]
_KEPT: dict[_Key, list[VideoReformatter]] = {}
_KEPT_LOCK = threading.Lock()
KEEP_EACH = 4


@contextlib.contextmanager
def _reformatter(key: _Key) -> Iterator[VideoReformatter]:
    with _KEPT_LOCK:
        free = _KEPT.get(key)
        reformatter = free.pop() if free else VideoReformatter()
    try:
        yield reformatter
    finally:
        with _KEPT_LOCK:
            if len(_KEPT) > 64:  # sizes seen long ago: set up again when asked
                _KEPT.clear()
            kept = _KEPT.setdefault(key, [])
            if len(kept) < KEEP_EACH:
                kept.append(reformatter)


def scale_rgb(image: np.ndarray, layout: PixelLayout, width: int, height: int) -> np.ndarray:
    """`image` (one borrowed frame in `layout`) as (height, width, 3) RGB, a new array."""
    if layout.planar420 and image.shape[0] % 6 != 0:
        # PyAV mis-sizes borrowed 4:2:0 frames whose height is not a multiple of 4.
        frame = av.VideoFrame.from_ndarray(image, format=layout.name)
    else:
        frame = av.VideoFrame.from_numpy_buffer(image, format=layout.name)
    key = (layout.name, frame.width, frame.height, "rgb24", width, height)
    with _reformatter(key) as reformatter:
        scaled = reformatter.reformat(
            frame,
            width=width,
            height=height,
            format="rgb24",
            src_colorspace=Colorspace.ITU709,
            dst_colorspace=Colorspace.ITU709,
            src_color_range=ColorRange.MPEG if layout.planar420 else ColorRange.JPEG,
            dst_color_range=ColorRange.JPEG,
            interpolation="AREA",  # averages what it drops: no aliasing in small tiles
        )
    return scaled.to_ndarray()


def encode_image(rgb: np.ndarray, fmt: ImageFormat, quality: int) -> bytes:
    """`rgb` (H, W, 3) as one image file's bytes, at `quality` 1-100 (higher: larger,
    closer to the source)."""
    height, width = rgb.shape[:2]
    ctx = cast(VideoCodecContext, av.CodecContext.create(fmt.codec, "w"))
    ctx.width, ctx.height = width, height
    ctx.pix_fmt = fmt.pixel_format
    ctx.time_base = Fraction(1, 1)
    ctx.thread_count = 1  # one small picture: starting threads costs more than it saves
    if fmt.codec == "mjpeg":
        # FFmpeg's JPEG quantiser scale: 2 (best) to 31, from quality 100 to 1.
        ctx.qmin = ctx.qmax = round(2 + (100 - quality) * 29 / 99)
    else:
        ctx.options = {"quality": str(quality)}
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    with _reformatter(("rgb24", width, height, fmt.pixel_format, width, height)) as reformatter:
        frame = reformatter.reformat(
            frame,
            format=fmt.pixel_format,
            # Image decoders read BT.601: full range for JPEG (JFIF), limited for WebP.
            src_colorspace=Colorspace.ITU601,
            dst_colorspace=Colorspace.ITU601,
            src_color_range=ColorRange.JPEG,
            dst_color_range=ColorRange.JPEG if fmt.codec == "mjpeg" else ColorRange.MPEG,
        )
    packets = ctx.encode(frame) + ctx.encode(None)
    return b"".join(bytes(packet) for packet in packets)
