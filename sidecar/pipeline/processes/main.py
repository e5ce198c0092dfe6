"""An encoder process: encodes videos from the daemon's slabs, one at a time.

Started by `processes.EncoderProcesses` as `python -m sidecar.pipeline.processes.main FD IDLE
SLAB...`, in its own session (a terminal's Ctrl-C is the daemon's to handle), with one end
of a socket pair as FD. It maps the slabs once, then serves jobs: an `Assignment` in, an
`Answer` out, with `FramesEncoded` between them on a long encode and a `Stop` from the daemon
ending it early. After each answer it opens the next encoder for the same settings, so the
open (several milliseconds that hold this process's GIL, not the daemon's) is done before
the next request for them arrives; it then says `Ready`. A `Prepare` asks it to open one for
given settings while it has no work (another process has just taken the only ready one); it
too is answered with `Ready`.

It never touches leases, sockets or files: the daemon checks every request, owns the leases,
and writes the bytes this process returns. When the daemon goes away, the next read fails
and the process exits."""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

import av
import numpy as np

from ...codec.catalogue import ResolvedCodec
from ...codec.encoder import VideoEncoder
from ...codec.frames import Geometry, PlacedRange, borrow_frames
from ...codec.landing import Landing
from ...codec.memory import RELEASE_S, keep_freed, limit_arenas, trim
from ...errors import Cancelled, InvalidRequest, SidecarError
from ...events import PROGRESS_INTERVAL
from ..encoding.consume import Handing, encode_pieces
from ..encoding.warm import EncoderKey, WarmEncoder
from .ready import EncoderSettings, ReadySlot

# Larger outputs are handed over as a descriptor: pickling a 2.9 MB output through the
# socket and back took ten times as long as handing over its memfd.
INLINE_ANSWER_BYTES = 256 * 1024
WATCH_S = 0.002  # how often an encode looks for the daemon's Stop, at most


@dataclass(frozen=True)
class Region:
    """Frames inside a slab, as `frames.PlacedRange` without its lease."""

    slab: int
    start: int
    frame_count: int
    row_stride: int
    frame_stride: int


@dataclass(frozen=True)
class Prepare(EncoderSettings):
    """Open a ready encoder for these settings now; answered with `Ready`."""


@dataclass(frozen=True)
class Assignment(EncoderSettings):
    regions: tuple[Region, ...]
    # Frames still landing: their count's (slab, byte offset); see landing.
    landed_at: tuple[int, int] | None = None

    def preparation(self) -> Prepare:
        """What another process needs to get an encoder ready for the next such job."""
        return Prepare(self.key, self.geometry, self.codec, self.threads, self.thread_type)

    @classmethod
    def of(
        cls,
        key: EncoderKey,
        geometry: Geometry,
        codec: ResolvedCodec,
        threads: int,
        thread_type: str,
        pieces: list[PlacedRange],
        *,
        landed_at: tuple[int, int] | None = None,
    ) -> Assignment:
        """What a process needs for an encode: settings, where its frames lie, and where
        their landed-frame count lies if they still land."""
        regions = tuple(
            Region(p.lease.slab_id, p.start, p.frame_count, p.row_stride, p.frame_stride)
            for p in pieces
        )
        return cls(key, geometry, codec, threads, thread_type, regions, landed_at)


@dataclass
class Answer:
    """What an assignment produced: the MP4's bytes, or why not (`error` is a class name
    from `errors`, `field` and `message` its arguments). An output larger than
    `INLINE_ANSWER_BYTES` does not travel as bytes: `in_file` says that the memfd holding
    it follows the answer over the socket (the daemon keeps it as `memfd`), so a long
    video's output is never copied, and never held twice in memory."""

    data: bytes = b""
    in_file: bool = False
    size: int = 0
    memfd: int | None = None  # set by the daemon once it has received the descriptor
    frames: int = 0
    warm: bool = False  # the encoder was ready before the assignment came
    timings_s: dict[str, float] = field(default_factory=dict)
    received_at: float = 0.0  # when the assignment was read (time.perf_counter)
    error: str = ""
    field: str = ""
    message: str = ""


@dataclass(frozen=True)
class FramesEncoded:
    """Frames encoded so far, sent every `PROGRESS_INTERVAL` during a long encode."""

    frames: int


@dataclass(frozen=True)
class Stop:
    """The daemon's word that the request was cancelled: end the encode, answer Cancelled.
    One that comes after the answer went is simply dropped."""


@dataclass(frozen=True)
class Ready:
    """The process is free again, with a ready encoder for `key` (None: the open failed)."""

    key: EncoderKey | None


class Worker:
    def __init__(self, conn: Connection, slab_paths: list[str], idle_s: float = RELEASE_S) -> None:
        self._conn = conn
        self._idle_s = idle_s  # idle this long, the ready encoder closes and memory goes back
        self._slabs = [_map(path) for path in slab_paths]
        self.ready = ReadySlot()
        self._used: list[WarmEncoder] = []  # freed once the answer is sent
        self._outgoing: int | None = None  # a large answer's memfd, sent after it

    def serve(self) -> None:
        while True:
            if not self._conn.poll(self._idle_s):
                self._idle()
                continue
            try:
                job = self._conn.recv()
            except (EOFError, OSError):
                return  # the daemon has gone
            if job is None:
                return
            if isinstance(job, Stop):
                continue  # it crossed the answer: nothing to stop
            try:
                if isinstance(job, Prepare):
                    self._conn.send(Ready(self.ready.prepare(job)))
                else:
                    assert isinstance(job, Assignment)
                    self._serve(job)
            except OSError:
                return  # the daemon has gone

    def _idle(self) -> None:
        """No work for `idle_s`: the ready encoder goes, and the memory the encoders freed."""
        had_ready = self.ready.holds
        self.ready.discard()
        self.ready.converters.clear()
        trim()  # what the encoders freed, kept for the next ones (keep_freed)
        if had_ready:
            with contextlib.suppress(OSError):
                self._conn.send(Ready(None))  # no encoder ready any more

    def _serve(self, job: Assignment) -> None:
        received_at = time.perf_counter()
        answer = self._encode(job)
        answer.received_at = received_at
        self._conn.send(answer)
        if self._outgoing is not None:
            send_handle(self._conn, self._outgoing, os.getppid())
            os.close(self._outgoing)
            self._outgoing = None
        # Only now let the used encoder go: closing x264 joins its threads.
        self._used.clear()
        self._conn.send(Ready(self.ready.refill(job)))

    def _encode(self, job: Assignment) -> Answer:
        warm = self.ready.take(job)
        was_ready = warm is not None
        encoder: VideoEncoder | None = None
        try:
            if warm is None:
                warm = self.ready.open(job)
            else:
                warm.encoder.timings.open = 0.0  # paid before this request arrived
            encoder = warm.encoder
            self._consume(job, encoder)
            size = os.fstat(warm.memfd).st_size
            in_file = size > INLINE_ANSWER_BYTES
            if in_file:
                self._outgoing = os.dup(warm.memfd)  # sent after the answer
            return Answer(
                data=b"" if in_file else os.pread(warm.memfd, size, 0),
                in_file=in_file,
                size=size,
                frames=encoder.frames,
                warm=was_ready,
                timings_s=dataclasses.asdict(encoder.timings),
            )
        except (SidecarError, av.error.FFmpegError, ValueError, OSError) as exc:
            return _refusal(exc, encoder.frames if encoder is not None else 0)
        finally:
            if warm is not None:
                warm.discard()
                self._used.append(warm)

    def _consume(self, job: Assignment, encoder: VideoEncoder) -> None:
        """Every frame of `job` into `encoder`, then its end."""
        total = sum(region.frame_count for region in job.regions)
        encoder.reserve_index(total)
        watch = _Watch(self._conn, encoder)
        landing = None
        if job.landed_at is not None:
            landing = Landing(self._slabs[job.landed_at[0]], job.landed_at[1], total)
        encode_pieces(encoder, job.regions, self._frames_of(job), Handing(landing, watch), watch)
        encoder.close(watch)  # a Stop ends the drain between its packets too

    def _frames_of(self, job: Assignment) -> Callable[[Region], np.ndarray]:
        def frames_of(region: Region) -> np.ndarray:
            placed = PlacedRange(
                None,  # type: ignore[arg-type]  # leases stay with the daemon
                region.start,
                region.frame_count,
                region.row_stride,
                region.frame_stride,
            )
            return borrow_frames(self._slabs[region.slab], job.geometry, placed)

        return frames_of


def _refusal(exc: BaseException, frames: int) -> Answer:
    """The answer of an encode that ended with `exc`, after `frames` frames."""
    if isinstance(exc, Cancelled):
        return Answer(frames=frames, error="Cancelled", message="cancelled by the client")
    if isinstance(exc, InvalidRequest):
        return Answer(frames=frames, error="InvalidRequest", field=exc.field, message=_detail(exc))
    return Answer(frames=frames, error="EncodeFailed", message=f"encoder failed: {exc}")


class _Watch:
    """Run after every frame, and between the packets of the encoder's final drain:
    reports progress now and then, and ends the encode if the daemon said Stop. It looks
    at most every `WATCH_S`, with one poll object: `Connection.poll()` builds a selector
    on each call, 20-40 us beside x264's threads: milliseconds of a long encode."""

    def __init__(self, conn: Connection, encoder: VideoEncoder) -> None:
        self._conn = conn
        self._encoder = encoder
        self._last = self._looked = time.monotonic()
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._looked >= WATCH_S:
            self._looked = now
            if self._poller.poll(0):  # a message, or the daemon gone (recv raises)
                message = self._conn.recv()
                if isinstance(message, Stop) or message is None:
                    raise Cancelled("cancelled by the client")
        if now - self._last >= PROGRESS_INTERVAL:
            self._last = now
            self._conn.send(FramesEncoded(self._encoder.frames))


def _detail(exc: InvalidRequest) -> str:
    text = str(exc)
    prefix = f"{exc.field}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def _map(path: str) -> np.ndarray:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        # Populated now, at startup: a page first touched during an encode faults there,
        # and a few hundred faults on a fresh region cost more than the encode itself.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(fd, os.fstat(fd).st_size, flags=flags)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype=np.uint8)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Each encoder's buffers serve the next one's (keep_freed), trimmed when idle. With
    # one arena only: malloc_trim gives back the top of the main arena's heap alone, and
    # another arena's kept top would stay resident. Few threads here allocate (the
    # feeding thread, the converting one, x264's at its open).
    if limit_arenas(1):
        keep_freed()
    conn = Connection(int(argv[0]))
    try:
        worker = Worker(conn, argv[2:], float(argv[1]))
    except OSError as exc:  # the daemon sees the connection close and stops using us
        print(f"video-sidecar encoder process: cannot map the slabs: {exc}", file=sys.stderr)
        return 1
    try:
        conn.send(Ready(None))
    except OSError:
        return 0  # the daemon stopped while this process started
    worker.serve()
    return 0


if __name__ == "__main__":
    # Run under the module's own name, so what it pickles names sidecar.pipeline.processes.main.
    from sidecar.pipeline.processes.main import main as run

    sys.exit(run(sys.argv[1:]))
