"""When the fused 4:2:0 kernel (`_yuv_triton`) serves a request: only once it is compiled.

Importing Triton and compiling a kernel takes a second or more in a fresh process (less
once Triton's disk cache holds it, never nothing), which a request must not pay; and the
import holds the GIL for some half a second, which requests running beside it feel. So
the kernel is compiled on a thread of its own, asked for by the first video large enough
to gain from it (`FUSED_MIN_BYTES`: a worker sending only short clips never imports
Triton), and a batch of frames takes the fused kernel only if the kernel for its
specialisation (`Key`) is compiled; until then the elementwise path converts it, to the
same bytes within rounding.

Triton is optional: without it (or where it fails to compile, said once on the log) the
elementwise path serves everything.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import math
import queue
import threading
from typing import Any

log = logging.getLogger("client")

Key = tuple[str, bool, bool]  # (dtype, source 16-byte aligned, NV12)
# A video of at least this many bytes (as the caller holds it) gains from the fused kernel
# enough to have it compiled; smaller ones convert elementwise, and never make a worker
# import Triton.
FUSED_MIN_BYTES = 8 * 1024 * 1024
DTYPES = ("uint8", "bfloat16", "float16", "float32")  # what frames and VAEs hand over
# What a worker sends: each dtype, from an aligned tensor or from a view into one.
USUAL: tuple[Key, ...] = tuple((d, aligned, False) for d in DTYPES for aligned in (True, False))


class _Kernel:
    """The process's state of the kernel: what is compiled, what is asked for, the thread."""

    def __init__(self) -> None:
        self.ready: set[Key] = set()
        self.asked: set[Key] = set()
        self.done = threading.Condition()
        self.jobs: queue.SimpleQueue[tuple[Key, Any] | None] = queue.SimpleQueue()
        self.worker: threading.Thread | None = None
        self.broken = False
        self.installed: bool | None = None

    def available(self) -> bool:
        if self.installed is None:
            self.installed = importlib.util.find_spec("triton") is not None
        return self.installed and not self.broken

    def warm(self, keys: tuple[Key, ...], device: Any, wait: float) -> bool:
        with self.done:
            for key in keys:
                if key not in self.asked:
                    self.asked.add(key)
                    self.jobs.put((key, device))
            if self.worker is None or not self.worker.is_alive():
                self.worker = threading.Thread(
                    target=self.compile, name="video-sidecar-kernel", daemon=True
                )
                self.worker.start()
                atexit.register(self.stop, self.worker)
            self.done.wait_for(lambda: self.broken or self.holds(keys), timeout=wait)
            return self.holds(keys)

    def stop(self, worker: threading.Thread, timeout: float = 10.0) -> None:
        """At exit: the thread ends after the compile under way, which is waited for. A
        thread still inside CUDA or Triton as the interpreter finalizes is ended by
        pthread_exit, which C++ answers with std::terminate (the process dies)."""
        self.jobs.put(None)
        if worker.is_alive() and worker is not threading.current_thread():
            worker.join(timeout)

    def holds(self, keys: tuple[Key, ...]) -> bool:
        return all(k in self.ready for k in keys)

    def compile(self) -> None:
        """The background thread: import Triton, then launch the kernel once per key
        asked for, on tiny frames on a stream of its own (compiling it)."""
        try:
            import torch

            from . import _yuv_triton

            while True:  # waits for more keys until exit: a thread asleep costs nothing
                job = self.jobs.get()
                if job is None:
                    return
                key, device = job
                _launch(torch, _yuv_triton, key, torch.device(device or "cuda"))
                with self.done:
                    self.ready.add(key)
                    self.done.notify_all()
        except Exception as exc:  # no compiler, an old driver: the elementwise path serves
            log.warning("the fused GPU 4:2:0 kernel is not used: %s", exc)
            with self.done:
                self.broken = True
                self.done.notify_all()


_KERNEL = _Kernel()


def available() -> bool:
    """Whether Triton is installed (found, not imported: importing it is what is slow)."""
    return _KERNEL.available()


def source_bytes(frames: Any) -> int:
    """The bytes of a (T, H, W, C) video as its caller holds it (a list's too)."""
    return int(math.prod(frames.shape)) * int(getattr(frames.dtype, "itemsize", 1))


def key_of(frames: Any, nv12: bool) -> Key:
    """A batch's specialisation: its dtype, its data's alignment, NV12 or not."""
    dtype = str(frames.dtype).removeprefix("torch.")
    pointer = frames.data_ptr() if hasattr(frames, "data_ptr") else 0  # a list's: fresh
    return dtype, pointer % 16 == 0, nv12


def ready(frames: Any, nv12: bool, compile: bool = True) -> bool:
    """Whether the fused kernel may convert `frames` now; if not yet compiled for them,
    it is compiled in the background for later batches, where `compile` says so."""
    if not available():
        return False
    key = key_of(frames, nv12)
    if key in _KERNEL.ready:
        return True
    if compile:
        warm((key,), frames.device)
    return False


def warm(keys: tuple[Key, ...], device: Any, wait: float = 0.0) -> bool:
    """Compile the kernel for `keys` on the background thread; wait up to `wait` seconds
    for them. True once all are ready."""
    return available() and _KERNEL.warm(keys, device, wait)


def rgb_to_yuv420(frames: Any, out: Any, scale: float, shift: float, nv12: bool) -> None:
    """The fused conversion (see `_yuv_triton`); only for frames `ready` said yes to."""
    from . import _yuv_triton

    _yuv_triton.rgb_to_yuv420(frames, out, scale, shift, nv12)


def _launch(torch: Any, kernel: Any, key: Key, device: Any) -> None:
    dtype, aligned, nv12 = key
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        skip = 0 if aligned else 1  # one element in: a pointer no longer 16-byte aligned
        flat = torch.zeros(skip + 16 * 32 * 3, dtype=getattr(torch, dtype), device=device)
        frames = flat[skip:].view(1, 16, 32, 3)
        out = torch.empty((1, 24, 32), dtype=torch.uint8, device=device)
        kernel.rgb_to_yuv420(frames, out, 1.0, 0.0, nv12)
    stream.synchronize()
