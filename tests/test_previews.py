"""Previews as the daemon plans and makes them: which frames, what size, what colour.

The images are decoded again (PyAV reads JPEG and WebP) and compared with the source
frames, box-averaged to the same size: an independent reference for the scaler.
"""

from __future__ import annotations

import io
import math
from fractions import Fraction

import av
import numpy as np
import pytest

from client._video import prepare_video
from client.patterns import moving_pattern
from sidecar.codec.frames import PIXEL_FORMATS, Geometry
from sidecar.errors import InvalidRequest, OutOfRange
from sidecar.pipeline.admission.requests import (
    PreviewImage,
    PreviewRequest,
    SpriteSheetRequest,
    ThumbnailRequest,
)
from sidecar.pipeline.previews.making import PreviewTaker
from sidecar.pipeline.previews.planning import fit, plan_previews

from .helpers import psnr

W, H, T = 320, 192, 24


def geometry(pixel_format: str = "rgb24", width: int = W, height: int = H) -> Geometry:
    return Geometry(width, height, PIXEL_FORMATS[pixel_format], Fraction(24))


def decoded(image: PreviewImage) -> np.ndarray:
    with av.open(io.BytesIO(image.data)) as container:
        frame = next(container.decode(video=0))
        assert (frame.width, frame.height) == (image.width, image.height)
        return frame.to_ndarray(format="rgb24")


def box(rgb: np.ndarray, factor: int) -> np.ndarray:
    """`rgb` (H, W, 3) averaged over factor x factor blocks."""
    h, w = rgb.shape[0] // factor, rgb.shape[1] // factor
    blocks = rgb[: h * factor, : w * factor].reshape(h, factor, w, factor, 3)
    return blocks.astype(np.float64).mean(axis=(1, 3)).round().astype(np.uint8)


def wire(
    video: np.ndarray, pixel_format: str, value_range: tuple[float, float] = (0, 1)
) -> np.ndarray:
    """Frames as the client writes them into a lease, by its own conversion."""
    if pixel_format == "gray":
        video = video[..., 1:2]
    elif pixel_format == "bgr24":  # the caller's frames are BGR then
        video = np.ascontiguousarray(video[..., ::-1])
    elif pixel_format == "rgba":
        alpha = np.full((*video.shape[:3], 1), 255, video.dtype)
        video = np.concatenate([video, alpha], axis=3)
    source = prepare_video(video, pixel_format=pixel_format, value_range=value_range)
    region = np.zeros(source.frames * source.frame_bytes, np.uint8)
    source.copy_into(region, 0, source.frames)
    shape = PIXEL_FORMATS[pixel_format].frame_shape(source.width, source.height)
    return region.reshape(source.frames, *shape)


def make(
    request: PreviewRequest, frames: np.ndarray, g: Geometry, pieces: int = 3
) -> list[PreviewImage]:
    plan = plan_previews(request, g, len(frames))
    assert plan is not None
    taker = PreviewTaker(plan, g, stream=False)
    released: list[int] = []
    for i, part in enumerate(np.array_split(frames, pieces)):
        taker.take(part, lambda i=i: released.append(i))  # type: ignore[misc]
    try:
        return taker.images()
    finally:
        taker.settle()
        assert sorted(released) == list(range(pieces)), "every piece let go once"


# -- planning ------------------------------------------------------------------------------


def test_nothing_asked_plans_nothing() -> None:
    assert plan_previews(PreviewRequest(), geometry(), T) is None


def test_defaults() -> None:
    asked = PreviewRequest(ThumbnailRequest(), SpriteSheetRequest())
    plan = plan_previews(asked, geometry("rgb24", 1344, 768), 122)
    assert plan is not None and plan.thumbnail is not None and plan.sheet is not None
    assert plan.thumbnail.index == 60  # the middle frame
    assert (plan.thumbnail.width, plan.thumbnail.height) == (630, 360)
    assert plan.thumbnail.format.name == "jpeg" and plan.thumbnail.quality == 85
    assert plan.sheet.frames == tuple(i * 122 // 10 for i in range(10))
    assert (plan.sheet.tile_width, plan.sheet.tile_height, plan.sheet.columns) == (160, 92, 5)


@pytest.mark.parametrize(
    ("size", "box_", "expected"),
    [
        ((1344, 768), (640, 360), (630, 360)),
        ((64, 48), (640, 360), (64, 48)),  # never enlarged
        ((33, 17), (640, 360), (32, 16)),  # even sides, never past the source
        ((4000, 10), (160, 1 << 30), (160, 2)),
    ],
)
def test_fit(size: tuple[int, int], box_: tuple[int, int], expected: tuple[int, int]) -> None:
    assert fit(*size, *box_) == expected


BAD = [
    (ThumbnailRequest(index=T), None, OutOfRange, "thumbnail.index"),
    (ThumbnailRequest(time_s=1.0), None, OutOfRange, "thumbnail.time_s"),  # frame 24 of 24
    (ThumbnailRequest(time_s=math.nan), None, InvalidRequest, "thumbnail.time_s"),
    (ThumbnailRequest(time_s=-1.0), None, InvalidRequest, "thumbnail.time_s"),
    (ThumbnailRequest(pick="enum value 9"), None, InvalidRequest, "thumbnail.pick"),
    (ThumbnailRequest(max_width=1921), None, InvalidRequest, "thumbnail.max_width"),
    (ThumbnailRequest(format="gif"), None, InvalidRequest, "thumbnail.format"),
    (ThumbnailRequest(quality=101), None, InvalidRequest, "thumbnail.quality"),
    (None, SpriteSheetRequest(tiles=101), InvalidRequest, "sprite_sheet.tiles"),
    (None, SpriteSheetRequest(tile_width=15), InvalidRequest, "sprite_sheet.tile_width"),
    (None, SpriteSheetRequest(tile_width=641), InvalidRequest, "sprite_sheet.tile_width"),
    (None, SpriteSheetRequest(columns=101), InvalidRequest, "sprite_sheet.columns"),
    (None, SpriteSheetRequest(interval_s=math.inf), InvalidRequest, "sprite_sheet.interval_s"),
    (None, SpriteSheetRequest(format="enum value 7"), InvalidRequest, "sprite_sheet.format"),
    # 100 tiles of 640 in one row: wider than a sheet may be
    (None, SpriteSheetRequest(tiles=100, tile_width=640, columns=100), InvalidRequest, "columns"),
]


@pytest.mark.parametrize(("thumbnail", "sheet", "error", "field"), BAD)
def test_bad_previews_are_refused_naming_the_field(
    thumbnail: ThumbnailRequest | None,
    sheet: SpriteSheetRequest | None,
    error: type[Exception],
    field: str,
) -> None:
    with pytest.raises(error, match=field.replace(".", r"\.")) as caught:
        plan_previews(PreviewRequest(thumbnail, sheet), geometry("rgb24", 640, 360), T)
    if isinstance(caught.value, InvalidRequest):
        assert caught.value.field.endswith(field)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("thumbnail", "sheet", "field"),
    [
        (ThumbnailRequest(pick="middle"), None, "thumbnail.pick"),
        (None, SpriteSheetRequest(tiles=4), "sprite_sheet.tiles"),
    ],
)
def test_a_stream_cannot_ask_what_needs_its_length(
    thumbnail: ThumbnailRequest | None, sheet: SpriteSheetRequest | None, field: str
) -> None:
    with pytest.raises(InvalidRequest, match="stream"):
        plan_previews(PreviewRequest(thumbnail, sheet), geometry(), 0)


# -- making ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pixel_format", sorted(PIXEL_FORMATS))
@pytest.mark.parametrize("image_format", ["jpeg", "webp"])
def test_the_thumbnail_matches_its_source_frame(pixel_format: str, image_format: str) -> None:
    rgb = moving_pattern(T, H, W)
    request = PreviewRequest(ThumbnailRequest(index=7, max_width=W // 2, format=image_format))
    (thumb,) = make(request, wire(rgb, pixel_format), geometry(pixel_format))
    assert thumb.kind == "thumbnail" and thumb.frames == (7,)
    assert thumb.mime_type == f"image/{image_format}"
    assert (thumb.width, thumb.height) == (W // 2, H // 2)
    reference = box(rgb[7], 2)
    got = decoded(thumb)
    if pixel_format == "gray":
        got, reference = got[..., 1], reference[..., 1]
    assert psnr(got, reference) >= 35, pixel_format


def test_float_minus_one_to_one_frames_land_as_their_rgb() -> None:
    """A (-1, 1) video reaches the lease as the client converts it: the preview shows the
    same picture as the uint8 one."""
    rgb = moving_pattern(T, H, W)
    as_float = rgb.astype(np.float32) / 127.5 - 1
    frames = wire(as_float, "yuv420p", value_range=(-1, 1))
    asked = PreviewRequest(ThumbnailRequest(pick="first", max_width=W // 4))
    (thumb,) = make(asked, frames, geometry("yuv420p"))
    assert psnr(decoded(thumb), box(rgb[0], 4)) >= 35


def test_the_sprite_sheet_lays_out_evenly_spaced_frames() -> None:
    rgb = moving_pattern(T, H, W)
    request = PreviewRequest(sprite_sheet=SpriteSheetRequest(tiles=7, tile_width=W // 4, columns=3))
    (sheet,) = make(request, rgb, geometry(), pieces=5)
    assert sheet.kind == "sprite_sheet"
    assert sheet.frames == tuple(i * T // 7 for i in range(7))
    assert sheet.times_s == tuple(f / 24 for f in sheet.frames)
    tw, th = W // 4, H // 4
    assert (sheet.tile_width, sheet.tile_height, sheet.columns, sheet.rows) == (tw, th, 3, 3)
    assert (sheet.width, sheet.height) == (3 * tw, 3 * th)
    image = decoded(sheet)
    for i, frame in enumerate(sheet.frames):
        row, col = divmod(i, 3)
        tile = image[row * th : (row + 1) * th, col * tw : (col + 1) * tw]
        assert psnr(tile, box(rgb[frame], 4)) >= 33, i  # JPEG blocks cross tile edges


def test_fewer_frames_than_tiles_gives_every_frame() -> None:
    (sheet,) = make(
        PreviewRequest(sprite_sheet=SpriteSheetRequest()),
        moving_pattern(4, H, W),
        geometry(),
        pieces=2,
    )
    assert sheet.frames == (0, 1, 2, 3) and (sheet.columns, sheet.rows) == (4, 1)


def test_a_stream_takes_tiles_by_time_and_its_last_frame() -> None:
    g = geometry()
    request = PreviewRequest(
        ThumbnailRequest(pick="last", max_width=W // 2),
        SpriteSheetRequest(interval_s=0.25, tile_width=W // 4),
    )
    plan = plan_previews(request, g, 0)
    assert plan is not None
    taker = PreviewTaker(plan, g, stream=True)
    rgb = moving_pattern(50, H, W)
    for part in np.array_split(rgb, 7):  # chunks as a stream sends them
        taker.take(part)
    thumb, sheet = taker.images()
    taker.settle()
    assert thumb.frames == (49,)
    assert psnr(decoded(thumb), box(rgb[49], 2)) >= 35
    assert sheet.frames == tuple(range(0, 50, 6))  # every 0.25 s at 24 fps: 6 frames
    assert sheet.times_s[1] == pytest.approx(0.25)


def test_a_streams_sheet_takes_as_many_tiles_as_fit() -> None:
    """Tiles a whole video's sheet would hold are not refused in a stream, whose tile
    count is known only at its end: it stops at what the sheet holds."""
    g = geometry("rgb24", 1280, 720)
    sheet = SpriteSheetRequest(tile_width=640, columns=2, interval_s=1.0)
    whole = plan_previews(PreviewRequest(sprite_sheet=sheet), g, 240)
    assert whole is not None and whole.sheet is not None and len(whole.sheet.frames) == 10
    stream = plan_previews(PreviewRequest(sprite_sheet=sheet), g, 0)
    assert stream is not None and stream.sheet is not None
    assert stream.sheet.tiles == 2 * (8192 // 360) == 44


def test_a_stream_thumbnail_past_its_end_takes_the_last_frame() -> None:
    g = geometry()
    plan = plan_previews(PreviewRequest(ThumbnailRequest(index=1000)), g, 0)
    assert plan is not None
    taker = PreviewTaker(plan, g, stream=True)
    for part in np.array_split(moving_pattern(20, H, W), 3):
        taker.take(part)
    (thumb,) = taker.images()
    taker.settle()
    assert thumb.frames == (19,)


def test_the_time_spent_is_counted() -> None:
    g = geometry()
    plan = plan_previews(PreviewRequest(ThumbnailRequest()), g, T)
    assert plan is not None
    taker = PreviewTaker(plan, g, stream=False)
    taker.take(moving_pattern(T, H, W))
    taker.images()
    taker.settle()
    assert taker.seconds > 0


def test_a_failure_while_scaling_fails_the_previews_and_still_lets_go() -> None:
    g = geometry()
    plan = plan_previews(PreviewRequest(ThumbnailRequest(index=3)), g, T)
    assert plan is not None

    def never_lands(frames: int) -> None:
        raise RuntimeError("cancelled while waiting")

    taker = PreviewTaker(plan, g, stream=False, wait_landed=never_lands)
    released: list[bool] = []
    taker.take(moving_pattern(T, H, W), lambda: released.append(True))
    with pytest.raises(RuntimeError, match="cancelled"):
        taker.images()
    taker.settle()
    assert released == [True]
