"""The daemon's shared-memory slabs: created, pre-faulted, swept and unlinked here only.

Slabs are plain files in a tmpfs (normally /dev/shm), named
`<prefix>.<instance>.<index>`. We create them with `os.open` + `posix_fallocate` + `mmap`
rather than `multiprocessing.shared_memory`, whose resource tracker would unlink segments
behind our back. A lock file `<prefix>.lock` makes one daemon own a prefix; whoever takes
it sweeps segments a dead predecessor left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import grp
import logging
import mmap
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config_values import format_size
from ..errors import StartupError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Slab:
    """One mapped segment. `array` is a flat uint8 view the encoder borrows frames from."""

    id: int
    name: str
    path: Path
    size: int
    _mmap: mmap.mmap = field(repr=False)
    array: np.ndarray = field(repr=False)

    def close(self) -> None:
        """Drop our mapping; fails quietly if frames borrowed from it are still alive."""
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self._mmap.close()
        except BufferError:
            log.warning("slab %s still has borrowed views; leaving it mapped", self.name)


def _segment_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}\.[0-9a-f]{{8}}\.\d+$")


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def not_in_group(group: str, what: str) -> str:
    """Why chown to --shm-group failed: only a member of a group may give it a file."""
    return (
        f"cannot give {what} to group {group!r} (--shm-group): the daemon's user is not "
        "in that group; add it (usermod -aG), or leave --shm-group unset"
    )


def group_id(group: str) -> int:
    """The id of --shm-group `group`; -1 for none."""
    try:
        return grp.getgrnam(group).gr_gid if group else -1
    except KeyError:
        raise StartupError(f"no group named {group!r} (--shm-group)") from None


class SlabSet:
    """Creates and owns all slabs of one daemon instance."""

    def __init__(
        self,
        directory: str | Path,
        prefix: str,
        count: int,
        size: int,
        group: str = "",
    ) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self.count = count
        self.size = size
        self.gid = group_id(group)
        self.group = group
        self.mode = 0o660 if group else 0o600
        self.instance = secrets.token_hex(4)
        self.slabs: list[Slab] = []
        self._lock_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.prefix}.lock"

    @property
    def total_bytes(self) -> int:
        return self.count * self.size

    def open(self) -> None:
        """Take the prefix lock, sweep stale segments, create and pre-fault every slab."""
        if not self.directory.exists():
            raise StartupError(f"shared-memory directory {self.directory} does not exist")
        if not self.directory.is_dir():
            raise StartupError(f"shared-memory directory {self.directory} is not a directory")
        self._take_lock()
        try:
            self.sweep_stale()
            self._check_room()
            for index in range(self.count):
                self.slabs.append(self._create(index))
        except OSError as exc:
            self.close()
            raise StartupError(self._cannot(exc)) from None
        except BaseException:
            self.close()
            raise
        log.info(
            "created %d slabs of %s in %s (instance %s)",
            self.count,
            format_size(self.size),
            self.directory,
            self.instance,
        )

    def close(self, unmap: bool = True) -> None:
        """Unmap and unlink every slab, then release the prefix lock. `unmap=False` keeps
        the mappings for threads that may still read them (the process is about to exit)."""
        gc.collect()  # views in reference cycles must go before the mappings can
        for slab in self.slabs:
            if unmap:
                slab.close()
            with contextlib.suppress(FileNotFoundError):
                slab.path.unlink()
        self.slabs.clear()
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.lock_path.unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    def sweep_stale(self) -> list[str]:
        """Remove segments of this prefix left by a dead instance (we hold the lock)."""
        pattern = _segment_pattern(self.prefix)
        removed = []
        for entry in os.scandir(self.directory):
            if (
                pattern.match(entry.name)
                and entry.stat(follow_symlinks=False).st_uid == os.getuid()
            ):
                os.unlink(entry.path)
                removed.append(entry.name)
        if removed:
            log.warning("removed %d stale segments of a dead instance: %s", len(removed), removed)
        return removed

    def _take_lock(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.lock_path, flags, 0o600)
        except OSError as exc:
            raise StartupError(self._cannot(exc, "create the lock file")) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(
                f"another video-sidecar instance already owns shm prefix {self.prefix!r} "
                f"(lock {self.lock_path}); stop it or choose another --shm-prefix"
            ) from None
        except OSError as exc:  # e.g. a file system without flock
            os.close(fd)
            self.lock_path.unlink(missing_ok=True)
            raise StartupError(self._cannot(exc, "lock the lock file")) from None
        self._lock_fd = fd

    def _cannot(self, exc: OSError, doing: str = "set up the slabs") -> str:
        """One line for an OSError while setting up the directory, with its reason."""
        where = f" ({exc.filename})" if exc.filename else ""
        reason = exc.strerror or str(exc)
        return (
            f"cannot {doing} in shared-memory directory {self.directory}: {reason}{where}; "
            "point --shm-dir at a writable tmpfs such as /dev/shm"
        )

    def _check_room(self) -> None:
        free = _free_bytes(self.directory)
        if free < self.total_bytes:
            raise StartupError(self._no_room_message(free))

    def _no_room_message(self, free: int) -> str:
        return (
            f"{self.directory} has {format_size(free)} free but the slab pool needs "
            f"{format_size(self.total_bytes)} ({self.count} x {format_size(self.size)}). "
            "Give the container more shared memory (docker --shm-size, Kubernetes emptyDir "
            "medium: Memory with a sizeLimit) or lower --slabs / --slab-size."
        )

    def _create(self, index: int) -> Slab:
        name = f"{self.prefix}.{self.instance}.{index}"
        path = self.directory / name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, self.mode)
        try:
            os.fchmod(fd, self.mode)  # the umask must not loosen or tighten it
            if self.gid >= 0:
                try:
                    os.fchown(fd, -1, self.gid)
                except PermissionError:
                    raise StartupError(not_in_group(self.group, "the slabs")) from None
            os.ftruncate(fd, self.size)
            try:
                # Reserve every page now, so running out of tmpfs is a startup error
                # and never a SIGBUS in the middle of a copy.
                os.posix_fallocate(fd, 0, self.size)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise StartupError(self._no_room_message(_free_bytes(self.directory))) from None
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            flags_map = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(fd, self.size, flags=flags_map)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return Slab(index, name, path, self.size, mapped, np.frombuffer(mapped, dtype=np.uint8))
