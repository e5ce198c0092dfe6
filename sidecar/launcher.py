"""Run `video-sidecar serve` as a child process: for the demo, the benchmark and tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from client import SidecarClient, TransportError


def serve_command() -> list[str]:
    """`video-sidecar` next to this interpreter, else the module it runs."""
    script = Path(sys.executable).with_name("video-sidecar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sidecar"]


def is_serving(socket: str) -> bool:
    with SidecarClient(socket, timeout=2) as probe:
        try:
            return probe.health() == "SERVING"
        except TransportError:
            return False


class DaemonProcess:
    """A daemon child process, started with `options` as `--flag value` pairs."""

    def __init__(self, socket: str, **options: Any) -> None:
        self.socket = socket
        self.options = {"socket": socket, **options}
        self.process: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        args = [*serve_command(), "serve"]
        for key, value in self.options.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        return args

    def start(
        self,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        output: IO[bytes] | None = None,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        """Start and wait until health says SERVING; RuntimeError if it never does."""
        self.process = subprocess.Popen(
            self.args(),
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # noqa: PLW1509 - tests limit the child's resources
        )
        deadline = time.monotonic() + timeout
        with SidecarClient(self.socket, timeout=2) as probe:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the daemon exited with status {self.process.returncode}")
                try:
                    if probe.health() == "SERVING":
                        return
                except TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
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
        return self.process.returncode

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()
