"""The route through an encoder process (see processes): the job's frames stay in its
leases, a process reads them there, and its answer comes back as bytes or a memfd."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ...codec.frames import PlacedRange
from ...errors import EncodeFailed, InvalidRequest
from ...events import ProgressReporter
from ..admission.plans import EncodeOutcome
from ..admission.requests import PreviewImage
from ..output.sinks import Made
from ..processes.handle import ProcessGone
from ..processes.main import Answer, Assignment, Prepare
from ..processes.pool import EncoderProcesses

if TYPE_CHECKING:
    from .jobs import EncodeJob


T = TypeVar("T")


class InThread(Protocol):
    """Runs a call on an encode thread, awaited on the event loop."""

    def __call__(self, call: Callable[[], T]) -> Awaitable[T]: ...


class Fallback(Protocol):
    def encode(self, job: EncodeJob, queue_s: float) -> EncodeOutcome: ...


class InEncoderProcess:
    """An encode in an encoder process, sent and awaited from the event loop; in the
    daemon (`here`, on an encode thread) when none is free.

    The loop only hands over and takes back: the frames' first measure (grain) and the
    choice of a process, some 0.1 ms; what may wait or work longer runs on an encode
    thread (`in_thread`): the first frame's landing, a large output written out of its
    memfd, the previews' images, an encode in the daemon. A thread waiting on the
    process in between cost a hand-off each way, and eight such threads took turns at
    the GIL with the loop: without them, eight clients' requests spent 5.5-6.6 ms in
    the daemon instead of 8.3-11.1 (H100), and a 448x256x4 request on two cores about
    2 ms less (bench/results/2026-12-07-*-loop-route.md)."""

    def __init__(self, processes: EncoderProcesses, here: Fallback) -> None:
        self._processes = processes
        self._here = here

    async def encode(self, job: EncodeJob, queue_s: float, in_thread: InThread) -> EncodeOutcome:
        if job.plan.landed_at is None:
            job.settle_codec()  # a whole video, landed: raises nothing, waits for nothing
        else:
            await in_thread(job.settle_codec)  # waits for the first frame
        pieces = job.feed.in_leases()
        answer, died = None, False
        progress = ProgressReporter(job.emit, job.plan.frames_total)
        if pieces:
            try:
                answer = await self._ask(job, pieces, progress.reach)
            except Exception as exc:  # e.g. two processes died on these frames: freed
                answer, died = Answer(error="EncodeFailed", message=str(exc)), True
        if answer is None:  # none free: the feed is untouched, encode here
            return await in_thread(functools.partial(self._encode_here, job, queue_s))
        outcome = functools.partial(self._outcome, job, queue_s, answer, died, progress)
        if answer.memfd is not None or job.previews is not None:
            return await in_thread(outcome)
        return outcome()

    def _encode_here(self, job: EncodeJob, queue_s: float) -> EncodeOutcome:
        job.restart_previews()  # begun for a process that then was not there
        return self._here.encode(job, queue_s)

    def _outcome(
        self,
        job: EncodeJob,
        queue_s: float,
        answer: Answer,
        died: bool,
        progress: ProgressReporter,
    ) -> EncodeOutcome:
        """The encode's outcome from the process's answer, its output in its sink."""
        t0 = time.perf_counter()
        made, images = self._finish(job, answer, died)
        progress.reach(answer.frames)
        t = {f"{stage}_ms": seconds * 1e3 for stage, seconds in answer.timings_s.items()}
        t["finalize_ms"] += (time.perf_counter() - t0) * 1e3
        return EncodeOutcome(
            frames=answer.frames,
            duration_s=float(answer.frames / job.plan.geometry.fps),
            size_bytes=made.size,
            path=made.path,
            memfd=made.memfd,  # a large output to send back, from the process's memfd
            audio_samples=0,
            timings_ms={"queue_ms": queue_s * 1e3, **t, "previews_ms": job.previews_ms},
            data=made.data,
            previews=images,
        )

    @staticmethod
    def _finish(job: EncodeJob, answer: Answer, died: bool) -> tuple[Made, list[PreviewImage]]:
        """The answer's output, in its sink, and the previews (made beside the process's
        encode from the same leases); else the error its client is told, raised bare.
        Every lease is let go."""
        made: Made | None = None
        error: BaseException | None = None
        try:
            job.check_stop()
            if answer.error:
                if not answer.frames and not died:  # refused before a frame: leases go back
                    job.feed.give_back_all()
                if answer.error == "InvalidRequest":
                    raise InvalidRequest(answer.field, answer.message)
                raise EncodeFailed(answer.message)
            made, images = job.finish(answer.memfd, answer.data)
            return made, images
        except BaseException as exc:
            job.sink.discard()
            error = job.failure(exc)
        finally:
            job.let_go()
            if answer.memfd is not None and (made is None or made.memfd is None):
                os.close(answer.memfd)  # written out, or not wanted: the bytes go
                answer.memfd = None
        raise error.with_traceback(None)

    async def _ask(
        self, job: EncodeJob, pieces: list[PlacedRange], progress: Callable[[int], None]
    ) -> Answer | None:
        """An encoder process's answer; None if none is free (encode here). A process
        that dies leaves the frames in the leases: a second one gets them, and if that
        one dies too, the request fails rather than risk the daemon on them."""
        assignment, prepare = self._assignment(job, pieces)
        for attempt in range(2):
            proc = self._processes.take(assignment.key, prepare)
            if proc is None:
                return None
            if not attempt:  # the previews read the leases while the process does
                for piece in pieces:
                    job.see(piece)
            answer = None
            try:
                answer = await proc.encode(assignment, progress, lambda: job.stopped)
                return answer
            except ProcessGone:
                if attempt or job.stopped:  # a cancelled request is not tried again
                    raise
            finally:
                self._processes.give(proc, answer.warm if answer is not None else None)
        return None

    @staticmethod
    def _assignment(job: EncodeJob, pieces: list[PlacedRange]) -> tuple[Assignment, Prepare]:
        """What the process is sent, and what another is sent to open an encoder for the
        next such request. The next request with these settings comes before the used
        process has opened its next encoder: a short clip's encode takes about as long as
        an open, and a long clip's next request follows its reply within a few
        milliseconds (it waited 0.2-2.8 ms at 1344x768x122). So another process opens
        one now, while this encodes."""
        plan = job.plan
        assignment = Assignment.of(
            job.key,
            plan.geometry,
            plan.codec,
            job.threads,
            job.thread_type,
            pieces,
            landed_at=plan.landed_at,
        )
        return assignment, assignment.preparation()
