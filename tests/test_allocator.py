from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.pool.allocator import RegionAllocator, align_up


def test_aligned_first_fit() -> None:
    a = RegionAllocator(64 * 1024, alignment=4096)
    assert a.allocate(1) == (0, 4096)
    assert a.allocate(4097) == (4096, 8192)
    assert a.allocate(4096) == (12288, 4096)
    assert a.allocated_bytes == 16384


def test_full_and_none() -> None:
    a = RegionAllocator(8192, alignment=4096)
    assert a.allocate(8192) == (0, 8192)
    assert a.allocate(1) is None
    a.free(0)
    assert a.allocate(8192) == (0, 8192)


def test_coalesces_both_neighbours() -> None:
    a = RegionAllocator(4 * 4096, alignment=4096)
    offsets = [a.allocate(4096)[0] for _ in range(4)]  # type: ignore[index]
    a.free(offsets[0])
    a.free(offsets[2])
    assert a.extents() == [(0, 4096), (8192, 4096)]
    a.free(offsets[1])  # joins both sides
    assert a.extents() == [(0, 3 * 4096)]
    a.free(offsets[3])
    assert a.extents() == [(0, 4 * 4096)] and a.largest_free == 4 * 4096


def test_fragmentation_is_visible() -> None:
    a = RegionAllocator(4 * 4096, alignment=4096)
    offsets = [a.allocate(4096)[0] for _ in range(4)]  # type: ignore[index]
    a.free(offsets[0])
    a.free(offsets[2])
    assert a.free_bytes == 8192 and a.largest_free == 4096
    assert a.allocate(8192) is None


def test_rejects_bad_use() -> None:
    with pytest.raises(ValueError):
        RegionAllocator(1000, alignment=4096)
    with pytest.raises(ValueError):
        RegionAllocator(8192, alignment=3000)
    a = RegionAllocator(8192)
    with pytest.raises(ValueError):
        a.allocate(0)
    with pytest.raises(KeyError):
        a.free(4096)
    off, _ = a.allocate(10)  # type: ignore[misc]
    a.free(off)
    with pytest.raises(KeyError):
        a.free(off)  # double free


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40_000)), max_size=60), st.integers(0, 99))
def test_random_workload_keeps_invariants(ops: list[tuple[bool, int]], seed: int) -> None:
    rng = random.Random(seed)
    a = RegionAllocator(64 * 4096, alignment=4096)
    live: dict[int, int] = {}
    for alloc, size in ops:
        if alloc or not live:
            got = a.allocate(size)
            if got is not None:
                offset, length = got
                assert offset % 4096 == 0 and length == align_up(size, 4096)
                for o, n in live.items():  # no overlap with anything live
                    assert offset + length <= o or o + n <= offset
                live[offset] = length
        else:
            offset = rng.choice(sorted(live))
            assert a.free(offset) == live.pop(offset)
        assert a.allocated_bytes == sum(live.values())
        extents = a.extents()
        for (o1, n1), (o2, _) in itertools.pairwise(extents):
            assert o1 + n1 < o2  # sorted, disjoint and never adjacent (coalesced)
    for offset in list(live):
        a.free(offset)
    assert a.extents() == [(0, 64 * 4096)]
