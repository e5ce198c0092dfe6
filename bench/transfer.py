"""The transfer suite: copies into leases against a raw registered copy, and fixed costs."""

from __future__ import annotations

import mmap
import statistics
import time
from typing import Any

import numpy as np

from client import SidecarClient

from .common import (
    Device,
    Row,
    parse_shape,
    summarise,
    timed,
)
from .daemons import daemon, pool_for


def transfer(device: Device, samples: int | None, content: str = "smooth") -> list[Row]:
    """Copy into leases vs a raw registered copy; fixed overhead per request; 4:2:0 bytes."""
    n = samples or 10
    rows: list[Row] = []
    shapes = ["448x256x3", "1344x768x5", "1344x768x122", "1344x768x362"]
    with daemon(**pool_for(1344 * 768 * 3, 362)) as d, SidecarClient(d.socket) as client:
        client.attach()
        for shape in shapes:
            w, h, t = parse_shape(shape)
            video = device.video(shape, content)
            nbytes = w * h * t * 3
            raw = _raw_copy_ms(device, video, nbytes, n)
            rows.append(summarise("raw_registered_copy", shape, raw, gbps=_gbps(nbytes, raw)))
            for fmt in ("rgb24", "yuv420p"):
                lease_ms, copy_ms, moved = _lease_copy_ms(client, device, video, fmt, n)
                name = "lease_copy" if fmt == "rgb24" else "lease_copy_yuv420p"
                rows.append(
                    summarise(
                        name, shape, lease_ms, bytes_moved=moved, gbps=_gbps(moved, lease_ms),
                        copy_only_median_ms=round(statistics.median(copy_ms), 3),
                        ratio_to_raw=round(statistics.median(lease_ms) / statistics.median(raw), 3),
                    )
                )  # fmt: skip
        rows += _overhead(client, device, samples or 50, content)
        rows += _round_trips(client)
    for r in rows:
        print(f"{r.shape:>14} {r.variant:<22} median {r.median_ms:9.3f} ms  {r.extra}", flush=True)
    return rows


def _gbps(nbytes: int, times_ms: list[float]) -> float:
    return round(nbytes / (statistics.median(times_ms) / 1e3) / 1e9, 2)


def _raw_copy_ms(device: Device, video: Any, nbytes: int, n: int) -> list[float]:
    """The hardware's number: one copy into a registered, pre-faulted buffer."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    host = np.frombuffer(buf, dtype=np.uint8)
    host[:] = 1  # pre-fault
    torch = device.torch
    times = []
    try:
        if torch is None:
            flat = np.ascontiguousarray(video).reshape(-1)
            for _ in range(n):
                t0 = time.perf_counter()
                np.copyto(host, flat)
                times.append((time.perf_counter() - t0) * 1e3)
            return times
        address = int(host.ctypes.data)
        assert int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) == 0
        try:
            dst = torch.from_numpy(host)
            src = video.reshape(-1)
            for _ in range(n + 2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.current_stream().synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            return times[2:]
        finally:
            del dst
            torch.cuda.cudart().cudaHostUnregister(address)
    finally:
        del host
        buf.close()


def _lease_copy_ms(
    client: SidecarClient, device: Device, video: Any, pixel_format: str | None, n: int
) -> tuple[list[float], list[float], int]:
    """Lease, copy (convert on the GPU for 4:2:0), land: what `encode` does before the RPC."""
    from client import _plan

    total, copies = [], []
    moved = 0
    for i in range(n + 2):
        source = client._prepare(video, pixel_format, None, (0, 1))
        att = client.attach()
        leases = []
        device.ready()
        t0 = time.perf_counter()
        copy_s = 0.0
        for first, count in _plan.plan_ranges(source.frames, source.frame_bytes, att):
            lease = client.lease(count * source.frame_bytes)
            leases.append(lease)
            c0 = time.perf_counter()
            source.copy_into(lease.array, first, count)
            copy_s += time.perf_counter() - c0
        c0 = time.perf_counter()
        source.finish()
        copy_s += time.perf_counter() - c0
        elapsed = (time.perf_counter() - t0) * 1e3
        for lease in leases:
            client.release(lease)
        moved = source.frames * source.frame_bytes
        if i >= 2:
            total.append(elapsed)
            copies.append(copy_s * 1e3)
    return total, copies, moved


def _overhead(client: SidecarClient, device: Device, n: int, content: str) -> list[Row]:
    """Fixed per-request costs of small requests, in the steady state (spare lease in hand).

    - transfer_overhead: getting the frames into the daemon's memory (lease + copy) beyond
      the raw device-to-host copy of the same bytes;
    - request_overhead: everything outside the copy and the encoder's own work (the gRPC
      round trip, the daemon's plumbing), for reference.
    """
    rows = []
    for shape in ("448x256x3", "448x256x4"):
        w, h, frames = parse_shape(shape)
        video = device.video(shape, content)
        raw = statistics.median(_raw_copy_ms(device, video, w * h * frames * 3, 20))
        device.ready()
        for _ in range(5):
            client.encode(video)
        transfer, overheads, totals = [], [], []
        for _ in range(n):
            device.ready()
            t = client.encode(video).timings
            time.sleep(0.02)  # requests arrive apart, as from a real worker
            work = t.open_ms + t.convert_ms + t.encode_ms + t.mux_ms + t.finalize_ms
            transfer.append(t.lease_ms + t.copy_ms - raw)
            overheads.append(t.total_ms - work - t.copy_ms)
            totals.append(t.total_ms)
        extra = {"payload_bytes": w * h * frames * 3, "raw_copy_ms": round(raw, 3)}
        rows.append(summarise("transfer_overhead", shape, transfer, **extra))
        rows.append(
            summarise(
                "request_overhead", shape, overheads, **extra,
                total_median_ms=round(statistics.median(totals), 3),
            )
        )  # fmt: skip
    return rows


def _round_trips(client: SidecarClient, n: int = 300) -> list[Row]:
    """What one unary call to the daemon costs on this machine."""
    status, lease = [], []
    for _ in range(n):
        ms, _ = timed(client.status)
        status.append(ms)
        t0 = time.perf_counter()
        got = client.lease(4096)
        lease.append((time.perf_counter() - t0) * 1e3)
        client.release(got)
    return [summarise("rpc_status", "-", status[20:]), summarise("rpc_lease", "-", lease[20:])]
