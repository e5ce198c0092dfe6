"""Which way an encode goes to the daemon: one function, `choose_way`, from the request's
facts and what the daemon and this client serve now.

The ways, cheapest first for a request answered in one reply:

- "Framed": a kept connection to the daemon's framed socket (see `_framed`); its replies
  have no size limit to keep under, so any length goes;
- "EncodeSession": a kept gRPC call, one request at a time; it cannot carry a deadline;
- "EncodeOnce": a unary gRPC call, whose one reply is kept under gRPC's 7 MiB;
- "Encode": a server-streaming call, for progress, chunks, or an output that may outgrow
  one gRPC reply; a round of messages more than EncodeOnce;
- "EncodeStream": the frames themselves as a stream, each lease freed once encoded: for a
  video larger than the pool lets one request hold, or frames sent inline.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class WayName(str, enum.Enum):
    FRAMED = "Framed"
    SESSION = "EncodeSession"
    ONCE = "EncodeOnce"
    REPLIES = "Encode"
    STREAM = "EncodeStream"


# The ways an older daemon may lack (UNIMPLEMENTED, without seeing the request), or that
# may be out of reach (the framed socket): a request refused on one asks the next.
REFUSABLE = frozenset({WayName.FRAMED, WayName.SESSION, WayName.ONCE})


@dataclass(frozen=True)
class SendFacts:
    """What the choice reads."""

    # The frames go through leases: the slabs are mapped here (else inline, as a stream).
    slabs_mapped: bool
    # Every range of the video can be leased at once (else a stream, leases freed early).
    fits_in_pool: bool
    # The caller asked for progress or chunks: the replies must be a stream.
    wants_events: bool
    # The output cannot outgrow one gRPC reply: written to a file, or a short clip.
    small: bool
    # The request carries a deadline, which a request on a kept session cannot.
    has_deadline: bool
    # The one-reply ways this daemon and client serve now (`ClientCore.served_ways`):
    # read at each choice, since a way may be refused or lost between two.
    served: Callable[[], frozenset[WayName]]


# The ways a request answered in one reply may take, cheapest first.
ONE_REPLY_WAYS = (WayName.FRAMED, WayName.SESSION, WayName.ONCE)


def one_reply_way(served: frozenset[WayName], has_deadline: bool) -> WayName:
    """The cheapest one-reply way served, for a request with or without a deadline;
    REPLIES (a reply stream, which every daemon serves) when none is."""
    for way in ONE_REPLY_WAYS:
        if way in served and not (way is WayName.SESSION and has_deadline):
            return way
    return WayName.REPLIES


def choose_way(facts: SendFacts) -> WayName:
    """The way an encode goes (docs/client.md has the table). A video too large for the
    pool, or sent inline, is a stream; a caller wanting events gets a reply stream; else
    the cheapest one-reply way offered, but only the framed socket takes an output that
    may outgrow one gRPC reply."""
    if not facts.slabs_mapped or not facts.fits_in_pool:
        return WayName.STREAM
    if facts.wants_events:
        return WayName.REPLIES
    offered = one_reply_way(facts.served(), facts.has_deadline)
    if offered is WayName.FRAMED:  # no reply size to keep under
        return offered
    if not facts.small:  # its output may not fit one gRPC reply
        return WayName.REPLIES
    return offered
