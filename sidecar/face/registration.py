"""The service registered with gRPC: every request decoded by our own deserialisers, and
every handler kept from holding its request past its answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory

from ..api.v1 import sidecar_pb2 as pb
from .convert import REPEATED_LIMITS
from .decoding import Decoder, Pending, decode_pending
from .status_codes import forget_frames

if TYPE_CHECKING:
    from .servicer import VideoSidecarServicer


def add_to_server(servicer: VideoSidecarServicer, server: grpc.aio.Server) -> None:
    """Register the service, decoding every request with `decoding.Decoder`."""
    service = pb.DESCRIPTOR.services_by_name["VideoSidecar"]
    handlers = {}
    for method in service.methods:
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            _unretained(
                getattr(servicer, method.name), method.client_streaming, method.server_streaming
            ),
            request_deserializer=Decoder(
                message_factory.GetMessageClass(method.input_type), REPEATED_LIMITS
            ),
            response_serializer=lambda m: m.SerializeToString(),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def _unretained(handler: Callable[..., Any], requests: bool, replies: bool) -> Callable[..., Any]:
    """`handler`, given its requests decoded (a large one off the event loop: `decoding`),
    so that no error it ends with keeps its request alive: gRPC keeps an abort's error
    with the call, whose context the handler's frames hold, and those frames hold the
    request, a cycle only a full collection would break."""

    async def take(request: Any) -> Any:
        if requests:
            return _decoded(request)
        return await decode_pending(request) if isinstance(request, Pending) else request

    if replies:

        async def many(request: Any, context: Any) -> AsyncIterator[Any]:
            answers = handler(await take(request), context)
            del request
            try:
                async for answer in answers:
                    yield answer
            except BaseException as exc:
                forget_frames(exc)
                raise

        return many

    async def reply(request: Any, context: Any) -> Any:
        answer = handler(await take(request), context)
        del request
        try:
            return await answer
        except BaseException as exc:
            forget_frames(exc)
            raise

    return reply


async def _decoded(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield await decode_pending(request) if isinstance(request, Pending) else request
