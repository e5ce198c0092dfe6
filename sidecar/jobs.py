"""One encode request, run to completion on an encoder thread.

The job walks its frame ranges in order, feeds borrowed views to the encoder, frees each
lease the moment its last frame has been encoded, and places the output. Whatever way it
ends (done, failed, cancelled), every lease it was given is freed and no partial file
is left behind.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np

from .encoder import ResolvedCodec, VideoEncoder
from .errors import Cancelled, EncodeFailed, SidecarError
from .frames import Geometry, PlacedRange, borrow_frames
from .leases import LeaseTable
from .output import FileTarget, output_error
from .warm import EncoderKey, WarmPool, open_in_memory

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.25  # seconds between progress events


@dataclass(frozen=True)
class Progress:
    frames_done: int
    frames_total: int


@dataclass(frozen=True)
class EncodePlan:
    request_id: str
    geometry: Geometry
    ranges: list[PlacedRange]
    codec: ResolvedCodec
    target: FileTarget | None  # None: bytes, returned in memory
    threads: int

    @property
    def frames_total(self) -> int:
        return sum(r.frame_count for r in self.ranges)


@dataclass
class EncodeOutcome:
    """What a finished job produced. For bytes outputs `memfd` holds the file."""

    frames: int
    duration_s: float
    size_bytes: int
    path: str
    memfd: int | None
    timings_ms: dict[str, float]

    def read_chunks(self, chunk_size: int) -> list[tuple[int, bytes]]:
        assert self.memfd is not None
        return [
            (offset, os.pread(self.memfd, chunk_size, offset))
            for offset in range(0, self.size_bytes, chunk_size)
        ]

    def close(self) -> None:
        if self.memfd is not None:
            os.close(self.memfd)
            self.memfd = None


class EncodeJob:
    """Runs an `EncodePlan` on the calling thread. `cancel` may be set from anywhere."""

    def __init__(
        self,
        plan: EncodePlan,
        slabs: list[np.ndarray],
        leases: LeaseTable,
        emit: Callable[[Progress], None],
        warm: WarmPool | None = None,
    ) -> None:
        self.plan = plan
        self._slabs = slabs
        self._leases = leases
        self._emit = emit
        self._warm = warm
        self.cancel = threading.Event()
        self.threads = plan.threads  # 0 until the service picks a count
        self.thread_type = "FRAME"
        self.queue_s = 0.0
        self.started = False

    def run(self) -> EncodeOutcome:
        plan = self.plan
        owned = list({r.lease.id: r.lease for r in plan.ranges}.values())
        uses = Counter(r.lease.id for r in plan.ranges)
        memfd: int | None = None
        encoder: VideoEncoder | None = None
        self.started = True
        try:
            encoder, memfd = self._open()
            self._encode_ranges(encoder, uses)
            encoder.close()
            t0 = time.perf_counter()
            if plan.target is not None:
                if memfd is not None:  # a short clip encoded in memory: write it out
                    self._write(memfd, plan.target)
                    os.close(memfd)
                    memfd = None
                path = str(plan.target.commit())
                size = os.stat(path).st_size
            else:
                assert memfd is not None
                path = ""
                size = os.fstat(memfd).st_size
            encoder.timings.finalize += time.perf_counter() - t0
        except BaseException as exc:
            if encoder is not None:
                encoder.abort()
            if plan.target is not None:
                plan.target.discard()
            if memfd is not None:
                os.close(memfd)
            if encoder is None or encoder.frames == 0:
                # Refused before reading a frame (e.g. the codec rejected an option):
                # the client keeps its leases and may fix the request and retry.
                self._leases.untake(owned)
            error = self._classify(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            self._leases.free([lease for lease in owned if lease.encoding])
        t = encoder.timings
        outcome = EncodeOutcome(
            frames=encoder.frames,
            duration_s=encoder.duration,
            size_bytes=size,
            path=path,
            memfd=memfd,
            timings_ms={
                "open_ms": t.open * 1e3,
                "convert_ms": t.convert * 1e3,
                "encode_ms": t.encode * 1e3,
                "mux_ms": t.mux * 1e3,
                "finalize_ms": t.finalize * 1e3,
            },
        )
        return outcome

    @property
    def key(self) -> EncoderKey:
        return EncoderKey.of(self.plan.geometry, self.plan.codec, self.threads, self.thread_type)

    @property
    def warmable(self) -> bool:
        return self._warm is not None and self._warm.eligible(
            self.plan.geometry, self.plan.frames_total
        )

    def _open(self) -> tuple[VideoEncoder, int | None]:
        """A ready encoder if one waits for these settings, else a fresh one."""
        plan = self.plan
        if self.warmable:
            assert self._warm is not None
            warm = self._warm.take(self.key)
            if warm is not None:
                warm.encoder.timings.open = 0.0  # paid before this request arrived
                return warm.encoder, warm.memfd
        if plan.target is None or self.warmable:
            fresh = open_in_memory(plan.geometry, plan.codec, self.threads, self.thread_type)
            return fresh.encoder, fresh.memfd
        sink = str(plan.target.open_temp())
        return VideoEncoder(sink, plan.geometry, plan.codec, self.threads, self.thread_type), None

    @staticmethod
    def _write(memfd: int, target: FileTarget) -> None:
        size = os.fstat(memfd).st_size
        with open(target.open_temp(), "wb") as out:
            sent = 0
            while sent < size:
                sent += os.sendfile(out.fileno(), memfd, sent, size - sent)

    def _encode_ranges(self, encoder: VideoEncoder, uses: Counter[str]) -> None:
        total = self.plan.frames_total
        done = 0
        last_report = time.monotonic()
        for placed in self.plan.ranges:
            frames = borrow_frames(self._slabs[placed.lease.slab_id], self.plan.geometry, placed)
            for index in range(placed.frame_count):
                if self.cancel.is_set():
                    raise Cancelled("cancelled by the client")
                encoder.encode(frames[index])
                done += 1
                now = time.monotonic()
                if now - last_report >= PROGRESS_INTERVAL:
                    self._emit(Progress(done, total))
                    last_report = now
            del frames
            uses[placed.lease.id] -= 1
            if uses[placed.lease.id] == 0:
                # Every frame of this lease is inside the encoder: give it back now,
                # so a waiting client can start its next copy while we keep encoding.
                self._leases.free([placed.lease])

    def _classify(self, exc: BaseException) -> BaseException:
        if isinstance(exc, (SidecarError, KeyboardInterrupt, SystemExit)):
            return exc
        what = str(self.plan.target.final) if self.plan.target else "the output"
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return output_error(exc, what)
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS, errno.EIO):
            return output_error(exc, what)
        if isinstance(exc, (av.error.FFmpegError, ValueError, OSError)):
            log.exception("encode %s failed", self.plan.request_id)
            return EncodeFailed(f"encoder failed: {exc}")
        log.exception("encode %s failed unexpectedly", self.plan.request_id)
        return EncodeFailed(f"unexpected {type(exc).__name__}: {exc}")
