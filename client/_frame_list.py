"""A video given as a sequence of frames, as diffusers pipelines hand it over.

`pipe(...).frames[0]` with `output_type="pil"` is a list of PIL images; people also build
lists of (H, W, C) arrays, or of (C, H, W) or (H, W, C) tensors, one per frame. Such a
list is seen here as one (T, H, W, C) array without ever stacking it: `FrameList` answers
`shape`, `dtype` and indexing, and a slice of frames stacks only those frames (a batch,
which the conversion bounds) or, for uint8 frames, copies each one straight into the
lease (`copy_frames`). A PIL image is turned into an array only when its frame is read.

Every frame is checked against the first before anything is sent (cheaply: sizes, modes,
dtypes and devices, never the pixels), and the first that differs is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import InvalidVideo
from ._layout import guess_layout

# PIL modes taken as they are, by the channels they give; any other is named with its fix.
PIL_MODES = {"RGB": 3, "RGBA": 4, "L": 1}
FRAME_LAYOUTS = {"THWC": "HWC", "TCHW": "CHW"}  # a list's layout, and each frame's


def is_frame_sequence(video: Any) -> bool:
    return isinstance(video, (list, tuple))


def is_pil_image(obj: Any) -> bool:
    """A PIL image, recognised without importing PIL."""
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(obj).__mro__)


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "device")


def one_video(frames: Sequence[Any]) -> Sequence[Any]:
    """`frames` as one video's frames: `pipe(...).frames` of one video (a list holding one
    list) is unwrapped; a batch of several is refused, naming `frames[0]`."""
    if not frames:
        raise InvalidVideo("an empty list of frames: a video needs at least one")
    if not is_frame_sequence(frames[0]):
        return frames
    if len(frames) > 1:
        raise InvalidVideo(
            f"a batch of {len(frames)} videos (a list of {len(frames)} lists of frames): "
            "pass one video, frames[0], and send the others one by one"
        )
    inner = frames[0]
    if inner and is_frame_sequence(inner[0]):
        raise InvalidVideo("frames[0][0] is a list: a video is a list of frames, not deeper")
    return one_video(inner)


class FrameList:
    """The frames of a list seen as one (T, H, W, C) array, never stacked whole."""

    def __init__(self, frames: Sequence[Any], layout: str | None = None) -> None:
        self._items = list(one_video(frames))
        first = self._items[0]
        self.torch: Any = None
        if is_pil_image(first):
            self._kind = "pil"
        elif _is_tensor(first):
            import torch  # the caller already imported it

            self.torch = torch
            self._kind = "tensor"
        elif isinstance(first, np.ndarray):
            self._kind = "array"
        else:
            raise InvalidVideo(
                f"frames[0] is a {type(first).__name__}: a list of frames holds PIL images, "
                "numpy arrays or torch tensors"
            )
        self._frame_layout = self._layout_of(first, layout)
        height, width, channels = self._hwc(first)
        self.shape = (len(self._items), height, width, channels)
        self.dtype = np.dtype(np.uint8) if self._kind == "pil" else first.dtype
        self.device = first.device if self._kind == "tensor" else None
        for index, item in enumerate(self._items[1:], start=1):
            self._check_like_first(index, item)

    # -- what the conversion reads ------------------------------------------------------

    ndim = 4

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> Any:
        """Frames picked by the first index, each indexed by the rest, stacked (only
        those: a batch, or a strided sample); an int gives one frame."""
        first, rest = (index[0], index[1:]) if isinstance(index, tuple) else (index, ())
        if isinstance(first, (int, np.integer)):
            return self.frame(int(first))[rest]
        if not isinstance(first, slice):
            raise TypeError(f"frames are picked by an int or a slice, not {first!r}")
        picked = [self.frame(i)[rest] for i in range(*first.indices(len(self)))]
        if self.torch is not None:
            return self.torch.stack(picked)
        return np.stack(picked)

    def frame(self, index: int) -> Any:
        """Frame `index` as (H, W, C): a view of the caller's array or tensor, or a PIL
        image's pixels (read now)."""
        item = self._items[index]
        if self._kind == "tensor":
            item = item.detach()
        elif self._kind == "pil":
            pixels = np.asarray(item)
            return pixels[..., None] if pixels.ndim == 2 else pixels
        if item.ndim == 2:
            return item[..., None]
        if self._frame_layout == "CHW":
            return item.permute(1, 2, 0) if self.torch is not None else item.transpose(1, 2, 0)
        return item

    def copy_frames(self, dst: Any, first: int, last: int) -> None:
        """Frames [first, last) into `dst` (k, ...), one at a time: no batch is stacked."""
        for i in range(first, last):
            out = self.frame(i)
            part = dst[i - first]
            if hasattr(part, "copy_"):
                part.copy_(out.reshape(part.shape))
            else:
                np.copyto(part, np.asarray(out).reshape(part.shape), casting="no")

    # -- checks --------------------------------------------------------------------------

    def _layout_of(self, first: Any, layout: str | None) -> str:
        """HWC or CHW: `layout` ("THWC"/"TCHW", the list read as one video), else the
        first frame's shape says; 2-D frames are gray."""
        if self._kind == "pil":
            return "HWC"
        if first.ndim == 2:
            return "HW"
        if first.ndim != 3:
            raise InvalidVideo(
                f"frames[0] has shape {tuple(first.shape)}: each frame of a list is "
                "(H, W, C), (C, H, W) or (H, W)"
            )
        if layout is not None:
            named = FRAME_LAYOUTS.get(str(layout).upper())
            if named is None:
                raise InvalidVideo(
                    f"layout {layout!r} for a list of frames: use 'THWC' ((H, W, C) frames) "
                    "or 'TCHW' ((C, H, W) frames)"
                )
            return named
        found = guess_layout((1, *first.shape))
        if found not in FRAME_LAYOUTS:
            raise InvalidVideo(
                f"frames[0] has shape {tuple(first.shape)}: pass layout='THWC' for (H, W, C) "
                "frames or layout='TCHW' for (C, H, W)"
            )
        return FRAME_LAYOUTS[found]

    def _hwc(self, item: Any) -> tuple[int, int, int]:
        if self._kind == "pil":
            channels = PIL_MODES.get(item.mode)
            if channels is None:
                raise InvalidVideo(
                    f"PIL mode {item.mode!r}: frames are RGB, RGBA or L; convert them with "
                    "[image.convert('RGB') for image in frames]"
                )
            width, height = item.size
            return height, width, channels
        shape = tuple(int(n) for n in item.shape)
        if self._frame_layout == "HW":
            return shape[0], shape[1], 1
        if self._frame_layout == "CHW":
            return shape[1], shape[2], shape[0]
        return shape[0], shape[1], shape[2]

    def _check_like_first(self, index: int, item: Any) -> None:
        """Frame `index` is of the first frame's kind, size, mode or dtype, and device."""
        name = f"frames[{index}]"
        kind_ok = {
            "pil": is_pil_image(item),
            "tensor": _is_tensor(item),
            "array": isinstance(item, np.ndarray),
        }[self._kind]
        if not kind_ok:
            raise InvalidVideo(
                f"{name} is a {type(item).__name__}, frames[0] a {type(self._items[0]).__name__}: "
                "every frame of a list must be of one kind"
            )
        if self._kind == "pil" and item.mode != self._items[0].mode:
            raise InvalidVideo(
                f"{name} is a PIL {item.mode!r} image, frames[0] {self._items[0].mode!r}: "
                "convert every frame to one mode, e.g. image.convert('RGB')"
            )
        if self._kind != "pil" and item.ndim != self._items[0].ndim:
            raise InvalidVideo(
                f"{name} has shape {tuple(item.shape)}, frames[0] "
                f"{tuple(self._items[0].shape)}: every frame must have one shape"
            )
        if self._hwc(item) != self.shape[1:]:
            _, h, w, c = self.shape
            hh, ww, cc = self._hwc(item)
            raise InvalidVideo(
                f"{name} is {ww}x{hh} with {cc} channels, frames[0] {w}x{h} with {c}: "
                "every frame must have one size"
            )
        if self._kind != "pil" and item.dtype != self.dtype:
            raise InvalidVideo(
                f"{name} is {item.dtype}, frames[0] {self.dtype}: every frame must have one dtype"
            )
        if self._kind == "tensor" and item.device != self.device:
            raise InvalidVideo(
                f"{name} is on {item.device}, frames[0] on {self.device}: every frame must be "
                "on one device"
            )
