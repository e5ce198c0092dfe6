"""The gRPC face of the daemon: proto in, domain call, proto out.

Thin on purpose. Every domain error becomes a status code in exactly one place,
`status_codes.STATUS_OF`; what a call's end means for its encodes is in `calls`.

Requests are decoded by `add_to_server`'s own deserialisers: bytes that are not a valid
message (or hold invalid UTF-8) become `Undecodable`, which each handler refuses with
INVALID_ARGUMENT, instead of grpc's UNKNOWN.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar

import grpc

from ..api.v1 import sidecar_pb2 as pb
from ..api.v1 import sidecar_pb2_grpc as pb_grpc
from ..errors import Cancelled, EncodeFailed, InvalidRequest, SidecarError
from ..events import Chunk, Progress
from ..pipeline.requests import OneReply, Result
from ..pool.lease_queue import MAX_REGIONS
from ..service import Sidecar
from ..vocabulary import FRAMED_VERSION, MAX_MESSAGE_BYTES, Reason
from .calls import CallEnd, Sessions, after_call, unless_cancelled
from .convert import (
    attachment_to_proto,
    encode_spec_from_proto,
    event_to_proto,
    leases_to_proto,
    result_to_proto,
    status_to_proto,
    stream_messages,
    stream_spec_from_proto,
)
from .decoding import Undecodable
from .status_codes import error_trailers, errors_by_code, forget_frames, session_error, status_of

log = logging.getLogger(__name__)

# A one-reply gRPC call's result: its output inside the one message, with room left for
# its other fields.
GRPC_ONE_REPLY = OneReply(MAX_MESSAGE_BYTES - 1024 * 1024)

_REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")


H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


def _mapped(handler: H) -> H:
    """Run a unary handler, turning a domain error into its status code."""

    @wraps(handler)
    async def wrapper(self: VideoSidecarServicer, request: Any, context: Any) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise request.refuse()
            return await handler(self, request, context)
        except SidecarError as exc:
            await self._fail(context, exc)

    return wrapper  # type: ignore[return-value]


Observer = Callable[[str, float, int, int], None]  # code, seconds, frames, bytes


class VideoSidecarServicer(pb_grpc.VideoSidecarServicer):
    def __init__(self, sidecar: Sidecar, observer: Observer | None = None) -> None:
        self.sidecar = sidecar
        self.observer = observer  # e.g. Prometheus metrics
        self._sessions = Sessions()
        self.framed_socket = ""  # the framed socket's file name, once it listens

    async def _fail(self, context: grpc.aio.ServicerContext, exc: SidecarError) -> None:
        code = status_of(exc)
        self.sidecar.record_error(exc)
        forget_frames(exc)
        await context.abort(code, str(exc), trailing_metadata=error_trailers(exc, code))

    # -- unary RPCs ----------------------------------------------------------------------

    @_mapped
    async def Attach(self, request: pb.AttachRequest, context: Any) -> pb.AttachResponse:
        reply = attachment_to_proto(self.sidecar.attach(request.client_name, request.pid))
        reply.framed_socket = self.framed_socket
        reply.framed_version = FRAMED_VERSION if self.framed_socket else 0
        return reply

    @_mapped
    async def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:
        return await self._lease(request)

    @_mapped
    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseResponse:
        self._release(request)
        return pb.ReleaseResponse()

    async def _lease(self, request: pb.LeaseRequest) -> pb.LeaseResponse:
        if len(request.more_sizes) >= MAX_REGIONS:  # counted before anything is built
            raise InvalidRequest("more_sizes", f"a lease request holds 1-{MAX_REGIONS} regions")
        sizes = [request.size, *request.more_sizes]
        leases = await self.sidecar.lease(
            request.client_token, sizes, request.wait_ms / 1e3, request.tag
        )
        return leases_to_proto(leases)

    def _release(self, request: pb.ReleaseRequest) -> None:
        self.sidecar.release(request.client_token, request.lease_id, request.tag)

    @_mapped
    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        report = self.sidecar.status()
        return status_to_proto(report, errors_by_code(report.stats.errors))

    # -- encodes -------------------------------------------------------------------------

    async def Encode(
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeEvent]:
        received_at = time.perf_counter()
        request_id, events = self._whole(request, received_at, one_reply=None)
        async for reply in self._replies(request_id, received_at, events, context):
            yield reply

    async def EncodeOnce(
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeResult:
        received_at = time.perf_counter()
        request_id, events = self._whole(request, received_at, one_reply=GRPC_ONE_REPLY)
        result = pb.EncodeResult()
        with CallEnd.of(context) as end:
            try:
                async for event in self._relay(
                    request_id, received_at, end, events, after_call(context)
                ):
                    if isinstance(event, Result):  # progress is not sent: the result is the reply
                        result = result_to_proto(event)
            except SidecarError as exc:
                await self._fail(context, exc)
        return result

    async def EncodeSession(
        self,
        requests: AsyncIterator[pb.EncodeRequest | Undecodable],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.SessionReply]:
        with CallEnd.of(context) as end:
            async for reply, sent in self.session(requests, end):
                yield reply
                for action in sent:
                    action()

    async def session(
        self,
        requests: AsyncIterator[pb.EncodeRequest | Undecodable],
        end: CallEnd,
        *,
        one_reply: OneReply = GRPC_ONE_REPLY,
    ) -> AsyncIterator[tuple[pb.SessionReply, list[Callable[[], None]]]]:
        """A kept session's replies, one per request, in order, each with the actions to
        run once it has gone out. Shared by EncodeSession and the framed socket's "VSF1",
        whose replies carry outputs as its `one_reply` says."""
        async for request in self._sessions.requests(requests):
            sent: list[Callable[[], None]] = []
            try:
                result = await self._answer(request, end, one_reply, sent)
                reply = pb.SessionReply(result=result)
            except SidecarError as exc:  # the request's error, as its reply
                self.sidecar.record_error(exc)
                forget_frames(exc)
                reply = pb.SessionReply(error=session_error(exc))
            yield reply, sent

    async def framed(
        self,
        requests: AsyncIterator[pb.FramedRequest | Undecodable],
        end: CallEnd,
        *,
        one_reply: OneReply,
    ) -> AsyncIterator[tuple[pb.FramedReply, list[Callable[[], None]]]]:
        """The framed socket's "VSF2": `session` for encodes, with leases and releases
        between them, each as its unary call would do it."""
        async for request in self._sessions.requests(requests):
            sent: list[Callable[[], None]] = []
            kind = None if isinstance(request, Undecodable) else request.WhichOneof("request")
            try:
                if kind == "lease":
                    reply = pb.FramedReply(lease=await self._lease(request.lease))
                elif kind == "release":
                    self._release(request.release)
                    reply = pb.FramedReply(release=pb.ReleaseResponse())
                elif kind is None and not isinstance(request, Undecodable):
                    raise InvalidRequest("request", "a FramedRequest with nothing set")
                else:  # an encode, or bytes that are none: refused as an encode is
                    encode = request if isinstance(request, Undecodable) else request.encode
                    result = await self._answer(encode, end, one_reply, sent)
                    reply = pb.FramedReply(result=result)
            except SidecarError as exc:
                self.sidecar.record_error(exc)
                forget_frames(exc)
                reply = pb.FramedReply(error=session_error(exc))
            yield reply, sent

    async def _answer(
        self,
        request: pb.EncodeRequest | Undecodable,
        end: CallEnd,
        one_reply: OneReply,
        sent: list[Callable[[], None]],
    ) -> pb.EncodeResult:
        """One encode on a kept session or connection: its result, or its SidecarError."""
        received_at = time.perf_counter()
        request_id, events = self._whole(request, received_at, one_reply=one_reply)
        result = pb.EncodeResult()
        async for event in self._relay(request_id, received_at, end, events, sent.append):
            if isinstance(event, Result):
                result = result_to_proto(event)
        return result

    def end_idle_sessions(self) -> None:
        """At shutdown: end every EncodeSession call between requests, and each other
        one after its reply."""
        self._sessions.end()

    def _whole(
        self,
        request: pb.EncodeRequest | Undecodable,
        received_at: float,
        *,
        one_reply: OneReply | None,
    ) -> tuple[str, Callable[[threading.Event], AsyncIterator[Any]]]:
        """The request id to log under, and the domain events of a whole-video encode."""
        given = "" if isinstance(request, Undecodable) else request.request_id
        request_id = _request_id(given)

        def events(stop: threading.Event) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                raise request.refuse()
            check_request_id(given)
            spec = encode_spec_from_proto(request, request_id, one_reply=one_reply)
            return self.sidecar.encode(spec, received_at, stop)

        return request_id, events

    async def EncodeStream(
        self, requests: AsyncIterator[pb.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeEvent]:
        received_at = time.perf_counter()
        requests = unless_cancelled(requests, context)
        try:
            first = await anext(requests, None)
        except Cancelled:  # before its header: nothing to answer, log or count
            return
        header = (
            first.header
            if isinstance(first, pb.StreamRequest) and first.HasField("header")
            else None
        )
        request_id = _request_id(header.request_id if header is not None else "")

        def events(stop: threading.Event) -> AsyncIterator[Any]:
            if isinstance(first, Undecodable):
                raise first.refuse()
            if header is None:
                raise InvalidRequest("header", "a stream starts with a header message")
            check_request_id(header.request_id)
            spec = stream_spec_from_proto(header, request_id)
            return self.sidecar.stream(spec, stream_messages(requests), received_at, stop)

        async for reply in self._replies(request_id, received_at, events, context):
            yield reply

    async def _replies(
        self,
        request_id: str,
        received_at: float,
        events: Callable[[threading.Event], AsyncIterator[Any]],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.EncodeEvent]:
        """A reply stream's messages: the encode's events, and its error as the status."""
        with CallEnd.of(context) as end:
            try:
                async for event in self._relay(
                    request_id, received_at, end, events, after_call(context)
                ):
                    yield event_to_proto(event)
            except SidecarError as exc:
                await self._fail(context, exc)

    async def _relay(
        self,
        request_id: str,
        received_at: float,
        end: CallEnd,
        events: Callable[[threading.Event], AsyncIterator[Any]],
        when_sent: Callable[[Callable[[], None]], None],
    ) -> AsyncIterator[Progress | Chunk | Result]:
        """An encode's domain events, its log line and metrics. A domain error is raised
        once recorded (a stop by the call's deadline as that, see `CallEnd.why`), and a
        bug of ours as EncodeFailed: the caller sends it, as a status or a reply. A
        result's `after` goes to `when_sent`, which runs it once the answer has gone out."""
        self.sidecar.received()
        outcome = "CANCELLED"  # ended before its result: the client went away
        error = ""
        frames = size = 0
        try:
            async for event in events(end.event()):
                if isinstance(event, Result):
                    outcome, frames, size = "OK", event.frames, event.size_bytes
                    if event.after is not None:
                        when_sent(event.after)
                yield event
        except SidecarError as exc:
            answer = end.why(exc)
            outcome = status_of(answer).name
            error = str(answer)
            if answer is exc:
                raise
            raise answer from None
        except asyncio.CancelledError:  # gRPC ended the call: the client left, or its deadline
            answer = end.why(Cancelled("cancelled"))
            outcome = status_of(answer).name
            if answer.reason is not Reason.CANCELLED:  # counted as `_fail` would have
                self.sidecar.record_error(answer)
            raise
        except Exception as exc:  # a bug of ours: say so, as INTERNAL, never UNKNOWN
            log.exception("encode %s failed unexpectedly", request_id)
            outcome = "INTERNAL"
            error = f"unexpected {type(exc).__name__}"
            raise EncodeFailed(f"internal error: {error}") from None
        finally:
            room = self.sidecar.left_for_room.pop(request_id, None)
            if outcome == "CANCELLED" and room is not None:
                outcome, error = "RESOURCE_EXHAUSTED", f"its client's lease wait ran out: {room}"
            report = functools.partial(
                self._report, request_id, outcome, error, frames, size, received_at
            )
            if outcome == "OK":  # after the reply has gone: the client need not wait for it
                asyncio.get_running_loop().call_soon(report)
            else:
                report()

    def _report(
        self, request_id: str, outcome: str, error: str, frames: int, size: int, since: float
    ) -> None:
        """The encode's log line and metrics."""
        seconds = time.perf_counter() - since
        log.info(
            "encode request_id=%s status=%s frames=%d bytes=%d ms=%.1f%s",
            request_id,
            outcome,
            frames,
            size,
            seconds * 1e3,
            f" error={error!r}" if error else "",
            extra={
                "request_id": request_id,
                "status": outcome,
                "frames": frames,
                "bytes": size,
                "ms": round(seconds * 1e3, 1),
                **({"error": error} if error else {}),
            },
        )
        if self.observer is not None:
            self.observer(outcome, seconds, frames, size)


def _request_id(given: str) -> str:
    """The id to log under: the client's if it is valid, else one made up."""
    return given if _REQUEST_ID_RE.match(given) else secrets.token_hex(8)


def check_request_id(given: str) -> None:
    if given and not _REQUEST_ID_RE.match(given):
        raise InvalidRequest(
            "request_id", "must be 1-128 printable ASCII characters without spaces, or empty"
        )
