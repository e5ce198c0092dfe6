"""Local files the client writes from an encode's bytes: the video, and its previews
beside it (`out.mp4` gets `out.thumbnail.jpg` and `out.sprites.jpg`, as the daemon
names them beside a file output). For `export_to_video` and `video-sidecar encode`,
which write wherever their caller may, not only under the daemon's output root.

Each file is checked and reserved before anything is encoded, so a wrong path costs
nothing, and moved into place at the end, atomically; a file that cannot be placed takes
back those this run placed, so no video is left without the previews asked for.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from sidecar.vocabulary import (
    CLIENT_WORDS,
    IMAGE_SUFFIX,
    PREVIEW_FILE_INFIX,
    FileNameError,
    Wording,
    file_container,
)

from ._types import EncodeResult, Preview


def preview_path(video: Path, kind: str, image_format: str) -> Path:
    """Where a preview of `kind` goes beside `video`: `out.mp4` -> `out.thumbnail.jpg`."""
    return video.with_name(video.stem + PREVIEW_FILE_INFIX[kind] + IMAGE_SUFFIX[image_format])


class OutputError(Exception):
    """The output cannot be written; the message says why, in a line."""


class OutputFile:
    """One local output file, checked and reserved before anything is encoded.

    `reserve` creates the temporary file the result is first written to, in the output's
    directory: the surest test that the directory is writable (root passes every
    permission check). `commit` moves it into place: renamed over an existing file with
    `overwrite`, else linked, which refuses a file that appeared meanwhile. A video's
    name must say its container (`is_video`); a preview's is made from it."""

    def __init__(
        self,
        path: Path,
        overwrite: bool,
        source: str = "",
        container: str = "",
        is_video: bool = True,
        words: Wording = CLIENT_WORDS,
    ) -> None:
        self.path = path
        self.overwrite = overwrite
        self.source = source  # the input's file, never to be written over ("": none)
        self.container = container  # "" until `reserve`: the one the name says
        self.is_video = is_video
        self.words = words
        self.tmp: str | None = None
        self.created = False  # placed by this run where no file was

    def reserve(self) -> None:
        out = self.path
        if out.is_dir():
            raise OutputError(f"output {out} is a directory; give a file name")
        if out.exists():
            if self.source and os.path.samefile(out, self.source):
                raise OutputError(f"output {out} is the input file")
            if not stat.S_ISREG(out.stat().st_mode):  # never replace a device or a FIFO
                raise OutputError(f"output {out} exists and is not a regular file")
        if (out.exists() or out.is_symlink()) and not self.overwrite:
            raise OutputError(f"output {out} exists; pass {self.words.overwrite} to replace it")
        if not out.parent.is_dir():
            raise OutputError(f"cannot write {out}: directory {out.parent} does not exist")
        if self.is_video:
            try:
                self.container = file_container(str(out), self.container, self.words)
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
            self.created = True
        self.discard()

    def take_back(self) -> None:
        """Remove the file this run created (never one it replaced)."""
        if self.created:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.created = False

    def discard(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            self.tmp = None


class CommitError(OutputError):
    """A reserved file could not be placed at the end."""


class Outputs:
    """The video's file and its previews' files beside it, reserved and placed together."""

    def __init__(self, video: OutputFile, previews: dict[str, str]) -> None:
        """`previews`: the image format of each kind asked for."""
        self.video = video
        self.previews = {
            kind: OutputFile(
                preview_path(video.path, kind, image_format),
                video.overwrite,
                video.source,
                is_video=False,
                words=video.words,
            )
            for kind, image_format in previews.items()
        }

    @property
    def files(self) -> list[OutputFile]:
        return [self.video, *self.previews.values()]

    def reserve(self) -> None:
        """Check every file and reserve its temporary; OutputError names the first that
        cannot be written."""
        for file in self.files:
            file.reserve()

    def commit(self, result: EncodeResult) -> list[tuple[Path, Preview]]:
        """Place the video and each preview; the previews' paths. CommitError if one
        cannot be placed: those placed before it are taken back."""
        placed: list[tuple[Path, Preview]] = []
        try:
            self._place(self.video, result.data or b"")
            for kind, file in self.previews.items():
                preview = next((p for p in result.previews if p.kind == kind), None)
                if preview is None or preview.data is None:
                    raise CommitError(f"the daemon sent no {kind.replace('_', ' ')}")
                self._place(file, preview.data)
                placed.append((file.path, preview))
        except CommitError:
            for file in self.files:
                file.take_back()
            raise
        return placed

    @staticmethod
    def _place(file: OutputFile, data: bytes) -> None:
        try:
            file.commit(data)
        except FileExistsError:
            raise CommitError(f"{file.path} appeared while encoding; not replaced") from None
        except OSError as exc:
            raise CommitError(f"cannot write {file.path}: {exc.strerror or exc}") from None

    def discard(self) -> None:
        for file in self.files:
            file.discard()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
