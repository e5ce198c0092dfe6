"""How many threads an encode gets, and of which kind: frame threads for long clips,
slices for short ones, the cores shared among the encodes that run at once."""

from __future__ import annotations

from .catalogue import SHORT_CLIP_FRAMES
from .frames import Geometry


def threading_for(
    frames: int, height: int, cores: int, *, converts: bool = False
) -> tuple[int, str]:
    """(threads, thread_type) for an encode given `cores` to itself.

    Frame threads need frames to work on: a short clip gets slice threads instead (each
    frame split across cores, at least three macroblock rows a slice; x264 gets fewer
    for a small frame, see `slice_threads`), a long one frame threads (`frame_threads`,
    or `converting_frame_threads` when swscale converts its frames beside it), never
    more than it has frames.
    """
    if frames <= SHORT_CLIP_FRAMES:
        rows = (height + 15) // 16
        return max(1, min(cores, rows // 3)), "SLICE"
    threads = converting_frame_threads(cores) if converts else frame_threads(cores)
    return max(1, min(threads, frames)), "FRAME"


PAIRED_SLICE_MIN_MACROBLOCKS = 1000
# Presets from `veryfast` down do enough work per macroblock for a second slice thread to
# pay on a small frame too (x264's and x265's names).
WORKED_PRESETS = frozenset(
    {"veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo"}
)


def slice_threads(geometry: Geometry, threads: int, preset: str = "") -> int:
    """x264 slice threads for frames of `geometry` at `preset`, given `threads`: one
    instead of two on a frame under `PAIRED_SLICE_MIN_MACROBLOCKS` at a light preset
    (`ultrafast`, `superfast`, or none named), where the second thread's hand-off each
    frame costs more than it saves. At ultrafast on the 2-core machine 448x256x4 (448
    macroblocks a frame) encoded in 2.9-3.3 ms on one thread and in 3.5 ms on two, idle;
    with an encoder opening beside it, as the daemon's processes do, in 3.5-3.6 ms and
    3.6-4.8 ms. At veryfast (`balanced`) two pay there: through the daemon, 0.83-0.84x of
    upstream A's time against 0.95-1.01x on one (bench/results/2026-12-06-cpu2-slices.md).
    More threads pay at any preset: on the 16-core host five took 1.8-2.2 ms and one
    3.4-4.5 ms. (The colour converter keeps its `threads`.)"""
    macroblocks = ((geometry.width + 15) // 16) * ((geometry.height + 15) // 16)
    if threads == 2 and macroblocks < PAIRED_SLICE_MIN_MACROBLOCKS and preset not in WORKED_PRESETS:
        return 1
    return threads


def frame_threads(cores: int) -> int:
    """x264 frame threads for one stream with `cores` to itself: one a core up to four
    cores, three in four past that, leaving the rest to the thread that feeds it frames
    and muxes its packets, and to the daemon around it. On 16 cores 12 threads encoded
    1344x768x122 11-12% faster than 16 (bench/results/2026-11-30-h200-threads-ab.md); 32
    were 30-45% slower (-frame-threads-ab.json). On 2 cores two were faster than one."""
    return cores if cores <= 4 else cores - cores // 4


def converting_frame_threads(cores: int) -> int:
    """x264 frame threads for one stream whose RGB frames are converted beside it, by
    swscale with up to 8 threads of its own (`FrameConverter`): half the cores past four,
    so that the two do not fight over them. On 16 cores 8 threads encoded rgb24
    1344x768x122 2-20% faster than 12 on three hosts (-h200-threads-ab.md)."""
    return cores if cores <= 4 else cores // 2


def converts(geometry: Geometry) -> bool:
    """Whether frames of this geometry go through swscale before the encoder."""
    return geometry.layout.name != "yuv420p"
