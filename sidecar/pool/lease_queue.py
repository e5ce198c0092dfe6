"""The queue for room in the pool: each request's regions granted whole, in turn.

A Lease request that finds no room joins one queue and holds nothing while it waits.
Whenever memory is freed the queue is served from its head, each waiter's regions all at
once, and it stops at the first that does not fit: nobody is served before an earlier
waiter, so a large request is never starved by a stream of small ones. Together with the
client leasing everything a request needs in one call, this rules out the hold-and-wait
deadlock in which several clients each hold part of what they need and wait for the rest.

A waiter leaves the queue
- with its regions, when they fit and every waiter ahead of it has been served;
- refused "wait", when its own wait (the client's deadline) is over;
- refused "stall", when nothing in the pool has moved for `max_wait` (and it has
  waited as long): no lease freed and none held by an encode, so the memory is held by
  clients that are not using it (leases taken by hand and kept, or clients that hang).
  A queue behind moving traffic never times out on this timer, however long it is;
- "cancelled", when its client goes away.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import PoolExhausted, SidecarError
from ..vocabulary import STALL_TEXT
from .leases import Lease, LeaseTable

log = logging.getLogger(__name__)

MAX_REGIONS = 1024  # regions in one request, counted before anything is built from them

# What a refused request's client can do about it, by why it was refused.
FIXES = {
    "stall": (
        "give back leases you hold (taken with lease() and kept), stop a client that hangs "
        "holding them, or start the daemon with a larger pool (--slabs, --slab-size) or a "
        "longer --max-lease-wait"
    ),
    "wait": (
        "let the request wait longer (its timeout, or the client's lease_wait), send from "
        "fewer clients at once, or start the daemon with a larger pool (--slabs, --slab-size)"
    ),
}


@dataclass(eq=False)
class Waiter:
    owner: str
    client: str  # its name, printable, for logs and status
    sizes: Sequence[int]
    tag: str
    since: float
    future: asyncio.Future[list[Lease]]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class WaiterView:
    client: str
    nbytes: int
    regions: int
    waited_s: float


@dataclass
class QueueStats:
    waits: int = 0  # requests that waited, then got their regions
    wait_s: float = 0.0  # the seconds they waited, in all
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)


class LeaseQueue:
    """Grants each request's regions at once, in arrival order; see the module."""

    def __init__(
        self,
        table: LeaseTable,
        max_wait: float,
        *,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self._table = table
        self.max_wait = max_wait  # with nothing moving in the pool
        self._waiters: collections.deque[Waiter] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._moved_at = time.monotonic()
        self.stats = QueueStats()
        self.observe = observe  # each granted wait's seconds (metrics)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def freed(self) -> None:
        """Memory came back: serve the queue. Called from encoder threads as well."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is gone
                loop.call_soon_threadsafe(self._serve, True)

    @property
    def waiting(self) -> bool:
        return bool(self._waiters)

    def waiters(self) -> list[WaiterView]:
        now = time.monotonic()
        return [WaiterView(w.client, w.nbytes, len(w.sizes), now - w.since) for w in self._waiters]

    async def acquire(
        self, owner: str, client: str, sizes: Sequence[int], wait: float, tag: str = ""
    ) -> list[Lease]:
        """Every region of `sizes` at once, waiting at most `wait` seconds in the queue.
        Sizes are checked by the caller (`LeaseTable.check_sizes`)."""
        if not self._waiters:
            leases = self._table.grant_all(owner, sizes, tag=tag)
            if leases is not None:
                return leases
        assert self._loop is not None
        since = time.monotonic()
        waiter = Waiter(owner, client, sizes, tag, since, self._loop.create_future())
        self._waiters.append(waiter)
        deadline = since + max(0.0, wait)
        why = ""
        try:
            while not waiter.future.done():
                now = time.monotonic()
                if now >= deadline:
                    why = "wait"
                    break
                stall_at = max(self._moved_at, since) + self.max_wait
                if now >= stall_at:
                    if not self._table.in_encodes():
                        why = "stall"
                        break
                    self._moved_at = now  # encodes hold memory: it will come back
                    stall_at = now + self.max_wait
                until = min(deadline, stall_at)
                await asyncio.wait({waiter.future}, timeout=until - now)
        except asyncio.CancelledError:
            self.stats.refusals["cancelled"] += 1
            self._leave(waiter)
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self._table.free(future.result())  # granted as its client left
            raise
        if waiter.future.done():  # granted, or its tag refused (even as the time ran out)
            leases = waiter.future.result()
            waited = time.monotonic() - since
            self.stats.waits += 1
            self.stats.wait_s += waited
            if self.observe is not None:
                self.observe(waited)
            return leases
        error = self._refuse(waiter, why)
        self._leave(waiter)
        raise error

    def refuse_all(self, error: SidecarError) -> None:
        """Refuse every waiter with `error` (the daemon is stopping)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # -- internals -----------------------------------------------------------------------

    def _serve(self, moved: bool = False) -> None:
        """Grant from the head while the head fits; stop at the first that does not."""
        if moved:
            self._moved_at = time.monotonic()
        while self._waiters:
            head = self._waiters[0]
            if head.future.done():  # gone already (a timeout or a cancel is leaving)
                self._waiters.popleft()
                continue
            try:
                leases = self._table.grant_all(head.owner, head.sizes, tag=head.tag)
            except SidecarError as err:  # its tag withdrawn, or reused
                self._waiters.popleft()
                head.future.set_exception(err)
                continue
            if leases is None:
                return
            self._waiters.popleft()
            head.future.set_result(leases)

    def _leave(self, waiter: Waiter) -> None:
        """Out of the queue, if still in it; the next may then fit where it did not."""
        was_head = bool(self._waiters) and self._waiters[0] is waiter
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        if was_head:
            self._serve()

    def _refuse(self, waiter: Waiter, why: str) -> SidecarError:
        self.stats.refusals[why] += 1
        usage = self._table.usage()
        position = self._position(waiter)
        waited = time.monotonic() - waiter.since
        log.warning(
            "lease refused (%s): client=%s bytes=%d regions=%d waited_ms=%.0f position=%d/%d "
            "pool_leased=%d/%d largest_free=%d",
            why,
            waiter.client,
            waiter.nbytes,
            len(waiter.sizes),
            waited * 1e3,
            position,
            len(self._waiters),
            usage.leased_bytes,
            usage.total_bytes,
            usage.largest_free,
            extra={
                "event": "lease_refused",
                "reason": why,
                "client": waiter.client,
                "bytes": waiter.nbytes,
                "regions": len(waiter.sizes),
                "waited_ms": round(waited * 1e3),
                "position": position,
                "queue": len(self._waiters),
                "pool_leased": usage.leased_bytes,
                "pool_total": usage.total_bytes,
            },
        )
        return PoolExhausted(
            f"no room for {waiter.nbytes} bytes in {len(waiter.sizes)} region(s): "
            f"{self._why(why, waited)}; {usage.leased_bytes} of {usage.total_bytes} bytes "
            f"leased, position {position} of {len(self._waiters)} in the queue. "
            f"Fix: {FIXES[why]}"
        )

    def _why(self, why: str, waited: float) -> str:
        if why == "stall":
            return (
                f"{STALL_TEXT} for {self.max_wait:g} s (its memory is held by clients that "
                "are not using it)"
            )
        return f"the wait of {waited:.1f} s is over"

    def _position(self, waiter: Waiter) -> int:
        for i, other in enumerate(self._waiters, 1):
            if other is waiter:
                return i
        return 0
