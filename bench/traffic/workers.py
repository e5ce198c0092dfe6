"""A traffic phase's worker processes: their client threads, and what each request gave."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

import numpy as np

from ..common import Device
from .plans import CHUNK, FPS, PSNR_FRAMES, Phase, Step, is_long


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def worker(phase: Phase, go: Any, results: Any) -> None:
    """A worker process's entry point (spawned): each request's record as it ends, then
    ("done", index, psnr by kind, problems); ("failed", index, text) if it could not run."""
    try:
        psnr, problems = _work(phase, go, results)
        results.put(("done", phase.index, psnr, problems))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            go.abort()
        results.put(("failed", phase.index, f"worker {phase.index}: {error_text(exc)}"))


def _input(device: Device, shape: str, content: str) -> Any:
    """Frames as a generation server holds them: bf16 in [-1, 1] for long videos on cuda."""
    video = device.video(shape, content)
    if device.torch is not None and is_long(shape):
        video = video.to(device.torch.bfloat16).div_(127.5).sub_(1.0)
    return video


def _work(phase: Phase, go: Any, results: Any) -> tuple[dict[str, float | None], list[str]]:
    device = Device(phase.device, phase.gpu)
    if device.torch is not None:
        device.torch.cuda.set_device(phase.gpu)
    shapes = sorted({s.shape for plan in phase.plans for s in plan if s.action == "send"})
    videos = {shape: _input(device, shape, phase.content) for shape in shapes}
    device.ready()
    samples: dict[str, tuple[str, bytes]] = {}
    problems: list[str] = []
    lock = threading.Lock()

    def emit(record: dict[str, Any], data: bytes | None) -> None:
        results.put(("rec", phase.index, record))
        kind = f"{record['shape']} {record['mode']}"
        if data and record["stage"] != "warmup":
            with lock:
                samples.setdefault(kind, (record["shape"], data))

    def note(text: str) -> None:
        with lock:
            if text not in problems:
                problems.append(text)

    threads = [
        threading.Thread(
            target=_client_thread,
            args=(phase, phase.first_client + k, plan, videos, device, go, emit, note),
            name=f"traffic-{phase.index}-{k}",
        )
        for k, plan in enumerate(phase.plans)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    psnr = {kind: _psnr(data, shape, phase.content) for kind, (shape, data) in samples.items()}
    return psnr, problems


class _Sender:
    """One client: a `SidecarClient`, or upstream path A, sending one request at a time."""

    def __init__(self, phase: Phase, client: int, device: Device) -> None:
        self.phase, self.device = phase, device
        self.client: Any = None
        self.upstream: Any = None
        if phase.side == "sidecar":
            from client import SidecarClient

            self.client = SidecarClient(phase.socket, client_name=f"bench-traffic-{client}")
            # As a GPU worker does once at startup: attach, register the slabs, compile the
            # conversion kernel; no request pays for them.
            self.client.warm_up("cuda" if device.torch is not None else None)
        else:
            from ..variants import UpstreamA

            self.upstream = UpstreamA(device)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def send(self, video: Any, shape: str, mode: str) -> tuple[float, float, int, bytes | None]:
        """(ms spent on leases, ms queued for an encoder in the daemon, output bytes, the
        output)."""
        if self.upstream is not None:
            torch = self.device.torch
            if torch is not None and video.is_floating_point():  # as upstream must, on the GPU
                video = (video.float() + 1).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)
            data = self.upstream.run(video, shape)
            return 0.0, 0.0, len(data), data
        vr = (-1.0, 1.0) if self.device.torch is not None and is_long(shape) else (0.0, 1.0)
        timeout = self.phase.timeout_s
        if mode == "encode":
            result = self.client.encode(video, fps=FPS, value_range=vr, timeout=timeout)
        else:
            frames = int(video.shape[0])
            with self.client.stream(fps=FPS, value_range=vr, timeout=timeout) as s:
                for first in range(0, frames, CHUNK):
                    s.write(video[first : first + CHUNK])
            result = s.result
        t = result.timings
        return t.lease_ms, t.queue_ms, result.size_bytes, result.data


def _client_thread(
    phase: Phase,
    client: int,
    plan: tuple[Step, ...],
    videos: dict[str, Any],
    device: Device,
    go: Any,
    emit: Any,
    note: Any,
) -> None:
    """Run one client's plan; every send gives one record, whatever happens."""
    sends = [s for s in plan if s.action == "send"]

    def record(step: Step, ms: float, error: str, got: tuple[Any, ...] = (0, 0, 0, None)) -> None:
        lease, queued, size, data = got
        emit(
            {"worker": phase.index, "client": client, "stage": step.stage, "shape": step.shape,
             "mode": step.mode, "ok": not error, "ms": round(ms, 3),
             "lease_ms": round(lease, 3), "queue_ms": round(queued, 3), "bytes": size,
             "error": error},
            data,
        )  # fmt: skip

    try:
        sender = _Sender(phase, client, device)
    except BaseException as exc:  # every request it would have sent fails the same way
        for step in sends:
            record(step, 0.0, f"client: {error_text(exc)}")
        return
    idle = sum(s.seconds for s in plan if s.action == "idle")
    wait_s = phase.budget_s + phase.timeout_s + idle + 60  # the longest a peer may take
    deadline: float | None = None
    try:
        for step in plan:
            if step.action == "sync":
                try:
                    go.wait(wait_s)
                except Exception as exc:  # broken: a peer failed; carry on unsynchronised
                    note(f"barrier: {error_text(exc) or type(exc).__name__}")
                if deadline is None:
                    deadline = time.monotonic() + phase.budget_s + idle
                continue
            if step.action == "idle":
                time.sleep(step.seconds)
                continue
            if deadline is not None and time.monotonic() > deadline:
                record(step, 0.0, "skipped")
                continue
            t0 = time.perf_counter()
            try:
                got = sender.send(videos[step.shape], step.shape, step.mode)
            except Exception as exc:
                record(step, (time.perf_counter() - t0) * 1e3, error_text(exc) or "error")
                continue
            record(step, (time.perf_counter() - t0) * 1e3, "", got)
    finally:
        with contextlib.suppress(Exception):
            sender.close()


def _psnr(data: bytes, shape: str, content: str) -> float | None:
    """PSNR (dB) of an output against the frames sent, on up to PSNR_FRAMES frames."""
    try:
        from tests.helpers import decode, psnr  # the one PSNR the project has

        frames, _ = decode(data)
    except Exception:
        return None
    reference = Device("cpu").video(shape, content)
    if len(frames) != len(reference):
        return None
    pick = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), PSNR_FRAMES)).astype(int))
    value = psnr(frames[pick], reference[pick])
    return None if math.isinf(value) else round(value, 2)
