"""Operations written once as steps, and the two ways of running them.

Every operation of the client (attach, lease, encode, a stream's write...) is a generator
of *steps* in the I/O-free core: it yields an `Op` (an RPC to make, a request on a kept
session, host work to do, a lock to hold, an action on a stream call) and gets back the
op's result, or has the op's error raised where it yielded. The core keeps all the logic
(planning, leases, the spare lease, re-attaching, cleaning up on errors); a driver only
performs ops:
`SidecarClient` blocking (`run_blocking`), `AsyncSidecarClient` awaiting (`run_awaiting`).
psycopg 3 runs its protocol code, written as generators, the same way under its sync and
async connections.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

import grpc
from google.protobuf.message import Message

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import DEADLINE_KEY

from ._errors import error_from_rpc

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """A unary RPC; the driver returns the response message."""

    method: str  # "Attach", "Lease", "Release", "Status"; "Check" on health
    request: Message
    timeout: float | None  # None: no deadline (an encode)
    service: Literal["sidecar", "health"] = "sidecar"
    # Wait, within `timeout`, for a daemon that is not reachable yet (one restarting)
    # rather than fail at once.
    wait_for_ready: bool = False


@dataclass(frozen=True)
class Replies:
    """The server-streaming Encode RPC; the driver hands every reply to `feed`."""

    request: pb.EncodeRequest
    timeout: float | None
    feed: Callable[[pb.EncodeEvent], object]


@dataclass(frozen=True)
class Exchange:
    """One request on a connection to the daemon's framed socket at `framed`, which the
    driver keeps open for the next one (one per request in flight, reused). The driver
    returns the `FramedReply`, read up to `reply_max` bytes (the daemon's announced
    limit). `timeout` is the client's own. `landing` runs between sending the request
    and reading its reply, to its end whatever happens: it waits for the request's frames
    to land, counting them."""

    request: pb.EncodeRequest | pb.LeaseRequest | pb.ReleaseRequest
    framed: str
    timeout: float | None = None
    reply_max: int = 0
    landing: Callable[[], None] | None = None


@dataclass(frozen=True)
class Work:
    """Host work: a copy into a lease, waiting for GPU copies to land. The async driver
    runs `long` work on a worker thread, so that its event loop keeps turning."""

    run: Callable[[], Any]
    long: bool = False


@dataclass(frozen=True)
class Exclusive:
    """`steps` run while holding the client's lock (one attach at a time)."""

    steps: Generator[Op, Any, Any]


class ReplyReader(Protocol):
    """Where a driver's reader (a thread, or a task) puts a stream call's replies."""

    def reading(self) -> AbstractContextManager[None]: ...

    def take_reply(self, event: pb.EncodeEvent) -> None: ...

    def raise_if_failed(self) -> None: ...


@dataclass(frozen=True)
class OpenStream:
    """Start an EncodeStream call, `header` first; the driver returns its call handle and
    reads the replies into `reader` until the call ends."""

    header: pb.StreamRequest
    timeout: float | None
    reader: ReplyReader


@dataclass(frozen=True)
class OnStream:
    """An action on a call handle from `OpenStream`: "send" `message`; "end" the requests
    and wait for the last reply; "abort" the call and wait for the reader to stop."""

    call: Any
    action: Literal["send", "end", "abort"]
    message: pb.StreamRequest | None = None


Op = Call | Replies | Exchange | Work | Exclusive | OpenStream | OnStream
Steps = Generator[Op, Any, T]


def deadline_metadata(timeout: float | None) -> tuple[tuple[str, str], ...]:
    """The metadata of an encode RPC about to start with `timeout` seconds: its deadline
    as this client set it (see `DEADLINE_KEY`)."""
    return () if timeout is None else ((DEADLINE_KEY, f"{time.time() + timeout:.6f}"),)


class Task(Generic[T]):
    """Steps being run: `op` is the next op to perform; once it is None, `result` is set."""

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self.op: Op | None = None
        self._result: Any = None
        self._advance(steps.send, None)

    @property
    def result(self) -> T:
        return cast(T, self._result)

    def resume(self, value: Any, error: BaseException | None) -> None:
        """Hand the op's result back, or raise its error (gRPC's translated) in the steps."""
        if error is None:
            self._advance(self._steps.send, value)
            return
        if isinstance(error, grpc.RpcError):
            error = error_from_rpc(error)
        self._advance(self._steps.throw, error)

    def _advance(self, step: Callable[[Any], Op], arg: Any) -> None:
        try:
            self.op = step(arg)
        except StopIteration as stop:
            self.op = None
            self._result = stop.value


def run_blocking(steps: Steps[T], perform: Callable[[Op], Any]) -> T:
    task = Task(steps)
    while task.op is not None:
        try:
            value, error = perform(task.op), None
        except BaseException as exc:  # thrown into the steps, which clean up and re-raise
            value, error = None, exc
        task.resume(value, error)
    return task.result


async def run_awaiting(steps: Steps[T], perform: Callable[[Op], Awaitable[Any]]) -> T:
    task = Task(steps)
    while task.op is not None:
        try:
            value, error = await perform(task.op), None
        except BaseException as exc:  # cancellation included: the steps give leases back
            value, error = None, exc
        task.resume(value, error)
    return task.result
