"""The framed socket: encodes, leases and releases over a plain Unix socket, without HTTP/2.

A request and its reply on a kept gRPC stream cost some 0.75 ms on the H200 host, most
of it gRPC's own threads and HTTP/2 framing on both sides, and a unary Lease call 1.1-1.5
ms; the same bytes on a Unix socket cost a few tens of microseconds. Clients on the
daemon's host use this socket for encodes answered in one reply, and for the leases and
releases around them; everything else stays on gRPC.

The protocol (`AttachResponse.framed_socket` in the proto says it for clients):

    client:  4 bytes naming the protocol, then requests      daemon: replies
    message: 4-byte big-endian length, then that many bytes

    "VSF2": requests are `FramedRequest` (an encode, a lease or a release), replies
            `FramedReply`;
    "VSF1": requests are `EncodeRequest`, replies `SessionReply` (older clients).

Exactly one reply per request, in order. Encodes run the same code as EncodeSession's
(`VideoSidecarServicer.session`), leases and releases the same as the unary calls, so
checks, errors, logs and metrics are the same. A request over `MAX_MESSAGE_BYTES` is
answered with INVALID_ARGUMENT and the connection ends (what follows cannot be trusted to
be a message); bytes that are no request are answered with INVALID_ARGUMENT and the
connection carries on. The client closing the connection stops its encode in progress.
A client sends its next request on a connection only once it has read the last reply, so
a lease granted in the last reply of a connection that ends before another request comes
on it was never read (the client gave up while it waited: a cancel, a deadline, Ctrl-C):
it is freed then, unless the client has used or released it meanwhile.

Replies have no gRPC limit to keep under, so no one-reply output is refused for its
size: up to 1 MiB it comes inside the reply, past that in a lease (one copy in, one
out: sooner than inside a reply, which costs copies on both sides), and when no lease
can hold it (larger than a slab, or the pool full) inside the reply again, up to
`FRAMED_REPLY_MAX_BYTES`. Clients therefore ask here for a long video in one reply too.

The socket sits next to the gRPC socket, with the same owner, group and mode, so whoever
may use one may use the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .api.v1 import sidecar_pb2 as pb
from .convert import Undecodable, decoder
from .errors import InvalidRequest
from .servicer import CallEnd, VideoSidecarServicer
from .vocabulary import FRAMED_PREAMBLES, FRAMED_REPLY_MAX_BYTES, MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

# A one-reply output's own bytes in a framed reply, with room left for its other fields.
REPLY_DATA_MAX = FRAMED_REPLY_MAX_BYTES - 1024 * 1024

PREAMBLE_BYTES = 4  # a connection's first bytes: the protocol's name (FRAMED_PREAMBLES)
SUFFIX = ".framed"  # the socket's name: the gRPC socket's, with this added
_LENGTH = struct.Struct(">I")
_DECODERS = {1: decoder(pb.EncodeRequest), 2: decoder(pb.FramedRequest)}
Request = pb.EncodeRequest | pb.FramedRequest | Undecodable


class Oversized(Undecodable):
    """A message whose stated length is over the limit: refused, and the connection ends."""

    def __init__(self, length: int, message: str) -> None:
        super().__init__(message)
        self.length = length

    def refuse(self) -> InvalidRequest:
        limit = f"the {MAX_MESSAGE_BYTES}-byte limit"
        return InvalidRequest("request", f"a message of {self.length} bytes is over {limit}")


class FramedServer:
    """Serves the framed socket on the running event loop."""

    def __init__(self, servicer: VideoSidecarServicer, grpc_socket: Path) -> None:
        self.servicer = servicer
        self.path = grpc_socket.with_name(grpc_socket.name + SUFFIX)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()

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
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(path), limit=1 << 20
            )
            os.chmod(path, mode)
            if gid != -1:
                os.chown(path, -1, gid)
        except OSError as exc:
            log.warning("no framed socket at %s: %s", path, exc)
            await self.close()
            return False
        self.servicer.framed_socket = path.name
        return True

    async def close(self) -> None:
        """Stop listening; end the connections left (call once their encodes are done)."""
        self.servicer.framed_socket = ""
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        end = CallEnd()
        pending: asyncio.Queue[Request | None] = asyncio.Queue()
        read: asyncio.Task[None] | None = None
        unread = Unread()
        try:
            version = FRAMED_PREAMBLES.get(await reader.readexactly(PREAMBLE_BYTES))
            if version is None:
                return  # not a protocol we speak: nothing we could answer would be read
            read = asyncio.create_task(_read(reader, version, pending, end, unread))
            requests: AsyncIterator[Any] = _drain(pending)  # of the version's kind
            replies = (
                self.servicer.framed(requests, end, reply_data_max=REPLY_DATA_MAX)
                if version == 2
                else self.servicer.session(requests, end, reply_data_max=REPLY_DATA_MAX)
            )
            async for reply, sent in replies:
                unread.leases = granted(reply)  # before it is written: the client may answer
                data = reply.SerializeToString()
                writer.writelines((_LENGTH.pack(len(data)), data))  # one send, no join
                await writer.drain()
                for action in sent:
                    action()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away; its encode was stopped through `end`
        finally:
            end.end()
            if read is not None:
                read.cancel()
            for lease_id in unread.leases:
                self.servicer.sidecar.leases.free_unused(lease_id)
            writer.close()
            self._connections.discard(task)


class Unread:
    """The leases granted in a connection's last reply (a Lease's, an encode's spare and
    output), until the client shows it read that reply by sending another request."""

    leases: tuple[str, ...] = ()


def granted(reply: pb.FramedReply | pb.SessionReply) -> tuple[str, ...]:
    """The leases a reply hands the client."""
    if isinstance(reply, pb.FramedReply) and reply.WhichOneof("reply") == "lease":
        return (reply.lease.lease_id, *(more.lease_id for more in reply.lease.more))
    if reply.HasField("result"):
        result = reply.result
        return tuple(filter(None, (result.next_lease.lease_id, result.data_lease.lease_id)))
    return ()


async def _read(
    reader: asyncio.StreamReader,
    version: int,
    pending: asyncio.Queue[Request | None],
    end: CallEnd,
    unread: Unread,
) -> None:
    """Queue the connection's requests, one at a time: the next is read only once the last
    was taken, so reading goes on while it is encoded, and notices the client leaving.
    At the connection's end (the client closed it, or broke the protocol) stop the encode
    in progress, and end the requests."""
    decode = _DECODERS[version]
    name = "FramedRequest" if version == 2 else "EncodeRequest"
    try:
        while True:
            (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
            if length > MAX_MESSAGE_BYTES:
                pending.put_nowait(Oversized(length, name))
                return
            request = decode(await reader.readexactly(length))
            unread.leases = ()  # the last reply was read
            pending.put_nowait(request)
            await pending.join()
    except (asyncio.IncompleteReadError, ConnectionError):
        end.end()
    finally:
        pending.put_nowait(None)


async def _drain(pending: asyncio.Queue[Request | None]) -> AsyncIterator[Request]:
    while (request := await pending.get()) is not None:
        pending.task_done()
        yield request
