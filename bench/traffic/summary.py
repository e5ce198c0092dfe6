"""A traffic phase's records as a row: counts, latency, lease time, per kind."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

import numpy as np

from ..common import Row
from .phases import Outcome
from .plans import MODES, Step


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def request_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
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
        "failed_after_ms_p50": pct([r["ms"] for r in failed], 50),
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "lease_ms": {"p50": pct(lease, 50), "p99": pct(lease, 99),
                     "max": round(max(lease), 3) if lease else None,
                     "share_of_time": round(sum(lease) / sum(ms), 4) if ms else None},
        "daemon_queue_ms": {"p50": pct(queued, 50), "p99": pct(queued, 99)},
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


def summary_row(
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
    by_kind = _by_kind(plans, measured)
    row.extra = {
        "pattern": pattern,
        **facts,
        "clients": len(plans),
        "workers": min(workers, len(plans)),
        **request_stats(measured),
        "warmup_failed": sum(not r["ok"] for r in warmups),
        "wall_s": round(out.wall_s, 1),
        "problems": out.problems,
    }
    if pattern == "bursts_after_idle":
        row.extra |= _bursts(plans, measured)
    if pattern == "first_after_start":
        row.extra["first_vs_steady"] = _first_vs_steady(by_kind)
    row.extra["by_kind"] = {
        kind: {k: v for k, v in request_stats(rs).items()
               if k not in ("errors", "failed_after_ms_p50")}
        | {"psnr_db": out.psnr.get(kind)}
        for kind, rs in by_kind.items()
        if rs
    }  # fmt: skip
    row.extra["log"] = [
        [r["worker"], r["client"], r["stage"], f"{r['shape']} {r['mode']}", r["ok"], r["ms"],
         r["lease_ms"], r["queue_ms"], r["bytes"], r["error"]]
        for r in records
    ]  # fmt: skip
    return row


def _by_kind(
    plans: list[tuple[Step, ...]], measured: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """The measured records by kind ("shape mode"), the kinds smallest first."""
    order = list(dict.fromkeys((s.shape, s.mode) for plan in plans for s in plan if s.stage))
    order.sort(key=lambda k: (math.prod(int(v) for v in k[0].split("x")), MODES.index(k[1])))
    by_kind: dict[str, list[dict[str, Any]]] = {f"{shape} {mode}": [] for shape, mode in order}
    for r in measured:
        by_kind.setdefault(f"{r['shape']} {r['mode']}", []).append(r)
    return by_kind


def _bursts(plans: list[tuple[Step, ...]], measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The bursts pattern's figures: the steady median, each wave's against it, and the
    first wave's against the later ones."""
    steady = request_stats([r for r in measured if r["stage"] == "steady"])
    waves = sorted({r["stage"] for r in measured if r["stage"].startswith("wave")},
                   key=lambda s: int(s[4:]))  # fmt: skip
    extra: dict[str, Any] = {
        "idle_s": sum(s.seconds for s in plans[0] if s.action == "idle"),
        "steady_p50_ms": steady["p50_ms"],
        "waves": [],
    }
    for w in waves:
        s = request_stats([r for r in measured if r["stage"] == w])
        extra["waves"].append({
            "wave": int(w[4:]), "requests": s["requests"], "failed": s["failed"],
            "p50_ms": s["p50_ms"], "max_ms": pct([r["ms"] for r in measured
                                                  if r["stage"] == w and r["ok"]], 100),
            "vs_steady": ratio(s["p50_ms"], steady["p50_ms"]),
        })  # fmt: skip
    first = extra["waves"][0] if extra["waves"] else {}
    extra["first_wave_p50_ms"] = first.get("p50_ms")
    extra["first_wave_vs_steady"] = first.get("vs_steady")
    later = [w["p50_ms"] for w in extra["waves"][1:] if w["p50_ms"] is not None]
    extra["first_wave_vs_later_waves"] = ratio(
        first.get("p50_ms"), statistics.median(later) if later else None
    )
    return extra


def _first_vs_steady(by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per kind: the first request on a fresh daemon against the steady ones after it."""
    figures = {}
    for kind, records_of_kind in by_kind.items():
        first = request_stats([r for r in records_of_kind if r["stage"] == "first"])
        steady = request_stats([r for r in records_of_kind if r["stage"] == "steady"])
        figures[kind] = {
            "first_ms": first["p50_ms"],
            "steady_p50_ms": steady["p50_ms"],
            "ratio": ratio(first["p50_ms"], steady["p50_ms"]),
        }
    return figures


LOG_FIELDS = [
    "worker", "client", "stage", "kind", "ok", "ms", "lease_ms", "queue_ms", "bytes", "error"
]  # fmt: skip


def compare(rows: list[Row]) -> None:
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
        x["p50_vs_upstream_a"] = ratio(x["p50_ms"], b["p50_ms"])
        x["p99_vs_upstream_a"] = ratio(x["p99_ms"], b["p99_ms"])
        if x["pattern"] == "bursts_after_idle":
            x["upstream_a_first_wave_p50_ms"] = b.get("first_wave_p50_ms")
            x["first_wave_vs_upstream_a"] = ratio(
                x.get("first_wave_p50_ms"), b.get("first_wave_p50_ms")
            )
        r.ratio_to_upstream_a = (
            ratio(r.median_ms, base.median_ms)
            if not (math.isnan(r.median_ms) or math.isnan(base.median_ms))
            else None
        )
