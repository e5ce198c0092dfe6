"""Where the client's own time goes: small clips back to back, under cProfile.

    python -m bench.client_profile [--device cpu|cuda] [--shape 448x256x4] [--calls 300]
    python -m bench.client_profile --device cuda --calls 0 --clients 8 [--processes]

Starts a daemon with default settings, sends `--calls` back-to-back `encode()` calls of
one clip per pixel format, and prints the median time outside the daemon (total minus the
daemon's own time; the copy into the lease is part of it) and the functions that took it.
cProfile slows the client itself, so the medians are above the bench's.

`--clients N` then measures what a worker process pays in CPU for its clients' requests,
with no profiler: one client back to back, then N clients of the process (one thread
each) in waves of N requests at once, then back to back. Per request: the wall time, the
copy (`copy_ms`), and the process's CPU time (user and system, all its threads) over the
requests it sent. Threads of one process share its GIL, so what each request spends in
Python and in the calls that let go of the GIL and take it back is paid N times over in a
wave. Each line also gives the daemon's own time (`daemon_ms`), so that what a wave costs
in the worker process is told from what it costs in the daemon.

`--processes` then sends the same as N processes of one client each (spawned; each makes
its own frames), back to back and in waves: the same load on the daemon without a GIL
shared between the clients. The process's CPU is not measured there.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import pstats
import queue
import resource
import statistics
import threading
import time
from typing import Any

from client import SidecarClient
from client.patterns import moving_pattern

from .common import parse_shape, stop_processes
from .daemons import daemon


def profile(client: SidecarClient, video: Any, fmt: str | None, calls: int, sync: Any) -> None:
    for _ in range(50):  # warm: the processes, the spare lease, the ready encoders
        client.encode(video, pixel_format=fmt)
    outside, copies = [], []
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        result = client.encode(video, pixel_format=fmt)
        outside.append((time.perf_counter() - t0) * 1e3 - result.timings.daemon_ms)
        copies.append(result.timings.copy_ms)
    profiler.disable()
    print(
        f"{fmt or 'default'}: outside the daemon {statistics.median(outside):.3f} ms "
        f"(copy {statistics.median(copies):.3f} ms), median of {calls}"
    )
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def _process_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1e3


def clients_cpu(socket: str, video: Any, clients: int, rounds: int = 20) -> None:
    """One client back to back, then `clients` clients in waves and back to back."""
    with SidecarClient(socket) as one:
        one.warm_up()
        for _ in range(30):
            one.encode(video)
        _report("1 client, back to back", [one], video, rounds * clients, None)
    many = [SidecarClient(socket) for _ in range(clients)]
    try:
        for c in many:
            c.warm_up()
        _report(f"{clients} clients, back to back", many, video, rounds, None)  # warms
        _report(f"{clients} clients, back to back", many, video, rounds, None)
        _report(f"{clients} clients, waves", many, video, rounds, threading.Barrier(clients))
    finally:
        for c in many:
            c.close()


def _report(label: str, clients: list[SidecarClient], video: Any, rounds: int, wave: Any) -> None:
    rows: list[tuple[float, float, float]] = []
    lock = threading.Lock()

    def send(client: SidecarClient) -> None:
        mine = _send(client, video, rounds, wave)
        with lock:
            rows.extend(mine)

    threads = [threading.Thread(target=send, args=(c,)) for c in clients]
    cpu0 = _process_cpu_ms()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = (_process_cpu_ms() - cpu0) / len(rows)
    print(f"{label}: {_medians(rows)}, the process's CPU {cpu:.2f} ms a request "
          f"(medians of {len(rows)})")  # fmt: skip


def _send(client: Any, video: Any, rounds: int, wave: Any) -> list[tuple[float, float, float]]:
    """(wall, copy, daemon) ms of `rounds` requests, each after `wave` (a barrier) if any."""
    rows = []
    for _ in range(rounds):
        if wave is not None:
            wave.wait()
        t0 = time.perf_counter()
        result = client.encode(video)
        wall = (time.perf_counter() - t0) * 1e3
        rows.append((wall, result.timings.copy_ms, result.timings.daemon_ms))
    return rows


def _medians(rows: list[tuple[float, float, float]]) -> str:
    wall, copy, in_daemon = (statistics.median(column) for column in zip(*rows, strict=True))
    return f"wall {wall:.2f} ms, copy {copy:.2f} ms, daemon {in_daemon:.2f} ms"


def clients_as_processes(socket: str, device: str, shape: str, clients: int, rounds: int) -> None:
    """`clients` processes of one client each, back to back, then in waves."""
    ctx = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    for label, waves in (("back to back", False), ("waves", True)):
        # The barrier goes to each process as it starts (it cannot travel later); the
        # first wait is every process ready, so none times its own start-up.
        barrier, results = ctx.Barrier(clients), ctx.Queue()
        args = (socket, device, shape, rounds, barrier, waves, results)
        procs = [ctx.Process(target=_one_process, args=args) for _ in range(clients)]
        for proc in procs:
            proc.start()
        rows = [row for _ in procs for row in _next_result(results, procs)]
        for proc in procs:
            proc.join()
        print(f"{clients} processes, {label}: {_medians(rows)} (medians of {len(rows)})")


def _next_result(results: Any, procs: list[Any]) -> list[tuple[float, float, float]]:
    """The next process's rows; an error, not a wait without end, if one of them died."""
    while True:
        try:
            rows: list[tuple[float, float, float]] = results.get(timeout=1.0)
            return rows
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                stop_processes(procs, 0, 5)
                raise RuntimeError(f"a client process failed (exit codes {failed})") from None


def _one_process(
    socket: str, device: str, shape: str, rounds: int, barrier: Any, waves: bool, results: Any
) -> None:
    video = _video(device, shape)
    with SidecarClient(socket) as client:
        client.warm_up()
        for _ in range(10):
            client.encode(video)
        barrier.wait()
        results.put(_send(client, video, rounds, barrier if waves else None))


def _video(device: str, shape: str) -> Any:
    width, height, frames = parse_shape(shape)
    video: Any = moving_pattern(frames, height, width)
    if device == "cuda":
        import torch

        video = torch.from_numpy(video).cuda()
    return video


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shape", default="448x256x4")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--clients", type=int, default=0, help="then N clients' CPU cost")
    parser.add_argument("--rounds", type=int, default=20, help="--clients: requests each")
    parser.add_argument("--processes", action="store_true", help="--clients: as processes too")
    args = parser.parse_args(argv)
    video = _video(args.device, args.shape)
    sync: Any = lambda: None  # noqa: E731
    formats: list[str | None] = [None]
    if args.device == "cuda":
        import torch

        sync = torch.cuda.synchronize
        formats.append("rgb24")  # the default for a CUDA tensor is yuv420p
    with daemon() as d, SidecarClient(d.socket) as client:
        for fmt in formats if args.calls else []:
            profile(client, video, fmt, args.calls, sync)
        if args.clients:
            clients_cpu(d.socket, video, args.clients, args.rounds)
        if args.clients and args.processes:
            clients_as_processes(d.socket, args.device, args.shape, args.clients, args.rounds)


if __name__ == "__main__":
    main()
