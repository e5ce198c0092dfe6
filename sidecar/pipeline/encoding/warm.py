"""Encoders opened ahead of time for the settings the daemon is serving.

Opening libx264 and the colour converter costs several milliseconds, as much as encoding a
short clip, and holds the GIL. Generation servers send the same settings again and again,
so the pool opens the next encoder for a setting on a background thread after a request
takes one: the next request finds it ready instead of paying the open. When several
requests run at once, it opens the next ones at once, while they encode; when one client
sends back to back, as its encode ends (the open then holds the GIL against the answer and
the client's own time, not the frames); when requests are spaced out, once the request is
answered. A request that finds its encoder still opening waits for it rather than open
its own. The pool keeps as many ready per setting as that setting has had requests in
flight at once recently, so 8 concurrent clients find 8. (Encodes that go to encoder
processes, see processes, skip this pool: each process keeps its own, see ready.)

The thread count is not part of the key: a ready encoder is opened with a share of the
cores for the concurrency its setting sees, and a request that takes it uses it as is.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ...codec.catalogue import CodecSpec, ResolvedCodec
from ...codec.colour import FrameConverter
from ...codec.encoder import VideoEncoder
from ...codec.frames import PIXEL_FORMATS, Geometry
from ...codec.threads import converts, threading_for
from ...config_values import cpu_count

# Only short clips are worth it: for long ones the open cost is lost in the encode.
MAX_WARM_BYTES = 64 * 1024 * 1024
MAX_IDLE_S = 120.0  # a ready encoder unused this long is closed
DEMAND_WINDOW_S = 30.0  # how long a burst of concurrency is remembered
STEADY_GAP_S = 0.005  # a request this soon after the last one ended is back to back
SPACED_IDLE_S = 0.05  # a ready encoder that waited this long served spaced-out traffic
WAIT_FOR_OPENING_S = 0.05  # longest a request waits for an encoder already opening


@dataclass(frozen=True)
class EncoderKey:
    geometry: Geometry
    encoder: str
    options: tuple[tuple[str, str], ...]
    gop: int | None
    thread_type: str
    threads: int  # as asked for (request or config); 0: a share of the cores

    @classmethod
    def of(
        cls, geometry: Geometry, codec: ResolvedCodec, thread_type: str, threads: int
    ) -> EncoderKey:
        options = tuple(sorted(codec.options.items()))
        return interned(
            cls(geometry, codec.choice.encoder, options, codec.gop, thread_type, threads)
        )


# The daemon keeps one key object per settings (`EncoderKey.of`, and `interned` for keys
# an encoder process sends back): choosing among nine encoder processes compares and
# counts their keys, twice a request, and equal keys that are distinct objects were
# compared field by field (a Fraction, a dozen options): 77-88 us a request on the 2-core
# machine, quiet, against 21 us for one object per settings.
_KEYS: dict[EncoderKey, EncoderKey] = {}
_MOST_KEYS = 256  # settings remembered; past that the table starts again


def interned(key: EncoderKey) -> EncoderKey:
    """The one object for `key`'s settings."""
    found = _KEYS.get(key)
    if found is None:
        if len(_KEYS) >= _MOST_KEYS:
            _KEYS.clear()
        found = _KEYS.setdefault(key, key)
    return found


@dataclass
class WarmEncoder:
    """An open encoder writing into an anonymous in-memory file."""

    encoder: VideoEncoder
    memfd: int
    threads: int
    ready_at: float

    def discard(self) -> None:
        self.encoder.abort()
        os.close(self.memfd)


def open_in_memory(
    geometry: Geometry,
    codec: ResolvedCodec,
    threads: int,
    thread_type: str,
    converter: FrameConverter | None = None,
    *,
    prime: bool = False,
) -> WarmEncoder:
    """An encoder writing into a new memfd. With `prime`, its colour converter is primed
    with one blank frame, unless `converter` (one that served an earlier encoder of these
    settings) is primed: what an encoder opened ahead of its request needs."""
    memfd = os.memfd_create("video-sidecar-out", os.MFD_CLOEXEC)
    try:
        encoder = VideoEncoder(
            f"/proc/self/fd/{memfd}", geometry, codec, threads, thread_type, converter=converter
        )
    except BaseException:
        os.close(memfd)
        raise
    if prime:
        layout = geometry.layout
        blank = np.zeros(layout.frame_shape(geometry.width, geometry.height), dtype=np.uint8)
        encoder.prime(blank)
    return WarmEncoder(encoder, memfd, threads, time.monotonic())


# Opens a ready encoder for a key, given how many requests for it run at once.
Opener = Callable[[int], WarmEncoder]


def opener_for(key: EncoderKey, codec: ResolvedCodec, frames: int) -> Opener:
    """How to open a ready encoder for `key`: with the threads asked for, else a share of
    the cores for the concurrency it sees. Holds settings only, never a job or its views."""

    def open_one(concurrency: int) -> WarmEncoder:
        if key.threads:
            return open_in_memory(key.geometry, codec, key.threads, key.thread_type, prime=True)
        share = max(1, cpu_count() // concurrency)
        threading = threading_for(
            frames, key.geometry.height, share, converts=converts(key.geometry)
        )
        return open_in_memory(key.geometry, codec, *threading, prime=True)

    return open_one


class WarmPool:
    """Ready encoders by key, at most `capacity` in all."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ready: dict[EncoderKey, deque[WarmEncoder]] = {}
        self._opening: Counter[EncoderKey] = Counter()
        self._in_use: Counter[EncoderKey] = Counter()
        self._demand: dict[EncoderKey, tuple[int, float]] = {}  # peak in use, and when
        self._ended: dict[EncoderKey, float] = {}  # when the last encode for a key ended
        self._deferred: dict[EncoderKey, tuple[int, Opener, str]] = {}  # openings for later
        self._late: set[EncoderKey] = set()  # keys whose openings for later came too late
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)  # an opening ended
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm")

    def eligible(self, geometry: Geometry, frames: int) -> bool:
        frame = geometry.layout.frame_bytes(geometry.width, geometry.height)
        return self.capacity > 0 and frames * frame <= MAX_WARM_BYTES

    def checkout(self, key: EncoderKey, opener: Opener) -> WarmEncoder | None:
        """A ready encoder for `key`, if one waits; either way, the pool starts opening
        the next ones now. Pair every call with `checkin(key)`."""
        now = time.monotonic()
        stale: list[WarmEncoder] = []
        with self._lock:
            self._in_use[key] += 1
            peak, since = self._demand.get(key, (0, now))
            if self._in_use[key] >= peak or now - since > DEMAND_WINDOW_S:
                self._demand[key] = (self._in_use[key], now)
            ready = self._ready.get(key, deque())
            while ready and now - ready[0].ready_at > MAX_IDLE_S:
                stale.append(ready.popleft())
            warm = ready.popleft() if ready else None
            waited = warm is None and self._opening[key] > 0
            if waited:
                warm = self._wait_for_opening(key, now + WAIT_FOR_OPENING_S)
            if warm is not None:
                self.hits += 1
            else:
                self.misses += 1
            missing = max(0, self._wanted(key) - len(ready) - self._opening[key])
            # The pool is full of other settings' encoders: the oldest ready ones make
            # room, or a server that moves to a new shape would open every request cold.
            stale += self._make_room(key, missing)
            missing = min(missing, self.capacity - self._held())
            # When to open the next ones. Several at once: now, during this encode, or
            # they would not be ready in time. One client back to back (this request
            # came right after the last one ended): as this encode ends, so the open
            # holds the GIL against the answer and the idle gap, not this request's
            # frames. Spaced out: once this request is answered, in the idle time.
            if waited:
                self._late.add(key)  # an opening left for later was not ready in time
            elif warm is not None and now - warm.ready_at > SPACED_IDLE_S:
                self._late.discard(key)  # it waited for its request: spaced out again
            gap = now - self._ended.get(key, -1e9)
            if missing and self._in_use[key] == 1:
                steady = gap < STEADY_GAP_S or key in self._late
                self._deferred[key] = (missing, opener, "checkin" if steady else "answered")
                missing = 0
            self._opening[key] += missing
        for old in stale:
            old.discard()
        for _ in range(missing):
            self._submit(key, opener)
        return warm

    def checkin(self, key: EncoderKey) -> None:
        with self._lock:
            self._in_use[key] -= 1
            if not self._in_use[key]:
                del self._in_use[key]
            self._ended[key] = time.monotonic()
        self._open_deferred(key, "checkin")

    def answered(self, key: EncoderKey) -> None:
        """The request that took an encoder for `key` has its answer: open what it left
        for later (see `checkout`)."""
        self._open_deferred(key, "answered", "checkin")

    def _open_deferred(self, key: EncoderKey, *moments: str) -> None:
        with self._lock:
            missing, opener, moment = self._deferred.get(key, (0, None, ""))
            if moment not in moments:
                return
            del self._deferred[key]
            self._opening[key] += missing
        for _ in range(missing):
            assert opener is not None
            self._submit(key, opener)

    def _wait_for_opening(self, key: EncoderKey, deadline: float) -> WarmEncoder | None:
        """The encoder being opened for `key`, once ready (lock held); None if it is not
        by `deadline`. It started before this request came: it is nearer done than an
        open of this request's own would be."""
        while self._opening[key] and (left := deadline - time.monotonic()) > 0:
            self._filled.wait(left)
            ready = self._ready.get(key)
            if ready:
                return ready.popleft()
        return None

    def demand(self, key: EncoderKey) -> int:
        with self._lock:
            return max(1, self._demand.get(key, (1, 0.0))[0])

    def _wanted(self, key: EncoderKey) -> int:
        """Ready encoders to keep for `key`: its recent peak concurrency, within capacity
        (lock held)."""
        return max(0, min(self._demand[key][0], self.capacity))

    def _held(self) -> int:
        return sum(len(q) for q in self._ready.values()) + sum(self._opening.values())

    def _make_room(self, key: EncoderKey, wanted: int) -> list[WarmEncoder]:
        """Take out the oldest ready encoders of other keys until `wanted` more fit
        (lock held); the caller discards them."""
        evicted: list[WarmEncoder] = []
        while self._held() + wanted > self.capacity:
            others = [q for k, q in self._ready.items() if k != key and q]
            if not others:
                break
            oldest = min(others, key=lambda q: q[0].ready_at)
            evicted.append(oldest.popleft())
        return evicted

    def _submit(self, key: EncoderKey, opener: Opener) -> None:
        def fill() -> None:
            warm: WarmEncoder | None = None
            try:
                warm = None if self._closed else opener(self.demand(key))
            finally:
                with self._lock:
                    self._opening[key] -= 1
                    keep = warm is not None and not self._closed
                    if warm is not None and keep:
                        self._ready.setdefault(key, deque()).append(warm)
                    self._filled.notify_all()
            if warm is not None and not keep:
                warm.discard()

        if self._executor is None or self._closed:
            with self._lock:
                self._opening[key] -= 1
            return
        self._executor.submit(fill)

    def close_ready(self) -> int:
        """Close every ready encoder (the daemon is idle: `memory.RELEASE_S`); the next
        request for their settings opens one. Returns how many were closed."""
        with self._lock:
            ready = [w for q in self._ready.values() for w in q]
            self._ready.clear()
        for warm in ready:
            with contextlib.suppress(Exception):
                warm.discard()
        return len(ready)

    def close(self) -> None:
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self.close_ready()


def first_encode() -> None:
    """Encode a few small frames in memory, once at startup, in each default pixel
    format: a process's first encode pays for paging in x264, the colour converter and
    the muxer (on two cores, 40 ms of a 448x256x4 clip's 60), which no request should."""
    codec = CodecSpec().resolve()
    for pixel_format in ("rgb24", "yuv420p"):
        geometry = Geometry(64, 64, PIXEL_FORMATS[pixel_format], Fraction(24))
        warm = open_in_memory(geometry, codec, 1, "FRAME")
        try:
            frames = np.zeros((4, *geometry.layout.frame_shape(64, 64)), dtype=np.uint8)
            warm.encoder.encode_all(frames)
            warm.encoder.close()
        finally:
            os.close(warm.memfd)
