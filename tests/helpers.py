"""Test helpers: a real daemon in a subprocess, decoding, PSNR."""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import av
import numpy as np

from client import SidecarClient
from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.tools.launcher import DaemonProcess, serve_command

SHM_DIR = Path("/dev/shm")


def daemon_command() -> list[str]:
    return serve_command()


class Daemon(DaemonProcess):
    """`video-sidecar serve` on a private socket, shm prefix and output root."""

    def __init__(self, prefix: str, **options: Any) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vsd-"))
        self.output_dir = self.dir / "out"
        self.prefix = prefix
        self.log_path = self.dir / "daemon.log"
        defaults = {
            "output_dir": str(self.output_dir),
            "shm_prefix": prefix,
            "slabs": 4,
            "slab_size": "16MiB",
            "lease_ttl": 30,
            "max_lease_wait": 5,
            "shutdown_grace": 10,
            "log_level": "info",
            # The suite starts some two hundred daemons. Each would start three encoder
            # processes (about a second of CPU each on two cores), which slows the suite
            # and starves the timing of tests that race a deadline. The processes have
            # their own tests (test_processes.py), which ask for them.
            "encoder_processes": 0,
        }
        socket = str(options.pop("socket", self.dir / "sidecar.sock"))
        super().__init__(socket, **{**defaults, **options})

    def start(  # type: ignore[override]
        self,
        timeout: float = 30.0,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> Daemon:
        with open(self.log_path, "ab") as log:
            try:
                super().start(timeout, env, output=log, preexec_fn=preexec_fn)
            except RuntimeError as exc:
                raise RuntimeError(f"daemon {exc}:\n{self.log()}") from None
        return self

    def client(self, **kwargs: Any) -> SidecarClient:
        return SidecarClient(self.socket, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def segments(self) -> list[str]:
        return sorted(p.name for p in SHM_DIR.glob(f"{self.prefix}.*"))

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class SlowHandshake:
    """A Unix socket in front of the daemon's that holds each new connection for
    `delay_s` before passing its bytes on: a daemon on a host too busy to answer at once."""

    def __init__(self, path: Path, daemon_socket: str, delay_s: float) -> None:
        self.path, self.daemon_socket, self.delay_s = path, daemon_socket, delay_s
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                near, _ = self.listener.accept()
                threading.Thread(target=self._pass_on, args=(near,), daemon=True).start()

    def _pass_on(self, near: socket.socket) -> None:
        time.sleep(self.delay_s)
        far = socket.socket(socket.AF_UNIX)
        self.held += [near, far]
        try:
            far.connect(self.daemon_socket)
        except OSError:  # the daemon stopped meanwhile
            near.close()
            return
        for a, b in ((near, far), (far, near)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in [self.listener, *self.held]:
            sock.close()


def mapped_segments(prefix: str) -> set[tuple[str, str]]:
    """This process's mappings of shared-memory segments named `prefix.*`, as (address
    range, name): what the kernel says the clients mapped, no client internals needed."""
    mapped = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(f"{SHM_DIR}/{prefix}."):
            mapped.add((fields[0], Path(fields[5].removesuffix(" (deleted)")).name))
    return mapped


def output_of(events: Iterable[Any]) -> bytes:
    """A raw `Encode` call's bytes output: inside its result (a small one), or its
    chunks in order."""
    chunks: dict[int, bytes] = {}
    for event in events:
        if event.HasField("chunk"):
            chunks[event.chunk.offset] = event.chunk.data
        elif event.HasField("result") and event.result.data:
            return bytes(event.result.data)
    return b"".join(chunks[k] for k in sorted(chunks))


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


class RawFramed:
    """A connection to a daemon's framed socket driven by hand: bytes as given."""

    def __init__(self, path: str, preamble: bytes = framing.PREAMBLE, timeout: float = 120) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.sock.sendall(preamble)

    def send(self, message: bytes) -> None:
        """One frame: the message's length, then the message."""
        self.sock.sendall(framing.frame(message))

    def reply(self) -> pb.FramedReply | None:
        """The next reply, or None once the daemon has closed the connection."""
        header = self._exactly(framing.HEADER_BYTES)
        if header is None:
            return None
        body = self._exactly(framing.length(header))
        assert body is not None, "the connection ended inside a reply"
        return pb.FramedReply.FromString(body)

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            more = self.sock.recv(size - len(data))
            if not more:
                assert not data, "the connection ended inside a reply"
                return None
            data += more
        return data

    def close(self) -> None:
        self.sock.close()


def recorded_ways(monkeypatch: Any) -> list[str]:
    """The way the client's chooser picks for each encode from now on, by name (pytest's
    `monkeypatch` undoes the recording after the test)."""
    from client import _choice, _send

    ways: list[str] = []
    pick = _choice.choose_way

    def recording(facts: _choice.SendFacts) -> _choice.WayName:
        ways.append(pick(facts).value)
        return pick(facts)

    monkeypatch.setattr(_send, "choose_way", recording)
    return ways


def top_level_boxes(data: bytes) -> list[tuple[bytes, int]]:
    """An MP4's top-level boxes: (type, size), in order."""
    boxes, at = [], 0
    while at + 8 <= len(data):
        size, kind = int.from_bytes(data[at : at + 4], "big"), data[at + 4 : at + 8]
        if size == 1:
            size = int.from_bytes(data[at + 8 : at + 16], "big")
        boxes.append((kind, size))
        at += size if size else len(data)
    return boxes


def index_first(data: bytes) -> int:
    """Checks that the index (moov) comes before the frames (mdat), with only `free`
    boxes between; returns the bytes those hold (FFmpeg always writes one of 8)."""
    boxes = top_level_boxes(data)
    kinds = [kind for kind, _ in boxes]
    assert kinds[:2] == [b"ftyp", b"moov"] and kinds[-1] == b"mdat", kinds
    assert set(kinds[2:-1]) <= {b"free"}, kinds
    return sum(size for kind, size in boxes if kind == b"free")


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, poll: float = 0.05) -> bool:
    """Whether `predicate` came true within `timeout` seconds. Give each wait its own
    timeout: on a loaded machine one slow step must not use up the next one's time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())
