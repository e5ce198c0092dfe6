"""The e2e suite: GPU-ready (or host-ready) RGB to MP4 bytes in the caller, per request."""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client import SidecarClient

from .common import (
    CONCURRENT_WARMUP_S,
    PATTERNS,
    Device,
    Row,
    parse_shape,
    run_together,
    summarise,
    timed,
)
from .daemons import daemon, pool_for
from .variants import (
    FfmpegPipe,
    Sidecar,
    SidecarDefault,
    SidecarPreviews,
    SidecarYuv,
    UpstreamA,
    UpstreamD,
    Variant,
)


def default_samples(shape: str) -> tuple[int, int]:
    """(samples, warm-ups): fewer for the long videos."""
    frames = parse_shape(shape)[2]
    if frames >= 300:
        return 5, 1
    if frames >= 100:
        return 8, 1
    return 20, 2


def _decoded_frames(data: bytes) -> int:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def e2e(
    device: Device,
    shapes: list[str],
    variants: list[str] | None,
    samples: int | None,
    sidecar_options: dict[str, Any],
    *,
    pattern: str = "steady",
    contents: Sequence[str] = ("smooth",),
    concurrency: int = 1,
    daemon_options: dict[str, Any] | None = None,
) -> list[Row]:
    """GPU-ready (or host-ready) RGB to MP4 bytes in the caller, per request.

    `pattern` "steady": all samples of one variant back to back, each request as soon as
    the previous one answered, as a busy generation server sends them; then the next
    variant, the order of the blocks rotated from shape to shape. "spaced": the variants
    interleaved per sample, which leaves the daemon idle between its requests.
    `concurrency` N: N threads run each variant at once, each sending its samples back to
    back; for the sidecar each thread has its own client, as separate workers would.
    """
    if pattern not in PATTERNS:
        raise SystemExit(f"--pattern: one of {', '.join(PATTERNS)}")
    biggest = max(shapes, key=lambda s: np.prod(parse_shape(s)))
    w, h, t = parse_shape(biggest)
    # Room for one video per thread (one variant runs at a time) and the spare leases of
    # all the clients, and never less than twice one video: a request may take at most half
    # the pool at once, else it goes as a stream.
    pool = pool_for(w * h * 3, t, copies=max(2, concurrency + 1), clients=2 * concurrency)
    options = {**pool, **(daemon_options or {})}
    rows: list[Row] = []
    with daemon(**options) as d, contextlib.ExitStack() as stack:

        def client() -> SidecarClient:
            return stack.enter_context(SidecarClient(d.socket))

        factories: dict[str, Callable[[], Variant]] = {
            "upstream_a": lambda: UpstreamA(device),
            "upstream_d": lambda: UpstreamD(device),
            "ffmpeg_pipe": lambda: FfmpegPipe(device),
            "sidecar": lambda: Sidecar(device, client(), **sidecar_options),
            "sidecar_yuv": lambda: SidecarYuv(device, client(), **sidecar_options),
            "sidecar_default": lambda: SidecarDefault(device, client(), **sidecar_options),
            "sidecar_previews": lambda: SidecarPreviews(device, client(), **sidecar_options),
        }
        lanes = _lanes(factories, variants, concurrency)
        with SidecarClient(d.socket, prepare=False) as probe:
            limit = probe.status().max_concurrent_encodes
        block = 0
        for content in contents:
            for shape in shapes:
                rows += _e2e_shape(device, shape, content, lanes, samples, pattern, block)
                block += 1
    for r in rows:
        if r.variant.startswith("sidecar"):
            r.extra["daemon_max_concurrent_encodes"] = limit
    return rows


# Run unless others are named; sidecar_default and sidecar_previews (the cost of
# previews: the default path without and with them) are run by name.
DEFAULT_VARIANTS = ("upstream_a", "upstream_d", "ffmpeg_pipe", "sidecar", "sidecar_yuv")


def _lanes(
    factories: dict[str, Callable[[], Variant]], variants: list[str] | None, concurrency: int
) -> dict[str, list[Variant]]:
    """The variants asked for (by default all but the previews pair) that can run here,
    `concurrency` of each."""
    unknown = set(variants or ()) - set(factories)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}")
    lanes: dict[str, list[Variant]] = {}
    for name, make in factories.items():
        if name not in (variants if variants is not None else DEFAULT_VARIANTS):
            continue
        first = make()
        if first.available():
            print(f"skipping {name}: {first.available()}")
            continue
        lanes[name] = [first] + [make() for _ in range(concurrency - 1)]
    if not lanes:
        raise SystemExit("e2e: no variant to run")
    return lanes


@dataclass
class _Lanes:
    """What one or more runs of a variant's threads measured."""

    times_ms: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)
    wall_s: float = 0.0
    output: bytes = b""

    def add(self, other: _Lanes) -> None:
        self.times_ms += other.times_ms
        self.stages += other.stages
        self.wall_s += other.wall_s
        self.output = other.output or self.output


def _run_lanes(
    runners: list[Variant], device: Device, video: Any, shape: str, count: int, warmup: int
) -> _Lanes:
    """Each runner on its own thread (inline when one): `warmup` requests, then, all
    starting together, `count` requests back to back, each timed."""
    device.ready()
    go = threading.Barrier(len(runners)) if len(runners) > 1 else None
    spans: list[tuple[float, float]] = []
    out = _Lanes()
    lock = threading.Lock()

    def lane(v: Variant) -> None:
        # Concurrent lanes warm up for a few seconds at least: long enough for the daemon to
        # start the encoder processes that much traffic asks for (steady state).
        until = time.perf_counter() + (CONCURRENT_WARMUP_S if go is not None and warmup else 0)
        done = 0
        while done < warmup or time.perf_counter() < until:
            v.run(video, shape)
            done += 1
        if go is not None:
            go.wait()
        times: list[float] = []
        stages: list[dict[str, float]] = []
        data = b""
        start = time.perf_counter()
        for _ in range(count):
            ms, data = timed(lambda: v.run(video, shape))
            times.append(ms)
            last = getattr(v, "last_timings", None)
            if last is not None:
                stages.append(last)
        end = time.perf_counter()
        with lock:
            out.times_ms += times
            out.stages += stages
            out.output = data or out.output
            spans.append((start, end))

    if go is None:
        lane(runners[0])
    else:
        run_together([functools.partial(lane, v) for v in runners], go)
    out.wall_s = max(e for _, e in spans) - min(s for s, _ in spans)
    return out


def _e2e_shape(
    device: Device,
    shape: str,
    content: str,
    lanes: dict[str, list[Variant]],
    samples: int | None,
    pattern: str,
    rotation: int,
) -> list[Row]:
    n, warmup = default_samples(shape)
    n = samples or n
    video = device.video(shape, content)
    names = list(lanes)
    results: dict[str, _Lanes] = {}
    if pattern == "steady":
        k = rotation % len(names)
        for name in names[k:] + names[:k]:
            results[name] = _run_lanes(lanes[name], device, video, shape, n, warmup)
    else:
        for name in names:
            _run_lanes(lanes[name], device, video, shape, 0, warmup)
        results = {name: _Lanes() for name in names}
        for i in range(n):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                results[name].add(_run_lanes(lanes[name], device, video, shape, 1, 0))
    expected = parse_shape(shape)[2]
    concurrency = len(next(iter(lanes.values())))
    rows = []
    for name in names:  # in the order asked for, whatever order they ran in
        got = results[name]
        frames = _decoded_frames(got.output)
        if frames != expected:
            raise RuntimeError(f"{name} at {shape}: decoded {frames} frames, expected {expected}")
        row = summarise(name, shape, got.times_ms)
        row.suite, row.content = "e2e", content
        if concurrency > 1:
            row.extra["concurrency"] = concurrency
            row.extra["frames_per_s"] = round(len(got.times_ms) * expected / got.wall_s, 1)
        if got.stages:
            row.extra["stages_median_ms"] = {
                k: round(statistics.median(s[k] for s in got.stages), 2) for k in got.stages[0]
            }
        rows.append(row)
    base = next((r for r in rows if r.variant == "upstream_a"), None)
    for r in rows:
        if base is not None:
            r.ratio_to_upstream_a = round(r.median_ms / base.median_ms, 3)
        print(
            f"{content:>6} {shape:>14} {r.variant:<12} median {r.median_ms:9.1f} ms "
            f"[{r.min_ms:.1f}-{r.max_ms:.1f}]"
            + (f"  x{r.ratio_to_upstream_a:.2f} of upstream_a" if r.ratio_to_upstream_a else "")
            + (f"  {r.extra['frames_per_s']:.0f} frames/s" if "frames_per_s" in r.extra else ""),
            flush=True,
        )
    return rows
