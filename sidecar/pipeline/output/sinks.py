"""Where an encode's output goes while it is made, chosen once per job (`sink_for`): its
file (a hidden temporary, moved into place once complete: see files), memory (a memfd,
sent back once the encode ends: see handback), or chunks sent back as it is made
(fragmented MP4 to bytes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from ...events import ChunkWriter, Emit
from ..admission.plans import EncodePlan
from .files import FileTarget


@dataclass(frozen=True)
class Made:
    """A finished output: its file's path ("" for bytes), its size, and its bytes still to
    send: in `memfd`, or in `data` when they came in memory already."""

    path: str
    size: int
    memfd: int | None = None
    data: bytes | None = None


class Sink(Protocol):
    def open(self) -> tuple[str | BinaryIO, int | None]:
        """Where a fresh encoder writes, and the memfd that is (None: none)."""
        ...

    def finish(self, memfd: int | None, data: bytes = b"") -> Made:
        """The output, made into `memfd` (else `data`; neither: where `open` said). A
        memfd that `Made` does not keep is the caller's to close."""
        ...

    def discard(self) -> None:
        """The encode failed: keep nothing."""
        ...


class ToFile:
    def __init__(self, target: FileTarget) -> None:
        self._target = target

    def open(self) -> tuple[str | BinaryIO, int | None]:
        return str(self._target.open_temp()), None

    def finish(self, memfd: int | None, data: bytes = b"") -> Made:
        if self._target.temp is None:  # encoded in memory, not into the file: write it out
            self._target.fill(memfd, data)
        path = str(self._target.commit())
        return Made(path, os.stat(path).st_size)

    def discard(self) -> None:
        self._target.discard()


class ToMemory:
    def open(self) -> tuple[str | BinaryIO, int | None]:
        memfd = os.memfd_create("video-sidecar-out", os.MFD_CLOEXEC)
        return f"/proc/self/fd/{memfd}", memfd

    def finish(self, memfd: int | None, data: bytes = b"") -> Made:
        if memfd is None:
            return Made("", len(data), data=data)
        return Made("", os.fstat(memfd).st_size, memfd)

    def discard(self) -> None:
        pass


class Streamed:
    def __init__(self, emit: Emit, chunk_size: int) -> None:
        self._writer = ChunkWriter(emit, chunk_size)

    def open(self) -> tuple[str | BinaryIO, int | None]:
        return self._writer, None  # type: ignore[return-value]

    def finish(self, memfd: int | None, data: bytes = b"") -> Made:
        return Made("", self._writer.offset)  # sent already

    def discard(self) -> None:
        pass


def sink_for(plan: EncodePlan, emit: Emit, chunk_size: int) -> Sink:
    if plan.streams_bytes:
        return Streamed(emit, chunk_size)
    if plan.target is None:
        return ToMemory()
    return ToFile(plan.target)
