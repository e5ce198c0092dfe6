"""How a video's frames are split into leases, and the host work of copying them there."""

from __future__ import annotations

import functools
from typing import Any

from ._errors import InvalidArgument
from ._steps import Work
from ._types import Attachment
from ._video import VideoSource

# Host copies larger than this run on a worker thread in the async client, so that its
# event loop keeps turning; smaller ones are not worth the hop.
THREAD_COPY_BYTES = 4 * 1024 * 1024


def copy_step(source: VideoSource, region: Any, first: int, count: int) -> Work:
    """Copying frames [first, first+count) of `source` to the start of `region`."""
    copy = functools.partial(source.copy_into, region, first, count)
    return Work(copy, long=count * source.frame_bytes >= THREAD_COPY_BYTES)


def plan_ranges(frames: int, frame_bytes: int, att: Attachment) -> list[tuple[int, int]]:
    """Split a video into (first frame, count) ranges, one lease each, none over a slab."""
    per_lease = att.max_lease_bytes // frame_bytes
    if per_lease < 1:
        raise InvalidArgument(
            f"one frame is {frame_bytes} bytes but the daemon's slabs hold {att.max_lease_bytes}; "
            "start the daemon with a larger --slab-size"
        )
    return [(start, min(per_lease, frames - start)) for start in range(0, frames, per_lease)]


def fits_in_pool(ranges: list[tuple[int, int]], frame_bytes: int, att: Attachment) -> bool:
    """Whether every range can be leased at once; if not, the video goes as a stream,
    each range's lease freed as its frames are encoded."""
    largest = max(count for _, count in ranges) * frame_bytes
    aligned = (largest + att.alignment - 1) // att.alignment * att.alignment
    room = sum(s.size // aligned for s in att.slabs)
    # Leave room for others: a single request takes at most half the pool at once.
    return len(ranges) <= max(1, room // 2)
