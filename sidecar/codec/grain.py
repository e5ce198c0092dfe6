"""How grainy a video is, from its first frame: per-pixel noise wants settings of its own.

x264's settings for the `balanced` profile were chosen on photographs and smooth generated
video. On frames with grain (noise that changes from pixel to pixel and frame to frame)
the same settings lose 0.5-0.6 dB of PSNR against diffusers' `export_to_video` at its
size; a finer motion search and full-strength adaptive quantisation win most of it back
(`bench/rdt.py`, docs/performance.md). The profile names those settings (`Profile.grain`),
and a request whose first frame measures as grainy is encoded with them.

The measure is Immerkaer's noise estimate (a 3x3 mask that cancels planes and straight
gradients), made robust to edges by taking the median of its magnitude instead of the
mean. It reads one plane that carries the picture's detail (green of packed RGB, luma of
planar YUV and grey) on a subset of rows, some 16,000 pixels whatever the frame's size:
about 60 us on the 2-core machine, read as strided views and worked on in place (110 us
with the rows gathered first; 0.9 ms when 48 whole rows were read at 1344x768 and
1920x1080), in line before every encode in the daemon's main process, where on a GPU host
serving eight clients it was in 18% of py-spy's samples of that process's GIL (the bench's
photographs, smooth frames and grain measure the same either way, from 448x256 to
1920x1080).
"""

from __future__ import annotations

import math

import numpy as np

from ..vocabulary import PixelFormat

# Estimated noise, in levels of the plane read, at or above which a frame counts as
# grainy. The bench's grain (sigma 4 per channel) measures 4.0 on green, 2.3 on limited-
# range luma; its photographs, panned and scaled, 0.2-1.0; smooth generated frames 0.2.
GRAINY_SIGMA = 1.5

# Rows read from a frame (each with its two neighbours): enough for `SAMPLE_PIXELS`
# samples, within these bounds.
SAMPLE_PIXELS = 16_384
SAMPLE_ROWS = (8, 48)

# The median of |N(0, 1)| is 0.6745; the mask's response to noise of sigma s has the
# standard deviation 6 s.
_MEDIAN_TO_SIGMA = 1.0 / (6.0 * 0.6745)


def detail_plane(frame: np.ndarray, pixel_format: PixelFormat, height: int) -> np.ndarray:
    """The (height, width) plane of `frame` (one frame as the lease holds it) that
    carries its detail: green of packed RGB, else the first plane (luma, or grey)."""
    if frame.ndim == 2:  # grey (H, W), or 4:2:0 as (H*3/2, W): luma comes first
        return frame[:height]
    green = 1  # rgb24, bgr24 and rgba alike
    return frame[..., green]


def noise_sigma(plane: np.ndarray) -> float:
    """The plane's per-pixel noise, in its levels (0.0 for a plane too small to tell)."""
    rows, cols = plane.shape[:2]
    if rows < 3 or cols < 3:
        return 0.0
    fewest, most = SAMPLE_ROWS
    sampled = max(fewest, min(most, SAMPLE_PIXELS // (cols - 2)))
    step = max(1, math.ceil((rows - 2) / sampled))
    # Rows 1, 1 + step, ... and their neighbours, as strided views (no gathering copy);
    # the arithmetic runs in place: this runs in the daemon's main process before every
    # encode, where each temporary and each call holds its GIL a little.
    stop = len(range(1, rows - 1, step)) * step
    vertical = plane[0:stop:step].astype(np.int16)
    vertical += plane[2 : stop + 2 : step]
    middle = plane[1 : stop + 1 : step].astype(np.int16)
    vertical -= middle
    vertical -= middle
    # [1 -2 1; -2 4 -2; 1 -2 1] = (row above - 2 middle + row below), then [1 -2 1] across
    response = vertical[:, :-2] + vertical[:, 2:]
    response -= vertical[:, 1:-1]
    response -= vertical[:, 1:-1]
    magnitude = np.abs(response, out=response)
    return float(np.median(magnitude)) * _MEDIAN_TO_SIGMA


def is_grainy(frame: np.ndarray, pixel_format: PixelFormat, height: int) -> bool:
    """Whether one frame (as the lease holds it) has grain enough for the grain settings."""
    return noise_sigma(detail_plane(frame, pixel_format, height)) >= GRAINY_SIGMA
