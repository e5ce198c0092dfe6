"""The scheduling of encodes: encode slots, the threads, and how many threads a job gets.

Encodes in the daemon run on threads, never on the event loop, so health and status keep
answering while a long encode runs; PyAV drops the GIL while it converts, encodes and
muxes. An encode in an encoder process is sent and awaited from the event loop itself
(see process_route): there the daemon only hands over and takes back. A job
holds one of `max_concurrent_encodes` slots while it has frames to encode, and gets a
share of the cores that depends on how many encodes run beside it.

A whole video holds its slot from start to end: every frame is in its leases already,
so it always finishes. A stream holds a slot only while it has a chunk to encode: between
chunks its encoder waits on a thread of its own, holding no slot, and gives its slot up
after a chunk when others wait for one. So a stream waiting for its next chunk (whose
lease may wait for memory that queued requests hold) never keeps those requests from
running: every slot is held by work that finishes without more memory, and each lease
an encode holds comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ...codec.threads import converts, threading_for
from ...config_values import cpu_count
from ...errors import PoolExhausted, SidecarError
from ..admission.plans import EncodeOutcome
from .jobs import EncodeJob
from .process_route import InEncoderProcess
from .routes import choose_route

# Streams at once: each has an encoder thread of its own (waiting between chunks).
MAX_STREAMS = 64
POLL_S = 0.1  # how often a stream waiting for a slot looks at its cancel flag


T = TypeVar("T")


class Scheduler:
    def __init__(self, max_concurrent: int, encoder_threads: int = 0) -> None:
        self.max_concurrent = max_concurrent
        self.encoder_threads = encoder_threads  # 0: a share of the cores
        self.active = 0
        self.queued = 0
        self._executor: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self._jobs: set[EncodeJob] = set()
        self._running: set[asyncio.Task[EncodeOutcome]] = set()
        self._abandoned = False  # closed without waiting for stuck threads
        self._stream_threads: ThreadPoolExecutor | None = None
        self.streams = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_concurrent, thread_name_prefix="encode"
        )
        self._stream_threads = ThreadPoolExecutor(
            max_workers=MAX_STREAMS, thread_name_prefix="stream"
        )
        self._slots = asyncio.Semaphore(self.max_concurrent)

    @property
    def busy(self) -> bool:
        """True while any encode is queued or running."""
        return bool(self._running)

    def submit(self, job: EncodeJob) -> asyncio.Task[EncodeOutcome]:
        """Queue `job` for a slot (a stream: start it); the task ends with its outcome or
        its error."""
        if job.is_stream:
            if self.streams >= MAX_STREAMS:
                raise PoolExhausted(
                    f"{MAX_STREAMS} streams are open already; end one, or send whole videos"
                )
            self.streams += 1
            run = self._run_stream(job)
        else:
            run = self._run(job)
        task = asyncio.create_task(run, name=f"encode-{job.plan.request_id}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        # When the client is gone nobody awaits the task's end; its error is expected.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def cancel_all(self, error: SidecarError, timeout: float) -> bool:
        """Stop every job, telling its client `error`, and wait at most `timeout` seconds
        for their threads to let go; False if some still hold on."""
        for job in list(self._jobs):
            job.stop(error)
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)
        return not self._running

    def close(self, wait: bool = True) -> None:
        """Stop the thread pool; `wait=False` leaves threads that would not stop behind."""
        self._abandoned = not wait
        for executor in (self._executor, self._stream_threads):
            if executor is not None:
                executor.shutdown(wait=wait, cancel_futures=True)

    async def _run(self, job: EncodeJob) -> EncodeOutcome:
        assert self._slots is not None
        queued_at = time.perf_counter()
        self.queued += 1
        self._jobs.add(job)
        try:
            async with self._slots:
                self.queued -= 1
                queued_at, queue_s = 0.0, time.perf_counter() - queued_at
                if job.stopped:
                    raise job.cancelled()
                self.active += 1
                try:
                    return await self._encode(job, queue_s)
                finally:
                    self.active -= 1
        finally:
            if queued_at:  # left the queue without a slot
                self.queued -= 1
            self._jobs.discard(job)
            job.abandon()  # a job that never ran still owns its leases

    async def _run_stream(self, job: EncodeJob) -> EncodeOutcome:
        self._jobs.add(job)
        try:
            job.slots = slots = StreamSlots(self, job)
            return await self._encode(job, 0.0, self._stream_threads)
        finally:
            if job.slots is slots:
                slots.release()
            self.streams -= 1
            self._jobs.discard(job)
            job.abandon()

    async def _encode(
        self, job: EncodeJob, queue_s: float, executor: ThreadPoolExecutor | None = None
    ) -> EncodeOutcome:
        """`job` on its route (see routes): through an encoder process from the event loop
        (a whole video only), every other on a thread of `executor` (the encode threads)."""
        self._settle(job)
        route = choose_route(job)
        work: asyncio.Future[EncodeOutcome]
        if isinstance(route, InEncoderProcess):
            work = asyncio.ensure_future(route.encode(job, queue_s, self._in_thread))
        else:
            run = functools.partial(route.encode, job, queue_s)
            work = asyncio.get_running_loop().run_in_executor(executor or self._executor, run)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            # Never free leases under a running encode: stop it and wait (unless the
            # daemon is leaving without it: then nothing is freed or unmapped anyway).
            job.stop()
            if not self._abandoned:
                with contextlib.suppress(BaseException):
                    await work
            raise

    def _settle(self, job: EncodeJob) -> None:
        """The job's threads, as it starts (`EncodeJob.settle`)."""
        threads, thread_type, cores = self.threading(job)
        fixed = bool(job.plan.threads or self.encoder_threads)
        job.settle(threads, thread_type, fixed=fixed, cores=cores)

    def _in_thread(self, call: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, call)

    def threading(self, job: EncodeJob) -> tuple[int, str, int]:
        """(threads, thread_type, cores) for a job: the request's or config's count, else
        what a share of the cores calls for; and the share, which segments divide."""
        # A stream's length is unknown: treat it as long (frame threads).
        frames, height = job.plan.frames_total or 1 << 20, job.plan.geometry.height
        asked = job.plan.threads or self.encoder_threads
        share = asked or cpu_count() // max(1, self.active)
        threads, thread_type = threading_for(
            frames, height, share, converts=converts(job.plan.geometry)
        )
        return (asked or threads), thread_type, share  # an explicit count is honoured as given


class StreamSlots:
    """A stream's hold on an encode slot, taken and given up from its encoder thread."""

    def __init__(self, scheduler: Scheduler, job: EncodeJob) -> None:
        self._scheduler = scheduler
        self._job = job
        self.held = False
        self.waited_s = 0.0  # in the slot queue, in all

    def hold(self) -> bool:
        """Hold a slot (waiting in turn for one); False if the job was stopped first."""
        if self.held:
            return True
        scheduler, loop = self._scheduler, self._scheduler._loop
        assert loop is not None and scheduler._slots is not None
        slots = scheduler._slots
        lock = threading.Lock()
        took = threading.Event()
        state = {"abandoned": False}
        t0 = time.perf_counter()

        async def take() -> None:
            scheduler.queued += 1
            try:
                await slots.acquire()
            finally:
                scheduler.queued -= 1
            with lock:
                if state["abandoned"]:
                    slots.release()
                    return
                scheduler.active += 1
                took.set()

        waiter = asyncio.run_coroutine_threadsafe(take(), loop)
        while not took.wait(POLL_S):
            if self._job.stopped:
                with lock:
                    if not took.is_set():
                        state["abandoned"] = True
                        with contextlib.suppress(RuntimeError):
                            loop.call_soon_threadsafe(waiter.cancel)
                        return False
                break
        self.waited_s += time.perf_counter() - t0
        self.held = True
        return True

    def release(self) -> None:
        """Give the slot up (between chunks, or at the end)."""
        if not self.held:
            return
        self.held = False
        scheduler, loop = self._scheduler, self._scheduler._loop
        assert loop is not None

        def give() -> None:
            scheduler.active -= 1
            assert scheduler._slots is not None
            scheduler._slots.release()

        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is gone
            loop.call_soon_threadsafe(give)

    def share(self) -> None:
        """After a chunk: give the slot up if others wait for one (taken again in turn)."""
        if self.held and self._scheduler.queued:
            self.release()
