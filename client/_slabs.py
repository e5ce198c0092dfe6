"""The client's mappings of the daemon's slabs: each slab is mapped once per process.

We open `/dev/shm/<name>` and `mmap` it ourselves. `multiprocessing.shared_memory` would
register the segment with Python's resource tracker, which unlinks it when this process
exits and so would destroy the daemon's pool.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._errors import SidecarUnavailable


@dataclass(frozen=True)
class SlabInfo:
    id: int
    shm_name: str
    size: int


class SlabMap:
    """Slab id -> flat uint8 array over a shared mapping, for one daemon instance."""

    def __init__(self) -> None:
        self.instance_id = ""
        self._maps: dict[int, mmap.mmap] = {}
        self._arrays: dict[int, np.ndarray] = {}
        # Called with a slab's address before it is unmapped; False keeps the mapping
        # (a CUDA registration that could not be undone must not outlive its memory).
        self.before_unmap: Callable[[int], bool] | None = None
        self._kept: list[mmap.mmap] = []

    def map(self, instance_id: str, shm_dir: str, slabs: list[SlabInfo]) -> None:
        """Map every slab of `instance_id`; a new instance replaces the old mappings."""
        if instance_id == self.instance_id and len(self._arrays) == len(slabs):
            return
        self.close()
        try:
            for slab in slabs:
                self._map_one(shm_dir, slab)
        except BaseException:
            self.close()
            raise
        self.instance_id = instance_id

    def _map_one(self, shm_dir: str, slab: SlabInfo) -> None:
        if "/" in slab.shm_name or slab.shm_name in {"", ".", ".."}:
            raise SidecarUnavailable(f"daemon sent a bad slab name {slab.shm_name!r}")
        path = os.path.join(shm_dir, slab.shm_name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise SidecarUnavailable(
                f"cannot open slab {path}: {exc.strerror}. The client must share the daemon's "
                "/dev/shm (same host, same IPC namespace) and its user or group."
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size != slab.size:
                raise SidecarUnavailable(f"slab {path} is {size} bytes, expected {slab.size}")
            # Populate the page tables now, not on the first copy of every request.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(fd, slab.size, flags=flags)
        finally:
            os.close(fd)
        self._maps[slab.id] = mapped
        self._arrays[slab.id] = np.frombuffer(mapped, dtype=np.uint8)

    def region(self, slab_id: int, offset: int, size: int) -> np.ndarray:
        """The leased bytes as a flat writable uint8 view."""
        array = self._arrays[slab_id]
        if offset < 0 or offset + size > array.size:
            raise SidecarUnavailable(f"lease [{offset}, {offset + size}) outside slab {slab_id}")
        return array[offset : offset + size]

    def addresses(self) -> list[int]:
        """The base address of every mapped slab (read from any thread: a snapshot)."""
        return [int(array.ctypes.data) for array in list(self._arrays.values())]

    def slab_of(self, address: int) -> tuple[int, int] | None:
        """(base address, size) of the slab containing `address`."""
        for array in list(self._arrays.values()):
            base = int(array.ctypes.data)
            if base <= address < base + array.size:
                return base, int(array.size)
        return None

    def close(self) -> None:
        """Unmap everything; a mapping still borrowed by a live view is left to the GC."""
        for slab_id, array in list(self._arrays.items()):
            # Out of the map first: a registration on another thread no longer finds it.
            del self._arrays[slab_id]
            keep = self.before_unmap is not None and not self.before_unmap(int(array.ctypes.data))
            mapped = self._maps.pop(slab_id)
            del array
            if keep:
                self._kept.append(mapped)
                continue
            with contextlib.suppress(BufferError):
                mapped.close()
        self.instance_id = ""
