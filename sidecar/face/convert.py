"""Protobuf to domain objects and back: the only module that knows both.

Enum values are translated through `vocabulary`; a value the daemon does not know
becomes a name that the domain checks refuse (`unknown pixel format 'enum value 9'`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from .. import __version__
from ..api.v1 import sidecar_pb2 as pb
from ..codec.audio import AudioFormat
from ..codec.catalogue import CodecSpec
from ..codec.codec_rules import MAX_OPTIONS
from ..codec.frames import FrameRangeSpec
from ..errors import InvalidRequest
from ..events import Chunk, Progress
from ..pipeline.admission.requests import (
    AudioPiece,
    AudioRangeSpec,
    AudioRequest,
    EncodeSpec,
    InlineChunk,
    LeaseChunk,
    LiveRequest,
    OneReply,
    OutputRequest,
    PreviewImage,
    PreviewRequest,
    Result,
    SpriteSheetRequest,
    StreamEnd,
    StreamMessage,
    ThumbnailRequest,
    VideoRequest,
)
from ..pipeline.status import RELEASE_ALREADY_FREED, Attachment, StatusReport
from ..pool.lease_queue import MAX_REGIONS
from ..pool.leases import Lease
from ..vocabulary import (
    CONTAINER_BY_PROTO,
    FRAME_PICK_BY_PROTO,
    IMAGE_FORMAT_BY_PROTO,
    PIXEL_FORMAT_BY_PROTO,
    SAMPLE_FORMAT_BY_PROTO,
)
from .decoding import Undecodable

MAX_RANGES = 65_536
MAX_AUDIO_PIECES = 4096


# Repeated fields by full name: at most this many, counted in the wire format before a
# large request is decoded (`decoding.over_limits`), and again once it is.
REPEATED_LIMITS = {
    "video_sidecar.v1.VideoDescriptor.ranges": MAX_RANGES,
    "video_sidecar.v1.EncodeRequest.audio_data": MAX_AUDIO_PIECES,
    "video_sidecar.v1.StreamHeader.audio_data": MAX_AUDIO_PIECES,
    "video_sidecar.v1.StreamEnd.audio_data": MAX_AUDIO_PIECES,
    "video_sidecar.v1.CodecOptions.extra": MAX_OPTIONS,
    "video_sidecar.v1.LeaseRequest.more_sizes": MAX_REGIONS - 1,
}


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


def lease_to_proto(lease: Lease) -> pb.LeaseResponse:
    return pb.LeaseResponse(
        lease_id=lease.id,
        slab_id=lease.slab_id,
        offset=lease.offset,
        size=lease.size,
        ttl_ms=int(lease.ttl * 1e3),
    )


def leases_to_proto(leases: list[Lease]) -> pb.LeaseResponse:
    """A Lease call's answer: the first region, then the others in `more`."""
    reply = lease_to_proto(leases[0])
    reply.more.extend(lease_to_proto(lease) for lease in leases[1:])
    return reply


def video_from_proto(
    width: int, height: int, pixel_format: int, fps: pb.Rational, ranges: Any = ()
) -> VideoRequest:
    if len(ranges) > MAX_RANGES:
        raise InvalidRequest("video.ranges", f"at most {MAX_RANGES} ranges per request")
    return VideoRequest(
        width=width,
        height=height,
        pixel_format=_name(PIXEL_FORMAT_BY_PROTO.get(pixel_format), pixel_format),
        fps=(fps.num, fps.den),
        ranges=tuple(range_from_proto(r) for r in ranges),
    )


def range_from_proto(r: pb.FrameRange) -> FrameRangeSpec:
    return FrameRangeSpec(r.lease_id, r.offset, r.frame_count, r.row_stride, r.frame_stride)


def codec_from_proto(c: pb.CodecOptions) -> CodecSpec:
    if len(c.extra) > MAX_OPTIONS:  # counted before anything is built from them
        raise InvalidRequest("codec.extra", f"at most {MAX_OPTIONS} options")
    return CodecSpec(
        codec=c.codec,
        crf=c.crf if c.HasField("crf") else None,
        preset=c.preset,
        gop=c.gop if c.HasField("gop") else None,
        threads=c.threads,
        extra=tuple(sorted(c.extra.items())),
        bitrate=c.bitrate if c.HasField("bitrate") else None,
        profile=c.profile,
    )


def _name(known: Any, value: int) -> str:
    """The wire name of a known enum value, else a name no domain check accepts."""
    if known is None:
        return f"enum value {value}"
    return known if isinstance(known, str) else str(known.name)


def output_from_proto(o: pb.OutputSpec, present: bool) -> OutputRequest:
    which = o.WhichOneof("target") if present else None
    container = CONTAINER_BY_PROTO.get(o.container)
    if container is None:
        raise InvalidRequest("output.container", f"unknown container enum value {o.container}")
    return OutputRequest(
        path=o.file.path if which == "file" else None,
        overwrite=which == "file" and o.file.overwrite,
        container=container,
    )


def audio_from_proto(present: bool, a: pb.AudioSpec, data: Any) -> AudioRequest:
    fmt = None
    if present:
        sample_format = _name(SAMPLE_FORMAT_BY_PROTO.get(a.sample_format), a.sample_format)
        fmt = AudioFormat(a.sample_rate, a.channels, sample_format)
    return AudioRequest(fmt, audio_pieces_from_proto(data))


def audio_pieces_from_proto(data: Any) -> tuple[AudioPiece, ...]:
    if len(data) > MAX_AUDIO_PIECES:
        raise InvalidRequest("audio_data", f"at most {MAX_AUDIO_PIECES} pieces")
    pieces: list[AudioPiece] = []
    for d in data:
        if d.WhichOneof("source") == "range":
            pieces.append(AudioRangeSpec(d.range.lease_id, d.range.offset, d.range.size))
        else:
            pieces.append(bytes(d.inline))
    return tuple(pieces)


def live_from_proto(p: pb.LivePackage, present: bool) -> LiveRequest | None:
    if not present:
        return None
    return LiveRequest(p.folder, p.segment_s, p.part_s, p.overwrite)


def previews_from_proto(p: pb.Previews, present: bool) -> PreviewRequest:
    if not present:
        return PreviewRequest()
    thumbnail = sheet = None
    if p.HasField("thumbnail"):
        t = p.thumbnail
        at = t.WhichOneof("at")
        thumbnail = ThumbnailRequest(
            pick=_name(FRAME_PICK_BY_PROTO.get(t.pick), t.pick) if at == "pick" else "",
            index=t.index if at == "index" else None,
            time_s=t.time_s if at == "time_s" else None,
            max_width=t.max_width,
            max_height=t.max_height,
            format=_name(IMAGE_FORMAT_BY_PROTO.get(t.format), t.format),
            quality=t.quality,
        )
    if p.HasField("sprite_sheet"):
        s = p.sprite_sheet
        sheet = SpriteSheetRequest(
            tiles=s.tiles,
            interval_s=s.interval_s,
            tile_width=s.tile_width,
            columns=s.columns,
            format=_name(IMAGE_FORMAT_BY_PROTO.get(s.format), s.format),
            quality=s.quality,
        )
    return PreviewRequest(thumbnail, sheet)


def preview_to_proto(image: PreviewImage) -> pb.Preview:
    sent = not image.path and image.lease_offset is None  # inside the result
    return pb.Preview(
        kind=image.kind,
        mime_type=image.mime_type,
        size_bytes=image.size_bytes,
        width=image.width,
        height=image.height,
        data=image.data if sent else b"",
        path=image.path,
        in_lease=image.lease_offset is not None,
        lease_offset=image.lease_offset or 0,
        tile_width=image.tile_width,
        tile_height=image.tile_height,
        columns=image.columns,
        rows=image.rows,
        frames=image.frames,
        times_s=image.times_s,
    )


def encode_spec_from_proto(
    request: pb.EncodeRequest, request_id: str, *, one_reply: OneReply | None = None
) -> EncodeSpec:
    v = request.video
    return EncodeSpec(
        client_token=request.client_token,
        request_id=request_id,
        video=video_from_proto(v.width, v.height, v.pixel_format, v.fps, v.ranges),
        codec=codec_from_proto(request.codec),
        next_lease_bytes=request.next_lease_bytes,
        one_reply=one_reply,
        landed_count_offset=request.landed_count_offset,
        output=output_from_proto(request.output, request.HasField("output")),
        audio=audio_from_proto(request.HasField("audio"), request.audio, request.audio_data),
        previews=previews_from_proto(request.previews, request.HasField("previews")),
        live=live_from_proto(request.live, request.HasField("live")),
    )


def stream_spec_from_proto(h: pb.StreamHeader, request_id: str) -> EncodeSpec:
    return EncodeSpec(
        client_token=h.client_token,
        request_id=request_id,
        video=video_from_proto(h.width, h.height, h.pixel_format, h.fps),
        codec=codec_from_proto(h.codec),
        output=output_from_proto(h.output, h.HasField("output")),
        audio=audio_from_proto(h.HasField("audio"), h.audio, h.audio_data),
        previews=previews_from_proto(h.previews, h.HasField("previews")),
        live=live_from_proto(h.live, h.HasField("live")),
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


def event_to_proto(event: Progress | Chunk | Result) -> pb.EncodeEvent:
    if isinstance(event, Progress):
        return pb.EncodeEvent(
            progress=pb.Progress(frames_done=event.frames_done, frames_total=event.frames_total)
        )
    if isinstance(event, Chunk):
        return pb.EncodeEvent(chunk=pb.OutputChunk(offset=event.offset, data=event.data))
    return pb.EncodeEvent(result=result_to_proto(event))


def result_to_proto(event: Result) -> pb.EncodeResult:
    return pb.EncodeResult(
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
        next_lease=lease_to_proto(event.next_lease) if event.next_lease else None,
        data=event.data,
        data_lease=lease_to_proto(event.data_lease) if event.data_lease else None,
        previews=[preview_to_proto(image) for image in event.previews],
    )


def status_to_proto(s: StatusReport, errors_by_code: dict[str, int]) -> pb.StatusResponse:
    return pb.StatusResponse(
        server_version=s.version,
        instance_id=s.instance_id,
        uptime_s=s.uptime_s,
        pool=pb.PoolStatus(**dataclasses.asdict(s.pool)),  # the same fields, by name
        active_encodes=s.active_encodes,
        queued_encodes=s.queued_encodes,
        max_concurrent_encodes=s.max_concurrent_encodes,
        encoder_processes=s.encoder_processes,
        live_clients=s.live_clients,
        clients_attached=s.clients_attached,
        output_dir=s.output_dir,
        shm_dir=s.shm_dir,
        shm_prefix=s.shm_prefix,
        counters=pb.Counters(
            requests=s.stats.requests,
            encodes_ok=s.stats.encodes_ok,
            encodes_failed=s.stats.encodes_failed,
            frames_encoded=s.stats.frames_encoded,
            bytes_out=s.stats.bytes_out,
            leases_granted=s.leases_granted,
            leases_expired=s.leases_expired,
            errors=errors_by_code,
            warm_hits=s.warm_hits,
            warm_misses=s.warm_misses,
            process_encodes=s.process_encodes,
            lease_waits=s.lease_queue.waits,
            lease_wait_s=s.lease_queue.wait_s,
            lease_refusals=dict(s.lease_queue.refusals),
            encodes_cancelled=s.stats.encodes_cancelled,
            releases_already_freed=s.stats.routine[RELEASE_ALREADY_FREED],
            spares_expired=s.spares_expired,
        ),
        lease_waiters=[
            pb.LeaseWaiter(client=w.client, bytes=w.nbytes, regions=w.regions, waited_s=w.waited_s)
            for w in s.lease_waiters
        ],
    )
