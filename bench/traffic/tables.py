"""The traffic rows as Markdown tables."""

from __future__ import annotations

import math
from typing import Any

from ..common import Row
from .summary import ratio


def _n(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[Row]) -> list[str]:
    """The traffic rows as tables: per pattern, per kind, and the bursts' waves."""
    rows = [r for r in rows if r.suite == "traffic"]
    if not rows:
        return []
    lines = _patterns(rows) + _kinds(rows)
    bursts = [r for r in rows if r.extra["pattern"] == "bursts_after_idle"]
    if bursts:
        lines += _bursts(bursts)
    firsts = [r for r in rows if r.extra["pattern"] == "first_after_start"]
    if firsts:
        lines += _firsts(firsts)
    lines += _steady_contention(rows)
    lines.append("")
    return lines


def _patterns(rows: list[Row]) -> list[str]:
    """One line per pattern and variant: counts, latency, and against upstream_a."""
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
    return lines


def _kinds(rows: list[Row]) -> list[str]:
    """One line per pattern, variant and kind of request."""
    lines = ["", "| content | pattern | variant | kind | requests | failed | p50 ms | p99 ms | "
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
    return lines


def _bursts(bursts: list[Row]) -> list[str]:
    """The bursts after the idle: each wave against the steady median."""
    count = max(len(r.extra.get("waves", [])) for r in bursts)
    lines = ["", "| content | variant | idle s | steady p50 ms | "
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
    return lines


def _firsts(firsts: list[Row]) -> list[str]:
    """The first request of each kind on a fresh daemon, against the steady ones."""
    lines = ["", "| content | variant | kind | first ms | steady p50 ms | first x steady |",
             "| --- | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
    for r in firsts:
        for kind, f in r.extra.get("first_vs_steady", {}).items():
            lines.append(
                f"| {r.content} | {r.variant} | {kind} | {_n(f['first_ms'])} | "
                f"{_n(f['steady_p50_ms'])} | {_n(f['ratio'], 2)} |"
            )
    return lines


def _steady_contention(rows: list[Row]) -> list[str]:
    """The default pool against the large one, in words, when both ran."""
    steadies = {r.extra["pattern"]: r for r in rows if r.variant == "sidecar"}
    default, large = (steadies.get(f"steady_long_{p}_pool") for p in ("default", "large"))
    if default is None or large is None:
        return []
    d, big = default.extra, large.extra
    vs_large = _n(ratio(d["p50_ms"], big["p50_ms"]), 2)
    spread = _n(ratio(d["p99_ms"], d["p50_ms"]), 2)
    return [
        "",
        "Steady contention, the reference video from every client: the default "
        f"pool's p50 is {vs_large}x the large pool's; its p99 is {spread}x its p50.",
    ]
