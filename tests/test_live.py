"""A live LL-HLS/CMAF package, against the real daemon: written as a stream's chunks come,
whole before any playlist names it, closed with ENDLIST, refused where it cannot be."""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from client import AlreadyExists, InvalidArgument, Live
from client.patterns import moving_pattern

from .helpers import Daemon, decode
from .live_helpers import (
    FPS,
    check_named_files_are_whole,
    check_rules,
    package_frames,
    playlist,
    probe_frames,
)


def test_a_stream_is_watchable_while_it_is_made(daemon: Daemon) -> None:
    folder = daemon.output_dir / "watch"
    seen: dict[str, bytes] = {}
    parts_while_open = 0
    video = moving_pattern(108, 96, 128)
    chunks = [video[i : i + 12] for i in range(0, 108, 12)]
    live = Live("watch", segment_s=1, part_s=0.5)  # first named with 3 s of segments
    with daemon.client() as c, c.stream(fps=FPS, path="watch.mp4", live=live) as s:
        for chunk in chunks:
            s.write(chunk)
            time.sleep(0.15)  # a generator between chunks
            if (folder / "index.m3u8").exists():
                parts_while_open = check_named_files_are_whole(folder, seen)
                pl = playlist(folder)
                assert pl is not None and not pl.is_endlist
    assert parts_while_open >= 2, "parts appeared while the stream was open"
    result = s.result
    assert result.frames == 108
    pl = playlist(folder)
    assert pl is not None
    check_rules(pl, 108, 1.0, 0.5)
    assert [s.duration for s in pl.segments if s.uri] == [1.0, 1.0, 1.0, 1.0, 0.5]
    check_named_files_are_whole(folder, seen)
    assert not (folder / "master.m3u8").exists()  # only where there is audio
    if shutil.which("ffprobe"):
        assert probe_frames(folder / "index.m3u8") == 108
    # One encode: the package and the MP4 hold the same pictures, bit for bit.
    mp4 = decode(daemon.output_dir / "watch.mp4")[0]
    assert np.array_equal(package_frames(folder), mp4)
    with av.open(str(daemon.output_dir / "watch.mp4")) as container:
        base = container.streams.video[0].time_base
        keyframes = [round(p.pts * base * FPS) for p in container.demux(video=0) if p.is_keyframe]
    assert keyframes == [0, 24, 48, 72, 96]  # a keyframe a segment, and only there


def test_a_part_is_named_as_its_last_packet_leaves_the_encoder(tmp_path: Path) -> None:
    """The encoder the daemon runs, with its package: when the packet that completes a
    part comes out of the encoder, the part is in the playlist before `encode()` returns,
    not when later frames come; a part's file is whole before it is named."""
    from sidecar.codec.catalogue import CodecSpec
    from sidecar.codec.encoder import VideoEncoder
    from sidecar.codec.frames import Limits, check_geometry
    from sidecar.pipeline.output.live import LiveLayout, LivePackage

    geometry = check_geometry(64, 48, "rgb24", Fraction(FPS), Limits(1000, 4096, 4096, 1 << 34))
    package = LivePackage(LiveLayout(tmp_path, Fraction(FPS), 24, 6, 1 << 30))
    codec = CodecSpec().resolve().for_live(24)
    encoder = VideoEncoder(str(tmp_path / "v.mp4"), geometry, codec, 1, live=package)
    named_after: list[int] = []
    for index, frame in enumerate(moving_pattern(120, 48, 64)):
        before = package.parts_written
        encoder.encode(frame)
        if package.parts_written > before and (tmp_path / "index.m3u8").exists():
            text = (tmp_path / "index.m3u8").read_text()
            segment, part = divmod(package.parts_written - 1, 4)
            assert f"s{segment:05d}.p{part}.m4s" in text or f"s{segment:05d}.m4s" in text
            named_after.append(index)
    encoder.close()
    assert named_after, "parts were named while frames still came"
    assert playlist(tmp_path).is_endlist  # type: ignore[union-attr]


def test_a_whole_video_gets_a_package_beside_its_bytes(daemon: Daemon) -> None:
    video = moving_pattern(60, 96, 128)
    with daemon.client() as c:
        result = c.encode(video, live=Live("whole", segment_s=1, part_s=0.5))
    pl = playlist(daemon.output_dir / "whole")
    assert pl is not None
    check_rules(pl, 60, 1.0, 0.5)
    assert np.array_equal(package_frames(daemon.output_dir / "whole"), decode(result.data)[0])


@pytest.mark.parametrize("audio", [False, True])
def test_a_stopped_stream_closes_its_package_shorter(daemon: Daemon, audio: bool) -> None:
    name = f"stopped-{audio}"
    folder = daemon.output_dir / name
    sound = {"audio": np.zeros((48000 * 5, 1), np.float32), "sample_rate": 48000} if audio else {}
    live = Live(name, segment_s=1)
    with daemon.client() as c:
        with (
            pytest.raises(RuntimeError, match="generator broke"),
            c.stream(fps=FPS, path=f"{name}.mp4", live=live, **sound) as s,
        ):
            s.write(moving_pattern(120, 64, 64))
            deadline = time.monotonic() + 10
            while (pl := playlist(folder)) is None or not pl.segments[0].uri:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            raise RuntimeError("generator broke")
        deadline = time.monotonic() + 10
        while not ((pl := playlist(folder)) is not None and pl.is_endlist):
            assert time.monotonic() < deadline, "the package was not closed"
            time.sleep(0.02)
    assert len(pl.segments) >= 1, pl.dumps()
    assert not (daemon.output_dir / f"{name}.mp4").exists()  # the MP4 is all or nothing
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    frames = package_frames(folder)
    assert 72 <= len(frames) <= 120, pl.dumps()
    if audio:  # its rendition closed too, under the multivariant playlist
        sound_pl = playlist(folder, "audio.m3u8")
        assert sound_pl is not None and sound_pl.is_endlist and sound_pl.segments
        assert (folder / "master.m3u8").exists()
    else:
        assert not (folder / "audio.m3u8").exists()


@pytest.mark.parametrize(
    ("live", "codec", "error", "words"),
    [
        (Live("bad", part_s=1.5), "", InvalidArgument, "at most half a segment"),
        (Live("bad", segment_s=0.5), "", InvalidArgument, "1-10 seconds"),
        (Live("bad", part_s=5), "", InvalidArgument, "0.1-2 seconds"),
        (Live("../out"), "", InvalidArgument, "'..'"),
        (Live("/etc/x"), "", InvalidArgument, "outside the output root"),
        (Live("vp9"), "vp9", InvalidArgument, "H.264"),
    ],
)
def test_what_cannot_be_packaged_is_refused(
    daemon: Daemon, live: Live, codec: str, error: type[Exception], words: str
) -> None:
    with daemon.client() as c, pytest.raises(error, match=words) as info:
        c.encode(moving_pattern(4, 64, 64), live=live, codec=codec, container=codec and "webm")
    assert getattr(info.value, "field", "live").startswith("live")


def test_a_package_is_not_replaced_unless_asked(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.encode(moving_pattern(4, 64, 64), live="again")
        with pytest.raises(AlreadyExists, match="holds a package"):
            c.encode(moving_pattern(4, 64, 64), live="again")
        c.encode(moving_pattern(30, 64, 64), live=Live("again", overwrite=True))
    pl = playlist(daemon.output_dir / "again")
    assert pl is not None and math.isclose(sum(s.duration for s in pl.segments), 30 / FPS)


def test_raw_live_fields_are_answered(daemon: Daemon) -> None:
    """The new fields as any client may send them, on gRPC and the framed socket: a
    clear answer each time, never INTERNAL, nothing written outside the root."""
    import grpc
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from sidecar.api.v1 import sidecar_pb2 as pb
    from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

    from .helpers import RawFramed

    channel = grpc.insecure_channel(f"unix:{daemon.socket}")
    stub = pb_grpc.VideoSidecarStub(channel)
    token = stub.Attach(pb.AttachRequest(client_name="fuzz")).client_token
    codes: dict[str, int] = {}
    before = set(Path(daemon.output_dir).parent.iterdir())

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        folder=st.one_of(
            st.text(max_size=40), st.binary(max_size=20).map(lambda b: b.decode("latin-1"))
        ),
        segment=st.floats(allow_nan=True, allow_infinity=True),
        part=st.floats(allow_nan=True, allow_infinity=True),
        framed=st.booleans(),
    )
    def ask(folder: str, segment: float, part: float, framed: bool) -> None:
        lease = stub.Lease(pb.LeaseRequest(client_token=token, size=64 * 64 * 3, wait_ms=5000))
        request = pb.EncodeRequest(
            client_token=token,
            video=pb.VideoDescriptor(
                width=64, height=64, pixel_format=pb.PIXEL_FORMAT_RGB24,
                fps=pb.Rational(num=24, den=1),
                ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=1)],
            ),
            live=pb.LivePackage(folder=folder, segment_s=segment, part_s=part, overwrite=True),
        )  # fmt: skip
        if framed:
            conn = RawFramed(f"{daemon.socket}.framed")
            conn.send(pb.FramedRequest(encode=request).SerializeToString())
            reply = conn.reply()
            conn.close()
            assert reply is not None
            code = str(reply.error.code) if reply.HasField("error") else "OK"
        else:
            try:
                list(stub.Encode(request, timeout=30))
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
        assert code not in ("INTERNAL", "UNKNOWN", "2", "13"), (folder, segment, part)
        codes[code] = codes.get(code, 0) + 1
        with contextlib.suppress(grpc.RpcError):
            stub.Release(pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))

    ask()
    channel.close()
    assert set(Path(daemon.output_dir).parent.iterdir()) == before  # nothing beside the root
    assert len(codes) >= 2, codes


def test_the_package_plays_from_the_playlist_with_pyav(daemon: Daemon) -> None:
    """FFmpeg's own HLS demuxer reads the finished package: the frame count and time."""
    with daemon.client() as c:
        c.encode(moving_pattern(50, 64, 96), live="hls")
    with av.open(str(daemon.output_dir / "hls" / "index.m3u8")) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 50
    # B-frames: the fragments' negative composition offsets (CMAF's trun version 1) put
    # the first frame at 0 for a browser; FFmpeg's demuxer shifts the whole video by the
    # encoder's delay instead (two frames here). The frames are evenly spaced either way.
    first, last = float(frames[0].time), float(frames[-1].time)
    assert 0 <= first <= 2 / FPS + 1e-3
    assert last - first == pytest.approx(49 / FPS, abs=1e-3)


def test_the_cli_writes_a_package(daemon: Daemon, tmp_path: Path) -> None:
    from .helpers import daemon_command

    source = tmp_path / "v.npy"
    np.save(source, moving_pattern(30, 64, 64))
    args = ["encode", str(source), "-o", str(tmp_path / "v.mp4"), "--socket", daemon.socket]
    args += ["--live", "cli", "--live-segment", "1", "--live-part", "0.25"]
    done = subprocess.run([*daemon_command(), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    pl = playlist(daemon.output_dir / "cli")
    assert pl is not None
    check_rules(pl, 30, 1.0, 0.25)
    assert len(decode(tmp_path / "v.mp4")[0]) == 30


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Live(3), "live.folder"),  # type: ignore[arg-type]
        (lambda: Live("x", segment_s="2"), "live.segment_s"),  # type: ignore[arg-type]
        (lambda: Live("x", part_s=float("nan")), "live.part_s"),
        (lambda: Live("x", overwrite=1), "live.overwrite"),  # type: ignore[arg-type]
    ],
)
def test_live_checks_its_own_types(make: Any, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        make()


def test_live_names_its_playlists() -> None:
    live = Live(Path("jobs/42"))
    assert live.playlist == "jobs/42/index.m3u8"
    assert live.multivariant_playlist == "jobs/42/master.m3u8"


def test_live_takes_a_folder_or_a_live(daemon: Daemon) -> None:
    with daemon.client() as c, pytest.raises(InvalidArgument, match="a folder or a Live"):
        c.encode(moving_pattern(2, 32, 32), live=5)  # type: ignore[arg-type]
    with daemon.client() as c:
        c.encode(moving_pattern(2, 32, 32), live=Path("as-path"))
    assert playlist(daemon.output_dir / "as-path") is not None


def demuxed_audio(path: Path | bytes) -> list[bytes]:
    import io

    with av.open(io.BytesIO(path) if isinstance(path, bytes) else str(path)) as container:
        return [bytes(p) for p in container.demux(audio=0) if p.size]


def test_audio_goes_into_the_package_as_its_own_rendition(daemon: Daemon) -> None:
    """Audio sent with a stream's opening: an audio rendition written as the chunks come,
    beside the video's, under a multivariant playlist; the MP4's AAC packets, not a
    second encode; as long as the video."""
    folder = daemon.output_dir / "sound"
    seen: dict[str, bytes] = {}
    open_playlists: set[str] = set()
    rate, frames = 48000, 96
    t = np.arange(frames * rate // FPS) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[:, None]
    live = Live("sound", segment_s=1, part_s=0.25)
    video = moving_pattern(frames, 96, 128)
    with (
        daemon.client() as c,
        c.stream(fps=FPS, path="sound.mp4", live=live, audio=pcm, sample_rate=rate) as s,
    ):
        for start in range(0, frames, 12):
            s.write(video[start : start + 12])
            time.sleep(0.15)
            for name in ("index.m3u8", "audio.m3u8", "master.m3u8"):
                if (folder / name).exists() and name != "master.m3u8":
                    check_named_files_are_whole(folder, seen, name)
                    open_playlists.add(name)
                elif (folder / name).exists():
                    open_playlists.add(name)
    assert open_playlists == {"index.m3u8", "audio.m3u8", "master.m3u8"}, open_playlists
    for name in ("index.m3u8", "audio.m3u8"):
        check_named_files_are_whole(folder, seen, name)
    check_rules(playlist(folder), frames, 1.0, 0.25)  # type: ignore[arg-type]
    audio = playlist(folder, "audio.m3u8")
    assert audio is not None
    aac_frame = 1024 / rate
    check_rules(audio, frames, 1.0, 0.25 + 2 * aac_frame, "audio.mp4", slack=2 * aac_frame)
    main = playlist(folder, "master.m3u8")
    assert main is not None and main.is_variant
    [variant] = main.playlists
    info = variant.stream_info
    assert info.codecs.startswith("avc1.64") and info.codecs.endswith(",mp4a.40.2")
    assert info.resolution == (128, 96) and info.bandwidth > 0 and info.audio == "audio"
    assert variant.uri == "index.m3u8"
    [media] = main.media
    assert (media.type, media.group_id, media.uri, media.default) == (
        "AUDIO", "audio", "audio.m3u8", "YES"
    )  # fmt: skip
    # One audio encode: the package carries the MP4's AAC packets, in order.
    carried = (folder / "audio.mp4").read_bytes()
    carried += b"".join((folder / seg.uri).read_bytes() for seg in audio.segments)
    assert demuxed_audio(carried) == demuxed_audio(daemon.output_dir / "sound.mp4")
    # Read through the multivariant playlist: the video's frames, audio as long.
    assert probe_frames(folder / "master.m3u8") == frames
    with av.open(str(folder / "master.m3u8")) as container:
        samples = sum(f.samples for f in container.decode(audio=0))
    assert abs(samples / rate - frames / FPS) <= aac_frame


def test_audio_sent_with_the_end_is_packaged_at_the_end(daemon: Daemon) -> None:
    """Audio declared at the opening, its samples sent with the end: the video's playlist
    meanwhile, the audio rendition and the multivariant playlist once the stream ends."""
    folder = daemon.output_dir / "later"
    rate, frames = 48000, 192  # the encoder's lookahead holds back 40-odd frames
    video = moving_pattern(frames, 64, 64)
    with daemon.client() as c:
        s = c.stream(fps=FPS, live=Live("later", segment_s=1), sample_rate=rate, channels=1)
        for start in range(0, frames, 24):
            s.write(video[start : start + 24])
        deadline = time.monotonic() + 10
        while not (folder / "index.m3u8").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not (folder / "audio.m3u8").exists() and not (folder / "master.m3u8").exists()
        s.close(np.zeros((rate * frames // FPS, 1), np.float32), rate)
    main = playlist(folder, "master.m3u8")
    assert main is not None and main.media[0].uri == "audio.m3u8"
    with av.open(str(folder / "master.m3u8")) as container:
        samples = sum(f.samples for f in container.decode(audio=0))
    assert abs(samples / rate - frames / FPS) <= 1024 / rate
