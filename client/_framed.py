"""The framed socket's client side: encodes, leases and releases on a plain Unix socket.

A daemon names the socket in its Attach reply (see `sidecar.face.framed` for the protocol,
and `sidecar.framing` for its bytes, which both ends share); this client uses the
socket only when the daemon says it speaks the same protocol. It spares each one-reply
encode gRPC's threads and HTTP/2 framing: most of what a short clip costs outside the
daemon, and a long video's output comes back without HTTP/2's flow control (a 1 MB
output took some 5 ms after the daemon had it on an Encode stream). A lease or release
on it costs a fraction of a unary gRPC call, which a long video would pay for each of its
leases. One connection carries one request at a time; the drivers keep one per request
in flight.

A connection that cannot be opened reads as a way out of reach (UNIMPLEMENTED): the
client then uses gRPC until it attaches again. An encode's deadline travels with it: the
daemon stops the encode then, and the client closes the connection at the same moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.framing import HEADER_BYTES, PREAMBLE

from ._errors import DeadlineExceeded, SidecarError, SidecarUnavailable, error_for

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_ENDED = "the daemon ended the framed connection; it is shutting down or restarting"


def _closed_before(exc: OSError) -> SidecarUnavailable:
    """A request whose send found the connection closed: the daemon left (it stopped, or
    restarts) before the request went, so none can have taken it, and it may be sent
    again once a daemon answers."""
    err = SidecarUnavailable(f"the daemon closed the framed connection: {exc.strerror or exc}")
    err.unsent = True
    return err


def framed_path(target: str, name: str, version: int) -> str:
    """The framed socket beside the gRPC socket `target`, or "" if there is none to use:
    the daemon named none, speaks an older protocol than ours (`version`), the target is
    not a Unix socket path, or the name is not a plain file name (a daemon's answer is
    checked like any input)."""
    if version < framing.VERSION or not name or not target.startswith("unix:"):
        return ""
    if not _NAME_RE.fullmatch(name):
        return ""
    path = target.removeprefix("unix:").removeprefix("//")
    if not path.startswith("/"):
        return ""
    return os.path.join(os.path.dirname(path), name)


def unreachable(path: str, exc: OSError) -> SidecarError:
    return error_for(grpc.StatusCode.UNIMPLEMENTED, f"framed socket {path}: {exc.strerror or exc}")


Request = framing.Request
# Run between sending an encode and reading its reply: waits for the request's frames to
# land, counting them for the daemon (see `sidecar.codec.landing`).
Landing = Callable[[], None]
T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> T:
    """Await `work` to its end even when cancelled meanwhile, then let the cancel go on.
    For work on a thread that writes into leases (a copy, frames landing): the steps give
    the leases back once cancelled, and no lease may be given back while it is written."""
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({future})
        if not future.cancelled():
            future.exception()  # retrieved: the cancel goes on, not the work's own error
        raise


async def within(work: Awaitable[T], timeout: float | None) -> T:
    """`work`, for at most `timeout` seconds (None: no limit), else asyncio.TimeoutError.
    Not `asyncio.wait_for`: before Python 3.12 it loses a cancel that comes just as the
    work completes, and the cancelled caller carries on (an async stream's writer went on
    writing for good)."""
    if timeout is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        await _stop(task)
        raise
    if not done:
        await _stop(task)
        raise asyncio.TimeoutError
    return task.result()


async def _stop(task: asyncio.Future[T]) -> None:
    """Cancel `task` and wait for it to end; its own error is dropped (retrieved)."""
    task.cancel()
    try:
        await asyncio.wait({task})
    finally:
        if task.done() and not task.cancelled():
            task.exception()


def _frame(request: Request, timeout: float | None) -> bytes:
    """The request's bytes; an encode with a `timeout` carries its deadline, so that the
    daemon stops it then and tells it from a cancel."""
    wrapped = framing.wrap(request)
    if timeout is not None and isinstance(request, pb.EncodeRequest):
        wrapped.deadline_unix_s = time.time() + timeout
    return framing.pack(wrapped)


def _reply_length(header: bytes | bytearray, reply_max: int) -> int:
    """A reply's length, within the limit the daemon announced (`reply_max`)."""
    length = framing.length(header)
    if length > reply_max:
        raise SidecarUnavailable(f"the framed socket sent a {length}-byte reply; not a daemon's")
    return length


def _reply(data: bytes | bytearray) -> pb.FramedReply:
    try:
        return pb.FramedReply.FromString(data)  # type: ignore[arg-type]  # any buffer
    except Exception:  # DecodeError: not our daemon speaking
        raise SidecarUnavailable("the framed socket sent bytes that are no reply") from None


class FramedConnection:
    """One blocking connection; `ask` sends a request and reads its reply."""

    def __init__(self, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5.0)
            sock.connect(path)
            sock.sendall(PREAMBLE)
        except OSError as exc:
            sock.close()
            raise unreachable(path, exc) from None
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    @property
    def open(self) -> bool:
        """False once the daemon has closed it: between requests it sends nothing."""
        return not self._poll.poll(0)

    def ask(
        self,
        request: Request,
        timeout: float | None,
        reply_max: int,
        landing: Landing | None = None,
    ) -> pb.FramedReply:
        """Send `request`, run `landing` (the request's frames still landing), then read
        the reply (of at most `reply_max` bytes)."""
        sock = self._sock
        sock.settimeout(timeout)
        try:
            try:
                sock.sendall(_frame(request, timeout))
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _closed_before(exc) from None
            if landing is not None:
                landing()
            header = self._read(HEADER_BYTES)
            return _reply(self._read(_reply_length(header, reply_max)))
        except TimeoutError:
            raise DeadlineExceeded("the deadline passed before the daemon's reply") from None
        except OSError as exc:
            raise SidecarUnavailable(f"framed connection lost: {exc.strerror or exc}") from None

    def _read(self, size: int) -> bytearray:
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise SidecarUnavailable(_ENDED)
            got += n
        return data

    def end(self, *, cancel: bool = False) -> None:
        """Close it; the daemon stops an encode still running on it. Shut down first, as
        a child after fork may hold the same socket, and the daemon must see it close."""
        with contextlib.suppress(OSError):  # already closed by the daemon
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class AsyncFramedConnection:
    """One connection on the running event loop; `ask` as `FramedConnection`'s."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open_to(cls, path: str) -> AsyncFramedConnection:
        try:
            reader, writer = await within(asyncio.open_unix_connection(path), 5.0)
        except asyncio.TimeoutError:  # before OSError: TimeoutError is one from 3.11
            raise unreachable(path, OSError("timed out")) from None
        except OSError as exc:
            raise unreachable(path, exc) from None
        writer.write(PREAMBLE)
        return cls(reader, writer)

    @property
    def open(self) -> bool:
        return not self._reader.at_eof() and not self._writer.is_closing()

    async def ask(
        self,
        request: Request,
        timeout: float | None,
        reply_max: int,
        landing: Landing | None = None,
    ) -> pb.FramedReply:
        """As `FramedConnection.ask`; `landing` runs on a worker thread, to its end even
        if the call is cancelled meanwhile."""
        try:
            if landing is None:
                return await within(self._ask(request, reply_max, timeout), timeout)
            started = time.monotonic()
            await within(self._send(request, timeout), timeout)
            await to_the_end(asyncio.to_thread(landing))
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            return await within(self._receive(reply_max), left)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            raise DeadlineExceeded("the deadline passed before the daemon's reply") from None
        except asyncio.IncompleteReadError:
            raise SidecarUnavailable(_ENDED) from None
        except OSError as exc:
            raise SidecarUnavailable(f"framed connection lost: {exc.strerror or exc}") from None

    async def _ask(self, request: Request, reply_max: int, timeout: float | None) -> pb.FramedReply:
        await self._send(request, timeout)
        return await self._receive(reply_max)

    async def _send(self, request: Request, timeout: float | None) -> None:
        try:
            self._writer.write(_frame(request, timeout))
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _closed_before(exc) from None

    async def _receive(self, reply_max: int) -> pb.FramedReply:
        header = await self._reader.readexactly(HEADER_BYTES)
        return _reply(await self._reader.readexactly(_reply_length(header, reply_max)))

    def end(self, *, cancel: bool = False) -> None:
        self._writer.close()
