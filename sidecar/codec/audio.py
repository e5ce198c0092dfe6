"""The optional audio track: PCM in, AAC (MP4) or Opus (WebM) packets out.

The track follows the video: after each video frame the samples up to that frame's time
are encoded, so the muxer can interleave them; at the end the track is padded with
silence or trimmed to the video's duration, so both durations agree to within one audio
frame. The AAC encoder's priming samples are described by an edit list, which the MP4
muxer writes, so players start the audio on time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import av
import numpy as np

from .audio_format import MAX_CHANNELS, AudioFormat

AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)

# One layout per channel count, the same for AAC and Opus: those libopus's multichannel
# mapping (family 1) accepts. FFmpeg's defaults for 3 and 4 channels (2.1, 4.0) are not
# among them, and libopus refused to open. Channels keep their order in the output.
LAYOUTS = {1: "mono", 2: "stereo", 3: "3.0", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}


def _layout(channels: int) -> str:
    return LAYOUTS[channels]


@dataclass
class AudioTrack:
    """Encodes PCM (given at any time) into an output audio stream, in step with video."""

    stream: av.audio.stream.AudioStream
    fmt: AudioFormat
    pcm: np.ndarray | None = None  # (samples, channels) float32, set once all has arrived
    sent: int = 0  # input samples handed to the encoder so far
    _resampler: av.AudioResampler | None = field(default=None, repr=False)
    _pts: int = 0

    @classmethod
    def add_to(
        cls, container: av.container.OutputContainer, fmt: AudioFormat, codec: str
    ) -> AudioTrack:
        rate = 48000 if codec == "libopus" else (
            fmt.sample_rate if fmt.sample_rate in AAC_RATES else 48000
        )  # fmt: skip
        stream = container.add_stream(codec, rate=rate)
        assert isinstance(stream, av.audio.stream.AudioStream)
        stream.layout = _layout(fmt.channels)
        stream.codec_context.bit_rate = 64000 * min(fmt.channels, 2)
        if codec == "libopus" and fmt.channels > 2:
            # Family 1 (Vorbis order) explicitly: libopus's default (-1) writes family 1
            # but does not reorder FFmpeg's channel order, which swaps channels at 5 and 7.
            stream.codec_context.options = {"mapping_family": "1"}
        stream.time_base = Fraction(1, rate)
        stream.codec_context.open()  # now frame_size is known, for the resampler
        return cls(stream, fmt)

    def encode_until(self, seconds: float) -> list[Any]:
        """Encode the input up to `seconds` of media time, as far as it has arrived."""
        if self.pcm is None:
            return []
        upto = min(round(seconds * self.fmt.sample_rate), len(self.pcm))
        return self._encode(self.pcm[self.sent : upto]) if upto > self.sent else []

    def finish(self, duration: float) -> list[Any]:
        """Pad or trim to `duration`, drain the encoder; returns the remaining packets."""
        total = round(duration * self.fmt.sample_rate)
        have = np.zeros((0, self.fmt.channels), np.float32) if self.pcm is None else self.pcm
        rest = have[self.sent : total]
        missing = total - max(self.sent, min(len(have), total))
        if missing > 0:
            rest = np.concatenate([rest, np.zeros((missing, self.fmt.channels), np.float32)])
        packets = self._encode(rest) if len(rest) else []
        for frame in self._resample(None):
            packets += self.stream.encode(frame)
        packets += self.stream.encode(None)
        return packets

    def _encode(self, pcm: np.ndarray) -> list[Any]:
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.float32).reshape(1, -1),
            format="flt",
            layout=_layout(self.fmt.channels),
        )
        frame.sample_rate = self.fmt.sample_rate
        frame.pts = self.sent
        frame.time_base = Fraction(1, self.fmt.sample_rate)
        self.sent += len(pcm)
        packets: list[Any] = []
        for out in self._resample(frame):
            packets += self.stream.encode(out)
        return packets

    def _resample(self, frame: av.AudioFrame | None) -> list[av.AudioFrame]:
        ctx = self.stream.codec_context
        if self._resampler is None:
            self._resampler = av.AudioResampler(
                format=ctx.format.name,
                layout=ctx.layout.name,
                rate=ctx.sample_rate,
                frame_size=ctx.frame_size or None,
            )
        frames = self._resampler.resample(frame)
        for out in frames:
            out.pts = self._pts
            out.time_base = Fraction(1, ctx.sample_rate)
            self._pts += out.samples
        return frames


__all__ = ["LAYOUTS", "MAX_CHANNELS", "AudioFormat", "AudioTrack"]
