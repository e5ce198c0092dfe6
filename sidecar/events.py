"""What an encode reports while it runs: progress, and output chunks of a streamed file.

Both are made on the encoder thread and handed to the event loop through an `Emit`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

PROGRESS_INTERVAL = 0.25  # seconds between progress events


@dataclass(frozen=True)
class Progress:
    frames_done: int
    frames_total: int  # 0 while a stream is still arriving


@dataclass(frozen=True)
class Chunk:
    """A piece of the output file, in order, at most 1 MiB."""

    offset: int
    data: bytes


Emit = Callable[[Progress | Chunk], None]


class ProgressReporter:
    """Progress events, at most one per PROGRESS_INTERVAL."""

    def __init__(self, emit: Emit, total: int) -> None:
        self._emit = emit
        self._total = total
        self._last = time.monotonic()
        self.done = 0

    def add(self, frames: int) -> None:
        self.reach(self.done + frames)

    def reach(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL:
            self._emit(Progress(done, self._total))
            self._last = now


class ChunkWriter:
    """A write-only sink that hands each write back as a `Chunk` (fragmented MP4)."""

    def __init__(self, emit: Emit, chunk_size: int) -> None:
        self._emit = emit
        self._chunk_size = chunk_size
        self.offset = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for start in range(0, len(view), self._chunk_size):
            piece = bytes(view[start : start + self._chunk_size])
            self._emit(Chunk(self.offset, piece))
            self.offset += len(piece)
        return len(view)
