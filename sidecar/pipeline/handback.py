"""How a bytes output goes back with its result: inside it, in a lease granted to the
client (its next request's, or one of its own), or as chunks before it.

One choice, made here: `OutputHandBack.hand_back`. The face says what its reply can carry
(`EncodeSpec.one_reply`, `reply_data_max`); this decides which way the output takes.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..errors import OutOfRange, PoolExhausted
from ..pool.lease_queue import LeaseQueue
from ..pool.leases import Lease, LeaseTable
from ..pool.shm import SlabSet
from ..vocabulary import MAX_MESSAGE_BYTES
from .plans import EncodeOutcome
from .requests import EncodeSpec

CHUNK_SIZE = 1024 * 1024  # bytes outputs travel in pieces well under gRPC's 4 MiB limit
# Outputs over this go back in the client's next lease when it asks (data_in_next_lease).
NEXT_LEASE_DATA_MIN = 64 * 1024
# An EncodeOnce result's own bytes: one message, with room left for its other fields.
ONE_REPLY_DATA_MAX = MAX_MESSAGE_BYTES - 1024 * 1024


class OutputHandBack:
    def __init__(self, leases: LeaseTable, slabset: SlabSet, queue: LeaseQueue) -> None:
        self.leases = leases
        self.slabset = slabset
        self.queue = queue

    async def hand_back(
        self, spec: EncodeSpec, outcome: EncodeOutcome, whole: bool
    ) -> tuple[bytes, Lease | None, bool]:
        """How a bytes output goes back with the result: inside it, or in a lease granted
        to the client (True: the one for its next request, `whole` encodes only); neither
        means chunks before it (or nothing to send)."""
        if not outcome.unsent:
            return b"", None, False
        token = spec.client_token
        # No spare while others wait for room: it would jump the queue.
        if whole and _in_next_lease(spec, outcome) and not self.queue.waiting:
            # The client's next frames go in the same lease, once it has the output.
            lease = await self.in_lease(token, outcome, spec.next_lease_bytes, spare=True)
            if lease is not None:
                return b"", lease, True
        if outcome.size_bytes <= _inline_max(spec):
            return outcome.read_all(), None, False
        if spec.data_in_lease or spec.one_reply:
            lease = await self.in_lease(token, outcome)
            if lease is not None:
                return b"", lease, False
            if spec.one_reply:
                if outcome.size_bytes <= spec.reply_data_max:
                    return outcome.read_all(), None, False  # the framed socket takes it
                raise PoolExhausted(
                    f"the output ({outcome.size_bytes} bytes) is too large for one reply "
                    "and no lease has room for it; use Encode for outputs this large"
                )
        return b"", None, False

    async def in_lease(
        self, token: str, outcome: EncodeOutcome, size: int = 0, *, spare: bool = False
    ) -> Lease | None:
        """A lease for `token` (of `size` bytes, else the output's) holding the bytes output
        at its start, or None (no room: send it another way)."""
        try:
            lease = self.leases.grant(token, size or outcome.size_bytes, spare=spare, in_reply=True)
        except OutOfRange:  # larger than a slab
            return None
        if lease is None:
            return None
        region = self.slabset.slabs[lease.slab_id].array[lease.offset : lease.offset + lease.size]
        if outcome.size_bytes <= CHUNK_SIZE:  # a small clip's: quicker than a thread hop
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
    fits = NEXT_LEASE_DATA_MIN < outcome.size_bytes <= spec.next_lease_bytes
    return spec.data_in_next_lease and fits


def _inline_max(spec: EncodeSpec) -> int:
    """The largest bytes output that travels inside the result (-1: none does). A
    framed reply (`reply_data_max`) takes more only when no lease has room: copied into a
    lease and out, a 2.9 MB output reached the client sooner than inside the reply."""
    if spec.one_reply and not spec.reply_data_max:
        return ONE_REPLY_DATA_MAX
    return CHUNK_SIZE if spec.data_in_result or spec.one_reply else -1
