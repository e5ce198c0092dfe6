"""The node suite: a whole generation node sending videos to its one daemon.

One daemon; one worker *process* per visible GPU (as a server runs one model worker per
GPU), each with `clients` threads, each thread its own `SidecarClient` sending the same
video back to back `requests` times. Frames start on that worker's GPU (`cuda:i`) with
--device cuda, in host memory with --device cpu. Measured for rgb24 and for yuv420p
(converted on the GPU with --device cuda), first with one worker, then with all of them,
so the ratio shows how far the one daemon scales with the node's GPUs.

Each phase: every thread sends warm-up requests for `CONCURRENT_WARMUP_S` (as the e2e
suite's concurrent lanes do: the daemon's encoder processes grow to the traffic, as they
would under a server's steady load), all wait at a barrier shared by all processes, send
their requests, and wait again before the next phase, so no warm-up
overlaps a timed request. Aggregate frames/s = all frames sent / (last thread's end -
first thread's start), from CLOCK_MONOTONIC, which all processes of a host share.

Expected duration with the defaults (1344x768x122, 8 clients, 3 requests, one content):
per launch, ~10 s to spawn the workers (torch, CUDA) and make the frames, then two phases
of clients x requests x 122 frames per worker at the node's frame rate; on a 16-core 2-GPU
host at ~1000 frames/s about 1 minute in all; on a 2-core CPU-only machine with the
defaults, several minutes (use a small --throughput-shape there). Every wait is bounded:
a launch that has not finished within `LAUNCH_TIMEOUT_S` is stopped and reported.
"""

from __future__ import annotations

import functools
import multiprocessing
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any, cast

from .common import (
    CONCURRENT_WARMUP_S,
    Device,
    Row,
    encode_settings,
    parse_shape,
    run_together,
    stop_processes,
    summarise,
)

FORMATS = ("rgb24", "yuv420p")
LAUNCH_TIMEOUT_S = 900.0  # one launch of the workers, both phases; then they are stopped
BARRIER_TIMEOUT_S = 600.0  # the longest any thread waits for the others


@dataclass(frozen=True)
class Job:
    """What one worker process is told."""

    index: int
    device: str  # "cpu" or "cuda"
    gpu: int
    socket: str
    clients: int
    requests: int
    shape: str
    content: str
    options: dict[str, Any]


# Per phase (format): each thread's (start, end, per-request ms).
Timings = dict[str, list[tuple[float, float, list[float]]]]


def worker(job: Job, go: Any, results: Any) -> None:
    """A worker process's entry point (spawned): report timings or why it failed."""
    try:
        results.put((job.index, _work(job, go)))
    except BaseException as exc:
        go.abort()
        results.put((job.index, f"worker {job.index}: {type(exc).__name__}: {exc}"))


def _work(job: Job, go: Any) -> Timings:
    from client import SidecarClient

    device = Device(job.device, job.gpu)
    if device.torch is not None:
        device.torch.cuda.set_device(job.gpu)
    video = device.video(job.shape, job.content)
    device.ready()
    fps = encode_settings()["fps"]
    timings: Timings = {fmt: [] for fmt in FORMATS}
    lock = threading.Lock()

    def thread(k: int) -> None:
        with SidecarClient(job.socket, client_name=f"bench-node-{job.index}-{k}") as c:
            for fmt in FORMATS:
                pixel_format = None if fmt == "rgb24" else fmt
                warm_until = time.perf_counter() + CONCURRENT_WARMUP_S
                while True:  # warm up: the daemon reaches its steady state (processes)
                    c.encode(video, fps=fps, pixel_format=pixel_format, **job.options)
                    if time.perf_counter() >= warm_until:
                        break
                go.wait(BARRIER_TIMEOUT_S)
                times = []
                start = time.perf_counter()
                for _ in range(job.requests):
                    t0 = time.perf_counter()
                    c.encode(video, fps=fps, pixel_format=pixel_format, **job.options)
                    times.append((time.perf_counter() - t0) * 1e3)
                end = time.perf_counter()
                with lock:
                    timings[fmt].append((start, end, times))
                go.wait(BARRIER_TIMEOUT_S)  # no warm-up of the next phase overlaps this one

    run_together([functools.partial(thread, k) for k in range(job.clients)], go)
    return timings


def worker_count(device_kind: str, workers: int) -> tuple[int, int]:
    """(worker processes, GPUs they share): one per visible GPU unless --workers says."""
    if device_kind != "cuda":
        return workers or 2, 0
    import torch

    gpus = torch.cuda.device_count()
    return workers or gpus, gpus


def node(
    device_kind: str,
    workers: int,
    clients: int,
    requests: int,
    shape: str,
    contents: list[str],
    sidecar_options: dict[str, Any],
    daemon_options: dict[str, Any] | None = None,
    idle_s: float = 0.0,
) -> list[Row]:
    """Aggregate frames/s of the node, with one worker and with all of them; with
    `idle_s`, then the daemon's memory after that long idle (`suites.TreeMemory`)."""
    from .daemons import daemon, pool_for
    from .memory import TreeMemory

    workers, gpus = worker_count(device_kind, workers)
    w, h, t = parse_shape(shape)
    ctx = multiprocessing.get_context("spawn")
    everyone = workers * clients
    pool = pool_for(w * h * 3, t, copies=max(2, everyone + 1), clients=everyone)
    options = {**pool, **(daemon_options or {})}
    rows: list[Row] = []
    with daemon(**options) as d:
        from client import SidecarClient

        with SidecarClient(d.socket, prepare=False) as probe:
            limit = probe.status().max_concurrent_encodes
        memory = TreeMemory(d.pid).start()
        for content in contents:
            base: dict[str, float] = {}
            for n in dict.fromkeys([1, workers]):
                jobs = [
                    Job(i, device_kind, i % gpus if gpus else 0, d.socket, clients, requests,
                        shape, content, sidecar_options)
                    for i in range(n)
                ]  # fmt: skip
                timings = _launch(ctx, jobs)
                for fmt in FORMATS:
                    row = _row(fmt, shape, content, jobs, timings, t, limit)
                    fps = row.extra["frames_per_s"]
                    if n == 1:
                        base[fmt] = fps
                    else:
                        row.extra["scaling_vs_1_worker"] = round(fps / base[fmt], 2)
                    rows.append(row)
                    print(
                        f"{content:>6} {shape:>14} {row.variant:<13} workers {n} x {clients} "
                        f"clients: {fps:8.1f} frames/s, median {row.median_ms:.1f} ms/request"
                        + (f", x{row.extra['scaling_vs_1_worker']:.2f} of 1 worker"
                           if n > 1 else ""),
                        flush=True,
                    )  # fmt: skip
        if idle_s > 0:
            rows.append(memory.after_load(idle_s))
    return rows


def _launch(ctx: SpawnContext, jobs: list[Job]) -> list[Timings]:
    """Start one process per job, all released together; their timings, in job order."""
    go = ctx.Barrier(len(jobs) * jobs[0].clients, timeout=BARRIER_TIMEOUT_S)
    results = ctx.Queue()
    procs: list[SpawnProcess] = [
        ctx.Process(target=worker, args=(job, go, results), name=f"bench-node-{job.index}")
        for job in jobs
    ]
    for p in procs:
        p.start()
    got: dict[int, Timings | str] = {}
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        silent: dict[int, int] = {}  # worker -> seconds since it exited without a report
        while len(got) < len(jobs):
            try:
                index, payload = results.get(timeout=1.0)
                got[index] = payload
                continue
            except queue.Empty:
                pass
            for i, p in enumerate(procs):
                if p.exitcode is not None and i not in got:
                    silent[i] = silent.get(i, 0) + 1
            # A report may still be in the pipe when its process has just exited.
            dead = [procs[i] for i, waited in silent.items() if waited > 2 and i not in got]
            if dead:
                go.abort()
                raise RuntimeError(f"{dead[0].name} exited with status {dead[0].exitcode}")
            if time.monotonic() > deadline:
                go.abort()
                raise RuntimeError(f"the node run did not finish within {LAUNCH_TIMEOUT_S:.0f}s")
        failures = [v for v in got.values() if isinstance(v, str)]
        if failures:
            raise RuntimeError("; ".join(failures))
    finally:
        stop_processes(procs, 30, None)
        results.close()
    return [cast(Timings, got[j.index]) for j in jobs]


def _row(
    fmt: str,
    shape: str,
    content: str,
    jobs: list[Job],
    timings: list[Timings],
    frames: int,
    limit: int,
) -> Row:
    spans = [s for worker_timings in timings for s in worker_timings[fmt]]
    times = [ms for _, _, per_request in spans for ms in per_request]
    wall_s = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    sent = len(times) * frames
    row = summarise(f"node_{fmt}", shape, times)
    row.suite, row.content = "node", content
    row.extra = {
        "workers": len(jobs),
        "clients_per_worker": jobs[0].clients,
        "requests_per_client": jobs[0].requests,
        "devices": [f"cuda:{j.gpu}" if j.device == "cuda" else "cpu" for j in jobs],
        "frames": sent,
        "wall_s": round(wall_s, 3),
        "frames_per_s": round(sent / wall_s, 1),
        "p90_ms": round(statistics.quantiles(times, n=10)[-1], 1) if len(times) > 1 else None,
        "daemon_max_concurrent_encodes": limit,
    }
    return row
