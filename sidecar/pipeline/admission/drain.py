"""The stop rule: once the daemon is told to stop, it takes no new work and finishes the
work in flight, for up to `--shutdown-grace` (docs/reliability.md, "Stopping").

In flight is whatever a client had begun before the stop:

- an encode accepted before it: a whole video, a stream (its later chunks, and the leases
  they need: a client with an encode in flight may still lease), an encode in an encoder
  process, parallel segments;
- a Lease waiting for room: it stays in the queue and is served from the room the
  draining encodes free;
- leases a client holds for a request it has not sent yet (leased, copying its frames):
  an Encode naming them is accepted, as is a stream its client opens while holding such
  leases (a video larger than the pool: its first chunk leased, waiting for room, then
  copied), and a client holding such leases may lease the rest of its video.

New work is refused at once with UNAVAILABLE, `SHUTTING_DOWN`, in words that name the
stop: Attach, a Lease from a client with nothing in flight, an Encode that names no lease,
a new stream from a client holding no lease on its way. The daemon waits while anything
is in flight (`in_flight`); what has not finished when the grace ends is stopped and told
so in the same words, and no partial file is left.
"""

from __future__ import annotations

import time

from ...errors import ShuttingDown

STOP_TEXT = "the daemon is shutting down"
# A client leases, then copies its frames and sends its request at once: leases granted
# this recently and not yet in an encode are a request on its way, which the stop waits
# for. Older ones are held by hand (lease() and kept), which no stop should wait on.
REQUEST_ON_ITS_WAY_S = 2.0


class Drain:
    """Whether the daemon is stopping, and what it still takes while it does."""

    def __init__(self) -> None:
        self.since: float | None = None  # monotonic time of the stop; None: serving

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def check_attach(self) -> None:
        if self.draining:
            raise ShuttingDown(f"{STOP_TEXT}: it takes no new clients")

    def check_lease(self, *, working: bool, holding: bool) -> None:
        """A Lease from a client with an encode in flight (`working`) or leases for a
        request on its way (`holding`) goes on; any other is new work."""
        if self.draining and not (working or holding):
            raise ShuttingDown(f"{STOP_TEXT}: it takes no new work; send this to another daemon")

    def check_encode(self, *, leases: int, stream: bool, holding: bool = False) -> None:
        """A whole video naming leases its client holds goes on (the request was begun),
        and so does a stream whose client holds leases for a request on its way
        (`holding`: its first chunk's); a video with no lease, or a stream from a client
        holding none, is new work."""
        begun = holding if stream else leases > 0
        if self.draining and not begun:
            raise ShuttingDown(f"{STOP_TEXT}: it takes no new work; send this to another daemon")

    def stopped(self) -> ShuttingDown:
        """What work still running when the grace ends is told."""
        return ShuttingDown(f"{STOP_TEXT} and its grace period ended; this encode was stopped")
