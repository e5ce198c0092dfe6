"""How a bytes output goes back with its result: inside it, in a lease granted to the
client (its next request's, or one of its own), or as chunks before it.

One choice, made once: `OutputHandBack.carriers` puts what may carry an output back in
the order they are tried (a lease may have no room: then the next). The transport says
what its reply can carry (`EncodeSpec.one_reply`); this decides what carries the output.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Protocol

from ...errors import OutOfRange, PoolExhausted
from ...pool.lease_queue import LeaseQueue
from ...pool.leases import Lease, LeaseTable
from ...pool.shm import SlabSet
from ..admission.plans import EncodeOutcome
from ..admission.requests import EncodeSpec

CHUNK_SIZE = 1024 * 1024  # bytes outputs travel in pieces of this size
# A result carries previews up to this, below the message limit with room to spare.
PREVIEWS_IN_RESULT_MAX = 6 * 1024 * 1024
# Outputs over this go back in the client's next lease when it asks for one.
NEXT_LEASE_DATA_MIN = 64 * 1024


@dataclass(frozen=True)
class HandedBack:
    """What carried the output: its bytes inside the result, a lease it is in (the one
    for the client's next request when `next_lease`), else chunks before the result."""

    data: bytes = b""
    lease: Lease | None = None
    next_lease: bool = False

    @property
    def in_chunks(self) -> bool:
        return not self.data and self.lease is None


class Carrier(Protocol):
    async def take(self, outcome: EncodeOutcome) -> HandedBack | None:
        """The output carried back; None if this cannot carry it (no room)."""
        ...


class InResult:
    async def take(self, outcome: EncodeOutcome) -> HandedBack | None:
        return HandedBack(data=outcome.read_all())


class InChunks:
    """Chunks before the result; also an output already sent, or none to send."""

    async def take(self, outcome: EncodeOutcome) -> HandedBack | None:
        return HandedBack()


@dataclass(frozen=True)
class InLease:
    handback: OutputHandBack
    token: str
    size: int = 0  # the lease's (0: the output's)
    next_lease: bool = False  # the one for the client's next request

    async def take(self, outcome: EncodeOutcome) -> HandedBack | None:
        lease = await self.handback.in_lease(self.token, outcome, self.size, spare=self.next_lease)
        return None if lease is None else HandedBack(lease=lease, next_lease=self.next_lease)


class TooLarge:
    """A one-reply output no lease had room for and the reply cannot carry."""

    async def take(self, outcome: EncodeOutcome) -> HandedBack | None:
        raise PoolExhausted(
            f"the output ({outcome.size_bytes} bytes) is too large for one reply and no "
            "lease has room for it; ask for it by Encode, which sends it in chunks"
        )


class OutputHandBack:
    def __init__(self, leases: LeaseTable, slabset: SlabSet, queue: LeaseQueue) -> None:
        self.leases = leases
        self.slabset = slabset
        self.queue = queue

    async def hand_back(self, spec: EncodeSpec, outcome: EncodeOutcome, whole: bool) -> HandedBack:
        """Send the bytes output back by the first of `carriers` that takes it."""
        for carrier in self.carriers(spec, outcome, whole):
            handed = await carrier.take(outcome)
            if handed is not None:
                break
        else:
            handed = HandedBack()
        if handed.lease is None and outcome.previews_bytes > PREVIEWS_IN_RESULT_MAX:
            raise OutOfRange(
                f"the previews ({outcome.previews_bytes} bytes) are too large to send in a "
                "result: ask for smaller or lower-quality ones, or a file output"
            )
        return handed

    def carriers(self, spec: EncodeSpec, outcome: EncodeOutcome, whole: bool) -> list[Carrier]:
        """What may carry the output back, in the order they are tried. A whole video's
        client maps the slabs (its frames came in leases): the lease for its next request
        is tried first, then the result for a small output, a lease of its own, and
        chunks (or, on a one-reply transport, the result up to its limit) last. A
        stream's output goes back in chunks, or in its one reply."""
        if not outcome.unsent:
            return [InChunks()]  # sent already, or a file
        # What one reply would carry: the output and its previews.
        token, size = spec.client_token, outcome.bytes_back
        carriers: list[Carrier] = []
        # No spare while others wait for room: it would jump the queue.
        if whole and _in_next_lease(spec, outcome) and not self.queue.waiting:
            # The client's next frames go in the same lease, once it has the output.
            carriers.append(InLease(self, token, spec.next_lease_bytes, next_lease=True))
        if size <= _inline_max(spec, whole):
            return [*carriers, InResult()]
        if whole:
            carriers.append(InLease(self, token))
        if spec.one_reply is None:
            return [*carriers, InChunks()]
        return [*carriers, InResult() if size <= spec.one_reply.data_max else TooLarge()]

    async def in_lease(
        self, token: str, outcome: EncodeOutcome, size: int = 0, *, spare: bool = False
    ) -> Lease | None:
        """A lease for `token` (of `size` bytes, else the output's) holding the bytes output
        at its start, or None (no room: another carrier then)."""
        try:
            lease = self.leases.grant(
                token, size or outcome.lease_bytes, spare=spare, in_reply=True
            )
        except OutOfRange:  # larger than a slab
            return None
        if lease is None:
            return None
        region = self.slabset.slabs[lease.slab_id].array[lease.offset : lease.offset + lease.size]
        if outcome.lease_bytes <= CHUNK_SIZE:  # a small clip's: quicker than a thread hop
            outcome.copy_into(region)
            return lease
        # Off the event loop: a long video's output is tens of megabytes.
        copy = asyncio.ensure_future(asyncio.to_thread(outcome.copy_into, region))
        try:
            await asyncio.shield(copy)
        except BaseException:
            # Never free a region a thread still writes into (the client went away).
            with contextlib.suppress(BaseException):
                await copy
            self.leases.free([lease])
            raise
        return lease


def _in_next_lease(spec: EncodeSpec, outcome: EncodeOutcome) -> bool:
    """Whether the output goes back in the lease the client's next frames will use: an
    output too small is quicker inside the result."""
    return outcome.size_bytes > NEXT_LEASE_DATA_MIN and outcome.lease_bytes <= spec.next_lease_bytes


def _inline_max(spec: EncodeSpec, whole: bool) -> int:
    """The largest bytes output that travels inside the result while a lease could hold
    it (-1: none does: a stream's goes in chunks)."""
    if spec.one_reply is not None:
        return spec.one_reply.inline_max
    return CHUNK_SIZE if whole else -1
