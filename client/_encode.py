"""An encode's job, the interface of the ways it can go (see `_choice`), and what the
ways that send one EncodeRequest share: leasing, copying, asking (Encode when the framed
socket is out of reach), taking the output, cleaning up on failure. The ways are in
`_ways`.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import LANDED_COUNT_BYTES as COUNT_BYTES

from ._audio import Pcm
from ._choice import WayName
from ._core import ClientCore, audio_in
from ._cuda_video import LANDING_MIN_BYTES
from ._errors import ServerError
from ._options import EncodeOptions, VideoFormat, VideoGeometry
from ._plan import copy_step, plan_ranges
from ._results import Clock, ResultBuilder
from ._steps import Steps, Work
from ._types import Attachment, EncodeResult, FrameRange, Lease
from ._video import VideoSource

ProgressCallback = Callable[[int, int], None]
ChunkCallback = Callable[[bytes], None]


@dataclass(frozen=True)
class SendJob:
    """One `encode()`: the checked video and what to do with it."""

    source: VideoSource
    options: EncodeOptions
    fmt: VideoFormat
    pcm: Pcm | None
    clock: Clock
    timeout: float | None
    on_progress: ProgressCallback | None
    on_chunk: ChunkCallback | None
    # The way to ask when the framed socket is lost, or after re-attaching: chosen anew.
    rechoose: Callable[[], RequestWay]


@dataclass(frozen=True)
class Outgoing:
    """One EncodeRequest on its way: the frames are in its leases (or still landing)."""

    request: pb.EncodeRequest
    builder: ResultBuilder
    clock: Clock
    deadline: float | None
    landing: FramesLanding | None
    rechoose: Callable[[], RequestWay]

    def landed_first(self) -> Steps[None]:
        """Wait for frames still landing: only the framed socket counts them as they do."""
        if self.landing is not None:
            yield Work(self.landing, long=True)


class SendWay(abc.ABC):
    """One way an encode goes to the daemon (see `_choice`); `_ways` has the five."""

    name: ClassVar[WayName]

    @abc.abstractmethod
    def encode(self, core: ClientCore, job: SendJob) -> Steps[EncodeResult]:
        """Send the job's video this way and take the replies; the result."""


class RequestWay(SendWay):
    """A way that sends the video as one EncodeRequest, its frames leased all at once."""

    def encode(self, core: ClientCore, job: SendJob) -> Steps[EncodeResult]:
        # The way was chosen before leasing; after re-attaching (the daemon restarted) the
        # new attachment may serve other ways: chosen anew.
        ways: list[RequestWay] = [self]
        return (
            yield from core.reattached(
                lambda: send_source(core, job, ways.pop() if ways else job.rechoose()),
                within=job.timeout or core.timeout,
            )
        )

    @abc.abstractmethod
    def ask(self, core: ClientCore, out: Outgoing) -> Steps[None]:
        """Send `out.request` and take its reply, or replies, into `out.builder`."""


def send_source(core: ClientCore, job: SendJob, way: RequestWay) -> Steps[EncodeResult]:
    """Lease what the video needs at once, copy its frames in (or queue the copies, when
    they land while the request goes), and ask `way`."""
    att = yield from core.attach()
    source = job.source
    plan = plan_ranges(source.frames, source.frame_bytes, att)
    single = len(plan) == 1  # small requests reuse the spare lease and ask for the next
    landing = FramesLanding.for_video(core, source, plan, att, job.clock)
    sizes = [count * source.frame_bytes for _, count in plan]
    if landing is not None:
        sizes[-1] = landing.make_room(sizes[-1])
    audio_sizes = [job.pcm.nbytes] if job.pcm is not None else []
    leases: list[Lease] = []
    try:
        # Everything the request needs, granted at once: nothing is held while waiting.
        with job.clock.leasing():
            leases = yield from core.lease_for(
                audio_sizes + sizes, single and not audio_sizes, within=job.timeout or core.timeout
            )
        next_bytes = sizes[-1] if single else 0
        request = yield from _filled(job, att, plan, leases, landing, next_bytes)
        builder = ResultBuilder(job.on_progress, job.on_chunk)  # anew for each attempt
        deadline = job.timeout or core.timeout
        out = Outgoing(request, builder, job.clock, deadline, landing, job.rechoose)
        return (yield from call_encode(core, out, way))
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


def _filled(
    job: SendJob,
    att: Attachment,
    plan: list[tuple[int, int]],
    leases: list[Lease],
    landing: FramesLanding | None,
    next_lease_bytes: int,
) -> Steps[pb.EncodeRequest]:
    """The request for the frames copied into `leases` (the audio track's first)."""
    source, pcm, clock = job.source, job.pcm, job.clock
    audio_data = audio_in(pcm, leases[0]) if pcm is not None else None
    ranges = []
    for (first, count), lease in zip(plan, leases[len(leases) - len(plan) :], strict=True):
        if landing is not None:
            landing.copy_later(lease.array, first, count)
        else:
            with clock.copying():
                yield copy_step(source, lease.array, first, count)
        ranges.append(FrameRange(lease, count))
    request = job.options.request(
        att.client_token,
        VideoGeometry(source.width, source.height, source.pixel_format),
        ranges,
        next_lease_bytes=next_lease_bytes,
        audio=pcm.spec() if pcm is not None else None,
        audio_data=audio_data,
    )
    if landing is not None:  # sent now; its copies are queued and counted after
        request.landed_count_offset = landing.count_in(leases[-1])
    else:
        with clock.copying():
            yield Work(source.finish, long=True)
        clock.transferred()
    return request


def call_encode(core: ClientCore, out: Outgoing, way: RequestWay) -> Steps[EncodeResult]:
    """Ask for the encode on `way` and take the replies; the result. A request whose
    frames still land (`out.landing`) has them counted between sending it and reading
    the reply on the framed socket; Encode waits for them first."""
    asked_at = time.monotonic()
    builder = out.builder
    try:
        yield from _ask(core, out, way)
        yield from _output_from_lease(core, builder)
    except GeneratorExit:
        raise
    except BaseException:
        # A reply that came (a callback of the caller's raised on it, the deadline fell
        # after it) may have handed us the output's lease or the next request's: give
        # them back, or they stay held until the TTL.
        handed = {lease.lease_id for lease in (builder.data_lease, builder.next_lease) if lease}
        yield from core.give_back(sorted(handed - {""}))
        raise
    out.clock.stop()
    yield from core.keep_spare(builder.next_lease, asked_at)
    return builder.result(out.clock)


def _ask(core: ClientCore, out: Outgoing, way: RequestWay) -> Steps[None]:
    """Ask `way`. The framed socket out of reach (it could not be connected to, so it
    never saw the request), or lost since it was chosen: Encode, chosen anew, which
    every daemon serves; the framed socket is tried again after the next Attach."""
    if way.name is WayName.FRAMED and core.framed:
        try:
            return (yield from way.ask(core, out))
        except ServerError as err:
            if err.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            core.framed_lost(str(err))
    if way.name is WayName.FRAMED:
        way = out.rechoose()
    yield from way.ask(core, out)


def _output_from_lease(core: ClientCore, builder: ResultBuilder) -> Steps[None]:
    """The output, when it came back through shared memory: copied out, the lease given
    back (unless it is the spare, kept for the next request)."""
    if builder.data_lease is None:
        return
    lease = core.leased(builder.data_lease)
    builder.take_from_lease(lease.array)
    if not builder.output_in_next_lease:
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
