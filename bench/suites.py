"""The benchmark suites. Each returns rows; `__main__` prints and records them."""

from __future__ import annotations

import contextlib
import mmap
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from client import SidecarClient
from sidecar.launcher import DaemonProcess

from .common import SHAPES, Device, Row, parse_shape, summarise, timed
from .variants import FfmpegPipe, Sidecar, SidecarYuv, UpstreamA, UpstreamD, Variant, pyav_encode

MiB = 1024 * 1024


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
            yield process
        finally:
            process.stop()


def pool_for(
    frame_bytes: int, frames: int, slab: int = 128 * MiB, copies: int = 1
) -> dict[str, Any]:
    """Slabs enough for `copies` videos resident at once, with room to spare."""
    per_slab = max(1, slab // frame_bytes)
    slabs = copies * -(-frames // per_slab) + 2
    return {"slabs": slabs, "slab_size": f"{slab // MiB}MiB"}


def default_samples(shape: str) -> tuple[int, int]:
    """(samples, warm-ups): fewer for the long videos."""
    frames = parse_shape(shape)[2]
    if frames >= 300:
        return 5, 1
    if frames >= 100:
        return 8, 1
    return 20, 2


def _decoded_frames(data: bytes) -> int:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


# -- end to end ------------------------------------------------------------------------------


def e2e(
    device: Device,
    shapes: list[str],
    variants: list[str] | None,
    samples: int | None,
    sidecar_options: dict[str, Any],
) -> list[Row]:
    """GPU-ready (or host-ready) RGB to MP4 bytes in the caller, variants interleaved."""
    biggest = max(shapes, key=lambda s: np.prod(parse_shape(s)))
    w, h, t = parse_shape(biggest)
    rows: list[Row] = []
    # Each sidecar variant has its own client, as each worker process would.
    with (
        daemon(**pool_for(w * h * 3, t, copies=2)) as d,
        SidecarClient(d.socket) as rgb_client,
        SidecarClient(d.socket) as yuv_client,
    ):
        candidates: list[Variant] = [
            UpstreamA(device),
            UpstreamD(device),
            FfmpegPipe(device),
            Sidecar(device, rgb_client, **sidecar_options),
            SidecarYuv(device, yuv_client, **sidecar_options),
        ]
        chosen = [v for v in candidates if variants is None or v.name in variants]
        usable = [v for v in chosen if not v.available()]
        for v in chosen:
            if v.available():
                print(f"skipping {v.name}: {v.available()}")
        for shape in shapes:
            rows += _e2e_shape(device, shape, usable, samples)
    return rows


def _e2e_shape(
    device: Device, shape: str, variants: list[Variant], samples: int | None
) -> list[Row]:
    n, warmup = default_samples(shape)
    n = samples or n
    video = device.video(shape)
    device.ready()
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    stages: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    outputs: dict[str, bytes] = {}
    for v in variants:
        for _ in range(warmup):
            v.run(video, shape)
    for i in range(n):
        order = variants[i % len(variants) :] + variants[: i % len(variants)]
        for v in order:
            device.ready()
            ms, data = timed(lambda v=v: v.run(video, shape))  # type: ignore[misc]
            times[v.name].append(ms)
            outputs[v.name] = data
            last = getattr(v, "last_timings", None)
            if last is not None:
                stages[v.name].append(last)
    expected = parse_shape(shape)[2]
    rows = []
    for v in variants:
        got = _decoded_frames(outputs[v.name])
        if got != expected:
            raise RuntimeError(f"{v.name} at {shape}: decoded {got} frames, expected {expected}")
        row = summarise(v.name, shape, times[v.name])
        if stages[v.name]:
            row.extra["stages_median_ms"] = {
                k: round(statistics.median(s[k] for s in stages[v.name]), 2)
                for k in stages[v.name][0]
            }
        rows.append(row)
    base = next((r for r in rows if r.variant == "upstream_a"), None)
    for r in rows:
        if base is not None:
            r.ratio_to_upstream_a = round(r.median_ms / base.median_ms, 3)
        print(
            f"{shape:>14} {r.variant:<12} median {r.median_ms:9.1f} ms "
            f"[{r.min_ms:.1f}-{r.max_ms:.1f}]"
            + (f"  x{r.ratio_to_upstream_a:.2f} of upstream_a" if r.ratio_to_upstream_a else ""),
            flush=True,
        )
    return rows


# -- transfer -------------------------------------------------------------------------------


def transfer(device: Device, samples: int | None) -> list[Row]:
    """Copy into leases vs a raw registered copy; fixed overhead per request; 4:2:0 bytes."""
    n = samples or 10
    rows: list[Row] = []
    shapes = ["448x256x3", "1344x768x5", "1344x768x122", "1344x768x362"]
    with daemon(**pool_for(1344 * 768 * 3, 362)) as d, SidecarClient(d.socket) as client:
        client.attach()
        for shape in shapes:
            w, h, t = parse_shape(shape)
            video = device.video(shape)
            nbytes = w * h * t * 3
            raw = _raw_copy_ms(device, video, nbytes, n)
            rows.append(summarise("raw_registered_copy", shape, raw, gbps=_gbps(nbytes, raw)))
            for fmt in (None, "yuv420p"):
                lease_ms, copy_ms, moved = _lease_copy_ms(client, device, video, fmt, n)
                name = "lease_copy" if fmt is None else "lease_copy_yuv420p"
                rows.append(
                    summarise(
                        name, shape, lease_ms, bytes_moved=moved, gbps=_gbps(moved, lease_ms),
                        copy_only_median_ms=round(statistics.median(copy_ms), 3),
                        ratio_to_raw=round(statistics.median(lease_ms) / statistics.median(raw), 3),
                    )
                )  # fmt: skip
        rows += _overhead(client, device, samples or 50)
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
    from client import _core

    total, copies = [], []
    moved = 0
    for i in range(n + 2):
        source = client._prepare(video, pixel_format, None, (0, 1))
        att = client.attach()
        leases = []
        device.ready()
        t0 = time.perf_counter()
        copy_s = 0.0
        for first, count in _core.plan_ranges(source.frames, source.frame_bytes, att):
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


def _overhead(client: SidecarClient, device: Device, n: int) -> list[Row]:
    """Fixed per-request costs of small requests, in the steady state (spare lease in hand).

    - transfer_overhead: getting the frames into the daemon's memory (lease + copy) beyond
      the raw device-to-host copy of the same bytes;
    - request_overhead: everything outside the copy and the encoder's own work (the gRPC
      round trip, the daemon's plumbing), for reference.
    """
    rows = []
    for shape in ("448x256x3", "448x256x4"):
        w, h, frames = parse_shape(shape)
        video = device.video(shape)
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


# -- throughput -----------------------------------------------------------------------------


def throughput(
    device: Device, clients: int, requests: int, shape: str, sidecar_options: dict[str, Any]
) -> list[Row]:
    """Aggregate frames/s with `clients` concurrent callers each sending `requests` videos."""
    w, h, t = parse_shape(shape)
    rows = []
    host_video = device.video(shape)
    frames_total = clients * requests * t

    def pyav_defaults() -> None:
        frames = host_video.cpu().numpy() if hasattr(host_video, "cpu") else host_video
        for _ in range(requests):
            pyav_encode(frames, borrowed=False)

    rows.append(_concurrent("pyav_defaults", shape, clients, pyav_defaults, frames_total))
    options = {"max_concurrent_encodes": clients, **pool_for(w * h * 3, t, copies=clients)}
    with daemon(**options) as d:
        for name, fmt in (("sidecar", None), ("sidecar_yuv", "yuv420p")):
            go = threading.Barrier(clients + 1)

            def work(fmt: str | None = fmt, go: threading.Barrier = go) -> None:
                with SidecarClient(d.socket) as c:
                    c.encode(host_video, pixel_format=fmt, **sidecar_options)  # warm up
                    go.wait()
                    for _ in range(requests):
                        c.encode(host_video, pixel_format=fmt, **sidecar_options)

            rows.append(_concurrent(name, shape, clients, work, frames_total, go))
    for r in rows:
        print(f"{r.shape:>14} {r.variant:<14} {r.extra['frames_per_s']:8.1f} frames/s "
              f"({clients} clients)", flush=True)  # fmt: skip
    return rows


def _concurrent(
    name: str, shape: str, clients: int, work: Any, frames: int, go: threading.Barrier | None = None
) -> Row:
    """Run `work` on `clients` threads; time from `go` (after their warm-up) to the last."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
            if go is not None:
                go.abort()

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for th in threads:
        th.start()
    if go is not None:
        go.wait()  # every client has finished its warm-up request
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    row = summarise(name, shape, [elapsed * 1e3], frames=frames, clients=clients)
    row.extra["frames_per_s"] = round(frames / elapsed, 1)
    return row


# -- streaming ------------------------------------------------------------------------------


def streaming(
    device: Device, shape: str, chunk: int, pace_ms: float, samples: int | None
) -> list[Row]:
    """A producer writes `chunk`-frame chunks every `pace_ms`; time from the last write to
    the complete video in the caller, next to encoding the whole video at once."""
    w, h, t = parse_shape(shape)
    n = samples or 3
    video = device.video(shape)
    rows = []
    with daemon(**pool_for(w * h * 3, t)) as d, SidecarClient(d.socket) as client:
        whole = []
        for i in range(n + 1):
            device.ready()
            ms, _ = timed(lambda: client.encode(video))
            if i:
                whole.append(ms)
        rows.append(summarise("whole_video_encode", shape, whole))
        for container, path in (("fmp4", None), ("mp4", "bench/stream.mp4")):
            tails, totals = [], []
            for i in range(n + 1):
                t0 = time.perf_counter()
                with client.stream(fps=24, container=container, path=path, overwrite=True) as s:
                    for first in range(0, t, chunk):
                        due = t0 + (first // chunk) * pace_ms / 1e3
                        time.sleep(max(0.0, due - time.perf_counter()))
                        s.write(video[first : first + chunk])
                    last_write = time.perf_counter()
                done = time.perf_counter()
                if i:
                    tails.append((done - last_write) * 1e3)
                    totals.append((done - t0) * 1e3)
            name = f"stream_tail_{container}_{'file' if path else 'bytes'}"
            rows.append(
                summarise(
                    name, shape, tails, chunk_frames=chunk, pace_ms=pace_ms,
                    producer_ms=round((-(-t // chunk) - 1) * pace_ms, 1),
                    total_median_ms=round(statistics.median(totals), 1),
                )
            )  # fmt: skip
    for r in rows:
        print(f"{r.shape:>14} {r.variant:<28} median {r.median_ms:8.1f} ms  {r.extra}", flush=True)
    return rows


# -- memory ---------------------------------------------------------------------------------


def memory() -> list[Row]:
    """Idle daemon RSS, excluding the slabs (shared memory)."""
    with daemon() as d:
        time.sleep(2.0)
        status = Path(f"/proc/{d.pid}/status").read_text()
    fields = {
        line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if "kB" in line
    }
    private_mib = (fields.get("RssAnon", 0) + fields.get("RssFile", 0)) / 1024
    row = summarise("idle_rss_excluding_slabs", "-", [private_mib])
    row.extra = {
        "rss_mib": round(fields.get("VmRSS", 0) / 1024, 1),
        "rss_anon_mib": round(fields.get("RssAnon", 0) / 1024, 1),
        "rss_file_mib": round(fields.get("RssFile", 0) / 1024, 1),
        "rss_shmem_mib": round(fields.get("RssShmem", 0) / 1024, 1),
        "private_mib": round(private_mib, 1),
    }
    print(f"idle daemon: {row.extra}", flush=True)
    return [row]


ALL_SHAPES = SHAPES
