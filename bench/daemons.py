"""A daemon of the bench's own: a private socket and shm prefix, sized pools."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from client import SidecarClient
from sidecar.config_values import ENV_PREFIX, default_encoder_processes
from sidecar.pipeline.processes.pool import KEEP
from sidecar.tools.launcher import DaemonProcess

MiB = 1024 * 1024
ENV_PROCESSES = ENV_PREFIX + "ENCODER_PROCESSES"


@contextlib.contextmanager
def daemon(**options: Any) -> Iterator[DaemonProcess]:
    """A daemon on a private socket and shm prefix, stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="vsb-") as tmp:
        defaults = {
            "output_dir": str(Path(tmp) / "out"),
            "shm_prefix": f"vsbench{os.getpid()}",
            "log_level": "warning",
        }
        process = DaemonProcess(str(Path(tmp) / "sidecar.sock"), **{**defaults, **options})
        process.start()
        try:
            _settle(process, options)
            yield process
        finally:
            process.stop()


def _settle(process: DaemonProcess, options: dict[str, Any]) -> None:
    """Wait (5 s at most) for the encoder processes a daemon starts with: a server runs
    for hours, and its first second is not what the bench measures."""
    configured = options.get("encoder_processes", os.environ.get(ENV_PROCESSES))
    wanted = min(KEEP, default_encoder_processes() if configured is None else int(configured))
    deadline = time.monotonic() + 5
    with SidecarClient(process.socket, prepare=False) as c:
        while c.status().encoder_processes < wanted and time.monotonic() < deadline:
            time.sleep(0.05)


def pool_for(
    frame_bytes: int, frames: int, slab: int = 128 * MiB, copies: int = 1, clients: int = 0
) -> dict[str, Any]:
    """Slabs enough for `copies` videos resident at once, with room to spare, plus one
    slab for the spare lease each of `clients` idle clients may hold."""
    per_slab = max(1, slab // frame_bytes)
    slabs = copies * -(-frames // per_slab) + 2 + clients
    return {"slabs": slabs, "slab_size": f"{slab // MiB}MiB"}
