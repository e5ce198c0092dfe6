"""The blocking client: performs the core's steps with blocking gRPC calls (see `_api`)."""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb

from . import _steps as ops
from ._api import ClientApi
from ._channel import explained, fork_generation, keep_after_fork, open_channel
from ._errors import error_from_rpc
from ._framed import FramedConnection
from ._steps import Op, Steps, run_blocking
from ._stream import StreamCore, StreamFace
from ._types import Attachment, EncodeResult, Lease, Status

T = TypeVar("T")

log = logging.getLogger("client")


class SidecarClient(ClientApi[EncodeResult, "VideoStream"]):
    """Talks to a video-sidecar daemon and writes frames straight into its slabs.

    ```python
    with SidecarClient() as client:
        result = client.encode(video, fps=24, path="clips/out.mp4")
    ```

    `target` is a socket path, a `unix:` URI or `host:port`; by default the daemon's
    default socket (or $VIDEO_SIDECAR_SOCKET). Slabs are mapped once, on first use, and
    again only if the daemon restarts. A client may be shared by threads, and survives a
    fork: the child opens its own channel and attaches anew.
    """

    _preparing: threading.Thread | None = None

    def _connect(self) -> None:
        self._generation = fork_generation()
        self._channel, self._stubs = open_channel(grpc, self._core.target, self.credentials)
        self._lock = threading.Lock()
        self._connections = _KeptConnections()
        keep_after_fork(self)

    def grpc_objects(self) -> tuple[Any, ...]:
        """What a child after fork must keep from being collected (see `_core._Forks`)."""
        return self._channel, self._connections

    def _run(self, steps: Steps[T]) -> T:
        self._check_open(steps)
        return run_blocking(steps, self._perform)

    def _attach_in_background(self) -> None:
        # Not a daemon thread: the interpreter must not end it inside a gRPC call.
        self._preparing = threading.Thread(target=self._attach_early, name="video-sidecar-attach")
        _PREPARING.add(self)
        self._preparing.start()

    def _attach_early(self) -> None:
        try:
            self._run(self._core.attach())
        except Exception as exc:  # the first request attaches itself, and raises this
            log.debug("attaching early to %s failed: %s", self._core.target, exc)

    def _prepared(self) -> None:
        """Wait for the early attach, if under way (bounded by the unary timeout)."""
        thread = self._preparing
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _perform(self, op: Op) -> Any:
        if self._generation != fork_generation():
            self._connect()  # a child after fork: the parent's channel is not usable here
        if isinstance(op, ops.Work):
            return op.run()
        if isinstance(op, ops.Call):
            call = getattr(self._stubs[op.service], op.method)
            try:
                return call(op.request, timeout=op.timeout, wait_for_ready=op.wait_for_ready)
            except grpc.RpcError as err:
                raise explained(self._core.target, error_from_rpc(err)) from None
        if isinstance(op, ops.Exchange):
            return self._connections.exchange(op)
        if isinstance(op, ops.Replies):
            for event in self._stubs["sidecar"].Encode(
                op.request, timeout=op.timeout, metadata=ops.deadline_metadata(op.timeout)
            ):
                op.feed(event)
            return None
        if isinstance(op, ops.Exclusive):
            with self._lock:
                return self._run(op.steps)
        if isinstance(op, ops.OpenStream):
            return _StreamCall(self._stubs["sidecar"], op)
        return op.call.act(op)

    def _result(self, steps: Steps[EncodeResult]) -> EncodeResult:
        return self._run(steps)

    def _stream(self, core: StreamCore) -> VideoStream:
        return VideoStream(self, core)

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give back the spare lease, unmap the slabs, close the kept framed connections
        and the channel. Closing a closed client does nothing; any other call raises
        `SidecarClosed`."""
        if self._closed:
            return
        self._prepared()
        try:
            self._run(self._core.close())
        finally:
            self._closed = True
        if self._generation == fork_generation():  # a parent's channel is left alone
            self._connections.close()
            self._channel.close()

    def attach(self, *, refresh: bool = False) -> Attachment:
        """Attach (once) and map the daemon's slabs; `refresh` attaches anew."""
        return self._run(self._core.attach(refresh=refresh))

    def lease(self, nbytes: int, *, wait: float | None = None) -> Lease:
        """Lease a region of at least `nbytes`; waits up to `wait` seconds for room."""
        return self._run(self._core.lease_for_caller(nbytes, wait))

    def release(self, lease: Lease | str) -> None:
        """Give a lease back. Releasing one the daemon already freed is not an error."""
        self._run(self._core.release(lease))

    def status(self) -> Status:
        """Pool occupancy, encodes and counters."""
        return self._run(self._core.status())

    def warm_up(self, device: Any = None) -> None:
        """Attach now and, on a GPU worker (or given a CUDA `device`), register every slab
        and load the GPU conversion's kernels: the first request then pays none of it.
        Without it, attaching does the same on a thread of its own once the process has
        started CUDA, and the first request registers its own slab beside it."""
        self._run(self._core.warm_up(device))

    def health(self, service: str = "") -> str:
        """The daemon's health status name, e.g. "SERVING"."""
        return self._run(self._core.health(service))


# Clients attaching early: a fork waits for their attach, so that no child starts with a
# client's lock held, or a call half made, by a thread it does not have.
_PREPARING: weakref.WeakSet[SidecarClient] = weakref.WeakSet()


def _before_fork() -> None:
    for client in list(_PREPARING):
        client._prepared()


os.register_at_fork(before=_before_fork)


class VideoStream(StreamFace):
    """One streaming encode on a `SidecarClient`; make it with `client.stream(...)`."""

    def __init__(self, client: SidecarClient, core: StreamCore) -> None:
        self._client = client
        self._chunks: queue.Queue[bytes | None] = queue.Queue()
        super().__init__(core, self._chunks.put)

    def __enter__(self) -> VideoStream:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    def write(self, video: Any) -> None:
        """Send a chunk: any accepted array or tensor of k frames, in order. Waits for a
        lease while the pool is full; the frames are copied when it returns."""
        self._client._run(self._core.write(video))

    def close(self, audio: Any = None, sample_rate: int | None = None) -> EncodeResult:
        """Finish the stream (optionally with the audio track declared when opening) and
        wait for the result."""
        return self._client._run(self._core.close(audio, sample_rate))

    def cancel(self) -> None:
        """Abandon the stream; every lease it took is freed."""
        self._client._run(self._core.cancel())

    def chunks(self) -> Iterator[bytes]:
        """The output as it is produced (fragmented MP4 arrives while encoding)."""
        while (data := self._chunks.get()) is not None:
            yield data
        self._chunks.put(None)  # for the next iteration, which ends at once


class _StreamCall:
    """An EncodeStream call: requests through a queue, replies read on a thread."""

    def __init__(self, stub: Any, op: ops.OpenStream) -> None:
        self._requests: queue.Queue[pb.StreamRequest | None] = queue.Queue()
        self._requests.put(op.header)
        self._call = stub.EncodeStream(
            iter(self._requests.get, None),
            timeout=op.timeout,
            metadata=ops.deadline_metadata(op.timeout),
        )
        self._reader = threading.Thread(
            target=self._read, args=(op,), name="video-sidecar-stream", daemon=True
        )
        self._reader.start()

    def _read(self, op: ops.OpenStream) -> None:
        with op.reader.reading():
            try:
                for event in self._call:
                    op.reader.take_reply(event)
            except grpc.RpcError:
                raise
            except BaseException:
                # A callback of the caller's raised (Ctrl-C in on_progress, say): the
                # replies go unread from now on, so the call ends here and the daemon
                # stops the encode, as it does when one sent as one request is left.
                self._call.cancel()
                raise

    def act(self, op: ops.OnStream) -> None:
        if op.action == "send":
            self._requests.put(op.message)
            return
        if op.action == "abort":
            self._call.cancel()
            self._reader.join()  # the call has ended: no half-close can follow the cancel
            self._requests.put(None)  # lets gRPC's sending thread go
            return
        self._requests.put(None)  # the end of the requests
        self._reader.join()


class _KeptConnections:
    """Framed connections kept open between requests, by socket path, one per request in
    flight, each taken by one request at a time and put back after its reply."""

    def __init__(self) -> None:
        self._framed: dict[str, list[FramedConnection]] = {}
        self._lock = threading.Lock()

    def exchange(self, op: ops.Exchange) -> pb.FramedReply:
        idle = self._framed.setdefault(op.framed, [])
        connection = self._take(idle) or FramedConnection(op.framed)
        try:
            reply = connection.ask(op.request, op.timeout, op.reply_max, op.landing)
        except BaseException:
            connection.end(cancel=True)  # in an unknown state: a reply may still come
            raise
        with self._lock:
            idle.append(connection)
        return reply

    def _take(self, idle: list[FramedConnection]) -> FramedConnection | None:
        """An idle one still open; the ones the daemon ended (restart, shutdown) end."""
        with self._lock:
            while idle:
                kept = idle.pop()
                if kept.open:
                    return kept
                kept.end()
        return None

    def close(self) -> None:
        with self._lock:
            idle = [c for cs in self._framed.values() for c in cs]
            self._framed = {}
        for kept in idle:
            kept.end()
