"""Videos the client accepts, and how their frames get into a leased region.

The client never imports torch itself: a tensor is recognised by its type's module, and
only then is torch (already loaded by the caller) used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._errors import InvalidVideo

PACKED_CHANNELS = {"rgb24": 3, "bgr24": 3, "rgba": 4}
PIXEL_FORMATS = ("rgb24", "bgr24", "rgba", "gray", "yuv420p", "nv12")


class VideoSource(Protocol):
    """Frames ready to be copied into leases, all of one size and pixel format."""

    frames: int
    width: int
    height: int
    pixel_format: str

    @property
    def frame_bytes(self) -> int: ...

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        """Write frames [start, start+count) tightly packed at the start of `region`."""


def is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "device")


def frame_shape(pixel_format: str, width: int, height: int) -> tuple[int, ...]:
    if pixel_format in PACKED_CHANNELS:
        return (height, width, PACKED_CHANNELS[pixel_format])
    if pixel_format == "gray":
        return (height, width)
    return (height * 3 // 2, width)


@dataclass
class HostVideo:
    """A uint8 array in host memory (numpy, or a CPU tensor seen through numpy)."""

    array: np.ndarray
    frames: int
    width: int
    height: int
    pixel_format: str

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(frame_shape(self.pixel_format, self.width, self.height)))

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        shape = (count, *frame_shape(self.pixel_format, self.width, self.height))
        dst = region[: count * self.frame_bytes].reshape(shape)
        # One pass over the bytes; handles non-contiguous sources too.
        np.copyto(dst, self.array[start : start + count].reshape(shape), casting="no")


def host_video(video: Any, pixel_format: str = "rgb24") -> HostVideo:
    """Check a video's type, dtype and shape against `pixel_format`."""
    if pixel_format not in PIXEL_FORMATS:
        raise InvalidVideo(f"unknown pixel_format {pixel_format!r}; use one of {PIXEL_FORMATS}")
    if is_torch_tensor(video):
        if video.device.type != "cpu":
            raise InvalidVideo(
                f"tensor on {video.device}: this build of the client accepts CPU tensors only"
            )
        video = video.detach()
        if str(video.dtype) != "torch.uint8":
            raise InvalidVideo(f"tensor dtype {video.dtype}: expected torch.uint8")
        video = video.numpy()
    if not isinstance(video, np.ndarray):
        raise InvalidVideo(f"expected a numpy array or torch tensor, got {type(video).__name__}")
    if video.dtype != np.uint8:
        raise InvalidVideo(f"dtype {video.dtype}: expected uint8")
    shape = video.shape
    if pixel_format in PACKED_CHANNELS:
        channels = PACKED_CHANNELS[pixel_format]
        if video.ndim != 4 or shape[3] != channels:
            raise InvalidVideo(
                f"shape {shape}: {pixel_format} video must be (frames, height, width, {channels})"
            )
        frames, height, width = shape[:3]
    elif pixel_format == "gray":
        if not (video.ndim == 3 or (video.ndim == 4 and shape[3] == 1)):
            raise InvalidVideo(f"shape {shape}: gray video must be (frames, height, width)")
        frames, height, width = shape[:3]
    else:
        if video.ndim != 3 or shape[1] % 3:
            raise InvalidVideo(
                f"shape {shape}: {pixel_format} video must be (frames, height*3/2, width)"
            )
        frames, height, width = shape[0], shape[1] * 2 // 3, shape[2]
    if min(frames, height, width) < 1:
        raise InvalidVideo(f"shape {shape}: empty video")
    return HostVideo(video, frames, width, height, pixel_format)
