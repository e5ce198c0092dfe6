"""Synthetic test videos: smooth moving content, optionally with mild noise.

Used by the demo, the tests and the benchmark. Never all zeros: encoders are much
faster on flat frames than on anything a model would produce.
"""

from __future__ import annotations

import numpy as np


def _texture(height: int, width: int) -> np.ndarray:
    """Smooth colour waves: each channel a sum of outer products of 1-D waves."""
    x = np.arange(width, dtype=np.float32)
    y = np.arange(height, dtype=np.float32)
    tex = np.empty((height, width, 3), dtype=np.float32)
    tex[..., 0] = 128 + np.multiply.outer(100 * np.cos(y / 97.0), np.sin(x / 41.0))
    tex[..., 1] = 128 + np.add.outer(60 * np.sin(y / 33.0), 40 * np.cos(x / 71.0))
    tex[..., 2] = (
        128
        + 90
        * (
            np.multiply.outer(np.cos(y / 59.0), np.sin(x / 59.0))
            + np.multiply.outer(np.sin(y / 59.0), np.cos(x / 59.0))
        )
        / 2
    )
    return tex


def moving_pattern(
    frames: int,
    height: int,
    width: int,
    *,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """A (frames, height, width, 3) uint8 RGB video of colour waves panning diagonally.

    Smooth enough that H.264 at crf 18 keeps it above 40 dB PSNR. `noise` adds Gaussian
    grain of that standard deviation (in 8-bit levels) that moves from frame to frame.
    """
    dx, dy = 3, 2  # pixels per frame
    tex = _texture(height + dy * frames, width + dx * frames)
    if noise:
        rng = np.random.default_rng(seed)
        tex += rng.standard_normal(tex.shape, dtype=np.float32) * noise
    np.clip(tex, 0, 255, out=tex)
    texture = tex.astype(np.uint8)
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for t in range(frames):
        out[t] = texture[dy * t : dy * t + height, dx * t : dx * t + width]
    return out
