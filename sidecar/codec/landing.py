"""Frames still landing when their request comes: the encoder takes each once it is there.

A client copying a long video from a GPU may send its request before the copy is done
(`EncodeRequest.landed_count_offset`), so that the daemon's work before the first frame,
and the encode of the first frames, overlap the copy of the rest. It then counts the
frames that have landed in a little-endian uint32 in its last lease, past its frames, and
only ever raises it. The encoder reads that count before each frame and waits while the
frame is not yet counted: a few microseconds of polling at first, then up to a
millisecond at a time (a 1344x768 frame lands in about 30 us and takes about 0.8 ms to
encode, so after the first few the encoder never waits).

The count is the client's word, like the frames themselves: a wrong one can only spoil
its own video. A count that stops rising for `STALL_S` fails the request. A request that
ends before every frame is counted, for any reason, gives its leases back to the client
instead of freeing them: its copies may still be landing in them, and another client
must never be handed that memory. The client releases them once its copies are done, or
the TTL reclaims them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import InvalidRequest
from ..vocabulary import LANDED_COUNT_BYTES as COUNT_BYTES

STALL_S = 10.0  # a count that rises no further for this long fails the request
FIRST_PAUSE_S = 20e-6
LONGEST_PAUSE_S = 1e-3
FIELD = "landed_count_offset"


class Landing:
    """The landed-frame count of one request, read from slab memory."""

    def __init__(self, slab: np.ndarray, offset: int, total: int) -> None:
        self._count = np.ndarray((1,), dtype="<u4", buffer=slab, offset=offset)
        self.total = total

    def landed(self) -> int:
        return min(int(self._count[0]), self.total)

    @property
    def complete(self) -> bool:
        return self.landed() >= self.total

    def wait_for(self, frames: int, check: Callable[[], None]) -> None:
        """Return once at least `frames` frames have landed. `check` runs between looks
        and may raise to stop waiting (the request was cancelled)."""
        seen = self.landed()
        if seen >= frames:
            return
        pause, since = FIRST_PAUSE_S, time.monotonic()
        while True:
            check()
            time.sleep(pause)
            now = self.landed()
            if now >= frames:
                return
            if now != seen:
                seen, since, pause = now, time.monotonic(), FIRST_PAUSE_S
            elif time.monotonic() - since > STALL_S:
                raise InvalidRequest(
                    FIELD,
                    f"the frames stopped landing: {now} of {self.total} counted, none more "
                    f"for {STALL_S:g} s",
                )
            else:
                pause = min(pause * 2, LONGEST_PAUSE_S)

    def gate(self, images: np.ndarray, first: int, check: Callable[[], None]) -> LandedFrames:
        """`images` (frames `first`... of the video), each handed out once it has landed."""
        return LandedFrames(self, images, first, check)


class LandedFrames:
    """A video piece's frames as a sequence whose items wait for their frame to land."""

    def __init__(
        self, landing: Landing, images: np.ndarray, first: int, check: Callable[[], None]
    ) -> None:
        self._landing = landing
        self._images = images
        self._first = first
        self._check = check

    def __len__(self) -> int:
        return len(self._images)

    def __getitem__(self, index: int) -> np.ndarray:
        self._landing.wait_for(self._first + index + 1, self._check)
        image: np.ndarray = self._images[index]
        return image

    def __iter__(self) -> Iterator[np.ndarray]:
        for index in range(len(self._images)):
            yield self[index]


Frames = np.ndarray | LandedFrames  # a piece's frames, borrowed, maybe still landing


def check_place(offset: int, frames_end: int, lease_size: int) -> None:
    """That a count at `offset` in a lease of `lease_size` bytes, whose frames end at
    `frames_end`, is 4-aligned, past the frames and inside the lease."""
    if offset % COUNT_BYTES:
        raise InvalidRequest(FIELD, f"{offset} is not a multiple of {COUNT_BYTES}")
    if offset < frames_end:
        raise InvalidRequest(
            FIELD, f"{offset} is inside the frames, which end at byte {frames_end} of the lease"
        )
    if offset + COUNT_BYTES > lease_size:
        raise InvalidRequest(
            FIELD, f"{offset} leaves no room for the count in the lease's {lease_size} bytes"
        )
