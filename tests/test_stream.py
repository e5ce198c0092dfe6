"""Streaming encodes, fragmented MP4, WebM, audio, and the inline transport."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import av
import numpy as np
import pytest

from client import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    OutOfRange,
    Reason,
    ResourceExhausted,
)
from client.patterns import moving_pattern

from .helpers import Daemon, decode, psnr, wait_until


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


def test_chunked_equals_whole(client: Any, video: np.ndarray) -> None:
    whole = client.encode(video, threads=1, gop=12)
    with client.stream(fps=24, threads=1, gop=12) as s:
        for chunk in chunks_of(video, 6):
            s.write(chunk)
    assert s.result is not None and s.result.frames == 36
    a, _ = decode(whole.data or b"")
    b, _ = decode(s.result.data or b"")
    assert np.array_equal(a, b)
    assert psnr(b, video) >= 40


def test_stream_frees_each_lease_as_it_goes(make_daemon, connect, video: np.ndarray) -> None:
    """A pool smaller than the video: chunks wait for leases the encoder frees."""
    d = make_daemon(slabs=2, slab_size="1MiB")  # 110 KiB frames: 9 a lease, 18 in the pool
    with connect(d) as c, c.stream(fps=24) as s:
        for chunk in chunks_of(video, 9):
            s.write(chunk)
    frames, _ = decode(s.result.data or b"")
    assert frames.shape == video.shape and psnr(frames, video) >= 40
    with connect(d) as c:
        status = c.status()
    assert status.pool["active_leases"] == 0 and status.counters["leases_granted"] == 4


def test_large_video_is_streamed_by_encode(make_daemon, connect) -> None:
    d = make_daemon(slabs=4, slab_size="1MiB")
    big = moving_pattern(60, 144, 256)  # 6.6 MB: more than the whole 4 MiB pool
    with connect(d) as c:
        result = c.encode(big)
    frames, _ = decode(result.data or b"")
    assert frames.shape == big.shape and psnr(frames, big) >= 40
    assert result.timings.transfer_ms >= result.timings.copy_ms > 0


def test_a_deadline_mid_stream_leaves_no_lease(make_daemon, connect) -> None:
    """Encode streams a video larger than the pool, and its deadline passes while chunks
    are still on their way: the daemon frees the leases it received, and the client the
    ones it sent that never arrived."""
    d = make_daemon()  # 64 MiB: the last chunks fit once the encoder frees the first
    grain = np.random.default_rng(3).integers(0, 256, (240, 360, 640, 3), dtype=np.uint8)
    with connect(d) as c:
        # The deadline, or first the wait for a lease the slow encoder has not freed.
        with pytest.raises((DeadlineExceeded, ResourceExhausted)):
            c.encode(grain, preset="veryslow", timeout=1.0)
        # The encoder stops at its next frame, and frees the leases then.
        status = wait_for_idle(c, timeout=10)
    assert status.pool["active_leases"] == 0, status.pool


def test_fragmented_mp4_arrives_before_the_last_chunk(client: Any, video: np.ndarray) -> None:
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


def test_chunks_can_be_read_while_writing(client: Any, video: np.ndarray) -> None:
    pieces: list[bytes] = []
    with client.stream(fps=24, container="fmp4", gop=6) as s:
        reader = threading.Thread(target=lambda: pieces.extend(s.chunks()))
        reader.start()
        for chunk in chunks_of(video, 6):
            s.write(chunk)
    reader.join(30)
    assert not reader.is_alive(), "chunks() did not end with the stream"
    assert s.result is not None and b"".join(pieces) == s.result.data


def test_webm_with_opus(client: Any, video: np.ndarray) -> None:
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
def test_audio_durations_match_the_video(client: Any, video: np.ndarray, dtype: str) -> None:
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


def test_audio_sent_at_the_end_of_a_stream(client: Any, video: np.ndarray) -> None:
    short = np.zeros((22050, 1), np.float32)  # 0.5 s of mono for 1.5 s of video: padded
    short[:, 0] = 0.2
    with client.stream(fps=24, sample_rate=22050, channels=1) as s:
        for chunk in chunks_of(video, 12):
            s.write(chunk)
        s.close(audio=short)
    audio_s, video_s, _, _ = audio_facts(s.result.data or b"")  # type: ignore[union-attr]
    assert abs(audio_s - video_s) <= 1024 / 22050


def wait_for_idle(c: Any, leases: int = 0, timeout: float = 5.0) -> Any:
    """The daemon's status once no encode runs and at most `leases` leases are out."""
    deadline = time.monotonic() + timeout
    while True:
        status = c.status()
        idle = status.pool["active_leases"] <= leases and status.active_encodes == 0
        if idle or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_cancelling_a_stream_frees_its_leases(daemon: Daemon, connect, video: np.ndarray) -> None:
    with connect(daemon) as c:
        before = c.status().counters
        failed, requests = before["encodes_failed"], before["requests"]
        with pytest.raises(RuntimeError, match="stop"), c.stream(fps=24) as s:
            s.write(video[:12])
            s.write(video[12:24])
            # Once the daemon has the stream, its end must be counted. (A call the client
            # cancels before it arrives is no request at all: under load the async client's
            # writes may still be on their way.)
            assert wait_until(lambda: c.status().counters["requests"] > requests)
            raise RuntimeError("stop")
        status = wait_for_idle(c)
        assert status.pool["active_leases"] == 0 and status.active_encodes == 0
        # Counted as the call's end is logged, a moment after its encode stopped.
        deadline = time.monotonic() + 5
        while c.status().counters["encodes_failed"] != failed + 1:
            assert time.monotonic() < deadline, "the cancelled stream was not counted"
            time.sleep(0.02)
        assert c.encode(video[:6]).frames == 6  # still serving
        with pytest.raises(InvalidArgument, match="closed"):
            s.write(video[:6])


def test_a_failed_close_still_ends_the_stream(daemon: Daemon, connect, video: np.ndarray) -> None:
    """`close` that fails on its way (here the end audio cannot be leased) still ends the
    requests, so the daemon ends the stream and frees its leases: no `cancel` needed."""
    with connect(daemon) as c:
        s = c.stream(fps=24, sample_rate=48000, channels=1)
        s.write(video[:12])
        too_long = np.zeros((16 * 1024 * 1024 // 4 + 1024, 1), np.float32)  # over a slab
        with pytest.raises(OutOfRange) as info:
            s.close(audio=too_long)
        assert info.value.reason is Reason.OUT_OF_RANGE
        status = wait_for_idle(c)
        assert status.active_encodes == 0, "the stream is still open in the daemon"
        assert status.pool["active_leases"] == 0


KILLED_CLIENT = {
    "sync": """
        c = SidecarClient({socket!r})
        held = c.lease(1 << 20)                      # leased, never sent
        s = c.stream(fps=24)
        s.write(np.zeros((4, 64, 64, 3), np.uint8))   # sent into a stream
        die()
        """,
    "async": """
        async def main():
            c = AsyncSidecarClient({socket!r})
            held = await c.lease(1 << 20)
            s = c.stream(fps=24)
            await s.write(np.zeros((4, 64, 64, 3), np.uint8))
            die()
        asyncio.run(main())
        """,
}


def test_killed_client_leases_come_back_within_the_ttl(make_daemon, connect, twin: str) -> None:
    d = make_daemon(lease_ttl=2)
    script = textwrap.dedent(
        """
        import asyncio, os, signal
        import numpy as np
        from client import AsyncSidecarClient, SidecarClient
        def die():
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    ) + textwrap.dedent(KILLED_CLIENT[twin].format(socket=d.socket))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "ready" in out.stdout, out.stderr
    with connect(d) as c:
        deadline = time.monotonic() + 10
        while c.status().pool["active_leases"] and time.monotonic() < deadline:
            time.sleep(0.2)
        status = c.status()
    assert status.pool["active_leases"] == 0 and status.pool["leased_bytes"] == 0


def test_inline_transport_gives_the_same_frames(daemon: Daemon, connect, video: np.ndarray) -> None:
    with connect(daemon) as shm, connect(daemon, transport="inline") as inline:
        a = shm.encode(video, threads=1)
        b = inline.encode(video, threads=1)
        assert inline.inline and not shm.inline
        with inline.stream(fps=24, threads=1) as s:
            for chunk in chunks_of(video, 5):
                s.write(chunk)
    fa, _ = decode(a.data or b"")
    fb, _ = decode(b.data or b"")
    fc, _ = decode(s.result.data or b"")
    assert np.array_equal(fa, fb) and np.array_equal(fa, fc)


def test_inline_frames_larger_than_a_message(daemon: Daemon, connect) -> None:
    big = moving_pattern(3, 1088, 1920)  # 6 MB frames: each spans two messages
    with connect(daemon, transport="inline") as c:
        result = c.encode(big)
    frames, _ = decode(result.data or b"")
    assert frames.shape == big.shape and psnr(frames, big) >= 40


def test_a_chunk_refused_mid_stream_ends_it_cleanly(make_daemon, connect) -> None:
    """The daemon refuses the stream at its second chunk (over --max-frames): the error
    reaches the writer, the stream's leases come back, and the client carries on."""
    d = make_daemon(max_frames=10)
    video = moving_pattern(12, 64, 64)
    with connect(d) as c:
        with pytest.raises(OutOfRange, match="frames") as info, c.stream(fps=24) as s:
            s.write(video[:6])
            s.write(video[6:])  # refused by the daemon after the client sent it
            time.sleep(0.5)
            s.write(video[:2])  # the refusal has arrived by now: raised here, or at close
        assert info.value.reason is Reason.OUT_OF_RANGE
        status = wait_for_idle(c)
        assert status.pool["active_leases"] == 0 and status.active_encodes == 0
        assert c.encode(video[:6]).frames == 6


def test_writing_a_different_size_is_refused(client: Any, video: np.ndarray) -> None:
    with pytest.raises(InvalidArgument, match="chunk is"), client.stream(fps=24) as s:
        s.write(video[:6])
        s.write(moving_pattern(6, 64, 64))


def test_closing_a_cancelled_stream_says_it_was_cancelled(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """The same error from both clients, in the project's words, and nothing held."""
    d = make_daemon()
    with connect(d) as c:
        s = c.stream(fps=24)
        s.write(np.zeros((4, 64, 64, 3), np.uint8))
        s.cancel()
        with pytest.raises(Cancelled, match=r"^the stream was cancelled$"):
            s.close()
        assert wait_for_idle(c, timeout=10).pool["active_leases"] == 0


@pytest.mark.exclusive
def test_a_stream_between_chunks_holds_no_encode_slot(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """One encode slot and a stream open between chunks: a whole video sent meanwhile is
    encoded at once (it would wait for the stream's end if the stream held the slot, and
    the stream's next chunk would wait for the room that video holds: a stall of
    --max-lease-wait, then a refusal), and the stream's next chunk then goes in."""
    d = make_daemon(slabs=2, slab_size="16MiB", max_concurrent_encodes=1, max_lease_wait=15)
    chunk = moving_pattern(24, 360, 640)  # 16.6 MB: a slab, nearly whole
    with d.client() as a, d.client() as b, d.client() as c:
        s = a.stream(fps=24)
        s.write(chunk)
        t0 = time.monotonic()
        other = b.encode(chunk)  # while the stream is open between chunks
        alone = time.monotonic() - t0
        # The stream waits for a chunk, slot-free (`other` is counted until a moment after
        # its result went; a stream holding its slot would stay counted).
        deadline = time.monotonic() + 5
        while c.status().active_encodes and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.status().active_encodes == 0
        t0 = time.monotonic()
        s.write(chunk)
        waited = time.monotonic() - t0
        result = s.close()
        assert alone < 10 and waited < 10, (alone, waited)  # 15 s and a refusal before
        assert result.frames == 48 and other.frames == 24
        assert wait_for_idle(c).pool["active_leases"] == 0


def test_chunks_end_when_a_stream_ends_before_its_first_chunk(client: Any) -> None:
    """Read from another thread, as `chunks()` is meant to be: it ends, it does not wait
    for a reader that never started."""
    s = client.stream(fps=24, container="fmp4")
    got: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: got.append(list(s.chunks())))
    reader.start()
    with pytest.raises(RuntimeError, match="before any frame"), s:
        raise RuntimeError("the model failed before any frame")
    reader.join(10)
    assert not reader.is_alive() and got == [[]]
    assert list(s.chunks()) == []  # a second reading ends at once too


def test_a_wrong_track_at_close_leaves_the_stream_open(client: Any, video: np.ndarray) -> None:
    """A track that is not what was declared is refused before anything ends the stream;
    the right one, int16 too, closes it."""
    s = client.stream(fps=24, sample_rate=22050, channels=2)
    s.write(video)
    with pytest.raises(InvalidArgument, match="2-channel"):
        s.close(audio=np.zeros((22050, 1), np.float32))
    tone = (np.full((22050, 2), 0.2) * 32767).astype(np.int16)
    result = s.close(audio=tone)
    audio_s, video_s, _, _ = audio_facts(result.data or b"")
    assert result.frames == len(video) and abs(audio_s - video_s) <= 1024 / 22050


@pytest.mark.parametrize("callback", ["on_chunk", "on_progress"])
def test_a_stream_callback_that_raises_gives_the_caller_its_error(
    make_daemon, connect, video: np.ndarray, callback: str
) -> None:  # type: ignore[no-untyped-def]
    """Raised on the reader (a thread, or a task), it reaches the caller as it was, not
    as the daemon's failure; no lease stays out."""

    def broken(*_: object) -> None:
        raise ZeroDivisionError("the caller's own bug")

    d = make_daemon()
    with connect(d) as c:
        with (
            pytest.raises(ZeroDivisionError, match="own bug"),
            c.stream(fps=24, container="fmp4", **{callback: broken}) as s,
        ):
            for chunk in chunks_of(video, 12):
                s.write(chunk)
        assert wait_for_idle(c, timeout=10).pool["active_leases"] == 0


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "5"])
def test_a_stream_timeout_must_be_a_positive_number(client: Any, timeout: Any) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        client.stream(fps=24, timeout=timeout)


def test_a_stream_ends_at_its_timeout_and_frees_its_leases(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """Chunks written slowly, past the stream's `timeout`: a write (or the close) raises
    DeadlineExceeded well before the writer would stop, and no lease stays held."""
    d = make_daemon()
    chunk = np.zeros((4, 64, 96, 3), np.uint8)
    with connect(d) as c:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded), c.stream(fps=24, timeout=0.8) as s:
            while time.monotonic() - t0 < 10:
                s.write(chunk)
                time.sleep(0.05)
        assert time.monotonic() - t0 < 3
        status = wait_for_idle(c, leases=1, timeout=10)
        assert status.pool["active_leases"] <= 1, status.pool  # the client's spare at most
        with c.stream(fps=24, timeout=5) as s:  # the next one, within its timeout, encodes
            s.write(chunk)
        assert s.result.frames == 4


def test_streams_left_or_cancelled_at_any_moment_end_as_cancelled(  # type: ignore[no-untyped-def]
    make_daemon, connect, twin: str
) -> None:
    """A `with` block left by an exception, or (async) a task cancelled while it writes:
    the call ends at once, the daemon logs it as CANCELLED (not as a stream missing its
    end), and nothing stays held. Before, a cancel that came as a framed reply did was
    lost under Python 3.11's `asyncio.wait_for`, and the cancelled writer wrote on."""
    import asyncio
    import json
    import random

    from client import AsyncSidecarClient

    d = make_daemon(log_json="true")
    chunk = np.zeros((4, 128, 160, 3), np.uint8)
    rng = random.Random(3)

    class Leaving(Exception):
        pass

    with connect(d) as c:
        for _ in range(12):
            with pytest.raises(Leaving), c.stream(fps=24) as s:
                for _ in range(rng.randint(1, 3)):
                    s.write(chunk)
                raise Leaving()
    if twin == "async":

        async def cancelled_writers() -> None:
            async with AsyncSidecarClient(d.socket) as c:

                async def writes_for_good() -> None:
                    async with c.stream(fps=24) as s:
                        while True:
                            await s.write(chunk)

                for _ in range(20):
                    task = asyncio.create_task(writes_for_good())
                    await asyncio.sleep(rng.uniform(0.005, 0.05))
                    task.cancel()
                    done, _ = await asyncio.wait({task}, timeout=10)
                    assert done, "a cancelled writer wrote on"

        asyncio.run(cancelled_writers())
    with d.client() as c:
        status = wait_for_idle(c, timeout=10)
    assert status.pool["active_leases"] == 0 and status.active_encodes == 0
    time.sleep(0.3)
    records = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    ends = [r["status"] for r in records if "status" in r]
    odd = [r for r in records if r.get("status", "CANCELLED") != "CANCELLED"]
    assert ends and not odd, odd[:5]


def test_a_stalled_daemon_holds_a_stream_no_longer_than_its_timeout(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """The daemon stopped (SIGSTOP) as a stream writes: the write's lease call gives up at
    the stream's timeout, not the 10 s a lease call allows itself past its wait."""
    import os
    import signal

    d = make_daemon()
    chunk = np.zeros((4, 64, 96, 3), np.uint8)
    with connect(d) as c:
        c.encode(chunk)  # attached, connected
        os.kill(d.process.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded), c.stream(fps=24, timeout=1.0) as s:
                s.write(chunk)
            assert time.monotonic() - t0 < 4
        finally:
            os.kill(d.process.pid, signal.SIGCONT)
        assert c.encode(chunk).frames == 4


def test_leaving_a_stream_stalled_with_chunks_in_flight_takes_its_timeout_not_more(  # type: ignore[no-untyped-def]
    make_daemon, connect
) -> None:
    """Chunks written, then the daemon stops: the block ends with DeadlineExceeded about
    the stream's timeout after it began, not 10 s more for each lease it gives back."""
    import os
    import signal

    d = make_daemon()
    chunk = np.zeros((4, 64, 96, 3), np.uint8)
    with connect(d) as c:
        c.encode(chunk)
        t0 = time.monotonic()
        try:
            with pytest.raises(DeadlineExceeded), c.stream(fps=24, timeout=1.5) as s:
                for _ in range(3):
                    s.write(chunk)
                os.kill(d.process.pid, signal.SIGSTOP)
                while True:
                    s.write(chunk)
            assert time.monotonic() - t0 < 1.5 + 3
        finally:
            os.kill(d.process.pid, signal.SIGCONT)
        assert c.encode(chunk).frames == 4
