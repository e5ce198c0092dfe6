"""The daemon's domain layer: attach, lease, release, encode, status. No gRPC here.

`Sidecar` wires the rooms below together and owns their lifecycle: the pool (slabs,
leases, the queue for room, clients), the pipeline (planner, stream intake, scheduler,
jobs, encoder processes, ready encoders, the output's way back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from . import __version__
from .codec import memory
from .codec.ceiling import CostCeiling
from .codec.frames import Limits
from .config import Config
from .errors import (
    InvalidRequest,
    PoolExhausted,
    ShuttingDown,
    SidecarError,
)
from .pipeline.admission.activity import Activity
from .pipeline.admission.drain import REQUEST_ON_ITS_WAY_S, STOP_TEXT, Drain
from .pipeline.admission.intake import StreamIntake
from .pipeline.admission.planner import Accepted, Planner
from .pipeline.admission.requests import EncodeSpec, Event, StreamMessage
from .pipeline.encoding.encodes import Encodes
from .pipeline.encoding.scheduler import Scheduler
from .pipeline.encoding.warm import WarmPool, first_encode
from .pipeline.output.files import partial_tag, prepare_root, sweep_partials
from .pipeline.output.handback import OutputHandBack
from .pipeline.processes.pool import EncoderProcesses
from .pipeline.status import RELEASE_ALREADY_FREED, Attachment, Stats, StatusReport
from .pool.clients import Clients
from .pool.lease_queue import MAX_REGIONS, LeaseQueue
from .pool.leases import Lease, LeaseAlreadyFreed, LeaseTable, check_tag
from .pool.reaper import reap_expired
from .pool.shm import SlabSet

log = logging.getLogger(__name__)

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
        self.partial_tag = partial_tag(config.shm_dir, config.shm_prefix, self.slabset.instance)
        self.planner = Planner(
            self.leases,
            self.slabset,
            self.limits,
            self.output_root,
            ceiling,
            config.profile,
            self.partial_tag,
        )
        self.scheduler = Scheduler(config.max_concurrent_encodes, config.encoder_threads)
        self.warm = WarmPool(config.warm_encoders)
        self.processes = EncoderProcesses(
            config.encoder_processes, config.idle_release, config.max_concurrent_encodes
        )
        self.stats = Stats()
        self._started_at = time.monotonic()
        self._last_call = self._started_at  # a client's last call, for `idle_for`
        self._accepting = False  # started, and not closed
        self.drain = Drain()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._trimmer: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.activity = Activity()
        self.encodes = Encodes(self)
        # Requests left for a lease refused to their client (request id: why), for the log.

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        prepare_root(self.output_root)
        self.slabset.open()  # holds the prefix: partial files of another instance are dead
        self._sweeper = asyncio.create_task(self._sweep_partials(), name="partials-sweep")
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
            reap_expired(self.leases, self.activity.alive, self.config.lease_ttl),
            name="lease-reaper",
        )
        # Memory given back when idle, and ready encoders closed (--idle-release).
        self._trimmer = asyncio.create_task(
            memory.trim_when_idle(
                lambda: self.busy,
                lambda: self.stats.requests,
                release=self.warm.close_ready,
                release_s=self.config.idle_release,
            ),
            name="memory-trimmer",
        )
        self._accepting = True

    async def _sweep_partials(self) -> None:
        """Remove the partial files a killed instance left in the output root, off the
        loop: a large root takes a while to walk."""
        try:
            removed = await asyncio.to_thread(sweep_partials, self.output_root, self.partial_tag)
        except OSError as exc:
            log.warning("could not look for partial files of a dead instance: %s", exc)
            return
        if removed:
            shown = ", ".join(repr(name[:120]) for name in removed[:5])
            more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
            log.warning(
                "removed %d partial files a killed instance left: %s%s", len(removed), shown, more
            )

    def begin_drain(self) -> None:
        """Take no new work from now on; finish what is in flight (see `drain`)."""
        self.drain.begin()

    @property
    def busy(self) -> bool:
        """True while any encode is queued or running."""
        return self.scheduler.busy

    @property
    def in_flight(self) -> bool:
        """True while work a stop waits for remains: an encode queued or running, a Lease
        waiting for room, or leases on their way into a request."""
        return (
            self.scheduler.busy
            or self.queue.waiting
            or self.leases.on_their_way(REQUEST_ON_ITS_WAY_S)
        )

    async def cancel_all(self, timeout: float) -> bool:
        """Stop every encode still running and refuse every Lease still waiting for room
        (their clients hear that the daemon is shutting down); False if some encoder
        thread has not let go within `timeout` seconds."""
        stopped = self.drain.stopped()
        self.queue.refuse_all(stopped)
        return await self.scheduler.cancel_all(stopped, timeout)

    async def close(self) -> None:
        """Release everything: threads, slabs (unlinked), lock. Encoder threads that would
        not stop are left behind, and so are the mappings they may read: the segments are
        unlinked all the same, and the process must then exit without waiting for them."""
        self._accepting = False
        for task in (self._reaper, self._trimmer, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        stuck = self.scheduler.busy
        self.scheduler.close(wait=not stuck)
        self.warm.close()
        self.processes.close()
        self.slabset.close(unmap=not stuck)

    # -- clients and leases --------------------------------------------------------------

    def attach(self, name: str, pid: int) -> Attachment:
        self._check_accepting()
        self.drain.check_attach()
        token = self.clients.attach(name, pid, busy=self.leases.owners)
        self._last_call = time.monotonic()
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
        seconds for room (see `lease_queue`). While the daemon drains, a client with work
        in flight may still lease (see `drain`). `tag`: the client's name for the request,
        to release its leases by if the reply is lost."""
        check_tag(tag)
        if not 1 <= len(sizes) <= MAX_REGIONS:
            raise InvalidRequest("more_sizes", f"a lease request holds 1-{MAX_REGIONS} regions")
        self.leases.check_sizes(sizes)
        self._check_accepting()
        if self.drain.draining:
            holding = self.leases.on_their_way(REQUEST_ON_ITS_WAY_S, token)
            self.drain.check_lease(working=self.activity.working(token), holding=holding)
        self._seen(token)
        with self.activity.waiting(token):
            try:
                return await self.queue.acquire(token, self.clients.name(token), sizes, wait, tag)
            except PoolExhausted as err:
                self.activity.refused(token, str(err))
                raise

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

    def free_unread(self, lease_id: str) -> None:
        """A lease handed over in a reply its client cannot have read (the framed
        connection ended first): freed, unless the client has used or released it."""
        self.leases.free_unused(lease_id)

    def on_lease_wait(self, observe: Callable[[float], None]) -> None:
        """Call `observe` with the seconds of each lease request that waited for room."""
        self.queue.observe = observe

    def room_wait_ended(self, request_id: str) -> str | None:
        """Why a request's client stopped waiting for room (its lease wait ran out), once;
        None if it did not."""
        return self.activity.left_for_room.pop(request_id, None)

    def _seen(self, token: str) -> None:
        """A call from `token`: it must be attached, and its leases stay alive."""
        self.clients.check(token)
        self.leases.renew(token)
        self._last_call = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since a client last attached, leased, released or sent an encode, with
        nothing encoding or waiting for room since; 0 while anything is (`--idle-exit`)."""
        if self.busy or self.queue.waiters():
            self._last_call = time.monotonic()
        return time.monotonic() - self._last_call

    # -- encoding ------------------------------------------------------------------------

    async def encode(
        self, spec: EncodeSpec, received_at: float, stop: threading.Event | None = None
    ) -> AsyncIterator[Event]:
        """A whole video in leases: validate, take the leases, encode, stream events back.

        `stop`, when given, is set by the transport when the client goes away or its
        deadline passes; the encoder stops at the next frame."""
        accepted = self._accept(spec)
        async for event in self.encodes.run(accepted, received_at, stop, None):
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
            async for event in self.encodes.run(accepted, received_at, stop, reader):
                yield event
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(BaseException):
                await reader  # also retrieves an error nobody else looked at

    def _accept(self, spec: EncodeSpec, *, stream: bool = False) -> Accepted:
        self._check_accepting()
        holding = (
            stream
            and self.drain.draining
            and self.leases.on_their_way(REQUEST_ON_ITS_WAY_S, spec.client_token)
        )
        self.drain.check_encode(leases=len(spec.video.ranges), stream=stream, holding=holding)
        self._seen(spec.client_token)
        return self.planner.accept(spec, stream=stream)

    # -- reporting -----------------------------------------------------------------------

    def received(self) -> None:
        """An encode request came, to be taken or refused: `requests` counts them all."""
        self.stats.requests += 1

    def ended(self, status: str) -> None:
        """An encode request ended with `status` (OK, CANCELLED, or its error's code)."""
        self.stats.record_end(status)

    def record_error(self, error: SidecarError) -> None:
        """A call answered with `error`: counted as an error, or as the routine it is."""
        if isinstance(error, LeaseAlreadyFreed):
            self.stats.record_routine(RELEASE_ALREADY_FREED)
        else:
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
            live_clients=self.clients.live(
                self.config.lease_ttl, self.leases.owners() | self.activity.alive()
            ),
            clients_attached=len(self.clients),
            stats=self.stats,
            leases_granted=self.leases.granted,
            leases_expired=self.leases.expired,
            spares_expired=self.leases.spares_expired,
            warm_hits=self.warm.hits + self.processes.hits,
            warm_misses=self.warm.misses + self.processes.misses,
            process_encodes=self.processes.hits + self.processes.misses,
            lease_waiters=self.queue.waiters(),
            lease_queue=self.queue.stats,
            output_dir=str(self.output_root.resolve()),
            shm_dir=str(self.slabset.directory),
            shm_prefix=self.config.shm_prefix,
        )

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise ShuttingDown(f"{STOP_TEXT}: it takes no new work")


__all__ = ["Attachment", "Sidecar", "StatusReport"]
