"""What a framed connection is watched for: its deadlines, and the leases its replies
handed out that the client may not have read."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable

from ..api.v1 import sidecar_pb2 as pb

log = logging.getLogger(f"{__package__}.framed")  # the socket's lines, under one name


class Watch:
    """A connection's deadlines: for its preamble, for a request begun, and (while a reply
    waits to be read) for the reply to move on. `FramedServer._sweep` checks them, and
    closes the connection when one has passed."""

    def __init__(self, transport: asyncio.WriteTransport, timeout: float, uid: int) -> None:
        self._transport, self._timeout, self.uid = transport, timeout, uid
        self._due = math.inf
        self._what = ""
        self._left: Callable[[], int] | None = None  # a reply's bytes not yet sent
        self._left_was = 0
        self._left_due = math.inf

    def begin(self, what: str) -> None:
        """Something to read has begun; `what` says it in the log, with {} for the time."""
        self._due = time.monotonic() + self._timeout
        self._what = what

    def done(self) -> None:
        self._due = math.inf

    def sending(self, left: Callable[[], int]) -> None:
        """A reply waits to be read; `left` says how much of it is still to go."""
        self._left, self._left_was = left, left()
        self._left_due = time.monotonic() + self._timeout

    def sent(self) -> None:
        self._left = None

    def check(self, now: float) -> None:
        if now >= self._due:
            self._close(self._what)
        elif self._left is not None and now >= self._left_due:
            left = self._left()
            if left == self._left_was:
                self._close("its reply not read for {}")
            else:  # it moved: wait again
                self._left_was, self._left_due = left, now + self._timeout

    def _close(self, what: str) -> None:
        self._due = self._left_due = math.inf
        self._left = None
        reason = what.format(f"{self._timeout:g} s")
        log.info("closed a framed connection of uid %d: %s", self.uid, reason)
        self._transport.abort()


class Handed:
    """The leases a connection's replies hand out, until a request shows the client read
    them: each reply's with the bytes the daemon had received when it was written. A
    request whose first byte lies past those came after the reply, so its client had
    read it (a client sends its next request once it has read the last reply); one
    already there when the reply was written was sent without reading it."""

    def __init__(self) -> None:
        self._replies: collections.deque[tuple[int, tuple[str, ...]]] = collections.deque()

    def add(self, received: int, leases: tuple[str, ...]) -> None:
        """A reply handing out `leases` is written with `received` bytes read."""
        self._replies.append((received, leases))

    def read_from(self, offset: int) -> None:
        """A request begins at byte `offset` of the connection."""
        while self._replies and self._replies[0][0] <= offset:
            self._replies.popleft()

    def unread(self) -> list[str]:
        return [lease for _, leases in self._replies for lease in leases]


def granted(reply: pb.FramedReply) -> tuple[str, ...]:
    """The leases a reply hands the client."""
    kind = reply.WhichOneof("reply")
    if kind == "lease":
        return (reply.lease.lease_id, *(more.lease_id for more in reply.lease.more))
    if kind == "result":
        result = reply.result
        return tuple(filter(None, (result.next_lease.lease_id, result.data_lease.lease_id)))
    return ()
