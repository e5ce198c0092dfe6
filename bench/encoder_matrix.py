"""In-process encoder settings matrix, to choose the daemon's defaults.

    python -m bench.encoder_matrix [--shape 1344x768x362] [--json FILE]

Times `VideoEncoder` alone (no transport) over thread counts, threading modes and input
formats, and prints the stage split.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from fractions import Fraction

import av
import numpy as np

from client._convert import Conversion, Ops
from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry

from .common import machine, parse_shape


def run(frames: np.ndarray, fmt: str, threads: int, thread_type: str, samples: int) -> dict:
    _, rows, w = frames.shape[:3]
    h = rows * 2 // 3 if fmt == "yuv420p" else rows
    g = check_geometry(w, h, fmt, Fraction(24), Limits(100000, 8192, 8192, 1 << 40))
    times, splits = [], []
    for _ in range(samples):
        fd = os.memfd_create("m")
        t0 = time.perf_counter()
        enc = VideoEncoder(f"/proc/self/fd/{fd}", g, CodecSpec().resolve(), threads, thread_type)
        for f in frames:
            enc.encode(f)
        enc.close()
        times.append((time.perf_counter() - t0) * 1e3)
        splits.append(enc.timings)
        os.close(fd)
    split = {k: round(statistics.median(getattr(s, k) for s in splits) * 1e3, 1)
             for k in ("open", "convert", "encode", "mux", "finalize")}  # fmt: skip
    return {"format": fmt, "threads": threads, "thread_type": thread_type,
            "median_ms": round(statistics.median(times), 1), **split}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="448x256x4,1344x768x1,448x256x16,1344x768x122")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    results = []
    for shape in args.shapes.split(","):
        w, h, t = parse_shape(shape)
        rgb = moving_pattern(t, h, w, noise=2.0)
        yuv = Conversion("yuv420p", 255.0, 0.0, integer=True).apply(rgb, Ops())
        for fmt, frames in (("rgb24", rgb), ("yuv420p", yuv)):
            for threads in sorted({1, 2, 4, 8, cores}):
                for tt in ("FRAME", "SLICE"):
                    r = {"shape": shape, **run(frames, fmt, threads, tt, args.samples)}
                    results.append(r)
                    print(r, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "av": av.__version__, "rows": results}, fh, indent=2)


if __name__ == "__main__":
    main()
