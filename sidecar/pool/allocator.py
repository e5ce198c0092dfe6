"""Region allocator for one slab: first fit, aligned, coalescing on free.

Pure bookkeeping over offsets; it never touches memory and is not thread-safe on its own
(the pool serialises access).
"""

from __future__ import annotations

import bisect


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
