"""The lease table: who holds which region of which slab, and until when.

Pure bookkeeping (no shared memory, no gRPC), safe to call from the event loop and from
encoder threads. A lease is

    HELD      granted to a client, which is writing frames into it; expires once the
              client has made no call for the TTL (every call renews its leases; one
              handed over in a result, a TTL after it was granted unless used)
    ENCODING  handed to an encode; never expires, freed as soon as its frames are consumed

A client may release a lease an encode holds: it is freed when the encode lets go of it,
even where the encode would have given it back (its frames still landing when it ended).
A client whose copy failed after its request went out releases its leases at once, and
need not wait to see them come back.

A request's regions are granted together or not at all (`grant_all`): a client never
holds part of what one request needs while it waits for the rest (see `lease_queue`).

A grant may be made under a tag, the client's name for its request: a client whose
reply never came (a cancel, a deadline) releases every lease of it by that tag. A tag
released before any lease was granted under it is withdrawn for a TTL: a grant under it
is refused.

Lease ids are 128-bit random. A lease is visible only to the client token that took it:
to anyone else it does not exist.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..errors import InvalidRequest, LeaseBusy, LeaseNotFound
from .allocator import SlabRegions
from .tags import LeaseTags

# A spare lives this long unused (at most the TTL): a client uses it for its very next
# request or not at all, and an idle client's spare should not keep a waiter out for long.
SPARE_TTL = 4.0
TAG = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_FREED = 4096  # leases the daemon freed itself, remembered to tell a late release apart


def check_tag(tag: str) -> None:
    """A Lease request's tag: empty (none), or 1-64 of A-Z a-z 0-9 _ -."""
    if tag and not TAG.fullmatch(tag):
        raise InvalidRequest("tag", "must be 1-64 of A-Z a-z 0-9 _ -, or empty")


@dataclass(eq=False)
class Lease:
    id: str
    owner: str
    slab_id: int
    offset: int
    size: int
    expires_at: float
    encoding: bool = False
    spare: bool = False  # granted with a result for the client's next request
    # Handed over inside a reply (a spare, an output's lease) that the client may never
    # have read: its calls do not renew it until it uses or releases it.
    unclaimed: bool = False
    released: bool = False  # released by its client while an encode held it
    tag: str = ""  # the client's name for the Lease request that granted it
    ttl: float = 30.0  # how long it lives unused, as its client was told
    granted_at: float = 0.0  # on the table's clock


@dataclass(frozen=True)
class PoolUsage:
    slabs: int
    slab_size: int
    total_bytes: int
    leased_bytes: int
    active_leases: int
    largest_free: int


class LeaseAlreadyFreed(LeaseNotFound):
    """A release of a lease the daemon freed itself (its encode consumed it, or it was a
    spare left unused): answered as any lease it does not know, NOT_FOUND, which the
    client takes as done, but counted as the routine it is, not as an error."""


class Freed:
    """The latest leases the daemon freed itself, by id, with their owners."""

    def __init__(self) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()

    def add(self, lease: Lease) -> None:
        self._owners[lease.id] = lease.owner
        if len(self._owners) > MAX_FREED:
            self._owners.popitem(last=False)

    def check(self, owner: str, lease_id: str) -> None:
        """Raise LeaseAlreadyFreed if the daemon freed `owner`'s lease `lease_id`."""
        known = self._owners.get(lease_id)
        if known is not None and secrets.compare_digest(known, owner):
            raise LeaseAlreadyFreed(
                f"lease {lease_id[:40]!r} was already freed (its frames were encoded, or "
                "it was a spare left unused): nothing to release"
            )


class LeaseTable:
    """Grants aligned regions of fixed-size slabs as leases with a TTL."""

    def __init__(
        self,
        slab_count: int,
        slab_size: int,
        *,
        alignment: int = 4096,
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        self.slab_size = slab_size
        self.alignment = alignment
        self.ttl = ttl
        self._clock = clock
        self._regions = SlabRegions(slab_count, slab_size, alignment)
        self._leases: dict[str, Lease] = {}
        self._by_owner: dict[str, dict[str, Lease]] = {}
        self._tags: LeaseTags[Lease] = LeaseTags(ttl)
        self._lock = threading.Lock()
        self.on_free = on_free
        self.granted = 0
        self.expired = 0
        self.spares_expired = 0  # of those, spares left unused: routine
        self._freed = Freed()

    # -- granting and giving back --------------------------------------------------------

    def grant(
        self,
        owner: str,
        size: int,
        *,
        spare: bool = False,
        in_reply: bool = False,
        tag: str = "",
    ) -> Lease | None:
        """A lease of at least `size` bytes, or None if no slab has room right now.
        `in_reply`: it goes to the client inside an encode's result (a spare always)."""
        self.check_sizes([size])
        granted = self._grant(owner, [size], tag, spare=spare, unclaimed=spare or in_reply)
        return granted[0] if granted else None

    def grant_all(self, owner: str, sizes: Sequence[int], *, tag: str = "") -> list[Lease] | None:
        """Leases of `sizes`, in order, all at once; None (nothing held) if the pool has
        no room for every one right now. `tag`: the client's name for the request
        (checked by the caller); sizes checked by `check_sizes`."""
        return self._grant(owner, sizes, tag)

    def _grant(
        self,
        owner: str,
        sizes: Sequence[int],
        tag: str,
        *,
        spare: bool = False,
        unclaimed: bool = False,
    ) -> list[Lease] | None:
        """Regions for every size, first fit slab by slab, as leases; or none at all."""
        with self._lock:
            if tag:
                self._tags.check(owner, tag, self._clock())
            placed = self._regions.place(sizes)
            if placed is None:
                return None
            ttl = min(self.ttl, SPARE_TTL) if spare else self.ttl
            now = self._clock()
            expires_at = now + ttl
            mine = self._by_owner.setdefault(owner, {})
            leases = [
                Lease(secrets.token_hex(16), owner, slab_id, offset, length, expires_at,
                      spare=spare, unclaimed=unclaimed, tag=tag, ttl=ttl, granted_at=now)
                for slab_id, offset, length in placed
            ]  # fmt: skip
            for lease in leases:
                self._leases[lease.id] = mine[lease.id] = lease
            self.granted += len(leases)
            if tag:
                self._tags.add(owner, tag, leases)
        return leases

    def check_sizes(self, sizes: Sequence[int]) -> None:
        """Refuse regions that no slab, or not even the empty pool, could hold at once."""
        self._regions.check(sizes)

    def renew(self, owner: str) -> None:
        """Push back the expiry of every held lease of `owner`: a client that calls is
        alive, and only the leases of clients that went silent may be reclaimed.

        Not one handed over in a result that its client has not used yet (a spare, an
        output's lease): the reply may never have been read (the client gave up on it),
        and the client's other calls would keep it for good. A client copies an output out
        at once, and uses a spare well within the TTL or gives it back."""
        until = self._clock() + self.ttl
        with self._lock:
            for lease in self._by_owner.get(owner, {}).values():
                if not lease.unclaimed:
                    lease.expires_at = until

    def lookup(self, owner: str, lease_id: str) -> Lease:
        with self._lock:
            return self._get(owner, lease_id)

    def release(self, owner: str, lease_id: str) -> None:
        """Give back a lease; one an encode holds is freed when the encode lets go."""
        with self._lock:
            if lease_id not in self._leases:
                self._freed.check(owner, lease_id)
            freed = self._let_go(self._get(owner, lease_id))
        if freed:
            self._notify()

    def release_tagged(self, owner: str, tag: str) -> None:
        """Give back the leases granted under `tag`, if any; if none, refuse them later."""
        with self._lock:
            leases = self._tags.leases(owner, tag)
            if leases is None:
                self._tags.withdraw(owner, tag, self._clock())
                return
            freed = [self._let_go(lease) for lease in list(leases)]
        if any(freed):
            self._notify()

    def take(self, owner: str, lease_ids: Iterable[str]) -> list[Lease]:
        """Hand leases to an encode, all or none. Duplicate ids are taken once."""
        unique = list(dict.fromkeys(lease_ids))
        with self._lock:
            leases = [self._get(owner, lease_id) for lease_id in unique]
            for lease in leases:
                if lease.encoding:
                    raise LeaseBusy(f"lease {lease.id} is already in use by another encode")
            for lease in leases:
                lease.encoding = True
                lease.unclaimed = False  # its client has it: renewed from now on
        return leases

    def untake(self, leases: Sequence[Lease]) -> None:
        """Give leases back to their client after an encode failed before reading them
        (or ended with frames still landing); those the client released meanwhile are
        freed instead."""
        freed = False
        with self._lock:
            for lease in leases:
                if self._leases.get(lease.id) is not lease:
                    continue
                if lease.released:
                    self._drop(lease, freed=True)
                    freed = True
                else:
                    lease.encoding = False
                    lease.expires_at = self._clock() + self.ttl
        if freed:
            self._notify()

    def free_unused(self, lease_id: str) -> bool:
        """Free a lease its client never saw (the reply granting it was not read), unless
        it is in an encode; False if it is gone or in use."""
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None or lease.encoding:
                return False
            self._drop(lease)
        self._notify()
        return True

    def free(self, leases: Sequence[Lease]) -> None:
        """Return leases to the pool once their frames are consumed. Idempotent."""
        freed = False
        with self._lock:
            for lease in leases:
                if self._leases.get(lease.id) is lease:
                    self._drop(lease, freed=True)
                    freed = True
        if freed:
            self._notify()

    # -- reclaiming ----------------------------------------------------------------------

    def expire(self) -> list[Lease]:
        """Reclaim held leases whose TTL has passed; leases in an encode never expire."""
        now = self._clock()
        with self._lock:
            stale = [
                lease
                for lease in self._leases.values()
                if not lease.encoding and lease.expires_at <= now
            ]
            for lease in stale:
                self._drop(lease, freed=lease.spare)
            self.expired += len(stale)
            self.spares_expired += sum(lease.spare for lease in stale)
            self._tags.forget(now)
        if stale:
            self._notify()
        return stale

    # -- reporting -----------------------------------------------------------------------

    def usage(self) -> PoolUsage:
        with self._lock:
            return PoolUsage(
                slabs=self._regions.count,
                slab_size=self.slab_size,
                total_bytes=self.slab_size * self._regions.count,
                leased_bytes=self._regions.allocated_bytes,
                active_leases=len(self._leases),
                largest_free=self._regions.largest_free,
            )

    def in_encodes(self) -> int:
        """How many leases encodes hold: while any do, the pool is moving."""
        with self._lock:
            return sum(lease.encoding for lease in self._leases.values())

    def on_their_way(self, within: float, owner: str | None = None) -> bool:
        """Whether leases granted in the last `within` seconds (to `owner`, or to anyone)
        wait for the request their client is about to send: not in an encode, nor handed
        over in a result."""
        since = self._clock() - within
        with self._lock:
            held = (
                self._leases.values() if owner is None else self._by_owner.get(owner, {}).values()
            )
            return any(
                lease.granted_at >= since and not (lease.encoding or lease.unclaimed)
                for lease in held
            )

    def owners(self) -> set[str]:
        with self._lock:
            return set(self._by_owner)

    def __len__(self) -> int:
        return len(self._leases)

    # -- internals (lock held) -----------------------------------------------------------

    def _get(self, owner: str, lease_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None or not secrets.compare_digest(lease.owner, owner):
            raise LeaseNotFound(
                f"no lease {lease_id[:40]!r} (unknown, expired or already consumed)"
            )
        return lease

    def _let_go(self, lease: Lease) -> bool:
        """Free `lease`, or, while an encode holds it, once the encode lets go of it;
        whether it was freed now."""
        if lease.encoding:
            lease.released = True
            return False
        self._drop(lease)
        return True

    def _drop(self, lease: Lease, *, freed: bool = False) -> None:
        """Out of the table; `freed`: by the daemon itself, its client's release routine."""
        del self._leases[lease.id]
        if freed:
            self._freed.add(lease)
        if lease.tag:
            self._tags.remove(lease.owner, lease.tag, lease)
        mine = self._by_owner[lease.owner]
        del mine[lease.id]
        if not mine:
            del self._by_owner[lease.owner]
        self._regions.free(lease.slab_id, lease.offset)

    def _notify(self) -> None:
        if self.on_free is not None:
            self.on_free()
