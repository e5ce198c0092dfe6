"""Running a traffic phase: its worker processes, and a fresh daemon for the sidecar's."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from ..common import stop_processes
from .plans import Phase, Step
from .workers import error_text, worker


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
        stop_processes(procs, 5, 10)
        results.close()
    return out


def _split(total: int, parts: int) -> list[int]:
    """`total` clients over `parts` processes, as evenly as can be."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def phases_for(
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


def run_on(
    ctx: SpawnContext, limit_s: float, phases: Callable[..., list[Phase]], socket: str
) -> Outcome:
    return run_phase(ctx, phases(socket=socket), limit_s)


def on_daemon(
    pool: dict[str, Any], daemon_options: dict[str, Any], run: Callable[[str], Outcome]
) -> tuple[Outcome, dict[str, Any], list[str]]:
    """`run(socket)` against a fresh daemon: (what it gave, facts of the daemon, problems).
    Whatever goes wrong starting or stopping the daemon is a problem noted, never raised;
    the requests it kept from running are counted as failed by the caller."""
    from client import SidecarClient

    from ..daemons import daemon

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
                problems.append(f"daemon attach before the phase: {error_text(exc)}")
            out = run(d.socket)
            try:
                with SidecarClient(d.socket, timeout=10) as probe:
                    status = probe.status()
                facts["daemon_errors"] = dict(status.counters.get("errors", {}))
                facts["daemon_max_concurrent_encodes"] = status.max_concurrent_encodes
            except Exception as exc:
                problems.append(f"daemon status after the phase: {error_text(exc)}")
            if not d.running():
                problems.append(f"the daemon exited (status {d.stop()})")
    except Exception as exc:
        problems.append(f"daemon: {error_text(exc)}")
    return out or Outcome(), facts, problems
