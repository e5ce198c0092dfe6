"""`video-sidecar encode`: encode a video file from the command line, with a progress bar.

Inputs: `.npy`, `.npz` (one array, or the one named `video` or `frames`) and torch `.pt`
tensors (loaded with `weights_only=True`). Nothing is ever unpickled: a file that would need
it is refused. The output, and the previews asked for beside it, are checked before anything
is encoded, so a wrong `-o` costs nothing (`outputs`).
"""

from __future__ import annotations

import re
import sys
import time
import warnings
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from client import (
    EncodeResult,
    Preview,
    SidecarClient,
    SidecarError,
    SidecarUnavailable,
    SpriteSheet,
    Thumbnail,
)

from ..config_values import format_size
from .exits import exit_status
from .launcher import AutoDaemon, DaemonStartError, is_serving
from .outputs import CommitError, OutputError, OutputFile, Outputs, default_output
from .preview_args import FIELD_FLAGS

ACCEPTED = (
    "a .npy file, a .npz file (one array, or one named 'video' or 'frames') or a torch .pt tensor"
)
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


class InputError(Exception):
    """An input file that cannot be used; the message is the whole story, in a line."""


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


def load_array(path: str, names: tuple[str, ...] = ("video", "frames")) -> Any:
    """The array in `path`: a numpy array (memory-mapped for .npy) or a CPU tensor.

    Raises InputError. `names` are the names by which an .npz (or a dict in a .pt) may
    say which of several arrays is meant."""
    suffix = Path(path).suffix.lower()
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(NPY_MAGIC))
        if suffix in (".pt", ".pth"):
            return _load_torch(path, names)
        if suffix == ".npz" and head.startswith(ZIP_MAGIC):
            return _load_npz(path, names)
        if head != NPY_MAGIC:  # numpy would take anything else for a pickle
            kind = {".npy": "a NumPy .npy file", ".npz": "a NumPy .npz file"}.get(suffix)
            what = f"not {kind}" if kind else "not a supported file"
            raise InputError(f"cannot read {path}: {what}; give {ACCEPTED}")
        # Memory-mapped: read while it is copied into shared memory, never all in RAM twice.
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, zipfile.BadZipFile) as exc:  # an object array, a damaged file
        reason = _first_line(exc)
        if "object" in reason.lower() or "pickle" in reason.lower():
            reason = "it holds Python objects, which would need pickle (never used here)"
        raise InputError(f"cannot read {path}: {reason}") from None


def _pick(path: str, available: list[Any], names: tuple[str, ...]) -> Any:
    """Which of the arrays in `path` to take: the only one, or the one named in `names`."""
    if len(available) == 1:
        return available[0]
    named = [n for n in names if n in available]
    if len(named) == 1:
        return named[0]
    if named:
        both = " and ".join(repr(n) for n in named)
        raise InputError(f"{path} holds both {both}: cannot tell which to encode")
    listed = ", ".join(sorted(map(str, available))) or "nothing"
    wanted = " or ".join(repr(n) for n in names)
    raise InputError(
        f"{path} holds {len(available)} arrays ({listed}): keep one, or name the one "
        f"to use {wanted}"
    )


def _load_npz(path: str, names: tuple[str, ...]) -> Any:
    with np.load(path, allow_pickle=False) as archive:
        return archive[_pick(path, list(archive.files), names)]


def _load_torch(path: str, names: tuple[str, ...]) -> Any:
    try:
        import torch
    except ImportError:
        raise InputError(
            f"cannot read {path}: .pt files need torch (pip install torch); or save the "
            "video with numpy.save as .npy"
        ) from None
    try:
        # weights_only: tensors and plain containers only; never arbitrary pickled code.
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as exc:  # torch raises many kinds for a file it cannot load safely
        raise InputError(
            f"cannot read {path}: torch does not load it as tensors alone "
            f"(weights_only=True: {_torch_reason(exc)}); save the video with "
            "torch.save(tensor)"
        ) from None
    if isinstance(loaded, dict):
        loaded = loaded[_pick(path, list(loaded), names)]
    if not isinstance(loaded, torch.Tensor):
        raise InputError(f"{path} holds a {type(loaded).__name__}, not a tensor")
    return loaded


def _torch_reason(exc: BaseException) -> str:
    # torch's message is a paragraph about its defaults; the unpickler's complaint is
    # the part that says what is in the file.
    match = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", str(exc), re.S)
    return " ".join(match.group(1).split()) if match else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        video = load_array(cmd.source)
        audio = load_array(cmd.audio, ("audio",)) if cmd.audio else None
    except InputError as exc:
        print(f"video-sidecar: {exc}", file=sys.stderr)
        return 2
    out = Path(cmd.output) if cmd.output else default_output(cmd.source, cmd.container)
    output = OutputFile(out, cmd.overwrite, cmd.source, cmd.container)
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
        )
    for notice in noticed:
        if issubclass(notice.category, UserWarning):
            print(f"video-sidecar: warning: {as_flags(str(notice.message))}", file=sys.stderr)
    return result
