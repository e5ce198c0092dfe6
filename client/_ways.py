"""The three ways an encode goes to the daemon, behind one interface (`SendWay`); which
one, `_choice.choose_way` says.

Two send the video as one EncodeRequest, its frames already in leases (`RequestWay` does
the leasing), and differ only in how they ask; the third streams the frames.
"""

from __future__ import annotations

from sidecar.api.v1 import sidecar_pb2 as pb

from ._choice import WayName
from ._core import ClientCore
from ._encode import Outgoing, RequestWay, SendJob, SendWay
from ._errors import error_from_reply
from ._steps import Exchange, Replies, Steps
from ._stream import StreamCore
from ._types import EncodeResult


def _take_reply(out: Outgoing, reply: pb.FramedReply) -> None:
    if reply.HasField("error"):
        raise error_from_reply(reply.error)
    out.builder.take_result(reply.result)


class FramedWay(RequestWay):
    """A kept connection to the daemon's framed socket: one reply, whatever its size.
    Frames still landing are counted between sending the request and reading its reply."""

    name = WayName.FRAMED

    def ask(self, core: ClientCore, out: Outgoing) -> Steps[None]:
        reply = yield Exchange(
            out.request, core.framed, out.deadline, core.framed_reply_max, out.landing
        )
        _take_reply(out, reply)


class RepliesWay(RequestWay):
    """The server-streaming Encode call: progress, chunks, then the result."""

    name = WayName.REPLIES

    def ask(self, core: ClientCore, out: Outgoing) -> Steps[None]:
        yield from out.landed_first()
        yield Replies(out.request, out.deadline, out.builder.feed)


class StreamWay(SendWay):
    """The frames as an EncodeStream, each lease freed once its frames are encoded: for a
    video larger than the pool lets one request hold, or frames sent inline."""

    name = WayName.STREAM

    def encode(self, core: ClientCore, job: SendJob) -> Steps[EncodeResult]:
        stream = StreamCore(
            core,
            job.options,
            job.fmt,
            audio=job.pcm,
            on_chunk=job.on_chunk,
            on_progress=job.on_progress,
            timeout=job.timeout,
            clock=job.clock,
        )
        return (yield from stream.whole(job.source))


REQUEST_WAYS: dict[WayName, RequestWay] = {way.name: way for way in (FramedWay(), RepliesWay())}
WAYS: dict[WayName, SendWay] = {**REQUEST_WAYS, WayName.STREAM: StreamWay()}
