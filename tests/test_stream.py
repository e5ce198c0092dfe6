"""Streaming encodes, fragmented MP4, WebM, audio, and the inline transport."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import textwrap
import time

import av
import numpy as np
import pytest

from client import AsyncSidecarClient, InvalidArgument, SidecarClient
from client.patterns import moving_pattern

from .helpers import Daemon, decode, psnr


@pytest.fixture(scope="module")
def video() -> np.ndarray:
    return moving_pattern(36, 144, 256)


def chunks_of(video: np.ndarray, k: int) -> list[np.ndarray]:
    return [video[i : i + k] for i in range(0, len(video), k)]


def audio_facts(data: bytes) -> tuple[float, float, int, str]:
    """(decoded audio seconds, video seconds, sample rate, audio codec)."""
    with av.open(io.BytesIO(data)) as c:
        rate = c.streams.audio[0].codec_context.sample_rate
        name = c.streams.audio[0].codec_context.name
        samples = sum(f.samples for f in c.decode(audio=0))
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        frames = sum(1 for _ in c.decode(stream))
        fps = stream.average_rate
    return samples / rate, float(frames / fps), rate, name


def test_chunked_equals_whole(client: SidecarClient, video: np.ndarray) -> None:
    whole = client.encode(video, threads=1, gop=12)
    with client.stream(fps=24, threads=1, gop=12) as s:
        for chunk in chunks_of(video, 6):
            s.write(chunk)
    assert s.result is not None and s.result.frames == 36
    a, _ = decode(whole.data or b"")
    b, _ = decode(s.result.data or b"")
    assert np.array_equal(a, b)
    assert psnr(b, video) >= 40


def test_stream_frees_each_lease_as_it_goes(make_daemon, video: np.ndarray) -> None:
    """A pool smaller than the video: chunks wait for leases the encoder frees."""
    d = make_daemon(slabs=2, slab_size="1MiB")  # 110 KiB frames: 9 a lease, 18 in the pool
    with d.client() as c, c.stream(fps=24) as s:
        for chunk in chunks_of(video, 9):
            s.write(chunk)
    frames, _ = decode(s.result.data or b"")  # type: ignore[union-attr]
    assert frames.shape == video.shape and psnr(frames, video) >= 40
    with d.client() as c:
        status = c.status()
    assert status.pool["active_leases"] == 0 and status.counters["leases_granted"] == 4


def test_large_video_is_streamed_by_encode(make_daemon) -> None:
    d = make_daemon(slabs=4, slab_size="1MiB")
    big = moving_pattern(60, 144, 256)  # 6.6 MB: more than the whole 4 MiB pool
    with d.client() as c:
        result = c.encode(big)
    frames, _ = decode(result.data or b"")
    assert frames.shape == big.shape and psnr(frames, big) >= 40


def test_fragmented_mp4_arrives_before_the_last_chunk(
    client: SidecarClient, video: np.ndarray
) -> None:
    arrivals: list[float] = []
    last_write = 0.0
    with client.stream(
        fps=24, container="fmp4", gop=6, on_chunk=lambda data: arrivals.append(time.monotonic())
    ) as s:
        for chunk in chunks_of(video, 6):
            s.write(chunk)
            time.sleep(0.15)
        last_write = time.monotonic()
    result = s.result
    assert result is not None and result.container == "fmp4"
    assert arrivals and arrivals[0] < last_write
    data = result.data or b""
    assert data[4:8] == b"ftyp" and b"moof" in data
    frames, _ = decode(data)
    assert frames.shape == video.shape and psnr(frames, video) >= 40


def test_webm_with_opus(client: SidecarClient, video: np.ndarray) -> None:
    t = np.arange(int(1.5 * 44100)) / 44100
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    result = client.encode(video, container="webm", audio=pcm, sample_rate=44100)
    frames, facts = decode(result.data or b"")
    assert facts["codec"] in {"vp9", "libvpx-vp9"} and facts["format"].startswith("matroska")
    assert psnr(frames, video) >= 35
    audio_s, video_s, rate, codec = audio_facts(result.data or b"")
    assert codec == "opus" and rate == 48000
    assert abs(audio_s - video_s) <= 960 / 48000 + 1e-6


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_audio_durations_match_the_video(
    client: SidecarClient, video: np.ndarray, dtype: str
) -> None:
    # 2 s of stereo audio for 1.5 s of video: trimmed; the AAC priming is edited out.
    t = np.arange(2 * 44100) / 44100
    wave = 0.3 * np.sin(2 * np.pi * 330 * t)
    pcm = np.stack([wave, wave], 1)
    pcm = (pcm * 32767).astype(np.int16) if dtype == "int16" else pcm.astype(np.float32)
    result = client.encode(video, audio=pcm, sample_rate=44100)
    assert result.audio_samples == round(1.5 * 44100)
    audio_s, video_s, rate, codec = audio_facts(result.data or b"")
    assert codec == "aac" and rate == 44100
    assert abs(audio_s - video_s) <= 1024 / 44100


def test_audio_sent_at_the_end_of_a_stream(client: SidecarClient, video: np.ndarray) -> None:
    short = np.zeros((22050, 1), np.float32)  # 0.5 s of mono for 1.5 s of video: padded
    short[:, 0] = 0.2
    with client.stream(fps=24, sample_rate=22050, channels=1) as s:
        for chunk in chunks_of(video, 12):
            s.write(chunk)
        s.close(audio=short)
    audio_s, video_s, _, _ = audio_facts(s.result.data or b"")  # type: ignore[union-attr]
    assert abs(audio_s - video_s) <= 1024 / 22050


def test_cancelling_a_stream_frees_its_leases(daemon: Daemon, video: np.ndarray) -> None:
    with daemon.client() as c:
        failed = c.status().counters["encodes_failed"]
        with pytest.raises(RuntimeError, match="stop"), c.stream(fps=24) as s:
            s.write(video[:12])
            s.write(video[12:24])
            raise RuntimeError("stop")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            status = c.status()
            if status.pool["active_leases"] == 0 and status.active_encodes == 0:
                break
            time.sleep(0.05)
        assert status.pool["active_leases"] == 0
        assert status.counters["encodes_failed"] == failed + 1
        assert c.encode(video[:6]).frames == 6  # still serving


def test_killed_client_leases_come_back_within_the_ttl(make_daemon) -> None:
    d = make_daemon(lease_ttl=2)
    script = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from client import SidecarClient
        c = SidecarClient({d.socket!r})
        held = c.lease(1 << 20)                      # leased, never sent
        s = c.stream(fps=24)
        s.write(np.zeros((4, 64, 64, 3), np.uint8))   # sent into a stream
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "ready" in out.stdout, out.stderr
    with d.client() as c:
        deadline = time.monotonic() + 10
        while c.status().pool["active_leases"] and time.monotonic() < deadline:
            time.sleep(0.2)
        status = c.status()
    assert status.pool["active_leases"] == 0 and status.pool["leased_bytes"] == 0


def test_inline_transport_gives_the_same_frames(daemon: Daemon, video: np.ndarray) -> None:
    with daemon.client() as shm, daemon.client(transport="inline") as inline:
        a = shm.encode(video, threads=1)
        b = inline.encode(video, threads=1)
        assert inline.inline and not shm.inline
        with inline.stream(fps=24, threads=1) as s:
            for chunk in chunks_of(video, 5):
                s.write(chunk)
    fa, _ = decode(a.data or b"")
    fb, _ = decode(b.data or b"")
    fc, _ = decode(s.result.data or b"")  # type: ignore[union-attr]
    assert np.array_equal(fa, fb) and np.array_equal(fa, fc)


def test_inline_frames_larger_than_a_message(daemon: Daemon) -> None:
    big = moving_pattern(3, 1088, 1920)  # 6 MB frames: each spans two messages
    with daemon.client(transport="inline") as c:
        result = c.encode(big)
    frames, _ = decode(result.data or b"")
    assert frames.shape == big.shape and psnr(frames, big) >= 40


def test_bad_chunk_ends_the_stream_cleanly(daemon: Daemon, video: np.ndarray) -> None:
    with daemon.client() as c:
        with pytest.raises(InvalidArgument, match="frame_count"), c.stream(fps=24) as s:
            s.write(video[:6])
            lease = c.lease(1024 * 1024)
            s._send(__import__("client._stream", fromlist=["lease_chunk"]).lease_chunk(lease, 999))
            time.sleep(0.5)
            s.write(video[6:12])
        time.sleep(0.2)
        c.release(lease)  # refused, so still ours
        assert c.encode(video[:6]).frames == 6


def test_writing_a_different_size_is_refused(client: SidecarClient, video: np.ndarray) -> None:
    with pytest.raises(InvalidArgument, match="chunk is"), client.stream(fps=24) as s:
        s.write(video[:6])
        s.write(moving_pattern(6, 64, 64))


def test_async_stream(daemon: Daemon, video: np.ndarray) -> None:
    async def main() -> tuple[bytes, int]:
        got: list[bytes] = []
        async with AsyncSidecarClient(daemon.socket) as c:
            async with c.stream(fps=24, container="fmp4", on_chunk=got.append) as s:
                for chunk in chunks_of(video, 9):
                    await s.write(chunk)
            assert s.result is not None
            before = (await c.status()).pool["active_leases"]
            with pytest.raises(RuntimeError):
                async with c.stream(fps=24) as s2:
                    await s2.write(video[:6])
                    raise RuntimeError("abandon")
            for _ in range(100):
                if (await c.status()).pool["active_leases"] <= before:
                    break
                await asyncio.sleep(0.05)
            assert (await c.status()).pool["active_leases"] <= before
            return s.result.data or b"", len(got)

    data, pieces = asyncio.run(main())
    assert pieces >= 1
    frames, _ = decode(data)
    assert psnr(frames, video) >= 40
