"""Run `video-sidecar serve` as a child process: for the CLI, the demo, the benchmark and
tests.

`AutoDaemon` is the daemon a command (`encode`, `demo`) starts for itself when none answers
at its socket: its output goes to a log file, not the user's terminal; it runs in its own
session, so a Ctrl-C reaches only the command, which then stops it cleanly; and on a socket
other than the default one it gets an shm prefix of its own, as `serve` does there
(`config.shm_prefix_for`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket as net
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from client import SidecarClient, TransportError
from client._autostart import state_dir  # one place for where daemons' logs go

from ..config import Config, shm_prefix_for
from ..config_values import socket_path


def serve_command() -> list[str]:
    """`video-sidecar` next to this interpreter, else the module it runs."""
    script = Path(sys.executable).with_name("video-sidecar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sidecar"]


def is_serving(socket: str) -> bool:
    with SidecarClient(socket, timeout=2, prepare=False) as probe:
        try:
            return probe.health() == "SERVING"
        except TransportError:
            return False


def permission_denied(socket: str) -> str:
    """The one line for a Unix socket this user may not connect to (the socket's mode, or
    a directory on its way, keeps them out), else "". Starting a daemon there would not
    help: the one there is not the user's to reach."""
    path = socket_path(socket)
    if path is None:
        return ""
    probe = net.socket(net.AF_UNIX, net.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(path)
    except PermissionError:
        return f"permission denied on {path}: the daemon's user or its --shm-group must include you"
    except OSError:  # nothing there, or nothing listening: no daemon, not a refusal
        return ""
    finally:
        probe.close()
    return ""


def _missing_dirs(directory: Path) -> list[Path]:
    """`directory` and those of its parents that do not exist yet, deepest first."""
    missing = []
    directory = directory.absolute()
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    return missing


class DaemonProcess:
    """A daemon child process, started with `options` as its `serve` flags (booleans as
    bare flags: `insecure=True` or `insecure="true"` gives `--insecure`)."""

    def __init__(self, socket: str, **options: Any) -> None:
        self.socket = socket
        self.options = {"socket": socket, **options}
        self.process: subprocess.Popen[bytes] | None = None
        self._made_dirs: list[Path] = []

    def args(self) -> list[str]:
        return [*serve_command(), "serve", *Config.to_args(self.options)]

    def start(
        self,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        output: IO[bytes] | None = None,
        preexec_fn: Callable[[], Any] | None = None,
        new_session: bool = False,
    ) -> None:
        """Start and wait until health says SERVING; RuntimeError if it never does.

        `new_session` keeps the terminal's Ctrl-C (sent to the whole foreground process
        group) away from the daemon, so that its parent decides when it stops."""
        # The daemon creates its socket directory; remember what to remove if it fails.
        self._made_dirs = _missing_dirs(Path(self.socket).parent)
        self.process = subprocess.Popen(
            self.args(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # noqa: PLW1509 - tests limit the child's resources
            start_new_session=new_session,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:  # an early exit, a timeout, or Ctrl-C while waiting
            self._abort()
            self._remove_made_dirs()
            raise

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        with SidecarClient(self.socket, timeout=2, prepare=False) as probe:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the daemon exited with status {self.process.returncode}")
                try:
                    if probe.health() == "SERVING":
                        return
                except TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not become ready within {timeout:.0f}s")
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful shutdown) and wait; returns the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._remove_made_dirs()
        return self.process.returncode

    def force_stop(self, timeout: float = 10.0) -> None:
        """Stop without the grace period: a second SIGTERM makes the daemon cancel what
        is running (it still removes its segments); SIGKILL only if even that hangs."""
        if self.running():
            assert self.process is not None
            for _ in range(2):  # apart, so that the kernel does not merge them into one
                self.process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.2)
                if self.process.poll() is not None:
                    break
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._remove_made_dirs()

    def _abort(self) -> None:
        # SIGTERM rather than SIGKILL: a daemon that got as far as creating its slabs
        # removes them on the way out.
        self.force_stop()

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def _remove_made_dirs(self) -> None:
        for directory in self._made_dirs:  # deepest first; one still in use stays
            with contextlib.suppress(OSError):
                directory.rmdir()
        self._made_dirs = []


class DaemonStartError(RuntimeError):
    """A daemon a command needed could not be started; the message says why, in a line."""


auto_shm_prefix = shm_prefix_for  # the name the launcher's callers know it by


class AutoDaemon:
    """A daemon a command starts because none answers at `socket`, stopped when it is done.

    Its settings come from the environment and config file as for `serve`, except the
    socket, and the shm prefix when `shm_prefix` names one.
    """

    def __init__(self, socket: str, shm_prefix: str = "", timeout: float = 60.0) -> None:
        path = socket_path(socket)
        if path is None:
            raise DaemonStartError(
                f"no daemon answers at {socket}; a daemon is started by itself only for a "
                f"Unix socket: start one there with `video-sidecar serve --tcp {socket}` "
                "(with TLS or --insecure)"
            )
        denied = permission_denied(path)
        if denied:
            raise DaemonStartError(denied)
        self.socket = socket = path
        self.timeout = timeout
        try:
            config = Config.load({"socket": socket, "shm_prefix": shm_prefix or None})
        except ValueError as exc:
            raise DaemonStartError(
                f"cannot start a daemon on {socket}: bad configuration: {exc}"
            ) from None
        self.shm_prefix = config.shm_prefix  # as `serve --socket` derives it, if none is set
        self.daemon = DaemonProcess(socket, shm_prefix=self.shm_prefix)
        self.log_path: Path | None = None
        self.owned = False  # False: another process's daemon answered in the meantime

    def start(self) -> None:
        with self._open_log() as log:
            offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {stamp} started for {self.socket} by pid {os.getpid()}\n".encode())
            log.flush()
            try:
                self.daemon.start(self.timeout, output=log, new_session=True)
            except RuntimeError as exc:
                if is_serving(self.socket):  # another command started one first: use it
                    return
                reason = self._reason(offset) or str(exc)
                raise DaemonStartError(
                    f"could not start a daemon on {self.socket}: {reason} "
                    f"(its log: {self.log_path or 'none'})"
                ) from None
        self.owned = True

    def stop(self, force: bool = False) -> None:
        """Stop the daemon if this command started it; `force` skips the grace period
        (nothing of this command's is worth waiting for after a Ctrl-C)."""
        if not self.owned:
            return
        self.owned = False
        if force:
            self.daemon.force_stop()
            return
        try:
            self.daemon.stop(self.timeout)
        except subprocess.TimeoutExpired:
            pass  # killed; the next daemon on this prefix sweeps what it left
        except KeyboardInterrupt:  # Ctrl-C again while it drains: stop waiting for that
            self.daemon.force_stop()
            raise

    def describe(self) -> str:
        return (
            f"no daemon answered at {self.socket}; started one for this command "
            f"(shm prefix {self.shm_prefix}, log {self.log_path or 'none'})"
        )

    def __enter__(self) -> AutoDaemon:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.stop(force=kind is not None and issubclass(kind, KeyboardInterrupt))

    def _open_log(self) -> IO[bytes]:
        """Append to `state_dir()/<prefix>.log`; a private temporary file if that cannot be
        written (a read-only home, say); nowhere as a last resort."""
        path = state_dir() / f"{self.shm_prefix}.log"
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            log: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed by start()
        except OSError:
            try:
                log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by start()
                    prefix=f"{self.shm_prefix}-", suffix=".log", delete=False
                )
                path = Path(log.name)
            except OSError:
                self.log_path = None
                return open(os.devnull, "ab")
        self.log_path = path
        return log

    def _reason(self, offset: int) -> str:
        """The daemon's own one-line reason for failing, from what it logged this time."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        lines = []
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("{"):  # --log-json
                with contextlib.suppress(ValueError, AttributeError):
                    line = str(json.loads(line).get("msg", line))
            if line and not line.startswith("--- "):
                lines.append(line)
        for marker in ("cannot start: ", "bad configuration: "):
            for line in reversed(lines):
                if marker in line:
                    return line.split(marker, 1)[1]
        return lines[-1] if lines else ""
