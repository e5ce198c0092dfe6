"""The ordered pieces of one encode, handed from the event loop to the encoder thread.

An encode's frames arrive as ranges in leases (shared memory) or as inline frames (bytes
sent over gRPC by a client without shared memory), then an end marker, optionally with
the audio samples. A whole-video Encode puts everything at once; a stream puts chunks as
they arrive and the encoder consumes them as they come.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...codec.frames import PlacedRange
from ...pool.leases import Lease, LeaseTable

POLL_S = 0.1  # how often a waiting encoder looks at its cancel flag
INLINE_BUDGET = 64 * 1024 * 1024  # inline frames queued for one encode, at most


@dataclass(frozen=True)
class InlineFrames:
    """Frames that came inline, already shaped (k, *frame_shape); owned, no lease."""

    frames: np.ndarray

    @property
    def frame_count(self) -> int:
        return len(self.frames)


@dataclass(frozen=True)
class End:
    audio: np.ndarray | None = None  # (samples, channels) float32, if sent at the end


Piece = PlacedRange | InlineFrames


@dataclass
class FrameFeed:
    """A queue of pieces that also knows which leases it holds, to free them exactly once."""

    leases: LeaseTable
    _queue: queue.Queue[Piece | End] = field(default_factory=queue.Queue)
    _pending: Counter[str] = field(default_factory=Counter)
    _owned: dict[str, Lease] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _room: threading.Condition = field(default_factory=threading.Condition)
    _inline_bytes: int = 0
    abandoned: bool = False

    def put(self, piece: Piece) -> None:
        if isinstance(piece, PlacedRange):
            with self._lock:
                late = self.abandoned
                if not late:
                    self._pending[piece.lease.id] += 1
                    self._owned[piece.lease.id] = piece.lease
            if late:  # the encode is over: nobody else would ever free it
                self.leases.free([piece.lease])
                return
        self._queue.put(piece)

    def hold(self, leases: list[Lease]) -> None:
        """Own leases that carry no frames (audio already copied out of them): freed with
        the rest when the encode ends, or given back with the rest if it is refused."""
        with self._lock:
            late = list(leases) if self.abandoned else []
            if not late:
                for lease in leases:
                    if lease.id not in self._pending:
                        self._owned[lease.id] = lease
        self.leases.free(late)

    def end(self, audio: np.ndarray | None = None) -> None:
        self._queue.put(End(audio))

    def get(self, cancel: threading.Event) -> Piece | End | None:
        """The next piece; None once `cancel` is set."""
        while not cancel.is_set():
            try:
                return self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
        return None

    def poll(self) -> Piece | End | None:
        """The next piece if one is queued; None at once if not."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def in_leases(self) -> list[PlacedRange] | None:
        """The pieces of a whole video if every one is queued, in leases, with no audio
        at the end; else None. Takes nothing off the queue."""
        with self._queue.mutex:
            items = list(self._queue.queue)
        if not items or not isinstance(items[-1], End) or items[-1].audio is not None:
            return None
        pieces = items[:-1]
        if not all(isinstance(piece, PlacedRange) for piece in pieces):
            return None
        return pieces  # type: ignore[return-value]

    def first(self) -> Piece | None:
        """The first piece queued, if any, left on the queue."""
        with self._queue.mutex:
            head = self._queue.queue[0] if self._queue.queue else None
        return None if head is None or isinstance(head, End) else head

    def drain(self) -> tuple[list[Piece], End]:
        """Every piece of a whole video, queued at once, and its end (no waiting)."""
        pieces: list[Piece] = []
        while True:
            item = self._queue.get_nowait()
            if isinstance(item, End):
                return pieces, item
            pieces.append(item)

    async def wait_for_room(self, nbytes: int) -> None:
        """Admit `nbytes` of inline frames, waiting while too many are queued: the
        backpressure that reaches a remote client through gRPC flow control."""
        with self._room:
            if self._inline_bytes == 0 or self._inline_bytes + nbytes <= INLINE_BUDGET:
                self._inline_bytes += nbytes
                return
        await asyncio.to_thread(self._wait_for_room, nbytes)

    def _wait_for_room(self, nbytes: int) -> None:
        with self._room:
            while (
                self._inline_bytes
                and self._inline_bytes + nbytes > INLINE_BUDGET
                and not self.abandoned
            ):
                self._room.wait(POLL_S)
            self._inline_bytes += nbytes

    def consumed(self, piece: Piece) -> None:
        """Every frame of `piece` is inside the encoder: free its lease if nothing else
        still points into it, so a waiting client can copy its next chunk."""
        if isinstance(piece, InlineFrames):
            with self._room:
                self._inline_bytes -= piece.frames.nbytes
                self._room.notify_all()
            return
        with self._lock:
            self._pending[piece.lease.id] -= 1
            done = self._pending[piece.lease.id] == 0
            if done:
                del self._pending[piece.lease.id]
                del self._owned[piece.lease.id]
        if done:
            self.leases.free([piece.lease])

    def release_all(self) -> None:
        """Free every lease still held (after a failure or a cancel)."""
        with self._lock:
            self.abandoned = True  # what is put from now on is freed at once
            leases = list(self._owned.values())
            self._owned.clear()
            self._pending.clear()
        with self._room:
            self._room.notify_all()
        self.leases.free(leases)

    def give_back_all(self) -> None:
        """Return every lease to its client (the encode refused before reading a frame)."""
        with self._lock:
            leases = list(self._owned.values())
            self._owned.clear()
            self._pending.clear()
        self.leases.untake(leases)


class InlineAssembler:
    """Cuts a stream of inline bytes into whole frames."""

    def __init__(self, frame_shape: tuple[int, ...]) -> None:
        self.frame_shape = frame_shape
        self.frame_bytes = int(np.prod(frame_shape))
        self._buffer = bytearray()

    def add(self, data: bytes) -> InlineFrames | None:
        self._buffer += data
        whole = len(self._buffer) // self.frame_bytes
        if not whole:
            return None
        cut = whole * self.frame_bytes
        frames = np.frombuffer(self._buffer[:cut], dtype=np.uint8)  # the slice is the one copy
        del self._buffer[:cut]
        return InlineFrames(frames.reshape(whole, *self.frame_shape))

    @property
    def leftover(self) -> int:
        return len(self._buffer)
