"""The throughput suite: aggregate frames/s of concurrent callers."""

from __future__ import annotations

import threading
import time
from typing import Any

from client import SidecarClient

from .common import (
    Device,
    Row,
    parse_shape,
    summarise,
)
from .daemons import daemon, pool_for
from .variants import pyav_encode


def throughput(
    device: Device,
    clients: int,
    requests: int,
    shape: str,
    sidecar_options: dict[str, Any],
    content: str = "smooth",
) -> list[Row]:
    """Aggregate frames/s with `clients` concurrent callers each sending `requests` videos."""
    w, h, t = parse_shape(shape)
    rows = []
    host_video = device.video(shape, content)
    frames_total = clients * requests * t

    def pyav_defaults() -> None:
        frames = host_video.cpu().numpy() if hasattr(host_video, "cpu") else host_video
        for _ in range(requests):
            pyav_encode(frames, borrowed=False)

    rows.append(_concurrent("pyav_defaults", shape, clients, pyav_defaults, frames_total))
    options = {"max_concurrent_encodes": clients, **pool_for(w * h * 3, t, copies=clients)}
    with daemon(**options) as d:
        for name, fmt in (("sidecar", "rgb24"), ("sidecar_yuv", "yuv420p")):
            go = threading.Barrier(clients + 1)

            def work(fmt: str | None = fmt, go: threading.Barrier = go) -> None:
                with SidecarClient(d.socket) as c:
                    c.encode(host_video, pixel_format=fmt, **sidecar_options)  # warm up
                    go.wait()
                    for _ in range(requests):
                        c.encode(host_video, pixel_format=fmt, **sidecar_options)

            rows.append(_concurrent(name, shape, clients, work, frames_total, go))
    for r in rows:
        print(f"{content:>6} {r.shape:>14} {r.variant:<14} {r.extra['frames_per_s']:8.1f} frames/s "
              f"({clients} clients)", flush=True)  # fmt: skip
    return rows


def _concurrent(
    name: str, shape: str, clients: int, work: Any, frames: int, go: threading.Barrier | None = None
) -> Row:
    """Run `work` on `clients` threads; time from `go` (after their warm-up) to the last."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
            if go is not None:
                go.abort()

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for th in threads:
        th.start()
    if go is not None:
        go.wait()  # every client has finished its warm-up request
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    row = summarise(name, shape, [elapsed * 1e3], frames=frames, clients=clients)
    row.extra["frames_per_s"] = round(frames / elapsed, 1)
    return row
