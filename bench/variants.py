"""The ways of getting GPU-ready RGB frames into an MP4 that the suite compares.

- `upstream_a`: the upstream default. Cached pinned D2H, a memcpy into a fresh POSIX SHM
  segment, a receiver copy out of it, then `VideoFrame.from_ndarray` (another copy) with
  PyAV's default threading.
- `upstream_d`: the upstream zero-copy attempt. A fresh SHM segment per transfer,
  `cudaHostRegister`ed, D2H straight into it, unregistered, then borrowed views and
  borrowed frames (`from_numpy_buffer`), PyAV's default threading.
- `ffmpeg_pipe`: what imageio-style exporters do: raw frames piped to an ffmpeg process.
- `sidecar`: the real daemon and the real client, sending rgb24 (byte-exact).
- `sidecar_yuv`: the same with RGB converted to yuv420p before the copy (on the GPU
  with --device cuda), so half the bytes move and the daemon does no colour conversion.

All encode H.264 with libx264 at the daemon's profile (`--profile`, by default
"balanced"; `common.encode_settings`), 24 fps.
"""

from __future__ import annotations

import io
import mmap
import os
import secrets
import shutil
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from .common import Device, as_host, encode_settings, parse_shape


def pyav_encode(frames: np.ndarray, *, borrowed: bool) -> bytes:
    """Encode (T, H, W, 3) rgb24 frames with PyAV's default threading, as upstream does,
    at the daemon's settings for them (its first frame measured for grain, as there)."""
    t, h, w = frames.shape[:3]
    settings = encode_settings(w, h, t, frames[0])
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream(settings["codec"], rate=Fraction(settings["fps"]))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.options = settings["options"]
        make = av.VideoFrame.from_numpy_buffer if borrowed else av.VideoFrame.from_ndarray
        for i, image in enumerate(frames):
            frame = make(image, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


class _Segment:
    """A fresh POSIX shared-memory segment, created the way `shm_open` + `mmap` do."""

    def __init__(self, size: int) -> None:
        self.path = f"/dev/shm/bench-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.map, dtype=np.uint8)

    def close(self) -> None:
        del self.array
        self.map.close()
        os.unlink(self.path)


class Variant:
    name = ""
    note = ""

    def __init__(self, device: Device) -> None:
        self.device = device

    def available(self) -> str:
        """Empty when usable; otherwise why not."""
        return ""

    def run(self, video: Any, shape: str) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _pinned_copy(self, video: Any) -> np.ndarray:
        """Cached pinned D2H, as upstream does (PyTorch's host allocator caches it)."""
        torch = self.device.torch
        if torch is None:
            return as_host(video)
        host = torch.empty(video.shape, dtype=video.dtype, pin_memory=True)
        host.copy_(video, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return host.numpy()  # type: ignore[no-any-return]


class UpstreamA(Variant):
    name = "upstream_a"

    def run(self, video: Any, shape: str) -> bytes:
        host = self._pinned_copy(video)
        segment = _Segment(host.nbytes)
        try:
            np.copyto(segment.array.reshape(host.shape), host)  # producer: into SHM
            received = segment.array.reshape(host.shape).copy()  # receiver: out of SHM
        finally:
            segment.close()
        return pyav_encode(received, borrowed=False)


class UpstreamD(Variant):
    name = "upstream_d"

    def run(self, video: Any, shape: str) -> bytes:
        torch = self.device.torch
        nbytes = int(np.prod(video.shape))
        segment = _Segment(nbytes)
        try:
            view = segment.array.reshape(tuple(video.shape))
            if torch is None:
                np.copyto(view, video)
            else:
                cudart = torch.cuda.cudart()
                address = int(segment.array.ctypes.data)
                if int(cudart.cudaHostRegister(address, nbytes, 0)) != 0:
                    raise RuntimeError("cudaHostRegister failed")
                try:
                    torch.from_numpy(view).copy_(video, non_blocking=True)
                    torch.cuda.current_stream().synchronize()
                finally:
                    cudart.cudaHostUnregister(address)
            return pyav_encode(view, borrowed=True)
        finally:
            del view
            segment.close()


class FfmpegPipe(Variant):
    name = "ffmpeg_pipe"

    def available(self) -> str:
        return "" if shutil.which("ffmpeg") else "no ffmpeg binary on this machine"

    def run(self, video: Any, shape: str) -> bytes:
        host = self._pinned_copy(video)
        w, h, t = parse_shape(shape)
        settings = encode_settings(w, h, t, host[0])
        options = [a for k, v in settings["options"].items() for a in (f"-{k}", v)]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.mp4"
            cmd = [
                "ffmpeg", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
                "-s", f"{w}x{h}", "-r", str(settings["fps"]), "-i", "-",
                "-c:v", settings["codec"], *options, "-pix_fmt", "yuv420p",
                "-movflags", "+faststart", str(out),
            ]  # fmt: skip
            subprocess.run(cmd, input=np.ascontiguousarray(host).tobytes(), check=True)
            return out.read_bytes()


class Sidecar(Variant):
    name = "sidecar"
    pixel_format: str | None = "rgb24"  # byte-exact; a CUDA tensor's default is yuv420p

    def __init__(self, device: Device, client: Any, **options: Any) -> None:
        super().__init__(device)
        self.client = client
        self.options = options

    def run(self, video: Any, shape: str) -> bytes:
        result = self.client.encode(video, fps=encode_settings()["fps"],
                                    pixel_format=self.pixel_format, **self.options)  # fmt: skip
        self.last_timings = result.timings.as_dict()
        return result.data  # type: ignore[no-any-return]


class SidecarYuv(Sidecar):
    name = "sidecar_yuv"
    pixel_format = "yuv420p"


class SidecarPreviews(Sidecar):
    """The default path (4:2:0 converted where the frames are) with a thumbnail and a
    sprite sheet beside the video, at their defaults."""

    name = "sidecar_previews"
    pixel_format = None  # the default: yuv420p from a CUDA tensor, rgb24 from host memory

    def __init__(self, device: Device, client: Any, **options: Any) -> None:
        super().__init__(device, client, thumbnail=True, sprite_sheet=True, **options)


class SidecarDefault(Sidecar):
    """The default path, as `SidecarPreviews` without the previews: the pair to compare."""

    name = "sidecar_default"
    pixel_format = None
