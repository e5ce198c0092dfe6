"""The CUDA runtime as the client uses it: page-locking slabs (cudaHostRegister) through
ctypes, which lets go of the GIL, and loading the elementwise conversion's kernels ahead
of the requests that would otherwise load them."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from ._convert import Conversion, Ops

CUDA_SUCCESS = 0
ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: visible to every context


class CudaRuntime:
    """cudaHostRegister and friends, called through ctypes on the CUDA runtime library
    torch has loaded: a ctypes call lets go of the GIL, so registering a slab (milliseconds
    of pinning pages) on a thread of its own does not hold up the requests beside it, and
    loading it costs no import. Where that library cannot be found, torch's binding (which
    holds the GIL) serves."""

    def __init__(self) -> None:
        self._lib = _loaded_cudart()
        self._rt: Any = None
        if self._lib is None:
            import torch

            self._rt = torch.cuda.cudart()

    @staticmethod
    def _code(result: Any) -> int:
        value: Any = result[0] if isinstance(result, tuple) else result
        return int(getattr(value, "value", value))

    def register(self, address: int, size: int) -> int:
        if self._lib is not None:
            return int(self._lib.cudaHostRegister(address, size, REGISTER_PORTABLE))
        return self._code(self._rt.cudaHostRegister(address, size, REGISTER_PORTABLE))

    def unregister(self, address: int) -> int:
        if self._lib is not None:
            return int(self._lib.cudaHostUnregister(address))
        return self._code(self._rt.cudaHostUnregister(address))

    def clear_error(self) -> None:
        """A failed call leaves a sticky 'last error' that later kernel checks would see."""
        if self._lib is not None:
            self._lib.cudaGetLastError()
            return
        get_last = getattr(self._rt, "cudaGetLastError", None)
        if get_last is not None:
            get_last()


def _loaded_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process has loaded (torch's), found in its memory
    map, with the three functions typed; None where there is none to find."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libcudart.so" in line}
        lib = ctypes.CDLL(sorted(paths)[0]) if paths else None
    except (OSError, IndexError):
        return None
    if lib is None:
        return None
    lib.cudaHostRegister.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
    lib.cudaHostUnregister.argtypes = (ctypes.c_void_p,)
    lib.cudaHostRegister.restype = lib.cudaHostUnregister.restype = ctypes.c_int
    lib.cudaGetLastError.restype = ctypes.c_int
    return lib


# Set once this process has launched the elementwise conversion's kernels (CUDA loads each
# on its first launch): until then a uint8 video goes as rgb24 (`_video.gpu_wire_format`).
ELEMENTWISE_LOADED = threading.Event()
os.register_at_fork(after_in_child=ELEMENTWISE_LOADED.clear)


def warm_elementwise(device: Any = None) -> None:
    """Launch the elementwise conversion once for each dtype a worker sends, as it sends
    it, on tiny frames: CUDA loads each kernel on its first launch (a few milliseconds
    each), here rather than in a request."""
    import torch

    device = torch.device(device) if device is not None else current_device()
    ops = Ops(torch)
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        # A VAE's floats as it lays them out (C, T, H, W), and a large uint8 video (the
        # only uint8 that is converted before the kernel is ready), to 4:2:0.
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.uint8):
            integer = dtype == torch.uint8
            scale, offset = (1.0, 0.0) if integer else (127.5, 127.5)
            cthw = torch.zeros((3, 2, 4, 8), dtype=dtype, device=device)
            frames = cthw.permute(1, 2, 3, 0)
            Conversion("yuv420p", scale, offset, integer).apply(
                frames.contiguous() if integer else frames, ops
            )
    stream.synchronize()
    ELEMENTWISE_LOADED.set()


def current_device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device())
