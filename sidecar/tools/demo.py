"""`video-sidecar demo`: the whole path on a generated video, with stage timings.

Starts a daemon with default settings when none answers on the socket (and stops it
afterwards; its log goes to a file, see `launcher.AutoDaemon`), pushes a moving test video
through the real client, and prints where the MP4 went and how long each stage took.

The video goes to `demo/demo.mp4` under the daemon's output root, replaced on every run, so
that runs do not pile up; `--output` names another file there, which is not replaced unless
`--overwrite` is given, as with the client's `path=`.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass

from client import AlreadyExists, EncodeResult, SidecarClient, SidecarError
from client.patterns import moving_pattern

from ..config_values import format_size
from .exits import EXIT_USAGE, exit_status
from .launcher import AutoDaemon, DaemonStartError, is_serving

DEFAULT_OUTPUT = "demo/demo.mp4"  # one file, replaced by each run


@dataclass(frozen=True)
class DemoOptions:
    socket: str
    frames: int = 122
    width: int = 1344
    height: int = 768
    fps: float = 24.0
    output: str = ""
    overwrite: bool = False
    shm_prefix: str = ""


@dataclass(frozen=True)
class _Setup:
    """The demo's own stages, before the encode: ms each."""

    startup_ms: float  # 0 when a daemon was already up
    generate_ms: float
    attach_ms: float


def run(options: DemoOptions) -> int:
    path = options.output or DEFAULT_OUTPUT
    # The daemon (if started here) is entered first, so it outlives the client.
    with ExitStack() as stack:
        try:
            setup, video_bytes, result = _encode(options, path, stack)
        except DaemonStartError as exc:
            print(f"video-sidecar: demo failed: {exc}", file=sys.stderr)
            return 1
        except AlreadyExists:
            print(
                f"video-sidecar: demo failed: {path} exists under the daemon's output root; "
                "pass --overwrite to replace it",
                file=sys.stderr,
            )
            return EXIT_USAGE
        except SidecarError as exc:
            print(f"video-sidecar: demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return exit_status(exc)
    _print_report(setup, video_bytes, result)
    return 0


def _encode(options: DemoOptions, path: str, stack: ExitStack) -> tuple[_Setup, int, EncodeResult]:
    """A daemon started if none answers, the video made, and encoded: the stages' times,
    the video's size and the result."""
    t0 = time.perf_counter()
    spawned = None
    if not is_serving(options.socket):
        daemon = AutoDaemon(options.socket, options.shm_prefix)  # refused: nothing said yet
        print(f"starting a daemon on {options.socket}", flush=True)
        spawned = stack.enter_context(daemon)
        print(f"  shm prefix {spawned.shm_prefix}, log {spawned.log_path}", flush=True)
    startup_ms = (time.perf_counter() - t0) * 1e3 if spawned else 0.0
    client = stack.enter_context(SidecarClient(options.socket, client_name="demo"))

    t0 = time.perf_counter()
    video = moving_pattern(options.frames, options.height, options.width)
    generate_ms = (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    client.attach()
    attach_ms = (time.perf_counter() - t0) * 1e3

    overwrite = options.overwrite or not options.output
    result = client.encode(video, fps=options.fps, path=path, overwrite=overwrite)
    return _Setup(startup_ms, generate_ms, attach_ms), video.nbytes, result


def _print_report(setup: _Setup, video_bytes: int, result: EncodeResult) -> None:
    t = result.timings
    print(f"\nwrote {result.path}")
    print(
        f"  {result.codec} in {result.container}, {result.width}x{result.height}, "
        f"{result.frames} frames, {result.duration:.2f} s, {format_size(result.size_bytes)}, "
        f"from {format_size(video_bytes)} of RGB"
    )
    rows = [
        ("daemon startup", setup.startup_ms, "0 when a daemon was already up"),
        ("generate video", setup.generate_ms, "numpy, in this process"),
        ("attach + map slabs", setup.attach_ms, "once per client"),
        ("lease", t.lease_ms, "regions of pre-faulted slabs"),
        ("copy into slabs", t.copy_ms, "the only host copy"),
        ("queue", t.queue_ms, "waiting for an encoder slot"),
        ("validate", t.validate_ms, "descriptor checked against leases"),
        ("open encoder", t.open_ms, "libx264 and the MP4 muxer"),
        ("convert", t.convert_ms, "RGB -> yuv420p BT.709"),
        ("encode", t.encode_ms, "libx264, frames borrowed from the slab"),
        ("mux", t.mux_ms, ""),
        ("finalize", t.finalize_ms, "the MP4 index up front, atomic rename"),
        ("daemon total", t.daemon_ms, ""),
        ("encode call total", t.total_ms, "lease + copy + daemon, as the client saw it"),
    ]
    print("\n  stage                     ms")
    for name, ms, note in rows:
        print(f"  {name:<20} {ms:>9.1f}   {note}")
