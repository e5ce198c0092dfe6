"""What a call's end means for its encodes, and the kept framed connections shutdown ends."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

from ..api.v1 import sidecar_pb2 as pb
from ..errors import Cancelled, DeadlinePassed, InvalidRequest, SidecarError
from ..vocabulary import DEADLINE_KEY


async def unless_cancelled(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    """A call's requests. gRPC may end them, as at the client's half-close, when the
    client cancels the call, and mark the call cancelled only a little later: that is a
    cancel, not a stream missing its header or end, so the end waits up to 0.1 s to tell
    which. (A stream that ends properly is not read past its end message.)"""
    async for request in requests:
        yield request
    for _ in range(20):
        if context.cancelled() or context.done():
            raise Cancelled("cancelled by the client")
        await asyncio.sleep(0.005)


def after_call(context: grpc.aio.ServicerContext) -> Callable[[Callable[[], None]], None]:
    """Runs an action once the RPC has ended."""
    return lambda action: context.add_done_callback(lambda _context: action())


DEADLINE_MARGIN_S = 0.05
# The client's deadline in the metadata: decimal Unix seconds, nothing else.
_UNIX_TIME = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def clients_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds left until the deadline the client sent, or None if it sent none, or one
    that is not a plain decimal Unix time (ignored: gRPC's deadline still holds)."""
    for key, value in context.invocation_metadata() or ():
        if key == DEADLINE_KEY and isinstance(value, str) and _UNIX_TIME.fullmatch(value):
            return float(value) - time.time()
    return None


def framed_deadline(request: pb.FramedRequest) -> float | None:
    """Seconds left until a framed encode's deadline (`deadline_unix_s`), None if none."""
    value = request.deadline_unix_s
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest("deadline_unix_s", "must be a finite Unix time, or 0 for none")
    return None if value == 0 else value - time.time()


class CallEnd:
    """Stops a call's encodes when the call ends early (the client gone, its deadline
    passed). Each encode gets an event of its own, as a job sets its event to stop its own
    parts when it fails: a kept connection's next request must not find it set."""

    def __init__(self, remaining: float | None = None) -> None:
        self.ended = False
        self._current: threading.Event | None = None
        self._context: grpc.aio.ServicerContext | None = None
        self._request_over = False  # the deadline of a kept connection's request passed
        loop = asyncio.get_running_loop()
        # When the call's deadline falls, on the loop's clock (None: no deadline).
        self._deadline_at = None if remaining is None else loop.time() + max(0.0, remaining)
        self._deadline = (
            None if self._deadline_at is None else loop.call_at(self._deadline_at, self.end)
        )

    @contextlib.contextmanager
    def request_deadline(self, remaining: float | None) -> Iterator[None]:
        """A deadline for one request of a kept connection (`remaining` seconds; None:
        none): it stops that request's encode, and leaves the connection to the next."""
        if remaining is None:
            yield
            return
        loop = asyncio.get_running_loop()
        self._deadline_at = loop.time() + max(0.0, remaining)
        timer = loop.call_at(self._deadline_at, self._stop_request)
        try:
            yield
        finally:
            timer.cancel()
            self._deadline_at = None
            self._request_over = False

    def _stop_request(self) -> None:
        self._request_over = True
        if self._current is not None:
            self._current.set()

    @classmethod
    def of(cls, context: grpc.aio.ServicerContext) -> CallEnd:
        """Ended by the gRPC call's end or its deadline, the client's own where it sent it
        (only ever earlier: a call without a gRPC deadline keeps none)."""
        remaining = context.time_remaining()
        sent = clients_deadline(context) if remaining is not None else None
        end = cls(remaining if sent is None else min(remaining, sent))
        end._context = context
        context.add_done_callback(lambda _context: end.end())
        return end

    def left(self) -> bool:
        """Whether the call has ended, as far as gRPC has told it yet: its done callback
        may come only after the handler."""
        context = self._context
        return self.ended or (context is not None and (context.cancelled() or context.done()))

    def event(self) -> threading.Event:
        """The next encode's stop event; already set once the call has ended."""
        self._current = threading.Event()
        if self.ended or self._request_over:
            self._current.set()
        return self._current

    def end(self) -> None:
        self.ended = True
        if self._current is not None:
            self._current.set()

    def why(self, exc: SidecarError) -> SidecarError:
        """The error to answer, log and count with: a stop the call's deadline caused says
        so, whether this timer or gRPC ended the call for it. (The daemon's timer may fire
        before the client's: the client should see its deadline, not a cancel it never
        made.)"""
        # Without the client's own deadline in the metadata its clock runs the deadline
        # out first, by the time the request took to get here: a cancel within that
        # margin is the deadline's.
        passed = (
            self._deadline_at is not None
            and asyncio.get_running_loop().time() >= self._deadline_at - DEADLINE_MARGIN_S
        )
        if passed and type(exc) is Cancelled:
            return DeadlinePassed("the call's deadline passed before the encode finished")
        return exc

    def __enter__(self) -> CallEnd:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._deadline is not None:
            self._deadline.cancel()


class KeptConnections:
    """The framed socket's connections between requests, so that shutdown can end them at
    once instead of waiting for connections that will send nothing more."""

    def __init__(self) -> None:
        self._idle: set[asyncio.Task[Any]] = set()
        self._ending = False

    async def requests(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A connection's requests, until the client ends them or the daemon shuts down."""
        task = asyncio.current_task()
        assert task is not None
        pending = aiter(requests)
        while not self._ending:
            self._idle.add(task)
            try:
                request = await anext(pending)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not self._ending:
                    raise
                task.uncancel()  # our own cancel, from end(): the connection ends cleanly
                return
            finally:
                self._idle.discard(task)
            yield request

    def end(self) -> None:
        self._ending = True
        for task in self._idle:
            task.cancel()
