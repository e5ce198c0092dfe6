"""Test helpers: a real daemon in a subprocess, decoding, PSNR."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

from client import SidecarClient, TransportError

SHM_DIR = Path("/dev/shm")


def daemon_command() -> list[str]:
    """`video-sidecar` from this environment, else the module it runs."""
    script = Path(sys.executable).with_name("video-sidecar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sidecar"]


class Daemon:
    """`video-sidecar serve` on a private socket, shm prefix and output root."""

    def __init__(self, prefix: str, **options: Any) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vsd-"))
        self.socket = str(self.dir / "sidecar.sock")
        self.output_dir = self.dir / "out"
        self.prefix = prefix
        self.options = {
            "socket": self.socket,
            "output_dir": str(self.output_dir),
            "shm_prefix": prefix,
            "slabs": 4,
            "slab_size": "16MiB",
            "lease_ttl": 30,
            "max_lease_wait": 5,
            "shutdown_grace": 10,
            "log_level": "info",
            **options,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "daemon.log"

    def args(self) -> list[str]:
        args = [*daemon_command(), "serve"]
        for key, value in self.options.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        return args

    def start(self, timeout: float = 30.0, env: dict[str, str] | None = None) -> Daemon:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            self.args(), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        log.close()
        deadline = time.monotonic() + timeout
        with SidecarClient(self.socket, timeout=2) as probe:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"daemon exited {self.process.returncode}:\n{self.log()}")
                try:
                    if probe.health() == "SERVING":
                        return self
                except TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"daemon not ready after {timeout}s:\n{self.log()}")
                time.sleep(0.05)

    def client(self, **kwargs: Any) -> SidecarClient:
        return SidecarClient(self.socket, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def segments(self) -> list[str]:
        return sorted(p.name for p in SHM_DIR.glob(f"{self.prefix}.*"))

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def decode(source: bytes | str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode every frame as RGB; returns (frames, stream facts)."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    with av.open(handle) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        facts = {
            "codec": ctx.name,
            "width": ctx.width,
            "height": ctx.height,
            "pix_fmt": ctx.pix_fmt,
            "colorspace": ctx.colorspace,
            "color_range": ctx.color_range,
            "color_primaries": ctx.color_primaries,
            "color_trc": ctx.color_trc,
            "rate": stream.average_rate,
            "format": container.format.name,
        }
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    return frames, facts


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
