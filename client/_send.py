"""`encode` and `encode_leased` as steps: the video checked, its way chosen
(`_choice`), and sent that way (`_ways`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sidecar.api.v1 import sidecar_pb2 as pb

from ._audio import prepare_audio
from ._choice import SendFacts, choose_way
from ._core import ClientCore
from ._encode import (
    ChunkCallback,
    FramesLanding,
    Outgoing,
    ProgressCallback,
    RequestWay,
    SendJob,
    call_encode,
)
from ._errors import SidecarUnavailable, gone_mid_encode
from ._options import EncodeOptions, VideoFormat, VideoGeometry
from ._plan import fits_in_pool, plan_ranges
from ._results import Clock, ResultBuilder
from ._steps import Steps
from ._types import EncodeResult, FrameRange
from ._ways import REQUEST_WAYS, WAYS


def request_way(facts: SendFacts) -> RequestWay:
    """The way for a request whose frames are all leased (never a stream)."""
    return REQUEST_WAYS[choose_way(facts)]


def encode(
    core: ClientCore,
    video: Any,
    options: EncodeOptions,
    fmt: VideoFormat,
    audio: Any,
    sample_rate: int | None,
    on_progress: ProgressCallback | None,
    timeout: float | None,
    on_chunk: ChunkCallback | None = None,
) -> Steps[EncodeResult]:
    clock = Clock()
    source = core.prepare(video, fmt)
    pcm = prepare_audio(audio, sample_rate) if audio is not None else None
    att = yield from core.attach()
    plan = plan_ranges(source.frames, source.frame_bytes, att)
    facts = SendFacts(
        slabs_mapped=not core.inline,
        fits_in_pool=fits_in_pool(plan, source.frame_bytes, att),
        wants_events=on_progress is not None or on_chunk is not None,
        framed=core.framed_in_reach,
    )
    rechoose = functools.partial(request_way, facts)
    job = SendJob(source, options, fmt, pcm, clock, timeout, on_progress, on_chunk, rechoose)
    try:
        return (yield from WAYS[choose_way(facts)].encode(core, job))
    except SidecarUnavailable as err:
        raise gone_mid_encode(err) from None


def encode_leased(
    core: ClientCore,
    ranges: Sequence[FrameRange],
    frames: VideoGeometry,
    options: EncodeOptions,
    on_progress: ProgressCallback | None,
    timeout: float | None,
) -> Steps[EncodeResult]:
    clock = Clock()
    att = yield from core.attach()
    request = options.request(att.client_token, frames, ranges)
    return (yield from send_request(core, request, clock, ResultBuilder(on_progress), timeout))


def send_request(
    core: ClientCore,
    request: pb.EncodeRequest,
    clock: Clock,
    builder: ResultBuilder,
    timeout: float | None,
    *,
    landing: FramesLanding | None = None,
) -> Steps[EncodeResult]:
    """A request whose frames are already in leases, on the way chosen for it."""
    facts = SendFacts(
        slabs_mapped=True,
        fits_in_pool=True,
        wants_events=builder.wants_events,
        framed=core.framed_in_reach,
    )
    deadline = timeout or core.timeout
    rechoose = functools.partial(request_way, facts)
    out = Outgoing(request, builder, clock, deadline, landing, rechoose)
    try:
        return (yield from call_encode(core, out, rechoose()))
    except SidecarUnavailable as err:
        raise gone_mid_encode(err) from None
