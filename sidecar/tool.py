"""`video-sidecar encode`: encode a .npy video from the command line, with a progress bar."""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from client import SidecarClient, SidecarError

from .config import format_size
from .launcher import DaemonProcess, is_serving


@dataclass(frozen=True)
class EncodeCommand:
    source: str
    output: str
    socket: str
    fps: float = 24.0
    codec: str = ""
    crf: int | None = None
    preset: str | None = None
    pixel_format: str | None = None
    layout: str | None = None
    value_range: tuple[float, float] = (0, 1)
    container: str = "mp4"
    audio: str = ""
    sample_rate: int | None = None


class ProgressBar:
    """A one-line bar on stderr, shown only on a terminal and only for long encodes."""

    def __init__(self, stream=sys.stderr, after: float = 0.5) -> None:  # type: ignore[no-untyped-def]
        self.stream = stream
        self.shown = False
        self.started = time.monotonic()
        self.after = after

    def __call__(self, done: int, total: int) -> None:
        if not self.stream.isatty() or time.monotonic() - self.started < self.after:
            return
        width = 30
        filled = int(width * done / total) if total else 0
        self.stream.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {done}/{total} frames")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")


def run(cmd: EncodeCommand) -> int:
    try:
        video = np.load(cmd.source, mmap_mode="r")  # read as copied, never all in RAM twice
        audio = np.load(cmd.audio) if cmd.audio else None
    except (OSError, ValueError) as exc:
        print(f"video-sidecar: cannot read {cmd.source}: {exc}", file=sys.stderr)
        return 2
    out = Path(cmd.output or Path(cmd.source).with_suffix(".mp4").name)
    with ExitStack() as stack:
        if not is_serving(cmd.socket):
            daemon = DaemonProcess(cmd.socket)
            quiet = os.environ.get("VIDEO_SIDECAR_LOG_LEVEL", "warning")
            daemon.start(env={"VIDEO_SIDECAR_LOG_LEVEL": quiet})
            stack.callback(daemon.stop)
        client = stack.enter_context(SidecarClient(cmd.socket, client_name="cli"))
        bar = ProgressBar()
        try:
            result = client.encode(
                video,
                fps=cmd.fps,
                pixel_format=cmd.pixel_format,
                layout=cmd.layout,
                value_range=cmd.value_range,
                audio=audio,
                sample_rate=cmd.sample_rate,
                on_progress=bar,
                container=cmd.container,
                codec=cmd.codec,
                crf=cmd.crf,
                preset=cmd.preset,
            )
        except SidecarError as exc:
            bar.close()
            print(f"video-sidecar: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        bar.close()
    out.write_bytes(result.data or b"")
    print(
        f"wrote {out} ({result.codec} in {result.container}, {result.width}x{result.height}, "
        f"{result.frames} frames, {format_size(result.size_bytes)}) "
        f"in {result.timings.total_ms:.0f} ms"
    )
    return 0
