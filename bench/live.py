"""How soon a live package's part is in its playlist, and what the package costs.

    python -m bench.live [--shape 832x480] [--parts 24] [--json live.json]

- packet to playlist: in the daemon's own encoder and package writer, from the packet
  that completes a part to the playlist naming it (the promise: at most 100 ms);
- sent to playlist: through the daemon, half a second of frames sent every half second,
  from a part's frames sent to the playlist naming it, polled every millisecond (the
  encoder holds its lookahead's frames, so a part leaves it with the next chunk);
- the same four seconds as a stream with and without a package, end to end: what the
  package and its settings (a keyframe a segment) cost in time and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from client import Live, SidecarClient
from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry
from sidecar.codec.threads import threading_for
from sidecar.pipeline.output.live import LiveLayout, LivePackage

from .common import machine
from .daemons import daemon

FPS = 24


class TimedPackage(LivePackage):
    """The daemon's package writer, timing each part from the packet that completes it
    to the playlist that names it."""

    def __init__(self, layout: LiveLayout) -> None:
        super().__init__(layout)
        self.latency_ms: list[float] = []

    def add(self, data: bytes, keyframe: bool, pts: int, dts: int) -> None:
        before, t0 = self.parts_written, time.perf_counter()
        super().add(data, keyframe, pts, dts)
        if self.parts_written > before and (self.layout.folder / "index.m3u8").exists():
            self.latency_ms.append((time.perf_counter() - t0) * 1e3)


def packet_to_playlist(shape: tuple[int, int], frames: int) -> list[float]:
    """In the daemon's own encoder and package writer, as a stream runs them: ms from a
    part's last packet leaving the encoder to the playlist naming the part."""
    width, height = shape
    with tempfile.TemporaryDirectory(prefix="vsb-live-") as tmp:
        geometry = check_geometry(
            width, height, "rgb24", Fraction(FPS), Limits(10**6, 8192, 8192, 1 << 40)
        )
        package = TimedPackage(LiveLayout(Path(tmp), Fraction(FPS), 2 * FPS, FPS // 2, 1 << 40))
        codec = CodecSpec().resolve(video=(width, height, 0)).for_live(2 * FPS)
        threads, thread_type = threading_for(1 << 20, height, os.cpu_count() or 1)
        encoder = VideoEncoder(
            str(Path(tmp) / "v.mp4"), geometry, codec, threads, thread_type, live=package
        )
        for frame in moving_pattern(frames, height, width, noise=4.0):
            encoder.encode(frame)
        encoder.close()
    return package.latency_ms


def sent_to_playlist(
    client: SidecarClient, root: Path, shape: tuple[int, int], parts: int
) -> list[float]:
    """Through the daemon: ms from a part's frames sent (`write()` returned, half a second
    of frames a chunk, one after another) to the playlist naming the part. The encoder
    holds its lookahead's frames: a part leaves it once the frames after it come."""
    width, height = shape
    part_frames = FPS // 2
    video = moving_pattern(part_frames * parts, height, width, noise=4.0)
    playlist = root / "latency" / "index.m3u8"
    sent_at: list[float] = []
    seen: dict[int, float] = {}
    live = Live("latency", segment_s=2.0, part_s=0.5, overwrite=True)

    def look() -> None:
        now = time.perf_counter()
        text = playlist.read_text() if playlist.exists() else ""
        for index in range(len(sent_at)):
            segment, part = divmod(index, 4)  # four half-second parts a segment
            named = f'"s{segment:05d}.p{part}.m4s"' in text or f"\ns{segment:05d}.m4s" in text
            if index not in seen and named:
                seen[index] = now

    with client.stream(fps=FPS, live=live) as s:
        for index in range(parts):
            s.write(video[index * part_frames : (index + 1) * part_frames])
            sent_at.append(time.perf_counter())
            end = time.perf_counter() + 0.5  # a generator making half a second of video
            while time.perf_counter() < end:
                look()
                time.sleep(0.001)
    look()
    # Parts named with the first playlist (three segments in) waited for it, not the encoder.
    first = min(seen.values(), default=0.0)
    return [(seen[i] - sent_at[i]) * 1e3 for i in sorted(seen) if seen[i] > first]


def end_to_end(
    client: SidecarClient, shape: tuple[int, int], frames: int, live: bool
) -> tuple[float, int]:
    """(ms, bytes) of a stream of `frames` sent in half-second chunks, with or without a
    package."""
    width, height = shape
    video = moving_pattern(frames, height, width, noise=4.0)
    t0 = time.perf_counter()
    package = Live("e2e", overwrite=True) if live else None
    with client.stream(fps=FPS, live=package) as s:
        for start in range(0, frames, FPS // 2):
            s.write(video[start : start + FPS // 2])
    assert s.result is not None
    return (time.perf_counter() - t0) * 1e3, s.result.size_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__)
    parser.add_argument("--shape", default="832x480")
    parser.add_argument("--parts", type=int, default=24)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    width, height = map(int, args.shape.split("x"))
    rows: dict[str, Any] = {}
    with daemon() as d, SidecarClient(d.socket) as client:
        root = Path(client.status().output_dir)
        for name, latency in (
            ("packet_to_playlist_ms", packet_to_playlist((width, height), args.parts * FPS // 2)),
            ("sent_to_playlist_ms", sent_to_playlist(client, root, (width, height), args.parts)),
        ):
            rows[name] = {
                "median": statistics.median(latency),
                "p95": float(np.percentile(latency, 95)),
                "max": max(latency),
                "parts": len(latency),
            }
        for name, live in (("stream", False), ("stream_with_package", True)):
            runs = [end_to_end(client, (width, height), 4 * FPS, live) for _ in range(args.samples)]
            rows[name] = {
                "median_ms": statistics.median(ms for ms, _ in runs),
                "bytes": runs[-1][1],
            }
    report = {
        "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
                 "command": "python -m bench.live " + " ".join(argv or [])},
        "shape": args.shape,
        "rows": rows,
    }  # fmt: skip
    print(json.dumps(report["rows"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
