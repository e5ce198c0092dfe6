"""The encoder on its own: write, reopen, compare."""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar.codec import encoder as encoder_module
from sidecar.codec.audio import AudioFormat
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Geometry, Limits, check_geometry
from sidecar.codec.threads import (
    converting_frame_threads,
    frame_threads,
    slice_threads,
    threading_for,
)
from sidecar.errors import InvalidRequest

from .helpers import decode, index_first, psnr

LIMITS = Limits(1000, 4096, 4096, 1 << 34)


def encode(tmp_path: Path, frames: np.ndarray, fmt: str = "rgb24", **codec: object) -> Path:
    h, w = frames.shape[1:3] if fmt != "yuv420p" else (frames.shape[1] * 2 // 3, frames.shape[2])
    geometry = check_geometry(w, h, fmt, Fraction(24), LIMITS)
    out = tmp_path / "out.mp4"
    encoder = VideoEncoder(str(out), geometry, CodecSpec(**codec).resolve(), threads=2)  # type: ignore[arg-type]
    for frame in frames:
        encoder.encode(frame)
    encoder.close()
    assert encoder.frames == len(frames)
    return out


def test_round_trip(tmp_path: Path) -> None:
    video = moving_pattern(30, 96, 160)
    decoded, facts = decode(encode(tmp_path, video))
    assert decoded.shape == video.shape
    assert psnr(decoded, video) >= 40
    assert facts["rate"] == 24 and facts["format"].startswith("mov")


def test_padded_rows_are_borrowed(tmp_path: Path) -> None:
    video = moving_pattern(6, 96, 160)
    padded = np.zeros((6, 96, 160 * 3 + 64), np.uint8)
    padded[:, :, : 160 * 3] = video.reshape(6, 96, -1)
    view = np.lib.stride_tricks.as_strided(padded, (6, 96, 160, 3), (padded.strides[0], 544, 3, 1))
    decoded, _ = decode(encode(tmp_path, view))
    assert psnr(decoded, video) >= 40


@pytest.mark.parametrize("height", [96, 98])  # 98: not a multiple of 4, copied instead
def test_yuv420p_input(tmp_path: Path, height: int) -> None:
    video = moving_pattern(4, height, 160)
    planes = np.stack(
        [
            av.VideoFrame.from_ndarray(f, format="rgb24")
            .reformat(format="yuv420p", src_colorspace="itu709", dst_colorspace="itu709",
                      src_color_range="JPEG", dst_color_range="MPEG")
            .to_ndarray()
            for f in video
        ]
    )  # fmt: skip
    decoded, _ = decode(encode(tmp_path, planes, "yuv420p"))
    assert decoded.shape == video.shape
    assert psnr(decoded, video) >= 40


def test_codec_spec_resolution() -> None:
    assert CodecSpec(profile="fast").resolve().options == {"preset": "ultrafast", "crf": "18"}
    assert CodecSpec().resolve(video=(448, 256, 17)).options["crf"] == "24"  # small, short
    assert CodecSpec().resolve(video=(1280, 720, 81)).options["crf"] == "22"
    assert CodecSpec("hevc").resolve().choice.encoder == "libx265"
    assert CodecSpec("av1", preset="8").resolve().options["preset"] == "8"
    for bad in (CodecSpec("vp8"), CodecSpec(crf=-1), CodecSpec(gop=0), CodecSpec(threads=999),
                CodecSpec(extra=(("bad key", "1"),)), CodecSpec(preset="fastest"),
                CodecSpec(profile="quick"), CodecSpec(bitrate=5),
                CodecSpec(crf=20, bitrate=500_000)):  # fmt: skip
        with pytest.raises(InvalidRequest):
            bad.resolve()


def test_bad_option_value_is_an_invalid_request(tmp_path: Path) -> None:
    geometry = check_geometry(64, 48, "rgb24", Fraction(24), LIMITS)
    with pytest.raises(InvalidRequest, match="codec"):
        VideoEncoder(
            str(tmp_path / "x.mp4"), geometry, CodecSpec(extra=(("crf", "abc"),)).resolve(), 1
        )
    assert not os.path.exists(tmp_path / "x.mp4") or os.path.getsize(tmp_path / "x.mp4") == 0


def test_threads_for_short_and_long_clips() -> None:
    """Slice threads for a short clip (three macroblock rows a slice at least); frame
    threads for a long one, one a core on a few cores, three in four on more."""
    assert [frame_threads(c) for c in (1, 2, 4, 8, 16, 32)] == [1, 2, 4, 6, 12, 24]
    assert threading_for(122, 768, 16) == (12, "FRAME")
    assert threading_for(122, 768, 2) == (2, "FRAME")
    assert threading_for(10, 768, 16) == (10, "FRAME")  # never more threads than frames
    assert threading_for(4, 768, 16) == (16, "SLICE")
    assert threading_for(4, 64, 16) == (1, "SLICE")
    # RGB input leaves half the cores to swscale's converter; 4:2:0 input needs none.
    assert [converting_frame_threads(c) for c in (1, 2, 4, 8, 16, 32)] == [1, 2, 4, 4, 8, 16]
    assert threading_for(122, 768, 16, converts=True) == (8, "FRAME")
    assert threading_for(4, 768, 16, converts=True) == (16, "SLICE")


def test_small_frames_get_one_slice_thread_rather_than_two_at_light_presets() -> None:
    """Two slice threads on a frame under 1000 macroblocks become one at ultrafast or
    superfast (or no preset named); from veryfast down, and with more threads, they stay."""
    limits = Limits(100, 8192, 8192, 1 << 40)

    def geometry(width: int, height: int) -> Geometry:
        return check_geometry(width, height, "rgb24", Fraction(24), limits)

    assert slice_threads(geometry(448, 256), 2, "ultrafast") == 1  # 448 macroblocks
    assert slice_threads(geometry(448, 256), 2, "superfast") == 1
    assert slice_threads(geometry(448, 256), 2) == 1
    assert slice_threads(geometry(448, 256), 2, "veryfast") == 2
    assert slice_threads(geometry(448, 256), 2, "medium") == 2
    assert slice_threads(geometry(448, 256), 5, "ultrafast") == 5
    assert slice_threads(geometry(672, 384), 2, "ultrafast") == 2  # 1008 macroblocks
    assert slice_threads(geometry(1344, 768), 2, "ultrafast") == 2
    assert slice_threads(geometry(64, 64), 1, "veryfast") == 1


def test_the_encoder_takes_the_slice_threads_its_preset_calls_for() -> None:
    """What x264 is opened with: one slice thread at ultrafast, two at veryfast."""
    limits = Limits(100, 8192, 8192, 1 << 40)
    shape = check_geometry(448, 256, "rgb24", Fraction(24), limits)
    for preset, threads in (("ultrafast", 1), ("veryfast", 2)):
        codec = CodecSpec(preset=preset).resolve()
        ctx = av.CodecContext.create("libx264", "w")
        encoder_module.configure_context(ctx, shape, codec, 2, "SLICE")
        assert ctx.thread_count == threads, preset


def encode_reserved(
    tmp_path: Path, video: np.ndarray, reserve: bool, audio: bool = False, **codec: object
) -> bytes:
    """`video` encoded to a file; with `reserve`, its frame count said up front."""
    frames, height, width = video.shape[:3]
    geometry = check_geometry(width, height, "rgb24", Fraction(24), LIMITS)
    out = tmp_path / f"reserved-{reserve}-{audio}.mp4"
    encoder = VideoEncoder(
        str(out),
        geometry,
        CodecSpec(**codec).resolve(),  # type: ignore[arg-type]
        threads=2,
        audio=AudioFormat(48000, 2, "f32") if audio else None,
    )
    if audio:  # a tone, a little longer than the video: trimmed to it
        t = np.arange(int(48000 * (frames / 24 + 0.5))) / 48000
        tone = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        encoder.set_audio(np.stack([tone, tone], axis=1))
    if reserve:
        encoder.reserve_index(frames)
    for frame in video:
        encoder.encode(frame)
    encoder.close()
    return out.read_bytes()


@pytest.fixture
def small_videos_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for the index kept for videos of any size, these small test ones too."""
    monkeypatch.setattr(encoder_module, "RESERVE_INDEX_MIN_PIXELS", 0)


@pytest.mark.usefixtures("small_videos_reserve")
@pytest.mark.parametrize("audio", [False, True])
def test_a_known_frame_count_reserves_the_index_ahead_of_the_frames(
    tmp_path: Path, audio: bool
) -> None:
    """The index goes first either way; with the count known it is written into room
    kept for it, instead of the whole file moving at the end: the same frames, a few
    kilobytes of `free` box more."""
    video = moving_pattern(30, 96, 160)
    moved = encode_reserved(tmp_path, video, reserve=False, audio=audio)
    kept = encode_reserved(tmp_path, video, reserve=True, audio=audio)
    assert index_first(moved) == 8
    assert index_first(kept) > 8
    assert 0 < len(kept) - len(moved) <= 4096 + 48 * 120
    for data in (moved, kept):
        decoded, _ = decode(data)
        assert decoded.shape == video.shape and psnr(decoded, video) >= 40
    if audio:
        with av.open(io.BytesIO(kept)) as container:
            seconds = sum(float(f.samples) / f.sample_rate for f in container.decode(audio=0))
        assert abs(seconds - 30 / 24) < 0.05  # the tone trimmed to the video


@pytest.mark.usefixtures("small_videos_reserve")
def test_the_reserved_index_holds_the_worst_case(tmp_path: Path) -> None:
    """Every frame a keyframe, with audio: the index's largest per-sample cost still fits."""
    video = moving_pattern(240, 32, 48)
    data = encode_reserved(tmp_path, video, reserve=True, audio=True, gop=1)
    decoded, _ = decode(data)
    assert len(decoded) == 240
    assert index_first(data) > 8


def test_small_videos_and_late_calls_keep_faststart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small video's file moves at next to no cost and room kept would be a large share
    of it; and once a frame is in, the header is written and nothing changes."""
    small = encode_reserved(tmp_path, moving_pattern(30, 96, 160), reserve=True)
    assert index_first(small) == 8
    monkeypatch.setattr(encoder_module, "RESERVE_INDEX_MIN_PIXELS", 0)
    geometry = check_geometry(160, 96, "rgb24", Fraction(24), LIMITS)
    out = tmp_path / "late.mp4"
    encoder = VideoEncoder(str(out), geometry, CodecSpec().resolve(), threads=2)
    video = moving_pattern(30, 96, 160)
    encoder.encode(video[0])
    encoder.reserve_index(30)
    for frame in video[1:]:
        encoder.encode(frame)
    encoder.close()
    assert index_first(out.read_bytes()) == 8
