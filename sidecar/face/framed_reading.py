"""A framed connection's requests, read as they come and queued one at a time.

A request's bytes are read in pieces as they come: a connection keeps no buffer of a large
message's size, before or after it, and a message half sent holds only the bytes sent,
until its timeout (`framed_watch`).
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import AsyncIterator

from .. import framing
from ..api.v1 import sidecar_pb2 as pb
from ..errors import InvalidRequest
from ..vocabulary import MAX_MESSAGE_BYTES
from .calls import CallEnd
from .convert import REPEATED_LIMITS
from .decoding import Decoder, Pending, Undecodable, decode_pending
from .framed_watch import Handed, Watch

# The largest reply the framed socket sends (an output inside a result), which Attach
# announces (`framed_reply_max_bytes`): a client reads up to it.
FRAMED_REPLY_MAX_BYTES = 1024 * 1024 * 1024

# A request larger than this is read in pieces of at most this into memory of its own
# (anonymous, mapped for it): only the pages its bytes came into are used, and all of it
# goes back to the system once the request is decoded or its connection ends. The heap
# would keep what many half-sent requests took long after they were gone.
PIECE = 64 * 1024
# The reader's own buffer: it stops taking bytes from the socket past twice this.
READER_LIMIT = PIECE
_DECODE = Decoder(pb.FramedRequest, REPEATED_LIMITS)
Request = pb.FramedRequest | Undecodable


class Reader(asyncio.StreamReader):
    """A connection's reader that counts the bytes it took from the socket."""

    received = 0

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]
        self.received += len(data)
        super().feed_data(data)


class Oversized(Undecodable):
    """A message whose stated length is over the limit: refused, and the connection ends."""

    def __init__(self, length: int) -> None:
        super().__init__("FramedRequest")
        self.length = length

    def refuse(self) -> InvalidRequest:
        limit = f"the {MAX_MESSAGE_BYTES}-byte limit"
        return InvalidRequest("request", f"a message of {self.length} bytes is over {limit}")


async def read_requests(
    reader: asyncio.StreamReader,
    pending: asyncio.Queue[Request | None],
    end: CallEnd,
    handed: Handed,
    watch: Watch,
) -> None:
    """Queue the connection's requests, one at a time: the next is read only once the last
    was taken, so reading goes on while it is encoded, and notices the client leaving.
    A request must be whole within the timeout of its first byte; between requests there
    is no limit. At the connection's end (the client closed it, or broke the protocol)
    stop the encode in progress, and end the requests."""
    offset = framing.PREAMBLE_BYTES  # where the next request begins
    try:
        while True:
            first = await reader.readexactly(1)  # between requests: no time limit
            watch.begin("a request begun and not whole within {}")
            handed.read_from(offset)
            rest = await reader.readexactly(framing.HEADER_BYTES - 1)
            length = framing.length(first + rest)
            if length > MAX_MESSAGE_BYTES:
                watch.done()
                pending.put_nowait(Oversized(length))
                return
            request = await _request(reader, length)
            watch.done()
            offset += framing.HEADER_BYTES + length
            pending.put_nowait(request)
            await pending.join()
    except (asyncio.IncompleteReadError, ConnectionError):
        end.end()
    finally:
        watch.done()
        pending.put_nowait(None)


async def _request(reader: asyncio.StreamReader, length: int) -> Request:
    """A message of `length` bytes, decoded; a large one read in pieces as they come
    (see `PIECE`), and decoded off the event loop (`decoding`)."""
    if length <= PIECE:
        request: Request | Pending = _DECODE(await reader.readexactly(length))
        return await decode_pending(request) if isinstance(request, Pending) else request
    body = mmap.mmap(-1, length)
    try:
        while (got := body.tell()) < length:
            piece = await reader.read(min(length - got, PIECE))
            if not piece:
                raise asyncio.IncompleteReadError(b"", length)
            body.write(piece)
    except BaseException:
        body.close()
        raise
    decoded: Request = await decode_pending(Pending(body, _DECODE.now))
    return decoded


async def skip(reader: asyncio.StreamReader, length: int) -> None:
    """Read `length` bytes and keep none."""
    while length:
        piece = await reader.read(min(length, PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)


async def handed_on(pending: asyncio.Queue[Request | None]) -> AsyncIterator[Request]:
    """The queued requests, each taken as it is handed on, until the reading ends."""
    while (request := await pending.get()) is not None:
        pending.task_done()
        yield request
