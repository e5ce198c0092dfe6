"""Videos the client accepts, and how their frames get into a leased region.

Three kinds of source, one protocol:

- `PlanarVideo`: uint8 4:2:0 frames the caller already laid out as (T, H*3/2, W);
- `ArrayVideo`: a numpy array or CPU tensor in any supported layout, dtype and range,
  converted in bounded batches straight into the lease;
- `CudaVideo` (in `_cuda_video`): a CUDA tensor, converted on the GPU and copied
  device-to-host straight into the (registered) lease.

The client never imports torch itself: a tensor is recognised by its type's module.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sidecar.vocabulary import PIXEL_FORMATS

from . import _yuv_kernel
from ._convert import (
    FLOAT_DTYPES,
    Conversion,
    Ops,
    RangeSample,
    check_range,
    check_value_range,
    dtype_name,
    frames_view,
    is_planar420,
    wire_format,
)
from ._cuda_runtime import ELEMENTWISE_LOADED
from ._errors import InvalidVideo
from ._frame_list import FrameList, is_frame_sequence, is_pil_image

log = logging.getLogger("client")

CPU_BATCH_BYTES = 32 * 1024 * 1024  # float32 scratch per conversion batch on the CPU
CONVERT_THREADS = min(8, os.cpu_count() or 1)  # threads converting a numpy video's batches
_converters: ThreadPoolExecutor | None = None
_converters_lock = threading.Lock()


def converters() -> ThreadPoolExecutor | None:
    """The threads that convert numpy batches at once (None on one core); made on first
    use, kept for the process (a child after fork makes its own)."""
    global _converters  # noqa: PLW0603 - one pool per process
    if CONVERT_THREADS < 2:
        return None
    with _converters_lock:
        if _converters is None:
            _converters = ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="convert")
        return _converters


def _forget_converters() -> None:
    global _converters  # noqa: PLW0603 - the parent's threads do not exist in the child
    _converters = None


os.register_at_fork(after_in_child=_forget_converters)


class VideoSource(Protocol):
    """Frames ready to be written into leases, all of one size and wire format."""

    frames: int
    width: int
    height: int

    @property
    def pixel_format(self) -> str: ...

    @property
    def frame_bytes(self) -> int: ...

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        """Write frames [start, start+count) tightly packed at the start of `region`."""

    def finish(self) -> None:
        """Block until every copy issued by `copy_into` has landed."""

    @property
    def lands_later(self) -> bool:
        """Whether copies still run when `copy_into` returns (a GPU's do)."""

    def land(self, count: Callable[[int], None]) -> None:
        """As `finish`, telling `count` how many frames (in order) have landed as more
        do: for a request sent while the copies still run."""


def is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "device")


def frame_shape(pixel_format: str, width: int, height: int) -> tuple[int, ...]:
    """One frame as it lies in a lease: the vocabulary's rule, which the daemon reads by."""
    return PIXEL_FORMATS[pixel_format].frame_shape(width, height)


def frame_bytes(pixel_format: str, width: int, height: int) -> int:
    return PIXEL_FORMATS[pixel_format].frame_bytes(width, height)


@dataclass
class PlanarVideo:
    """uint8 4:2:0 frames already in the wire layout (T, H*3/2, W)."""

    array: np.ndarray
    pixel_format: str
    frames: int = field(init=False)
    width: int = field(init=False)
    height: int = field(init=False)

    def __post_init__(self) -> None:
        self.frames, rows, self.width = self.array.shape
        self.height = rows * 2 // 3

    @property
    def frame_bytes(self) -> int:
        return frame_bytes(self.pixel_format, self.width, self.height)

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        dst = region[: count * self.frame_bytes].reshape(count, *self.array.shape[1:])
        np.copyto(dst, self.array[start : start + count], casting="no")

    def finish(self) -> None:
        pass

    lands_later = False

    def land(self, count: Callable[[int], None]) -> None:
        count(self.frames)


@dataclass
class ArrayVideo:
    """Host frames as a (T, H, W, C) view; converted batch by batch into the lease."""

    frames_thwc: Any
    conversion: Conversion
    ops: Ops
    frames: int = field(init=False)
    width: int = field(init=False)
    height: int = field(init=False)

    def __post_init__(self) -> None:
        self.frames, self.height, self.width, _ = self.frames_thwc.shape

    @property
    def pixel_format(self) -> str:
        return self.conversion.pixel_format

    @property
    def frame_bytes(self) -> int:
        return frame_bytes(self.pixel_format, self.width, self.height)

    def batch_frames(self, budget: int) -> int:
        scratch = self.height * self.width * int(self.frames_thwc.shape[3]) * 4
        return max(1, budget // scratch)

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        dst: Any = region[: count * self.frame_bytes].reshape(
            count, *frame_shape(self.pixel_format, self.width, self.height)
        )
        if self.ops.torch is not None:
            dst = self.ops.torch.from_numpy(dst)
        identity = self.conversion.integer and not self.conversion.yuv
        if identity and isinstance(self.frames_thwc, FrameList):
            self.frames_thwc.copy_frames(dst, start, start + count)  # frame by frame
            return
        if identity:
            self._convert(dst, start, start, start + count)
            return
        workers = converters() if self.ops.torch is None else None  # torch has its threads
        step = self.batch_frames(CPU_BATCH_BYTES)
        if workers is not None:  # a batch for each thread, each within the budget
            step = max(1, min(step, -(-count // CONVERT_THREADS)))
        batches = [
            (first, min(first + step, start + count)) for first in range(start, start + count, step)
        ]
        if workers is None or len(batches) == 1:
            for first, last in batches:
                self._convert(dst, start, first, last)
            return
        # numpy lets go of the GIL in each pass: the batches convert on several cores
        for done in [workers.submit(self._convert, dst, start, a, b) for a, b in batches]:
            done.result()

    def _convert(self, dst: Any, start: int, first: int, last: int) -> None:
        """Frames [first, last) into their place in `dst` (which holds `start` on)."""
        out = self.conversion.apply(self.frames_thwc[first:last], self.ops)
        part = dst[first - start : last - start]
        out = out.reshape(part.shape)  # gray's channel axis of 1 goes: a view
        if self.ops.torch is not None:
            part.copy_(out)
        else:
            np.copyto(part, out, casting="no")

    def finish(self) -> None:
        pass

    lands_later = False

    def land(self, count: Callable[[int], None]) -> None:
        count(self.frames)


def prepare_video(
    video: Any,
    *,
    pixel_format: str | None = None,
    layout: str | None = None,
    value_range: tuple[float, float] = (0, 1),
    cuda: Any = None,
) -> VideoSource:
    """Check a video and pick how its frames reach the lease.

    `video` is an array or tensor, or a list of frames (`FrameList`). `cuda` makes the
    `CudaVideo` for a CUDA tensor (the client passes its CUDA state). A float video is
    refused when a sample of it says it is not in `value_range` (`check_range`); the
    few values a sample finds beyond it are clipped, and their count is logged.
    """
    if pixel_format is not None and (
        not isinstance(pixel_format, str) or pixel_format not in PIXEL_FORMATS
    ):
        raise InvalidVideo(
            f"unknown pixel_format {pixel_format!r}; use one of {', '.join(PIXEL_FORMATS)}"
        )
    found = _frames_of(video, pixel_format, layout)
    if isinstance(found, PlanarVideo):
        return found
    view, torch, dtype = found
    device = view.device.type if torch is not None else "cpu"
    if pixel_format is None and device == "cuda" and view.shape[3] == 3:
        pixel_format = gpu_wire_format(view, dtype)
    conversion = _conversion(view, pixel_format, value_range, integer=dtype == "uint8")
    if device not in ("cpu", "cuda"):
        raise InvalidVideo(f"tensor on {view.device}: only CPU and CUDA tensors are supported")
    if device == "cuda" and cuda is None:
        raise InvalidVideo("CUDA tensors need a client with CUDA support")
    if not conversion.integer:
        _log_clipped(check_range(view, value_range, torch), value_range)
    if device == "cuda":
        return cuda(view, conversion)  # type: ignore[no-any-return]
    return ArrayVideo(view, conversion, Ops(torch))


def gpu_wire_format(view: Any, dtype: str) -> str:
    """What RGB on a GPU travels as, unless the caller says: 4:2:0, converted there (half
    the bytes, no conversion left for the daemon), by the fused kernel once it is compiled
    (`_cuda` asks for it for a large video), elementwise before that. Small uint8 clips
    went faster so than as rgb24 for the daemon to convert: 0.43-0.63x of upstream A's time
    against 0.48-0.70x, 448x256x4 to 1344x768x1 (H100, 2026-12-06,
    bench/results/2026-12-06-h100-e2e-small-wire.json). Only until this process has loaded
    the elementwise kernels (`_cuda.CudaHost.warm_in_background`, at attach) does a small
    uint8 video go as rgb24, a plain copy that launches no kernel: a fresh worker's first
    request loading them itself took 339 ms instead of 67 ms."""
    if dtype != "uint8" or ELEMENTWISE_LOADED.is_set():
        return "yuv420p"
    worth = _yuv_kernel.source_bytes(view) >= _yuv_kernel.FUSED_MIN_BYTES
    return "yuv420p" if _yuv_kernel.ready(view, False, compile=worth) or worth else "rgb24"


def video_geometry(video: Any, layout: str | None = None) -> tuple[int, int, int]:
    """(width, height, frames) of a video as `encode` reads it, touching no pixel."""
    found = _frames_of(video, None, layout)
    if isinstance(found, PlanarVideo):
        return found.width, found.height, found.frames
    frames, height, width, _ = found[0].shape
    return int(width), int(height), int(frames)


def _frames_of(
    video: Any, pixel_format: str | None, layout: str | None
) -> PlanarVideo | tuple[Any, Any, str]:
    """`video` as frames already in the wire layout, or as (a (T, H, W, C) view, torch if
    it holds tensors, its dtype's name)."""
    if is_frame_sequence(video):
        frames = FrameList(video, layout)
        return frames, frames.torch, _checked_dtype(dtype_name(frames))
    video, torch, dtype = _checked_array(video)
    if is_planar420(pixel_format) and video.ndim == 3:
        if torch is not None or dtype != "uint8" or video.shape[1] % 3:
            raise InvalidVideo(
                f"shape {tuple(video.shape)}: {pixel_format} frames must be a uint8 numpy "
                "array (T, H*3/2, W), or RGB frames to convert"
            )
        return PlanarVideo(video, pixel_format)
    if pixel_format == "gray" and video.ndim == 3 and layout is None:
        video, layout = video[..., None], "THWC"  # the channel axis is the one added here
    return frames_view(video, layout), torch, dtype


def _log_clipped(seen: RangeSample, value_range: tuple[float, float]) -> None:
    """The values a float video's sample found outside its range, which are clipped: at
    INFO where some were beyond the slack, else (a model's overshoot) at DEBUG."""
    if seen.clipped:
        log.log(
            logging.INFO if seen.beyond else logging.DEBUG,
            "%d of %d sampled values (%.3g to %.3g) lie outside value_range=%s: clipped",
            seen.clipped,
            seen.values,
            seen.lowest,
            seen.highest,
            tuple(value_range),
        )


def _checked_array(video: Any) -> tuple[Any, Any, str]:
    """(the video, detached if a tensor; torch, if it is one, else None; its dtype's
    name), once it is an array of a dtype the client takes."""
    torch: Any = None
    if is_torch_tensor(video):
        import torch  # the caller already imported it

        video = video.detach()
    elif is_pil_image(video):
        raise InvalidVideo("one PIL image: a video is a list of them, [image] for one frame")
    elif not isinstance(video, np.ndarray):
        raise InvalidVideo(
            f"video must be a numpy array, a torch tensor or a list of frames (PIL images, "
            f"arrays or tensors), got {type(video).__name__}"
        )
    return video, torch, _checked_dtype(dtype_name(video))


def _checked_dtype(dtype: str) -> str:
    if dtype != "uint8" and dtype not in FLOAT_DTYPES:
        raise InvalidVideo(f"dtype {dtype}: {_dtype_fix(dtype)}")
    return dtype


def _dtype_fix(dtype: str) -> str:
    """How to make frames of `dtype` into ones the client takes."""
    taken = "send uint8, or floats in [0, 1]"
    if dtype == "uint16":
        return f"{taken}: e.g. (video >> 8).astype(np.uint8)"
    if dtype == "int16":  # 0..32767 taken as the range
        return f"{taken}: e.g. (video.clip(0) >> 7).astype(np.uint8)"
    if dtype.startswith(("int", "uint")):
        return f"{taken}: scale to 0..255 and .astype(np.uint8), e.g. video * 255 // video.max()"
    if dtype == "bool":
        return f"{taken}: e.g. video.astype(np.uint8) * 255"
    return f"{taken}; float16, bfloat16, float32 and float64 are taken too"


def _conversion(
    view: Any, pixel_format: str | None, value_range: tuple[float, float], *, integer: bool
) -> Conversion:
    """How the (T, H, W, C) `view` becomes what travels."""
    wire = wire_format(view.shape[3], pixel_format)
    height, width = int(view.shape[1]), int(view.shape[2])
    if height % 2 or width % 2:  # the daemon's encoders take 4:2:0, whatever travels
        even = f"{width - width % 2}x{height - height % 2}"
        raise InvalidVideo(
            f"{width}x{height}: video is encoded as 4:2:0, which needs an even width and "
            f"height, whatever pixel format travels; crop to {even} (as THWC: "
            f"video[:, :{height - height % 2}, :{width - width % 2}]) or pad to "
            f"{width + width % 2}x{height + height % 2}"
        )
    scale, offset = check_value_range(value_range)
    return Conversion(wire, scale, offset, integer=integer)
