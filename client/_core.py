"""The I/O-free core both clients share: targets, planning, requests, results, errors.

Nothing here talks to the network or touches shared memory; `SidecarClient` and
`AsyncSidecarClient` do the I/O around it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.config import default_socket

from ._errors import (
    InvalidArgument,
    ServerError,
    SidecarError,
    error_for,
)
from ._slabs import SlabInfo
from ._types import Attachment, EncodeResult, FrameRange, Status, Timings

ERROR_KEY = "video-sidecar-error"
NOT_ATTACHED = "NotAttached"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    # A local daemon that restarts should be found again within a fraction of a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

PIXEL_FORMAT_ENUM = {
    "rgb24": pb.PIXEL_FORMAT_RGB24,
    "bgr24": pb.PIXEL_FORMAT_BGR24,
    "rgba": pb.PIXEL_FORMAT_RGBA,
    "gray": pb.PIXEL_FORMAT_GRAY,
    "yuv420p": pb.PIXEL_FORMAT_YUV420P,
    "nv12": pb.PIXEL_FORMAT_NV12,
}


def resolve_target(target: str | None) -> str:
    """A gRPC target from a socket path, `unix:` URI or `host:port`.

    With no target: $VIDEO_SIDECAR_SOCKET, else the daemon's default socket.
    """
    target = target or os.environ.get("VIDEO_SIDECAR_SOCKET") or default_socket()
    if target.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return target
    if "/" in target or target.endswith(".sock"):
        return f"unix:{os.path.abspath(target)}"
    return target


def fps_rational(fps: float | int | Fraction | tuple[int, int]) -> pb.Rational:
    if isinstance(fps, tuple):
        num, den = fps
    else:
        rate = Fraction(fps).limit_denominator(1001 * 1000)
        num, den = rate.numerator, rate.denominator
    return pb.Rational(num=num, den=den)


def new_request_id() -> str:
    return secrets.token_hex(8)


def attachment_from_proto(resp: pb.AttachResponse) -> Attachment:
    lim = resp.limits
    return Attachment(
        client_token=resp.client_token,
        instance_id=resp.instance_id,
        shm_dir=resp.shm_dir,
        slabs=tuple(SlabInfo(s.id, s.shm_name, s.size) for s in resp.slabs),
        max_lease_bytes=lim.max_lease_bytes,
        alignment=lim.alignment or 1,
        max_frames=lim.max_frames,
        max_width=lim.max_width,
        max_height=lim.max_height,
        lease_ttl=lim.lease_ttl_ms / 1e3,
        max_lease_wait=lim.max_lease_wait_ms / 1e3,
        server_version=resp.server_version,
    )


def plan_ranges(frames: int, frame_bytes: int, att: Attachment) -> list[tuple[int, int]]:
    """Split a video into (first frame, count) ranges, one lease each, none over a slab."""
    per_lease = att.max_lease_bytes // frame_bytes
    if per_lease < 1:
        raise InvalidArgument(
            f"one frame is {frame_bytes} bytes but the daemon's slabs hold {att.max_lease_bytes}; "
            "start the daemon with a larger --slab-size"
        )
    return [(start, min(per_lease, frames - start)) for start in range(0, frames, per_lease)]


def fits_in_pool(ranges: list[tuple[int, int]], frame_bytes: int, att: Attachment) -> bool:
    """Whether every range can be leased at once; if not, the video goes as a stream,
    each range's lease freed as its frames are encoded."""
    largest = max(count for _, count in ranges) * frame_bytes
    room = sum(s.size // _aligned(largest, att.alignment) for s in att.slabs)
    # Leave room for others: a single request takes at most half the pool at once.
    return len(ranges) <= max(1, room // 2)


def _aligned(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def encode_request(
    *,
    token: str,
    request_id: str,
    width: int,
    height: int,
    pixel_format: str,
    fps: Any,
    ranges: list[FrameRange],
    path: str | None,
    overwrite: bool,
    codec: str,
    crf: int | None,
    preset: str | None,
    gop: int | None,
    threads: int,
    extra: Mapping[str, Any] | None,
    next_lease_bytes: int = 0,
    container: str = "mp4",
    audio: pb.AudioSpec | None = None,
    audio_data: list[pb.AudioData] | None = None,
) -> pb.EncodeRequest:
    options = codec_options(codec, crf, preset, gop, threads, extra)
    output = output_spec(path, overwrite, container)
    return pb.EncodeRequest(
        client_token=token,
        request_id=request_id,
        video=pb.VideoDescriptor(
            width=width,
            height=height,
            pixel_format=PIXEL_FORMAT_ENUM.get(pixel_format, pb.PIXEL_FORMAT_UNSPECIFIED),
            fps=fps_rational(fps),
            ranges=[
                pb.FrameRange(
                    lease_id=r.lease_id,
                    offset=r.offset,
                    frame_count=r.frame_count,
                    row_stride=r.row_stride,
                    frame_stride=r.frame_stride,
                )
                for r in ranges
            ],
        ),
        codec=options,
        output=output,
        next_lease_bytes=next_lease_bytes,
        audio=audio,
        audio_data=audio_data or [],
    )


CONTAINER_ENUM = {
    "mp4": pb.CONTAINER_MP4,
    "fmp4": pb.CONTAINER_FRAGMENTED_MP4,
    "webm": pb.CONTAINER_WEBM,
}


def codec_options(
    codec: str,
    crf: int | None,
    preset: str | None,
    gop: int | None,
    threads: int,
    extra: Mapping[str, Any] | None,
) -> pb.CodecOptions:
    options = pb.CodecOptions(
        codec=codec,
        preset=preset or "",
        threads=threads,
        extra={str(k): str(v) for k, v in (extra or {}).items()},
    )
    if crf is not None:
        options.crf = crf
    if gop is not None:
        options.gop = gop
    return options


def output_spec(path: str | None, overwrite: bool, container: str) -> pb.OutputSpec:
    if container not in CONTAINER_ENUM:
        raise InvalidArgument(f"container {container!r}: use mp4, fmp4 or webm")
    if path is not None:
        return pb.OutputSpec(
            file=pb.FileOutput(path=path, overwrite=overwrite), container=CONTAINER_ENUM[container]
        )
    return pb.OutputSpec(bytes=pb.BytesOutput(), container=CONTAINER_ENUM[container])


class ResultBuilder:
    """Consumes an Encode reply stream; `result()` assembles the EncodeResult."""

    def __init__(self, on_progress: Callable[[int, int], None] | None = None) -> None:
        self._on_progress = on_progress
        self._chunks: list[bytes] = []
        self._received = 0
        self._result: pb.EncodeResult | None = None
        self.next_lease: pb.LeaseResponse | None = None

    def feed(self, event: pb.EncodeEvent) -> bytes | None:
        """Take one reply; returns the bytes of an output chunk, if it was one."""
        kind = event.WhichOneof("event")
        if kind == "progress":
            if self._on_progress is not None:
                self._on_progress(event.progress.frames_done, event.progress.frames_total)
        elif kind == "chunk":
            if event.chunk.offset != self._received:
                raise ServerError(
                    f"output chunk at {event.chunk.offset}, expected {self._received}"
                )
            self._chunks.append(event.chunk.data)
            self._received += len(event.chunk.data)
            return event.chunk.data
        elif kind == "result":
            self._result = event.result
            if event.result.HasField("next_lease"):
                self.next_lease = event.result.next_lease
            if self._on_progress is not None:
                self._on_progress(event.result.frames, event.result.frames)
        return None

    def result(self, client: dict[str, float]) -> EncodeResult:
        r = self._result
        if r is None:
            raise ServerError("the daemon ended the encode without a result")
        data = b"".join(self._chunks) if not r.path else None
        if data is not None and len(data) != r.size_bytes:
            raise ServerError(f"received {len(data)} bytes, the daemon reported {r.size_bytes}")
        t = r.timings
        timings = Timings(
            lease_ms=client.get("lease_ms", 0.0),
            copy_ms=client.get("copy_ms", 0.0),
            queue_ms=t.queue_ms,
            validate_ms=t.validate_ms,
            open_ms=t.open_ms,
            convert_ms=t.convert_ms,
            encode_ms=t.encode_ms,
            mux_ms=t.mux_ms,
            finalize_ms=t.finalize_ms,
            daemon_ms=t.total_ms,
            transfer_ms=client.get("transfer_ms", 0.0),
            total_ms=client.get("total_ms", 0.0),
        )
        return EncodeResult(
            data=data,
            path=r.path or None,
            frames=r.frames,
            duration=r.duration_s,
            width=r.width,
            height=r.height,
            codec=r.codec,
            container=r.container,
            size_bytes=r.size_bytes,
            request_id=r.request_id,
            timings=timings,
            audio_samples=r.audio_samples,
        )


def status_from_proto(resp: pb.StatusResponse) -> Status:
    def as_dict(message: Any) -> dict[str, Any]:
        return MessageToDict(  # type: ignore[no-any-return]
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    counters = as_dict(resp.counters)
    counters = {
        k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in counters.items()
    }
    counters["errors"] = {k: int(v) for k, v in resp.counters.errors.items()}
    return Status(
        server_version=resp.server_version,
        instance_id=resp.instance_id,
        uptime_s=resp.uptime_s,
        pool={k: int(v) for k, v in as_dict(resp.pool).items()},
        active_encodes=resp.active_encodes,
        queued_encodes=resp.queued_encodes,
        max_concurrent_encodes=resp.max_concurrent_encodes,
        clients=resp.clients,
        counters=counters,
    )


def error_from_rpc(err: grpc.RpcError) -> SidecarError:
    """Translate a gRPC error into the client's exception tree."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    reason = ""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_KEY:
            reason = value if isinstance(value, str) else value.decode()
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    return error_for(name, details, reason)


def is_not_attached(err: SidecarError) -> bool:
    return err.reason == NOT_ATTACHED
