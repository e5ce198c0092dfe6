"""`video-sidecar encode`: encode a video file from the command line, with a progress bar.

What it reads is `inputs`'s. The output, and the previews asked for beside it, are checked
before anything is encoded, so a wrong `-o` costs nothing (`client._files`).
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from client import (
    EncodeResult,
    Live,
    Preview,
    SidecarClient,
    SidecarError,
    SidecarUnavailable,
    SpriteSheet,
    Thumbnail,
)
from client._files import CommitError, OutputError, OutputFile, Outputs

from ..config_values import format_size
from ..vocabulary import CLI_WORDS, DEFAULT_CONTAINER, EXTENSION_OF
from .exits import exit_status
from .inputs import InputError, load_array, load_frames
from .launcher import AutoDaemon, DaemonStartError, is_serving
from .preview_args import FIELD_FLAGS


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
    container: str = ""  # none named: the one the output's extension says
    audio: str = ""
    sample_rate: int | None = None
    overwrite: bool = False
    shm_prefix: str = ""
    thumbnail: Thumbnail | None = None  # written beside the output
    sprite_sheet: SpriteSheet | None = None
    live: Live | None = None  # a live package in the daemon's output root

    def preview_formats(self) -> dict[str, str]:
        """The image format of each preview asked for, by its kind."""
        asked = {"thumbnail": self.thumbnail, "sprite_sheet": self.sprite_sheet}
        return {kind: p.format for kind, p in asked.items() if p is not None}


class ProgressBar:
    """A one-line bar on stderr, shown only on a terminal and only for long encodes."""

    def __init__(self, stream: TextIO = sys.stderr, after: float = 0.5) -> None:
        self.stream = stream
        self.shown = False
        self.started = time.monotonic()
        self.after = after

    def __call__(self, done: int, total: int) -> None:
        if not self.stream.isatty() or time.monotonic() - self.started < self.after:
            return
        self.stream.write(f"\r{self.line(done, total)}")
        self.stream.flush()
        self.shown = True

    @staticmethod
    def line(done: int, total: int, width: int = 30) -> str:
        """The bar; with no total (a length not known yet), the count alone."""
        if total <= 0:
            return f"[{' ' * width}] {done} frames"
        filled = min(width, width * done // total)
        return f"[{'#' * filled}{' ' * (width - filled)}] {done}/{total} frames"

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.shown = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_output(source: str, container: str) -> Path:
    """The input's name with its container's extension (.mp4, .webm), in the current
    directory."""
    return Path(Path(source).with_suffix(EXTENSION_OF[container or DEFAULT_CONTAINER]).name)


def as_flags(message: str) -> str:
    """A client message in this command's words: `value_range=(-1, 1)` is
    `--value-range -1,1` here, `layout='THWC'` is `--layout THWC`, and
    `pixel_format='yuv420p'` is `--pixel-format yuv420p`."""
    message = re.sub(r"value_range=\(([^,()]+), ([^,()]+)\)", r"--value-range \1,\2", message)
    message = re.sub(r"layout='([A-Z]+)'", r"--layout \1", message)
    message = re.sub(r"layout=([A-Z]+)\b", r"--layout \1", message)
    message = re.sub(r"(--layout [A-Z]+) or '([A-Z]+)'", r"\1 or --layout \2", message)
    message = re.sub(r"pixel_format='([a-z0-9]+)'", r"--pixel-format \1", message)
    fields = "|".join(re.escape(field) for field in FIELD_FLAGS)
    return re.sub(rf"\b({fields})\b", lambda m: FIELD_FLAGS[m.group(1)], message)


def run(cmd: EncodeCommand) -> int:
    try:
        video = load_frames(cmd.source)
        audio = load_array(cmd.audio, ("audio",)) if cmd.audio else None
    except InputError as exc:
        print(f"video-sidecar: {exc}", file=sys.stderr)
        return 2
    out = Path(cmd.output) if cmd.output else default_output(cmd.source, cmd.container)
    output = OutputFile(out, cmd.overwrite, cmd.source, cmd.container, words=CLI_WORDS)
    outputs = Outputs(output, cmd.preview_formats())
    with ExitStack() as stack:
        try:
            outputs.reserve()
        except OutputError as exc:
            outputs.discard()
            print(f"video-sidecar: {exc}", file=sys.stderr)
            return 2
        stack.callback(outputs.discard)  # after a failure or Ctrl-C: no .part file left
        try:
            daemon = _daemon(cmd, stack)
        except DaemonStartError as exc:
            print(f"video-sidecar: {exc}", file=sys.stderr)
            return 1
        try:
            result = _encode(cmd, output.container, video, audio, stack)
        except SidecarError as exc:
            print(f"video-sidecar: {type(exc).__name__}: {as_flags(str(exc))}", file=sys.stderr)
            if isinstance(exc, SidecarUnavailable) and daemon is not None and daemon.owned:
                print(f"video-sidecar: the daemon's log: {daemon.log_path}", file=sys.stderr)
            return exit_status(exc)
        try:
            previews = outputs.commit(result)
        except CommitError as exc:
            print(f"video-sidecar: {exc}", file=sys.stderr)
            return 1
    print(
        f"wrote {out} ({result.codec} in {result.container}, {result.width}x{result.height}, "
        f"{result.frames} frames, {format_size(result.size_bytes)}) "
        f"in {result.timings.total_ms:.0f} ms"
    )
    for path, preview in previews:
        print(f"wrote {path} ({_described(preview)})")
    return 0


def _described(preview: Preview) -> str:
    """A preview in the summary: what it shows, its size."""
    size = f"{preview.width}x{preview.height}, {format_size(preview.size_bytes)}"
    if preview.kind == "thumbnail":
        return f"thumbnail of frame {preview.frames[0]}, {size}"
    tiles = f"{len(preview.frames)} tiles of {preview.tile_width}x{preview.tile_height}"
    return f"sprite sheet, {tiles}, {size}"


def _daemon(cmd: EncodeCommand, stack: ExitStack) -> AutoDaemon | None:
    """A daemon started for the command when none answers at its socket."""
    if is_serving(cmd.socket):
        return None
    daemon = stack.enter_context(AutoDaemon(cmd.socket, cmd.shm_prefix))
    if daemon.owned:
        print(f"video-sidecar: {daemon.describe()}", file=sys.stderr)
    return daemon


def _encode(
    cmd: EncodeCommand, container: str, video: Any, audio: Any, stack: ExitStack
) -> EncodeResult:
    """The video encoded, with a progress bar; the client's warnings about the input
    said in this command's words once it is done."""
    client = stack.enter_context(SidecarClient(cmd.socket, client_name="cli"))
    with ProgressBar() as bar, warnings.catch_warnings(record=True) as noticed:
        warnings.simplefilter("always", UserWarning)
        result = client.encode(
            video,
            fps=cmd.fps,
            pixel_format=cmd.pixel_format,
            layout=cmd.layout,
            value_range=cmd.value_range,
            audio=audio,
            sample_rate=cmd.sample_rate,
            on_progress=bar,
            container=container,
            codec=cmd.codec,
            crf=cmd.crf,
            preset=cmd.preset,
            thumbnail=cmd.thumbnail,
            sprite_sheet=cmd.sprite_sheet,
            live=cmd.live,
        )
    for notice in noticed:
        if issubclass(notice.category, UserWarning):
            print(f"video-sidecar: warning: {as_flags(str(notice.message))}", file=sys.stderr)
    return result
