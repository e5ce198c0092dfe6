"""Audio the client accepts: PCM shaped (samples, channels), float32 or int16."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import SAMPLE_FORMATS

from ._checks import whole
from ._errors import InvalidArgument
from ._video import is_torch_tensor

INLINE_PIECE = 3 * 1024 * 1024  # inline audio travels in pieces well under 4 MiB
SAMPLE_FORMAT_OF = {"i": "s16", "f": "f32"}  # by dtype kind: int16 or float32, as prepared


@dataclass(frozen=True)
class Pcm:
    """Interleaved PCM ready to send."""

    data: np.ndarray  # (samples, channels), float32 or int16, C-contiguous
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def spec(self) -> pb.AudioSpec:
        fmt = cast("pb.SampleFormat", SAMPLE_FORMATS[SAMPLE_FORMAT_OF[self.data.dtype.kind]])
        return pb.AudioSpec(sample_rate=self.sample_rate, channels=self.channels, sample_format=fmt)

    def inline_pieces(self) -> list[pb.AudioData]:
        raw = self.data.reshape(-1).view(np.uint8)
        return [
            pb.AudioData(inline=raw[i : i + INLINE_PIECE].tobytes())
            for i in range(0, raw.size, INLINE_PIECE)
        ]


def prepare_audio(audio: Any, sample_rate: int | None) -> Pcm:
    """Check a PCM track: (samples,) or (samples, channels), float or int16."""
    if sample_rate is None:
        raise InvalidArgument("sample_rate None: pass the audio's rate, 8000..192000")
    sample_rate = whole("sample_rate", sample_rate, 8000, 192000)
    if is_torch_tensor(audio):
        audio = audio.detach().cpu()
        if str(audio.dtype) == "torch.bfloat16":
            audio = audio.float()
        audio = audio.numpy()
    if not isinstance(audio, np.ndarray):
        raise InvalidArgument(
            f"audio: expected a numpy array or tensor, got {type(audio).__name__}"
        )
    if audio.ndim == 1:
        audio = audio[:, None]
    if audio.ndim != 2 or not 1 <= audio.shape[1] <= 8 or audio.shape[0] < 1:
        raise InvalidArgument(f"audio shape {audio.shape}: expected (samples, channels<=8)")
    if audio.dtype == np.int16:
        data = np.ascontiguousarray(audio, dtype="<i2")
    elif np.issubdtype(audio.dtype, np.floating):
        data = np.ascontiguousarray(audio, dtype="<f4")
    else:
        raise InvalidArgument(f"audio dtype {audio.dtype}: expected float32 or int16")
    return Pcm(data, int(sample_rate))
