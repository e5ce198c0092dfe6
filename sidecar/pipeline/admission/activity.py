"""Which clients are waiting on the daemon, and why their requests ended.

A client with an encode in flight, or a place in the queue for room, is not silent: the
reaper keeps its leases. A lease refused to a client with an encode in flight (a stream's
next chunk) usually ends that encode; the log says so. A client may have several encodes
in flight (streams from threads or tasks of one client), each refused its own lease: each
refusal is kept until one of its encodes ends for it, oldest first.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

# A request that ends this soon after its client's lease was refused ended for that.
REFUSAL_NOTE_S = 5.0
MAX_NOTED = 1024  # requests left for room, kept until the face reads them


class Activity:
    def __init__(self) -> None:
        self._working: Counter[str] = Counter()  # tokens with an encode in flight
        self._waiting: Counter[str] = Counter()  # tokens waiting in the queue for room
        # Leases refused to a client with encodes in flight (when, why), oldest first,
        # and the requests its client then left for that reason (request id: why), for
        # the log.
        self._refused: dict[str, deque[tuple[float, str]]] = {}
        self.left_for_room: dict[str, str] = {}

    def alive(self) -> set[str]:
        """Tokens waiting on their own encode, or in the queue for room: not silent."""
        return {*self._working, *self._waiting}

    def working(self, token: str) -> bool:
        return token in self._working

    @contextmanager
    def encoding(self, token: str) -> Iterator[None]:
        """While `token` has an encode in flight."""
        try:
            with _counted(self._working, token):
                yield
        finally:
            if token not in self._working:
                self._refused.pop(token, None)

    def waiting(self, token: str) -> AbstractContextManager[None]:
        """While `token` waits in the queue for room."""
        return _counted(self._waiting, token)

    def refused(self, token: str, why: str) -> None:
        """A lease was refused to `token`; if it has an encode in flight, noted."""
        if token in self._working:  # its stream's next chunk: the stream ends for it
            refusals = self._refused.setdefault(token, deque(maxlen=MAX_NOTED))
            refusals.append((time.monotonic(), why))

    def ended(self, token: str, request_id: str) -> None:
        """A request ended early: if right after its client's lease was refused, it was
        left for that."""
        refusals = self._refused.get(token)
        now = time.monotonic()
        while refusals and now - refusals[0][0] >= REFUSAL_NOTE_S:  # too old to be why
            refusals.popleft()
        if not refusals:
            return
        _, why = refusals.popleft()
        while len(self.left_for_room) >= MAX_NOTED:  # read at once; bounded all the same
            del self.left_for_room[next(iter(self.left_for_room))]
        self.left_for_room[request_id] = why


@contextmanager
def _counted(counter: Counter[str], token: str) -> Iterator[None]:
    """`token` counted in `counter` meanwhile; gone from it at its last."""
    counter[token] += 1
    try:
        yield
    finally:
        counter[token] -= 1
        if not counter[token]:
            del counter[token]
