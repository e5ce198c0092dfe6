"""The framed socket: encodes, leases and releases over a plain Unix socket, without HTTP/2.

A request and its reply on a kept gRPC stream cost most of a short clip's time outside
the daemon, gRPC's own threads and HTTP/2 framing on both sides, and a unary Lease call
more; the same bytes on a Unix socket cost tens of times less (docs/performance.md). Clients on the
daemon's host use this socket for encodes answered in one reply, and for the leases and
releases around them; everything else stays on gRPC.

The protocol (`AttachResponse.framed_socket` in the proto says it for clients; the bytes
are laid out by `sidecar.api.framing`):

    client:  "VSF2", then requests                            daemon: replies
    message: 4-byte big-endian length, then that many bytes
    request: `FramedRequest` (an encode, a lease or a release); reply: `FramedReply`

Exactly one reply per request, in order. Encodes run the same code as Encode's
(`VideoSidecarServicer.framed`), leases and releases the same as the unary calls, so
checks, errors, logs and metrics are the same. A request over `MAX_MESSAGE_BYTES` is
answered with INVALID_ARGUMENT and the connection ends (what follows cannot be trusted to
be a message); bytes that are no request are answered with INVALID_ARGUMENT and the
connection carries on. The client closing the connection stops its encode in progress;
an encode's own deadline (`FramedRequest.deadline_unix_s`) stops it then, as an Encode
call's does, and the connection serves the next request.

Every connection has limits (the settings `framed_connections`,
`framed_connections_per_uid` and `framed_message_timeout`):

- At most 1024 connections are open at once, and at most 256 of one user (the peer's
  uid, from SO_PEERCRED). A connection over either cap gets one reply, to its first
  request: an error with RESOURCE_EXHAUSTED (reason unspecified: no pool is short) that
  says which cap and how to get under it; then the daemon closes it. A server with 64
  workers, each with a connection per request in flight, stays far below both.
- The preamble must come within 10 s of the connection, and a request must be whole
  within 10 s of its first byte; a reply waiting to be read must move on at least every
  10 s. Otherwise the daemon closes the connection, within a second more (one line in
  its log, with the uid), and stops its encode. Time between requests has no limit:
  clients keep connections open between requests.
- A request's bytes are read in pieces as they come (`framed_reading`): a message half
  sent holds only the bytes sent, until its timeout: at worst 8 MiB a connection, for 10 s.

A lease handed out in a reply the client cannot have read is freed when the connection
ends, unless the client has used or released it meanwhile (a lease in an encode is never
freed this way). A client sends its next request on a connection once it has read the
last reply, so a request shows that the replies written before it came were read; those
written after it came (a client that sent several requests at once without reading, then
closed the connection: a cancel, a deadline, Ctrl-C), and the last reply if no request
followed it, were not, and each lease they hand out is freed. A lease in a reply that
was read stays with its client, which may use it on any connection or call, until it is
used, released, or its TTL passes.

Replies have no gRPC limit to keep under, so no one-reply output is refused for its
size: up to 1 MiB it comes inside the reply, past that in a lease (one copy in, one
out: sooner than inside a reply, which costs copies on both sides), and when no lease
can hold it (larger than a slab, or the pool full) inside the reply again, up to
`FRAMED_REPLY_MAX_BYTES`, which Attach announces. Clients ask here for a long video in
one reply too.

The socket sits next to the gRPC socket, with the same owner, group and mode, so whoever
may use one may use the other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import socket
import stat
import struct
import termios
import time
from pathlib import Path
from typing import Any

import grpc

from .. import framing
from ..api.v1 import sidecar_pb2 as pb
from ..pipeline.admission.requests import OneReply
from ..vocabulary import MAX_MESSAGE_BYTES
from .calls import CallEnd
from .framed_reading import (
    FRAMED_REPLY_MAX_BYTES,
    READER_LIMIT,
    Reader,
    Request,
    handed_on,
    read_requests,
    skip,
)
from .framed_watch import Handed, Watch, granted
from .servicer import VideoSidecarServicer

log = logging.getLogger(__name__)

# A one-reply output's own bytes in a framed reply, with room left for its other fields.
# Past 1 MiB it goes in a lease when one has room: copied into a lease and out, a 2.9 MB
# output reached the client sooner than inside the reply.
ONE_REPLY = OneReply(FRAMED_REPLY_MAX_BYTES - 1024 * 1024, lease_past=1024 * 1024)

SUFFIX = ".framed"  # the socket's name: the gRPC socket's, with this added
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
# Connections over a cap that wait to be told so (their first request); more are closed
# at once, without a reply.
REFUSING_MAX = 64
# A refusal is logged at most once in this many seconds.
REFUSAL_LOG_S = 10.0
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


class FramedServer:
    """Serves the framed socket on the running event loop."""

    def __init__(self, servicer: VideoSidecarServicer, grpc_socket: Path) -> None:
        self.servicer = servicer
        self.path = grpc_socket.with_name(grpc_socket.name + SUFFIX)
        config = servicer.sidecar.config
        self.max_connections = max(1, config.framed_connections)
        self.max_per_uid = max(1, config.framed_connections_per_uid)
        self.timeout = config.framed_message_timeout if config.framed_message_timeout > 0 else 10.0
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._watches: set[Watch] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._open = 0  # connections served (not those refused)
        self._by_uid: collections.Counter[int] = collections.Counter()
        self._refusing = 0
        self._refused = 0
        self._refusal_logged_at = -REFUSAL_LOG_S

    async def start(self, mode: int, gid: int) -> bool:
        """Listen, with the gRPC socket's mode and group. False, with a warning, when the
        socket cannot be made: clients then use gRPC only."""
        path = self.path
        if len(os.fsencode(str(path))) > 107:
            log.warning("no framed socket: %s is over the 107 bytes a socket path allows", path)
            return False
        try:
            if path.is_symlink() or path.exists():
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    log.warning("no framed socket: %s exists and is not a socket", path)
                    return False
                path.unlink()  # a dead daemon's: the gRPC socket was checked to be free

            def protocol() -> asyncio.StreamReaderProtocol:
                return asyncio.StreamReaderProtocol(Reader(READER_LIMIT), self._serve)

            loop = asyncio.get_running_loop()
            self._server = await loop.create_unix_server(protocol, path=str(path))
            os.chmod(path, mode)
            if gid != -1:
                os.chown(path, -1, gid)
            self._sweeper = asyncio.create_task(self._sweep(), name="framed-timeouts")
        except OSError as exc:
            log.warning("no framed socket at %s: %s", path, exc)
            await self.close()
            return False
        self.servicer.framed_socket = path.name
        return True

    async def close(self) -> None:
        """Stop listening; end the connections left (call once their encodes are done)."""
        self.servicer.framed_socket = ""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.wait({self._sweeper})
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=1.0)

    async def _sweep(self) -> None:
        """Close the connections whose preamble, request or reply is late. One look a
        little more often than the timeout, not a timer per message: that would cost more
        than a small message's whole handling."""
        period = min(1.0, self.timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for watch in list(self._watches):
                try:
                    watch.check(now)
                except Exception:  # one connection's trouble: the others are still watched
                    log.exception("checking a framed connection's deadlines failed")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and isinstance(reader, Reader)
        self._connections.add(task)
        uid = peer_uid(writer)
        watch = Watch(writer.transport, self.timeout, uid)
        self._watches.add(watch)
        try:
            refusal = self._over_cap(uid)
            if refusal:
                await self._refuse(reader, writer, watch, refusal)
                return
            self._open += 1
            self._by_uid[uid] += 1
            try:
                await self._converse(reader, writer, watch)
            finally:
                self._open -= 1
                self._by_uid[uid] -= 1
                if self._by_uid[uid] <= 0:
                    del self._by_uid[uid]
        finally:
            self._watches.discard(watch)
            self._connections.discard(task)

    def _over_cap(self, uid: int) -> str:
        """Why a new connection of `uid` is refused, or "" if it is not."""
        held, most = self._by_uid[uid], self.max_per_uid
        if held >= most:
            how_many = f"{held} for uid {uid}, at most {most}"
        elif self._open >= self.max_connections:
            how_many = f"{self._open} open, at most {self.max_connections}"
        else:
            return ""
        return f"too many framed connections ({how_many}); close some, or use gRPC"

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: Watch, why: str
    ) -> None:
        """Answer the first request of a connection over a cap with RESOURCE_EXHAUSTED,
        then close it. Its client sends its preamble and first request before it reads:
        closed sooner, it would see a broken connection instead of the reason."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_S:
            self._refusal_logged_at = now
            log.warning("refused a framed connection: %s (%d refused in all)", why, self._refused)
        if self._refusing >= REFUSING_MAX:
            writer.close()
            return
        self._refusing += 1
        try:
            watch.begin("no preamble and first request within {} (over a cap)")
            if await reader.readexactly(framing.PREAMBLE_BYTES) != framing.PREAMBLE:
                return
            length = framing.length(await reader.readexactly(framing.HEADER_BYTES))
            if length <= MAX_MESSAGE_BYTES:
                await skip(reader, length)
            watch.done()
            error = pb.FramedError(code=_RESOURCE_EXHAUSTED, message=why)
            writer.write(framing.pack(pb.FramedReply(error=error)))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._refusing -= 1
            writer.close()

    async def _converse(self, reader: Reader, writer: asyncio.StreamWriter, watch: Watch) -> None:
        end = CallEnd()
        pending: asyncio.Queue[Request | None] = asyncio.Queue()
        read: asyncio.Task[None] | None = None
        handed = Handed()
        try:
            watch.begin("no preamble within {}")
            preamble = await reader.readexactly(framing.PREAMBLE_BYTES)
            watch.done()
            if preamble != framing.PREAMBLE:
                return  # not a protocol we speak: nothing we could answer would be read
            read = asyncio.create_task(read_requests(reader, pending, end, handed, watch))
            replies = self.servicer.framed(handed_on(pending), end, one_reply=ONE_REPLY)
            async for reply, sent in replies:
                leases = granted(reply)
                if leases:  # before it is written: the client may answer
                    handed.add(reader.received + _unread_bytes(writer), leases)
                await _send(reply, writer, watch)
                for action in sent:
                    action()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away; its encode was stopped through `end`
        finally:
            end.end()
            if read is not None:
                read.cancel()
            for lease_id in handed.unread():
                self.servicer.sidecar.free_unread(lease_id)
            writer.close()


async def _send(reply: pb.FramedReply, writer: asyncio.StreamWriter, watch: Watch) -> None:
    """Write a reply, watched while the client is slow to read it."""
    data = reply.SerializeToString()
    writer.writelines((framing.header(len(data)), data))  # one send, no join
    transport = writer.transport
    if transport.get_write_buffer_size():  # the client reads it as it goes
        watch.sending(transport.get_write_buffer_size)
    await writer.drain()
    watch.sent()


def peer_uid(writer: asyncio.StreamWriter) -> int:
    """The connecting process's uid (-1 if the kernel does not say)."""
    sock = writer.get_extra_info("socket")
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        return int(_PEERCRED.unpack(creds)[1])
    except (AttributeError, OSError, struct.error):
        return -1


def _unread_bytes(writer: asyncio.StreamWriter) -> int:
    """Bytes the client sent that are still in the socket, not yet taken by the reader."""
    sock = writer.get_extra_info("socket")
    try:
        waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4))
        return int(struct.unpack("i", waiting)[0])
    except (AttributeError, OSError, ValueError):
        return 0
