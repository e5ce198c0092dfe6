"""The gRPC face of the daemon: proto in, domain call, proto out.

Thin on purpose. Every domain error becomes a status code in exactly one place,
`status_codes.STATUS_OF`; what a call's end means for its encodes is in `calls`.

Requests are decoded by `add_to_server`'s own deserialisers: bytes that are not a valid
message (or hold invalid UTF-8) become `Undecodable`, which each handler refuses with
INVALID_ARGUMENT, instead of grpc's UNKNOWN.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar

import grpc

from .. import framing
from ..api.v1 import sidecar_pb2 as pb
from ..api.v1 import sidecar_pb2_grpc as pb_grpc
from ..errors import Cancelled, InvalidRequest, SidecarError
from ..pipeline.admission.requests import OneReply, Result
from ..pool.lease_queue import MAX_REGIONS
from ..service import Sidecar
from .calls import CallEnd, KeptConnections, after_call, framed_deadline, unless_cancelled
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
from .framed_reading import FRAMED_REPLY_MAX_BYTES
from .outcomes import EncodeCall, Observer, Outcomes, check_request_id, request_id_for
from .status_codes import error_trailers, errors_by_code, forget_frames, framed_error, status_of

Sent = list[Callable[[], None]]  # what to run once a reply has gone out

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


class VideoSidecarServicer(pb_grpc.VideoSidecarServicer):
    def __init__(self, sidecar: Sidecar, observer: Observer | None = None) -> None:
        self.sidecar = sidecar
        self._outcomes = Outcomes(sidecar, observer)
        self._connections = KeptConnections()
        self.framed_socket = ""  # the framed socket's file name, once it listens

    def _recorded(self, exc: SidecarError) -> SidecarError:
        """A request's error, counted, its frames let go: about to be answered."""
        self.sidecar.record_error(exc)
        forget_frames(exc)
        return exc

    async def _fail(self, context: grpc.aio.ServicerContext, exc: SidecarError) -> None:
        code = status_of(self._recorded(exc))
        await context.abort(code, str(exc), trailing_metadata=error_trailers(exc, code))

    def _error(self, exc: SidecarError) -> pb.FramedError:
        """A request's error as the reply on a framed connection carries it."""
        return framed_error(self._recorded(exc))

    # -- unary RPCs ----------------------------------------------------------------------

    @_mapped
    async def Attach(self, request: pb.AttachRequest, context: Any) -> pb.AttachResponse:
        reply = attachment_to_proto(self.sidecar.attach(request.client_name, request.pid))
        reply.framed_socket = self.framed_socket
        if self.framed_socket:
            reply.framed_version = framing.VERSION
            reply.framed_reply_max_bytes = FRAMED_REPLY_MAX_BYTES
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
        encode = self._whole(request, received_at, one_reply=None)
        async for reply in self._replies(encode, context):
            yield reply

    async def framed(
        self,
        requests: AsyncIterator[pb.FramedRequest | Undecodable],
        end: CallEnd,
        *,
        one_reply: OneReply,
    ) -> AsyncIterator[tuple[pb.FramedReply, Sent]]:
        """The framed socket's replies, one per request, in order, each with the actions
        to run once it has gone out: an encode's result, whose output travels as
        `one_reply` says, or a lease or release as its unary call would do it."""
        async for request in self._connections.requests(requests):
            sent: Sent = []
            try:
                reply = await self._framed_reply(request, end, one_reply, sent)
            except SidecarError as exc:
                reply = pb.FramedReply(error=self._error(exc))
            yield reply, sent

    async def _framed_reply(
        self,
        request: pb.FramedRequest | Undecodable,
        end: CallEnd,
        one_reply: OneReply,
        sent: Sent,
    ) -> pb.FramedReply:
        if isinstance(request, Undecodable):  # bytes that are no request: refused as an encode is
            return pb.FramedReply(result=await self._answer(request, end, one_reply, sent))
        if request.WhichOneof("request") == "encode":
            with end.request_deadline(framed_deadline(request)):
                return pb.FramedReply(
                    result=await self._answer(request.encode, end, one_reply, sent)
                )
        kind = request.WhichOneof("request")
        if kind == "lease":
            return pb.FramedReply(lease=await self._lease(request.lease))
        if kind == "release":
            self._release(request.release)
            return pb.FramedReply(release=pb.ReleaseResponse())
        raise InvalidRequest("request", "a FramedRequest with nothing set")

    async def _answer(
        self,
        request: pb.EncodeRequest | Undecodable,
        end: CallEnd,
        one_reply: OneReply,
        sent: Sent,
    ) -> pb.EncodeResult:
        """One encode on a framed connection: its result, or its SidecarError."""
        received_at = time.perf_counter()
        encode = self._whole(request, received_at, one_reply=one_reply)
        return await self._result(encode, end, sent.append)

    async def _result(
        self, encode: EncodeCall, end: CallEnd, when_sent: Callable[[Callable[[], None]], None]
    ) -> pb.EncodeResult:
        """A one-reply encode's result; progress is not sent: the result is the reply."""
        result = pb.EncodeResult()
        async for event in self._outcomes.recorded(encode, end, when_sent):
            if isinstance(event, Result):
                result = result_to_proto(event)
        return result

    def end_idle_connections(self) -> None:
        """At shutdown: end every framed connection between requests, and each other one
        after its reply."""
        self._connections.end()

    def _whole(
        self,
        request: pb.EncodeRequest | Undecodable,
        received_at: float,
        *,
        one_reply: OneReply | None,
    ) -> EncodeCall:
        """A whole-video encode: the request id to log under, and its domain events."""
        given = "" if isinstance(request, Undecodable) else request.request_id
        request_id = request_id_for(given)

        def events(stop: threading.Event) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                raise request.refuse()
            check_request_id(given)
            spec = encode_spec_from_proto(request, request_id, one_reply=one_reply)
            return self.sidecar.encode(spec, received_at, stop)

        return EncodeCall(request_id, received_at, events)

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
        request_id = request_id_for(header.request_id if header is not None else "")

        def events(stop: threading.Event) -> AsyncIterator[Any]:
            if isinstance(first, Undecodable):
                raise first.refuse()
            if header is None:
                raise InvalidRequest("header", "a stream starts with a header message")
            check_request_id(header.request_id)
            spec = stream_spec_from_proto(header, request_id)
            return self.sidecar.stream(spec, stream_messages(requests), received_at, stop)

        async for reply in self._replies(EncodeCall(request_id, received_at, events), context):
            yield reply

    async def _replies(
        self, encode: EncodeCall, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeEvent]:
        """A reply stream's messages: the encode's events, and its error as the status."""
        with CallEnd.of(context) as end:
            try:
                async for event in self._outcomes.recorded(encode, end, after_call(context)):
                    yield event_to_proto(event)
            except SidecarError as exc:
                await self._fail(context, exc)
