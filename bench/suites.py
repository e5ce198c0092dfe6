"""The benchmark suites. Each returns rows; `__main__` prints and records them."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client import SidecarClient
from sidecar.config_values import ENV_PREFIX, default_encoder_processes
from sidecar.pipeline.processes import KEEP
from sidecar.tools.launcher import DaemonProcess

from .common import (
    CONCURRENT_WARMUP_S,
    PATTERNS,
    Device,
    Row,
    parse_shape,
    run_together,
    summarise,
    timed,
)
from .variants import FfmpegPipe, Sidecar, SidecarYuv, UpstreamA, UpstreamD, Variant, pyav_encode

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
    with SidecarClient(process.socket) as c:
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
    *,
    pattern: str = "steady",
    contents: Sequence[str] = ("smooth",),
    concurrency: int = 1,
    daemon_options: dict[str, Any] | None = None,
) -> list[Row]:
    """GPU-ready (or host-ready) RGB to MP4 bytes in the caller, per request.

    `pattern` "steady": all samples of one variant back to back, each request as soon as
    the previous one answered, as a busy generation server sends them; then the next
    variant, the order of the blocks rotated from shape to shape. "spaced": the variants
    interleaved per sample, which leaves the daemon idle between its requests.
    `concurrency` N: N threads run each variant at once, each sending its samples back to
    back; for the sidecar each thread has its own client, as separate workers would.
    """
    if pattern not in PATTERNS:
        raise SystemExit(f"--pattern: one of {', '.join(PATTERNS)}")
    biggest = max(shapes, key=lambda s: np.prod(parse_shape(s)))
    w, h, t = parse_shape(biggest)
    # Room for one video per thread (one variant runs at a time) and the spare leases of
    # all the clients, and never less than twice one video: a request may take at most half
    # the pool at once, else it goes as a stream.
    pool = pool_for(w * h * 3, t, copies=max(2, concurrency + 1), clients=2 * concurrency)
    options = {**pool, **(daemon_options or {})}
    rows: list[Row] = []
    with daemon(**options) as d, contextlib.ExitStack() as stack:

        def client() -> SidecarClient:
            return stack.enter_context(SidecarClient(d.socket))

        factories: dict[str, Callable[[], Variant]] = {
            "upstream_a": lambda: UpstreamA(device),
            "upstream_d": lambda: UpstreamD(device),
            "ffmpeg_pipe": lambda: FfmpegPipe(device),
            "sidecar": lambda: Sidecar(device, client(), **sidecar_options),
            "sidecar_yuv": lambda: SidecarYuv(device, client(), **sidecar_options),
        }
        unknown = set(variants or ()) - set(factories)
        if unknown:
            raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}")
        lanes: dict[str, list[Variant]] = {}
        for name, make in factories.items():
            if variants is not None and name not in variants:
                continue
            first = make()
            if first.available():
                print(f"skipping {name}: {first.available()}")
                continue
            lanes[name] = [first] + [make() for _ in range(concurrency - 1)]
        if not lanes:
            raise SystemExit("e2e: no variant to run")
        with SidecarClient(d.socket) as probe:
            limit = probe.status().max_concurrent_encodes
        block = 0
        for content in contents:
            for shape in shapes:
                rows += _e2e_shape(device, shape, content, lanes, samples, pattern, block)
                block += 1
    for r in rows:
        if r.variant.startswith("sidecar"):
            r.extra["daemon_max_concurrent_encodes"] = limit
    return rows


@dataclass
class _Lanes:
    """What one or more runs of a variant's threads measured."""

    times_ms: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)
    wall_s: float = 0.0
    output: bytes = b""

    def add(self, other: _Lanes) -> None:
        self.times_ms += other.times_ms
        self.stages += other.stages
        self.wall_s += other.wall_s
        self.output = other.output or self.output


def _run_lanes(
    runners: list[Variant], device: Device, video: Any, shape: str, count: int, warmup: int
) -> _Lanes:
    """Each runner on its own thread (inline when one): `warmup` requests, then, all
    starting together, `count` requests back to back, each timed."""
    device.ready()
    go = threading.Barrier(len(runners)) if len(runners) > 1 else None
    spans: list[tuple[float, float]] = []
    out = _Lanes()
    lock = threading.Lock()

    def lane(v: Variant) -> None:
        # Concurrent lanes warm up for a few seconds at least: long enough for the daemon to
        # start the encoder processes that much traffic asks for (steady state).
        until = time.perf_counter() + (CONCURRENT_WARMUP_S if go is not None and warmup else 0)
        done = 0
        while done < warmup or time.perf_counter() < until:
            v.run(video, shape)
            done += 1
        if go is not None:
            go.wait()
        times: list[float] = []
        stages: list[dict[str, float]] = []
        data = b""
        start = time.perf_counter()
        for _ in range(count):
            ms, data = timed(lambda: v.run(video, shape))
            times.append(ms)
            last = getattr(v, "last_timings", None)
            if last is not None:
                stages.append(last)
        end = time.perf_counter()
        with lock:
            out.times_ms += times
            out.stages += stages
            out.output = data or out.output
            spans.append((start, end))

    if go is None:
        lane(runners[0])
    else:
        run_together([functools.partial(lane, v) for v in runners], go)
    out.wall_s = max(e for _, e in spans) - min(s for s, _ in spans)
    return out


def _e2e_shape(
    device: Device,
    shape: str,
    content: str,
    lanes: dict[str, list[Variant]],
    samples: int | None,
    pattern: str,
    rotation: int,
) -> list[Row]:
    n, warmup = default_samples(shape)
    n = samples or n
    video = device.video(shape, content)
    names = list(lanes)
    results: dict[str, _Lanes] = {}
    if pattern == "steady":
        k = rotation % len(names)
        for name in names[k:] + names[:k]:
            results[name] = _run_lanes(lanes[name], device, video, shape, n, warmup)
    else:
        for name in names:
            _run_lanes(lanes[name], device, video, shape, 0, warmup)
        results = {name: _Lanes() for name in names}
        for i in range(n):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                results[name].add(_run_lanes(lanes[name], device, video, shape, 1, 0))
    expected = parse_shape(shape)[2]
    concurrency = len(next(iter(lanes.values())))
    rows = []
    for name in names:  # in the order asked for, whatever order they ran in
        got = results[name]
        frames = _decoded_frames(got.output)
        if frames != expected:
            raise RuntimeError(f"{name} at {shape}: decoded {frames} frames, expected {expected}")
        row = summarise(name, shape, got.times_ms)
        row.suite, row.content = "e2e", content
        if concurrency > 1:
            row.extra["concurrency"] = concurrency
            row.extra["frames_per_s"] = round(len(got.times_ms) * expected / got.wall_s, 1)
        if got.stages:
            row.extra["stages_median_ms"] = {
                k: round(statistics.median(s[k] for s in got.stages), 2) for k in got.stages[0]
            }
        rows.append(row)
    base = next((r for r in rows if r.variant == "upstream_a"), None)
    for r in rows:
        if base is not None:
            r.ratio_to_upstream_a = round(r.median_ms / base.median_ms, 3)
        print(
            f"{content:>6} {shape:>14} {r.variant:<12} median {r.median_ms:9.1f} ms "
            f"[{r.min_ms:.1f}-{r.max_ms:.1f}]"
            + (f"  x{r.ratio_to_upstream_a:.2f} of upstream_a" if r.ratio_to_upstream_a else "")
            + (f"  {r.extra['frames_per_s']:.0f} frames/s" if "frames_per_s" in r.extra else ""),
            flush=True,
        )
    return rows


# -- transfer -------------------------------------------------------------------------------


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


# -- throughput -----------------------------------------------------------------------------


def throughput(
    device: Device,
    clients: int,
    requests: int,
    shape: str,
    sidecar_options: dict[str, Any],
    content: str = "smooth",
) -> list[Row]:
    """Aggregate frames/s with `clients` concurrent callers each sending `requests` videos."""
    w, h, t = parse_shape(shape)
    rows = []
    host_video = device.video(shape, content)
    frames_total = clients * requests * t

    def pyav_defaults() -> None:
        frames = host_video.cpu().numpy() if hasattr(host_video, "cpu") else host_video
        for _ in range(requests):
            pyav_encode(frames, borrowed=False)

    rows.append(_concurrent("pyav_defaults", shape, clients, pyav_defaults, frames_total))
    options = {"max_concurrent_encodes": clients, **pool_for(w * h * 3, t, copies=clients)}
    with daemon(**options) as d:
        for name, fmt in (("sidecar", "rgb24"), ("sidecar_yuv", "yuv420p")):
            go = threading.Barrier(clients + 1)

            def work(fmt: str | None = fmt, go: threading.Barrier = go) -> None:
                with SidecarClient(d.socket) as c:
                    c.encode(host_video, pixel_format=fmt, **sidecar_options)  # warm up
                    go.wait()
                    for _ in range(requests):
                        c.encode(host_video, pixel_format=fmt, **sidecar_options)

            rows.append(_concurrent(name, shape, clients, work, frames_total, go))
    for r in rows:
        print(f"{content:>6} {r.shape:>14} {r.variant:<14} {r.extra['frames_per_s']:8.1f} frames/s "
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
    device: Device,
    shape: str,
    chunk: int,
    pace_ms: float,
    samples: int | None,
    content: str = "smooth",
) -> list[Row]:
    """A producer writes `chunk`-frame chunks every `pace_ms`; time from the last write to
    the complete video in the caller, next to encoding the whole video at once."""
    w, h, t = parse_shape(shape)
    n = samples or 3
    video = device.video(shape, content)
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


def status_kib(pid: int) -> dict[str, int]:
    """The KiB fields of /proc/PID/status (VmRSS, RssAnon, ...); empty once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    lines = [line.split() for line in status.splitlines() if line.endswith(" kB")]
    return {fields[0].rstrip(":"): int(fields[1]) for fields in lines}


def memory() -> list[Row]:
    """Idle daemon RSS, excluding the slabs (shared memory)."""
    with daemon() as d:
        time.sleep(2.0)
        fields = status_kib(d.pid)
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


def children(pid: int) -> list[int]:
    """The live child processes of `pid`: for the daemon, its encoder processes."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return sorted(set(kids))


def tree_rss_anon(pid: int) -> dict[str, Any]:
    """MiB of RssAnon: the daemon's, its processes' in all, and how many processes."""
    kids = children(pid)
    own, *theirs = (status_kib(p).get("RssAnon", 0) for p in [pid, *kids])
    return {
        "daemon_mib": round(own / 1024, 1),
        "processes": len(kids),
        "total_mib": round((own + sum(theirs)) / 1024, 1),
    }


class TreeMemory:
    """Samples `tree_rss_anon` every `every` seconds in a thread, from `start()` on;
    `after_load()` then lets the daemon idle and reports how its memory came back."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        self.pid, self.every = pid, every
        self.peak: dict[str, Any] = {}  # the sample with the most memory, under load
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def start(self) -> TreeMemory:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = tree_rss_anon(self.pid)
            if sample["total_mib"] > self.peak.get("total_mib", -1):
                self.peak = sample
            self._stop.wait(self.every)

    def after_load(self, idle_s: float, every: float = 5.0) -> Row:
        """Stop sampling the load, idle `idle_s` seconds sampling every `every`, and
        return a row: MiB of RssAnon (daemon and encoder processes) at the end of the
        idle, with the peak under load and the idle samples in its details."""
        self._stop.set()
        self._thread.join()
        idle: list[dict[str, Any]] = []
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            idle.append({"idle_s": round(waited, 1), **tree_rss_anon(self.pid)})
            print(f"  memory after {waited:5.1f} s idle: {idle[-1]}", flush=True)
            if waited >= idle_s:
                break
            time.sleep(min(every, idle_s - waited))
        row = summarise("rss_anon_after_load_mib", "-", [idle[-1]["total_mib"]])
        row.suite = "memory"
        row.extra = {
            "idle_s": idle_s,
            "daemon_mib": idle[-1]["daemon_mib"],
            "processes": idle[-1]["processes"],
            "peak_under_load": self.peak,
            "end_of_load": idle[0],
            "idle": idle,
        }
        return row
