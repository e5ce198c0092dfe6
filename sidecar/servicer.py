"""The gRPC face of the daemon: proto in, domain call, proto out.

Thin on purpose. Every domain error becomes a status code in exactly one place,
`STATUS_OF`, and its reason (`vocabulary.Reason`) travels twice in the trailers: as
`video-sidecar-error`, and as a google.rpc.Status holding an ErrorInfo (the standard rich
error model), so clients can tell, say, an unknown token from a busy lease.

Requests are decoded by `add_to_server`'s own deserialisers: bytes that are not a valid
message (or hold invalid UTF-8) become `Undecodable`, which each handler refuses with
INVALID_ARGUMENT, instead of grpc's UNKNOWN.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, message_factory
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from . import __version__
from .api.v1 import sidecar_pb2 as pb
from .api.v1 import sidecar_pb2_grpc as pb_grpc
from .audio import AudioFormat
from .encoder import CodecSpec
from .errors import (
    Cancelled,
    DiskFull,
    EncodeFailed,
    InvalidRequest,
    LeaseBusy,
    LeaseNotFound,
    NotAttached,
    OutOfRange,
    OutputError,
    OutputExists,
    PoolExhausted,
    ShuttingDown,
    SidecarError,
)
from .frames import FrameRangeSpec
from .jobs import Chunk, Progress
from .leases import Lease
from .requests import (
    AudioPiece,
    AudioRangeSpec,
    EncodeSpec,
    InlineChunk,
    LeaseChunk,
    Result,
    StreamEnd,
    StreamMessage,
    VideoRequest,
)
from .service import Attachment, Sidecar, StatusReport
from .vocabulary import ERROR_DOMAIN, ERROR_KEY

log = logging.getLogger(__name__)

MAX_RANGES = 65_536

STATUS_OF: dict[type[SidecarError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    NotAttached: grpc.StatusCode.FAILED_PRECONDITION,
    LeaseNotFound: grpc.StatusCode.NOT_FOUND,
    LeaseBusy: grpc.StatusCode.FAILED_PRECONDITION,
    PoolExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    OutputExists: grpc.StatusCode.ALREADY_EXISTS,
    DiskFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    OutputError: grpc.StatusCode.FAILED_PRECONDITION,
    EncodeFailed: grpc.StatusCode.INTERNAL,
    Cancelled: grpc.StatusCode.CANCELLED,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
}

PIXEL_FORMAT_NAMES: dict[int, str] = {
    pb.PIXEL_FORMAT_RGB24: "rgb24",
    pb.PIXEL_FORMAT_BGR24: "bgr24",
    pb.PIXEL_FORMAT_RGBA: "rgba",
    pb.PIXEL_FORMAT_GRAY: "gray",
    pb.PIXEL_FORMAT_YUV420P: "yuv420p",
    pb.PIXEL_FORMAT_NV12: "nv12",
}

CONTAINER_NAMES: dict[int, str] = {
    pb.CONTAINER_UNSPECIFIED: "mp4",
    pb.CONTAINER_MP4: "mp4",
    pb.CONTAINER_FRAGMENTED_MP4: "fmp4",
    pb.CONTAINER_WEBM: "webm",
}
SAMPLE_FORMAT_NAMES: dict[int, str] = {pb.SAMPLE_FORMAT_F32: "f32", pb.SAMPLE_FORMAT_S16: "s16"}
MAX_AUDIO_PIECES = 4096

_REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")


def status_of(exc: SidecarError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]  # type: ignore[index]
    return grpc.StatusCode.INTERNAL


def error_trailers(exc: SidecarError, code: grpc.StatusCode) -> tuple[tuple[str, Any], ...]:
    """The error's reason as our own key and as a google.rpc.Status with an ErrorInfo."""
    info = error_details_pb2.ErrorInfo(reason=exc.reason.value, domain=ERROR_DOMAIN)
    if exc.field:
        info.metadata["field"] = exc.field
    detail = any_pb2.Any()
    detail.Pack(info)
    rich = status_pb2.Status(code=code.value[0], message=str(exc), details=[detail])
    return ((ERROR_KEY, exc.reason.value), *rpc_status.to_status(rich).trailing_metadata)


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request whose bytes are not a valid message."""

    message: str

    def refuse(self) -> InvalidRequest:
        return InvalidRequest("request", f"not a valid {self.message} message")


def _decoder(cls: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception:  # DecodeError, or invalid UTF-8 in a string field
            return Undecodable(cls.DESCRIPTOR.name)

    return decode


def add_to_server(servicer: VideoSidecarServicer, server: grpc.aio.Server) -> None:
    """Register the service, decoding every request with `_decoder` (see the module doc)."""
    service = pb.DESCRIPTOR.services_by_name["VideoSidecar"]
    handlers = {}
    for method in service.methods:
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=_decoder(message_factory.GetMessageClass(method.input_type)),
            response_serializer=lambda m: m.SerializeToString(),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


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

    async def _fail(self, context: grpc.aio.ServicerContext, exc: SidecarError) -> None:
        code = status_of(exc)
        self.sidecar.stats.errors[code.name] += 1
        await context.abort(code, str(exc), trailing_metadata=error_trailers(exc, code))

    # -- unary RPCs ----------------------------------------------------------------------

    @_mapped
    async def Attach(self, request: pb.AttachRequest, context: Any) -> pb.AttachResponse:
        return attachment_to_proto(self.sidecar.attach(request.client_name, request.pid))

    @_mapped
    async def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:
        lease = await self.sidecar.lease(request.client_token, request.size, request.wait_ms / 1e3)
        return lease_to_proto(lease, self.sidecar.config.lease_ttl)

    @_mapped
    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseResponse:
        self.sidecar.release(request.client_token, request.lease_id)
        return pb.ReleaseResponse()

    @_mapped
    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        return status_to_proto(self.sidecar.status())

    # -- streaming -----------------------------------------------------------------------

    async def Encode(
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeEvent]:
        received_at = time.perf_counter()
        given = "" if isinstance(request, Undecodable) else request.request_id
        request_id = _request_id(given)

        def events(stop: threading.Event) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                raise request.refuse()
            check_request_id(given)
            spec = encode_spec_from_proto(request, request_id)
            return self.sidecar.encode(spec, received_at, stop)

        async for event in self._relay(request_id, received_at, context, events):
            yield event

    async def EncodeStream(
        self, requests: AsyncIterator[pb.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeEvent]:
        received_at = time.perf_counter()
        first = await anext(aiter(requests), None)
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

        async for event in self._relay(request_id, received_at, context, events):
            yield event

    async def _relay(
        self,
        request_id: str,
        received_at: float,
        context: grpc.aio.ServicerContext,
        events: Callable[[threading.Event], AsyncIterator[Any]],
    ) -> AsyncIterator[pb.EncodeEvent]:
        """Turn domain events into replies, and a domain error into its status, once."""
        outcome = "OK"
        frames = size = 0
        # The RPC ending early (client gone, deadline passed) stops the encoder.
        stop = threading.Event()
        context.add_done_callback(lambda _context: stop.set())
        remaining = context.time_remaining()
        deadline = (
            asyncio.get_running_loop().call_later(max(0.0, remaining), stop.set)
            if remaining is not None
            else None
        )
        try:
            async for event in events(stop):
                if isinstance(event, Result):
                    frames, size = event.frames, event.size_bytes
                    if event.after is not None:
                        context.add_done_callback(_run_after(event.after))
                yield event_to_proto(event, self.sidecar.config.lease_ttl)
        except SidecarError as exc:
            outcome = status_of(exc).name
            await self._fail(context, exc)
        except asyncio.CancelledError:
            outcome = "CANCELLED"
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            seconds = time.perf_counter() - received_at
            log.info(
                "encode request_id=%s status=%s frames=%d bytes=%d ms=%.1f",
                request_id,
                outcome,
                frames,
                size,
                seconds * 1e3,
                extra={
                    "request_id": request_id,
                    "status": outcome,
                    "frames": frames,
                    "bytes": size,
                    "ms": round(seconds * 1e3, 1),
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


def _run_after(action: Callable[[], None]) -> Callable[[Any], None]:
    """A done-callback that runs `action` once the RPC has ended."""
    return lambda _context: action()


# -- conversions ---------------------------------------------------------------------------


def attachment_to_proto(a: Attachment) -> pb.AttachResponse:
    return pb.AttachResponse(
        client_token=a.client_token,
        instance_id=a.instance_id,
        shm_dir=a.shm_dir,
        slabs=[pb.Slab(id=s.id, shm_name=s.name, size=s.size) for s in a.slabs],
        limits=pb.Limits(
            max_lease_bytes=a.slab_size,
            alignment=a.alignment,
            max_frames=a.limits.max_frames,
            max_width=a.limits.max_width,
            max_height=a.limits.max_height,
            max_request_bytes=a.limits.max_request_bytes,
            lease_ttl_ms=int(a.lease_ttl * 1e3),
            max_lease_wait_ms=int(a.max_lease_wait * 1e3),
        ),
        server_version=__version__,
    )


def lease_to_proto(lease: Lease, ttl: float) -> pb.LeaseResponse:
    return pb.LeaseResponse(
        lease_id=lease.id,
        slab_id=lease.slab_id,
        offset=lease.offset,
        size=lease.size,
        ttl_ms=int(ttl * 1e3),
    )


def video_from_proto(
    width: int, height: int, pixel_format: int, fps: pb.Rational, ranges: Any = ()
) -> VideoRequest:
    if len(ranges) > MAX_RANGES:
        raise InvalidRequest("video.ranges", f"at most {MAX_RANGES} ranges per request")
    return VideoRequest(
        width=width,
        height=height,
        pixel_format=PIXEL_FORMAT_NAMES.get(pixel_format, f"enum value {pixel_format}"),
        fps=(fps.num, fps.den),
        ranges=tuple(range_from_proto(r) for r in ranges),
    )


def range_from_proto(r: pb.FrameRange) -> FrameRangeSpec:
    return FrameRangeSpec(r.lease_id, r.offset, r.frame_count, r.row_stride, r.frame_stride)


def codec_from_proto(c: pb.CodecOptions) -> CodecSpec:
    return CodecSpec(
        codec=c.codec,
        crf=c.crf if c.HasField("crf") else None,
        preset=c.preset,
        gop=c.gop if c.HasField("gop") else None,
        threads=c.threads,
        extra=tuple(sorted(c.extra.items())),
    )


def output_from_proto(o: pb.OutputSpec, present: bool) -> dict[str, Any]:
    which = o.WhichOneof("target") if present else None
    if o.container not in CONTAINER_NAMES:
        raise InvalidRequest("output.container", f"unknown container enum value {o.container}")
    return {
        "path": o.file.path if which == "file" else None,
        "overwrite": which == "file" and o.file.overwrite,
        "container": CONTAINER_NAMES[o.container],
    }


def audio_from_proto(present: bool, a: pb.AudioSpec, data: Any) -> dict[str, Any]:
    if len(data) > MAX_AUDIO_PIECES:
        raise InvalidRequest("audio_data", f"at most {MAX_AUDIO_PIECES} pieces")
    fmt = None
    if present:
        fmt = AudioFormat(
            a.sample_rate,
            a.channels,
            SAMPLE_FORMAT_NAMES.get(a.sample_format, f"enum value {a.sample_format}"),
        )
    return {"audio": fmt, "audio_data": audio_pieces_from_proto(data)}


def audio_pieces_from_proto(data: Any) -> tuple[AudioPiece, ...]:
    pieces: list[AudioPiece] = []
    for d in data:
        if d.WhichOneof("source") == "range":
            pieces.append(AudioRangeSpec(d.range.lease_id, d.range.offset, d.range.size))
        else:
            pieces.append(bytes(d.inline))
    return tuple(pieces)


def encode_spec_from_proto(request: pb.EncodeRequest, request_id: str) -> EncodeSpec:
    v = request.video
    return EncodeSpec(
        client_token=request.client_token,
        request_id=request_id,
        video=video_from_proto(v.width, v.height, v.pixel_format, v.fps, v.ranges),
        codec=codec_from_proto(request.codec),
        next_lease_bytes=request.next_lease_bytes,
        **output_from_proto(request.output, request.HasField("output")),
        **audio_from_proto(request.HasField("audio"), request.audio, request.audio_data),
    )


def stream_spec_from_proto(h: pb.StreamHeader, request_id: str) -> EncodeSpec:
    return EncodeSpec(
        client_token=h.client_token,
        request_id=request_id,
        video=video_from_proto(h.width, h.height, h.pixel_format, h.fps),
        codec=codec_from_proto(h.codec),
        **output_from_proto(h.output, h.HasField("output")),
        **audio_from_proto(h.HasField("audio"), h.audio, h.audio_data),
    )


async def stream_messages(
    requests: AsyncIterator[pb.StreamRequest],
) -> AsyncIterator[StreamMessage]:
    """The rest of a stream as domain messages."""
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.refuse()
        kind = request.WhichOneof("message")
        if kind == "chunk":
            if request.chunk.WhichOneof("frames") == "range":
                yield LeaseChunk(range_from_proto(request.chunk.range))
            else:
                yield InlineChunk(bytes(request.chunk.inline))
        elif kind == "end":
            yield StreamEnd(
                audio_pieces_from_proto(request.end.audio_data), request.end.next_lease_bytes
            )
            return
        else:
            raise InvalidRequest("message", f"expected a chunk or the end, got {kind or 'nothing'}")


def event_to_proto(event: Progress | Chunk | Result, lease_ttl: float) -> pb.EncodeEvent:
    if isinstance(event, Progress):
        return pb.EncodeEvent(
            progress=pb.Progress(frames_done=event.frames_done, frames_total=event.frames_total)
        )
    if isinstance(event, Chunk):
        return pb.EncodeEvent(chunk=pb.OutputChunk(offset=event.offset, data=event.data))
    return pb.EncodeEvent(
        result=pb.EncodeResult(
            request_id=event.request_id,
            path=event.path,
            size_bytes=event.size_bytes,
            frames=event.frames,
            duration_s=event.duration_s,
            codec=event.codec,
            container=event.container,
            width=event.width,
            height=event.height,
            audio_samples=event.audio_samples,
            timings=pb.StageTimings(**event.timings_ms),
            next_lease=lease_to_proto(event.next_lease, lease_ttl) if event.next_lease else None,
        )
    )


def status_to_proto(s: StatusReport) -> pb.StatusResponse:
    return pb.StatusResponse(
        server_version=s.version,
        instance_id=s.instance_id,
        uptime_s=s.uptime_s,
        pool=pb.PoolStatus(
            slabs=s.pool.slabs,
            slab_size=s.pool.slab_size,
            total_bytes=s.pool.total_bytes,
            leased_bytes=s.pool.leased_bytes,
            active_leases=s.pool.active_leases,
            largest_free=s.pool.largest_free,
        ),
        active_encodes=s.active_encodes,
        queued_encodes=s.queued_encodes,
        max_concurrent_encodes=s.max_concurrent_encodes,
        clients=s.clients,
        counters=pb.Counters(
            requests=s.stats.requests,
            encodes_ok=s.stats.encodes_ok,
            encodes_failed=s.stats.encodes_failed,
            frames_encoded=s.stats.frames_encoded,
            bytes_out=s.stats.bytes_out,
            leases_granted=s.leases_granted,
            leases_expired=s.leases_expired,
            errors=dict(s.stats.errors),
            warm_hits=s.warm_hits,
            warm_misses=s.warm_misses,
        ),
    )
