"""The traffic suite: each pattern, per content, through the sidecar then upstream_a."""

from __future__ import annotations

import functools
import multiprocessing
from typing import Any

from ..common import Device, Row
from .phases import on_daemon, phases_for, run_on
from .plans import (
    BURST_CLIENTS,
    BURST_SHAPE,
    FIRST_SHAPES,
    LARGE_POOL,
    LAUNCH_S,
    PHASE_BUDGET_S,
    REQUEST_TIMEOUT_S,
    SIDES,
    SMALL_POOL,
    STEADY_REQUESTS,
    STEADY_SHAPE,
    WAVES,
    Step,
    burst_plan,
    first_plan,
    kinds_for,
    mixed_plan,
    parse_pool,
    steady_plan,
)
from .summary import compare, summary_row


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
    patterns = _patterns(device_kind, clients, requests, idle_s, waves, small_pool)
    if only:
        patterns = [p for p in patterns if p[0] in only]
    ctx = multiprocessing.get_context("spawn")
    rows: list[Row] = []
    for content in contents:
        for pattern, pool, shape, plans in patterns:
            sends = max(sum(s.action == "send" for s in p) for p in plans)
            limit = LAUNCH_S + min(budget_s, sends * timeout_s) + timeout_s + idle_s + 60
            for side in SIDES:
                print(f"traffic {content} {pattern}: {side}, {len(plans)} clients ...", flush=True)
                phases = functools.partial(phases_for, side, device_kind, gpus, content=content,
                                           plans=plans, workers=workers, timeout_s=timeout_s,
                                           budget_s=budget_s)  # fmt: skip
                problems: list[str] = []
                facts: dict[str, Any] = {}
                if side == "sidecar":
                    run = functools.partial(run_on, ctx, limit, phases)
                    out, facts, problems = on_daemon(pool, daemon_options or {}, run)
                else:
                    out = run_on(ctx, limit, phases, "")
                out.problems = problems + out.problems
                row = summary_row(pattern, side, shape, plans, out, facts, workers)
                row.content = content
                rows.append(row)
                _say(row)
    compare(rows)
    return rows


def _patterns(
    device_kind: str, clients: int, requests: int, idle_s: float, waves: int, small_pool: str
) -> list[tuple[str, dict[str, Any], str, list[tuple[Step, ...]]]]:
    """Every pattern: (name, the daemon's pool, the row's shape, each client's plan)."""
    small = parse_pool(small_pool or SMALL_POOL[device_kind])
    kinds = kinds_for(device_kind)
    mixed = [mixed_plan(c, kinds, requests) for c in range(clients)]
    bursts = [burst_plan(STEADY_REQUESTS, idle_s, waves) for _ in range(BURST_CLIENTS)]
    long = STEADY_SHAPE[device_kind]
    steady = [steady_plan(long, requests) for _ in range(clients)]
    first = [first_plan(FIRST_SHAPES[device_kind], STEADY_REQUESTS)]
    return [
        ("mixed_default_pool", {}, "mixed", mixed),
        ("mixed_small_pool", small, "mixed", mixed),
        ("steady_long_default_pool", {}, long, steady),
        ("steady_long_large_pool", parse_pool(LARGE_POOL[device_kind]), long, steady),
        ("bursts_after_idle", {}, BURST_SHAPE, bursts),
        ("first_after_start", {}, "first", first),
    ]


def _say(row: Row) -> None:
    x = row.extra
    print(f"  {x['requests']} requests, {x['failed']} failed, {x['skipped']} skipped, "
          f"p50 {x['p50_ms']} ms, p99 {x['p99_ms']} ms"
          + (f"; first error: {x['first_error']}" if x["failed"] else ""),
          flush=True)  # fmt: skip
