"""A CUDA tensor's frames copied device-to-host straight into leases (`CudaVideo`).

Conversion (layout, range, dtype, optionally RGB to 4:2:0) runs on the GPU in batches of
frames on a side stream that waits for the producer's stream through an event; no
device-wide synchronize. The slabs' registrations and the streams are the process's
(`_cuda.CudaHost`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _yuv_kernel
from ._convert import Conversion, Ops
from ._frame_list import FrameList
from ._video import frame_bytes, frame_shape

if TYPE_CHECKING:
    from ._cuda import CudaHost

GPU_BATCH_BYTES = 64 * 1024 * 1024  # scratch per conversion batch on the GPU
OVERLAP_BATCHES = 4  # fused 4:2:0 batches: smaller, converted while the last one copies
# A video this large is sent while its frames land (`_encode.FramesLanding`): the copy
# then overlaps the encode, and what the caller waits for is queueing the batches, some
# 0.2 ms each (a kernel launch, events, streams): such a video takes whole batches.
LANDING_MIN_BYTES = 32 * 1024 * 1024


class CudaVideo:
    """A CUDA tensor's frames (a (T, H, W, C) view), copied into leases from the GPU."""

    def __init__(self, frames_thwc: Any, conversion: Conversion, host: CudaHost) -> None:
        import torch

        self._torch = torch
        self.frames_thwc = frames_thwc
        self.conversion = conversion
        self.host = host
        self.frames, self.height, self.width, channels = frames_thwc.shape
        self.pixel_format = conversion.pixel_format
        self.device = frames_thwc.device
        self._side = host.stream(self.device)
        # Everything the producer queued so far must finish before we read the frames.
        self._ready = torch.cuda.Event()
        self._ready.record(torch.cuda.current_stream(self.device))
        self._side.wait_event(self._ready)
        self._ops = Ops(torch)
        self._identity = conversion.integer and not conversion.yuv
        # (event, frames landed once it completes) after each batch's copy, for `land`;
        # only for a video that may be sent while it lands (an event costs each batch).
        self._marks: list[tuple[Any, int]] = []
        self._marked = self.frames * self.frame_bytes >= LANDING_MIN_BYTES
        # 4:2:0 in one kernel where it is compiled (`_yuv_kernel`; asked for by a video
        # large enough to gain from it); it needs no float scratch. A batch the kernel is
        # not ready for takes the elementwise path.
        nv12 = conversion.pixel_format == "nv12"
        worth = _yuv_kernel.source_bytes(frames_thwc) >= _yuv_kernel.FUSED_MIN_BYTES
        self._fused = conversion.yuv and _yuv_kernel.ready(frames_thwc, nv12, compile=worth)
        scratch = self.frame_bytes if self._fused else self.height * self.width * channels * 4
        self._batch = max(1, GPU_BATCH_BYTES // scratch)
        if self._fused and not self._marked:
            # The kernel for the next batch runs on its own stream while this one crosses
            # PCIe: smaller batches, so little of the first kernel is left unhidden.
            self._batch = max(1, self._batch // OVERLAP_BATCHES)
        if self._fused:
            self._convert_stream = host.stream(self.device, "convert")
            self._convert_stream.wait_event(self._ready)

    lands_later = True  # copies run on the GPU's streams after copy_into returns

    @property
    def frame_bytes(self) -> int:
        return frame_bytes(self.pixel_format, self.width, self.height)

    def copy_into(self, region: np.ndarray, start: int, count: int) -> None:
        torch = self._torch
        if start == 0:
            self._marks.clear()  # a new transfer (a retried request copies again)
        self.host.copying()
        self.host.ensure_registered(region)  # else pageable: slower, still correct
        shape = frame_shape(self.pixel_format, self.width, self.height)
        dst = torch.from_numpy(region[: count * self.frame_bytes]).view(count, *shape)
        # A list's frames are stacked a batch at a time, never the whole range at once.
        whole = self._identity and not isinstance(self.frames_thwc, FrameList)
        step = count if whole else self._batch
        # One batch (a short clip) has nothing to overlap: convert and copy on one stream,
        # with no event between them; each such call costs the request time.
        overlap = self._fused and count > step
        with torch.cuda.device(self.device):
            for first in range(start, start + count, step):
                last = min(first + step, start + count)
                with self.host.queueing:
                    self._queue_batch(dst, shape, first, last, start, overlap)

    def _queue_batch(
        self, dst: Any, shape: tuple[int, ...], first: int, last: int, start: int, overlap: bool
    ) -> None:
        """Queue frames [first, last)'s conversion and copy into `dst` on the streams."""
        torch = self._torch
        if overlap:
            with torch.cuda.stream(self._convert_stream):
                out = self._convert(self.frames_thwc[first:last], shape)
                converted = torch.cuda.Event()
                converted.record(self._convert_stream)
            self._side.wait_event(converted)
            out.record_stream(self._side)  # not reused before the copy is done
        with torch.cuda.stream(self._side):
            if not overlap:
                out = self._convert(self.frames_thwc[first:last], shape)
            part = dst[first - start : last - start]
            # gray's channel axis of 1 goes: a view
            part.copy_(out.reshape(part.shape), non_blocking=True)
            if self._marked:
                landed = torch.cuda.Event()
                landed.record(self._side)
                self._marks.append((landed, last))

    def _convert(self, batch: Any, shape: tuple[int, ...]) -> Any:
        """Wire frames for `batch`, on the GPU (the caller's own frames when they are)."""
        conversion = self.conversion
        nv12 = conversion.pixel_format == "nv12"
        if not (self._fused and _yuv_kernel.ready(batch, nv12, compile=True)):
            return conversion.apply(batch, self._ops)
        out = self._torch.empty((len(batch), *shape), dtype=self._torch.uint8, device=self.device)
        scale, shift = (1.0, 0.0) if conversion.integer else (conversion.scale, conversion.offset)
        _yuv_kernel.rgb_to_yuv420(batch, out, scale, shift, nv12)
        return out

    def finish(self) -> None:
        done = self._torch.cuda.Event()
        done.record(self._side)
        done.synchronize()  # waits for our copies only, not the whole device
        self.host.copying()  # the pause the background waits for begins now
        self._marks.clear()

    def land(self, count: Callable[[int], None]) -> None:
        """As `finish`, telling `count` how many frames (in order) have landed as each
        batch's copy completes: for a request sent while the copies still run."""
        for landed, frames in self._marks:
            landed.synchronize()
            count(frames)
        self.finish()
        count(self.frames)  # every frame: a short video marks no batch
