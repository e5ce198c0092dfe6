"""The CUDA path's process state: each slab registered once per process, the streams.

A slab is `cudaHostRegister`ed once per process and stays registered until the client
unmaps it, so the per-request cost is a copy at full PCIe speed and nothing else. A GPU
worker registers every slab on a thread of its own as it attaches (or in `warm_up()`); a
request that needs a slab not yet registered registers it itself, waiting for at most
one registration. No request compiles the fused 4:2:0 kernel either (`_yuv_kernel`).
A video's conversion and copies: `_cuda_video`.

Registration state is per process. After a fork the child forgets the parent's
registrations (they are not valid in the child) and never unregisters them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._cuda_runtime import (
    ALREADY_REGISTERED,
    CUDA_SUCCESS,
    CudaRuntime,
    warm_elementwise,
)
from ._slabs import PROCESS_MAPS, ProcessMaps

log = logging.getLogger(__name__)

# The background registers a slab only once requests' copies have paused this long, and
# waits at most `REGISTER_DEFER_S` for such a pause. cudaHostRegister pins a slab's pages
# under the driver's lock (some 3 ms for 64 MiB), and copies queued meanwhile wait for it:
# eight fresh clients' first two waves spent 17-18 ms a request in the copy while it
# registered, against 0.2 ms steady (H100, 2026-12-06,
# bench/results/2026-12-06-h100-cold-fb6db81.json).
REGISTER_QUIET_S = 0.002
REGISTER_DEFER_S = 1.0
# How long a process's exit waits for the background to finish its step under way (a
# kernel launch, one registration). A thread still inside CUDA when the interpreter
# finalizes is ended by pthread_exit, which C++ answers with std::terminate: the worker
# dies with "terminate called without an active exception" instead of exiting.
EXIT_WAIT_S = 10.0


@dataclass
class CudaHost:
    """This process's CUDA state, which its clients share (`process_host`): the slabs'
    registrations and the side streams."""

    maps: ProcessMaps
    pid: int = field(default_factory=os.getpid)
    registrations: int = 0  # successful cudaHostRegister calls, for tests and status
    _registered: dict[int, tuple[int, bool]] = field(default_factory=dict)  # addr -> size, owned
    _failed: set[int] = field(default_factory=set)
    _streams: dict[tuple[int, str], Any] = field(default_factory=dict)
    _runtime: CudaRuntime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slab_locks: dict[int, threading.Lock] = field(default_factory=dict)
    _warned: bool = False
    _registering: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _exit_hooked: bool = False
    _last_copy: float = 0.0  # monotonic time a request last queued a copy
    # Held by the thread queueing a batch's conversion and copy. torch lets go of the GIL
    # in every op, so threads queueing at once take turns at each of a batch's few dozen
    # ops, each waiting for every other's turn. Eight clients of one process sending
    # 448x256x4 back to back spent 6.7-10.5 ms each queueing and landing their frames,
    # and 2.5-3.4 ms with this; their whole requests took 30% less
    # (H100, bench/results/2026-12-07-h100-launch-lock.md).
    queueing: threading.Lock = field(default_factory=threading.Lock)

    def copying(self) -> None:
        """A request is queueing copies now (the background waits for a pause)."""
        self._last_copy = time.monotonic()

    def _wait_for_pause(self) -> None:
        """Until requests' copies pause for `REGISTER_QUIET_S`, `REGISTER_DEFER_S` at most."""
        deadline = time.monotonic() + REGISTER_DEFER_S
        while (now := time.monotonic()) < deadline and not self._stopping.is_set():
            quiet = now - self._last_copy
            if quiet >= REGISTER_QUIET_S:
                return
            time.sleep(REGISTER_QUIET_S - quiet)

    def _check_fork(self) -> None:
        if os.getpid() != self.pid:
            # Registrations and streams belong to the parent; forget them, never undo them.
            self.pid = os.getpid()
            self._registered = {}
            self._failed = set()
            self._streams = {}
            self._runtime = None
            self._registering = None
            self._stopping = threading.Event()
            self.queueing = threading.Lock()  # perhaps held by a parent's thread at fork
            self.registrations = 0

    @property
    def runtime(self) -> CudaRuntime:
        if self._runtime is None:
            self._runtime = CudaRuntime()
        return self._runtime

    def registered_slabs(self) -> int:
        self._check_fork()
        return len(self._registered)

    def ensure_registered(self, region: np.ndarray) -> bool:
        """Register the slab holding `region`, once. False means pageable copies."""
        return self.ensure_registered_at(int(region.ctypes.data))

    def ensure_registered_at(self, address: int, quiet: bool = False) -> bool:
        """Register the slab holding `address`, once. False means pageable copies.
        `quiet` (the background's): a failure is neither remembered nor warned of, so
        that the request that needs the slab tries, and warns its caller. Each slab has
        a lock of its own: a request registers its slab beside the background, never
        behind it."""
        self._check_fork()
        slab = self.maps.slab_of(address)
        if slab is None:
            return False
        address, size = slab
        with self._lock:
            if address in self._registered:
                return True
            if address in self._failed:
                return False
            own = self._slab_locks.setdefault(address, threading.Lock())
        with own:
            # Looked up again under its lock: a slab being unmapped is gone from the map
            # before its unregistration takes this lock.
            if self.maps.slab_of(address) is None:
                return False
            with self._lock:
                if address in self._registered:
                    return True
            code = self.runtime.register(address, size)
            with self._lock:
                return self._registered_as(address, size, code, quiet)

    def _registered_as(self, address: int, size: int, code: int, quiet: bool) -> bool:
        """What cudaHostRegister's `code` makes of the slab at `address` (under the lock)."""
        if code == ALREADY_REGISTERED:
            # Someone else in this process registered it; use it, never unregister it.
            self.runtime.clear_error()
            self._registered[address] = (size, False)
            return True
        if code != CUDA_SUCCESS:
            self.runtime.clear_error()
            if not quiet:
                self._failed.add(address)
                self._warn(f"cudaHostRegister failed with error {code}")
            return False
        self._registered[address] = (size, True)
        self.registrations += 1
        return True

    def register_all(self, quiet: bool = False) -> None:
        """Register every slab mapped in this process that is not yet (some 50 ms a GiB);
        `quiet`: in the background, each slab in a pause of the requests' copies, stopping
        at the first failure (the requests then say it)."""
        for address in self.maps.addresses():
            if quiet:
                if self._stopping.is_set():
                    return
                with self._lock:
                    if address in self._registered:
                        continue
                self._wait_for_pause()
            if not self.ensure_registered_at(address, quiet) and quiet:
                return

    def warm_in_background(self, device: Any = None) -> None:
        """What a first request would otherwise pay, on a thread of its own: every slab
        registered, and the elementwise conversion's GPU kernels loaded (CUDA loads each
        on its first launch). A request meanwhile registers the slab it needs itself.
        The fused 4:2:0 kernel is not compiled here: importing Triton holds the GIL for
        half a second, which the first requests would feel; `_yuv_kernel` compiles it
        once a video large enough to gain from it comes."""
        self._check_fork()
        if self._stopping.is_set():
            return  # the process is exiting
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(self.stop_background)
        if self._registering is None or not self._registering.is_alive():
            self._registering = threading.Thread(
                target=self._warm, args=(device, True), name="video-sidecar-warm", daemon=True
            )
            self._registering.start()

    def stop_background(self, timeout: float = EXIT_WAIT_S) -> None:
        """At exit: the background stops after the step under way, which is waited for
        (see `EXIT_WAIT_S`); a later `warm_in_background` starts nothing."""
        self._stopping.set()
        thread = self._registering
        if thread is not None and thread.is_alive() and os.getpid() == self.pid:
            thread.join(timeout)

    def _warm(self, device: Any, quiet: bool) -> None:
        # The kernels first: until they are loaded, small uint8 videos go as rgb24 (see
        # `_video.gpu_wire_format`); a request registers the slab it needs itself.
        with contextlib.suppress(Exception):  # an optimisation: a request would load them
            warm_elementwise(device)
        self.register_all(quiet)  # quiet (the background's): stops at once at exit

    def unregister(self, address: int) -> bool:
        """Called before a slab is unmapped. False: keep the mapping (still registered)."""
        self._check_fork()
        with self._lock:
            own = self._slab_locks.pop(address, None) or threading.Lock()
        with own, self._lock:  # a registration of it under way finishes first
            # A failure was this mapping's: another may come to the same address later.
            self._failed.discard(address)
            entry = self._registered.get(address)
            if entry is None:
                return True
            _, owned = entry
            if owned:
                code = self.runtime.unregister(address)
                if code != CUDA_SUCCESS:
                    self.runtime.clear_error()
                    log.warning(
                        "cudaHostUnregister failed with error %d; keeping the slab mapped", code
                    )
                    return False
            del self._registered[address]
            return True

    def stream(self, device: Any, role: str = "copy") -> Any:
        """This client's stream for `role` ("copy" or "convert") on `device`."""
        import torch

        self._check_fork()
        index = device.index if device.index is not None else torch.cuda.current_device()
        if (index, role) not in self._streams:
            self._streams[index, role] = torch.cuda.Stream(device=index)
        return self._streams[index, role]

    def _warn(self, reason: str) -> None:
        if not self._warned:
            self._warned = True
            message = (
                f"{reason}: copying into shared memory without page-locking it; this works "
                "but is slower. Check `ulimit -l` and that the slabs are mapped read-write."
            )
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            log.warning(message)

    def serve(self, device: Any) -> None:
        """Before a video from `device` is copied: the background starts now if the
        clients attached before the process started CUDA."""
        self._check_fork()
        if self._registering is None:
            self.warm_in_background(device)

    def warm_up(self, device: Any = None) -> None:
        """`warm_up()`'s GPU part, now: what `warm_in_background` does."""
        self._warm(device, quiet=False)


_HOST: CudaHost | None = None
_HOST_LOCK = threading.Lock()


def process_host() -> CudaHost:
    """This process's CUDA state, made on first use: every client's slabs are mapped once
    per process (`_slabs.PROCESS_MAPS`), and so registered once."""
    global _HOST  # noqa: PLW0603 - one per process, as the mappings it registers
    with _HOST_LOCK:
        if _HOST is None:
            _HOST = CudaHost(PROCESS_MAPS)
            PROCESS_MAPS.before_unmap = _HOST.unregister
        return _HOST
