"""Keeping the daemon's heap from ballooning: fewer malloc arenas, and a trim when idle.

glibc gives each thread that allocates an arena of its own, up to eight per core, and what
is freed in an arena stays there, resident, for that arena's next allocations. The daemon
has many allocating threads, most short-lived: the encoder pool, the warm-up thread,
gRPC's, and the threads libx264, libx265, libvpx and SVT-AV1 start for every encoder. So
the arenas keep what the encoders freed. Measured (bench/soak_fuzz.py, malloc_info,
smaps): over a 10-minute fuzz run Python's objects and the heap in use stay flat while 15
arenas hold 140 MiB of heap, 120 MiB of it free; after 24-40 encodes of up to 1080p from
four clients an idle daemon kept 107-444 MiB of RssAnon. Retention, not a leak. So:

- `limit_arenas()` caps the arenas (M_ARENA_MAX) before the threads start, so freed
  memory is reused across threads instead of parked in one arena per thread;
- `trim()` (malloc_trim) gives free heap pages back to the kernel, and `trim_when_idle`
  calls it once no encode has run or started for a few seconds; after `RELEASE_S` idle
  (`--idle-release`) the ready encoders are closed too, in the daemon and in each encoder
  process, and trimmed, so a daemon idle for a minute holds no encoder's memory.

With both, the same encodes leave 40-60 MiB.

The opposite problem, under load: every encoder allocates its frame buffers afresh (x264
when it opens, swscale for each converted frame), megabytes at a time. glibc maps such
blocks, or grows the heap for them and trims it back when they are freed (its trim
threshold follows the largest block freed, not their sum), so the next encoder's buffers
are new pages that the kernel faults in and zeroes. On the 2-core machine that was
600-1200 page faults per small clip in the encoder processes, a fifth to a quarter of
their CPU. `keep_freed()` raises the mmap and trim thresholds so that freed buffers stay
in the heap for the next encoder (a few faults per clip). Encoder processes call it, with
a single arena, and not at all where an operator set the arenas: `trim()` gives back the
top of the main arena's heap only, so another arena's kept top would stay resident after
the idle trim. The daemon does not: its in-process encodes (segments of long videos,
audio, streams) spread over an arena per encode, and pay their faults over many frames.

All of this is skipped where the C library is not glibc (musl, macOS); an operator's
MALLOC_* variables or glibc.malloc tunables win.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MiB = 1024 * 1024
# Blocks up to this size come from the heap: glibc's own ceiling for its sliding threshold
# (a 4K frame is 12 MiB). Larger ones are still mapped, and unmapped when freed.
MMAP_THRESHOLD = 32 * MiB
# Free memory the heap's top may hold before free() gives it back: a 1344x768 encoder's
# buffers and more. Beyond, or when idle (`trim()`), it goes back.
TRIM_THRESHOLD = 64 * MiB
# How an operator sets each parameter: glibc's environment variable (MALLOC_ARENA_MAX has
# no trailing underscore), or glibc.malloc.<name> in GLIBC_TUNABLES.
OPERATOR_VARIABLES = {
    "arena_max": "MALLOC_ARENA_MAX",
    "mmap_threshold": "MALLOC_MMAP_THRESHOLD_",
    "trim_threshold": "MALLOC_TRIM_THRESHOLD_",
}
ARENAS = 2  # at least: the main thread's arena and one for every other thread
IDLE_S = 5.0  # idle this long, free heap goes back
# Idle this long, ready encoders are closed and their memory goes back: a server that
# pauses for half a minute pays one encoder open (3-5 ms) on its next request.
RELEASE_S = 30.0


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, TypeError, AttributeError):  # no dlopen(NULL), or not glibc
        return None
    return libc


def limit_arenas(count: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before threads start. True if the cap was set."""
    libc = _glibc()
    if libc is None or _operator_set("arena_max"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, count))


def keep_freed() -> bool:
    """Keep freed blocks of up to `MMAP_THRESHOLD` bytes, and up to `TRIM_THRESHOLD`
    bytes of free heap, for the next allocations (see above). True if both were set."""
    libc = _glibc()
    if libc is None or _operator_set("mmap_threshold", "trim_threshold"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def _operator_set(*names: str) -> bool:
    """Whether the environment sets any of these malloc parameters (`OPERATOR_VARIABLES`)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(OPERATOR_VARIABLES[n] in os.environ or f"malloc.{n}" in tunables for n in names)


def trim() -> bool:
    """Return free heap pages to the kernel. True if any memory was released."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


async def trim_when_idle(
    busy: Callable[[], bool],
    started: Callable[[], int],
    idle_s: float = IDLE_S,
    release: Callable[[], int] | None = None,
    release_s: float = RELEASE_S,
) -> None:
    """Trim once whenever no encode has run (`busy()` false) nor started (`started()`, a
    count, unchanged) for `idle_s` seconds; after `release_s`, call `release()` (closes
    what is kept ready, returns how many) and trim again if it closed any. Runs until
    cancelled. The trim runs on the loop: milliseconds (10 ms after 70 MiB of 1080p
    encodes), at a moment nothing else is encoding; without glibc only `release` runs."""
    loop = asyncio.get_running_loop()
    count, since = started(), loop.time()
    trimmed, released = True, release is None  # nothing to give back at start
    while True:
        await asyncio.sleep(1.0)
        now = loop.time()
        if busy() or started() != count:
            count, since = started(), now
            trimmed, released = False, release is None
            continue
        if not released and release is not None and now - since >= release_s:
            released = True
            if release():
                trimmed = False
        if not trimmed and now - since >= idle_s:
            trimmed = True
            if _glibc() is not None:
                t0 = time.perf_counter()
                freed = trim()
                ms = (time.perf_counter() - t0) * 1e3
                log.debug("malloc_trim released=%s in %.1f ms", freed, ms)
