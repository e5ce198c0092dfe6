"""Keeping the daemon's heap from ballooning: fewer malloc arenas, and a trim when idle.

glibc gives every thread that allocates an arena of its own, up to eight per core, and an
arena keeps what was freed in it for later use by that arena alone. The daemon runs many
short-lived allocating threads: the encoder pool, the warm-up thread, gRPC's, and the
threads libx264, libx265, libvpx and SVT-AV1 start for every encoder. Under a long mix of
short encodes (bench/soak_fuzz.py) the arenas fill with freed, fragmented but resident
memory: in a 3-minute fuzz run the heaps reached 120 MiB of which 50-85 MiB was free,
while Python's own objects stayed flat. That is retention, not a leak; two calls bound it:

- `limit_arenas()` caps the arenas (M_ARENA_MAX) before any thread exists, so freed
  memory is reused across threads instead of parked in one arena per thread;
- `trim()` hands free pages back to the kernel (malloc_trim), which `trim_when_idle` does
  once no encode has run for a few seconds.

Both are skipped where the C library is not glibc (musl, macOS): nothing to tune there.
An operator's MALLOC_ARENA_MAX or glibc.malloc.arena_max tunable wins over ours.
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

M_ARENA_MAX = -8  # mallopt parameter, from glibc's malloc.h
ARENAS = 2  # the event loop's (main) arena and one shared by every other thread
IDLE_S = 5.0


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
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    if "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, count))


def trim() -> bool:
    """Return free heap pages to the kernel. True if any memory was released."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


async def trim_when_idle(
    activity: Callable[[], object], idle_s: float = IDLE_S, poll_s: float = 1.0
) -> None:
    """Trim once each time `activity()` (e.g. encodes running, requests seen) has stayed
    unchanged for `idle_s` seconds. Runs until cancelled; does nothing without glibc."""
    if _glibc() is None:
        return
    loop = asyncio.get_running_loop()
    last, since, trimmed = activity(), loop.time(), True  # nothing to trim at start
    while True:
        await asyncio.sleep(poll_s)
        now, current = loop.time(), activity()
        if current != last:
            last, since, trimmed = current, now, False
        elif not trimmed and now - since >= idle_s:
            t0 = time.perf_counter()
            released = trim()  # a few milliseconds on the loop: nothing else is running
            log.debug(
                "malloc_trim released=%s in %.1f ms", released, (time.perf_counter() - t0) * 1e3
            )
            trimmed = True
