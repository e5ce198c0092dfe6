"""The PCM a request may send for its audio track: its format, checked, and its samples
as float32. No PyAV here: the request layer imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidRequest

SAMPLE_DTYPES: dict[str, np.dtype[Any]] = {"f32": np.dtype("<f4"), "s16": np.dtype("<i2")}
MAX_CHANNELS = 8


@dataclass(frozen=True)
class AudioFormat:
    sample_rate: int
    channels: int
    sample_format: str  # "f32" or "s16", interleaved

    def check(self) -> AudioFormat:
        if not 8000 <= self.sample_rate <= 192000:
            raise InvalidRequest("audio.sample_rate", f"{self.sample_rate} is outside 8000..192000")
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise InvalidRequest("audio.channels", f"{self.channels} is outside 1..{MAX_CHANNELS}")
        if self.sample_format not in SAMPLE_DTYPES:
            raise InvalidRequest(
                "audio.sample_format", f"{self.sample_format!r}: use f32 or s16 (interleaved)"
            )
        return self

    @property
    def frame_bytes(self) -> int:
        """Bytes per sample frame (one sample of every channel)."""
        return SAMPLE_DTYPES[self.sample_format].itemsize * self.channels

    def samples(self, data: bytes | memoryview | np.ndarray) -> np.ndarray:
        """(samples, channels) float32 in [-1, 1] from interleaved PCM bytes."""
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size % self.frame_bytes:
            raise InvalidRequest(
                "audio_data",
                f"{raw.size} bytes is not a whole number of {self.channels}-channel "
                f"{self.sample_format} samples",
            )
        pcm = raw.view(SAMPLE_DTYPES[self.sample_format]).reshape(-1, self.channels)
        out: np.ndarray
        if self.sample_format == "s16":
            out = pcm.astype(np.float32) / 32768.0
        else:
            out = np.nan_to_num(pcm, nan=0.0, posinf=1.0, neginf=-1.0).clip(-1.0, 1.0)
        return out
