"""A daemon that cannot start says why in one line and exits non-zero: no traceback, and
nothing left in /dev/shm (slabs, lock) or beside the socket."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import new_prefix
from .helpers import SHM_DIR, Daemon

# sun_path is 108 bytes on Linux, the closing NUL included.
MAX_SOCKET_PATH = 107


@dataclass
class Failed:
    returncode: int
    stderr: str
    prefix: str
    socket: Path

    @property
    def error(self) -> str:
        """The one line saying why it could not start."""
        lines = [line for line in self.stderr.splitlines() if "cannot start" in line]
        assert len(lines) == 1, self.stderr
        return lines[0]


def serve(tmp_path: Path, *args: str, socket_path: str | None = None) -> Failed:
    """`video-sidecar serve` with a private prefix, socket and output root, plus `args`."""
    prefix = new_prefix()
    sock = Path(socket_path) if socket_path is not None else tmp_path / "s.sock"
    defaults = {
        "--socket": str(sock),
        "--output-dir": str(tmp_path / "out"),
        "--shm-prefix": prefix,
        "--slabs": "2",
        "--slab-size": "1MiB",
        "--log-level": "info",
    }
    for flag in args[::2]:
        defaults.pop(flag, None)
    command = [sys.executable, "-m", "sidecar", "serve"]
    for flag, value in defaults.items():
        command += [flag, value]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, check=False
    )
    return Failed(result.returncode, result.stderr, prefix, sock)


def check_refused(result: Failed, *words: str) -> None:
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    # The error, and at most the INFO lines of what was set up (and torn down) before it.
    assert len(result.stderr.splitlines()) <= 3, result.stderr
    for word in words:
        assert word in result.error, result.stderr
    assert len(result.error) < 400, result.error
    assert not list(SHM_DIR.glob(f"{result.prefix}*")), "segments or lock left behind"
    assert not result.socket.is_socket(), "socket left behind"


def long_path(tmp_path: Path, size: int, char: str = "x") -> str:
    """A socket path of exactly `size` bytes (in UTF-8) under tmp_path."""
    base = f"{tmp_path}/"
    room = size - len(os.fsencode(base + "s.sock"))
    width = len(char.encode())
    return base + char * (room // width) + "x" * (room % width) + "s.sock"


def test_socket_path_too_long(tmp_path: Path) -> None:
    path = long_path(tmp_path, MAX_SOCKET_PATH + 1)
    result = serve(tmp_path, socket_path=path)
    check_refused(result, path, "108 bytes", "107", "--socket")


def test_socket_path_limit_counts_bytes_not_characters(tmp_path: Path) -> None:
    path = long_path(tmp_path, MAX_SOCKET_PATH + 2, "é")
    assert len(path) <= MAX_SOCKET_PATH < len(os.fsencode(path))
    check_refused(serve(tmp_path, socket_path=path), "bytes", "107")


def test_socket_path_at_the_limit_serves(
    tmp_path: Path, make_daemon: Callable[..., Daemon]
) -> None:
    path = long_path(tmp_path, MAX_SOCKET_PATH)
    daemon = make_daemon(socket=path)
    with daemon.client() as client:
        assert client.health() == "SERVING"


def test_tcp_failure_removes_the_unix_socket(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(tmp_path, "--tcp", f"127.0.0.1:{port}", "--insecure", "true")
    check_refused(result, f"127.0.0.1:{port}", os.strerror(errno.EADDRINUSE))
    assert not result.socket.exists()


BAD_STARTS: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    # The lock file cannot be created there: procfs takes no new files.
    "shm_dir_proc": (lambda _: ["--shm-dir", "/proc/sys"], ("/proc/sys", "lock file")),
    "shm_dir_missing": (
        lambda tmp: ["--shm-dir", str(tmp / "nope")],
        ("nope", "does not exist"),
    ),
    "shm_dir_is_a_file": (
        lambda tmp: ["--shm-dir", str(tmp / "file")],
        ("file", "not a directory"),
    ),
    "shm_group_unknown": (
        lambda _: ["--shm-group", "no-such-group-vst"],
        ("no-such-group-vst",),
    ),
    "slabs_too_big": (lambda _: ["--slab-size", "512TiB"], ("slab pool needs", "--shm-size")),
    "socket_dir_unmakeable": (
        lambda _: ["--socket", "/proc/no-such/dir/s.sock"],
        ("/proc/no-such", "No such file"),
    ),
    "socket_dir_is_a_file": (
        lambda tmp: ["--socket", str(tmp / "file" / "s.sock")],
        ("file", "not a directory"),
    ),
    "output_dir_unmakeable": (
        lambda _: ["--output-dir", "/proc/sys/video-out"],
        ("/proc/sys/video-out",),
    ),
    "output_dir_unwritable": (
        lambda _: ["--output-dir", "/proc/sys"],
        ("/proc/sys", "not writable"),
    ),
    "tcp_host_unknown": (
        lambda _: ["--tcp", "no-such-host.invalid:5000", "--insecure", "true"],
        ("no-such-host.invalid", "cannot resolve"),
    ),
    "tcp_host_malformed": (
        lambda _: ["--tcp", "999.1.1.1:5000", "--insecure", "true"],
        ("999.1.1.1", "cannot resolve"),
    ),
}


@pytest.mark.parametrize("case", BAD_STARTS)
def test_bad_startup_is_one_clear_line(tmp_path: Path, case: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    args, words = BAD_STARTS[case]
    check_refused(serve(tmp_path, *args(tmp_path)), *words)
