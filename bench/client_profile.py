"""Where the client's own time goes: small clips back to back, under cProfile.

    python -m bench.client_profile [--device cpu|cuda] [--shape 448x256x4] [--calls 300]

Starts a daemon with default settings, sends `--calls` back-to-back `encode()` calls of
one clip per pixel format, and prints the median time outside the daemon (total minus the
daemon's own time; the copy into the lease is part of it) and the functions that took it.
cProfile slows the client itself, so the medians are above the bench's.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

from client import SidecarClient
from client.patterns import moving_pattern

from .common import parse_shape
from .daemons import daemon


def profile(client: SidecarClient, video: Any, fmt: str | None, calls: int, sync: Any) -> None:
    for _ in range(50):  # warm: the processes, the spare lease, the ready encoders
        client.encode(video, pixel_format=fmt)
    outside, copies = [], []
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        result = client.encode(video, pixel_format=fmt)
        outside.append((time.perf_counter() - t0) * 1e3 - result.timings.daemon_ms)
        copies.append(result.timings.copy_ms)
    profiler.disable()
    print(
        f"{fmt or 'default'}: outside the daemon {statistics.median(outside):.3f} ms "
        f"(copy {statistics.median(copies):.3f} ms), median of {calls}"
    )
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shape", default="448x256x4")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    width, height, frames = parse_shape(args.shape)
    video: Any = moving_pattern(frames, height, width)
    sync: Any = lambda: None  # noqa: E731
    formats: list[str | None] = [None]
    if args.device == "cuda":
        import torch

        video = torch.from_numpy(video).cuda()
        sync = torch.cuda.synchronize
        formats.append("rgb24")  # the default for a CUDA tensor is yuv420p
    with daemon() as d, SidecarClient(d.socket) as client:
        for fmt in formats:
            profile(client, video, fmt, args.calls, sync)


if __name__ == "__main__":
    main()
