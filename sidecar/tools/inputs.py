"""What `video-sidecar encode` reads: a video as an array, a tensor or a list of frames.

Inputs: `.npy`, `.npz` (one array, or the one named `video` or `frames`), torch `.pt`
files (a tensor, or a list of frame tensors, loaded with `weights_only=True`), and a
directory of images (PNG, JPEG or WebP frames in name order, as a pipeline's list of PIL
images is saved). Nothing is ever unpickled: a file that would need it is refused.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import av
import numpy as np

ACCEPTED = (
    "a .npy file, a .npz file (one array, or one named 'video' or 'frames'), a torch .pt "
    "tensor or list of tensors, or a directory of PNG, JPEG or WebP frames"
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


class InputError(Exception):
    """An input file that cannot be used; the message is the whole story, in a line."""


def load_frames(path: str) -> Any:
    """The video at `path`: a directory's images as a list of frames, else `load_array`."""
    if Path(path).is_dir():
        return load_images(path)
    return load_array(path)


def load_images(directory: str) -> list[np.ndarray]:
    """The images in `directory`, in name order (frame2 before frame10), decoded to RGB
    with PyAV: a list of frames, as a pipeline's list of PIL images is taken."""
    files = [p for p in Path(directory).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise InputError(f"{directory} holds no PNG, JPEG or WebP images; give {ACCEPTED}")
    files.sort(key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])
    frames = []
    for file in files:
        try:
            with av.open(str(file)) as container:
                frame = next(container.decode(video=0))
                frames.append(frame.to_ndarray(format="rgb24"))
        except (OSError, av.FFmpegError, StopIteration) as exc:
            raise InputError(f"cannot read {file}: {_first_line(exc) or 'no image'}") from None
    return frames


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
    if isinstance(loaded, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in loaded):
        return list(loaded)  # a list of frames, as a pipeline gives them (empty: refused)
    if not isinstance(loaded, torch.Tensor):
        raise InputError(
            f"{path} holds a {type(loaded).__name__}, not a tensor or a list of tensors"
        )
    return loaded


def _torch_reason(exc: BaseException) -> str:
    # torch's message is a paragraph about its defaults; the unpickler's complaint is
    # the part that says what is in the file.
    match = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", str(exc), re.S)
    return " ".join(match.group(1).split()) if match else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
