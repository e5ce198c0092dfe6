"""The route through an encoder process (see processes): the job's frames stay in its
leases, a process reads them there, and its answer comes back as bytes or a memfd."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

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


# Runs a call on an encode thread, awaited on the event loop.
InThread = Callable[[Callable[[], EncodeOutcome]], Awaitable[EncodeOutcome]]


class Fallback(Protocol):
    def encode(self, job: EncodeJob, queue_s: float) -> EncodeOutcome: ...


class InEncoderProcess:
    """An encode in an encoder process; in the daemon (`here`) when none is free."""

    def __init__(self, processes: EncoderProcesses, here: Fallback) -> None:
        self._processes = processes
        self._here = here

    def encode(self, job: EncodeJob, queue_s: float) -> EncodeOutcome:
        job.settle_codec()  # a whole video: raises nothing
        outcome = self._elsewhere(job, queue_s)
        if outcome is not None:
            return outcome
        job.restart_previews()  # begun for a process that then was not there
        return self._here.encode(job, queue_s)

    def _elsewhere(self, job: EncodeJob, queue_s: float) -> EncodeOutcome | None:
        """The outcome of an encode in an encoder process; None if none is free."""
        pieces = job.feed.in_leases()
        if not pieces:
            return None
        died = False
        progress = ProgressReporter(job.emit, job.plan.frames_total)
        try:
            answer = self._ask(job, pieces, progress.reach)
        except Exception as exc:  # e.g. two processes died on these frames: freed, not given back
            answer, died = Answer(error="EncodeFailed", message=str(exc)), True
        if answer is None:
            return None  # the feed is untouched: encode here
        return self._outcome(job, queue_s, answer, died, progress)

    @staticmethod
    def from_loop(job: EncodeJob) -> bool:
        """Whether `job` may be sent to its process from the event loop (`encode_from_loop`):
        a job with previews makes them from the leases while the process encodes, and one
        whose frames still land waits for the first; both want a thread."""
        return job.previews is None and job.plan.landed_at is None

    async def encode_from_loop(
        self, job: EncodeJob, queue_s: float, in_thread: InThread
    ) -> EncodeOutcome:
        """`encode`, with the event loop sending the assignment and awaiting its answer.
        For a short clip, the hand-offs to an encode thread and back were most of what the
        daemon added to the process's encode: on two cores 0.5 ms each way, and on a GPU
        host eight such threads took turns at one GIL with the loop. The measure of the
        first frame (grain) and the choice of a process run on the loop, some 0.1 ms; an
        output in a memfd is written out, and an encode that finds no process free runs,
        on an encode thread (`in_thread`)."""
        job.settle_codec()  # a whole video, landed: raises nothing, waits for nothing
        pieces = job.feed.in_leases()
        if not pieces:
            return await in_thread(functools.partial(self._here.encode, job, queue_s))
        died = False
        progress = ProgressReporter(job.emit, job.plan.frames_total)
        assignment, prepare = self._assignment(job, pieces)
        answer = None
        try:
            for attempt in range(2):
                proc = self._processes.take(job.key, prepare)
                if proc is None:
                    break
                try:
                    answer = await proc.encode_from_loop(
                        assignment, progress.reach, lambda: job.stopped
                    )
                    break
                except ProcessGone:
                    if attempt or job.stopped:  # a cancelled request is not tried again
                        raise
                finally:
                    self._processes.give(proc, answer.warm if answer is not None else None)
        except Exception as exc:  # e.g. two processes died on these frames: freed, not given back
            answer, died = Answer(error="EncodeFailed", message=str(exc)), True
        if answer is None:  # none free: the feed is untouched, encode here
            return await in_thread(functools.partial(self._here.encode, job, queue_s))
        outcome = functools.partial(self._outcome, job, queue_s, answer, died, progress)
        if answer.memfd is not None:  # a large output, written out off the loop
            return await in_thread(outcome)
        return outcome()

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

    def _ask(
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
                answer = proc.encode(assignment, progress, lambda: job.stopped)
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
