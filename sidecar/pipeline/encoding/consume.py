"""Frames handed to an encoder: in the video's order, each once it has landed (see
landing), piece after piece. One loop, for encodes in the daemon and in encoder processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

from ...codec.encoder import VideoEncoder
from ...codec.landing import Frames, Landing

P = TypeVar("P")


class Handing:
    """Hands out the frames of a video's pieces in order. While frames still land, each is
    held back until it has; `check` runs while waiting, and raises to give up."""

    def __init__(self, landing: Landing | None, check: Callable[[], None]) -> None:
        self.landing = landing
        self._check = check
        self._handed = 0  # frames handed out so far, in order

    @property
    def still_landing(self) -> bool:
        """Whether frames may still be landing in the leases: not all have yet."""
        return self.landing is not None and not self.landing.complete

    def restart(self) -> None:
        """Hand out the same frames again from the first (a fallback encodes them anew)."""
        self._handed = 0

    def next(self, frames: np.ndarray) -> Frames:
        """`frames`, the next in the video, gated on their landing."""
        first, self._handed = self._handed, self._handed + len(frames)
        if self.landing is None:
            return frames
        return self.landing.gate(frames, first, self._check)


def encode_pieces(
    encoder: VideoEncoder,
    pieces: Iterable[P],
    frames_of: Callable[[P], np.ndarray],
    handing: Handing,
    after_each: Callable[[], None],
    consumed: Callable[[P], None] = lambda piece: None,
) -> None:
    """Every frame of `pieces` into `encoder`; `after_each` runs after every frame (it
    may raise to stop), `consumed` once a piece's last frame is inside the encoder."""
    for piece in pieces:
        encoder.encode_all(handing.next(frames_of(piece)), after_each)
        consumed(piece)
