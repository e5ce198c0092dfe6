"""An accepted request run to its result: its job scheduled, its events passed on, its
output handed back (see handback), and whatever way it ends, every lease let go once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from ...errors import OutOfRange
from ...events import Chunk, Progress
from ...pool.lease_queue import LeaseQueue
from ...pool.leases import LeaseTable
from ...pool.shm import SlabSet
from ..admission.activity import Activity
from ..admission.planner import Accepted
from ..admission.plans import EncodeOutcome
from ..admission.requests import Event
from ..output.handback import CHUNK_SIZE, OutputHandBack
from ..output.results import result_of
from ..processes.pool import EncoderProcesses
from ..status import Stats
from .jobs import EncodeJob
from .relay import relay
from .scheduler import Scheduler
from .warm import WarmPool


class Parts(Protocol):
    """The parts of the daemon an encode uses (the service wires them)."""

    slabset: SlabSet
    leases: LeaseTable
    queue: LeaseQueue
    scheduler: Scheduler
    warm: WarmPool
    processes: EncoderProcesses
    handback: OutputHandBack
    stats: Stats
    activity: Activity


class Encodes:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    async def run(
        self,
        accepted: Accepted,
        received_at: float,
        stop: threading.Event | None,
        reader: asyncio.Task[int] | None,
    ) -> AsyncIterator[Event]:
        """Run the request's job, passing its events on; the shared tail of both calls."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Progress | Chunk] = asyncio.Queue()

        def emit(event: Progress | Chunk) -> None:  # called on the encoder thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = EncodeJob(
            accepted.plan,
            self._parts.slabset.slabs,
            accepted.feed,
            emit,
            warm=self._parts.warm,
            processes=self._parts.processes,
            audio=accepted.audio,
            chunk_size=CHUNK_SIZE,
            cancel=stop,
        )
        try:
            runner = self._parts.scheduler.submit(job)
        except BaseException:
            accepted.feed.give_back_all()  # refused before it began: the client keeps them
            raise
        outcome: EncodeOutcome | None = None
        token = accepted.spec.client_token
        with self._parts.activity.encoding(token):
            try:
                async for event in relay(events, runner, reader):
                    yield event
                outcome = runner.result()
                # Closed with this call: a lease the output went into is freed at once
                # when the result never goes.
                endings = self._hand_back(accepted, job, outcome, received_at, reader)
                async with contextlib.aclosing(endings):
                    async for ending in endings:
                        yield ending
            except BaseException:
                if outcome is None:
                    # The client went away or something failed: stop the encoder, which
                    # frees (or gives back) every lease it holds; wait for it so none is
                    # left behind.
                    self._parts.activity.ended(token, accepted.spec.request_id)
                    job.stop()
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(runner)
                raise
            finally:
                if outcome is not None:
                    outcome.close()

    async def _hand_back(
        self,
        accepted: Accepted,
        job: EncodeJob,
        outcome: EncodeOutcome,
        received_at: float,
        reader: asyncio.Task[int] | None,
    ) -> AsyncGenerator[Event]:
        """The output's way back (see handback), then the result."""
        spec = accepted.spec
        handed = await self._parts.handback.hand_back(spec, outcome, reader is None)
        try:
            if handed.in_chunks:
                for offset, data in outcome.read_chunks(CHUNK_SIZE):
                    yield Chunk(offset, data)
            next_bytes = reader.result() if reader is not None else spec.next_lease_bytes
            next_lease = None
            if not handed.next_lease and next_bytes and not self._parts.queue.waiting:
                with contextlib.suppress(OutOfRange):  # no room is no spare, not an error
                    next_lease = self._parts.leases.grant(spec.client_token, next_bytes, spare=True)
            self._parts.stats.record_success(outcome.frames, outcome.size_bytes)
            # Holds the settings, not the job: nothing of it may outlive the request.
            key = job.warm_key
            after = functools.partial(self._parts.warm.answered, key) if key is not None else None
            yield result_of(accepted, outcome, received_at, handed, next_lease, after)
        except BaseException:
            if handed.lease is not None:  # the result never went: nobody will read it
                self._parts.leases.free([handed.lease])
            raise
