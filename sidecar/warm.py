"""Encoders opened ahead of time for the shapes the daemon just served.

Opening libx264 and the colour converter costs several milliseconds, as much as encoding a
short clip. Generation servers send the same shape again and again, so after a short
clip is done the daemon opens the next encoder for that shape on a background thread;
the next request with the same settings finds it ready.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .encoder import ResolvedCodec, VideoEncoder
from .frames import Geometry

if TYPE_CHECKING:
    from .jobs import EncodeJob

# Only short clips are worth it: for long ones the open cost is lost in the encode.
MAX_WARM_BYTES = 64 * 1024 * 1024
MAX_IDLE_S = 120.0


@dataclass(frozen=True)
class EncoderKey:
    geometry: Geometry
    encoder: str
    options: tuple[tuple[str, str], ...]
    gop: int | None
    threads: int
    thread_type: str

    @classmethod
    def of(
        cls, geometry: Geometry, codec: ResolvedCodec, threads: int, thread_type: str
    ) -> EncoderKey:
        return cls(
            geometry,
            codec.choice.encoder,
            tuple(sorted(codec.options.items())),
            codec.gop,
            threads,
            thread_type,
        )


@dataclass
class WarmEncoder:
    """An open encoder writing into an anonymous in-memory file."""

    encoder: VideoEncoder
    memfd: int
    ready_at: float

    def discard(self) -> None:
        self.encoder.abort()
        os.close(self.memfd)


def open_in_memory(
    geometry: Geometry, codec: ResolvedCodec, threads: int, thread_type: str
) -> WarmEncoder:
    memfd = os.memfd_create("video-sidecar-out", os.MFD_CLOEXEC)
    try:
        encoder = VideoEncoder(f"/proc/self/fd/{memfd}", geometry, codec, threads, thread_type)
    except BaseException:
        os.close(memfd)
        raise
    return WarmEncoder(encoder, memfd, time.monotonic())


def warm_up(
    geometry: Geometry, codec: ResolvedCodec, threads: int, thread_type: str
) -> WarmEncoder:
    """Open an encoder and prime its colour converter with one blank frame."""
    warm = open_in_memory(geometry, codec, threads, thread_type)
    layout = geometry.layout
    blank = np.zeros(layout.frame_shape(geometry.width, geometry.height), dtype=np.uint8)
    warm.encoder.prime(blank)
    return warm


class WarmPool:
    """At most `capacity` ready encoders, one per key, most recently used kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ready: OrderedDict[EncoderKey, WarmEncoder] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm")

    def refill_for(self, job: EncodeJob) -> Callable[[], None]:
        """What opens the next encoder for a finished job's settings, in the background,
        once called (after the client has its answer: opening holds the GIL for
        milliseconds). It keeps the settings only, not the job, whose slab views must
        not outlive it."""
        geometry, codec, key = job.plan.geometry, job.plan.codec, job.key
        threads, thread_type = job.threads, job.thread_type

        def open_next() -> None:
            if self._executor is not None and not self._closed:
                self._executor.submit(
                    self.fill, key, lambda: warm_up(geometry, codec, threads, thread_type)
                )

        return open_next

    def eligible(self, geometry: Geometry, frames: int) -> bool:
        frame = geometry.layout.frame_bytes(geometry.width, geometry.height)
        return self.capacity > 0 and frames * frame <= MAX_WARM_BYTES

    def take(self, key: EncoderKey) -> WarmEncoder | None:
        with self._lock:
            warm = self._ready.pop(key, None)
            if warm is not None and time.monotonic() - warm.ready_at < MAX_IDLE_S:
                self.hits += 1
                return warm
            self.misses += 1
        if warm is not None:
            warm.discard()
        return None

    def fill(self, key: EncoderKey, make: Callable[[], WarmEncoder]) -> None:
        """Open an encoder for `key` unless one is waiting already (runs off the loop)."""
        with self._lock:
            if self._closed or key in self._ready:
                return
        warm = make()
        evicted = []
        with self._lock:
            if self._closed or key in self._ready:
                evicted.append(warm)
            else:
                self._ready[key] = warm
                while len(self._ready) > self.capacity:
                    evicted.append(self._ready.popitem(last=False)[1])
        for old in evicted:
            old.discard()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._closed = True
            ready, self._ready = list(self._ready.values()), OrderedDict()
        for warm in ready:
            with contextlib.suppress(Exception):
                warm.discard()
