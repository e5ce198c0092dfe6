"""Which way an encode goes to the daemon: one function, `choose_way`, from the request's
facts.

- "Framed": a kept connection to the daemon's framed socket (see `_framed`), for a worker
  on the daemon's host: one reply, whatever the output's size, without HTTP/2;
- "Encode": the server-streaming gRPC call, for progress or output chunks, a remote
  worker, or a daemon whose framed socket is out of reach;
- "EncodeStream": the frames themselves as a stream, each lease freed once encoded: for
  frames sent as they are made, a video larger than the pool lets one request hold, or
  frames sent inline.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class WayName(str, enum.Enum):
    FRAMED = "Framed"
    REPLIES = "Encode"
    STREAM = "EncodeStream"


@dataclass(frozen=True)
class SendFacts:
    """What the choice reads."""

    # The frames go through leases: the slabs are mapped here (else inline, as a stream).
    slabs_mapped: bool
    # Every range of the video can be leased at once (else a stream, leases freed early).
    fits_in_pool: bool
    # The caller asked for progress or chunks: the replies must be a stream.
    wants_events: bool
    # Whether the framed socket is in reach now (`ClientCore.framed`): read at each
    # choice, since it may be lost between two.
    framed: Callable[[], bool]


def choose_way(facts: SendFacts) -> WayName:
    """The way an encode goes (docs/client.md has the table). A video too large for the
    pool, or sent inline, is a stream; a caller wanting events gets Encode's reply
    stream; else the framed socket where it is in reach, and Encode where it is not."""
    if not facts.slabs_mapped or not facts.fits_in_pool:
        return WayName.STREAM
    if facts.wants_events or not facts.framed():
        return WayName.REPLIES
    return WayName.FRAMED
