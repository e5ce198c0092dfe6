"""The stream suite: a producer writing chunks at a pace, against one whole-video encode."""

from __future__ import annotations

import statistics
import time

from client import SidecarClient

from .common import (
    Device,
    Row,
    parse_shape,
    summarise,
    timed,
)
from .daemons import daemon, pool_for


def streaming(
    device: Device,
    shape: str,
    chunk: int,
    pace_ms: float,
    samples: int | None,
    content: str = "smooth",
) -> list[Row]:
    """A producer writes `chunk`-frame chunks every `pace_ms`; time from the last write to
    the complete video in the caller, next to encoding the whole video at once."""
    w, h, t = parse_shape(shape)
    n = samples or 3
    video = device.video(shape, content)
    rows = []
    with daemon(**pool_for(w * h * 3, t)) as d, SidecarClient(d.socket) as client:
        whole = []
        for i in range(n + 1):
            device.ready()
            ms, _ = timed(lambda: client.encode(video))
            if i:
                whole.append(ms)
        rows.append(summarise("whole_video_encode", shape, whole))
        for container, path in (("fmp4", None), ("mp4", "bench/stream.mp4")):
            tails, totals = [], []
            for i in range(n + 1):
                t0 = time.perf_counter()
                with client.stream(fps=24, container=container, path=path, overwrite=True) as s:
                    for first in range(0, t, chunk):
                        due = t0 + (first // chunk) * pace_ms / 1e3
                        time.sleep(max(0.0, due - time.perf_counter()))
                        s.write(video[first : first + chunk])
                    last_write = time.perf_counter()
                done = time.perf_counter()
                if i:
                    tails.append((done - last_write) * 1e3)
                    totals.append((done - t0) * 1e3)
            name = f"stream_tail_{container}_{'file' if path else 'bytes'}"
            rows.append(
                summarise(
                    name, shape, tails, chunk_frames=chunk, pace_ms=pace_ms,
                    producer_ms=round((-(-t // chunk) - 1) * pace_ms, 1),
                    total_median_ms=round(statistics.median(totals), 1),
                )
            )  # fmt: skip
    for r in rows:
        print(f"{r.shape:>14} {r.variant:<28} median {r.median_ms:8.1f} ms  {r.extra}", flush=True)
    return rows
