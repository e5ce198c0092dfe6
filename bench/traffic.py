"""The traffic suite: what a generation server sends under contention, and what fails.

python -m bench --suite traffic --device cuda --json traffic.json
python -m bench --suite traffic --idle 5 --requests 4 --json traffic.json  # a short cpu run

Each pattern runs against a fresh daemon started here, then the same way through
upstream_a (`variants.UpstreamA`, in the same threads and processes), side by side:

1. `mixed_default_pool`: `clients` clients spread over `workers` worker processes (each
   thread its own `SidecarClient`), each sending back to back `requests` requests of a mix:
   small clips (448x256x4, 672x384x4) and long videos (1344x768x122 and 1344x768x362 on
   cuda; 448x256x48 and 448x256x96 on cpu), each as a whole-video `encode` and as a stream
   of `CHUNK`-frame writes. Client k starts at kind k of the mix and takes the next one for
   each request, so every kind is sent by several clients at once. The daemon's own pool.
2. `mixed_small_pool`: the same on a small pool (`--small-pool`; 4x8MiB on cpu, 4x64MiB on
   cuda), where requests wait for leases.
3. `steady_long_default_pool` and `steady_long_large_pool`: every client sends the
   reference video (1344x768x122 on cuda, 448x256x48 on cpu) whole, back to back, on the
   daemon's own pool and on one with room for all of them at once (`LARGE_POOL`): what
   waiting for memory costs when every request wants the same.
4. `bursts_after_idle`: `BURST_CLIENTS` clients of 448x256x4 encodes: a steady phase (each
   client back to back), then every client and the daemon idle `idle_s` seconds, then
   `waves` waves back to back (every client sends one request at once; the next wave when
   all have answered). The first wave's median and each later one's against the steady
   median, and against upstream_a's first wave.
5. `first_after_start`: one client on a daemon just started (health answering): its first
   request of each of `FIRST_SHAPES`, then `STEADY_REQUESTS` more of each; the first
   against the steady median.

On cuda the inputs are CUDA tensors: uint8 for the small clips, bf16 in [-1, 1] with
`value_range=(-1, 1)` for the long videos, as a diffusion VAE gives them (upstream_a
converts those to uint8 on the GPU first, inside its timed request; it has no streams, so
a stream request is the whole video through path A for it). On cpu, numpy uint8 arrays.

Every request counts: one that raises is a failed request (its error text kept), never
the end of the run. Requests have a deadline (`--request-timeout`, 120 s); no request
starts after `PHASE_BUDGET_S` in one phase (those are counted as skipped); a phase's
processes that have not reported within its limit are stopped and their missing requests
counted as failed. Recorded per pattern and variant: requests, failed (and the first error),
skipped, p50 and p99 latency of the requests that succeeded, those against upstream_a's,
the client's lease time (`Timings.lease_ms`: waiting for and granting leases), output bytes,
PSNR of worker 0's first output of each kind, and the same per kind; and every request.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import queue
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import numpy as np

from .common import Device, Row, encode_settings

SMALL_SHAPES = ("448x256x4", "672x384x4")
LONG_SHAPES = {"cuda": ("1344x768x122", "1344x768x362"), "cpu": ("448x256x48", "448x256x96")}
MODES = ("encode", "stream")
CHUNK = 16  # frames per stream write
SMALL_POOL = {"cuda": "4x64MiB", "cpu": "4x8MiB"}
BURST_SHAPE = "448x256x4"
BURST_CLIENTS = 8
STEADY_REQUESTS = 5  # per client, in the bursts pattern's steady phase
WAVES = 5
REQUEST_TIMEOUT_S = 120.0
PHASE_BUDGET_S = 600.0  # no request starts later than this into a phase (idle not counted)
LAUNCH_S = 180.0  # spawning a phase's workers and making their frames, at most
PSNR_FRAMES = 24  # frames compared per sampled output, evenly spaced
FPS = encode_settings()["fps"]
SIDES = ("sidecar", "upstream_a")
PATTERNS = (
    "mixed_default_pool",
    "mixed_small_pool",
    "steady_long_default_pool",
    "steady_long_large_pool",
    "bursts_after_idle",
    "first_after_start",
)
# The steady patterns: the reference video, whole, back to back from every client.
STEADY_SHAPE = {"cuda": "1344x768x122", "cpu": "448x256x48"}
LARGE_POOL = {"cuda": "64x64MiB", "cpu": "32x8MiB"}  # room for every client's video at once
FIRST_SHAPES = {"cuda": ("448x256x4", "1344x768x122"), "cpu": ("448x256x4", "448x256x48")}


def default_clients(device_kind: str) -> int:
    return 8 if device_kind == "cuda" else 4


def kinds_for(device_kind: str) -> list[tuple[str, str]]:
    """The mix: (shape, mode) pairs, small clips first."""
    shapes = [*SMALL_SHAPES, *LONG_SHAPES[device_kind]]
    return [(shape, mode) for shape in shapes for mode in MODES]


def parse_pool(text: str) -> dict[str, Any]:
    """'4x8MiB' -> the daemon's --slabs and --slab-size."""
    slabs, sep, size = text.partition("x")
    if not sep or not slabs.isdigit() or int(slabs) < 1 or not size:
        raise SystemExit(f"--small-pool: SLABSxSIZE, e.g. 4x8MiB (got {text!r})")
    return {"slabs": int(slabs), "slab_size": size}


def is_long(shape: str) -> bool:
    return shape not in SMALL_SHAPES and shape != BURST_SHAPE


# -- what the workers are told, and do ------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a client's plan: send a request, wait for the others, or idle."""

    action: str  # "send", "sync" or "idle"
    stage: str = ""  # send: "warmup" (not counted), "load", "steady", "wave1", ...
    shape: str = ""
    mode: str = ""
    seconds: float = 0.0  # idle


@dataclass(frozen=True)
class Phase:
    """What one worker process is told: one variant, one pattern."""

    index: int
    side: str  # "sidecar" or "upstream_a"
    device: str  # "cpu" or "cuda"
    gpu: int
    socket: str
    content: str
    plans: tuple[tuple[Step, ...], ...]  # one per client thread of this worker
    first_client: int  # the global number of this worker's first client
    timeout_s: float
    budget_s: float


def mixed_plan(client: int, kinds: list[tuple[str, str]], requests: int) -> tuple[Step, ...]:
    """A warm-up small clip, then `requests` requests of the mix, from kind `client` on."""
    warm = Step("send", "warmup", SMALL_SHAPES[0], "encode")
    load = [kinds[(client + i) % len(kinds)] for i in range(requests)]
    return (warm, Step("sync"), *(Step("send", "load", s, m) for s, m in load))


def steady_plan(shape: str, requests: int) -> tuple[Step, ...]:
    """A warm-up, then `requests` whole videos of `shape` back to back."""
    warm = Step("send", "warmup", shape, "encode")
    return (warm, Step("sync"), *(Step("send", "load", shape, "encode"),) * requests)


def first_plan(shapes: tuple[str, ...], steady: int) -> tuple[Step, ...]:
    """Each shape's first request on a fresh daemon, then `steady` more of it."""
    steps: list[Step] = []
    for shape in shapes:
        steps += [Step("send", "first", shape, "encode")]
        steps += [Step("send", "steady", shape, "encode")] * steady
    return tuple(steps)


def burst_plan(steady: int, idle_s: float, waves: int) -> tuple[Step, ...]:
    steps = [Step("send", "warmup", BURST_SHAPE, "encode"), Step("sync")]
    steps += [Step("send", "steady", BURST_SHAPE, "encode")] * steady
    steps += [Step("sync"), Step("idle", seconds=idle_s)]
    for w in range(waves):
        steps += [Step("sync"), Step("send", f"wave{w + 1}", BURST_SHAPE, "encode")]
    return tuple(steps)


def _text(exc: BaseException) -> str:
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
        results.put(("failed", phase.index, f"worker {phase.index}: {_text(exc)}"))


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
            from .variants import UpstreamA

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
            record(step, 0.0, f"client: {_text(exc)}")
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
                    note(f"barrier: {_text(exc) or type(exc).__name__}")
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
                record(step, (time.perf_counter() - t0) * 1e3, _text(exc) or "error")
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


# -- running a phase -------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a phase's workers reported."""

    records: list[dict[str, Any]] = field(default_factory=list)
    psnr: dict[str, float | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def run_phase(ctx: SpawnContext, phases: list[Phase], limit_s: float) -> Outcome:
    """Start one process per phase, collect their records; stop them after `limit_s`."""
    out = Outcome()
    go = ctx.Barrier(sum(len(p.plans) for p in phases))
    results = ctx.Queue()
    procs: list[SpawnProcess] = [
        ctx.Process(target=worker, args=(p, go, results), name=f"bench-traffic-{p.index}")
        for p in phases
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    done: set[int] = set()
    silent: dict[int, int] = {}
    try:
        while len(done) < len(procs):
            try:
                msg = results.get(timeout=1.0)
            except queue.Empty:
                for i, p in enumerate(procs):
                    if p.exitcode is not None and i not in done:
                        silent[i] = silent.get(i, 0) + 1
                        if silent[i] > 3:  # its last words may still be in the pipe
                            out.problems.append(f"worker {i} exited with status {p.exitcode}")
                            done.add(i)
                if time.monotonic() - t0 > limit_s and len(done) < len(procs):
                    out.problems.append(
                        f"workers {sorted(set(range(len(procs))) - done)} did not finish "
                        f"within {limit_s:.0f} s and were stopped"
                    )
                    break
                continue
            if msg[0] == "rec":
                out.records.append(msg[2])
            elif msg[0] == "done":
                done.add(msg[1])
                for kind, value in msg[2].items():
                    out.psnr.setdefault(kind, value)
                out.problems += msg[3]
            else:
                done.add(msg[1])
                out.problems.append(msg[2])
    finally:
        out.wall_s = time.monotonic() - t0
        with contextlib.suppress(Exception):
            go.abort()
        for p in procs:
            p.join(timeout=5)
            if p.exitcode is None:
                p.terminate()
                p.join(timeout=10)
            if p.exitcode is None:
                p.kill()
                p.join()
        results.close()
    return out


def _split(total: int, parts: int) -> list[int]:
    """`total` clients over `parts` processes, as evenly as can be."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _phases(
    side: str,
    device_kind: str,
    gpus: int,
    socket: str,
    content: str,
    plans: list[tuple[Step, ...]],
    workers: int,
    timeout_s: float,
    budget_s: float,
) -> list[Phase]:
    phases, first = [], 0
    for i, n in enumerate(_split(len(plans), min(workers, len(plans)))):
        phases.append(
            Phase(i, side, device_kind, i % gpus if gpus else 0, socket, content,
                  tuple(plans[first : first + n]), first, timeout_s, budget_s)
        )  # fmt: skip
        first += n
    return phases


def _run(
    ctx: SpawnContext, limit_s: float, phases: Callable[..., list[Phase]], socket: str
) -> Outcome:
    return run_phase(ctx, phases(socket=socket), limit_s)


def _on_daemon(
    pool: dict[str, Any], daemon_options: dict[str, Any], run: Callable[[str], Outcome]
) -> tuple[Outcome, dict[str, Any], list[str]]:
    """`run(socket)` against a fresh daemon: (what it gave, facts of the daemon, problems).
    Whatever goes wrong starting or stopping the daemon is a problem noted, never raised;
    the requests it kept from running are counted as failed by the caller."""
    from client import SidecarClient

    from .suites import daemon

    facts: dict[str, Any] = {}
    problems: list[str] = []
    out: Outcome | None = None
    try:
        with daemon(**pool, **daemon_options) as d:
            try:
                with SidecarClient(d.socket, timeout=10) as probe:
                    att = probe.attach()
                facts["pool"] = f"{len(att.slabs)}x{att.slabs[0].size // 2**20}MiB"
                facts["max_lease_wait_s"] = att.max_lease_wait
            except Exception as exc:
                problems.append(f"daemon attach before the phase: {_text(exc)}")
            out = run(d.socket)
            try:
                with SidecarClient(d.socket, timeout=10) as probe:
                    status = probe.status()
                facts["daemon_errors"] = dict(status.counters.get("errors", {}))
                facts["daemon_max_concurrent_encodes"] = status.max_concurrent_encodes
            except Exception as exc:
                problems.append(f"daemon status after the phase: {_text(exc)}")
            if not d.running():
                problems.append(f"the daemon exited (status {d.stop()})")
    except Exception as exc:
        problems.append(f"daemon: {_text(exc)}")
    return out or Outcome(), facts, problems


# -- summaries -------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, latency and lease time of the given requests (the measured ones)."""
    ok = [r for r in records if r["ok"]]
    skipped = [r for r in records if r["error"] == "skipped"]
    failed = [r for r in records if not r["ok"] and r["error"] != "skipped"]
    ms = [r["ms"] for r in ok]
    lease = [r["lease_ms"] for r in ok]
    queued = [r["queue_ms"] for r in ok]
    errors = Counter(r["error"].split(":", 1)[0] for r in failed)
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(failed),
        "skipped": len(skipped),
        "first_error": failed[0]["error"] if failed else "",
        "errors": dict(errors),
        "failed_after_ms_p50": _pct([r["ms"] for r in failed], 50),
        "p50_ms": _pct(ms, 50),
        "p99_ms": _pct(ms, 99),
        "lease_ms": {"p50": _pct(lease, 50), "p99": _pct(lease, 99),
                     "max": round(max(lease), 3) if lease else None,
                     "share_of_time": round(sum(lease) / sum(ms), 4) if ms else None},
        "daemon_queue_ms": {"p50": _pct(queued, 50), "p99": _pct(queued, 99)},
        "output_bytes_median": int(statistics.median(r["bytes"] for r in ok)) if ok else None,
    }  # fmt: skip


def _missing(
    expected: list[tuple[str, str, str]], got: list[dict[str, Any]], why: str
) -> list[dict[str, Any]]:
    """Records for the requests that never reported (their worker was stopped or died)."""
    left = Counter(expected)
    left.subtract(Counter((r["stage"], r["shape"], r["mode"]) for r in got))
    return [
        {"worker": -1, "client": -1, "stage": stage, "shape": shape, "mode": mode, "ok": False,
         "ms": 0.0, "lease_ms": 0.0, "queue_ms": 0.0, "bytes": 0, "error": f"no answer: {why}"}
        for (stage, shape, mode), n in left.items() for _ in range(max(0, n))
    ]  # fmt: skip


def _row(
    pattern: str,
    side: str,
    shape: str,
    plans: list[tuple[Step, ...]],
    out: Outcome,
    facts: dict[str, Any],
    workers: int,
) -> Row:
    expected = [(s.stage, s.shape, s.mode) for plan in plans for s in plan if s.action == "send"]
    why = "; ".join(out.problems) or "the worker did not report it"
    records = out.records + _missing(expected, out.records, why)
    measured = [r for r in records if r["stage"] != "warmup"]
    warmups = [r for r in records if r["stage"] == "warmup"]
    stats = _stats(measured)
    # The row's median: of the load; for the bursts, of the first wave after the idle.
    head = {"bursts_after_idle": "wave1", "first_after_start": "first"}.get(pattern, "load")
    times = [r["ms"] for r in measured if r["stage"] == head and r["ok"]]
    median = statistics.median(times) if times else math.nan
    row = Row(
        variant=side, shape=shape, median_ms=round(median, 3),
        min_ms=round(min(times), 3) if times else math.nan,
        max_ms=round(max(times), 3) if times else math.nan,
        samples=len(times), suite="traffic",
    )  # fmt: skip
    order = list(dict.fromkeys((s.shape, s.mode) for plan in plans for s in plan if s.stage))
    order.sort(key=lambda k: (math.prod(int(v) for v in k[0].split("x")), MODES.index(k[1])))
    by_kind: dict[str, Any] = {f"{shape} {mode}": [] for shape, mode in order}
    for r in measured:
        by_kind.setdefault(f"{r['shape']} {r['mode']}", []).append(r)
    row.extra = {
        "pattern": pattern,
        **facts,
        "clients": len(plans),
        "workers": min(workers, len(plans)),
        **stats,
        "warmup_failed": sum(not r["ok"] for r in warmups),
        "wall_s": round(out.wall_s, 1),
        "problems": out.problems,
    }
    if pattern == "bursts_after_idle":
        steady = _stats([r for r in measured if r["stage"] == "steady"])
        waves = sorted({r["stage"] for r in measured if r["stage"].startswith("wave")},
                       key=lambda s: int(s[4:]))  # fmt: skip
        row.extra["idle_s"] = sum(s.seconds for s in plans[0] if s.action == "idle")
        row.extra["steady_p50_ms"] = steady["p50_ms"]
        row.extra["waves"] = []
        for w in waves:
            s = _stats([r for r in measured if r["stage"] == w])
            row.extra["waves"].append({
                "wave": int(w[4:]), "requests": s["requests"], "failed": s["failed"],
                "p50_ms": s["p50_ms"], "max_ms": _pct([r["ms"] for r in measured
                                                       if r["stage"] == w and r["ok"]], 100),
                "vs_steady": _ratio(s["p50_ms"], steady["p50_ms"]),
            })  # fmt: skip
        first = row.extra["waves"][0] if row.extra["waves"] else {}
        row.extra["first_wave_p50_ms"] = first.get("p50_ms")
        row.extra["first_wave_vs_steady"] = first.get("vs_steady")
        later = [w["p50_ms"] for w in row.extra["waves"][1:] if w["p50_ms"] is not None]
        row.extra["first_wave_vs_later_waves"] = _ratio(
            first.get("p50_ms"), statistics.median(later) if later else None
        )
    if pattern == "first_after_start":
        row.extra["first_vs_steady"] = {}
        for kind, records_of_kind in by_kind.items():
            first = _stats([r for r in records_of_kind if r["stage"] == "first"])
            steady = _stats([r for r in records_of_kind if r["stage"] == "steady"])
            row.extra["first_vs_steady"][kind] = {
                "first_ms": first["p50_ms"],
                "steady_p50_ms": steady["p50_ms"],
                "ratio": _ratio(first["p50_ms"], steady["p50_ms"]),
            }
    row.extra["by_kind"] = {
        kind: {k: v for k, v in _stats(rs).items() if k not in ("errors", "failed_after_ms_p50")}
        | {"psnr_db": out.psnr.get(kind)}
        for kind, rs in by_kind.items()
        if rs
    }
    row.extra["log"] = [
        [r["worker"], r["client"], r["stage"], f"{r['shape']} {r['mode']}", r["ok"], r["ms"],
         r["lease_ms"], r["queue_ms"], r["bytes"], r["error"]]
        for r in records
    ]  # fmt: skip
    return row


LOG_FIELDS = [
    "worker", "client", "stage", "kind", "ok", "ms", "lease_ms", "queue_ms", "bytes", "error"
]  # fmt: skip


def _compare(rows: list[Row]) -> None:
    """Each sidecar row against upstream_a's of the same pattern and content."""
    for r in rows:
        base = next(
            (b for b in rows if b.variant == "upstream_a" and b.content == r.content
             and b.extra["pattern"] == r.extra["pattern"]),
            None,
        )  # fmt: skip
        if base is None:
            continue
        x, b = r.extra, base.extra
        x["p50_vs_upstream_a"] = _ratio(x["p50_ms"], b["p50_ms"])
        x["p99_vs_upstream_a"] = _ratio(x["p99_ms"], b["p99_ms"])
        if x["pattern"] == "bursts_after_idle":
            x["upstream_a_first_wave_p50_ms"] = b.get("first_wave_p50_ms")
            x["first_wave_vs_upstream_a"] = _ratio(
                x.get("first_wave_p50_ms"), b.get("first_wave_p50_ms")
            )
        r.ratio_to_upstream_a = (
            _ratio(r.median_ms, base.median_ms)
            if not (math.isnan(r.median_ms) or math.isnan(base.median_ms))
            else None
        )


# -- the suite -------------------------------------------------------------------------------


def traffic(
    device_kind: str,
    clients: int,
    workers: int,
    requests: int,
    contents: list[str],
    idle_s: float,
    waves: int = WAVES,
    small_pool: str = "",
    timeout_s: float = REQUEST_TIMEOUT_S,
    daemon_options: dict[str, Any] | None = None,
    budget_s: float = PHASE_BUDGET_S,
    only: tuple[str, ...] = (),
) -> list[Row]:
    """The patterns (`only` these, if given), per content, each through the sidecar then
    upstream_a."""
    gpus = 0
    if device_kind == "cuda":
        Device("cuda")  # exits with a message when no GPU is visible
        import torch

        gpus = torch.cuda.device_count()
    small = parse_pool(small_pool or SMALL_POOL[device_kind])
    kinds = kinds_for(device_kind)
    ctx = multiprocessing.get_context("spawn")
    mixed = [mixed_plan(c, kinds, requests) for c in range(clients)]
    bursts = [burst_plan(STEADY_REQUESTS, idle_s, waves) for _ in range(BURST_CLIENTS)]
    long = STEADY_SHAPE[device_kind]
    steady = [steady_plan(long, requests) for _ in range(clients)]
    first = [first_plan(FIRST_SHAPES[device_kind], STEADY_REQUESTS)]
    patterns: list[tuple[str, dict[str, Any], str, list[tuple[Step, ...]]]] = [
        ("mixed_default_pool", {}, "mixed", mixed),
        ("mixed_small_pool", small, "mixed", mixed),
        ("steady_long_default_pool", {}, long, steady),
        ("steady_long_large_pool", parse_pool(LARGE_POOL[device_kind]), long, steady),
        ("bursts_after_idle", {}, BURST_SHAPE, bursts),
        ("first_after_start", {}, "first", first),
    ]
    if only:
        patterns = [p for p in patterns if p[0] in only]
    rows: list[Row] = []
    for content in contents:
        for pattern, pool, shape, plans in patterns:
            sends = max(sum(s.action == "send" for s in p) for p in plans)
            limit = LAUNCH_S + min(budget_s, sends * timeout_s) + timeout_s + idle_s + 60
            for side in SIDES:
                print(f"traffic {content} {pattern}: {side}, {len(plans)} clients ...", flush=True)
                phases = functools.partial(_phases, side, device_kind, gpus, content=content,
                                           plans=plans, workers=workers, timeout_s=timeout_s,
                                           budget_s=budget_s)  # fmt: skip
                problems: list[str] = []
                facts: dict[str, Any] = {}
                if side == "sidecar":
                    run = functools.partial(_run, ctx, limit, phases)
                    out, facts, problems = _on_daemon(pool, daemon_options or {}, run)
                else:
                    out = _run(ctx, limit, phases, "")
                out.problems = problems + out.problems
                row = _row(pattern, side, shape, plans, out, facts, workers)
                row.content = content
                rows.append(row)
                x = row.extra
                print(f"  {x['requests']} requests, {x['failed']} failed, {x['skipped']} skipped, "
                      f"p50 {x['p50_ms']} ms, p99 {x['p99_ms']} ms"
                      + (f"; first error: {x['first_error']}" if x["failed"] else ""),
                      flush=True)  # fmt: skip
    _compare(rows)
    return rows


# -- tables ----------------------------------------------------------------------------------


def _n(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[Row]) -> list[str]:
    """The traffic rows as tables: per pattern, per kind, and the bursts' waves."""
    rows = [r for r in rows if r.suite == "traffic"]
    if not rows:
        return []
    lines = [
        "Traffic: requests from several clients and worker processes at once; failed "
        "requests (the goal is 0), latency of the ones that succeeded, against upstream_a.",
        "",
        "| content | pattern | pool | variant | clients | requests | failed | skipped | "
        "p50 ms | p99 ms | p50 x A | p99 x A | lease p50/p99 ms | first error |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | --- |",
    ]
    for r in rows:
        x = r.extra
        lease = x.get("lease_ms") or {}
        lines.append(
            f"| {r.content} | {x['pattern']} | {x.get('pool', '-')} | {r.variant} | "
            f"{x['clients']} | {x['requests']} | {x['failed']} | {x['skipped']} | "
            f"{_n(x['p50_ms'])} | {_n(x['p99_ms'])} | {_n(x.get('p50_vs_upstream_a'), 2)} | "
            f"{_n(x.get('p99_vs_upstream_a'), 2)} | "
            + (f"{_n(lease.get('p50'))}/{_n(lease.get('p99'))}" if r.variant == "sidecar" else "-")
            + f" | {x['first_error'][:120]} |"
        )
    lines += ["", "| content | pattern | variant | kind | requests | failed | p50 ms | p99 ms | "
              "lease p50 ms | bytes | PSNR dB |",
              "| --- | --- | --- | --- | " + "---: | " * 6 + "---: |"]  # fmt: skip
    for r in rows:
        for kind, k in r.extra.get("by_kind", {}).items():
            lines.append(
                f"| {r.content} | {r.extra['pattern']} | {r.variant} | {kind} | {k['requests']} | "
                f"{k['failed']} | {_n(k['p50_ms'])} | {_n(k['p99_ms'])} | "
                f"{_n(k['lease_ms']['p50']) if r.variant == 'sidecar' else '-'} | "
                f"{_n(k['output_bytes_median'])} | {_n(k['psnr_db'], 2)} |"
            )
    bursts = [r for r in rows if r.extra["pattern"] == "bursts_after_idle"]
    if bursts:
        count = max(len(r.extra.get("waves", [])) for r in bursts)
        lines += ["", "| content | variant | idle s | steady p50 ms | "
                  + " | ".join(f"wave {i + 1} p50 ms (x steady)" for i in range(count))
                  + " | first wave x later waves | first wave x upstream_a's |",
                  "| --- | --- | ---: | ---: | " + "---: | " * (count + 1) + "---: |"]  # fmt: skip
        for r in bursts:
            x = r.extra
            waves = [f"{_n(w['p50_ms'])} ({_n(w['vs_steady'], 2)})" for w in x.get("waves", [])]
            waves += ["-"] * (count - len(waves))
            lines.append(
                f"| {r.content} | {r.variant} | {_n(x.get('idle_s'))} | "
                f"{_n(x.get('steady_p50_ms'))} | "
                + " | ".join(waves)
                + f" | {_n(x.get('first_wave_vs_later_waves'), 2)}"
                + f" | {_n(x.get('first_wave_vs_upstream_a'), 2)} |"
            )
    firsts = [r for r in rows if r.extra["pattern"] == "first_after_start"]
    if firsts:
        lines += ["", "| content | variant | kind | first ms | steady p50 ms | first x steady |",
                  "| --- | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
        for r in firsts:
            for kind, f in r.extra.get("first_vs_steady", {}).items():
                lines.append(
                    f"| {r.content} | {r.variant} | {kind} | {_n(f['first_ms'])} | "
                    f"{_n(f['steady_p50_ms'])} | {_n(f['ratio'], 2)} |"
                )
    steadies = {r.extra["pattern"]: r for r in rows if r.variant == "sidecar"}
    default, large = (steadies.get(f"steady_long_{p}_pool") for p in ("default", "large"))
    if default is not None and large is not None:
        d, big = default.extra, large.extra
        vs_large = _n(_ratio(d["p50_ms"], big["p50_ms"]), 2)
        spread = _n(_ratio(d["p99_ms"], d["p50_ms"]), 2)
        lines += [
            "",
            "Steady contention, the reference video from every client: the default "
            f"pool's p50 is {vs_large}x the large pool's; its p99 is {spread}x its p50.",
        ]
    lines.append("")
    return lines
