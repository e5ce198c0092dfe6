"""Soak: many mixed requests from many clients, and lease churn, with nothing leaked.

The 100k-cycle churn is marked `slow` (run with `-m slow`); CI runs 10k. Set
VIDEO_SIDECAR_SOAK_REPORT=FILE to write the figures as JSON.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

import pytest

from client.patterns import moving_pattern

from .helpers import Daemon, decode

SHAPES = [(1, 64, 64), (4, 256, 448), (8, 144, 256), (16, 256, 448), (24, 144, 256), (2, 384, 672)]


def private_rss_mib(pid: int) -> float:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    kib = sum(int(fields[k].split()[0]) for k in ("RssAnon", "RssFile") if k in fields)
    return kib / 1024


def report(name: str, figures: dict[str, object]) -> None:
    print(f"\n{name}: {figures}")
    target = os.environ.get("VIDEO_SIDECAR_SOAK_REPORT")
    if target:
        path = Path(target)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = figures
        path.write_text(json.dumps(data, indent=2) + "\n")


def test_mixed_requests_from_16_clients(make_daemon, connect, twin: str) -> None:
    d = make_daemon(slabs=8, slab_size="16MiB", max_concurrent_encodes=4)
    videos = {shape: moving_pattern(*shape) for shape in SHAPES}
    per_client, clients = 63, 16  # 1008 requests
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    rss_before = private_rss_mib(d.pid)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with connect(d) as c:
            for i in range(per_client):
                shape = rng.choice(SHAPES)
                video = videos[shape]
                kind = rng.random()
                t0 = time.perf_counter()
                try:
                    if kind < 0.1:
                        with c.stream(fps=24) as s:
                            for first in range(0, len(video), 4):
                                s.write(video[first : first + 4])
                        result = s.result
                    elif kind < 0.2:
                        result = c.encode(video, path=f"soak/{seed}-{i}.mp4")
                    elif kind < 0.3:
                        result = c.encode(video, container="fmp4")
                    else:
                        result = c.encode(video)
                    assert result is not None and result.frames == len(video)
                except BaseException as exc:
                    with lock:
                        failures.append(exc)
                    return
                with lock:
                    latencies.append((time.perf_counter() - t0) * 1e3)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    assert not failures, failures[:3]
    assert len(latencies) == per_client * clients
    with d.client() as c:
        status = c.status()
        frames, _ = decode(c.encode(videos[SHAPES[1]]).data or b"")
    assert len(frames) == SHAPES[1][0]
    assert status.pool["active_leases"] == 0 and status.active_encodes == 0
    assert status.counters["encodes_failed"] == 0
    quantiles = statistics.quantiles(latencies, n=100)
    report(
        "mixed_requests" if twin == "sync" else f"mixed_requests_{twin}",
        {
            "requests": len(latencies),
            "clients": clients,
            "failures": 0,
            "seconds": round(elapsed, 1),
            "p50_ms": round(statistics.median(latencies), 1),
            "p99_ms": round(quantiles[98], 1),
            "rss_before_mib": round(rss_before, 1),
            "rss_after_mib": round(private_rss_mib(d.pid), 1),
        },
    )


def churn(d: Daemon, cycles: int) -> None:
    with d.client() as c:
        c.attach()
        sizes = [4096, 65536, 1 << 20, 3 << 20]
        for i in range(1000):
            c.release(c.lease(sizes[i % 4]))
        rss_start = private_rss_mib(d.pid)
        times = []
        for i in range(cycles):
            t0 = time.perf_counter()
            c.release(c.lease(sizes[i % 4]))
            times.append((time.perf_counter() - t0) * 1e3)
        rss_end = private_rss_mib(d.pid)
        status = c.status()
    assert status.pool["active_leases"] == 0
    assert rss_end - rss_start < 8, (rss_start, rss_end)  # no growth with the cycles
    quantiles = statistics.quantiles(times, n=100)
    report(
        f"lease_release_{cycles}",
        {
            "cycles": cycles,
            "p50_ms": round(statistics.median(times), 3),
            "p99_ms": round(quantiles[98], 3),
            "rss_start_mib": round(rss_start, 1),
            "rss_end_mib": round(rss_end, 1),
        },
    )


def test_lease_release_churn(make_daemon) -> None:
    churn(make_daemon(), 10_000)


@pytest.mark.slow
def test_lease_release_churn_100k(make_daemon) -> None:
    churn(make_daemon(), 100_000)
