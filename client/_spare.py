"""The spare lease: one the daemon granted with the last result, for the next request.

In the steady state a request then costs one round trip instead of two. A spare is used
only while surely alive, well within its TTL counted from before it was asked for:
writing into an expired lease could overwrite another client's frames. One not used goes
back while it may still be held, so that a client never holds it while waiting for room.
"""

from __future__ import annotations

import threading
import time

from ._types import Lease


class Spare:
    def __init__(self) -> None:
        self._held: tuple[Lease, float, float] | None = None  # lease, asked at, its TTL
        self._lock = threading.Lock()

    def take(self, nbytes: int | None) -> tuple[Lease | None, Lease | None]:
        """(the spare, to use for `nbytes`, or None; the spare to give back, or None).
        `nbytes` None: not to use it."""
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            return None, None
        lease, asked_at, ttl = held
        age = time.monotonic() - asked_at
        if nbytes is not None and age < ttl / 2 and lease.size >= nbytes:
            return lease, None
        return None, lease if age < ttl else None  # the daemon expires it a TTL after

    def keep(self, lease: Lease, asked_at: float, ttl: float) -> Lease | None:
        """Keep the newest spare; the one it displaces (concurrent requests), to give back."""
        with self._lock:
            displaced, self._held = self._held, (lease, asked_at, ttl)
        return displaced[0] if displaced is not None else None

    def drop(self) -> Lease | None:
        """Forget the spare; it, to give back (None if there was none)."""
        with self._lock:
            held, self._held = self._held, None
        return held[0] if held is not None else None
