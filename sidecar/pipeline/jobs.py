"""One encode, run to completion on an encoder thread.

The job takes pieces from its feed in order (ranges in leases, or inline frames), hands
borrowed views to the encoder, and frees each lease the moment its last frame is inside
the encoder. Whatever way it ends (done, failed, cancelled), every lease it was given is
freed, or handed back to the client if nothing was read or its frames may still be
landing (see landing), and no partial file is left.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO, Protocol

import av
import numpy as np

from ..codec.encoder import VideoEncoder
from ..codec.frames import PlacedRange, borrow_frames
from ..codec.landing import Frames, Landing
from ..errors import Cancelled, EncodeFailed, InvalidRequest, SidecarError
from ..events import ChunkWriter, Emit, ProgressReporter
from ..pool.shm import Slab
from .encoder_process import ProcessGone
from .feed import End, FrameFeed, InlineFrames, Piece
from .output import FileTarget, output_error
from .plans import EncodeOutcome, EncodePlan
from .process_main import Answer, Assignment
from .processes import EncoderProcesses
from .segments import SEGMENTABLE, encode_segments, frame_lookup, keyframe_interval, plan_segments
from .warm import EncoderKey, WarmPool, open_in_memory, opener_for

log = logging.getLogger(__name__)

# Errors of the output file, not of the encoder: reported as the output's fault.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EIO)


class Slots(Protocol):
    def hold(self) -> bool: ...
    def release(self) -> None: ...
    def share(self) -> None: ...


class HeldSlot:
    """A whole video's slot: held for it from start to end by the scheduler."""

    def hold(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def share(self) -> None:
        pass


class EncodeJob:
    """Runs an `EncodePlan` on the calling thread; `stop()` may be called from anywhere.

    The job owns its feed: whichever way it ends, or if it never runs (`abandon()`), every
    lease the feed holds is freed or given back exactly once.
    """

    def __init__(
        self,
        plan: EncodePlan,
        slabs: Sequence[Slab],
        feed: FrameFeed,
        emit: Emit,
        *,
        warm: WarmPool | None = None,
        processes: EncoderProcesses | None = None,
        audio: np.ndarray | None = None,
        chunk_size: int = 1024 * 1024,
        cancel: threading.Event | None = None,
    ) -> None:
        self.plan = plan
        self._feed = feed
        self._slabs = slabs
        self._emit = emit
        self._warm = warm
        self._processes = processes
        self._audio = audio  # samples sent up front, if any
        self._chunk_size = chunk_size
        # Shared with the transport, which sets it when the client goes away.
        self._cancel = cancel if cancel is not None else threading.Event()
        self.threads = plan.threads  # settled when the job runs
        self.cores = plan.threads
        self.thread_type = "FRAME"
        self._started = False
        self._writer: ChunkWriter | None = None  # fragmented MP4 streamed back
        self._checked_out: EncoderKey | None = None  # settings taken from the warm pool
        self._fixed_threads = False
        self._stop_error: SidecarError | None = None
        self._landing: Landing | None = None  # frames still landing: their count
        if plan.landed_at is not None:
            slab, offset = plan.landed_at
            self._landing = Landing(slabs[slab].array, offset, plan.frames_total)
        self._handed = 0  # frames handed to the encoder so far, in order
        # A stream's hold on an encode slot, chunk by chunk (see scheduler); a whole
        # video's slot is held for it from start to end.
        self.slots: Slots = HeldSlot()

    @property
    def is_stream(self) -> bool:
        """Fed chunk by chunk, its length known only at the end."""
        return not self.plan.frames_total

    def stop(self, error: SidecarError | None = None) -> None:
        """Ask the job to stop at the next frame (or never to start). `error` is what its
        client is told; by default, that it cancelled."""
        if error is not None:
            self._stop_error = error
        self._cancel.set()

    def cancelled(self) -> SidecarError:
        """The error a stopped job ends with."""
        return self._stop_error or Cancelled("cancelled by the client")

    @property
    def stopped(self) -> bool:
        return self._cancel.is_set()

    def abandon(self) -> None:
        """Free the leases of a job that never ran; a job that ran has freed them."""
        if not self._started:
            self._let_go()

    def _let_go(self) -> None:
        """Free every lease the feed still holds; or, while frames may still be landing
        in them, give them back to the client (see landing)."""
        if self._landing is not None and not self._landing.complete:
            self._feed.give_back_all()
        self._feed.release_all()

    # -- the run -------------------------------------------------------------------------

    def run(
        self,
        threads: int,
        thread_type: str,
        queue_s: float = 0.0,
        *,
        fixed: bool = False,
        cores: int = 0,
    ) -> EncodeOutcome:
        """Encode to the end. `threads` is what a share of the cores calls for, or
        (`fixed`) a count the request or the configuration asked for, which a ready
        encoder must match. `cores` is that share (default: `threads`): parallel segments
        divide it among themselves."""
        plan = self.plan
        memfd: int | None = None
        encoder: VideoEncoder | None = None
        error: BaseException | None = None
        self._started = True
        self.threads, self.thread_type, self._fixed_threads = threads, thread_type, fixed
        self.cores = cores or threads
        if self._processes is not None and self.for_processes:
            outcome = self._run_elsewhere(self._processes, queue_s)
            if outcome is not None:
                return outcome
        try:
            encoder, memfd = self._open()
            if self._audio is not None:
                encoder.set_audio(self._audio)
            encoder.reserve_index(plan.frames_total)  # 0, for a stream: nothing reserved
            self._consume(encoder)
            encoder.close(self._check_stop)  # stops between the drain's packets too
            if self.stopped:  # gone while the encoder drained: keep nothing
                raise self.cancelled()
            t0 = time.perf_counter()
            if plan.target is not None:
                if memfd is not None:  # a short clip encoded in memory: write it out
                    self._write(memfd, plan.target)
                    os.close(memfd)
                    memfd = None
                path = str(plan.target.commit())
                size = os.stat(path).st_size
            else:
                path = ""
                size = os.fstat(memfd).st_size if memfd is not None else self._streamed
            encoder.timings.finalize += time.perf_counter() - t0
        except BaseException as exc:
            if encoder is not None:
                encoder.abort()
            if plan.target is not None:
                plan.target.discard()
            if memfd is not None:
                os.close(memfd)
            refused = not self.stopped and not isinstance(exc, Cancelled)
            if refused and (encoder is None or encoder.frames == 0):
                # Refused before reading a frame (e.g. the codec rejected an option):
                # the client keeps its leases and may fix the request and retry. A client
                # that went away gets nothing back: everything is freed below.
                self._feed.give_back_all()
            error = self.cancelled() if isinstance(exc, Cancelled) else self._classify(exc)
        finally:
            self._let_go()
            if self._checked_out is not None and self._warm is not None:
                self._warm.checkin(self._checked_out)
        if error is not None:
            # Raised here, bare: the frames of a failed encode hold views of slab memory,
            # and no traceback may keep them alive past the job.
            raise error.with_traceback(None)
        assert encoder is not None
        t = encoder.timings
        return EncodeOutcome(
            frames=encoder.frames,
            duration_s=encoder.duration,
            size_bytes=size,
            path=path,
            memfd=memfd,
            audio_samples=encoder.audio.sent if encoder.audio is not None else 0,
            timings_ms={
                "queue_ms": queue_s * 1e3,
                "open_ms": t.open * 1e3,
                "convert_ms": t.convert * 1e3,
                "encode_ms": t.encode * 1e3,
                "mux_ms": t.mux * 1e3,
                "finalize_ms": t.finalize * 1e3,
            },
        )

    def _run_elsewhere(self, processes: EncoderProcesses, queue_s: float) -> EncodeOutcome | None:
        """Encode in an encoder process (see processes); None if none is free."""
        pieces = self._feed.in_leases()
        if not pieces:
            return None
        plan, error, died = self.plan, None, False
        progress = ProgressReporter(self._emit, plan.frames_total)
        try:
            answer = self._ask(processes, pieces, progress.reach)
        except Exception as exc:  # e.g. two processes died on these frames: freed, not given back
            answer, died = Answer(error="EncodeFailed", message=str(exc)), True
        if answer is None:
            return None  # the feed is untouched: encode here
        try:
            if self.stopped:
                raise self.cancelled()
            if answer.error:
                if not answer.frames and not died:  # refused before a frame: leases go back
                    self._feed.give_back_all()
                if answer.error == "InvalidRequest":
                    raise InvalidRequest(answer.field, answer.message)
                raise EncodeFailed(answer.message)
            t0 = time.perf_counter()
            path = ""
            if plan.target is not None:
                if answer.memfd is not None:
                    self._write(answer.memfd, plan.target)
                else:
                    with open(plan.target.open_temp(), "wb") as out:
                        out.write(answer.data)
                path = str(plan.target.commit())
        except BaseException as exc:
            if plan.target is not None:
                plan.target.discard()
            error = self.cancelled() if isinstance(exc, Cancelled) else self._classify(exc)
        finally:
            self._let_go()
            if answer.memfd is not None and (error is not None or plan.target is not None):
                os.close(answer.memfd)  # written out, or not wanted: the bytes go
                answer.memfd = None
        if error is not None:
            raise error.with_traceback(None)
        progress.reach(answer.frames)
        t = {f"{stage}_ms": seconds * 1e3 for stage, seconds in answer.timings_s.items()}
        t["finalize_ms"] += (time.perf_counter() - t0) * 1e3
        return EncodeOutcome(
            frames=answer.frames,
            duration_s=float(answer.frames / plan.geometry.fps),
            size_bytes=answer.size,
            path=path,
            memfd=answer.memfd,  # a large output to send back, from the process's memfd
            audio_samples=0,
            timings_ms={"queue_ms": queue_s * 1e3, **t},
            data=None if plan.target is not None or answer.memfd is not None else answer.data,
        )

    def _ask(
        self,
        processes: EncoderProcesses,
        pieces: list[PlacedRange],
        progress: Callable[[int], None],
    ) -> Answer | None:
        """An encoder process's answer; None if none is free (encode here). A process
        that dies leaves the frames in the leases: a second one gets them, and if that
        one dies too, the request fails rather than risk the daemon on them."""
        plan = self.plan
        job = Assignment.of(
            self.key,
            plan.geometry,
            plan.codec,
            self.threads,
            self.thread_type,
            pieces,
            landed_at=plan.landed_at,
        )
        # The next request with these settings comes before the used process has opened
        # its next encoder: a short clip's encode takes about as long as an open, and a
        # long clip's next request follows its reply within a few milliseconds (it waited
        # 0.2-2.8 ms at 1344x768x122). So another process opens one now, while this encodes.
        prepare = job.preparation()
        for attempt in range(2):
            proc = processes.take(self.key, prepare)
            if proc is None:
                return None
            answer = None
            try:
                answer = proc.encode(job, progress, lambda: self.stopped)
                return answer
            except ProcessGone:
                if attempt or self.stopped:  # a cancelled request is not tried again
                    raise
            finally:
                processes.give(proc, answer.warm if answer is not None else None)
        return None

    def _consume(self, encoder: VideoEncoder) -> None:
        progress = ProgressReporter(self._emit, self.plan.frames_total)
        if self._consume_in_segments(encoder, progress):
            return
        while True:
            piece = self._feed.poll()
            if piece is None:  # nothing to encode: a stream waits holding no slot
                self.slots.release()
                piece = self._feed.get(self._cancel)
            if piece is None or not self.slots.hold():
                raise self.cancelled()
            if isinstance(piece, End):
                self._finish(encoder, piece, progress.done)
                return
            self._encode_piece(encoder, piece, progress)
            self.slots.share()

    def _encode_piece(
        self, encoder: VideoEncoder, piece: Piece, progress: ProgressReporter
    ) -> None:
        def after_each() -> None:
            progress.add(1)
            if self.stopped:
                raise self.cancelled()

        if self.stopped:
            raise self.cancelled()
        encoder.encode_all(self._landed(piece), after_each)
        # Every frame of this piece is inside the encoder: its lease can go.
        self._feed.consumed(piece)

    def _finish(self, encoder: VideoEncoder, end: End, frames: int) -> None:
        if frames == 0:  # an MP4 with no frames plays nowhere: refuse, keep nothing
            raise InvalidRequest("end", "the stream ended before its first frame")
        if end.audio is not None:
            encoder.set_audio(end.audio)

    def _consume_in_segments(self, encoder: VideoEncoder, progress: ProgressReporter) -> bool:
        """A whole video (every piece queued already) in parallel segments, when it is
        long enough and the job has the cores (see segments); False if not."""
        segments = self._segments()
        if len(segments) < 2:
            return False
        pieces, end = self._feed.drain()
        frame_at = frame_lookup([self._landed(piece) for piece in pieces])
        self._handed = 0  # a fallback below hands the same frames out again
        done = encode_segments(
            encoder, frame_at, segments, self.cores, lambda: self.stopped, progress.reach
        )
        for piece in pieces:  # every frame is encoded (or, if not, each is, now)
            if not done:
                self._encode_piece(encoder, piece, progress)
            else:
                self._feed.consumed(piece)
        self._finish(encoder, end, progress.done)
        return True

    def _landed(self, piece: Piece) -> Frames:
        """The frames of `piece`, next in the video: each handed out once it has landed."""
        frames = self._frames_of(piece)
        first, self._handed = self._handed, self._handed + len(frames)
        if self._landing is None:
            return frames
        return self._landing.gate(frames, first, self._check_stop)

    def _check_stop(self) -> None:
        if self.stopped:
            raise self.cancelled()

    def _frames_of(self, piece: Piece) -> np.ndarray:
        if isinstance(piece, InlineFrames):
            return piece.frames
        assert isinstance(piece, PlacedRange)
        # Looked up per piece: the job never keeps a view of a slab beyond its frames.
        return borrow_frames(self._slabs[piece.lease.slab_id].array, self.plan.geometry, piece)

    # -- opening -------------------------------------------------------------------------

    @property
    def warm_key(self) -> EncoderKey | None:
        """The settings this job took a ready encoder for, if it went to the warm pool."""
        return self._checked_out

    @property
    def key(self) -> EncoderKey:
        fixed = self.threads if self._fixed_threads else 0
        return EncoderKey.of(self.plan.geometry, self.plan.codec, self.thread_type, fixed)

    @property
    def for_processes(self) -> bool:
        """Whether an encoder process may take this job: an MP4 without audio, all of it
        sent at once, and not a video this job cuts into segments (those are encoded
        here, across the job's share of the cores)."""
        plan = self.plan
        if plan.container != "mp4" or plan.audio is not None or self._audio is not None:
            return False
        return plan.frames_total > 0 and len(self._segments()) < 2

    def _segments(self) -> list[tuple[int, int]]:
        plan = self.plan
        if not plan.frames_total or plan.codec.choice.encoder not in SEGMENTABLE:
            return [(0, plan.frames_total)]
        return plan_segments(plan.frames_total, self.cores, keyframe_interval(plan.codec))

    @property
    def warmable(self) -> bool:
        plan = self.plan
        return (
            self._warm is not None
            and plan.container == "mp4"
            and plan.audio is None
            and plan.frames_total > 0
            and self._warm.eligible(plan.geometry, plan.frames_total)
        )

    def _open(self) -> tuple[VideoEncoder, int | None]:
        """A ready encoder if one waits for these settings, else a fresh one."""
        plan = self.plan
        if self.warmable:
            assert self._warm is not None
            self._checked_out = self.key
            opener = opener_for(self._checked_out, plan.codec, plan.frames_total)
            t0 = time.perf_counter()
            warm = self._warm.checkout(self._checked_out, opener)
            if warm is None:
                warm = open_in_memory(plan.geometry, plan.codec, self.threads, self.thread_type)
            else:
                self.threads = warm.threads
            # What this request spent getting its encoder: nothing if one was ready, the
            # wait if one was still opening, its own open otherwise.
            warm.encoder.timings.open = time.perf_counter() - t0
            return warm.encoder, warm.memfd
        sink: str | BinaryIO
        memfd = None
        if plan.streams_bytes:
            writer = ChunkWriter(self._emit, self._chunk_size)
            self._writer = writer
            sink = writer  # type: ignore[assignment]
        elif plan.target is None:
            memfd = os.memfd_create("video-sidecar-out", os.MFD_CLOEXEC)
            sink = f"/proc/self/fd/{memfd}"
        else:
            sink = str(plan.target.open_temp())
        try:
            encoder = VideoEncoder(
                sink,
                plan.geometry,
                plan.codec,
                self.threads,
                self.thread_type,
                container=plan.container,
                audio=plan.audio,
                # Cut into segments: their encoders make the packets and the headers.
                headers_later=len(self._segments()) > 1,
            )
        except BaseException:
            if memfd is not None:
                os.close(memfd)
            raise
        return encoder, memfd

    @property
    def _streamed(self) -> int:
        return self._writer.offset if self._writer is not None else 0

    @staticmethod
    def _write(memfd: int, target: FileTarget) -> None:
        size = os.fstat(memfd).st_size
        with open(target.open_temp(), "wb") as out:
            sent = 0
            while sent < size:
                sent += os.sendfile(out.fileno(), memfd, sent, size - sent)

    def _classify(self, exc: BaseException) -> BaseException:
        if isinstance(exc, (SidecarError, KeyboardInterrupt, SystemExit)):
            return exc
        what = str(self.plan.target.final) if self.plan.target else "the output"
        if isinstance(exc, OSError) and exc.errno in OUTPUT_ERRNOS:
            return output_error(exc, what)
        if isinstance(exc, (av.error.FFmpegError, ValueError, OSError)):
            log.exception("encode %s failed", self.plan.request_id)
            return EncodeFailed(f"encoder failed: {exc}")
        log.exception("encode %s failed unexpectedly", self.plan.request_id)
        return EncodeFailed(f"unexpected {type(exc).__name__}: {exc}")
