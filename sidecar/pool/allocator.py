"""Region allocators: one slab's (first fit, aligned, coalescing on free), and the pool's
slabs together.

Pure bookkeeping over offsets; it never touches memory and is not thread-safe on its own
(the pool serialises access).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..errors import OutOfRange


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class RegionAllocator:
    """Hands out aligned, non-overlapping regions of `[0, size)`.

    Free space is a sorted list of disjoint `(offset, length)` extents. Allocation takes
    the first extent that fits; freeing merges the region with its free neighbours, so a
    fully freed allocator is one extent again.
    """

    def __init__(self, size: int, alignment: int = 4096) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if size <= 0 or size % alignment:
            raise ValueError(f"size must be a positive multiple of {alignment}, got {size}")
        self.size = size
        self.alignment = alignment
        self._free_offsets: list[int] = [0]
        self._free_lengths: list[int] = [size]
        self._allocated: dict[int, int] = {}

    @property
    def free_bytes(self) -> int:
        return sum(self._free_lengths)

    @property
    def allocated_bytes(self) -> int:
        return self.size - self.free_bytes

    @property
    def largest_free(self) -> int:
        return max(self._free_lengths, default=0)

    def allocate(self, length: int) -> tuple[int, int] | None:
        """Reserve at least `length` bytes; returns `(offset, aligned_length)` or None."""
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        need = align_up(length, self.alignment)
        for i, extent in enumerate(self._free_lengths):
            if extent >= need:
                offset = self._free_offsets[i]
                if extent == need:
                    del self._free_offsets[i]
                    del self._free_lengths[i]
                else:
                    self._free_offsets[i] = offset + need
                    self._free_lengths[i] = extent - need
                self._allocated[offset] = need
                return offset, need
        return None

    def free(self, offset: int) -> int:
        """Return the region at `offset` to the free list; returns its length."""
        length = self._allocated.pop(offset, None)
        if length is None:
            raise KeyError(f"no allocation at offset {offset}")
        i = bisect.bisect_left(self._free_offsets, offset)
        merged = length
        # Merge with the following extent, then with the preceding one.
        if i < len(self._free_offsets) and self._free_offsets[i] == offset + merged:
            merged += self._free_lengths[i]
            del self._free_offsets[i]
            del self._free_lengths[i]
        if i > 0 and self._free_offsets[i - 1] + self._free_lengths[i - 1] == offset:
            self._free_lengths[i - 1] += merged
        else:
            self._free_offsets.insert(i, offset)
            self._free_lengths.insert(i, merged)
        return length

    def extents(self) -> list[tuple[int, int]]:
        """The free extents, in offset order (for tests and status)."""
        return list(zip(self._free_offsets, self._free_lengths, strict=False))


class SlabRegions:
    """The regions of every slab of the pool: a request's sizes placed first fit, slab by
    slab, all or none. Not thread-safe on its own (the lease table serialises access)."""

    def __init__(self, slab_count: int, slab_size: int, alignment: int) -> None:
        self.slab_size = slab_size
        self.alignment = alignment
        self._slabs = [RegionAllocator(slab_size, alignment) for _ in range(slab_count)]

    @property
    def count(self) -> int:
        return len(self._slabs)

    @property
    def allocated_bytes(self) -> int:
        return sum(a.allocated_bytes for a in self._slabs)

    @property
    def largest_free(self) -> int:
        return max(a.largest_free for a in self._slabs)

    def check(self, sizes: Sequence[int]) -> None:
        """Refuse regions that no slab, or not even the empty pool, could hold at once."""
        for size in sizes:
            if size <= 0:
                raise OutOfRange(f"lease size must be positive, got {size}")
            if size > self.slab_size:
                raise OutOfRange(
                    f"lease of {size} bytes exceeds the slab size {self.slab_size}; "
                    "split the video into frame ranges of at most one slab each"
                )
        if len(sizes) > 1 and not self._fit_empty(sizes):
            total = sum(align_up(size, self.alignment) for size in sizes)
            raise OutOfRange(
                f"{len(sizes)} regions of {total} bytes in all cannot be held at once even by "
                f"the empty pool ({self.count} x {self.slab_size} bytes); lease fewer at once"
            )

    def _fit_empty(self, sizes: Sequence[int]) -> bool:
        """Whether first fit, in order, places every size in empty slabs."""
        free = [self.slab_size] * len(self._slabs)
        for size in sizes:
            need = align_up(size, self.alignment)
            slab = next((i for i, room in enumerate(free) if room >= need), None)
            if slab is None:
                return False
            free[slab] -= need
        return True

    def place(self, sizes: Sequence[int]) -> list[tuple[int, int, int]] | None:
        """`(slab, offset, length)` for every size, or None, with nothing held, when one
        does not fit."""
        placed: list[tuple[int, int, int]] = []
        for size in sizes:
            for slab_id, allocator in enumerate(self._slabs):
                region = allocator.allocate(size)
                if region is not None:
                    placed.append((slab_id, *region))
                    break
            else:
                for slab_id, offset, _ in placed:
                    self.free(slab_id, offset)
                return None
        return placed

    def free(self, slab_id: int, offset: int) -> None:
        self._slabs[slab_id].free(offset)
