"""`encode` and `encode_leased` as steps: plan, lease, copy, ask, clean up on failure."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import LANDED_COUNT_BYTES as COUNT_BYTES

from ._audio import Pcm, prepare_audio
from ._core import ClientCore, audio_in
from ._cuda import LANDING_MIN_BYTES
from ._errors import ServerError, error_from_session
from ._options import EncodeOptions, VideoFormat, VideoGeometry
from ._plan import copy_step, fits_in_pool, plan_ranges
from ._results import Clock, ResultBuilder
from ._steps import Call, Exchange, Replies, Steps, Work
from ._stream import StreamCore
from ._types import Attachment, EncodeResult, FrameRange, Lease
from ._video import VideoSource

# EncodeOnce for outputs that cannot outgrow its one reply (7 MiB): clips of at most this
# many bytes as 4:2:0 pictures, which even lossless H.264 of noise keeps well under it.
ONCE_MAX_BYTES = 4 * 1024 * 1024

ProgressCallback = Callable[[int, int], None]
ChunkCallback = Callable[[bytes], None]


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
    if core.inline or not fits_in_pool(plan, source.frame_bytes, att):
        # Larger than the pool lets one request hold, or no shared memory: stream it,
        # each lease freed as soon as its frames are encoded.
        stream = StreamCore(
            core,
            options,
            fmt,
            audio=pcm,
            on_chunk=on_chunk,
            on_progress=on_progress,
            timeout=timeout,
            clock=clock,
        )
        return (yield from stream.whole(source))
    # A fresh builder for each attempt: a retried request starts its replies anew.
    return (
        yield from core.reattached(
            lambda: _encode_source(
                core, source, options, pcm, clock, ResultBuilder(on_progress, on_chunk), timeout
            )
        )
    )


def _encode_source(
    core: ClientCore,
    source: VideoSource,
    options: EncodeOptions,
    pcm: Pcm | None,
    clock: Clock,
    builder: ResultBuilder,
    timeout: float | None,
) -> Steps[EncodeResult]:
    att = yield from core.attach()
    plan = plan_ranges(source.frames, source.frame_bytes, att)
    single = len(plan) == 1  # small requests reuse the spare lease and ask for the next
    landing = FramesLanding.for_video(core, source, plan, att, clock)
    sizes = [count * source.frame_bytes for _, count in plan]
    if landing is not None:
        sizes[-1] = landing.make_room(sizes[-1])
    audio_sizes = [pcm.nbytes] if pcm is not None else []
    leases: list[Lease] = []
    try:
        # Everything the request needs, granted at once: nothing is held while waiting.
        with clock.leasing():
            leases = yield from core.lease_for(
                audio_sizes + sizes, single and not audio_sizes, within=timeout or core.timeout
            )
        audio_data = audio_in(pcm, leases[0]) if pcm is not None else None
        ranges = []
        nbytes = sizes[-1]
        for (first, count), lease in zip(plan, leases[len(audio_sizes) :], strict=True):
            if landing is not None:
                landing.copy_later(lease.array, first, count)
            else:
                with clock.copying():
                    yield copy_step(source, lease.array, first, count)
            ranges.append(FrameRange(lease, count))
        request = options.request(
            att.client_token,
            VideoGeometry(source.width, source.height, source.pixel_format),
            ranges,
            next_lease_bytes=nbytes if single else 0,
            audio=pcm.spec() if pcm is not None else None,
            audio_data=audio_data,
        )
        if landing is not None:  # sent now; its copies are queued and counted after
            request.landed_count_offset = landing.count_in(leases[-1])
        else:
            with clock.copying():
                yield Work(source.finish, long=True)
            clock.transferred()
        small = options.path is not None or source.frames * picture_bytes(source) <= ONCE_MAX_BYTES
        return (
            yield from _call_encode(
                core, request, clock, builder, timeout, small=small, landing=landing
            )
        )
    except GeneratorExit:
        raise
    except BaseException:
        # The daemon frees leases it took; ones it refused go back now, once no copy
        # queued into them can still land (even if cancelled again while waiting).
        try:
            with contextlib.suppress(Exception):
                yield Work(source.finish, long=True)
        finally:
            yield from core.give_back(leases)
        raise


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
    return (yield from _call_encode(core, request, clock, ResultBuilder(on_progress), timeout))


def _call_encode(
    core: ClientCore,
    request: pb.EncodeRequest,
    clock: Clock,
    builder: ResultBuilder,
    timeout: float | None,
    *,
    small: bool = False,
    landing: FramesLanding | None = None,
) -> Steps[EncodeResult]:
    """Ask for the encode and take the replies. A caller that wants no progress and no
    chunks gets the result as one reply: on a kept connection to the daemon's framed
    socket, whatever the video's length (its replies have no size limit to keep under);
    else, when `small` (the output is a file or cannot come near a gRPC reply's 7 MiB),
    on a kept EncodeSession call (no deadline), else as an EncodeOnce call; else on an
    Encode stream. A stream costs a round of messages more than EncodeOnce (a sixth of a
    small clip's time outside the daemon, when it was measured), EncodeOnce a new call
    more than a kept session, and a kept session gRPC's threads and HTTP/2 more than the
    framed socket. A request whose frames still land (`landing`) has them counted between
    sending it and reading the reply on the framed socket; any other way waits for them
    first."""
    asked_at = time.monotonic()
    try:
        yield from _ask(core, request, builder, timeout, small, landing)
    except GeneratorExit:
        raise
    except BaseException:
        # A reply that came (a callback of the caller's raised on it, the deadline fell
        # after it) may have handed us the output's lease or the next request's: give
        # them back, or they stay held until the TTL.
        handed = {lease.lease_id for lease in (builder.data_lease, builder.next_lease) if lease}
        yield from core.give_back(sorted(handed - {""}))
        raise
    clock.stop()
    yield from core.keep_spare(builder.next_lease, asked_at)
    return builder.result(clock)


def _ask(
    core: ClientCore,
    request: pb.EncodeRequest,
    builder: ResultBuilder,
    timeout: float | None,
    small: bool,
    landing: FramesLanding | None,
) -> Steps[None]:
    """Send the request and take every reply into `builder`, the output included."""
    deadline = timeout or core.timeout
    while not builder.wants_events and not builder.has_result:
        way = core.one_reply_way(deadline)
        if way != "Framed" and not small:
            break
        try:
            if landing is not None and way != "Framed":
                yield Work(landing, long=True)
            if way in ("Framed", "EncodeSession"):
                framed = core.framed if way == "Framed" else ""
                reply: pb.SessionReply = yield Exchange(request, framed, deadline, landing)
                if reply.HasField("error"):
                    raise error_from_session(reply.error)
                builder.take_result(reply.result)
            elif way == "EncodeOnce":
                builder.take_result((yield Call("EncodeOnce", request, deadline)))
            else:
                break
        except ServerError as err:
            if err.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            core.unimplemented(way, str(err))  # an older daemon: it never saw the request
    if not builder.has_result:
        if landing is not None:
            yield Work(landing, long=True)
        yield Replies(request, deadline, builder.feed)
    if builder.data_lease is not None:  # the output came back through shared memory
        lease = core.leased(builder.data_lease)
        builder.take_from_lease(lease.array)
        if not builder.data_in_next_lease:  # else it is the spare, kept by the caller
            yield from core.give_back([lease])
            builder.data_lease = None


class FramesLanding:
    """A request sent while its frames still land from the GPU (see `sidecar.codec.landing`):
    the daemon's work before the first frame, and the encode of the first frames, overlap
    the copy. The count of landed frames lies after the last lease's frames. The request
    goes as soon as its leases are granted; calling this then queues the copies (the
    daemon checks the request and readies its encoder meanwhile: queueing 1344x768x122
    took the client 1.4 ms), waits for each batch and raises the count, once."""

    def __init__(self, source: VideoSource, clock: Clock) -> None:
        self._source = source
        self._clock = clock
        self._offset = 0
        self._count: Any = None
        self._copies: list[tuple[Any, int, int]] = []
        self._done = False

    @classmethod
    def for_video(
        cls,
        core: ClientCore,
        source: VideoSource,
        plan: list[tuple[int, int]],
        att: Attachment,
        clock: Clock,
    ) -> FramesLanding | None:
        """One for a video whose copy is worth overlapping, on a daemon that takes it."""
        if not core.framed or not source.lands_later:
            return None  # only the framed socket overlaps; only a GPU copies behind us
        if source.frames * source.frame_bytes < LANDING_MIN_BYTES:
            return None
        last = plan[-1][1] * source.frame_bytes
        if _aligned(last) + COUNT_BYTES > att.max_lease_bytes:
            return None  # no room for the count in the last lease
        return cls(source, clock)

    def make_room(self, frames_bytes: int) -> int:
        """The last lease's size: its frames, then the count."""
        self._offset = _aligned(frames_bytes)
        return self._offset + COUNT_BYTES

    def count_in(self, lease: Lease) -> int:
        """Set the count to 0 in `lease` (before the request goes); its offset there."""
        self._count = lease.array[self._offset : self._offset + COUNT_BYTES].view("<u4")
        self._count[0] = 0
        return self._offset

    def copy_later(self, region: Any, first: int, count: int) -> None:
        """Frames [first, first+count) into `region`, queued when this is called."""
        self._copies.append((region, first, count))

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        with self._clock.copying():
            for region, first, count in self._copies:
                self._source.copy_into(region, first, count)
            self._source.land(self._landed)
        self._clock.transferred()

    def _landed(self, frames: int) -> None:
        self._count[0] = frames


def _aligned(nbytes: int) -> int:
    return (nbytes + COUNT_BYTES - 1) // COUNT_BYTES * COUNT_BYTES


def picture_bytes(source: VideoSource) -> int:
    """One frame as the encoder's 4:2:0 picture: what bounds the size of its output."""
    return source.width * source.height * 3 // 2
