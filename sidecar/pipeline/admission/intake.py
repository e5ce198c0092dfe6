"""Stream intake: the chunks of an EncodeStream, checked one by one and queued for its job.

Each chunk is accepted on its own: a range is checked against its lease and the lease
taken before the next message is read; inline bytes are cut into whole frames and
admitted under the stream's inline budget (backpressure through gRPC flow control).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ...codec.frames import Limits, place_range
from ...errors import InvalidRequest, OutOfRange
from ..encoding.feed import InlineAssembler, Piece
from .planner import Accepted, Planner
from .requests import LeaseChunk, StreamEnd, StreamMessage


class StreamIntake:
    def __init__(self, planner: Planner, accepted: Accepted, limits: Limits) -> None:
        self._planner = planner
        self._accepted = accepted
        self._limits = limits
        geometry = accepted.plan.geometry
        self._frame_bytes = geometry.layout.frame_bytes(geometry.width, geometry.height)
        self._assembler = InlineAssembler(
            geometry.layout.frame_shape(geometry.width, geometry.height)
        )
        self._frames = 0

    async def read(self, messages: AsyncIterator[StreamMessage]) -> int:
        """Queue every chunk until the end message; returns the end's `next_lease_bytes`."""
        index = 0
        async for message in messages:
            self._planner.leases.renew(self._accepted.spec.client_token)  # a live client
            if isinstance(message, StreamEnd):
                self._finish(message)
                return message.next_lease_bytes
            if isinstance(message, LeaseChunk):
                self._check_count(message.range.frame_count)  # before its lease is taken
                piece: Piece | None = self._take_range(message, index)
            else:
                piece = await self._take_inline(message.data)
            if piece is not None:
                self._queue(piece)
                index += 1
        raise InvalidRequest("end", "the stream ended without an end message")

    def _take_range(self, message: LeaseChunk, index: int) -> Piece:
        token = self._accepted.spec.client_token
        leases = self._planner.leases
        lease = leases.lookup(token, message.range.lease_id)
        placed = place_range(self._accepted.plan.geometry, message.range, lease, f"chunks[{index}]")
        leases.take(token, [lease.id])
        return placed

    async def _take_inline(self, data: bytes) -> Piece | None:
        inline = self._assembler.add(data)
        if inline is not None:
            await self._accepted.feed.wait_for_room(len(inline.frames) * self._frame_bytes)
        return inline

    def _check_count(self, more: int) -> None:
        if self._frames + max(0, more) > self._limits.max_frames:
            raise OutOfRange(f"more than {self._limits.max_frames} frames in one stream")

    def _queue(self, piece: Piece) -> None:
        self._check_count(piece.frame_count)  # inline frames: their lease is the stream's
        self._accepted.feed.put(piece)  # owned by the feed from here, whatever happens next
        self._frames += piece.frame_count

    def _finish(self, end: StreamEnd) -> None:
        if self._assembler.leftover:
            raise InvalidRequest(
                "chunk.inline", f"{self._assembler.leftover} bytes left over: not a whole frame"
            )
        token, plan, feed = (
            self._accepted.spec.client_token,
            self._accepted.plan,
            self._accepted.feed,
        )
        feed.end(self._planner.accept_audio(token, plan.audio, end.audio_data, feed))
