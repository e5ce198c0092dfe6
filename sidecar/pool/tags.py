"""Tags a client released before any lease was granted under them: a grant under one is
refused for a TTL (the Lease reply was lost to a cancel or a deadline, and the client has
given up on it)."""

from __future__ import annotations

from typing import Generic, TypeVar

from ..errors import Cancelled, InvalidRequest

# A lease, as the lease table keeps it; this module needs only to hold and compare them.
L = TypeVar("L")

# At most this many a client, its oldest forgotten first. A client withdraws one only when
# a Lease reply was lost, and another client's withdrawals never push out its own.
MAX_WITHDRAWN = 64


class WithdrawnTags:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._until: dict[str, dict[str, float]] = {}  # owner: {tag: until}

    def withdrawn(self, owner: str, tag: str, now: float) -> bool:
        until = self._until.get(owner, {}).get(tag)
        return until is not None and until > now

    def add(self, owner: str, tag: str, now: float) -> None:
        mine = self._until.setdefault(owner, {})
        mine.pop(tag, None)  # to the end: the newest
        while mine:  # oldest first: drop the expired, and any over the cap
            oldest, until = next(iter(mine.items()))
            if until > now and len(mine) < MAX_WITHDRAWN:
                break
            del mine[oldest]
        mine[tag] = now + self.ttl

    def forget(self, now: float) -> None:
        """Drop the tags whose TTL has passed, and the clients left with none."""
        for owner, mine in list(self._until.items()):
            for tag, until in list(mine.items()):
                if until <= now:
                    del mine[tag]
            if not mine:
                del self._until[owner]


class LeaseTags(Generic[L]):
    """The leases granted under each client's tags, and the tags withdrawn before any
    lease was granted under them. Not thread-safe on its own (the lease table's lock)."""

    def __init__(self, ttl: float) -> None:
        self._leases: dict[tuple[str, str], list[L]] = {}
        self._withdrawn = WithdrawnTags(ttl)

    def check(self, owner: str, tag: str, now: float) -> None:
        """Refuse a grant under `tag`: withdrawn, or naming leases already."""
        if self._withdrawn.withdrawn(owner, tag, now):
            raise Cancelled(f"the lease request {tag!r} was withdrawn by its client")
        if (owner, tag) in self._leases:
            raise InvalidRequest("tag", f"{tag!r} already names a lease of this client")

    def add(self, owner: str, tag: str, leases: list[L]) -> None:
        self._leases[(owner, tag)] = leases

    def leases(self, owner: str, tag: str) -> list[L] | None:
        """The leases still held under `tag`; None if there are none."""
        return self._leases.get((owner, tag))

    def withdraw(self, owner: str, tag: str, now: float) -> None:
        self._withdrawn.add(owner, tag, now)

    def remove(self, owner: str, tag: str, lease: L) -> None:
        """`lease`, granted to `owner` under `tag`, is gone: no longer under its tag."""
        key = (owner, tag)
        siblings = self._leases[key]
        siblings.remove(lease)
        if not siblings:
            del self._leases[key]

    def forget(self, now: float) -> None:
        self._withdrawn.forget(now)
