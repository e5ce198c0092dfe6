"""A daemon started for a caller that found none, as sccache and Gradle start theirs.

`export_to_video` is a function call, not a service to run: where no daemon answers at
its socket (a Unix socket; the default one, or $VIDEO_SIDECAR_SOCKET), it starts
`video-sidecar serve` in the background with `--idle-exit`, so that the daemon stops by
itself once no call has come for `IDLE_EXIT_S` (or $VIDEO_SIDECAR_IDLE_EXIT, which the
daemon reads as it reads all its settings from the environment). Later calls, from this
process or any other of the user's, find it warm. It runs in a session of its own (a Ctrl-C in the
caller's terminal does not reach it), its output goes to a log file in
$XDG_STATE_HOME/video-sidecar, and it is said once, on the `client` logger.

Two callers starting at once start one daemon: the start is serialised by a lock file
beside the socket, and the daemon itself refuses a second instance on its shm prefix.
The daemon is this installation's (`python -m sidecar` with this interpreter), so the
worker's environment must have the daemon's dependencies, as `pip install video-sidecar`
gives it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ._channel import resolve_target
from ._errors import SidecarUnavailable, TransportError

log = logging.getLogger("client")

IDLE_EXIT_S = 600.0  # the started daemon stops after this long with no call
START_TIMEOUT_S = 60.0  # a first start (slabs made, encoder processes up) takes seconds


def state_dir() -> Path:
    """Where the logs of daemons started for a caller (or by the command line) go:
    $XDG_STATE_HOME/video-sidecar."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "video-sidecar"


def serving(target: str) -> bool:
    """Whether a daemon answers health checks at `target` (a gRPC target)."""
    from ._sync import SidecarClient

    with SidecarClient(target, timeout=2, prepare=False) as probe:
        try:
            return probe.health() == "SERVING"
        except TransportError:
            return False


def ensure_daemon(target: str | None = None, timeout: float = START_TIMEOUT_S) -> str:
    """The gRPC target of a daemon that answers: the one at `target` (None: the default
    socket or $VIDEO_SIDECAR_SOCKET), started in the background if none does. Raises
    SidecarUnavailable, with the daemon's own reason, when none can be started."""
    resolved = resolve_target(target)
    if serving(resolved):
        return resolved
    socket = resolved.removeprefix("unix:")
    if socket == resolved:  # a network target: not ours to start
        raise SidecarUnavailable(
            f"no daemon answers at {resolved}: start one there with video-sidecar serve --tcp"
        )
    Path(socket).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _start_lock(socket):
        if serving(resolved):  # another caller started it while this one waited
            return resolved
        _start(socket, timeout)
    return resolved


@contextlib.contextmanager
def _start_lock(socket: str) -> Iterator[None]:
    fd = os.open(f"{socket}.start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start(socket: str, timeout: float) -> None:
    log_path = _log_file()
    command = [sys.executable, "-m", "sidecar", "serve", "--socket", socket]
    if "VIDEO_SIDECAR_IDLE_EXIT" not in os.environ:  # the daemon reads that one itself
        command += ["--idle-exit", f"{IDLE_EXIT_S:g}"]
    with open(log_path, "ab") as out:
        out.write(
            f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started by pid {os.getpid()}\n".encode()
        )
        out.flush()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while not serving(f"unix:{socket}"):
        if process.poll() is not None:
            raise SidecarUnavailable(
                f"no daemon answered at {socket}, and the one started there exited "
                f"({_last_line(log_path) or f'status {process.returncode}'}); its log: {log_path}"
            )
        if time.monotonic() > deadline:
            process.terminate()
            raise SidecarUnavailable(
                f"no daemon answered at {socket}, and the one started there was not ready "
                f"within {timeout:g}s; its log: {log_path}"
            )
        time.sleep(0.05)
    log.info(
        "no daemon answered at %s: started one (pid %d) that stops by itself when idle; "
        "its log: %s",
        socket,
        process.pid,
        log_path,
    )


def _log_file() -> Path:
    """The log the started daemon appends to; a temporary one where the state directory
    cannot be written (a read-only home)."""
    path = state_dir() / "autostart.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "ab"):
            pass
        return path
    except OSError:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="video-sidecar-", suffix=".log")
        os.close(fd)
        return Path(name)


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
        lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("---")]
        return lines[-1] if lines else ""
    return ""
