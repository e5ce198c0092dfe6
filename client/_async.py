"""The asyncio client: awaits the core's steps on `grpc.aio` (see `_api`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb

from . import _steps as ops
from ._api import ClientApi
from ._channel import explained, fork_generation, keep_after_fork, open_channel
from ._errors import DeadlineExceeded, SidecarUnavailable, error_from_rpc
from ._framed import AsyncFramedConnection, to_the_end
from ._steps import Op, Steps, run_awaiting
from ._stream import StreamCore, StreamFace
from ._types import Attachment, EncodeResult, Lease, Status

T = TypeVar("T")

log = logging.getLogger("client")


class AsyncSidecarClient(ClientApi[Coroutine[Any, Any, EncodeResult], "AsyncVideoStream"]):
    """Async twin of `SidecarClient`: the same calls and arguments, awaitable.

    ```python
    async with AsyncSidecarClient() as client:
        result = await client.encode(video, fps=24)
    ```

    Use a client from one event loop. gRPC's asyncio stack does not survive fork: in a
    child after fork, make a new client (closing an inherited one is fine, and leaves the
    parent's leases alone).

    Encodes answered in one reply go on kept connections to the daemon's framed socket:
    plain sockets, which fork leaves alone (a process forked while a gRPC asyncio stream
    is open crashed in the child about one time in three).
    """

    _preparing: asyncio.Task[None] | None = None

    def _connect(self) -> None:
        self._generation = fork_generation()
        self._channel, self._stubs = open_channel(grpc.aio, self._core.target, self.credentials)
        self._lock = asyncio.Lock()
        self._framed: dict[str, list[AsyncFramedConnection]] = {}  # idle, by socket path
        keep_after_fork(self)

    def grpc_objects(self) -> tuple[Any, ...]:
        """What a child after fork must keep from being collected (see `_core._Forks`)."""
        return (self._channel,)

    async def _run(self, steps: Steps[T]) -> T:
        self._check_open(steps)
        return await run_awaiting(steps, self._perform)

    def _attach_in_background(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # made outside a loop: the first call attaches
        self._preparing = loop.create_task(self._attach_early(), name="video-sidecar-attach")

    async def _attach_early(self) -> None:
        try:
            await self._run(self._core.attach())
        except Exception as exc:  # the first request attaches itself, and raises this
            log.debug("attaching early to %s failed: %s", self._core.target, exc)

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, ops.Work):  # a long one may write into leases: to its end
            return await to_the_end(asyncio.to_thread(op.run)) if op.long else op.run()
        if self._generation != fork_generation():
            raise SidecarUnavailable(
                "an AsyncSidecarClient cannot be used after fork; make one in the child"
            )
        # A Release is cleanup (the steps give leases back when cancelled): it runs to its
        # end even if cancelled again meanwhile, as anyio cancels at every await, or a
        # lease would stay held while this client's other calls renew it.
        if isinstance(op, ops.Call):
            stub = getattr(self._stubs[op.service], op.method)
            call = stub(op.request, timeout=op.timeout, wait_for_ready=op.wait_for_ready)
            try:
                return await (to_the_end(call) if op.method == "Release" else call)
            except grpc.RpcError as err:
                raise explained(self._core.target, error_from_rpc(err)) from None
        if isinstance(op, ops.Exchange):
            exchange = self._exchange(op)
            releases = isinstance(op.request, pb.ReleaseRequest)
            return await (to_the_end(exchange) if releases else exchange)
        if isinstance(op, ops.Replies):
            async for event in self._stubs["sidecar"].Encode(
                op.request, timeout=op.timeout, metadata=ops.deadline_metadata(op.timeout)
            ):
                op.feed(event)
            return None
        if isinstance(op, ops.Exclusive):
            async with self._lock:
                return await self._run(op.steps)
        if isinstance(op, ops.OpenStream):
            return await _StreamCall.open(self._stubs["sidecar"], op)
        assert isinstance(op, ops.OnStream), op
        return await op.call.act(op)

    async def _exchange(self, op: ops.Exchange) -> pb.FramedReply:
        """A request on a framed connection kept for the next one, or a new one."""
        idle = self._framed.setdefault(op.framed, [])
        while idle and not idle[-1].open:
            idle.pop().end()  # the daemon ended it (restart, shutdown)
        connection = idle.pop() if idle else await AsyncFramedConnection.open_to(op.framed)
        try:
            reply = await connection.ask(op.request, op.timeout, op.reply_max, op.landing)
        except BaseException:  # cancelled included: closing it stops the encode
            connection.end(cancel=True)
            raise
        idle.append(connection)
        return reply

    def _result(self, steps: Steps[EncodeResult]) -> Coroutine[Any, Any, EncodeResult]:
        return self._run(steps)

    def _stream(self, core: StreamCore) -> AsyncVideoStream:
        return AsyncVideoStream(self, core)

    async def __aenter__(self) -> AsyncSidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Give back the spare lease, unmap the slabs, close the framed connections and
        the channel. Closing a closed client does nothing; any other call raises
        `SidecarClosed`."""
        if self._closed:
            return
        if self._preparing is not None and not self._preparing.done():
            await asyncio.wait([self._preparing])
        try:
            await self._run(self._core.close())
        finally:
            self._closed = True
        if self._generation == fork_generation():  # a parent's channel is left alone
            for idle in self._framed.values():
                for connection in idle:
                    connection.end()
            self._framed.clear()
            await self._channel.close()

    async def attach(self, *, refresh: bool = False) -> Attachment:
        """Attach (once) and map the daemon's slabs; `refresh` attaches anew."""
        return await self._run(self._core.attach(refresh=refresh))

    async def lease(self, nbytes: int, *, wait: float | None = None) -> Lease:
        """Lease a region of at least `nbytes`; waits up to `wait` seconds for room."""
        return await self._run(self._core.lease_for_caller(nbytes, wait))

    async def release(self, lease: Lease | str) -> None:
        """Give a lease back. Releasing one the daemon already freed is not an error."""
        await self._run(self._core.release(lease))

    async def status(self) -> Status:
        """Pool occupancy, encodes and counters."""
        return await self._run(self._core.status())

    async def warm_up(self, device: Any = None) -> None:
        """Attach now and, on a GPU worker (or given a CUDA `device`), register every slab
        and load the GPU conversion's kernels: the first request then pays none of it.
        Without it, attaching does the same on a thread of its own once the process has
        started CUDA, and the first request registers its own slab beside it."""
        await self._run(self._core.warm_up(device))

    async def health(self, service: str = "") -> str:
        """The daemon's health status name, e.g. "SERVING"."""
        return await self._run(self._core.health(service))


class AsyncVideoStream(StreamFace):
    """One streaming encode on an `AsyncSidecarClient`; make it with `client.stream(...)`."""

    def __init__(self, client: AsyncSidecarClient, core: StreamCore) -> None:
        self._client = client
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        super().__init__(core, self._chunks.put_nowait)

    async def __aenter__(self) -> AsyncVideoStream:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.cancel()

    async def write(self, video: Any) -> None:
        """As `VideoStream.write`, awaited."""
        await self._client._run(self._core.write(video))

    async def close(self, audio: Any = None, sample_rate: int | None = None) -> EncodeResult:
        """As `VideoStream.close`, awaited."""
        return await self._client._run(self._core.close(audio, sample_rate))

    async def cancel(self) -> None:
        """Abandon the stream; every lease it took is freed."""
        await self._client._run(self._core.cancel())

    async def chunks(self) -> AsyncIterator[bytes]:
        """The output as it is produced (fragmented MP4 arrives while encoding)."""
        while (data := await self._chunks.get()) is not None:
            yield data
        self._chunks.put_nowait(None)  # for the next iteration, which ends at once


class _StreamCall:
    """An EncodeStream call: requests written on the call, replies read by a task."""

    def __init__(self, stub: Any, op: ops.OpenStream) -> None:
        self._call = stub.EncodeStream(
            timeout=op.timeout, metadata=ops.deadline_metadata(op.timeout)
        )
        self._stream = op.reader
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, stub: Any, op: ops.OpenStream) -> _StreamCall:
        call = cls(stub, op)
        await call._write(op.header)
        return call

    async def _read(self) -> None:
        with self._stream.reading():
            try:
                async for event in self._call:
                    self._stream.take_reply(event)
            except (grpc.RpcError, asyncio.CancelledError):
                raise
            except BaseException:
                # A callback of the caller's raised: as in `SidecarClient`'s stream calls,
                # the call ends here and the daemon stops the encode.
                self._call.cancel()
                raise

    async def act(self, op: ops.OnStream) -> None:
        if op.action == "send":
            assert op.message is not None
            await self._write(op.message)
            return
        if op.action == "abort":
            self._call.cancel()
        else:  # the end of the requests
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._call.done_writing()
        await asyncio.wait({self._reader})  # never raises: the reader keeps the call's error

    async def _write(self, message: pb.StreamRequest) -> None:
        try:
            await self._call.write(message)
        except (asyncio.InvalidStateError, grpc.RpcError):
            # The call has ended: the daemon refused the stream, and its error says why;
            # or its deadline passed, and gRPC fails the write with INTERNAL ("Internal
            # error from Core"), which is not what happened.
            await asyncio.wait({self._reader})
            remaining = self._call.time_remaining()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded("the deadline passed while the stream was sent") from None
            self._stream.raise_if_failed()
            raise
