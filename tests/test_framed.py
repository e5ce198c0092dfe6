"""The framed socket, against the real daemon: its protocol byte by byte, its errors, and
the client's use of it (deadlines, cancelling, fallback, restarts)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb

from .helpers import Daemon, RawFramed, decode, psnr, recorded_ways

CLIP = moving_pattern(3, 48, 64)


def framed_request(**kind: Any) -> bytes:
    return pb.FramedRequest(**kind).SerializeToString()


def framed_to(daemon: Daemon, preamble: bytes = framing.PREAMBLE) -> RawFramed:
    return RawFramed(f"{daemon.socket}.framed", preamble, timeout=30)


def rgb_request(
    token: str, lease_id: str, frames: int = 3, w: int = 64, h: int = 48
) -> pb.EncodeRequest:
    video = pb.VideoDescriptor(
        width=w, height=h, pixel_format=pb.PIXEL_FORMAT_RGB24, fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=lease_id, frame_count=frames)],
    )  # fmt: skip
    output = pb.OutputSpec()
    output.bytes.SetInParent()
    return pb.EncodeRequest(client_token=token, video=video, output=output)


def filled_lease(client: Any, clip: np.ndarray = CLIP) -> str:
    lease = client.lease(clip.nbytes)
    lease.array[: clip.nbytes] = clip.reshape(-1)
    return str(lease.id)


def wait_idle(client: Any, timeout: float = 10.0) -> Any:
    """The daemon's status once no encode runs."""
    end = time.monotonic() + timeout
    while True:
        status = client.status()
        if status.active_encodes == 0 or time.monotonic() > end:
            return status
        time.sleep(0.02)


def test_each_request_gets_one_reply_in_order_and_errors_do_not_end_it(
    daemon: Daemon,
) -> None:
    """Good requests, an unknown lease and bytes that are no message, one connection:
    a reply each, in order; the errors are replies with the status Encode would
    have had, and the connection carries on."""
    from client import SidecarClient

    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        raw = framed_to(daemon)
        try:
            raw.send(framed_request(encode=rgb_request(token, filled_lease(c))))
            raw.send(framed_request(encode=rgb_request(token, "ab" * 16)))
            raw.send(b"\xff\x00\x01")
            raw.send(framed_request(encode=rgb_request(token, filled_lease(c))))
            replies = [raw.reply() for _ in range(4)]
        finally:
            raw.close()
        assert [r.WhichOneof("reply") if r else None for r in replies] == [
            "result", "error", "error", "result"
        ]  # fmt: skip
        assert replies[1] is not None and replies[2] is not None
        assert pb.ErrorReason.Name(replies[1].error.reason) == "ERROR_REASON_LEASE_NOT_FOUND"
        assert replies[1].error.code == 5  # NOT_FOUND
        assert replies[2].error.code == 3 and replies[2].error.field == "request"
        for reply in (replies[0], replies[3]):
            assert reply is not None
            frames, _ = decode(reply.result.data)
            assert len(frames) == 3 and psnr(frames, CLIP) > 35
        assert wait_idle(c).pool["active_leases"] == 0


def test_vsf2_leases_encodes_and_releases_on_one_connection(daemon: Daemon) -> None:
    """ "VSF2": a lease, an encode of the frames written into it, a release, and the
    errors between them (a lease too large, an unknown lease, a request with nothing set,
    bytes that are no message), one reply each, in order; the connection carries on and
    nothing stays leased."""
    from client import SidecarClient

    with SidecarClient(daemon.socket) as c:
        att = c.attach()
        token = att.client_token
        raw = framed_to(daemon)
        try:
            raw.send(framed_request(lease=pb.LeaseRequest(client_token=token, size=CLIP.nbytes)))
            granted = raw.reply()
            assert granted.WhichOneof("reply") == "lease", granted
            lease = granted.lease
            assert lease.size >= CLIP.nbytes and lease.ttl_ms > 0
            region = c._core.slabs.region(lease.slab_id, lease.offset, lease.size)
            region[: CLIP.nbytes] = CLIP.reshape(-1)
            too_large = pb.LeaseRequest(client_token=token, size=att.max_lease_bytes + 1)
            unknown = pb.ReleaseRequest(client_token=token, lease_id="ab" * 16)
            raw.send(framed_request(lease=too_large))
            raw.send(framed_request(release=unknown))
            raw.send(framed_request())
            raw.send(b"\xff\x00\x01")
            raw.send(framed_request(encode=pb.EncodeRequest()))
            raw.send(framed_request(encode=rgb_request(token, lease.lease_id)))
            replies = [raw.reply() for _ in range(6)]
            assert [r.WhichOneof("reply") for r in replies] == ["error"] * 5 + ["result"]
            assert [r.error.code for r in replies[:4]] == [11, 5, 3, 3], replies[
                :4
            ]  # OUT_OF_RANGE first
            assert "nothing set" in replies[2].error.message
            assert replies[3].error.field == "request"
            frames, _ = decode(replies[5].result.data)
            assert len(frames) == 3 and psnr(frames, CLIP) > 35
            # The encode freed its lease; releasing it again is NOT_FOUND, as on gRPC.
            raw.send(
                framed_request(
                    release=pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id)
                )
            )
            again = raw.reply()
            assert again.WhichOneof("reply") == "error" and again.error.code == 5
            raw.send(framed_request(lease=pb.LeaseRequest(client_token=token, size=1)))
            second = raw.reply().lease
            raw.send(
                framed_request(
                    release=pb.ReleaseRequest(client_token=token, lease_id=second.lease_id)
                )
            )
            assert raw.reply().WhichOneof("reply") == "release"
            raw.send(framed_request(lease=pb.LeaseRequest(client_token="nobody", size=1)))
            assert pb.ErrorReason.Name(raw.reply().error.reason) == "ERROR_REASON_NOT_ATTACHED"
        finally:
            raw.close()
        assert wait_idle(c).pool["active_leases"] == 0


def test_the_client_leases_and_releases_on_the_framed_socket(
    make_daemon, connect, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A video of several leases and an output in a lease: no Lease or Release goes over
    gRPC while the framed socket is there."""
    from client import AsyncSidecarClient, SidecarClient
    from client._steps import Call, Exchange

    made: list[str] = []

    def record(op: Any) -> None:
        if isinstance(op, Call):
            made.append(op.method)
        elif isinstance(op, Exchange):
            made.append("framed:" + type(op.request).__name__)

    perform, aperform = SidecarClient._perform, AsyncSidecarClient._perform

    def recording(self: SidecarClient, op: Any) -> Any:
        record(op)
        return perform(self, op)

    async def arecording(self: AsyncSidecarClient, op: Any) -> Any:
        record(op)
        return await aperform(self, op)

    monkeypatch.setattr(SidecarClient, "_perform", recording)
    monkeypatch.setattr(AsyncSidecarClient, "_perform", arecording)
    video = moving_pattern(18, 256, 448, noise=40.0)
    d = make_daemon(slabs=16, slab_size="2MiB")  # 6 frames a lease: 3 leases
    with connect(d) as c:
        result = c.encode(video, crf=0, preset="ultrafast")  # lossless noise: in a lease
        assert result.size_bytes > 1024 * 1024
        assert "Lease" not in made and "Release" not in made, made
        assert made.count("framed:LeaseRequest") == 1  # the three leases in one request
        assert made.count("framed:ReleaseRequest") >= 1
        frames, _ = decode(result.data)
        assert len(frames) == 18
        assert wait_idle(c).pool["active_leases"] <= 1


def test_an_oversized_message_is_refused_and_ends_the_connection(daemon: Daemon) -> None:
    from client import SidecarClient

    raw = framed_to(daemon)
    try:
        raw.sock.sendall(framing.header(0xFFFFFFFF) + b"\x00" * 64)
        reply = raw.reply()
        assert reply is not None and reply.error.code == 3
        assert "over the 8388608-byte limit" in reply.error.message
        assert raw.reply() is None  # then the daemon closes it
    finally:
        raw.close()
    with SidecarClient(daemon.socket) as c:
        assert c.encode(CLIP).frames == 3


@pytest.mark.parametrize(
    "preamble,then",
    [
        (b"GET / HTTP/1.1\r\n\r\n", b""),
        (b"VSF3", b""),
        (b"VSF1", b"\x00\x00\x00\x00"),
        (b"VS", b""),
        (b"VSF2", b"\x00\x00"),
    ],
    ids=["http", "other-version", "retired-version", "cut-preamble", "cut-length"],
)
def test_a_stranger_is_hung_up_on(daemon: Daemon, preamble: bytes, then: bytes) -> None:
    """Bytes that are not the protocol get no reply: the daemon closes the connection
    and keeps serving. "VSF1", a protocol no longer spoken, is one of them."""
    from client import SidecarClient

    raw = framed_to(daemon, preamble)
    try:
        raw.sock.sendall(then)
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.reply() is None
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon hung up while we were still sending
    finally:
        raw.close()
    with SidecarClient(daemon.socket) as c:
        assert c.encode(CLIP).frames == 3
        assert wait_idle(c).pool["active_leases"] <= 1


def _slow_request(c: Any, request_id: str) -> pb.EncodeRequest:
    """A most-of-a-second encode of RGB frames in one lease, as a raw request."""
    slow = moving_pattern(96, 176, 320)
    video = pb.VideoDescriptor(
        width=320, height=176, pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=filled_lease(c, slow), frame_count=96)],
    )  # fmt: skip
    output = pb.OutputSpec()
    output.bytes.SetInParent()
    return pb.EncodeRequest(
        client_token=c.attach().client_token, video=video, output=output,
        codec=pb.CodecOptions(preset="veryslow", threads=1, crf=0), request_id=request_id,
    )  # fmt: skip


def test_closing_the_connection_stops_its_encode(daemon: Daemon) -> None:
    from client import SidecarClient

    with SidecarClient(daemon.socket) as c:
        raw = framed_to(daemon)
        raw.send(framed_request(encode=_slow_request(c, "close-me")))
        for _ in range(300):
            if c.status().active_encodes:
                break
            time.sleep(0.01)
        raw.close()
        status = wait_idle(c)
        assert status.active_encodes == 0
        assert status.pool["active_leases"] == 0
        assert c.encode(CLIP).frames == 3
    assert "request_id=close-me status=CANCELLED" in daemon.log()  # stopped, not finished


def test_a_deadline_on_the_framed_socket_stops_the_encode(daemon: Daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """The client's deadline travels with the encode: the daemon stops it then, frees its
    leases, and logs it as the deadline's, not as a cancel. The next encode works."""
    from client import DeadlineExceeded

    # 12 MiB as 4:2:0: one reply; over a second at this preset on a fast core
    slow = moving_pattern(144, 176, 320)
    request_id = f"late-{id(connect)}"
    with connect(daemon) as c:
        c.encode(CLIP)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            c.encode(slow, preset="veryslow", crf=0, threads=1, timeout=0.15, request_id=request_id)
        assert time.monotonic() - started < 5
        status = wait_idle(c)
        assert status.active_encodes == 0 and status.pool["active_leases"] <= 1
        assert c.encode(CLIP).frames == 3
    assert f"request_id={request_id} status=DEADLINE_EXCEEDED" in daemon.log()


def test_the_deadline_a_framed_encode_carries_stops_it_alone(daemon: Daemon) -> None:
    """An encode whose `deadline_unix_s` passes is stopped then and answered
    DEADLINE_EXCEEDED; the connection stays open and serves the next request."""
    from client import SidecarClient

    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        raw = framed_to(daemon)
        try:
            started = time.monotonic()
            raw.send(
                pb.FramedRequest(
                    encode=_slow_request(c, "framed-late"), deadline_unix_s=time.time() + 0.3
                ).SerializeToString()
            )
            late = raw.reply()
            assert late is not None and late.WhichOneof("reply") == "error", late
            assert late.error.code == 4, late  # DEADLINE_EXCEEDED
            assert time.monotonic() - started < 5
            later = time.time() + 60  # one not reached: the encode finishes
            raw.send(
                pb.FramedRequest(
                    encode=rgb_request(token, filled_lease(c)), deadline_unix_s=later
                ).SerializeToString()
            )
            done = raw.reply()
            assert done is not None and done.WhichOneof("reply") == "result", done
            assert len(decode(done.result.data)[0]) == 3
        finally:
            raw.close()
        assert wait_idle(c).pool["active_leases"] == 0
    assert "request_id=framed-late status=DEADLINE_EXCEEDED" in daemon.log()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_framed_deadline_that_is_no_time_is_refused(daemon: Daemon, value: float) -> None:
    """A `deadline_unix_s` that is not a finite time from the epoch: INVALID_ARGUMENT
    naming it, and the request's lease stays the client's, for its next request."""
    from client import SidecarClient

    with SidecarClient(daemon.socket) as c:
        token = c.attach().client_token
        lease = filled_lease(c)
        raw = framed_to(daemon)
        try:
            request = rgb_request(token, lease)
            raw.send(pb.FramedRequest(encode=request, deadline_unix_s=value).SerializeToString())
            refused = raw.reply()
            assert refused is not None and refused.error.code == 3, refused
            assert refused.error.field == "deadline_unix_s"
            raw.send(pb.FramedRequest(encode=request).SerializeToString())
            done = raw.reply()
            assert done is not None and done.WhichOneof("reply") == "result", done
        finally:
            raw.close()
        assert wait_idle(c).pool["active_leases"] == 0


def test_without_the_framed_socket_the_client_uses_grpc(make_daemon, connect, caplog) -> None:  # type: ignore[no-untyped-def]
    """A framed socket that cannot be reached (removed here) reads as a way the daemon
    lacks: the client says so once, goes on over gRPC, and tries the framed socket again
    when it attaches anew."""
    import logging

    caplog.set_level(logging.INFO, logger="client")
    d = make_daemon()
    path = Path(f"{d.socket}.framed")
    with connect(d) as c:
        assert c.encode(CLIP).frames == 3  # on a framed connection, kept
        path.unlink()
        assert c.encode(CLIP).frames == 3  # the kept connection still works
        c.close()
    with connect(d) as c:  # a new client: its first connection fails
        first = c.encode(CLIP)
        assert first.frames == 3 and len(decode(first.data or b"")[0]) == 3
        assert c.encode(CLIP).frames == 3
    said = [r.getMessage() for r in caplog.records if "using gRPC" in r.getMessage()]
    assert said == [
        f"framed socket {path}: No such file or directory; using gRPC until the next attach"
    ]


def test_a_restarted_daemon_is_found_again(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """Kept framed connections to a daemon that went away are dropped, and the next
    encode reaches the new daemon on a new one."""
    d = make_daemon()
    with connect(d) as c:
        assert c.encode(CLIP).frames == 3
        assert d.stop() == 0
        d.start()
        for _ in range(3):
            assert c.encode(CLIP).frames == 3
        assert wait_idle(c).pool["active_leases"] <= 1


def test_shutdown_ends_idle_framed_connections_at_once(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An idle kept connection does not hold the daemon's shutdown for its grace."""
    from client import SidecarClient, SidecarUnavailable

    d = make_daemon(shutdown_grace=20)
    with SidecarClient(d.socket) as c:
        assert c.encode(CLIP).frames == 3
        started = time.monotonic()
        assert d.stop() == 0
        assert time.monotonic() - started < 10
        assert not Path(f"{d.socket}.framed").exists()
        with pytest.raises(SidecarUnavailable):
            c.encode(CLIP)


def test_the_framed_socket_has_the_grpc_sockets_mode(make_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import grp
    import os
    import stat

    private = make_daemon()
    assert stat.S_IMODE(os.stat(f"{private.socket}.framed").st_mode) == 0o600
    group = grp.getgrgid(os.getgid()).gr_name
    shared = make_daemon(shm_group=group, socket=str(tmp_path / "g" / "s.sock"))
    st = os.stat(f"{shared.socket}.framed")
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()


def test_a_file_in_the_way_leaves_grpc_only(make_daemon, connect, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A file that is not a socket where the framed socket would go is left alone: the
    daemon warns and serves gRPC only."""
    sock = tmp_path / "s.sock"
    (tmp_path / "s.sock.framed").write_text("precious")
    d = make_daemon(socket=str(sock))
    assert (tmp_path / "s.sock.framed").read_text() == "precious"
    assert "no framed socket" in d.log()
    with connect(d) as c:
        assert c.encode(CLIP).frames == 3


def test_a_long_video_comes_back_in_one_reply_whatever_its_output(
    make_daemon, connect, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A long video goes on the framed socket all the same, and an output that no lease
    can hold (larger than a slab) comes back inside the reply: lossless noise, 10 MB,
    through 2 MiB slabs. On gRPC alone the same request goes on an Encode stream."""
    ways = recorded_ways(monkeypatch)
    noise = np.random.default_rng(7).integers(0, 256, (24, 480, 640, 3), dtype=np.uint8)
    outputs = []
    for framed in (True, False):
        d = make_daemon(slabs=32, slab_size="2MiB", framed_socket=framed)
        with connect(d) as c:
            result = c.encode(noise, crf=0, preset="ultrafast")
            outputs.append(result.data or b"")
            assert c.status().pool["active_leases"] <= 1  # the spare at most
        assert result.size_bytes > 8 * 1024 * 1024  # past a gRPC reply, and past a slab
    assert ways == ["Framed", "Encode"]
    assert outputs[0] == outputs[1]
    frames, _ = decode(outputs[0])
    assert len(frames) == 24
