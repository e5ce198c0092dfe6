"""The client's mappings of the daemon's slabs: each slab is mapped once per process.

We open `/dev/shm/<name>` and `mmap` it ourselves. `multiprocessing.shared_memory` would
register the segment with Python's resource tracker, which unlinks it when this process
exits and so would destroy the daemon's pool.

A process maps each slab once, whatever number of clients it runs (`PROCESS_MAPS`): eight
fresh clients of one worker attach without mapping the pool eight times, and a CUDA
worker registers each slab once (`_cuda`). A client's `SlabMap` holds the slabs of the
daemon instance it attached to; the mapping goes when its last client lets go of it.

Attaching maps the slabs without touching their pages (a GiB of page tables takes some
45 ms to fill): the pages are filled in on a thread of its own (`populate`), before the
copies of later requests reach them; a first request's copy fills in the few it touches.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._errors import SidecarUnavailable

# madvise(2) advice that fills in a range's page tables, writable (Linux 5.14).
MADV_POPULATE_WRITE = 23
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _madvise(address: int, size: int, advice: int) -> bool:
    """madvise(2) through ctypes, which lets go of the GIL while the kernel works (the
    mmap module's holds it); False where the kernel refused."""
    return bool(_LIBC.madvise(address, size, advice) == 0)


@dataclass(frozen=True)
class SlabInfo:
    id: int
    shm_name: str
    size: int


@dataclass
class _Mapping:
    map: mmap.mmap
    array: np.ndarray
    users: int = 0
    filling: bool = False  # the kernel is filling in its page tables: not to be unmapped


class ProcessMaps:
    """Every slab mapped in this process, by path, shared by its clients."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)  # a fill let go of a mapping
        self._maps: dict[str, _Mapping] = {}
        # Called with a slab's address before it is unmapped; False keeps the mapping
        # (a CUDA registration that could not be undone must not outlive its memory).
        self.before_unmap: Callable[[int], bool] | None = None
        self._kept: list[mmap.mmap] = []
        # Base addresses whose page tables are filled in, or being filled in, and the one
        # thread doing it: eight clients attaching at once start one, not eight (each
        # would also hold up the others' thread starts, which wait for the kernel's lock
        # on the address space while a fill holds it).
        self._populated: set[int] = set()
        self._populating: threading.Thread | None = None

    def acquire(self, shm_dir: str, slab: SlabInfo) -> tuple[str, np.ndarray]:
        """The slab's path and a flat uint8 array over its mapping, mapped if no client
        of this process has it yet."""
        if "/" in slab.shm_name or slab.shm_name in {"", ".", ".."}:
            raise SidecarUnavailable(f"daemon sent a bad slab name {slab.shm_name!r}")
        path = os.path.join(shm_dir, slab.shm_name)
        with self._lock:
            mapping = self._maps.get(path)
            while mapping is not None and mapping.array.size != slab.size:
                self._drop(path)  # another segment by that name: a new daemon
                mapping = self._maps.get(path)  # (another client's, mapped during the wait)
            if mapping is None:
                mapping = self._maps[path] = _map(path, slab.size)
            mapping.users += 1
            return path, mapping.array

    def release(self, path: str) -> None:
        """One client lets go of `path`; the last one unmaps it."""
        with self._lock:
            mapping = self._maps.get(path)
            if mapping is None:
                return
            mapping.users -= 1
            if mapping.users > 0:
                return
            del self._maps[path]  # out of the map first: a registration elsewhere skips it
            self._wait_unfilled(mapping)
        self._unmap(mapping)

    def _drop(self, path: str) -> None:
        mapping = self._maps.pop(path)
        self._wait_unfilled(mapping)
        self._unmap(mapping)

    def _wait_unfilled(self, mapping: _Mapping) -> None:
        # (lock held) Unmapping a range the kernel is filling would let the fill reach
        # whatever is mapped there next; the wait is one slab's fill at most.
        while mapping.filling:
            self._filled.wait()

    def _unmap(self, mapping: _Mapping) -> None:
        address = int(mapping.array.ctypes.data)
        self._populated.discard(address)  # another mapping may come to the same address
        keep = self.before_unmap is not None and not self.before_unmap(address)
        del mapping.array
        if keep:
            self._kept.append(mapping.map)
            return
        with contextlib.suppress(BufferError):  # a live view still borrows it: the GC will
            mapping.map.close()

    def populate(self) -> None:
        """Fill in the page tables of every slab mapped here, off the requests' path (on
        a thread of its own, through libc: the call lets go of the GIL); where the kernel
        cannot (before Linux 5.14), the copies fill them in as they go. Returns once
        every slab's are, whichever thread filled them."""
        self._fill()
        running = self._populating
        if running is not None and running is not threading.current_thread():
            running.join()

    def _fill(self) -> None:
        for address in self.addresses():
            with self._lock:
                # Only a slab still mapped is marked: one unmapped since `addresses()`
                # would leave its address marked for the next mapping placed there.
                mapping = self._containing(address)
                if mapping is None or _base(mapping) != address or address in self._populated:
                    continue
                self._populated.add(address)
                mapping.filling = True
            try:
                filled = _madvise(address, int(mapping.array.size), MADV_POPULATE_WRITE)
            finally:
                with self._lock:
                    mapping.filling = False
                    self._filled.notify_all()
            if not filled:
                return

    def forget_filled(self) -> None:
        """In a child after fork: no page table is filled, no thread fills one, and no
        lock is held (the parent's holder does not exist here)."""
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)
        self._populated = set()
        self._populating = None
        for mapping in self._maps.values():
            mapping.filling = False

    def populate_in_background(self) -> None:
        """`populate` on a thread of its own, unless one runs or nothing is left to fill."""
        with self._lock:  # started under it: a second attach sees it alive
            running = self._populating is not None and self._populating.is_alive()
            if running or all(a in self._populated for a in self.addresses()):
                return
            thread = threading.Thread(target=self._fill, name="video-sidecar-populate", daemon=True)
            thread.start()  # (`_fill` takes the lock only once this returns)
            self._populating = thread

    def addresses(self) -> list[int]:
        """The base address of every slab mapped in this process (from any thread)."""
        return [int(m.array.ctypes.data) for m in list(self._maps.values())]

    def slab_of(self, address: int) -> tuple[int, int] | None:
        """(base address, size) of the mapped slab containing `address` (no lock: a slab
        being unmapped is gone from the map before it is)."""
        mapping = self._containing(address)
        return None if mapping is None else (_base(mapping), int(mapping.array.size))

    def _containing(self, address: int) -> _Mapping | None:
        for mapping in list(self._maps.values()):
            if _base(mapping) <= address < _base(mapping) + mapping.array.size:
                return mapping
        return None


def _base(mapping: _Mapping) -> int:
    return int(mapping.array.ctypes.data)


def _map(path: str, size: int) -> _Mapping:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SidecarUnavailable(
            f"cannot open slab {path}: {exc.strerror}. The client must share the daemon's "
            "/dev/shm (same host, same IPC namespace) and its user or group."
        ) from None
    try:
        found = os.fstat(fd).st_size
        if found != size:
            raise SidecarUnavailable(f"slab {path} is {found} bytes, expected {size}")
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)  # pages: `populate`
    finally:
        os.close(fd)
    return _Mapping(mapped, np.frombuffer(mapped, dtype=np.uint8))


PROCESS_MAPS = ProcessMaps()
# A child after fork has the mappings but not their page tables (fork leaves a shared
# mapping's to be faulted in again); the parent's thread is not alive there.
os.register_at_fork(after_in_child=PROCESS_MAPS.forget_filled)


class SlabMap:
    """One client's slabs: slab id -> flat uint8 array, for one daemon instance."""

    def __init__(self, maps: ProcessMaps = PROCESS_MAPS) -> None:
        self.instance_id = ""
        self._process = maps
        self._paths: dict[int, str] = {}
        self._arrays: dict[int, np.ndarray] = {}

    def map(self, instance_id: str, shm_dir: str, slabs: list[SlabInfo]) -> None:
        """Map every slab of `instance_id`; a new instance replaces the old mappings."""
        if instance_id == self.instance_id and len(self._arrays) == len(slabs):
            return
        self.close()
        try:
            for slab in slabs:
                self._paths[slab.id], self._arrays[slab.id] = self._process.acquire(shm_dir, slab)
        except BaseException:
            self.close()
            raise
        self.instance_id = instance_id

    def region(self, slab_id: int, offset: int, size: int) -> np.ndarray:
        """The leased bytes as a flat writable uint8 view."""
        array = self._arrays[slab_id]
        if offset < 0 or offset + size > array.size:
            raise SidecarUnavailable(f"lease [{offset}, {offset + size}) outside slab {slab_id}")
        return array[offset : offset + size]

    def addresses(self) -> list[int]:
        """The base address of each of this client's slabs."""
        return [int(array.ctypes.data) for array in list(self._arrays.values())]

    def close(self) -> None:
        """Let go of every slab; the last client of a slab in this process unmaps it."""
        paths = list(self._paths.values())
        self._paths.clear()
        self._arrays.clear()
        for path in paths:
            self._process.release(path)
        self.instance_id = ""
