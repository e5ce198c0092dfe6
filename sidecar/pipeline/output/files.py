"""Where encoded bytes go: a file placed atomically under the output root, or memory.

File outputs are confined to the output root: no absolute paths, no `..`, and no
directory on the way that resolves (through a symlink) outside the root. The encoder
writes a hidden partial file next to the target; only a complete file is renamed into
place, so a reader never sees a partial MP4 and a failed encode leaves nothing. A daemon
killed while writing leaves its partial file; the next one on the same slab prefix
removes it at start (`sweep_partials`), and nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...codec.catalogue import CONTAINERS
from ...errors import DiskFull, InvalidRequest, OutputError, OutputExists, StartupError
from ...vocabulary import DEFAULT_CONTAINER, WIRE_WORDS, FileNameError, extension, file_container
from ..admission.requests import OutputRequest, PreviewImage

FIELD = "output.file.path"
MAX_PATH_CHARS = 1024
NAME_MAX = 255  # bytes in one file name


def prepare_root(root: Path) -> None:
    """Make the output root at startup; one the daemon cannot write to stops it there."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot create output directory {root}: {exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise StartupError(f"output directory {root} is not writable")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def within_root(path: str, root: Path, field: str = FIELD) -> str:
    """An absolute `path` inside the output root (as configured, or as it resolves) as
    the relative path it names there; any other path as it is, for `confine` to judge.
    The daemon and a client on its host see the same root, so a client may name a file
    by its absolute path, as `export_to_video` callers do."""
    given = PurePosixPath(path) if path.startswith("/") and "\x00" not in path else None
    if given is None or ".." in given.parts:
        return path  # relative, or refused by `confine` with the reason
    for base in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))):
        inside = PurePosixPath(base)
        if given != inside and given.is_relative_to(inside):
            return str(given.relative_to(inside))
    shown = path if len(path) <= 80 else path[:77] + "..."
    raise InvalidRequest(
        field,
        f"{shown!r} is outside the output root {root}; give a path under it, or one relative to it",
    )


def confine(relative: str, field: str = FIELD) -> PurePosixPath:
    """Check a client path lexically; returns it as a relative path."""
    if not relative:
        raise InvalidRequest(field, "must not be empty")
    if len(relative) > MAX_PATH_CHARS:
        raise InvalidRequest(field, f"longer than {MAX_PATH_CHARS} characters")
    if "\x00" in relative:
        raise InvalidRequest(field, "must not contain NUL")
    if not relative.isprintable():  # letters of any script, digits, marks, punctuation, spaces
        raise InvalidRequest(
            field, "may hold only printable characters: no control characters, tabs or newlines"
        )
    path = PurePosixPath(relative)
    if relative.endswith("/"):
        raise InvalidRequest(field, f"{relative[:80]!r} names a directory, not a file")
    if any(part == ".." for part in path.parts):
        raise InvalidRequest(
            field, f"{relative[:80]!r} contains '..'; it must stay under the output root"
        )
    if path.is_absolute():
        raise InvalidRequest(
            field, f"{relative[:80]!r} is absolute; give a path under the output root"
        )
    if not path.name or path.name in {".", ".."}:
        raise InvalidRequest(field, f"{relative[:80]!r} does not name a file")
    return path


def output_container(out: OutputRequest) -> str:
    """The container an output is written in: the one named, checked against a file's
    extension; else the one the extension says; else (bytes) MP4. A file name with no
    extension is refused by `FileTarget.prepare`, once a directory in the way is told."""
    if out.container and out.container not in CONTAINERS:
        raise InvalidRequest("output.container", f"unknown container {out.container!r}")
    if out.path is None or not extension(out.path):
        return out.container or DEFAULT_CONTAINER
    return _named(out.path, out.container)


def _named(path: str, container: str) -> str:
    try:
        return file_container(path, container, WIRE_WORDS)
    except FileNameError as exc:
        raise InvalidRequest(FIELD, str(exc)) from None


def output_error(exc: OSError, what: str) -> OutputError:
    """Turn an OS error while writing into the matching domain error."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left on the output device while writing {what}")
    if exc.errno == errno.EFBIG:
        return DiskFull(f"{what} would exceed the file size limit")
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return OutputError(f"cannot write {what}: {reason}")


def write_beside(video: str, images: list[PreviewImage], targets: dict[str, FileTarget]) -> None:
    """Write each image as its file beside the video at `video`, setting its path. If one
    cannot be written, none is kept and neither is the video: the request failed."""
    written: list[str] = []
    try:
        for image in images:
            image.path = str(targets[image.kind].write(image.data))
            written.append(image.path)
    except BaseException:
        for path in [*written, video]:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


# A partial file: `.<name>.vsp-<owner>-<instance>-<random>.part` beside its video, where
# <owner> names the daemon's slab prefix and directory (one instance at a time holds
# them) and <instance> the instance that writes it.
_PARTIAL = re.compile(r"\..+\.vsp-([0-9a-f]{8})-([0-9a-f]{8})-[0-9a-f]{8}\.part")


def partial_tag(shm_dir: str, shm_prefix: str, instance: str) -> str:
    """What this instance's partial files are named with (see `_PARTIAL`)."""
    owner = hashlib.sha256(f"{shm_dir}\0{shm_prefix}".encode()).hexdigest()[:8]
    return f"vsp-{owner}-{instance}"


def sweep_partials(root: Path, tag: str) -> list[str]:
    """Remove the partial files a dead instance of this daemon left under `root` (killed
    while writing): only files named as ours, with our owner and another instance (ours
    holds the slab prefix's lock, so that one is dead), regular and our user's. Links are
    not followed. Returns the names removed."""
    _, owner, instance = tag.split("-")
    removed: list[str] = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            match = _PARTIAL.fullmatch(name)
            if match is None or match[1] != owner or match[2] == instance:
                continue
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                    os.unlink(path)
                    removed.append(os.path.relpath(path, root))
    return removed


def make_dirs(root: Path, rel: PurePosixPath, relative: str, field: str = FIELD) -> str:
    """The directory `rel` under `root`, created as needed, each step checked to stay
    inside the root (a link may not lead out); its real path."""
    real_root = os.path.realpath(root)
    current = real_root
    for part in rel.parts:
        step = os.path.join(current, part)
        try:
            os.mkdir(step, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise output_error(exc, f"directory {rel}") from None
        current = os.path.realpath(step)
        if not _inside(current, real_root):
            raise InvalidRequest(field, f"{relative[:80]!r} leaves the output root through a link")
        # A file in the way is the output root's state, not a wrong request.
        if not os.path.isdir(current):
            raise OutputError(f"cannot write {relative[:80]!r}: {part!r} in it is not a directory")
    return current


@dataclass
class FileTarget:
    """A confined output path; `open_temp` and `commit` write it atomically, through a
    partial file named with `tag` (see `partial_tag`)."""

    final: Path
    overwrite: bool
    temp: Path | None = None
    tag: str = "vsp-00000000-00000000"

    @classmethod
    def prepare(
        cls,
        root: Path,
        relative: str,
        overwrite: bool,
        container: str = "",
        tag: str = "vsp-00000000-00000000",
    ) -> FileTarget:
        """Resolve `relative` under `root`, creating directories, refusing any escape and
        a name whose extension does not say `container` ("": any container's)."""
        relative = within_root(relative, root)
        rel = confine(relative)
        current = make_dirs(root, rel.parent, relative)
        final = Path(current) / rel.name
        if os.path.isdir(final):
            raise OutputError(f"cannot write {relative[:80]!r}: it is a directory")
        _named(relative, container)
        if not overwrite and os.path.lexists(final):
            raise OutputExists(f"{relative[:80]!r} exists; pass overwrite to replace it")
        return cls(final, overwrite, tag=tag)

    def beside(self, endings: list[tuple[str, str]]) -> tuple[tuple[str, FileTarget], ...]:
        """Targets next to this one, for (key, ending) pairs: `jobs/42.mp4` and
        ".thumbnail.jpg" make `jobs/42.thumbnail.jpg`. The name is this one's, which is
        confined already; an existing file is refused unless overwriting."""
        stem = self.final.name[: -len(self.final.suffix)] if self.final.suffix else self.final.name
        targets = []
        for key, ending in endings:
            final = self.final.with_name(stem + ending)
            if os.path.isdir(final):
                raise OutputError(f"cannot write {final.name[:80]!r}: it is a directory")
            if not self.overwrite and os.path.lexists(final):
                raise OutputExists(f"{final.name[:80]!r} exists; pass overwrite to replace it")
            targets.append((key, FileTarget(final, self.overwrite, tag=self.tag)))
        return tuple(targets)

    def write(self, data: bytes) -> Path:
        """Write `data` as this file, atomically."""
        try:
            self.fill(None, data)
        except OSError as exc:
            self.discard()
            raise output_error(exc, str(self.final)) from None
        return self.commit()

    def open_temp(self) -> Path:
        """Create the hidden temporary file the encoder writes to."""
        ending = f".{self.tag}-{secrets.token_hex(4)}.part"
        # Within a name's 255 bytes: a long name's partial file is cut short before it.
        stem = self.final.name.encode()[: NAME_MAX - 1 - len(ending)].decode(errors="ignore")
        temp = self.final.with_name(f".{stem}{ending}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise output_error(exc, str(self.final)) from None
        os.close(fd)
        self.temp = temp
        return temp

    def fill(self, memfd: int | None, data: bytes = b"") -> None:
        """Write an output encoded in memory (`memfd`, else `data`) to the temporary file."""
        with open(self.open_temp(), "wb") as out:
            if memfd is None:
                out.write(data)
                return
            size, sent = os.fstat(memfd).st_size, 0
            while sent < size:
                sent += os.sendfile(out.fileno(), memfd, sent, size - sent)

    def commit(self) -> Path:
        """Move the finished temporary file into place, atomically."""
        assert self.temp is not None
        try:
            if self.overwrite:
                os.replace(self.temp, self.final)
            else:
                # link() fails if the name was taken meanwhile, so nothing is clobbered.
                os.link(self.temp, self.final)
                os.unlink(self.temp)
        except FileExistsError:
            self.discard()
            raise OutputExists(
                f"{self.final.name!r} appeared while encoding; not replaced"
            ) from None
        except OSError as exc:
            self.discard()
            raise output_error(exc, str(self.final)) from None
        self.temp = None
        return self.final

    def discard(self) -> None:
        """Remove the temporary file, if any."""
        if self.temp is not None:
            with contextlib.suppress(FileNotFoundError):
                self.temp.unlink()
            self.temp = None
