"""Frames that land after their request (`landed_count_offset`), against the real daemon:
the encoder waits for each frame, a count that stalls fails the request, and a request
that ends early gives its leases back instead of freeing them."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from client import SidecarClient
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb

from .helpers import Daemon, RawFramed, decode, psnr

W, H = 128, 96
VIDEO = moving_pattern(24, H, W)
FRAME = W * H * 3


def request(token: str, leases: list[Any], counts: list[int], offset: int) -> pb.FramedRequest:
    pairs = zip(leases, counts, strict=True)
    ranges = [pb.FrameRange(lease_id=lease.id, frame_count=n) for lease, n in pairs]
    output = pb.OutputSpec()
    output.bytes.SetInParent()
    encode = pb.EncodeRequest(
        client_token=token,
        request_id="landing",
        video=pb.VideoDescriptor(
            width=W, height=H, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1), ranges=ranges,
        ),
        output=output,
        landed_count_offset=offset,
    )  # fmt: skip
    return pb.FramedRequest(encode=encode)


def leased(client: SidecarClient, counts: list[int]) -> tuple[list[Any], int]:
    """A lease per range, the last with room for the count after its frames (set to 0)."""
    leases = [
        client.lease(n * FRAME + (4 if k == len(counts) - 1 else 0)) for k, n in enumerate(counts)
    ]
    offset = counts[-1] * FRAME
    leases[-1].array[offset : offset + 4] = 0
    return leases, offset


def count_at(lease: Any, offset: int) -> np.ndarray:
    return lease.array[offset : offset + 4].view("<u4")


def ask(daemon: Daemon, message: pb.FramedRequest) -> RawFramed:
    raw = RawFramed(f"{daemon.socket}.framed", b"VSF2", timeout=60)
    raw.send(message.SerializeToString())
    return raw


@pytest.mark.parametrize("processes", [None, 0], ids=["encoder-processes", "in-daemon"])
def test_the_encoder_waits_for_frames_that_land_after_the_request(make_daemon, processes) -> None:  # type: ignore[no-untyped-def]
    """The request goes first, the frames follow in pieces with pauses, the count rising
    after each: the video comes back whole and right, as an encode of frames that had
    all landed gives it."""
    options = {} if processes is None else {"encoder_processes": processes}
    d = make_daemon(**options)
    counts = [10, 14]
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        leases, offset = leased(c, counts)
        raw = ask(d, request(token, leases, counts, offset))
        try:
            landed = 0
            for lease, n in zip(leases, counts, strict=True):
                for first in range(0, n, 4):
                    last = min(first + 4, n)
                    piece = VIDEO[landed : landed + last - first]
                    lease.array[first * FRAME : last * FRAME] = piece.reshape(-1)
                    landed += last - first
                    time.sleep(0.03)  # the encoder is left waiting for the next frames
                    count_at(leases[-1], offset)[0] = landed
            reply = raw.reply()
        finally:
            raw.close()
        assert reply.WhichOneof("reply") == "result", reply
        frames, _ = decode(reply.result.data)
        assert len(frames) == len(VIDEO) and psnr(frames, VIDEO) > 35
        # The same frames, landed before the request: the same bytes.
        again, offset = leased(c, counts)
        start = 0
        for lease, n in zip(again, counts, strict=True):
            lease.array[: n * FRAME] = VIDEO[start : start + n].reshape(-1)
            start += n
        count_at(again[-1], offset)[0] = len(VIDEO)
        raw = ask(d, request(token, again, counts, offset))
        try:
            assert raw.reply().result.data == reply.result.data
        finally:
            raw.close()
        assert c.status().pool["active_leases"] <= 1


def test_a_count_that_stops_rising_fails_the_request_and_gives_the_leases_back(
    daemon: Daemon,
) -> None:
    """Half the frames counted, then nothing: INVALID_ARGUMENT on the field after the
    stall limit, and the leases are still the client's to release (not freed under a copy
    that might still land)."""
    counts = [12]
    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        leases, offset = leased(c, counts)
        leases[0].array[: 12 * FRAME] = VIDEO[:12].reshape(-1)
        count_at(leases[0], offset)[0] = 6
        started = time.monotonic()
        raw = ask(daemon, request(token, leases, counts, offset))
        try:
            reply = raw.reply()
        finally:
            raw.close()
        assert time.monotonic() - started >= 10
        assert reply.error.code == 3 and reply.error.field == "landed_count_offset", reply
        assert "6 of 12 counted" in reply.error.message
        assert c.status().pool["active_leases"] >= 1
        c.release(leases[0])  # still ours: NotFound would be raised for a freed one
        assert c.status().pool["active_leases"] == 0


def test_closing_the_connection_while_frames_land_gives_the_leases_back(daemon: Daemon) -> None:
    counts = [12]
    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        leases, offset = leased(c, counts)
        raw = ask(daemon, request(token, leases, counts, offset))
        deadline = time.monotonic() + 10
        while c.status().active_encodes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        raw.close()
        deadline = time.monotonic() + 10
        while c.status().active_encodes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.status().active_encodes == 0
        c.release(leases[0])  # given back, not freed
        assert c.status().pool["active_leases"] == 0
    assert "request_id=landing status=CANCELLED" in daemon.log()


@pytest.mark.parametrize(
    "offset,why",
    [(12 * FRAME + 2, "not a multiple of 4"), (8, "inside the frames"), (1 << 40, "no room")],
    ids=["unaligned", "inside-frames", "past-lease"],
)
def test_a_count_that_cannot_be_there_is_refused_and_the_leases_kept(
    daemon: Daemon, offset: int, why: str
) -> None:
    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        leases, _ = leased(c, [12])
        raw = ask(daemon, request(token, leases, [12], offset))
        try:
            reply = raw.reply()
        finally:
            raw.close()
        assert reply.error.code == 3 and reply.error.field == "landed_count_offset"
        assert why in reply.error.message
        c.release(leases[0])  # refused before anything: still the client's
        assert c.status().pool["active_leases"] == 0


def test_frames_landing_from_another_thread_while_others_encode(daemon: Daemon) -> None:
    """Two requests whose frames land slowly, side by side with one whose frames had
    landed: each comes back right; the waiting ones hold no one else up."""
    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        results: dict[str, bytes] = {}

        def slow(name: str) -> None:
            leases, offset = leased(c, [24])
            raw = ask(daemon, request(token, leases, [24], offset))
            try:
                for k in range(24):
                    leases[0].array[k * FRAME : (k + 1) * FRAME] = VIDEO[k].reshape(-1)
                    count_at(leases[0], offset)[0] = k + 1
                    time.sleep(0.01)
                results[name] = raw.reply().result.data
            finally:
                raw.close()

        threads = [threading.Thread(target=slow, args=(f"slow-{k}",)) for k in range(2)]
        for thread in threads:
            thread.start()
        quick = c.encode(VIDEO, fps=24)
        for thread in threads:
            thread.join()
        assert len(decode(quick.data)[0]) == 24
        for data in results.values():
            frames, _ = decode(data)
            assert len(frames) == 24 and psnr(frames, VIDEO) > 35
        assert c.status().pool["active_leases"] <= 1


# -- the count itself, without a daemon ---------------------------------------------------


def test_a_count_is_waited_for_and_each_frame_handed_out_once_counted() -> None:
    from sidecar.codec.landing import Landing

    slab = np.zeros(64, dtype=np.uint8)
    frames = np.arange(5 * 4, dtype=np.uint8).reshape(5, 4)
    landing = Landing(slab, 8, total=5)
    gated = landing.gate(frames, 0, lambda: None)
    count = slab[8:12].view("<u4")

    def land_slowly() -> None:
        for k in range(1, 6):
            time.sleep(0.02)
            count[0] = k

    lander = threading.Thread(target=land_slowly)
    lander.start()
    got = [(time.monotonic(), image.copy()) for image in gated]
    lander.join()
    assert len(gated) == 5 and landing.complete
    assert [image.tolist() for _, image in got] == frames.tolist()
    assert got[-1][0] - got[0][0] >= 0.06  # each waited for its own count
    count[0] = 2**32 - 1
    assert landing.landed() == 5  # a count past the frames is the frames


def test_a_stalled_count_fails_and_a_check_stops_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.codec import landing as module
    from sidecar.errors import Cancelled, InvalidRequest

    monkeypatch.setattr(module, "STALL_S", 0.1)
    slab = np.zeros(16, dtype=np.uint8)
    slab[:4].view("<u4")[0] = 2
    landing = module.Landing(slab, 0, total=4)
    landing.wait_for(2, lambda: None)  # already there: no wait
    with pytest.raises(InvalidRequest, match="2 of 4 counted") as stalled:
        landing.wait_for(3, lambda: None)
    assert stalled.value.field == "landed_count_offset"

    def stop() -> None:
        raise Cancelled("cancelled by the client")

    with pytest.raises(Cancelled):
        landing.wait_for(3, stop)


@pytest.mark.parametrize(
    "offset,frames_end,size,why",
    [(6, 4, 64, "multiple of 4"), (4, 8, 64, "inside the frames"), (64, 8, 64, "no room")],
)
def test_where_a_count_may_lie(offset: int, frames_end: int, size: int, why: str) -> None:
    from sidecar.codec.landing import check_place
    from sidecar.errors import InvalidRequest

    check_place(8, 8, 12)  # right after the frames, the lease's last 4 bytes
    with pytest.raises(InvalidRequest, match=why):
        check_place(offset, frames_end, size)


LONG = moving_pattern(24, 192, 256)  # 7 frames a 1 MiB slab: four leases


class LandsLater:
    """A host video that stands in for a GPU's: its copies are taken to run on until
    `land`, as a CUDA video's do. Records when each copy is queued."""

    lands_later = True

    def __init__(self, inner: Any, events: list[str], fail_at: int | None = None) -> None:
        self._inner = inner
        self._events = events
        self._fail_at = fail_at
        self.frames, self.width, self.height = inner.frames, inner.width, inner.height
        self.pixel_format, self.frame_bytes = inner.pixel_format, inner.frame_bytes

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        if start == self._fail_at:
            raise RuntimeError("the copy failed")
        self._events.append("copy")
        self._inner.copy_into(region, start, count)

    def finish(self) -> None:
        self._events.append("finish")

    def land(self, count: Any) -> None:
        self.finish()
        count(self.frames)


@pytest.fixture
def lands_later(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every video becomes a `LandsLater`, and counts as long enough to land; returns
    (events, a setter for the frame whose copy fails)."""
    from client import _core, _encode, _framed

    events: list[str] = []
    failing: dict[str, int | None] = {"at": None}
    prepare, frame = _core.ClientCore.prepare, _framed._frame

    def late(self: Any, video: Any, fmt: Any, *args: Any, **kwargs: Any) -> LandsLater:
        return LandsLater(prepare(self, video, fmt, *args, **kwargs), events, failing["at"])

    def framed(request: Any, timeout: float | None) -> bytes:
        if isinstance(request, pb.EncodeRequest):
            events.append("sent")
        return frame(request, timeout)

    monkeypatch.setattr(_core.ClientCore, "prepare", late)
    monkeypatch.setattr(_framed, "_frame", framed)
    monkeypatch.setattr(_encode, "LANDING_MIN_BYTES", 0)
    return events, lambda at: failing.update(at=at)


def test_a_landing_request_goes_before_its_copies_are_queued(  # type: ignore[no-untyped-def]
    make_daemon, connect, lands_later
) -> None:
    """The daemon checks the request while the copies are queued: the request is sent
    as soon as its leases are granted, every copy after it, and the output is the one
    of the same frames sent once copied."""
    events, _ = lands_later
    d = make_daemon(slabs=8, slab_size="1MiB")
    with connect(d) as c:
        landed = c.encode(LONG, fps=24).data
        assert events[0] == "sent" and events.count("copy") == 4, events
        assert events.index("finish") > events.index("copy")
        events.clear()
        with pytest.MonkeyPatch.context() as undo:
            from client import _encode

            undo.setattr(_encode, "LANDING_MIN_BYTES", 1 << 62)  # copied, then sent
            whole = c.encode(LONG, fps=24).data
        assert events.index("sent") > events.index("copy"), events
        assert landed == whole


def test_a_copy_that_fails_after_the_request_went_loses_no_lease(  # type: ignore[no-untyped-def]
    make_daemon, connect, lands_later
) -> None:
    """The third lease's copy raises once the request is with the daemon: the caller gets
    that error, the daemon stops the encode, every lease comes back to the pool, and the
    next encode is served."""
    events, fail_at = lands_later
    d = make_daemon(slabs=8, slab_size="1MiB")
    with connect(d) as c:
        fail_at(14)
        with pytest.raises(RuntimeError, match="the copy failed"):
            c.encode(LONG, fps=24)
        assert events == ["sent", "copy", "copy", "finish"], events  # waited, then released
        deadline = time.monotonic() + 10
        while c.status().pool["active_leases"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.status().pool["active_leases"] == 0
        fail_at(None)
        frames, _ = decode(c.encode(LONG, fps=24).data)
        assert len(frames) == len(LONG)
