"""Cold paths: what a worker process pays before it is warm, against upstream A.

    python -m bench.cold --device cuda --json cold.json
    python -m bench.cold --device cpu --workers 2 --idle 5        # a short run anywhere

A generation server scales by starting workers, so a worker's first request is a real
request. On a daemon already running (its own pool, default settings), each case starts
fresh worker processes, one after another, and records:

- `first_no_warm_up`: a worker that never calls `warm_up()`: its first `encode()` of a
  448x256x4 clip (uint8, on the GPU with --device cuda), its second, and its steady median;
  `upstream_a`'s first and steady in a fresh process of its own, at the same settings;
- `warm_up`: a worker that calls `warm_up()` first: how long that took, then its first
  encode against its steady median (the first worker on a host fills Triton's disk cache:
  its figures are kept apart from the later ones');
- `burst_after_idle`: eight clients in one fresh process, each its own `SidecarClient`
  never warmed up, idle `--idle` seconds (the daemon idle too), then `--waves` waves of one
  request each, all eight at once; then the steady 8-client median (each back to back);
  then `--waves` warm waves, as the first ones but with nothing left to warm. A wave sends
  eight requests at the same instant, which steady clients (each at its own phase) never
  do: the warm waves are what a wave costs when nothing is cold, so later waves against
  them show any cost left in line, and against the steady median what a wave's
  synchronised start costs besides. The same for upstream A in a fresh process (8
  threads).

Every figure is a wall time in ms, the encode at the daemon's profile (`--profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from .common import PROFILE_ENV, parse_shape, write_run

SHAPE = "448x256x4"
STEADY = 20


def _video(device: str, shape: str) -> Any:
    from client.patterns import moving_pattern

    w, h, t = parse_shape(shape)
    frames = moving_pattern(t, h, w)
    if device != "cuda":
        return frames
    import torch

    video = torch.from_numpy(frames).cuda()
    torch.cuda.synchronize()
    return video


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _upstream(device: str) -> Any:
    from .common import Device
    from .variants import UpstreamA

    return UpstreamA(Device(device))


# -- what a fresh worker process runs (`--role`) ---------------------------------------------


def worker(role: str, socket: str, device: str, shape: str, idle: float, waves: int) -> dict:
    video = _video(device, shape)  # the frames exist (and CUDA is up) before any timer
    if role == "upstream_first":
        way = _upstream(device)
        first = _timed(lambda: way.run(video, shape))
        steady = [_timed(lambda: way.run(video, shape)) for _ in range(STEADY)]
        return {"first_ms": first, "steady_ms": statistics.median(steady)}
    if role in ("burst", "upstream_burst"):
        return _burst(role, socket, device, video, shape, idle, waves)
    from client import SidecarClient

    with SidecarClient(socket) as client:
        out: dict[str, Any] = {}
        if role == "warm_up":
            out["warm_up_ms"] = _timed(client.warm_up)
        out["first_ms"] = _timed(lambda: client.encode(video))
        out["second_ms"] = _timed(lambda: client.encode(video))
        out["steady_ms"] = statistics.median(
            _timed(lambda: client.encode(video)) for _ in range(STEADY)
        )
        return out


def _burst(
    role: str, socket: str, device: str, video: Any, shape: str, idle: float, waves: int
) -> dict:
    clients: list[Any] = []
    lock = threading.Lock()
    stages: list[list[dict[str, float]]] = []  # each wave's requests' stage timings

    def encode(c: Any) -> None:
        timings = c.encode(video).timings.as_dict()
        with lock:
            stages[-1].append({k: v for k, v in timings.items() if isinstance(v, float)})

    where = ""  # the client package the burst ran (`bench.client_ab` checks it)
    if role == "burst":
        import client
        from client import SidecarClient

        where = os.path.dirname(client.__file__)
        clients = [SidecarClient(socket) for _ in range(8)]
        send = [lambda c=c: encode(c) for c in clients]
    else:
        ways = [_upstream(device) for _ in range(8)]
        send = [lambda w=w: w.run(video, shape) for w in ways]
    time.sleep(idle)
    wave_ms = []
    for _ in range(waves):
        stages.append([])
        wave_ms.append(_together(send))
    stages.append([])  # the steady requests'
    steady: list[float] = []

    def back_to_back(fn: Any) -> None:
        times = [_timed(fn) for _ in range(STEADY)]
        with lock:
            steady.extend(times)

    threads = [threading.Thread(target=back_to_back, args=(fn,)) for fn in send]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    warm_ms = []
    for _ in range(waves):
        stages.append([])
        warm_ms.append(_together(send))
    for c in clients:
        c.close()
    medians = [
        {k: round(statistics.median(t[k] for t in wave), 2) for k in wave[0]} if wave else {}
        for wave in stages
    ]
    return {
        "waves_ms": wave_ms,
        "steady_ms": statistics.median(steady),
        "warm_waves_ms": warm_ms,
        "stages_ms": medians,
        "client": where,
    }


def _together(send: list[Any]) -> float:
    """Every client's one request at once; the median of their times."""
    times: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(len(send))

    def one(fn: Any) -> None:
        go.wait()
        ms = _timed(fn)
        with lock:
            times.append(ms)

    threads = [threading.Thread(target=one, args=(fn,)) for fn in send]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(times)


# -- the run ---------------------------------------------------------------------------------


def _fresh(role: str, socket: str, args: argparse.Namespace) -> dict:
    """`role` in a fresh worker process; what it measured."""
    command = [sys.executable, "-m", "bench.cold", "--role", role, "--socket", socket,
               "--device", args.device, "--shape", args.shape, "--idle", str(args.idle),
               "--waves", str(args.waves)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{role} failed:\n{out.stderr[-3000:]}")
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(args: argparse.Namespace) -> dict:
    from .daemons import daemon

    results: dict[str, Any] = {}
    with daemon() as process:
        socket = process.socket
        results["first_no_warm_up"] = [_fresh("first", socket, args) for _ in range(args.workers)]
        results["upstream_first"] = [
            _fresh("upstream_first", socket, args) for _ in range(args.workers)
        ]
        results["warm_up"] = [_fresh("warm_up", socket, args) for _ in range(args.workers)]
        results["burst_after_idle"] = _fresh("burst", socket, args)
        results["upstream_burst_after_idle"] = _fresh("upstream_burst", socket, args)
    return results


def summary(results: dict) -> str:
    med = statistics.median
    firsts = results["first_no_warm_up"]
    up = results["upstream_first"]
    warm = results["warm_up"]
    burst, up_burst = results["burst_after_idle"], results["upstream_burst_after_idle"]
    later = warm[1:] or warm
    lines = [
        "| case | sidecar | upstream A |",
        "| --- | ---: | ---: |",
        f"| first encode, no warm_up (median of {len(firsts)} fresh workers) | "
        f"{med(r['first_ms'] for r in firsts):.1f} ms | {med(r['first_ms'] for r in up):.1f} ms |",
        f"| its second encode | {med(r['second_ms'] for r in firsts):.1f} ms | |",
        f"| steady | {med(r['steady_ms'] for r in firsts):.1f} ms | "
        f"{med(r['steady_ms'] for r in up):.1f} ms |",
        f"| warm_up(), first worker on the host | {warm[0]['warm_up_ms']:.0f} ms | |",
        f"| warm_up(), later workers (max) | {max(r['warm_up_ms'] for r in later):.0f} ms | |",
        f"| first encode after warm_up / steady (later workers, max) | "
        f"{max(r['first_ms'] / r['steady_ms'] for r in later):.2f}x | |",
        f"| 8 fresh clients after idle: first wave median | {burst['waves_ms'][0]:.1f} ms | "
        f"{up_burst['waves_ms'][0]:.1f} ms |",
        f"| later waves / steady 8-client (max) | "
        f"{max(w / burst['steady_ms'] for w in burst['waves_ms'][1:]):.2f}x | "
        f"{max(w / up_burst['steady_ms'] for w in up_burst['waves_ms'][1:]):.2f}x |",
        f"| steady 8-client median | {burst['steady_ms']:.1f} ms | "
        f"{up_burst['steady_ms']:.1f} ms |",
    ]
    if burst.get("warm_waves_ms") and up_burst.get("warm_waves_ms"):
        warm, up_warm = med(burst["warm_waves_ms"]), med(up_burst["warm_waves_ms"])
        lines += [
            f"| warm waves after the steady requests (median) | {warm:.1f} ms | {up_warm:.1f} ms |",
            f"| later waves / warm waves (max) | "
            f"{max(w / warm for w in burst['waves_ms'][1:]):.2f}x | "
            f"{max(w / up_warm for w in up_burst['waves_ms'][1:]):.2f}x |",
        ]
    stages = burst.get("stages_ms") or []
    if stages and stages[0]:
        names = [k for k in stages[0] if any(wave.get(k, 0) >= 0.5 for wave in stages)]
        lines += ["", "The burst's stages, median per wave (ms; `steady`: the steady requests,",
                  "`warm`: the warm waves):",
                  "", "| wave | " + " | ".join(n.removesuffix("_ms") for n in names) + " |",
                  "| --- |" + " ---: |" * len(names)]  # fmt: skip
        waves = len(burst["waves_ms"])
        for i, wave in enumerate(stages):
            label = str(i + 1) if i < waves else "steady" if i == waves else f"warm {i - waves}"
            cells = " | ".join(f"{wave.get(n, 0):.1f}" for n in names)
            lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cold", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--shape", default=SHAPE)
    p.add_argument("--workers", type=int, default=4, help="fresh workers per case")
    p.add_argument("--idle", type=float, default=40.0, help="seconds idle before the bursts")
    p.add_argument("--waves", type=int, default=4)
    p.add_argument("--profile", default=None, help="the daemon's profile (default: balanced)")
    p.add_argument("--json", default="")
    p.add_argument("--role", default="", help=argparse.SUPPRESS)
    p.add_argument("--socket", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.profile:
        os.environ[PROFILE_ENV] = args.profile
    if args.role:
        print(json.dumps(worker(args.role, args.socket, args.device, args.shape, args.idle,
                                args.waves)))  # fmt: skip
        return 0
    results = run(args)
    print(summary(results))
    if args.json:
        write_run(args.json, "bench.cold", argv or sys.argv[1:], args.device, {"results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
