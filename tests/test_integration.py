"""End to end: the real daemon in a subprocess, the real client, decoded output."""

from __future__ import annotations

import os
import select
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.patterns import moving_pattern

from .helpers import Daemon, decode, mapped_segments, psnr, recorded_ways


@pytest.fixture(scope="module")
def video() -> np.ndarray:
    return moving_pattern(24, 144, 256)


def test_bytes_round_trip(client: Any, video: np.ndarray) -> None:
    result = client.encode(video, fps=24)

    assert result.path is None and result.data is not None
    assert result.size_bytes == len(result.data)
    assert result.frames == 24 and result.duration == pytest.approx(1.0)
    frames, facts = decode(result.data)
    assert frames.shape == video.shape
    assert facts["codec"] == "h264" and facts["pix_fmt"] == "yuv420p"
    assert facts["rate"] == Fraction(24)
    assert psnr(frames, video) >= 40
    # Plain MP4 with the index up front, so it plays while it downloads.
    assert result.data[4:8] == b"ftyp" and result.data.find(b"moov") < result.data.find(b"mdat")


def test_path_round_trip(daemon: Daemon, client: Any, twin: str, video: np.ndarray) -> None:
    result = client.encode(video, fps=24, path=f"clips/{twin}/first.mp4")

    assert result.data is None
    path = Path(result.path or "")
    assert path == daemon.output_dir.resolve() / f"clips/{twin}/first.mp4"
    assert path.stat().st_size == result.size_bytes
    frames, _ = decode(path)
    assert frames.shape == video.shape and psnr(frames, video) >= 40
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "temp file left"


def test_colour_is_tagged_bt709_limited(client: Any, video: np.ndarray) -> None:
    _, facts = decode(client.encode(video[:4]).data or b"")
    assert (facts["colorspace"], facts["color_primaries"], facts["color_trc"]) == (1, 1, 1)
    assert facts["color_range"] == 1  # limited ("tv")


def test_same_frames_same_bytes(client: Any, video: np.ndarray) -> None:
    """The daemon is deterministic: the same frames give the same MP4."""
    a = client.encode(video[:8], threads=1)
    b = client.encode(video[:8].copy(), threads=1)
    assert a.data == b.data


@pytest.mark.parametrize("pixel_format", ["bgr24", "rgba", "gray", "yuv420p", "nv12"])
def test_pixel_formats(client: Any, video: np.ndarray, pixel_format: str) -> None:
    rgb = video[:6]
    if pixel_format == "bgr24":
        data, expect = rgb[..., ::-1], rgb
    elif pixel_format == "rgba":
        data = np.concatenate([rgb, np.full((*rgb.shape[:3], 1), 255, np.uint8)], axis=-1)
        expect = rgb
    elif pixel_format == "gray":
        data = rgb[..., 1].copy()
        expect = np.repeat(data[..., None], 3, axis=-1)
    else:
        import av

        planes = []
        for frame in rgb:
            yuv = av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(
                format=pixel_format,
                src_colorspace="itu709",
                dst_colorspace="itu709",
                src_color_range="JPEG",
                dst_color_range="MPEG",
            )
            planes.append(yuv.to_ndarray())
        data, expect = np.stack(planes), rgb

    result = client.encode(data, pixel_format=pixel_format)
    frames, _ = decode(result.data or b"")
    assert frames.shape == expect.shape
    assert psnr(frames, expect) >= 35


def test_cpu_tensor(client: Any, video: np.ndarray) -> None:
    torch = pytest.importorskip("torch")
    result = client.encode(torch.from_numpy(video[:6]), fps=24)
    frames, _ = decode(result.data or b"")
    assert psnr(frames, video[:6]) >= 40


def test_non_contiguous_input(client: Any, video: np.ndarray) -> None:
    strided = video[::2, :, ::-1]  # every other frame, mirrored: no contiguous memory
    result = client.encode(strided)
    frames, _ = decode(result.data or b"")
    assert psnr(frames, strided) >= 40


def test_video_split_across_leases(make_daemon, connect, video: np.ndarray) -> None:
    """A video larger than one slab travels as several frame ranges, each its own lease."""
    d = make_daemon(slabs=8, slab_size="1MiB")
    frames_in = moving_pattern(40, 144, 256)  # 110 KiB a frame: 9 frames a lease, 5 leases
    with connect(d) as c:
        result = c.encode(frames_in)
        status = c.status()
    frames, _ = decode(result.data or b"")
    assert psnr(frames, frames_in) >= 40
    assert status.counters["leases_granted"] == 5
    assert status.pool["leased_bytes"] == 0


def test_codecs(client: Any, video: np.ndarray) -> None:
    for codec, name in (("h265", "hevc"), ("av1", "libdav1d")):
        result = client.encode(video[:6], codec=codec)
        frames, facts = decode(result.data or b"")
        assert result.codec == codec
        assert facts["codec"] in {name, "av1", "hevc"}
        assert psnr(frames, video[:6]) >= 35


def test_codec_options(client: Any, video: np.ndarray) -> None:
    small = client.encode(video[:12], crf=40, preset="veryfast", gop=4)
    big = client.encode(video[:12], crf=10)
    assert small.size_bytes < big.size_bytes


def test_progress_callback(client: Any, video: np.ndarray) -> None:
    seen: list[tuple[int, int]] = []
    client.encode(video, on_progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (24, 24)


def test_concurrent_encodes_on_one_client(client: Any, video: np.ndarray) -> None:
    """One client shared by threads (on the async twin: concurrent tasks on its loop)."""
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: client.encode(video[:8]), range(3)))
    assert client.health() == "SERVING"
    for result in results:
        frames, _ = decode(result.data or b"")
        assert psnr(frames, video[:8]) >= 40


@pytest.mark.exclusive
def test_status_and_health_answer_during_long_encode(client: Any) -> None:
    long_video = moving_pattern(120, 288, 512)  # 53 MB: fits the 64 MiB pool
    results: list[Any] = []
    encode = threading.Thread(
        target=lambda: results.append(client.encode(long_video, preset="medium", threads=1))
    )
    encode.start()
    try:
        for _ in range(1000):
            status = client.status()
            if status.active_encodes or not encode.is_alive():
                break
            time.sleep(0.01)
        assert status.active_encodes == 1, "the encode never started"
        t0 = time.monotonic()
        assert client.health() == "SERVING"
        client.status()
        latency = time.monotonic() - t0
        assert encode.is_alive()
    finally:
        encode.join()
    assert results[0].frames == 120
    assert latency < 1.0


def test_slabs_are_private(daemon: Daemon) -> None:
    segments = daemon.segments()
    assert len(segments) == 4 + 1  # slabs and the instance lock
    for name in segments:
        mode = stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode)
        assert mode == 0o600, (name, oct(mode))
    socket_mode = stat.S_IMODE(os.stat(daemon.socket).st_mode)
    assert socket_mode == 0o600


def test_status_counts(daemon: Daemon, connect, video: np.ndarray) -> None:
    with connect(daemon) as c:
        before = c.status()
        c.encode(video[:4])
        during = c.status()
    with connect(daemon) as c:
        after = c.status()
    assert after.counters["encodes_ok"] == before.counters["encodes_ok"] + 1
    assert after.counters["frames_encoded"] == before.counters["frames_encoded"] + 4
    assert after.pool["total_bytes"] == 4 * 16 * 1024 * 1024
    # The client held one spare lease for its next request, and gave it back on close.
    assert during.pool["active_leases"] == 1
    assert after.pool["leased_bytes"] == 0 and after.pool["active_leases"] == 0


def test_spare_lease_saves_a_round_trip(daemon: Daemon, connect, video: np.ndarray) -> None:
    with connect(daemon) as c:
        c.encode(video[:4])
        granted = c.status().counters["leases_granted"]
        for _ in range(5):
            c.encode(video[:4])
        # Each request used the spare from the previous result: one lease per request,
        # granted by the daemon alongside the result, and no Lease call.
        status = c.status()
        assert status.counters["leases_granted"] == granted + 5
        assert status.pool["active_leases"] == 1  # the spare, for the next request
        small_spare = status.pool["leased_bytes"]
        c.encode(video[:8])  # larger: the spare is too small, given back, a fresh lease taken
        status = c.status()
        assert status.counters["leases_granted"] == granted + 7  # the fresh one, a new spare
        assert status.pool["active_leases"] == 1
        assert status.pool["leased_bytes"] == 2 * small_spare  # sized for the last request


def _in_a_forked_child(action: Any, timeout: float, capfd: Any) -> bytes:
    """What `action()` returns in a child after fork (which then leaves at once), or
    why there is nothing.

    gRPC runs its fork handlers only where no other thread of the parent is inside gRPC
    at that moment (its own threads included); otherwise it says so on stderr and the
    child's gRPC may hang or fail. That fork is gRPC's limit, not the client's: it is made
    again (gRPC's own threads may still be busy just after the client's last call)."""
    for _ in range(3):
        answer = _fork_once(action, timeout)
        if "skipping fork()" not in capfd.readouterr().err:
            return answer
    return answer


def _fork_once(action: Any, timeout: float) -> bytes:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, action())
        except BaseException as exc:  # say what went wrong, for the parent's assertion
            os.write(write, f"{type(exc).__name__}: {exc}"[:500].encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], timeout)
        return os.read(read, 600) if ready else f"(no answer in {timeout:g} s)".encode()
    finally:
        os.close(read)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_close_in_a_forked_child_leaves_the_parents_spare_lease(
    daemon: Daemon, connect, video: np.ndarray, capfd: Any
) -> None:
    """A child after fork closing its copy of the client must not give back the parent's
    spare lease (nor use the parent's channel): the parent carries on with it."""
    with connect(daemon) as c:
        c.encode(video[:4])  # the result brings a spare lease
        assert c.status().pool["active_leases"] == 1

        def child() -> bytes:  # close the inherited client, say so, leave at once
            c.close()
            return b"closed"

        assert _in_a_forked_child(child, 20, capfd) == b"closed"
        status = c.status()
        assert status.pool["active_leases"] == 1, "the child gave the parent's spare back"
        granted = status.counters["leases_granted"]
        c.encode(video[:4])  # on the spare: the only lease granted is the next spare
        assert c.status().counters["leases_granted"] == granted + 1


def test_a_forked_child_encodes_on_its_own_connection(
    daemon: Daemon, video: np.ndarray, capfd: Any
) -> None:
    """A child after fork using the inherited client opens its own channel and connections;
    the parent's kept connection is left alone and carries on."""
    from client import SidecarClient, SidecarUnavailable

    with SidecarClient(daemon.socket) as c:
        first = c.encode(video[:4]).data  # leaves a session open and idle

        def child() -> bytes:  # encode, say how it went
            try:
                data = c.encode(video[:4]).data
            except SidecarUnavailable as exc:
                # gRPC's fork support may end the child's first call on its new channel
                # ("Wrong file descriptor generation") while it resets its pollers after
                # the fork, on a loaded machine: the call never reached the daemon.
                if "generation" not in str(exc):
                    raise
                data = c.encode(video[:4]).data
            same = data == first
            c.close()  # gives back the child's own spare lease
            return b"same" if same else b"different"

        assert _in_a_forked_child(child, 30, capfd) == b"same"
        assert c.encode(video[:4]).data == first


def test_slabs_mapped_once_per_client(daemon: Daemon, client: Any, video: np.ndarray) -> None:
    client.encode(video[:2])
    before = mapped_segments(daemon.prefix)
    assert len({name for _, name in before}) == 4  # every slab of the pool
    for _ in range(3):
        client.encode(video[:2])
    assert mapped_segments(daemon.prefix) <= before  # nothing mapped again


def test_clients_attaching_at_once_fill_the_page_tables_once(
    make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight fresh clients of one process attaching together fill each slab's page tables
    once, on one thread; `warm_up()` returns once they are filled, filling none again."""
    from client import SidecarClient, _slabs

    filled: list[int] = []
    threads: set[int] = set()
    real = _slabs._madvise

    def counted(address: int, size: int, advice: int) -> bool:
        filled.append(address)
        threads.add(threading.get_ident())
        return real(address, size, advice)

    monkeypatch.setattr(_slabs, "_madvise", counted)
    daemon = make_daemon()  # slabs this process has not mapped
    clients = [SidecarClient(daemon.socket) for _ in range(8)]
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda c: c.attach(), clients))
        clients[0].warm_up()
        slabs = len(clients[0].attach().slabs)
        assert sorted(filled) == sorted(set(filled)) and len(filled) == slabs
        assert len(threads - {threading.get_ident()}) == 1  # one thread in the background
        clients[1].warm_up()
        assert len(filled) == slabs
    finally:
        for c in clients:
            c.close()


def test_daemon_refuses_second_instance_on_same_prefix(daemon: Daemon) -> None:
    twin = Daemon(daemon.prefix)
    try:
        with pytest.raises(RuntimeError, match="already owns shm prefix"):
            twin.start(timeout=20)
        assert twin.process is not None and twin.process.returncode == 1
    finally:
        twin.cleanup()
    with daemon.client() as c:
        assert c.health() == "SERVING"


def test_warm_encoders_change_nothing_but_time(make_daemon, video: np.ndarray) -> None:
    """Repeated short clips find an encoder opened ahead of time; the bytes are the same."""
    cold = make_daemon(warm_encoders=0)
    warm = make_daemon(warm_encoders=2)
    clip = video[:6]
    with cold.client() as c:
        reference = c.encode(clip, threads=1).data
        assert c.status().counters["warm_hits"] == 0
    with warm.client() as c:
        outputs = []
        for _ in range(4):
            outputs.append(c.encode(clip, threads=1).data)
            time.sleep(0.2)  # the next encoder opens in the background
        saved = c.encode(clip, threads=1, path="warm/clip.mp4")
        counters = c.status().counters
    assert all(out == reference for out in outputs)
    assert Path(saved.path or "").read_bytes() == reference
    assert counters["warm_hits"] >= 3
    assert not [p for p in Path(saved.path or "").parent.iterdir() if p.name.startswith(".")]


def test_outputs_come_in_the_result_or_in_a_lease(
    daemon: Daemon, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encode, the reply stream (a caller that wants progress gets it): a small output
    saves a reply, coming in the result; a large one comes back through shared memory
    (the client maps the slabs, as frames in leases say)."""
    from client._results import ResultBuilder

    kinds: list[str] = []
    feed = ResultBuilder.feed

    def recording_feed(self: ResultBuilder, event: Any) -> bytes | None:
        kind = event.WhichOneof("event")
        if kind == "result":
            kind += "+data" if event.result.data else ""
            kind += "+lease" if event.result.HasField("data_lease") else ""
        if kind != "progress":
            kinds.append(kind)
        return feed(self, event)

    monkeypatch.setattr(ResultBuilder, "feed", recording_feed)
    small = moving_pattern(4, 64, 96)
    rng = np.random.default_rng(7)
    large = rng.integers(0, 256, (12, 256, 320, 3), dtype=np.uint8)  # lossless noise: > 1 MiB
    progress = {"on_progress": lambda done, total: None}
    with connect(daemon) as c:
        small_out = c.encode(small, **progress).data
        assert kinds == ["result+data"]
        kinds.clear()
        large_out = c.encode(large, crf=0, preset="ultrafast", **progress).data
        assert large_out is not None and len(large_out) > 1024 * 1024
        assert kinds in (["result+lease"], ["result+data+lease"])
        status = c.status()
        assert status.pool["active_leases"] <= 1  # the spare: the output's lease went back
    frames, _ = decode(small_out or b"")
    assert len(frames) == 4 and psnr(frames, small) > 35
    assert len(decode(large_out)[0]) == 12


def _recording_results(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each result reaches the client: "stream" for a reply of Encode's stream, then
    where its output was: "data" (inside the result), "lease", or "none" (a file)."""
    from client._results import ResultBuilder

    seen: list[str] = []
    feed, take = ResultBuilder.feed, ResultBuilder.take_result

    def recording_feed(self: ResultBuilder, event: Any) -> bytes | None:
        seen.append("stream")
        return feed(self, event)

    def recording_take(self: ResultBuilder, result: Any) -> None:
        lease = result.HasField("data_lease")
        seen.append("lease" if lease else "data" if result.data else "none")
        take(self, result)

    monkeypatch.setattr(ResultBuilder, "feed", recording_feed)
    monkeypatch.setattr(ResultBuilder, "take_result", recording_take)
    return seen


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc-only"])
def test_a_clip_without_progress_gets_one_reply(
    make_daemon, connect, monkeypatch: pytest.MonkeyPatch, framed: bool
) -> None:  # type: ignore[no-untyped-def]
    """A caller that wants no progress and no chunks gets the result as one reply on the
    framed socket, a file output too: past 1 MiB in a lease the client copies it from and
    gives back. Without the framed socket, Encode's reply stream: small outputs inside
    the result, large ones in a lease."""
    seen = _recording_results(monkeypatch)
    small = moving_pattern(4, 64, 96)
    noise = np.random.default_rng(5).integers(0, 256, (12, 256, 320, 3), dtype=np.uint8)
    with connect(make_daemon(framed_socket=framed)) as c:
        small_out = c.encode(small).data
        large_out = c.encode(noise, crf=0, preset="ultrafast").data  # lossless: > 1 MiB
        saved = c.encode(small, path="once/clip.mp4", overwrite=True)
        fmp4 = c.encode(small, container="fmp4").data
        status = c.status()
    if framed:
        assert seen == ["data", "lease", "none", "data"]
    else:  # each result after its reply stream's events; fragmented MP4 streams back
        assert [s for s in seen if s != "stream"] == ["data", "lease", "none", "none"]
    assert large_out is not None and len(large_out) > 1024 * 1024
    assert len(decode(large_out)[0]) == 12
    for out in (small_out, fmp4, Path(saved.path or "").read_bytes()):
        frames, _ = decode(out or b"")
        assert len(frames) == 4 and psnr(frames, small) > 35
    assert status.pool["active_leases"] == 1  # the spare, nothing else


def test_an_output_comes_back_in_the_next_lease(
    daemon: Daemon, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output over 64 KiB comes at the start of the lease granted for the next
    request; the client copies it out and keeps that lease as its spare, so back-to-back
    clips need no Release, and nothing more is held."""
    from client._results import ResultBuilder

    shared: list[bool] = []
    take = ResultBuilder.take_result

    def recording(self: ResultBuilder, result: Any) -> None:
        take(self, result)
        shared.append(self.output_in_next_lease)

    monkeypatch.setattr(ResultBuilder, "take_result", recording)
    noise = np.random.default_rng(11).integers(0, 256, (4, 128, 160, 3), dtype=np.uint8)
    small = moving_pattern(4, 64, 96)  # an output of a few KiB: inside the result
    with connect(daemon) as c:
        outputs = [c.encode(noise, crf=0, preset="ultrafast").data for _ in range(3)]
        tiny = c.encode(small).data
        status = c.status()
    assert shared == [True, True, True, False]
    assert outputs[0] is not None and len(outputs[0]) > 64 * 1024
    assert outputs[0] == outputs[1] == outputs[2]  # the frames that followed did not touch it
    frames, _ = decode(outputs[0])
    assert len(frames) == 4 and np.array_equal(frames[0].shape, noise[0].shape)
    assert len(decode(tiny or b"")[0]) == 4
    assert status.pool["active_leases"] == 1  # the spare, nothing else


def test_one_reply_past_what_a_lease_holds_comes_inside_it_or_fails_cleanly(
    make_daemon, connect, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """On the framed socket an output past 1 MiB goes back in a lease; where no lease can
    hold it, inside the one reply (there is no gRPC message limit to keep under)."""
    seen = _recording_results(monkeypatch)
    noise = np.random.default_rng(9).integers(0, 256, (6, 720, 1280, 3), dtype=np.uint8)
    with connect(make_daemon()) as c:  # 16 MiB slabs: the ~9 MB output fits one
        out = c.encode(noise, crf=0, preset="ultrafast").data
        status = c.status()
    assert seen == ["lease"] and out is not None and len(out) > 7 * 1024 * 1024
    assert len(decode(out)[0]) == 6
    assert status.pool["active_leases"] == 1
    seen.clear()
    small = make_daemon(slabs=16, slab_size="4MiB")  # no lease holds it
    with connect(small) as c:
        inside = c.encode(noise, crf=0, preset="ultrafast").data
        assert c.status().pool["active_leases"] <= 1  # the spare at most
    assert seen == ["data"] and inside is not None and len(decode(inside)[0]) == 6


def test_an_output_larger_than_a_slab_comes_in_chunks(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """No lease can hold it: on an Encode stream the output travels as chunks, whole, and
    nothing is left."""
    d = make_daemon(slabs=16, slab_size="1MiB", framed_socket=False)
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, (14, 192, 256, 3), dtype=np.uint8)  # lossless: ~1.3 MB
    with connect(d) as c:
        out = c.encode(noise, crf=0, preset="ultrafast").data
        status = c.status()
    assert out is not None and len(out) > 1024 * 1024
    assert len(decode(out)[0]) == 14
    assert status.pool["active_leases"] == 0  # two leases in, none kept, none out


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc-only"])
def test_one_reply_encodes_share_kept_connections(
    make_daemon, connect, twin: str, framed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Clips answered in one reply go on kept connections to the daemon's framed socket,
    one per encode in flight, deadline or not, from either client; without the framed
    socket, on Encode. A refused request leaves a kept connection usable."""
    from client import InvalidArgument

    ways = recorded_ways(monkeypatch)
    d = make_daemon(framed_socket=framed)
    assert Path(f"{d.socket}.framed").is_socket() == framed
    clip = moving_pattern(4, 64, 96)
    with connect(d) as c:
        first = c.encode(clip).data
        with pytest.raises(InvalidArgument, match="crf"):
            c.encode(clip, crf=99)
        with ThreadPoolExecutor(4) as pool:
            outputs = list(pool.map(lambda _: c.encode(clip).data, range(8)))
        timed = c.encode(clip, timeout=30).data
        status = c.status()
    assert ways == ["Framed" if framed else "Encode"] * 11
    assert all(out == first for out in [*outputs, timed])
    assert len(decode(first or b"")[0]) == 4
    assert status.pool["active_leases"] <= 1  # the spare at most
    assert status.active_encodes == 0


def test_shutdown_ends_an_idle_framed_connection_at_once(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """A kept framed connection between requests does not hold the daemon's shutdown: the
    daemon ends it, and the client's next encode says the daemon is unavailable."""
    from client import SidecarUnavailable

    d = make_daemon()
    clip = moving_pattern(2, 48, 64)
    with connect(d) as c:
        assert c.encode(clip).frames == 2  # leaves its connection open and idle
        began = time.monotonic()
        assert d.stop() == 0
        assert time.monotonic() - began < 5  # not held by the idle connection
        with pytest.raises(SidecarUnavailable):
            c.encode(clip)


def test_cancelling_an_awaited_one_reply_encode_stops_it(daemon: Daemon) -> None:
    """An awaited encode answered in one reply, cancelled while the daemon encodes: the
    daemon stops the encode and frees its leases, and the client carries on."""
    import asyncio

    from client import AsyncSidecarClient

    slow = moving_pattern(144, 176, 320)  # 12 MiB as 4:2:0: one reply; seconds to encode

    async def main() -> tuple[int, int, int]:
        async with AsyncSidecarClient(daemon.socket) as c:
            await c.encode(slow[:2])
            task = asyncio.create_task(c.encode(slow, preset="veryslow", crf=0, threads=1))
            for _ in range(200):  # until the daemon is encoding it
                if (await c.status()).active_encodes:
                    break
                await asyncio.sleep(0.01)
            assert not task.done(), task.result()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                status = await c.status()
                if status.active_encodes == 0:
                    break
                await asyncio.sleep(0.05)
            after = await c.encode(slow[:2])
            return status.active_encodes, status.pool["active_leases"], after.frames

    active, leases, frames = asyncio.run(main())
    assert active == 0 and leases <= 1 and frames == 2
