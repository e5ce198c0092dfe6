"""What the fuzz soak reads off its run: memory figures, files, abandoned encodes."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

_LOG_LINE = re.compile(r"request_id=(abandon-\S+) status=(\S+) .*?ms=([0-9.]+)")


def stop_latencies(
    log: str, abandoned: dict[str, tuple[float, float, str]]
) -> dict[str, list[float]]:
    """For each abandoned encode the daemon did not finish first, by the way it was sent:
    seconds from its client leaving to the daemon ending it (its log's `ms`, counted from
    when it came)."""
    late: dict[str, list[float]] = {}
    for request_id, status, ms in _LOG_LINE.findall(log):
        if request_id in abandoned and status != "OK":
            sent, left, kind = abandoned[request_id]
            late.setdefault(kind, []).append(max(0.0, sent + float(ms) / 1e3 - left))
    return late


def figures(key: str, samples: list[dict[str, Any]], warm_t: float, end: dict[str, Any]) -> Any:
    """MiB of `key`: at the warm point and at the end of the load, the max, and those two as
    medians over 30 s windows (one sample swings with the encodes in flight)."""
    load = [s for s in samples if s["t"] < end["t"]] + [end]
    warm = next((s for s in load if s["t"] >= warm_t), end)  # a short run: its end

    def median(start: float, stop: float) -> float:
        window = [s[key] for s in load if start <= s["t"] <= stop]
        return statistics.median(window or [warm[key]])

    kib = {"warm": warm[key], "end": end[key], "max": max(s[key] for s in load)}
    kib |= {"warm_median": median(warm_t, warm_t + 30), "end_median": median(end["t"] - 30, 1e99)}
    kib |= {"growth": end[key] - warm[key], "growth_median": kib["end_median"] - kib["warm_median"]}
    return {k: round(v / 1024, 1) for k, v in kib.items()}


def files_under(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p != skip and skip not in p.parents}


def by_code(codes: Counter[str]) -> dict[str, int]:
    """The answers ("kind:CODE" counts) by code alone, most common first."""
    counts = Counter[str]()
    for key, n in codes.items():
        counts[key.rsplit(":", 1)[1]] += n
    return dict(counts.most_common())


def abandoned_figures(left: int, by_way: dict[str, list[float]]) -> dict[str, Any]:
    """How soon the daemon ended the encodes their clients left, in all and by way."""
    stops = sorted(s for way in by_way.values() for s in way)
    return {"left": left, "stopped_by_daemon": len(stops),
            "max_s": round(stops[-1], 3) if stops else None,
            "p50_s": round(stops[len(stops) // 2], 3) if stops else None,
            "by_way": {way: {"n": len(v), "max_s": round(max(v), 3),
                             "over_0.5_s": sum(x > 0.5 for x in v)}
                       for way, v in sorted(by_way.items())}}  # fmt: skip


def innocent_figures(waited: list[float]) -> dict[str, Any]:
    """The innocent client's waits (sorted): how many, p50, p99 and the longest."""
    return {"requests": len(waited),
            "p50_s": round(waited[len(waited) // 2], 4) if waited else None,
            "p99_s": round(waited[int(len(waited) * 0.99)], 4) if waited else None,
            "max_s": round(waited[-1], 4) if waited else None}  # fmt: skip
