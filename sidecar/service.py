"""The daemon's domain layer: attach, lease, release, encode, status. No gRPC here.

`Sidecar` wires the rooms below together and owns their lifecycle: the pool (slabs,
leases, the queue for room, clients), the pipeline (planner, stream intake, scheduler,
jobs, encoder processes, ready encoders, the output's way back).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from . import __version__
from .codec.ceiling import CostCeiling
from .codec.frames import Limits
from .config import Config
from .errors import (
    InvalidRequest,
    OutOfRange,
    PoolExhausted,
    ShuttingDown,
    SidecarError,
)
from .events import Chunk, Progress
from .pipeline.handback import CHUNK_SIZE, OutputHandBack
from .pipeline.intake import StreamIntake
from .pipeline.jobs import EncodeJob
from .pipeline.output import prepare_root
from .pipeline.planner import Accepted, Planner
from .pipeline.plans import EncodeOutcome
from .pipeline.processes import EncoderProcesses
from .pipeline.relay import relay
from .pipeline.requests import EncodeSpec, Event, Result, StreamMessage
from .pipeline.scheduler import Scheduler
from .pipeline.status import Attachment, Stats, StatusReport
from .pipeline.warm import WarmPool, first_encode
from .pool.clients import Clients
from .pool.lease_queue import MAX_REGIONS, LeaseQueue
from .pool.leases import Lease, LeaseTable, check_tag
from .pool.reaper import reap_expired
from .pool.shm import SlabSet

log = logging.getLogger(__name__)

# A request that ends this soon after its client's lease was refused ended for that.
REFUSAL_NOTE_S = 5.0
PROCESSES_UP_S = 15.0  # the longest the start waits for the kept encoder processes


class Sidecar:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.limits = Limits(
            max_frames=config.max_frames,
            max_width=config.max_width,
            max_height=config.max_height,
            max_request_bytes=config.max_request_bytes,
        )
        self.slabset = SlabSet(
            config.shm_dir, config.shm_prefix, config.slabs, config.slab_size, config.shm_group
        )
        self.leases = LeaseTable(
            config.slabs, config.slab_size, alignment=config.slab_alignment, ttl=config.lease_ttl
        )
        self.queue = LeaseQueue(self.leases, config.max_lease_wait)
        self.handback = OutputHandBack(self.leases, self.slabset, self.queue)
        self.output_root = Path(config.output_dir)
        self.clients = Clients()
        ceiling = CostCeiling(config.max_preset, config.max_lookahead)
        self.planner = Planner(self.leases, self.slabset, self.limits, self.output_root, ceiling)
        self.scheduler = Scheduler(config.max_concurrent_encodes, config.encoder_threads)
        self.warm = WarmPool(config.warm_encoders)
        self.processes = EncoderProcesses(config.encoder_processes, config.idle_release)
        self.stats = Stats()
        self._started_at = time.monotonic()
        self._accepting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._working: Counter[str] = Counter()  # tokens with an encode in flight
        self._waiting: Counter[str] = Counter()  # tokens waiting in the queue for room
        # A lease refused to a client with an encode in flight (when, why), and the
        # requests its client then left for that reason (request id: why), for the log.
        self._refused: dict[str, tuple[float, str]] = {}
        self.left_for_room: dict[str, str] = {}

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        prepare_root(self.output_root)
        self.slabset.open()
        self.queue.start(self._loop)
        self.leases.on_free = self.queue.freed
        self.scheduler.start()
        self.warm.start()
        self.processes.start([str(slab.path) for slab in self.slabset.slabs])
        await asyncio.to_thread(first_encode)  # while the processes start: none in a request
        # Serving once the kept processes are up: the first requests after a start find
        # them ready, and do not share the cores with their start.
        await asyncio.to_thread(self.processes.wait_started, PROCESSES_UP_S)
        self._reaper = asyncio.create_task(
            reap_expired(self.leases, self._alive, self.config.lease_ttl), name="lease-reaper"
        )
        self._accepting = True

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def busy(self) -> bool:
        """True while any encode is queued or running."""
        return self.scheduler.busy

    async def cancel_all(self, timeout: float) -> bool:
        """Stop every encode still running (its client hears that the daemon is shutting
        down); False if some encoder thread has not let go within `timeout` seconds."""
        stopped = ShuttingDown("the daemon is shutting down; this encode was stopped")
        return await self.scheduler.cancel_all(stopped, timeout)

    async def close(self) -> None:
        """Release everything: threads, slabs (unlinked), lock. Encoder threads that would
        not stop are left behind, and so are the mappings they may read: the segments are
        unlinked all the same, and the process must then exit without waiting for them."""
        self._accepting = False
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        stuck = self.scheduler.busy
        self.scheduler.close(wait=not stuck)
        self.warm.close()
        self.processes.close()
        self.slabset.close(unmap=not stuck)

    # -- clients and leases --------------------------------------------------------------

    def attach(self, name: str, pid: int) -> Attachment:
        self._check_accepting()
        token = self.clients.attach(name, pid, busy=self.leases.owners)
        log.info("client attached: name=%r pid=%d", name[:128], pid)
        return Attachment(
            client_token=token,
            instance_id=self.slabset.instance,
            shm_dir=str(self.slabset.directory),
            slabs=list(self.slabset.slabs),
            limits=self.limits,
            alignment=self.leases.alignment,
            slab_size=self.config.slab_size,
            lease_ttl=self.config.lease_ttl,
            max_lease_wait=self.config.max_lease_wait,
        )

    async def lease(self, token: str, sizes: list[int], wait: float, tag: str = "") -> list[Lease]:
        """Regions of `sizes`, granted together, waiting in the queue at most `wait`
        seconds for room (see `lease_queue`). While the daemon drains, a client with an
        encode in flight may still lease (a stream's next chunks), so that the encode
        finishes within the grace period. `tag`: the client's name for the request, to
        release its leases by if the reply is lost."""
        check_tag(tag)
        if not 1 <= len(sizes) <= MAX_REGIONS:
            raise InvalidRequest("more_sizes", f"a lease request holds 1-{MAX_REGIONS} regions")
        self.leases.check_sizes(sizes)
        if token not in self._working:
            self._check_accepting()
        self._seen(token)
        self._waiting[token] += 1
        try:
            return await self.queue.acquire(token, self.clients.name(token), sizes, wait, tag)
        except PoolExhausted as err:
            if token in self._working:  # its stream's next chunk: the stream ends for it
                self._refused[token] = (time.monotonic(), str(err))
            raise
        finally:
            self._waiting[token] -= 1
            if not self._waiting[token]:
                del self._waiting[token]

    def release(self, token: str, lease_id: str, tag: str = "") -> None:
        """Give back a lease named by its id, or by the tag of the request that granted it."""
        self._seen(token)
        if tag and not lease_id:
            check_tag(tag)
            self.leases.release_tagged(token, tag)
        elif tag:
            raise InvalidRequest("tag", "name a lease by lease_id or by tag, not both")
        else:
            self.leases.release(token, lease_id)

    def _alive(self) -> set[str]:
        """Tokens waiting on their own encode, or in the queue for room: not silent."""
        return {*self._working, *self._waiting}

    def _seen(self, token: str) -> None:
        """A call from `token`: it must be attached, and its leases stay alive."""
        self.clients.check(token)
        self.leases.renew(token)

    # -- encoding ------------------------------------------------------------------------

    async def encode(
        self, spec: EncodeSpec, received_at: float, stop: threading.Event | None = None
    ) -> AsyncIterator[Event]:
        """A whole video in leases: validate, take the leases, encode, stream events back.

        `stop`, when given, is set by the transport when the client goes away or its
        deadline passes; the encoder stops at the next frame."""
        accepted = self._accept(spec)
        async for event in self._run(accepted, received_at, stop, None):
            yield event

    async def stream(
        self,
        spec: EncodeSpec,
        messages: AsyncIterator[StreamMessage],
        received_at: float,
        stop: threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """A stream: the encoder starts on the header and takes chunks as they arrive."""
        accepted = self._accept(spec, stream=True)
        intake = StreamIntake(self.planner, accepted, self.limits)
        reader = asyncio.create_task(intake.read(messages), name=f"intake-{spec.request_id}")
        try:
            async for event in self._run(accepted, received_at, stop, reader):
                yield event
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(BaseException):
                await reader  # also retrieves an error nobody else looked at

    def _accept(self, spec: EncodeSpec, *, stream: bool = False) -> Accepted:
        self._check_accepting()
        self._seen(spec.client_token)
        return self.planner.accept(spec, stream=stream)

    async def _run(
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
            self.slabset.slabs,
            accepted.feed,
            emit,
            warm=self.warm,
            processes=self.processes,
            audio=accepted.audio,
            chunk_size=CHUNK_SIZE,
            cancel=stop,
        )
        runner = self.scheduler.submit(job)
        outcome: EncodeOutcome | None = None
        data_lease: Lease | None = None
        token = accepted.spec.client_token
        self._working[token] += 1
        try:
            async for event in relay(events, runner, reader):
                yield event
            outcome = runner.result()
            spec = accepted.spec
            inline, data_lease, in_next = await self.handback.hand_back(
                spec, outcome, reader is None
            )
            if not inline and data_lease is None:
                for offset, data in outcome.read_chunks(CHUNK_SIZE):
                    yield Chunk(offset, data)
            next_bytes = reader.result() if reader is not None else spec.next_lease_bytes
            next_lease = data_lease if in_next else None
            yield self._result(
                accepted, job, outcome, received_at, next_bytes, inline, data_lease, next_lease
            )
            data_lease = None  # the client's now
        except BaseException:
            if outcome is None:
                # The client went away or something failed: stop the encoder, which frees
                # (or gives back) every lease it holds; wait for it so none is left behind.
                self._note_refusal(token, accepted.spec.request_id)
                job.stop()
                self.stats.encodes_failed += 1
                with contextlib.suppress(BaseException):
                    await asyncio.shield(runner)
            raise
        finally:
            self._working[token] -= 1
            if not self._working[token]:
                del self._working[token]
                self._refused.pop(token, None)
            if outcome is not None:
                outcome.close()
            if data_lease is not None:  # the result never went: nobody will read it
                self.leases.free([data_lease])

    def _note_refusal(self, token: str, request_id: str) -> None:
        """A request ended right after its client's lease was refused: left for that."""
        when, why = self._refused.pop(token, (0.0, ""))
        if time.monotonic() - when < REFUSAL_NOTE_S:
            while len(self.left_for_room) >= 1024:  # read at once; bounded all the same
                del self.left_for_room[next(iter(self.left_for_room))]
            self.left_for_room[request_id] = why

    def _result(
        self,
        accepted: Accepted,
        job: EncodeJob,
        outcome: EncodeOutcome,
        received_at: float,
        next_lease_bytes: int,
        data: bytes,
        data_lease: Lease | None,
        next_lease: Lease | None = None,
    ) -> Result:
        """The result; `next_lease` when the output already went into it (else one of
        `next_lease_bytes` is granted now, if there is room)."""
        spec, plan = accepted.spec, accepted.plan
        if next_lease is None and next_lease_bytes and not self.queue.waiting:
            with contextlib.suppress(OutOfRange):  # no room is no spare, not an error
                next_lease = self.leases.grant(spec.client_token, next_lease_bytes, spare=True)
        self.stats.record_success(outcome.frames, outcome.size_bytes)
        return Result(
            request_id=spec.request_id,
            path=outcome.path,
            size_bytes=outcome.size_bytes,
            frames=outcome.frames,
            duration_s=outcome.duration_s,
            codec=plan.codec.choice.name,
            container=plan.container,
            width=plan.geometry.width,
            height=plan.geometry.height,
            audio_samples=outcome.audio_samples,
            timings_ms={
                "validate_ms": accepted.validate_ms,
                **outcome.timings_ms,
                "total_ms": (time.perf_counter() - received_at) * 1e3,
            },
            next_lease=next_lease,
            data=data,
            data_lease=data_lease,
            # Holds the settings, not the job: nothing of it may outlive the request.
            after=functools.partial(self.warm.answered, job.warm_key) if job.warm_key else None,
        )

    # -- reporting -----------------------------------------------------------------------

    def received(self) -> None:
        """An encode request came, to be taken or refused: `requests` counts them all."""
        self.stats.requests += 1

    def record_error(self, error: SidecarError) -> None:
        self.stats.record_error(error.reason)

    def status(self) -> StatusReport:
        return StatusReport(
            version=__version__,
            instance_id=self.slabset.instance,
            uptime_s=time.monotonic() - self._started_at,
            pool=self.leases.usage(),
            active_encodes=self.scheduler.active,
            queued_encodes=self.scheduler.queued,
            max_concurrent_encodes=self.config.max_concurrent_encodes,
            encoder_processes=self.processes.ready,
            clients=len(self.clients),
            stats=self.stats,
            leases_granted=self.leases.granted,
            leases_expired=self.leases.expired,
            warm_hits=self.warm.hits + self.processes.hits,
            warm_misses=self.warm.misses + self.processes.misses,
            process_encodes=self.processes.hits + self.processes.misses,
            lease_waiters=self.queue.waiters(),
            lease_queue=self.queue.stats,
        )

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise ShuttingDown("the daemon is shutting down")


__all__ = ["Attachment", "Sidecar", "StatusReport"]
