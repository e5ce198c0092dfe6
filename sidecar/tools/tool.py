"""`video-sidecar encode`: encode a video file from the command line, with a progress bar.

Inputs: `.npy`, `.npz` (one array, or the one named `video` or `frames`) and torch `.pt`
tensors (loaded with `weights_only=True`). Nothing is ever unpickled: a file that would need
it is refused. The output is checked before anything is encoded, so a wrong `-o` costs
nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import time
import warnings
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from client import EncodeResult, SidecarClient, SidecarError, SidecarUnavailable

from ..config_values import format_size
from ..vocabulary import DEFAULT_CONTAINER, EXTENSION_OF, FileNameError, Wording, file_container
from .exits import exit_status
from .launcher import AutoDaemon, DaemonStartError, is_serving

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


CLI_WORDS = Wording("-o", "--container", "drop --container")


def default_output(source: str, container: str) -> Path:
    """The input's name with its container's extension (.mp4, .webm), in the current
    directory."""
    return Path(Path(source).with_suffix(EXTENSION_OF[container or DEFAULT_CONTAINER]).name)


class OutputError(Exception):
    """The output cannot be written; the message says why, in a line."""


class OutputFile:
    """The local output file, checked and reserved before anything is encoded.

    `reserve` creates the temporary file the result is first written to, in the output's
    directory: the surest test that the directory is writable (root passes every
    permission check). `commit` moves it into place: renamed over an existing file with
    `overwrite`, else linked, which refuses a file that appeared meanwhile."""

    def __init__(self, path: Path, overwrite: bool, source: str, container: str = "") -> None:
        self.path = path
        self.overwrite = overwrite
        self.source = source
        self.container = container  # "" until `reserve`: the one the name says
        self.tmp: str | None = None

    def reserve(self) -> None:
        out = self.path
        if out.is_dir():
            raise OutputError(f"output {out} is a directory; give a file name")
        if out.exists():
            if os.path.samefile(out, self.source):
                raise OutputError(f"output {out} is the input file")
            if not stat.S_ISREG(out.stat().st_mode):  # never replace a device or a FIFO
                raise OutputError(f"output {out} exists and is not a regular file")
        if (out.exists() or out.is_symlink()) and not self.overwrite:
            raise OutputError(f"output {out} exists; pass --overwrite to replace it")
        if not out.parent.is_dir():
            raise OutputError(f"cannot write {out}: directory {out.parent} does not exist")
        try:
            self.container = file_container(str(out), self.container, CLI_WORDS)
        except FileNameError as exc:
            raise OutputError(str(exc)) from None
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from None
        os.close(fd)

    def commit(self, data: bytes) -> None:
        assert self.tmp is not None
        with open(self.tmp, "wb") as fh:
            fh.write(data)
        os.chmod(self.tmp, 0o666 & ~_umask())  # as a plain open() would have made it
        if self.overwrite:
            os.replace(self.tmp, self.path)
        else:
            try:
                os.link(self.tmp, self.path)  # FileExistsError if it appeared meanwhile
            except FileExistsError:
                raise
            except OSError:  # no hard links here (some FUSE, FAT): an exclusive create
                with open(self.path, "xb") as fh:
                    fh.write(data)
        self.discard()

    def discard(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            self.tmp = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def as_flags(message: str) -> str:
    """A client message in this command's words: `value_range=(-1, 1)` is
    `--value-range -1,1` here, `layout='THWC'` is `--layout THWC`, and
    `pixel_format='yuv420p'` is `--pixel-format yuv420p`."""
    message = re.sub(r"value_range=\(([^,()]+), ([^,()]+)\)", r"--value-range \1,\2", message)
    message = re.sub(r"layout='([A-Z]+)'", r"--layout \1", message)
    message = re.sub(r"layout=([A-Z]+)\b", r"--layout \1", message)
    message = re.sub(r"(--layout [A-Z]+) or '([A-Z]+)'", r"\1 or --layout \2", message)
    return re.sub(r"pixel_format='([a-z0-9]+)'", r"--pixel-format \1", message)


def run(cmd: EncodeCommand) -> int:
    try:
        video = load_array(cmd.source)
        audio = load_array(cmd.audio, ("audio",)) if cmd.audio else None
    except InputError as exc:
        print(f"video-sidecar: {exc}", file=sys.stderr)
        return 2
    out = Path(cmd.output) if cmd.output else default_output(cmd.source, cmd.container)
    output = OutputFile(out, cmd.overwrite, cmd.source, cmd.container)
    with ExitStack() as stack:
        try:
            output.reserve()
        except OutputError as exc:
            print(f"video-sidecar: {exc}", file=sys.stderr)
            return 2
        stack.callback(output.discard)  # after a failure or Ctrl-C: no .part file left
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
            output.commit(result.data or b"")
        except FileExistsError:
            print(f"video-sidecar: {out} appeared while encoding; not replaced", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"video-sidecar: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    print(
        f"wrote {out} ({result.codec} in {result.container}, {result.width}x{result.height}, "
        f"{result.frames} frames, {format_size(result.size_bytes)}) "
        f"in {result.timings.total_ms:.0f} ms"
    )
    return 0


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
        )
    for notice in noticed:
        if issubclass(notice.category, UserWarning):
            print(f"video-sidecar: warning: {as_flags(str(notice.message))}", file=sys.stderr)
    return result
