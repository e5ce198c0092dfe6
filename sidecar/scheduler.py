"""Admission and scheduling: encoder slots, the thread pool, and how many threads a job gets.

Encodes run on a bounded thread pool, never on the event loop, so health and status keep
answering while a long encode runs; PyAV drops the GIL while it converts, encodes and
muxes. A job waits for one of `max_concurrent_encodes` slots, then gets a share of the
cores that depends on how many encodes run beside it.

A slot can be lent while a client with an encode in flight waits for room in the pool: a
stream holds its slot while its client waits to lease the next chunk, and the requests
queued for that slot hold the leases that would make the room. The lent slot runs one of
them; it is taken back once a slot frees after the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .config_values import cpu_count
from .encoder import converts, threading_for
from .errors import SidecarError
from .jobs import EncodeJob
from .plans import EncodeOutcome


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
        self.lent = 0  # slots lent to queued encodes while a client waits for room
        self._taking_back: set[asyncio.Task[bool]] = set()

    def start(self) -> None:
        # Room for as many lent slots as slots (see `lend`).
        self._executor = ThreadPoolExecutor(
            max_workers=2 * self.max_concurrent, thread_name_prefix="encode"
        )
        self._slots = asyncio.Semaphore(self.max_concurrent)

    @property
    def busy(self) -> bool:
        """True while any encode is queued or running."""
        return bool(self._running)

    def submit(self, job: EncodeJob) -> asyncio.Task[EncodeOutcome]:
        """Queue `job` for a slot; the task ends with its outcome or its error."""
        task = asyncio.create_task(self._run(job), name=f"encode-{job.plan.request_id}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        # When the client is gone nobody awaits the task's end; its error is expected.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def lend(self) -> Callable[[], None] | None:
        """Lend a slot to the queue while a client with an encode in flight waits for room
        in the pool; returns what gives it back, or None (nothing queued, or as many lent
        as there are slots)."""
        if self._slots is None or not self.queued or self.lent >= self.max_concurrent:
            return None
        self.lent += 1
        self._slots.release()

        def give_back() -> None:
            self.lent -= 1
            assert self._slots is not None
            task = asyncio.ensure_future(self._slots.acquire())  # the next slot to free
            self._taking_back.add(task)
            task.add_done_callback(self._taking_back.discard)

        return give_back

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
        for task in list(self._taking_back):
            task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)

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
                    return await self._run_in_thread(job, queue_s)
                finally:
                    self.active -= 1
        finally:
            if queued_at:  # left the queue without a slot
                self.queued -= 1
            self._jobs.discard(job)
            job.abandon()  # a job that never ran still owns its leases

    async def _run_in_thread(self, job: EncodeJob, queue_s: float) -> EncodeOutcome:
        threads, thread_type, cores = self.threading(job)
        fixed = bool(job.plan.threads or self.encoder_threads)
        run = functools.partial(job.run, threads, thread_type, queue_s, fixed=fixed, cores=cores)
        future = asyncio.get_running_loop().run_in_executor(self._executor, run)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Never free leases under a running thread: stop it and wait (unless the
            # daemon is leaving without it: then nothing is freed or unmapped anyway).
            job.stop()
            if not self._abandoned:
                with contextlib.suppress(BaseException):
                    await future
            raise

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
