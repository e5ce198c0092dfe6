"""The framed socket's limits, against the real daemon: a cap on connections, a timeout
for a preamble, a request or a reply that stalls, memory that a half-sent message holds
only for that long, and leases handed out in replies the client cannot have read."""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.framing import frame

from .helpers import Daemon, RawFramed, decode

MiB = 1024 * 1024
CLIP = moving_pattern(3, 48, 64)
RESOURCE_EXHAUSTED = 8


def rss_mib(daemon: Daemon) -> float:
    assert daemon.process is not None
    for line in Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def framed_path(daemon: Daemon) -> str:
    return f"{daemon.socket}.framed"


def connect(daemon: Daemon, first: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(framed_path(daemon))
    if first:
        sock.sendall(first)
    return sock


def closed_by_daemon(socks: list[socket.socket], within: float) -> dict[int, float]:
    """When each socket was closed by the daemon (read to its end), on the monotonic
    clock; those still open after `within` seconds are missing."""
    started = time.monotonic()
    open_ = {s.fileno(): s for s in socks}
    ended: dict[int, float] = {}
    poller = select.poll()
    for fd in open_:
        poller.register(fd, select.POLLIN)
    while open_ and (left := started + within - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            try:
                data = open_[fd].recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                ended[fd] = time.monotonic()
                poller.unregister(fd)
                del open_[fd]
    return ended


def lease_request(token: str, size: int = 4096) -> bytes:
    return pb.FramedRequest(
        lease=pb.LeaseRequest(client_token=token, size=size)
    ).SerializeToString()


def release_request(token: str, lease_id: str) -> bytes:
    release = pb.ReleaseRequest(client_token=token, lease_id=lease_id)
    return pb.FramedRequest(release=release).SerializeToString()


def round_trip(raw: RawFramed, token: str) -> float:
    """A lease and its release on `raw`: the slower of the two, in seconds."""
    started = time.monotonic()
    raw.send(lease_request(token))
    granted = raw.reply()
    assert granted.WhichOneof("reply") == "lease", granted
    leased = time.monotonic()
    raw.send(release_request(token, granted.lease.lease_id))
    assert raw.reply().WhichOneof("reply") == "release"
    return max(leased - started, time.monotonic() - leased)


def active_leases(client: Any, want: int, within: float = 5.0) -> int:
    """The pool's active leases, once they are `want` or `within` has passed."""
    end = time.monotonic() + within
    while True:
        status = client.status()
        active = int(status.pool["active_leases"])
        if (active == want and status.active_encodes == 0) or time.monotonic() > end:
            return active
        time.sleep(0.05)


@contextmanager
def held(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.exclusive
def test_half_sent_messages_are_closed_after_the_timeout_and_their_memory_comes_back(
    make_daemon: Callable[..., Daemon],
) -> None:
    """40 connections each announce an 8 MiB message and send 1 MiB of it. The daemon
    holds what came, not what was announced, serves others meanwhile, closes all 40 once
    the timeout has passed from their first byte, and gives the memory back."""
    from client import SidecarClient

    d = make_daemon(framed_message_timeout=2)
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        raw = RawFramed(framed_path(d), b"VSF2", timeout=10)
        try:
            for _ in range(3):  # warm: the daemon's first requests import and build
                round_trip(raw, token)
            time.sleep(0.3)
            before = rss_mib(d)
            half = framing.header(8 * MiB) + bytes(MiB)
            sent_at = time.monotonic()
            with held([connect(d, b"VSF2" + half) for _ in range(40)]) as socks:
                time.sleep(0.5)
                holding = rss_mib(d) - before
                slowest = max(round_trip(raw, token) for _ in range(5))
                assert c.status().pool["active_leases"] == 0
                ended = closed_by_daemon(socks, within=10)
            time.sleep(0.3)
            after = rss_mib(d) - before
            assert len(ended) == 40, f"{40 - len(ended)} of 40 still open after 10 s"
            # Closed once the timeout had passed from their first byte, none much later.
            when = sorted(t - sent_at for t in ended.values())
            assert when[0] > 1.9 and when[-1] < 2 + 3, when
            assert slowest < 0.3, f"a lease round trip took {slowest:.3f} s meanwhile"
            assert holding < 40 * 1.5 + 16, f"40 MiB half sent held {holding:.0f} MiB"
            assert after < 12, f"{after:.0f} MiB still held after the connections closed"
            assert round_trip(raw, token) < 0.3  # the idle kept connection is still served
        finally:
            raw.close()
        assert c.encode(CLIP).frames == 3
    log = d.log()
    line = f"closed a framed connection of uid {os.getuid()}: a request begun and not whole"
    assert log.count(line) == 40, log[-2000:]


def test_a_slow_preamble_or_request_is_closed_and_an_idle_connection_is_not(
    make_daemon: Callable[..., Daemon],
) -> None:
    """No preamble, part of one, or part of a request's length within the timeout: the
    daemon closes the connection. A connection idle between requests for longer stays
    open and is served."""
    from client import SidecarClient

    d = make_daemon(framed_message_timeout=1)
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        idle = RawFramed(framed_path(d), b"VSF2", timeout=10)
        try:
            round_trip(idle, token)
            started = time.monotonic()
            slow = [connect(d), connect(d, b"VS"), connect(d, b"VSF2\x00\x00")]
            with held(slow):
                ended = closed_by_daemon(slow, within=6)
            assert len(ended) == 3, f"{3 - len(ended)} of 3 still open after 6 s"
            when = sorted(t - started for t in ended.values())
            assert when[0] > 0.9 and when[-1] < 1 + 3, when
            time.sleep(max(0.0, started + 1.5 - time.monotonic()))  # idle past the timeout
            assert round_trip(idle, token) < 0.3
        finally:
            idle.close()
        assert c.encode(CLIP).frames == 3
    log = d.log()
    uid = os.getuid()
    assert log.count(f"closed a framed connection of uid {uid}: no preamble within 1 s") == 2
    assert f"uid {uid}: a request begun and not whole within 1 s" in log


@pytest.mark.parametrize(
    "cap,said",
    [
        ("framed_connections", "too many framed connections (3 open, at most 3)"),
        ("framed_connections_per_uid", "too many framed connections (3 for uid {uid}, at most 3)"),
    ],
    ids=["daemon", "uid"],
)
def test_connections_over_a_cap_are_refused_with_the_reason(
    make_daemon: Callable[..., Daemon], cap: str, said: str
) -> None:
    """Past the cap a connection's first request is answered with RESOURCE_EXHAUSTED,
    saying which cap, and the connection ends; for the client too.
    Once a connection closes there is room again."""
    from client import ResourceExhausted, SidecarClient

    said = said.format(uid=os.getuid())
    d = make_daemon(**{cap: 3})
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        kept = [RawFramed(framed_path(d), b"VSF2", timeout=10) for _ in range(3)]
        try:
            for raw in kept:
                round_trip(raw, token)  # served
            refused = RawFramed(framed_path(d), b"VSF2", timeout=10)
            try:
                refused.send(lease_request(token))
                reply = refused.reply()
                assert reply.HasField("error"), reply
                assert reply.error.code == RESOURCE_EXHAUSTED, reply
                assert reply.error.reason == pb.ERROR_REASON_UNSPECIFIED
                assert reply.error.message == f"{said}; close some, or use gRPC"
                assert refused.reply() is None  # then the daemon closes it
            finally:
                refused.close()
            with pytest.raises(ResourceExhausted, match="too many framed connections"):
                c.lease(4096)  # the client's own framed connection is over the cap
            assert active_leases(c, 0) == 0
            kept.pop().close()
            time.sleep(0.2)
            lease = c.lease(4096)  # room again
            c.release(lease)
            assert c.encode(CLIP).frames == 3
            for raw in kept:
                assert round_trip(raw, token) < 0.3  # those kept are served throughout
        finally:
            for raw in kept:
                raw.close()
        assert active_leases(c, 0) <= 1
    assert f"refused a framed connection: {said}" in d.log()


def test_leases_in_replies_the_client_cannot_have_read_are_freed_when_it_closes(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Leases asked for together, without reading between, then the connection closed
    (a cancel): each lease whose reply was written after the next request had come is
    freed, not only the last. One whose reply was read before the next request stays
    with its client, which uses it elsewhere."""
    from client import SidecarClient

    d = make_daemon(lease_ttl=60)
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        raw = connect(d, b"VSF2")
        with held([raw]):
            raw.sendall(b"".join(frame(lease_request(token)) for _ in range(3)))
            time.sleep(0.3)  # the replies are written; none is read
        assert active_leases(c, 0) == 0

        raw2 = RawFramed(framed_path(d), b"VSF2", timeout=10)
        try:
            raw2.send(lease_request(token))
            kept = raw2.reply().lease.lease_id  # read, then the next requests come
            raw2.sock.sendall(b"".join(frame(lease_request(token)) for _ in range(2)))
            time.sleep(0.3)
        finally:
            raw2.close()
        assert active_leases(c, 1) == 1  # the two unread are freed, the one read is not
        other = RawFramed(framed_path(d), b"VSF2", timeout=10)
        try:
            other.send(release_request(token, kept))
            assert other.reply().WhichOneof("reply") == "release"
        finally:
            other.close()
        assert active_leases(c, 0) == 0
        assert c.encode(CLIP).frames == 3


def test_a_reply_left_unread_ends_the_connection(make_daemon: Callable[..., Daemon]) -> None:
    """A client that asks for an encode and does not read its reply (1 MB, inside the
    reply) does not keep it in the daemon: once the reply has not moved for the
    timeout, the connection is closed, and the daemon serves on."""
    from client import SidecarClient

    d = make_daemon(framed_message_timeout=1, slab_size="1MiB", slabs=4)
    noise = np.random.default_rng(3).integers(0, 256, (3, 256, 448, 3), dtype=np.uint8)
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        lease = c.lease(noise.nbytes)
        lease.array[: noise.nbytes] = noise.reshape(-1)
        video = pb.VideoDescriptor(
            width=448, height=256, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1),
            ranges=[pb.FrameRange(lease_id=str(lease.id), frame_count=3)],
        )  # fmt: skip
        output = pb.OutputSpec()
        output.bytes.SetInParent()
        request = pb.EncodeRequest(
            client_token=token, video=video, output=output,
            codec=pb.CodecOptions(preset="ultrafast", crf=0),
        )  # fmt: skip
        raw = connect(d, b"VSF2" + framing.pack(pb.FramedRequest(encode=request)))
        with held([raw]):
            line = "its reply not read for 1 s"
            end = time.monotonic() + 15
            while line not in d.log() and time.monotonic() < end:
                time.sleep(0.1)
            assert line in d.log(), d.log()[-2000:]
            got = b""
            raw.settimeout(5)
            while True:
                try:
                    more = raw.recv(1 << 16)
                except ConnectionResetError:
                    break
                if not more:
                    break
                got += more
            length = framing.length(got[: framing.HEADER_BYTES])
            assert length > 512 * 1024 and len(got) < 4 + length  # cut short, then closed
        assert active_leases(c, 0) == 0
        result = c.encode(noise, crf=0, preset="ultrafast")
        assert len(decode(result.data or b"")[0]) == 3


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_a_large_request_that_comes_in_pieces_is_served(
    make_daemon: Callable[..., Daemon],
) -> None:
    """A request of 3 MiB (a lease request with a field this daemon does not know)
    sent in three parts, inside the timeout: read in pieces, decoded and answered, and
    the next one on the same connection too. (A guard for the reading in pieces.)"""
    from client import SidecarClient

    d = make_daemon(framed_message_timeout=2)
    with SidecarClient(d.socket) as c:
        token = c.attach().client_token
        padding = bytes(3 * MiB)
        unknown = varint(1000 << 3 | 2) + varint(len(padding)) + padding
        large = lease_request(token) + unknown
        assert len(large) > 3 * MiB
        raw = RawFramed(framed_path(d), b"VSF2", timeout=10)
        try:
            for _ in range(2):
                data = frame(large)
                third = len(data) // 3
                for part in (data[:third], data[third : 2 * third], data[2 * third :]):
                    raw.sock.sendall(part)
                    time.sleep(0.3)
                reply = raw.reply()
                assert reply.WhichOneof("reply") == "lease", reply.error
                raw.send(release_request(token, reply.lease.lease_id))
                assert raw.reply().WhichOneof("reply") == "release"
        finally:
            raw.close()
        assert active_leases(c, 0) == 0
