"""The routes a job encodes by, behind one interface, and the one place one is chosen
(the scheduler runs a job by it).

In an encoder process (an MP4 without audio, all of it in leases: see processes), which
falls back to the daemon when none is free; in the daemon, with a ready encoder from the
warm pool (a short clip: see warm) or a fresh one; a long video in parallel segments (see
segments), with either. Every route leaves the job's leases freed or given back once, and
no partial file.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Protocol

from ...codec.encoder import EncodeTimings, VideoEncoder
from ...errors import Cancelled, InvalidRequest
from ...events import ProgressReporter
from ..admission.plans import EncodeOutcome
from ..output.live import LivePackage
from .consume import encode_pieces
from .feed import End
from .process_route import InEncoderProcess
from .segments import encode_segments, frame_lookup
from .warm import WarmPool, open_in_memory, opener_for

if TYPE_CHECKING:
    from .jobs import EncodeJob


class EncodeRoute(Protocol):
    def encode(self, job: EncodeJob, queue_s: float) -> EncodeOutcome:
        """Run `job` to its outcome, or raise the error its client is told (bare)."""
        ...


def choose_route(job: EncodeJob) -> EncodeRoute | InEncoderProcess:
    """How `job` encodes, chosen once when it runs (its threads settled). The route
    through an encoder process is awaited on the event loop (see process_route); every
    other runs on an encode thread."""
    here: InDaemon
    segmented = len(job.segments) > 1
    if job.warmable and job.warm is not None:
        here = ReadyEncoder(job.warm)
    else:
        # Cut into segments: their encoders make the packets and the headers.
        here = FreshEncoder(headers_later=segmented)
    if segmented:
        return Segments(here)
    if job.processes is not None and job.for_processes:
        return InEncoderProcess(job.processes, here)
    return here


class InDaemon:
    """An encode on the job's thread, with an encoder `_open` gives it."""

    def encode(self, job: EncodeJob, queue_s: float) -> EncodeOutcome:
        plan = job.plan
        memfd: int | None = None
        encoder: VideoEncoder | None = None
        error: BaseException | None = None
        try:
            job.settle_codec()
            encoder, memfd = self._open(job)
            if job.audio is not None:
                encoder.set_audio(job.audio)
            encoder.reserve_index(plan.frames_total)  # 0, for a stream: nothing reserved
            self._consume(job, encoder)
            encoder.close(job.check_stop)  # stops between the drain's packets too
            job.check_stop()  # gone while the encoder drained: keep nothing
            t0 = time.perf_counter()
            made, images = job.finish(memfd)
            if memfd is not None and made.memfd is None:
                os.close(memfd)  # written out
            memfd = made.memfd
            encoder.timings.finalize += time.perf_counter() - t0
        except BaseException as exc:
            if encoder is not None:
                encoder.abort()
            job.sink.discard()
            if memfd is not None:
                os.close(memfd)
            refused = not job.stopped and not isinstance(exc, Cancelled)
            if refused and (encoder is None or encoder.frames == 0):
                # Refused before reading a frame (e.g. the codec rejected an option):
                # the client keeps its leases and may fix the request and retry. A client
                # that went away gets nothing back: everything is freed below.
                job.feed.give_back_all()
            error = job.failure(exc)
        finally:
            job.let_go()
            self._done(job)
        if error is not None:
            # Raised here, bare: the frames of a failed encode hold views of slab memory,
            # and no traceback may keep them alive past the job.
            raise error.with_traceback(None)
        assert encoder is not None
        return EncodeOutcome(
            frames=encoder.frames,
            duration_s=encoder.duration,
            size_bytes=made.size,
            path=made.path,
            memfd=memfd,
            audio_samples=encoder.audio.sent if encoder.audio is not None else 0,
            timings_ms={**timings_ms(queue_s, encoder.timings), "previews_ms": job.previews_ms},
            previews=images,
        )

    def _open(self, job: EncodeJob) -> tuple[VideoEncoder, int | None]:
        """The encoder, and the memfd it writes into (None: a file, or streamed)."""
        raise NotImplementedError

    def _done(self, job: EncodeJob) -> None:
        """After the encode, whichever way it ended."""

    def _consume(self, job: EncodeJob, encoder: VideoEncoder) -> None:
        progress = ProgressReporter(job.emit, job.plan.frames_total)
        encode_pieces(
            encoder,
            job.pieces(),
            job.frames_of,
            job.handing,
            lambda: job.after_frame(progress),
            job.consumed,
        )
        assert job.end is not None
        finish_feed(encoder, job.end, progress.done)


class FreshEncoder(InDaemon):
    """An encoder opened for this job, into its sink (see sinks)."""

    def __init__(self, *, headers_later: bool = False) -> None:
        self._headers_later = headers_later

    def _open(self, job: EncodeJob) -> tuple[VideoEncoder, int | None]:
        plan = job.plan
        sink, memfd = job.sink.open()
        try:
            encoder = VideoEncoder(
                sink,
                plan.geometry,
                plan.codec,
                job.threads,
                job.thread_type,
                container=plan.container,
                audio=plan.audio,
                headers_later=self._headers_later,
                live=LivePackage(plan.live) if plan.live is not None else None,
            )
        except BaseException:
            if memfd is not None:
                os.close(memfd)
            raise
        return encoder, memfd


class ReadyEncoder(InDaemon):
    """An encoder from the warm pool: ready if one waits for these settings, else opened
    here (the pool opens the next ones meanwhile)."""

    def __init__(self, pool: WarmPool) -> None:
        self._pool = pool

    def _open(self, job: EncodeJob) -> tuple[VideoEncoder, int | None]:
        plan = job.plan
        key = job.warm_key = job.key
        opener = opener_for(key, plan.codec, plan.frames_total)
        t0 = time.perf_counter()
        warm = self._pool.checkout(key, opener)
        if warm is None:
            warm = open_in_memory(plan.geometry, plan.codec, job.threads, job.thread_type)
        else:
            job.threads = warm.threads
        # What this request spent getting its encoder: nothing if one was ready, the
        # wait if one was still opening, its own open otherwise.
        warm.encoder.timings.open = time.perf_counter() - t0
        return warm.encoder, warm.memfd

    def _done(self, job: EncodeJob) -> None:
        if job.warm_key is not None:
            self._pool.checkin(job.warm_key)


class Segments(InDaemon):
    """A whole video (every piece queued already) in parallel segments, on the encoder
    `opener` opens; one piece after another if the segments' headers disagree."""

    def __init__(self, opener: InDaemon) -> None:
        self._opener = opener

    def _open(self, job: EncodeJob) -> tuple[VideoEncoder, int | None]:
        return self._opener._open(job)

    def _done(self, job: EncodeJob) -> None:
        self._opener._done(job)

    def _consume(self, job: EncodeJob, encoder: VideoEncoder) -> None:
        progress = ProgressReporter(job.emit, job.plan.frames_total)
        pieces, end = job.feed.drain()
        frame_at = frame_lookup([job.handing.next(job.frames_of(piece)) for piece in pieces])
        job.handing.restart()  # a fallback below hands the same frames out again
        for piece in pieces:  # the previews read the leases beside the segments' encoders
            job.see(piece)
        done = encode_segments(
            encoder, frame_at, job.segments, job.cores, lambda: job.stopped, progress.reach
        )
        if done:  # every frame is encoded (or, if not, each is, now)
            # With previews, the leases go at the job's end, once the previews are made.
            for piece in pieces if job.previews is None else ():
                job.feed.consumed(piece)
        else:
            job.restart_previews()  # taken again, as the frames are encoded again
            encode_pieces(
                encoder,
                job.checked(pieces),
                job.frames_of,
                job.handing,
                lambda: job.after_frame(progress),
                job.consumed,
            )
        finish_feed(encoder, end, progress.done)


def finish_feed(encoder: VideoEncoder, end: End, frames: int) -> None:
    """The feed has ended with `end`, after `frames` frames."""
    if frames == 0:  # an MP4 with no frames plays nowhere: refuse, keep nothing
        raise InvalidRequest("end", "the stream ended before its first frame")
    if end.audio is not None:
        encoder.set_audio(end.audio)


def timings_ms(queue_s: float, t: EncodeTimings) -> dict[str, float]:
    """An encode's stages, in milliseconds."""
    return {
        "queue_ms": queue_s * 1e3,
        "open_ms": t.open * 1e3,
        "convert_ms": t.convert * 1e3,
        "encode_ms": t.encode * 1e3,
        "mux_ms": t.mux * 1e3,
        "finalize_ms": t.finalize * 1e3,
    }
