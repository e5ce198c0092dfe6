"""How large the slab pool is when the configuration leaves it to the daemon.

`--slabs 0` and `--slab-size 0` (the defaults; also `auto`) mean "size it to this host".
The rule, in `size_pool`:

- The reference video is 1344x768, 122 frames of 4:2:0: 1344*768*3/2 = 1,548,288 bytes a
  frame. The client splits a video into leases of at most one slab each, so a 64 MiB slab
  holds 43 of its frames and one video takes 3 slabs (43 + 43 + 36 frames).
- Slabs are 64 MiB, and the pool wants room for one reference video per encode that
  `--max-concurrent-encodes` lets run at once: 3 slabs each.
- The pool takes at most half of the shared-memory filesystem (`os.statvfs` of
  `--shm-dir`: its total size, not what is free) and at most a quarter of the machine's
  physical memory. It never has fewer than 4 slabs: where 4 slabs of 64 MiB would exceed
  those caps, the slabs shrink (whole 4 KiB pages, down to 8 MiB) until 4 fit. 4 x 8 MiB
  is the least pool; a shared-memory filesystem too small even for that stays a startup
  error that says so. Nor does it have more than `MAX_SLABS`.
- When only one of the two is given, the other is chosen by the same rule: a given slab
  count gets 64 MiB slabs, shrunk (down to 8 MiB) where that count of them would exceed
  the caps; a given slab size gets as many slabs as the concurrent reference videos take
  at that size (4 where one frame does not fit a slab), at least 4, at most what the caps
  hold of that size, and at least 1.

A configured pool too small for the concurrent reference videos still works: requests
wait for memory in turn and long videos stream through it; `pool_warning` says so once at
startup.
"""

from __future__ import annotations

import os

from ..config_values import MAX_SLABS, PAGE, format_size

MiB = 1024 * 1024
REFERENCE = (1344, 768, 122)  # width, height, frames
REFERENCE_FRAME_BYTES = 1344 * 768 * 3 // 2  # 4:2:0: 1,548,288 bytes
REFERENCE_TEXT = "1344x768x122 4:2:0"
SLAB_SIZE = 64 * MiB
MIN_SLAB_SIZE = 8 * MiB
MIN_SLABS = 4
SHM_SHARE = 2  # the pool takes at most 1/2 of the shared-memory filesystem
MEMORY_SHARE = 4  # and at most 1/4 of the physical memory


def slabs_per_video(slab_size: int) -> int | None:
    """Slabs one reference video takes when each lease is at most a slab; None when one
    of its frames does not fit a slab."""
    per_slab = slab_size // REFERENCE_FRAME_BYTES
    if per_slab < 1:
        return None
    return -(-REFERENCE[2] // per_slab)


def videos_held(slabs: int, slab_size: int) -> int:
    """Reference videos a pool holds at once."""
    per_video = slabs_per_video(slab_size)
    return slabs // per_video if per_video else 0


def pool_cap(shm_total: int | None, memory_total: int | None) -> tuple[int | None, str]:
    """The most bytes the pool may take, and what sets it ("" when nothing is known)."""
    caps = []
    if shm_total is not None:
        caps.append(
            (shm_total // SHM_SHARE, f"half of the {format_size(shm_total)} shared-memory dir")
        )
    if memory_total is not None:
        caps.append(
            (memory_total // MEMORY_SHARE, f"a quarter of the {format_size(memory_total)} memory")
        )
    if not caps:
        return None, ""
    return min(caps)


def _pages(n: int) -> int:
    return n // PAGE * PAGE


def _shrunk(slabs: int, cap: int) -> int:
    """The slab size, 64 MiB down to 8 MiB in whole pages, at which `slabs` fit `cap`."""
    return max(MIN_SLAB_SIZE, min(SLAB_SIZE, _pages(cap // slabs)))


def _videos(n: int) -> str:
    return f"{n} concurrent {REFERENCE_TEXT} video{'' if n == 1 else 's'}"


def _shrink_text(slabs: int, size: int, cap: int) -> str:
    if slabs * size <= cap:
        return f"shrunk from {format_size(SLAB_SIZE)} to fit"
    return "the least slab size, though even these do not fit"


def size_pool(
    max_concurrent: int,
    shm_total: int | None,
    memory_total: int | None,
    *,
    slabs: int = 0,
    slab_size: int = 0,
) -> tuple[int, int, str]:
    """(slabs, slab size, why) by the rule in this module's docstring.

    `shm_total` and `memory_total` are bytes, None where unknown (no cap from it);
    `slabs` and `slab_size` are the configured values, 0 for "choose". `why` is one line
    for the log, saying what was chosen and what set it."""
    if slabs and slab_size:
        return slabs, slab_size, "as configured"
    cap, cap_why = pool_cap(shm_total, memory_total)
    capped = f"the pool's cap of {format_size(cap or 0)}, {cap_why}"
    if slabs:  # the size is chosen
        size = SLAB_SIZE if cap is None else _shrunk(slabs, cap)
        why = f"--slabs as configured, the slab size chosen for this host: {format_size(size)}"
        if size < SLAB_SIZE:
            why += f" ({_shrink_text(slabs, size, cap or 0)} {capped})"
        return slabs, size, why
    if slab_size:  # the count is chosen
        per = slabs_per_video(slab_size)
        want = max_concurrent * per if per else MIN_SLABS
        count = min(max(want, MIN_SLABS), MAX_SLABS)
        if per:
            why = f"{want} for {_videos(max_concurrent)} ({per} each)"
        else:
            why = f"{MIN_SLABS}, the least: one {REFERENCE_TEXT} frame does not fit a slab"
        if count > want:
            why = f"{count}, the least ({why})"
        if cap is not None and count > cap // slab_size:
            count = max(1, cap // slab_size)
            why += f", cut to {count} by {capped}"
        return count, slab_size, f"--slab-size as configured, the count chosen for this host: {why}"
    per_video = slabs_per_video(SLAB_SIZE) or 1
    want = max_concurrent * per_video
    count = min(max(want, MIN_SLABS), MAX_SLABS)
    why = (
        f"{want} slabs of {format_size(SLAB_SIZE)} for {_videos(max_concurrent)} "
        f"(--max-concurrent-encodes) at {per_video} slabs each"
    )
    if count > want:
        why = f"the least pool, {MIN_SLABS} slabs of {format_size(SLAB_SIZE)} ({why})"
    elif count < want:
        why += f", cut to {MAX_SLABS} slabs"
    size = SLAB_SIZE
    if cap is not None and count * SLAB_SIZE > cap:
        if cap >= MIN_SLABS * SLAB_SIZE:
            count = cap // SLAB_SIZE
            why += f", cut to {count} by {capped}"
        else:
            count, size = MIN_SLABS, _shrunk(MIN_SLABS, cap)
            why = (
                f"the least pool, {MIN_SLABS} slabs of {format_size(size)} "
                f"({_shrink_text(MIN_SLABS, size, cap)} {capped})"
            )
    return count, size, f"sized to this host: {why}"


def host_totals(shm_dir: str) -> tuple[int | None, int | None]:
    """(total bytes of the filesystem at `shm_dir`, physical memory), None where unknown.

    A missing `shm_dir` gives None here; opening the slabs then fails with a clear
    startup error, as it does for any configured pool."""
    try:
        st = os.statvfs(shm_dir)
        shm_total: int | None = st.f_blocks * st.f_frsize or None
    except OSError:
        shm_total = None
    try:
        memory_total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf, or no such name here
        memory_total = None
    if memory_total is not None and memory_total <= 0:
        memory_total = None
    return shm_total, memory_total


def resolve(
    max_concurrent: int, shm_dir: str, slabs: int = 0, slab_size: int = 0
) -> tuple[int, int, str]:
    """`size_pool` for this host: its shared-memory dir `shm_dir` and its memory."""
    return size_pool(max_concurrent, *host_totals(shm_dir), slabs=slabs, slab_size=slab_size)


def pool_warning(slabs: int, slab_size: int, max_concurrent: int) -> str | None:
    """One line when the pool cannot hold `max_concurrent` reference videos at once
    (None when it can). Such a pool still works: requests wait for memory in turn."""
    if slabs_per_video(slab_size) is None:
        return (
            f"the pool's slabs ({format_size(slab_size)}) are smaller than one "
            f"{REFERENCE_TEXT} frame ({REFERENCE_FRAME_BYTES} bytes); a client cannot lease "
            "room for frames that large. Raise --slab-size."
        )
    held = videos_held(slabs, slab_size)
    if held >= max_concurrent:
        return None
    return (
        f"the pool ({slabs} x {format_size(slab_size)}) holds {held} of the "
        f"{_videos(max_concurrent)} --max-concurrent-encodes allows; they will "
        "wait their turn for memory. Raise --slabs or --slab-size."
    )


def describe_pool(slabs: int, slab_size: int, reason: str, max_concurrent: int) -> list[str]:
    """The lines to log at startup: the pool and why it is that size (`reason`; empty: as
    configured), and the warning of `pool_warning` if there is one."""
    total = format_size(slabs * slab_size)
    why = reason or "as configured"
    lines = [f"slab pool: {slabs} x {format_size(slab_size)} = {total}, {why}"]
    warning = pool_warning(slabs, slab_size, max_concurrent)
    if warning:
        lines.append(warning)
    return lines
