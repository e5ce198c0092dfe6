"""The daemon's domain layer: attach, lease, release, encode, status. No gRPC here.

`Sidecar` owns the slabs, the lease table and the encoder threads. Encodes run on a
bounded thread pool, never on the event loop, so health and status keep answering while
a long encode runs; PyAV drops the GIL while it converts, encodes and muxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import __version__
from .audio import AudioFormat
from .config import Config, cpu_count
from .encoder import CONTAINERS, threading_for
from .errors import (
    Cancelled,
    InvalidRequest,
    NotAttached,
    OutOfRange,
    PoolExhausted,
    ShuttingDown,
    StartupError,
)
from .feed import FrameFeed, InlineAssembler, Piece
from .frames import Limits, PlacedRange, check_geometry, place_range, place_ranges
from .jobs import Chunk, EncodeJob, EncodeOutcome, EncodePlan, Progress
from .leases import Lease, LeaseTable, PoolUsage
from .output import FileTarget
from .requests import (
    AudioPiece,
    EncodeSpec,
    Event,
    LeaseChunk,
    Result,
    StreamEnd,
    StreamMessage,
)
from .shm import Slab, SlabSet
from .warm import WarmPool, warm_up

log = logging.getLogger(__name__)

CHUNK_SIZE = 1024 * 1024  # bytes outputs travel in pieces well under gRPC's 4 MiB limit
MAX_CLIENTS = 4096


@dataclass(frozen=True)
class Attachment:
    client_token: str
    instance_id: str
    shm_dir: str
    slabs: list[Slab]
    limits: Limits
    alignment: int
    slab_size: int
    lease_ttl: float
    max_lease_wait: float


@dataclass
class ClientInfo:
    name: str
    pid: int
    attached_at: float


@dataclass
class Stats:
    requests: int = 0
    encodes_ok: int = 0
    encodes_failed: int = 0
    frames_encoded: int = 0
    bytes_out: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class StatusReport:
    version: str
    instance_id: str
    uptime_s: float
    pool: PoolUsage
    active_encodes: int
    queued_encodes: int
    max_concurrent_encodes: int
    clients: int
    stats: Stats
    leases_granted: int
    leases_expired: int
    warm_hits: int = 0
    warm_misses: int = 0


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
            config.slabs,
            config.slab_size,
            alignment=config.slab_alignment,
            ttl=config.lease_ttl,
        )
        self.output_root = Path(config.output_dir)
        self.warm = WarmPool(config.warm_encoders)
        self._warm_executor: ThreadPoolExecutor | None = None
        self.stats = Stats()
        self._clients: dict[str, ClientInfo] = {}
        self._started_at = time.monotonic()
        self._accepting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._freed: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self._running: set[asyncio.Task[EncodeOutcome]] = set()
        self._jobs: set[EncodeJob] = set()
        self._active = 0
        self._queued = 0
        self._reaper: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._freed = asyncio.Event()
        self._prepare_output_root()
        self.slabset.open()
        self.leases.on_free = self._wake_waiters
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.max_concurrent_encodes, thread_name_prefix="encode"
        )
        self._slots = asyncio.Semaphore(self.config.max_concurrent_encodes)
        self._warm_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm")
        self._reaper = asyncio.create_task(self._reap_expired(), name="lease-reaper")
        self._accepting = True

    def _prepare_output_root(self) -> None:
        try:
            self.output_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(
                f"cannot create output directory {self.output_root}: {exc}"
            ) from None
        if not os.access(self.output_root, os.W_OK | os.X_OK):
            raise StartupError(f"output directory {self.output_root} is not writable")

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def busy(self) -> bool:
        """True while any encode is queued or running."""
        return bool(self._running)

    async def cancel_all(self) -> None:
        """Cancel every encode still running and wait for their threads to let go."""
        for job in list(self._jobs):
            job.cancel.set()
        if self._running:
            await asyncio.wait(set(self._running), timeout=30)

    async def close(self) -> None:
        """Release everything: threads, slabs (unlinked), lock."""
        self._accepting = False
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._warm_executor is not None:
            self._warm_executor.shutdown(wait=True, cancel_futures=True)
        self.warm.close()
        self.slabset.close()

    # -- clients and leases --------------------------------------------------------------

    def attach(self, name: str, pid: int) -> Attachment:
        self._check_accepting()
        if len(self._clients) >= MAX_CLIENTS:
            self._forget_idle_clients()
        token = secrets.token_hex(16)
        self._clients[token] = ClientInfo(name[:128], pid, time.time())
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

    def _forget_idle_clients(self) -> None:
        busy = self.leases.owners()
        oldest = sorted(
            (t for t in self._clients if t not in busy), key=lambda t: self._clients[t].attached_at
        )
        for token in oldest[: len(oldest) // 2 + 1]:
            del self._clients[token]

    def check_client(self, token: str) -> None:
        if token not in self._clients:
            raise NotAttached("unknown client token; call Attach (the daemon may have restarted)")

    async def lease(self, token: str, size: int, wait: float) -> Lease:
        """Grant a lease, waiting at most `wait` seconds (capped) for room."""
        self._check_accepting()
        self.check_client(token)
        assert self._freed is not None
        deadline = time.monotonic() + max(0.0, min(wait, self.config.max_lease_wait))
        while True:
            self._freed.clear()
            lease = self.leases.grant(token, size)
            if lease is not None:
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                usage = self.leases.usage()
                raise PoolExhausted(
                    f"no room for {size} bytes within the wait: {usage.leased_bytes} of "
                    f"{usage.total_bytes} bytes leased, largest free region {usage.largest_free}"
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._freed.wait(), remaining)

    def release(self, token: str, lease_id: str) -> None:
        self.check_client(token)
        self.leases.release(token, lease_id)

    def _wake_waiters(self) -> None:
        # Called from encoder threads as well as the loop.
        loop, freed = self._loop, self._freed
        if loop is not None and freed is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed at shutdown
                loop.call_soon_threadsafe(freed.set)

    async def _reap_expired(self) -> None:
        interval = min(1.0, self.config.lease_ttl / 4)
        while True:
            await asyncio.sleep(interval)
            expired = [lease for lease in self.leases.expire() if not lease.spare]
            if expired:  # an unused spare lease expiring is normal; these were written to
                log.warning(
                    "reclaimed %d expired leases (clients gone or silent for %.0fs)",
                    len(expired),
                    self.config.lease_ttl,
                )

    # -- encoding ------------------------------------------------------------------------

    def plan(
        self, spec: EncodeSpec, *, stream: bool = False
    ) -> tuple[EncodePlan, list[PlacedRange]]:
        """Check a request (or a stream's header) completely, touching no memory and
        taking no lease; returns the plan and where each range's frames lie."""
        self.check_client(spec.client_token)
        v = spec.video
        geometry = check_geometry(v.width, v.height, v.pixel_format, v.fps, self.limits)
        if spec.container not in CONTAINERS:
            raise InvalidRequest("output.container", f"unknown container {spec.container!r}")
        codec = spec.codec.resolve(spec.container)
        audio = spec.audio.check() if spec.audio is not None else None
        if spec.audio_data and audio is None:
            raise InvalidRequest("audio_data", "audio samples sent without an audio format")
        frames_total = 0
        ranges: list[PlacedRange] = []
        if not stream:
            leases = {
                r.lease_id: self.leases.lookup(spec.client_token, r.lease_id) for r in v.ranges
            }
            ranges = place_ranges(geometry, list(v.ranges), leases, self.limits)
            frames_total = sum(r.frame_count for r in ranges)
        target = None
        if spec.path is not None:
            target = FileTarget.prepare(self.output_root, spec.path, spec.overwrite)
        plan = EncodePlan(
            spec.request_id,
            geometry,
            codec,
            target,
            spec.codec.threads,
            container=spec.container,
            audio=audio,
            frames_total=frames_total,
        )
        return plan, ranges

    async def encode(
        self, spec: EncodeSpec, received_at: float, stop: threading.Event | None = None
    ) -> AsyncIterator[Event]:
        """A whole video in leases: validate, take the leases, encode, stream events back."""
        self._check_accepting()
        self.stats.requests += 1
        t0 = time.perf_counter()
        plan, ranges = self.plan(spec)
        audio, audio_leases = self._audio_samples(spec.client_token, plan.audio, spec.audio_data)
        # All or nothing: no lease changes hands unless every one the request names can.
        taken = [r.lease.id for r in ranges] + [lease.id for lease in audio_leases]
        self.leases.take(spec.client_token, taken)
        feed = FrameFeed(self.leases)
        for placed in ranges:
            feed.put(placed)
        feed.hold(audio_leases)
        feed.end()
        validate_ms = (time.perf_counter() - t0) * 1e3
        async for event in self._execute(
            spec, plan, feed, audio, received_at, validate_ms, stop=stop
        ):
            yield event

    async def stream(
        self,
        spec: EncodeSpec,
        messages: AsyncIterator[StreamMessage],
        received_at: float,
        stop: threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """A stream: the encoder starts on the header and takes chunks as they arrive."""
        self._check_accepting()
        self.stats.requests += 1
        t0 = time.perf_counter()
        plan, _ = self.plan(spec, stream=True)
        audio, audio_leases = self._audio_samples(spec.client_token, plan.audio, spec.audio_data)
        self.leases.take(spec.client_token, [lease.id for lease in audio_leases])
        feed = FrameFeed(self.leases)
        feed.hold(audio_leases)
        validate_ms = (time.perf_counter() - t0) * 1e3
        ending: dict[str, int] = {}
        reader = asyncio.create_task(self._read_stream(spec, plan, feed, messages, ending))
        try:
            async for event in self._execute(
                spec, plan, feed, audio, received_at, validate_ms, reader, ending, stop
            ):
                yield event
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(BaseException):
                await reader  # also retrieves an error nobody else looked at

    async def _read_stream(
        self,
        spec: EncodeSpec,
        plan: EncodePlan,
        feed: FrameFeed,
        messages: AsyncIterator[StreamMessage],
        ending: dict[str, int],
    ) -> None:
        """Check each chunk against its lease, take it, and queue it for the encoder."""
        token, geometry = spec.client_token, plan.geometry
        frame_bytes = geometry.layout.frame_bytes(geometry.width, geometry.height)
        assembler = InlineAssembler(geometry.layout.frame_shape(geometry.width, geometry.height))
        frames = 0
        index = 0
        async for message in messages:
            if isinstance(message, StreamEnd):
                if assembler.leftover:
                    raise InvalidRequest(
                        "chunk.inline", f"{assembler.leftover} bytes left over: not a whole frame"
                    )
                audio, audio_leases = self._audio_samples(token, plan.audio, message.audio_data)
                # A lease this stream's chunks already hold is freed with those chunks.
                mine = [lease for lease in audio_leases if not lease.encoding]
                self.leases.take(token, [lease.id for lease in mine])
                feed.hold(mine)
                ending["next_lease_bytes"] = message.next_lease_bytes
                feed.end(audio)
                return
            if isinstance(message, LeaseChunk):
                lease = self.leases.lookup(token, message.range.lease_id)
                placed = place_range(geometry, message.range, lease, f"chunks[{index}]")
                self.leases.take(token, [lease.id])
                piece: Piece = placed
                count = placed.frame_count
            else:
                inline = assembler.add(message.data)
                if inline is None:
                    continue
                piece, count = inline, len(inline.frames)
                await feed.wait_for_room(count * frame_bytes)
            frames += count
            if frames > self.limits.max_frames:
                feed.put(piece)  # owned now: freed with the rest
                raise OutOfRange(f"more than {self.limits.max_frames} frames in one stream")
            feed.put(piece)
            index += 1
        raise InvalidRequest("end", "the stream ended without an end message")

    async def _execute(
        self,
        spec: EncodeSpec,
        plan: EncodePlan,
        feed: FrameFeed,
        audio: np.ndarray | None,
        received_at: float,
        validate_ms: float,
        reader: asyncio.Task[None] | None = None,
        ending: dict[str, int] | None = None,
        stop: threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run a job, relaying its events; the shared tail of `encode` and `stream`.

        `stop`, when given, is the job's cancel flag: the transport sets it when the
        client goes away or its deadline passes, and the encoder stops at the next frame.
        """
        loop = self._loop
        assert loop is not None
        events: asyncio.Queue[Progress | Chunk] = asyncio.Queue()

        def emit(event: Progress | Chunk) -> None:  # called on the encoder thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = EncodeJob(
            plan,
            self.slabset.slabs,
            feed,
            emit,
            self.warm,
            audio=audio,
            chunk_size=CHUNK_SIZE,
        )
        if stop is not None:
            job.cancel = stop
        runner = asyncio.create_task(self._run(job), name=f"encode-{spec.request_id}")
        self._running.add(runner)
        runner.add_done_callback(self._running.discard)
        # When the client is gone nobody awaits the runner's end; its error is expected.
        runner.add_done_callback(lambda task: task.cancelled() or task.exception())
        outcome: EncodeOutcome | None = None
        finished = False
        try:
            watch = {runner} if reader is None else {runner, reader}
            while not runner.done():
                getter = asyncio.ensure_future(events.get())
                try:
                    done, _ = await asyncio.wait(
                        {getter, *watch}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    if not getter.done():
                        getter.cancel()
                if getter.done() and not getter.cancelled():
                    yield getter.result()
                if reader is not None and reader in done:
                    watch.discard(reader)
                    if reader.exception() is not None:
                        raise reader.exception()  # type: ignore[misc]
            while not events.empty():
                yield events.get_nowait()
            outcome = runner.result()
            for offset, data in outcome.read_chunks(CHUNK_SIZE):
                yield Chunk(offset, data)
            timings = {
                "queue_ms": job.queue_s * 1e3,
                "validate_ms": validate_ms,
                **outcome.timings_ms,
                "total_ms": (time.perf_counter() - received_at) * 1e3,
            }
            next_lease = None
            next_bytes = ending.get("next_lease_bytes", 0) if ending else spec.next_lease_bytes
            if next_bytes:
                with contextlib.suppress(OutOfRange):
                    next_lease = self.leases.grant(spec.client_token, next_bytes, spare=True)
            finished = True
            self.stats.encodes_ok += 1
            self.stats.frames_encoded += outcome.frames
            self.stats.bytes_out += outcome.size_bytes
            yield Result(
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
                timings_ms=timings,
                next_lease=next_lease,
                after=self._prepare_next(job) if job.warmable else None,
            )
        except BaseException:
            if not finished:
                # The client went away or something failed: stop the encoder, which frees
                # (or gives back) every lease it holds; wait for it so none is left behind.
                job.cancel.set()
                self.stats.encodes_failed += 1
                with contextlib.suppress(BaseException):
                    await asyncio.shield(runner)
            raise
        finally:
            if outcome is not None:
                outcome.close()

    def _audio_samples(
        self, token: str, fmt: AudioFormat | None, pieces: tuple[AudioPiece, ...]
    ) -> tuple[np.ndarray | None, list[Lease]]:
        """Join audio pieces (inline or in leases) into (samples, channels) float32.

        Copies the samples out and returns the leases they came from, untouched: the
        caller takes them with the rest of the request, all or nothing."""
        if not pieces:
            return None, []
        if fmt is None:
            raise InvalidRequest("audio_data", "audio samples sent without an audio format")
        parts: list[bytes] = []
        used: list[Lease] = []
        for index, piece in enumerate(pieces):
            if isinstance(piece, bytes):
                parts.append(piece)
                continue
            lease = self.leases.lookup(token, piece.lease_id)
            where = f"audio_data[{index}]"
            if piece.offset < 0 or piece.size < 0 or piece.offset + piece.size > lease.size:
                raise InvalidRequest(where, f"[{piece.offset}, +{piece.size}) is outside the lease")
            start = lease.offset + piece.offset
            parts.append(
                self.slabset.slabs[lease.slab_id].array[start : start + piece.size].tobytes()
            )
            used.append(lease)
        return fmt.samples(b"".join(parts)), list({lease.id: lease for lease in used}.values())

    async def _run(self, job: EncodeJob) -> EncodeOutcome:
        """Wait for an encoder slot, then run the job on the thread pool."""
        assert self._slots is not None and self._loop is not None
        queued_at = time.perf_counter()
        queued = True
        self._queued += 1
        self._jobs.add(job)
        try:
            async with self._slots:
                self._queued -= 1
                queued = False
                job.queue_s = time.perf_counter() - queued_at
                if job.cancel.is_set():
                    raise Cancelled("cancelled while waiting for an encoder")
                self._active += 1
                try:
                    job.threads, job.thread_type = self._threading(job)
                    future = self._loop.run_in_executor(self._executor, job.run)
                    try:
                        outcome = await asyncio.shield(future)
                    except asyncio.CancelledError:
                        # Never free leases under a running thread: stop it and wait.
                        job.cancel.set()
                        with contextlib.suppress(BaseException):
                            await future
                        raise
                    return outcome
                finally:
                    self._active -= 1
        finally:
            if queued:
                self._queued -= 1
            self._jobs.discard(job)
            if not job.started:  # a job that never ran still owns its leases
                job.feed.release_all()

    def _prepare_next(self, job: EncodeJob) -> Callable[[], None]:
        """What opens the next encoder for these settings in the background; it holds the
        settings only, not the job (whose slab views must not outlive it)."""
        geometry, codec, key = job.plan.geometry, job.plan.codec, job.key
        threads, thread_type = job.threads, job.thread_type

        def open_next() -> None:
            if self._warm_executor is not None:
                self._warm_executor.submit(
                    self.warm.fill, key, lambda: warm_up(geometry, codec, threads, thread_type)
                )

        return open_next

    def _threading(self, job: EncodeJob) -> tuple[int, str]:
        """Threads for a job: the request's or config's count, else a share of the cores."""
        # A stream's length is unknown: treat it as long (frame threads).
        frames, height = job.plan.frames_total or 1 << 20, job.plan.geometry.height
        share = job.threads or self.config.encoder_threads or cpu_count() // max(1, self._active)
        threads, thread_type = threading_for(frames, height, share)
        if job.threads or self.config.encoder_threads:
            threads = share  # an explicit count is honoured as given
        return threads, thread_type

    # -- reporting -----------------------------------------------------------------------

    def status(self) -> StatusReport:
        return StatusReport(
            version=__version__,
            instance_id=self.slabset.instance,
            uptime_s=time.monotonic() - self._started_at,
            pool=self.leases.usage(),
            active_encodes=self._active,
            queued_encodes=self._queued,
            max_concurrent_encodes=self.config.max_concurrent_encodes,
            clients=len(self._clients),
            stats=self.stats,
            leases_granted=self.leases.granted,
            leases_expired=self.leases.expired,
            warm_hits=self.warm.hits,
            warm_misses=self.warm.misses,
        )

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise ShuttingDown("the daemon is shutting down")


__all__ = ["Attachment", "Sidecar", "StatusReport"]
