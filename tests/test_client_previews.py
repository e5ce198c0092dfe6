"""Previews through the client and the command line: a thumbnail and a sprite sheet
beside the video, made by the real daemon, decoded here with PyAV."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from client import (
    AlreadyExists,
    InvalidArgument,
    OutOfRange,
    Preview,
    SpriteSheet,
    Thumbnail,
)
from client._options import EncodeOptions
from client._previews import previews_proto
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.face.convert import previews_from_proto
from sidecar.vocabulary import PIXEL_FORMATS

from .helpers import Daemon, decode, psnr
from .test_cli_errors import cli, one_line_error, usage_error

FPS = 24
VIDEO = moving_pattern(24, 360, 640)  # smooth and moving: scaled frames compare well


def image(preview: Preview | None) -> np.ndarray:
    """A preview's pixels, RGB, decoded from its bytes or its file."""
    assert preview is not None
    source = io.BytesIO(preview.data) if preview.data is not None else preview.path
    with av.open(source) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def shrunk(frame: np.ndarray, factor: int) -> np.ndarray:
    """`frame` scaled down by a whole `factor`: each output pixel the mean of its box."""
    h, w, c = frame.shape
    boxes = frame.astype(np.float64).reshape(h // factor, factor, w // factor, factor, c)
    return boxes.mean(axis=(1, 3))


def check_sheet(sheet: Preview, video: np.ndarray, factor: int) -> None:
    """The sheet's layout agrees with itself, and each tile shows its frame."""
    tiles = len(sheet.frames)
    assert sheet.rows == -(-tiles // sheet.columns) and len(sheet.times_s) == tiles
    assert (sheet.width, sheet.height) == (
        sheet.columns * sheet.tile_width,
        sheet.rows * sheet.tile_height,
    )
    pixels = image(sheet)
    assert pixels.shape == (sheet.height, sheet.width, 3)
    for i, frame in enumerate(sheet.frames):
        assert sheet.times_s[i] == pytest.approx(frame / FPS)
        assert sheet.tile_at(sheet.times_s[i]) == i
        x, y, w, h = sheet.tile_box(i)
        assert psnr(pixels[y : y + h, x : x + w], shrunk(video[frame], factor)) >= 35


# -- the client's checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: Thumbnail(at="midle"), "Thumbnail.at must be one of first, middle, last"),
        (lambda: Thumbnail(at=True), "Thumbnail.at must be first, middle, last"),
        (lambda: Thumbnail(at=None), "Thumbnail.at must be first"),
        (lambda: Thumbnail(at=float("nan")), "(a time in seconds) must be a finite number"),
        (lambda: Thumbnail(at=-1), "Thumbnail.at (a frame index) must be 0 to"),
        (lambda: Thumbnail(format="png"), "Thumbnail.format must be one of jpeg, webp, got 'png'"),
        (lambda: Thumbnail(max_width=True), "Thumbnail.max_width must be a whole number"),
        (lambda: Thumbnail(max_height=180.0), "Thumbnail.max_height must be a whole number"),
        (lambda: Thumbnail(quality="85"), "Thumbnail.quality must be a whole number"),
        (lambda: SpriteSheet(tiles=False), "SpriteSheet.tiles must be a whole number"),
        (lambda: SpriteSheet(columns=-1), "SpriteSheet.columns must be 1 to"),
        (lambda: SpriteSheet(tiles=0), "SpriteSheet.tiles must be 1 to"),
        (lambda: SpriteSheet(tile_width=0), "SpriteSheet.tile_width must be 1 to"),
        (lambda: Thumbnail(max_width=0), "Thumbnail.max_width must be 1 to"),
        (lambda: SpriteSheet(interval_s=0), "SpriteSheet.interval_s must be above 0"),
        (lambda: SpriteSheet(interval_s=float("nan")), "interval_s must be a finite number"),
        (lambda: SpriteSheet(interval_s=True), "SpriteSheet.interval_s must be a number"),
        (lambda: SpriteSheet(format="gif"), "SpriteSheet.format must be one of jpeg, webp"),
        (lambda: EncodeOptions(thumbnail="yes"), "thumbnail must be a Thumbnail, True"),
        (lambda: EncodeOptions(sprite_sheet=Thumbnail()), "sprite_sheet must be a SpriteSheet"),
    ],
)  # fmt: skip
def test_what_cannot_go_into_a_request_is_refused_naming_it(
    make: Callable[[], Any], said: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        make()
    assert said in str(refused.value)


def test_what_can_go_into_a_request() -> None:
    request = EncodeOptions(thumbnail=Thumbnail(at=np.int64(3)), sprite_sheet=True)
    previews = previews_proto(request.thumbnail, request.sprite_sheet)
    assert previews is not None and previews.thumbnail.index == 3
    assert previews.HasField("sprite_sheet") and previews.sprite_sheet.tiles == 0
    assert previews_proto(Thumbnail(at=2.0), None).thumbnail.time_s == 2.0  # type: ignore[union-attr]
    assert previews_proto(Thumbnail(at="last"), None).thumbnail.pick == pb.FRAME_PICK_LAST  # type: ignore[union-attr]
    # True is the daemon's defaults: no frame named (the middle; a stream's first).
    assert previews_proto(True, False).thumbnail.WhichOneof("at") is None  # type: ignore[union-attr]
    assert previews_proto(None, False) is None


@pytest.mark.parametrize(("frames", "fps"), [(24, (24, 1)), (97, (30000, 1001)), (7, (25, 1))])
@pytest.mark.parametrize("tiles", [None, 3, 10, 13, 100])
def test_a_whole_video_sent_as_a_stream_shows_the_frames_a_request_would(
    frames: int, fps: tuple[int, int], tiles: int | None
) -> None:
    """Its header names the middle frame by index, and `tiles` as the interval between
    them, which the daemon's stream plan turns back into the same frames."""
    from sidecar.codec.frames import Geometry
    from sidecar.pipeline.previews.planning import plan_previews

    geometry = Geometry(64, 64, PIXEL_FORMATS["rgb24"], Fraction(*fps))
    asked = previews_proto(True, SpriteSheet(tiles=tiles))
    assert asked is not None
    whole = plan_previews(previews_from_proto(asked, True), geometry, frames)
    known = previews_proto(
        True, SpriteSheet(tiles=tiles), (frames, pb.Rational(num=fps[0], den=fps[1]))
    )
    assert known is not None and known.sprite_sheet.tiles == 0
    streamed = plan_previews(previews_from_proto(known, True), geometry, 0)
    assert whole is not None and whole.sheet is not None and whole.thumbnail is not None
    assert streamed is not None and streamed.sheet is not None and streamed.thumbnail is not None
    assert streamed.thumbnail.index == whole.thumbnail.index == (frames - 1) // 2
    every = streamed.sheet.every
    shown = [f for f in (math.floor(k * every) for k in range(100)) if f < frames]
    assert tuple(shown) == whole.sheet.frames


def test_past_the_end_is_out_of_range_however_the_video_travels() -> None:
    rate = pb.Rational(num=24, den=1)
    with pytest.raises(OutOfRange, match=r"thumbnail.index: frame 24 is past the video's 24"):
        previews_proto(Thumbnail(at=24), None, (24, rate))
    with pytest.raises(OutOfRange, match=r"thumbnail.time_s: frame 48 is past"):
        previews_proto(Thumbnail(at=2.0), None, (24, rate))


def test_what_a_stream_cannot_know_is_refused_when_it_opens(client: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"at='middle' needs the video's length"):
        client.stream(fps=FPS, thumbnail=Thumbnail())
    with pytest.raises(InvalidArgument, match=r"tiles=5 needs .* set interval_s"):
        client.stream(fps=FPS, sprite_sheet=SpriteSheet(tiles=5))
    with pytest.raises(InvalidArgument, match="thumbnail must be a Thumbnail"):
        client.encode(VIDEO[:2], thumbnail="yes")


# -- bytes outputs -------------------------------------------------------------------------


def test_a_bytes_output_brings_both_previews(client: Any) -> None:
    result = client.encode(
        VIDEO,
        fps=FPS,
        thumbnail=Thumbnail(max_width=320, max_height=180),
        sprite_sheet=SpriteSheet(tiles=6, columns=4, tile_width=160),
    )
    thumb, sheet = result.thumbnail, result.sprite_sheet
    assert [p.kind for p in result.previews] == ["thumbnail", "sprite_sheet"]
    assert (thumb.width, thumb.height, thumb.mime_type) == (320, 180, "image/jpeg")
    assert thumb.size_bytes == len(thumb.data) and thumb.path == ""
    assert thumb.frames == (11,) and thumb.times_s == pytest.approx((11 / FPS,))
    pixels = image(thumb)
    assert pixels.shape == (180, 320, 3)
    assert psnr(pixels, shrunk(VIDEO[11], 2)) >= 35
    assert sheet.frames == (0, 4, 8, 12, 16, 20)  # floor(i * 24 / 6)
    assert (sheet.tile_width, sheet.tile_height, sheet.columns, sheet.rows) == (160, 90, 4, 2)
    check_sheet(sheet, VIDEO, 4)
    assert sheet.tile_at(0.4) == 2 and sheet.tile_at(100) == 5
    shown = repr(result) + repr(thumb) + repr(sheet)
    assert f"<{thumb.size_bytes} bytes>" in shown and "\\x" not in shown
    assert result.timings.previews_ms > 0


def test_float_frames_in_minus_one_to_one(client: Any) -> None:
    frames = VIDEO[:4].astype(np.float32) / 127.5 - 1
    result = client.encode(
        frames, fps=FPS, value_range=(-1, 1), thumbnail=Thumbnail(at="first", max_width=320)
    )
    assert result.thumbnail.frames == (0,)
    assert psnr(image(result.thumbnail), shrunk(VIDEO[0], 2)) >= 35


def test_webp_and_a_thumbnail_at_a_time(daemon: Daemon) -> None:
    with daemon.client() as c:
        result = c.encode(
            VIDEO, fps=FPS, thumbnail=Thumbnail(at=0.5, format="webp", quality=90),
            sprite_sheet=SpriteSheet(interval_s=0.25, format="webp", tile_width=320),
        )  # fmt: skip
    assert result.thumbnail.mime_type == "image/webp" and result.thumbnail.frames == (12,)
    assert result.thumbnail.data[8:12] == b"WEBP"
    assert result.sprite_sheet.frames == (0, 6, 12, 18)
    assert image(result.thumbnail).shape == (360, 640, 3)  # never enlarged
    assert image(result.sprite_sheet).shape == (180, 4 * 320, 3)


def _recording_leases(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where each result's previews were: "spare" (in the output's lease, kept as the
    next request's), "lease" (in a lease of their own), "result" or "file"."""
    from client._results import ResultBuilder

    seen: list[str] = []
    take = ResultBuilder.take_result

    def recording(self: ResultBuilder, result: pb.EncodeResult) -> None:
        if all(p.in_lease for p in result.previews):
            spare = result.next_lease.lease_id == result.data_lease.lease_id
            seen.append("spare" if spare else "lease")
        else:
            seen.append("file" if result.path else "result")
        take(self, result)

    monkeypatch.setattr(ResultBuilder, "take_result", recording)
    return seen


@pytest.mark.parametrize("spare", [True, False], ids=["next-lease", "own-lease"])
def test_a_large_output_brings_its_previews_in_its_lease(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, spare: bool
) -> None:
    """Lossless noise, over 1 MiB: the output comes back in a lease, its previews after
    it. They are copied out before the lease goes back or takes the next frames: the
    same bytes as the daemon writes beside a file."""
    noise = np.random.default_rng(3).integers(0, 256, (12, 256, 320, 3), dtype=np.uint8)
    asked = {"thumbnail": Thumbnail(at="last"), "sprite_sheet": SpriteSheet(tiles=4)}
    if not spare:
        request = EncodeOptions.request

        def without_spare(self: EncodeOptions, *args: Any, **kwargs: Any) -> Any:
            made = request(self, *args, **kwargs)
            made.next_lease_bytes = 0  # no lease for the next request to come back in
            return made

        monkeypatch.setattr(EncodeOptions, "request", without_spare)
    seen = _recording_leases(monkeypatch)
    with daemon.client() as c:
        first = c.encode(noise, crf=0, **asked)
        again = c.encode(noise, crf=0, **asked)  # into the lease the first came back in
        saved = c.encode(noise, crf=0, path=f"noise-{spare}.mp4", overwrite=True, **asked)
        assert c.status().pool["active_leases"] <= 1  # the spare at most
    assert seen == ["spare" if spare else "lease"] * 2 + ["file"]
    assert first.size_bytes > 1024 * 1024
    for kind in ("thumbnail", "sprite_sheet"):
        written = Path(getattr(saved, kind).path).read_bytes()
        assert getattr(first, kind).data == getattr(again, kind).data == written
    assert len(decode(first.data)[0]) == 12


# -- file outputs -------------------------------------------------------------------------


def test_a_file_output_gets_its_previews_beside_it(daemon: Daemon) -> None:
    with daemon.client() as c:
        result = c.encode(
            VIDEO[:8], fps=FPS, path="jobs/42.mp4", overwrite=True, thumbnail=True,
            sprite_sheet=SpriteSheet(format="webp"),
        )  # fmt: skip
    video = Path(result.path)
    assert video == (daemon.output_dir / "jobs" / "42.mp4").resolve()
    thumb, sheet = result.thumbnail, result.sprite_sheet
    assert thumb.path == str(video.with_name("42.thumbnail.jpg")) and thumb.data is None
    assert sheet.path == str(video.with_name("42.sprites.webp"))
    for preview in (thumb, sheet):
        assert Path(preview.path).is_absolute()
        assert Path(preview.path).stat().st_size == preview.size_bytes
        assert image(preview).shape == (preview.height, preview.width, 3)
        assert preview.path in repr(preview)
    assert thumb.frames == (3,) and sheet.frames == tuple(range(8))
    check_sheet(sheet, VIDEO, 4)


def test_an_existing_preview_is_not_replaced_without_overwrite(daemon: Daemon) -> None:
    folder = daemon.output_dir / "taken"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "7.sprites.jpg").write_bytes(b"keep me")
    with daemon.client() as c:
        with pytest.raises(AlreadyExists, match=r"7\.sprites\.jpg"):
            c.encode(VIDEO[:4], fps=FPS, path="taken/7.mp4", thumbnail=True, sprite_sheet=True)
        assert sorted(p.name for p in folder.iterdir()) == ["7.sprites.jpg"]  # no video
        assert (folder / "7.sprites.jpg").read_bytes() == b"keep me"
        result = c.encode(VIDEO[:4], fps=FPS, path="taken/7.mp4", overwrite=True, sprite_sheet=True)
    assert Path(result.sprite_sheet.path).read_bytes() != b"keep me"
    assert sorted(p.name for p in folder.iterdir()) == ["7.mp4", "7.sprites.jpg"]


def test_a_request_that_goes_wrong_makes_no_previews(daemon: Daemon) -> None:
    """Previews asked for beside a wrong option, or an encoder that fails: the request's
    error, nothing written, every lease back, the daemon serving."""
    folder = daemon.output_dir / "wrong"
    with daemon.client() as c:
        with pytest.raises(InvalidArgument, match="crf"):
            c.encode(
                VIDEO[:4], fps=FPS, path="wrong/1.mp4", crf=99, thumbnail=True, sprite_sheet=True
            )
        with pytest.raises(InvalidArgument, match="tile_width"):
            c.encode(VIDEO[:4], fps=FPS, path="wrong/2.mp4", sprite_sheet=SpriteSheet(tile_width=8))
        with pytest.raises(OutOfRange, match="index"):
            c.encode(VIDEO[:4], fps=FPS, path="wrong/3.mp4", thumbnail=Thumbnail(at=4))
        assert not folder.exists() or not any(folder.iterdir())
        assert c.status().pool["active_leases"] <= 1  # the spare at most
        assert c.encode(VIDEO[:4], fps=FPS, thumbnail=True).thumbnail is not None


# -- streams -------------------------------------------------------------------------------


def test_a_stream_takes_its_last_frame_and_a_tile_every_interval(client: Any) -> None:
    with client.stream(
        fps=FPS, thumbnail=Thumbnail(at="last", max_width=320),
        sprite_sheet=SpriteSheet(interval_s=0.25, tile_width=160, columns=3),
    ) as s:  # fmt: skip
        for start in range(0, 24, 8):
            s.write(VIDEO[start : start + 8])
    result = s.result
    assert result.thumbnail.frames == (23,)
    assert psnr(image(result.thumbnail), shrunk(VIDEO[23], 2)) >= 35
    sheet = result.sprite_sheet
    assert sheet.frames == (0, 6, 12, 18) and (sheet.columns, sheet.rows) == (3, 2)
    check_sheet(sheet, VIDEO, 4)


def test_a_whole_video_sent_inline_shows_what_a_request_shows(daemon: Daemon) -> None:
    """Inline, `encode()` goes as a stream; its previews are still the middle frame and
    ten evenly spread tiles."""
    with daemon.client() as c, daemon.client(transport="inline") as inline:
        leased = c.encode(VIDEO, fps=FPS, thumbnail=True, sprite_sheet=True)
        streamed = inline.encode(VIDEO, fps=FPS, thumbnail=True, sprite_sheet=True)
        with pytest.raises(OutOfRange, match="past the video's 24 frames"):
            inline.encode(VIDEO, fps=FPS, thumbnail=Thumbnail(at=30))
    assert streamed.thumbnail.frames == leased.thumbnail.frames == (11,)
    assert streamed.sprite_sheet.frames == leased.sprite_sheet.frames
    assert leased.sprite_sheet.frames == tuple(i * 24 // 10 for i in range(10))
    assert streamed.thumbnail.data == leased.thumbnail.data


# -- the command line ----------------------------------------------------------------------


def test_the_command_line_writes_previews_beside_its_output(daemon: Daemon, tmp_path: Path) -> None:
    np.save(tmp_path / "clip.npy", VIDEO[:12, :180, :320])
    base = ["encode", "clip.npy", "--socket", daemon.socket]
    result = cli([*base, "-o", "out.mp4", "--thumbnail", "--sprite-sheet"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "wrote out.thumbnail.jpg (thumbnail of frame 5, 320x180" in result.stdout
    assert "wrote out.sprites.jpg (sprite sheet, 10 tiles of 160x90" in result.stdout
    for name in ("out.thumbnail.jpg", "out.sprites.jpg"):
        with av.open(str(tmp_path / name)) as container:
            assert next(container.decode(video=0)).width in (320, 800)
    # A flag only a preview takes asks for it; webp names its files so.
    args = ["-o", "b.mp4", "--thumbnail-at", "0.25s", "--sprite-interval", "0.125"]
    result = cli([*base, *args, "--image-format", "webp", "--thumbnail-size", "160x90"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "b.thumbnail.webp (thumbnail of frame 6, 160x90" in result.stdout
    assert "b.sprites.webp (sprite sheet, 4 tiles" in result.stdout
    assert not list(tmp_path.glob(".*.part"))


def test_the_command_line_refuses_previews_in_its_own_words(daemon: Daemon, tmp_path: Path) -> None:
    np.save(tmp_path / "clip.npy", VIDEO[:4, :64, :64])
    base = ["encode", "clip.npy", "--socket", daemon.socket]
    (tmp_path / "c.sprites.jpg").write_bytes(b"keep me")
    line = one_line_error(cli([*base, "-o", "c.mp4", "--sprite-columns", "2"], tmp_path), 2)
    assert "c.sprites.jpg exists; pass --overwrite" in line
    assert not (tmp_path / "c.mp4").exists() and not list(tmp_path.glob(".*.part"))
    line = one_line_error(cli([*base, "--sprite-tile-width", "1000"], tmp_path), 2)
    assert line == "video-sidecar: InvalidArgument: --sprite-tile-width: 1000 is not 16-640"
    line = one_line_error(cli([*base, "--thumbnail-at", "9"], tmp_path), 2)
    assert "--thumbnail-at: frame 9 is past the video's 4 frames" in line
    line = one_line_error(cli([*base, "--image-quality", "50"], tmp_path), 2)
    assert "--image-quality need --thumbnail or --sprite-sheet" in line
    assert "2.5s" in usage_error(cli([*base, "--thumbnail-at", "2.5"], tmp_path))
    assert "1 to 100" in usage_error(cli([*base, "--thumbnail", "--image-quality", "0"], tmp_path))
    assert "WxH" in usage_error(cli([*base, "--thumbnail-size", "320"], tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "c.sprites.jpg",
        "clip.npy",
    ]


def test_the_command_line_names_its_files_as_the_daemon_does() -> None:
    from sidecar.codec.images import IMAGE_FORMATS
    from sidecar.pipeline.previews.planning import FILE_INFIX
    from sidecar.tools import preview_args

    assert FILE_INFIX == preview_args.FILE_INFIX
    assert {name: f.suffix for name, f in IMAGE_FORMATS.items()} == preview_args.FILE_SUFFIX
    assert tuple(IMAGE_FORMATS) == preview_args.IMAGE_FORMATS
