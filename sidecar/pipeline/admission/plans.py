"""What an encode is asked to do (`EncodePlan`) and what it produced (`EncodeOutcome`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ...codec.audio_format import AudioFormat
from ...codec.catalogue import ResolvedCodec
from ...codec.frames import Geometry
from ..output.files import FileTarget
from ..output.live import LiveLayout
from ..previews.planning import PreviewPlan
from .requests import PreviewImage


@dataclass(frozen=True)
class EncodePlan:
    request_id: str
    geometry: Geometry
    codec: ResolvedCodec
    target: FileTarget | None  # None: bytes, returned in memory or streamed
    threads: int
    container: str = "mp4"
    audio: AudioFormat | None = None
    frames_total: int = 0  # known up front for a whole-video Encode
    one_reply: bool = False  # nothing goes back before the result
    # Frames still landing: where their count lies, as (slab id, byte offset in the slab).
    landed_at: tuple[int, int] | None = None
    previews: PreviewPlan | None = None
    # A file output's previews: where each kind is written, beside the video.
    preview_targets: tuple[tuple[str, FileTarget], ...] = ()
    live: LiveLayout | None = None  # a live package beside the output (see output/live)

    @property
    def streams_bytes(self) -> bool:
        """Fragmented MP4 to bytes goes back while encoding; the rest when complete."""
        return self.target is None and self.container == "fmp4" and not self.one_reply


PREVIEW_ALIGN = 64  # a preview in the output's lease starts at a multiple of this


def _aligned(n: int) -> int:
    return -(-n // PREVIEW_ALIGN) * PREVIEW_ALIGN


def preview_offsets(outcome: EncodeOutcome) -> tuple[list[int], int]:
    """Where each preview sent with a bytes output lies after it in one lease, and the
    end of the last."""
    offsets, end = [], outcome.size_bytes
    for image in outcome.previews:
        if not image.path:
            end = _aligned(end)
            offsets.append(end)
            end += image.size_bytes
    return offsets, end


@dataclass
class EncodeOutcome:
    """What a finished job produced. Bytes outputs not yet sent are in `memfd`, or in
    `data` when an encoder process sent them (already in memory: no file round trip)."""

    frames: int
    duration_s: float
    size_bytes: int
    path: str
    memfd: int | None
    audio_samples: int
    timings_ms: dict[str, float]
    data: bytes | None = None
    previews: list[PreviewImage] = field(default_factory=list)

    def read_chunks(self, chunk_size: int) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) pieces of a bytes output, read as they are sent: a long
        video's output is never all in the daemon's memory at once."""
        if self.data is not None:
            for offset in range(0, len(self.data), chunk_size):
                yield offset, self.data[offset : offset + chunk_size]
        elif self.memfd is not None:
            for offset in range(0, self.size_bytes, chunk_size):
                yield offset, os.pread(self.memfd, chunk_size, offset)

    def read_all(self) -> bytes:
        """The whole bytes output, in memory (a small one)."""
        if self.data is not None:
            return self.data
        assert self.memfd is not None
        return os.pread(self.memfd, self.size_bytes, 0)

    @property
    def previews_bytes(self) -> int:
        """The bytes of the previews that go back with a bytes output (not as files)."""
        return sum(image.size_bytes for image in self.previews if not image.path)

    @property
    def bytes_back(self) -> int:
        """A bytes output's size with its previews: what one reply would carry."""
        return self.size_bytes + self.previews_bytes

    @property
    def lease_bytes(self) -> int:
        """The room a lease needs for a bytes output and its previews after it, each at
        a multiple of `PREVIEW_ALIGN`."""
        return preview_offsets(self)[1]

    @property
    def unsent(self) -> bool:
        """A bytes output still to send (a streamed one has gone already)."""
        return self.data is not None or self.memfd is not None

    def copy_into(self, target: np.ndarray) -> None:
        """Put the whole bytes output into `target` (a region of a slab), its previews
        after it (see `preview_offsets`), each told where."""
        self._copy_video(target)
        sent = [image for image in self.previews if not image.path]
        for image, offset in zip(sent, preview_offsets(self)[0], strict=True):
            target[offset : offset + image.size_bytes] = np.frombuffer(image.data, np.uint8)
            image.lease_offset = offset

    def _copy_video(self, target: np.ndarray) -> None:
        if self.data is not None:
            target[: len(self.data)] = np.frombuffer(self.data, dtype=np.uint8)
        elif self.memfd is not None:
            view = target.data[: self.size_bytes]
            done = 0
            while done < self.size_bytes:
                got = os.preadv(self.memfd, [view[done:]], done)
                if got <= 0:
                    raise OSError(f"the output ended at {done} of {self.size_bytes} bytes")
                done += got

    def close(self) -> None:
        if self.memfd is not None:
            os.close(self.memfd)
            self.memfd = None
