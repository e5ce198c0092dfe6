"""The malloc settings of the daemon and its encoder processes (sidecar.codec.memory), in fresh
interpreters: glibc reads its environment once, and mallopt lasts for the process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sidecar.codec import memory

pytestmark = pytest.mark.skipif(memory._glibc() is None, reason="glibc's malloc only")

# An encoder's buffers: twelve 4:2:0 frames of 1344x768, allocated, touched and freed.
ENCODER = """
import ctypes, sys
from sidecar.codec import memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 1344 * 768 * 3 // 2
def encoder():
    blocks = [libc.malloc(size) for _ in range(12)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
"""

# A few encoders, then the page faults of one more: with `keep` after keep_freed().
REUSE = (
    ENCODER
    + """
import resource
kept = memory.keep_freed() if sys.argv[1] == "keep" else None
for _ in range(3):
    encoder()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
encoder()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
)

# One encoder on another thread (as the converting thread allocates), with `argv[1]`
# malloc arenas; then the idle trim. RssAnon in KiB before and after it.
IDLE = (
    ENCODER
    + """
import threading
memory.limit_arenas(int(sys.argv[1]))
memory.keep_freed()
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
worker = threading.Thread(target=encoder)
worker.start()
worker.join()
before = rss_anon()
memory.trim()
print(before, rss_anon())
"""
)


def run(code: str, *args: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env={**clean, **env}, capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.split()


def test_freed_buffers_serve_the_next_encoder_without_new_pages() -> None:
    kept, faults = run(REUSE, "keep")
    assert kept == "True"
    assert int(faults) < 100, faults


def test_by_default_the_next_encoders_buffers_are_new_pages() -> None:
    """What keep_freed saves: with glibc's defaults the heap grows for the twelve and is
    trimmed back as they are freed (the trim threshold follows the largest block freed,
    twice 1.5 MiB), so every page is faulted in and zeroed again."""
    kept, faults = run(REUSE, "default")
    assert kept == "None"
    assert int(faults) > 12 * 300, faults  # 369 pages a frame


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
        {"MALLOC_TRIM_THRESHOLD_": "1048576"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
    ],
)
def test_an_operators_malloc_settings_win(env: dict[str, str]) -> None:
    assert run("from sidecar.codec import memory; print(memory.keep_freed())", **env) == ["False"]


def test_an_idle_encoder_process_gives_the_kept_buffers_back() -> None:
    """With one arena, as encoder processes run, the idle trim returns what keep_freed
    kept, though another thread freed it."""
    before, after = map(int, run(IDLE, "1"))
    assert before - after > 12 * 1024, (before, after)  # of 18 MiB


def test_with_a_second_arena_its_kept_top_would_stay() -> None:
    """Why one: malloc_trim trims the top of the main arena's heap only."""
    before, after = map(int, run(IDLE, "2"))
    assert before - after < 4 * 1024, (before, after)
