"""`video-sidecar demo`: the whole path on a generated video, with stage timings.

Starts a daemon with default settings when none answers on the socket (and stops it
afterwards), pushes a moving test video through the real client, and prints where the
MP4 went and how long each stage took.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass

from client import SidecarClient, SidecarError
from client.patterns import moving_pattern

from .config import format_size
from .launcher import DaemonProcess, is_serving


@dataclass(frozen=True)
class DemoOptions:
    socket: str
    frames: int = 122
    width: int = 1344
    height: int = 768
    fps: float = 24.0
    output: str = ""


def run(options: DemoOptions) -> int:
    spawned = None
    with SidecarClient(options.socket, client_name="demo") as client:
        try:
            t0 = time.perf_counter()
            if not is_serving(options.socket):
                print(f"starting a daemon on {options.socket}", flush=True)
                spawned = DaemonProcess(options.socket)
                env = {
                    "VIDEO_SIDECAR_LOG_LEVEL": os.environ.get("VIDEO_SIDECAR_LOG_LEVEL", "warning")
                }
                spawned.start(env=env)
            startup_ms = (time.perf_counter() - t0) * 1e3

            t0 = time.perf_counter()
            video = moving_pattern(options.frames, options.height, options.width)
            generate_ms = (time.perf_counter() - t0) * 1e3

            t0 = time.perf_counter()
            client.attach()
            attach_ms = (time.perf_counter() - t0) * 1e3

            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = options.output or f"demo/demo-{stamp}-{secrets.token_hex(2)}.mp4"
            result = client.encode(video, fps=options.fps, path=path)
        except (SidecarError, RuntimeError) as exc:
            print(f"demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            if spawned is not None:
                spawned.stop()

    t = result.timings
    print(f"\nwrote {result.path}")
    print(
        f"  {result.codec} in {result.container}, {result.width}x{result.height}, "
        f"{result.frames} frames, {result.duration:.2f} s, {format_size(result.size_bytes)}, "
        f"from {format_size(video.nbytes)} of RGB"
    )
    rows = [
        ("daemon startup", startup_ms if spawned else 0.0, "0 when a daemon was already up"),
        ("generate video", generate_ms, "numpy, in this process"),
        ("attach + map slabs", attach_ms, "once per client"),
        ("lease", t.lease_ms, "regions of pre-faulted slabs"),
        ("copy into slabs", t.copy_ms, "the only host copy"),
        ("queue", t.queue_ms, "waiting for an encoder slot"),
        ("validate", t.validate_ms, "descriptor checked against leases"),
        ("open encoder", t.open_ms, "libx264 and the MP4 muxer"),
        ("convert", t.convert_ms, "RGB -> yuv420p BT.709"),
        ("encode", t.encode_ms, "libx264, frames borrowed from the slab"),
        ("mux", t.mux_ms, ""),
        ("finalize", t.finalize_ms, "faststart index, atomic rename"),
        ("daemon total", t.daemon_ms, ""),
        ("encode call total", t.total_ms, "lease + copy + daemon, as the client saw it"),
    ]
    print("\n  stage                     ms")
    for name, ms, note in rows:
        print(f"  {name:<20} {ms:>9.1f}   {note}")
    return 0
