"""x264 alone on a short clip, by thread configuration (the script behind
2026-12-07-short-clip-threads.md; not part of the bench package).

    PYTHONPATH=. python bench/results/2026-12-07-short-clip-threads.py \
        448x256x4,672x384x4 noisy,smooth 40 2s,2f,3f

Configurations: N slice threads (`Ns`) or N frame threads (`Nf`). Each encoder is
opened untimed with the daemon's settings for the clip (`balanced`, or $PROF), the first
frame measured for grain; the frames are converted to yuv420p first; the configurations
alternate in order each round, and the first two rounds are not counted.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from fractions import Fraction

import av

from bench.common import Device, as_host, parse_shape
from bench.floor import LIMITS
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.colour import FrameConverter
from sidecar.codec.encoder import configure_context
from sidecar.codec.frames import check_geometry
from sidecar.codec.grain import is_grainy
from sidecar.vocabulary import PIXEL_FORMATS


def run(shape: str, content: str, configs: list[tuple[int, str]], rounds: int) -> None:
    rgb = as_host(Device("cpu").video(shape, content))
    w, h, t = parse_shape(shape)
    converter = FrameConverter(check_geometry(w, h, "rgb24", Fraction(24), LIMITS), 2)
    frames = [
        av.VideoFrame.from_ndarray(converter.frame(image).to_ndarray(), format="yuv420p")
        for image in rgb
    ]
    codec = CodecSpec(profile=os.environ.get("PROF", "balanced")).resolve(video=(w, h, t))
    codec = codec.measured(is_grainy(rgb[0], PIXEL_FORMATS["rgb24"], h))
    geometry = check_geometry(w, h, "yuv420p", Fraction(24), LIMITS)
    times: dict[tuple[int, str], list[float]] = {c: [] for c in configs}
    sizes: dict[tuple[int, str], int] = {}
    for r in range(rounds + 2):
        for config in configs if r % 2 else configs[::-1]:
            threads, kind = config
            ctx = av.CodecContext.create("libx264", "w")
            assert isinstance(ctx, av.VideoCodecContext)
            configure_context(ctx, geometry, codec, threads, kind)
            ctx.thread_count = threads
            ctx.open()
            t0, size = time.perf_counter(), 0
            for i, frame in enumerate(frames):
                frame.pts = i
                size += sum(p.size for p in ctx.encode(frame))
            size += sum(p.size for p in ctx.encode(None))
            if r >= 2:
                times[config].append((time.perf_counter() - t0) * 1e3)
            sizes[config] = size
    for config in configs:
        median = statistics.median(times[config])
        threads, kind = config
        print(f"{content:7}{shape:12}{kind:6}{threads}  {median:6.2f} ms  {sizes[config]} bytes")


if __name__ == "__main__":
    shapes, contents, rounds, spec = sys.argv[1:5]
    chosen = [(int(c[:-1]), "SLICE" if c[-1] == "s" else "FRAME") for c in spec.split(",")]
    for shape in shapes.split(","):
        for content in contents.split(","):
            run(shape, content, chosen, int(rounds))
