"""Tables and plots of benchmark rows."""

from __future__ import annotations

import math
from typing import Any

from .common import PATTERNS, Row


def is_e2e(r: Row) -> bool:
    if r.suite:
        return r.suite == "e2e"
    # Files from before rows named their suite.
    return r.ratio_to_upstream_a is not None or r.variant.startswith("upstream")


def _machine_line(m: dict[str, Any]) -> str:
    if "description" in m and "cores" not in m:
        return f"Machine: {m['description']}  "
    return (
        f"Machine: {m.get('cores', '?')} cores"
        + (f" ({m['threads_per_core']} threads a core)" if m.get("threads_per_core", 1) > 1 else "")
        + f", {m.get('cpu', '?')}"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + f"; Python {m.get('python', '?')}, PyAV {m.get('av', '?')}"
        + (f", torch {m['torch']}" if m.get("torch") else "")
        + "  "
    )


def _contents(meta: dict[str, Any]) -> str:
    content = meta.get("content") or []
    return ", ".join(content) if isinstance(content, list) else str(content)


def load_line(meta: dict[str, Any]) -> str:
    """How the e2e requests were sent, in words, for the table header."""
    pattern = meta.get("pattern", "?")
    return (
        f"Pattern: {pattern} ({PATTERNS.get(pattern, '?')}); "
        f"concurrency {meta.get('concurrency', 1)}; content: {_contents(meta) or '?'}"
    )


def _num(value: float, digits: int) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    lines = [
        f"Date: {meta.get('date', '?')}  ",
        _machine_line(meta.get("machine") or {}),
        f"Command: `{meta.get('command', '?')}` (commit {meta.get('commit') or '?'})",
        "",
    ]
    e2e = [r for r in rows if is_e2e(r)]
    if e2e:
        lines += _e2e_table(meta, e2e)
    nodes = [r for r in rows if r.suite == "node"]
    if nodes:
        lines += _node_table(meta, nodes)
    others = [r for r in rows if r not in e2e and r not in nodes]
    if others:
        if meta.get("content") and not e2e and not nodes:
            lines += [f"Content: {_contents(meta)}", ""]
        lines += ["| measurement | shape | median | details |", "| --- | --- | ---: | --- |"]
        for r in others:
            name = r.variant + (f" ({r.content})" if r.content else "")
            details = ", ".join(f"{k}={v}" for k, v in r.extra.items())
            lines.append(f"| {name} | {r.shape} | {_num(r.median_ms, 3)} | {details} |")
        lines.append("")
    return "\n".join(lines)


def _e2e_table(meta: dict[str, Any], e2e: list[Row]) -> list[str]:
    by_content = len({r.content for r in e2e}) > 1
    rate = any("frames_per_s" in r.extra for r in e2e)
    head = ["shape", "variant", "median ms", "min-max ms", "x upstream_a", "samples"]
    if by_content:
        head.insert(0, "content")
    if rate:
        head.append("frames/s")
    lines = [
        load_line(meta),
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" if h in {"content", "shape", "variant"} else "---:" for h in head)
        + " |",
    ]  # fmt: skip
    for r in e2e:
        ratio = f"{r.ratio_to_upstream_a:.2f}" if r.ratio_to_upstream_a is not None else ""
        cells = [r.shape, r.variant, f"{r.median_ms:.1f}", f"{r.min_ms:.1f}-{r.max_ms:.1f}",
                 ratio, str(r.samples)]  # fmt: skip
        if by_content:
            cells.insert(0, r.content)
        if rate:
            cells.append(f"{r.extra['frames_per_s']:.1f}" if "frames_per_s" in r.extra else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _node_table(meta: dict[str, Any], nodes: list[Row]) -> list[str]:
    node = meta.get("node", {})
    lines = [
        f"Node: one daemon, worker processes x client threads, each client sending "
        f"{node.get('requests', '?')} {nodes[0].shape} videos back to back; "
        f"content: {_contents(meta) or '?'}",
        "",
        "| content | pixel format | workers x clients | devices | frames/s | x 1 worker "
        "| median ms/request | p90 ms |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in nodes:
        x = r.extra
        scaling = x.get("scaling_vs_1_worker")
        lines.append(
            f"| {r.content} | {r.variant.removeprefix('node_')} "
            f"| {x.get('workers')} x {x.get('clients_per_worker')} "
            f"| {', '.join(x.get('devices', []))} | {x.get('frames_per_s', 0):.1f} "
            f"| {'' if scaling is None else f'{scaling:.2f}'} | {r.median_ms:.1f} "
            f"| {'' if x.get('p90_ms') is None else x['p90_ms']} |"
        )
    lines.append("")
    return lines


def plot(rows: list[Row], path: str, meta: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'video-sidecar[plot]'") from None
    e2e = [r for r in rows if is_e2e(r) and r.ratio_to_upstream_a is not None]
    if not e2e:
        raise SystemExit("--plot: no e2e rows with an upstream_a baseline to draw")
    by_content = len({r.content for r in e2e}) > 1

    def series(r: Row) -> str:
        return f"{r.variant} ({r.content})" if by_content else r.variant

    shapes = list(dict.fromkeys(r.shape for r in e2e))
    names = list(dict.fromkeys(series(r) for r in e2e))
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [
            next((r.median_ms for r in e2e if r.shape == s and series(r) == name), 0)
            for s in shapes
        ]
        ax.bar([x + i * width for x in range(len(shapes))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(shapes))], shapes)
    ax.set_yscale("log")
    ax.set_ylabel("median ms, GPU/host-ready RGB to MP4 bytes (log)")
    ax.set_title(
        f"video-sidecar vs upstream paths ({meta.get('device', '?')}, "
        f"{str(meta.get('date', '?'))[:10]}; {meta.get('pattern', '?')}, "
        f"concurrency {meta.get('concurrency', 1)})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
