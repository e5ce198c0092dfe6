"""Segment-parallel encoding: one valid file, the same frames, about the same size."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry
from sidecar.pipeline.encoding.segments import (
    encode_segments,
    keyframe_interval,
    plan_segments,
    thread_shares,
)

from .helpers import decode, psnr

LIMITS = Limits(1000, 4096, 4096, 1 << 34)


def test_plan_follows_frames_cores_and_keyframes() -> None:
    # Cuts only where a single pass starts a GOP anyway: with the default interval of 250,
    # a 362-frame video once, a 122-frame one never.
    assert plan_segments(362, 16, 250) == [(0, 250), (250, 362)]
    assert plan_segments(122, 16, 250) == [(0, 122)]
    assert plan_segments(362, 2, 250) == [(0, 362)]  # a 2-core share never cuts
    assert plan_segments(100, 16, 10) == [(0, 100)]  # too short for two segments
    cut = plan_segments(362, 16, 48)  # a short GOP cuts freely, on whole GOPs
    assert len(cut) == 4 and all(start % 48 == 0 for start, _ in cut) and cut[-1][1] == 362
    assert len(plan_segments(10_000, 256, 250)) == 8


def test_keyframe_interval_comes_from_the_settings() -> None:
    assert keyframe_interval(CodecSpec().resolve()) == 250
    assert keyframe_interval(CodecSpec(gop=48).resolve()) == 48
    assert keyframe_interval(CodecSpec(extra=(("x264-params", "keyint=60"),)).resolve()) == 60
    h265 = CodecSpec(codec="h265", extra=(("x265-params", "keyint=30"),)).resolve()
    assert keyframe_interval(h265) == 30


def packets(data: bytes, fps: int = 24) -> list[tuple[int, int, bool]]:
    """(pts, dts, keyframe) of each video packet, in frames."""
    with av.open(io.BytesIO(data)) as container:
        return [
            (round(p.pts * p.time_base * fps), round(p.dts * p.time_base * fps), p.is_keyframe)
            for p in container.demux(video=0)
            if p.size
        ]


@pytest.mark.parametrize("container", ["mp4", "fmp4"])
@pytest.mark.parametrize("preset", ["ultrafast", "fast"])
def test_segments_match_a_single_pass(make_daemon, container: str, preset: str) -> None:  # type: ignore[no-untyped-def]
    video = moving_pattern(240, 96, 160, noise=2.0)
    one = make_daemon(encoder_threads=2, warm_encoders=0)  # 2 threads: a single pass
    four = make_daemon(encoder_threads=8, warm_encoders=0)  # 8 threads: two segments
    outputs = []
    for d in (one, four):
        with d.client() as c:
            outputs.append(c.encode(video, preset=preset, container=container, gop=60).data)
    single, segmented = outputs
    got_single, _ = decode(single)
    got, facts = decode(segmented)
    assert len(got) == len(got_single) == 240
    assert abs(psnr(got, video) - psnr(got_single, video)) < 0.5  # the same quality
    assert len(segmented) <= 1.05 * len(single), (len(segmented), len(single))
    timeline = packets(segmented)
    assert sorted(pts for pts, _, _ in timeline) == list(range(240))  # continuous timestamps
    dts = [d for _, d, _ in timeline]
    assert dts == sorted(dts) and len(set(dts)) == len(dts)
    keyframes = [pts for pts, _, key in timeline if key]
    assert 0 in keyframes and 120 in keyframes  # each segment starts on a keyframe
    assert keyframes == [pts for pts, _, key in packets(single) if key]  # and no others
    assert facts["rate"] == 24


def test_segments_carry_audio(make_daemon) -> None:  # type: ignore[no-untyped-def]
    video = moving_pattern(144, 96, 160)
    pcm = (np.sin(np.arange(6 * 48000) / 20) * 0.3).astype(np.float32)[:, None]
    d = make_daemon(encoder_threads=8, warm_encoders=0)
    with d.client() as c:
        data = c.encode(video, audio=pcm, sample_rate=48000).data
    with av.open(io.BytesIO(data)) as container:
        v, a = container.streams.video[0], container.streams.audio[0]
        assert v.frames == 144
        assert abs(float(a.duration * a.time_base) - 6.0) < 0.05


def test_threads_follow_the_frames() -> None:
    """Each segment's threads in proportion to its frames: they finish together."""
    assert thread_shares(16, [250, 112]) == [11, 5]
    assert thread_shares(16, [100, 100]) == [8, 8]
    assert thread_shares(8, [250, 250, 10]) == [4, 3, 1]
    assert thread_shares(2, [250, 112]) == [1, 1]  # at least one each
    assert sum(thread_shares(13, [60, 70, 80, 90])) == 13


@pytest.mark.parametrize("preset", ["ultrafast", "fast"])  # fast: B-frames, so dts < pts
def test_a_stream_without_an_encoder_takes_the_segments_headers(
    tmp_path: Path, preset: str
) -> None:
    """The output stream of a segmented video opens no encoder of its own: it takes the
    first segment encoder's headers, and the file has the packets and the parameter sets
    (SPS, PPS) a stream with its own encoder gives it."""
    video = moving_pattern(120, 96, 160, noise=2.0)
    geometry = check_geometry(160, 96, "rgb24", Fraction(24), LIMITS)
    codec = CodecSpec(preset=preset, gop=60).resolve()
    files = []
    for later in (False, True):
        out = tmp_path / f"later-{later}.mp4"
        # One thread a segment encoder: x264's frame threads may decide a frame differently
        # from run to run on a loaded machine, and the two files must be the same encode.
        encoder = VideoEncoder(str(out), geometry, codec, 1, headers_later=later)
        done = encode_segments(
            encoder, lambda i: video[i], [(0, 60), (60, 120)], 2, lambda: False, lambda n: None
        )
        assert done
        encoder.close()
        files.append(out.read_bytes())
    opened, later_ = files
    assert packets(later_) == packets(opened)
    got, _ = decode(later_)
    assert len(got) == 120 and psnr(got, video) >= 35
    # The same headers: x264's rate control is not bit-exact from run to run on a busy
    # host, so the frames' bytes may differ; the stream's parameters must not.
    assert extradata(later_) == extradata(opened)


def extradata(data: bytes) -> bytes:
    with av.open(io.BytesIO(data)) as container:
        return bytes(container.streams.video[0].codec_context.extradata or b"")


def test_a_stream_without_an_encoder_encodes_nothing(tmp_path: Path) -> None:
    geometry = check_geometry(160, 96, "rgb24", Fraction(24), LIMITS)
    encoder = VideoEncoder(
        str(tmp_path / "x.mp4"), geometry, CodecSpec().resolve(), 2, headers_later=True
    )
    with pytest.raises(RuntimeError, match="no encoder"):
        encoder.encode(moving_pattern(1, 96, 160)[0])
    encoder.abort()


def test_long_h265_videos_encode_whole(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """x265's headers differ with its thread count, so its segment encoders (5 and 3
    threads here, for 120 and 60 frames) would never share them: an h265 video is not cut,
    and is encoded in one pass."""
    video = moving_pattern(180, 96, 160, noise=2.0)
    d = make_daemon(encoder_threads=8, warm_encoders=0)
    with d.client() as c:
        result = c.encode(video, codec="h265", gop=60)
    got, facts = decode(result.data or b"")
    assert len(got) == 180 and facts["codec"] == "hevc"
    assert psnr(got, video) >= 35


def test_segments_make_the_same_previews(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Previews taken beside parallel segments show the same frames as a single pass's,
    and every lease comes back once they are made."""
    from client import SpriteSheet, Thumbnail

    video = moving_pattern(240, 96, 160)
    asked = {"thumbnail": Thumbnail(at=130), "sprite_sheet": SpriteSheet(tiles=6, columns=3)}
    made = []
    for threads in (2, 8):  # a single pass, then two segments
        d = make_daemon(encoder_threads=threads, warm_encoders=0)
        with d.client() as c:
            result = c.encode(video, gop=60, **asked)
            assert c.status().pool["active_leases"] <= 1  # the spare at most
        assert result.thumbnail is not None and result.sprite_sheet is not None
        assert result.thumbnail.frames == (130,)
        assert result.sprite_sheet.frames == tuple(i * 40 for i in range(6))
        made.append((result.thumbnail.data, result.sprite_sheet.data))
    assert made[0] == made[1]  # the same frames, scaled and encoded alike
