"""Tables and plots of benchmark rows."""

from __future__ import annotations

from typing import Any

from .common import Row


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    m = meta["machine"]
    lines = [
        f"Date: {meta['date']}  ",
        f"Machine: {m.get('cores')} cores, {m.get('cpu', '?')}"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + f"; Python {m.get('python')}, PyAV {m.get('av', '?')}"
        + (f", torch {m['torch']}" if m.get("torch") else "")
        + "  ",
        f"Command: `{meta['command']}` (commit {meta.get('commit') or '?'})",
        "",
    ]
    e2e = [r for r in rows if r.ratio_to_upstream_a is not None or r.variant.startswith("upstream")]
    if e2e:
        lines += [
            "| shape | variant | median ms | min-max ms | x upstream_a | samples |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for r in e2e:
            ratio = f"{r.ratio_to_upstream_a:.2f}" if r.ratio_to_upstream_a is not None else ""
            lines.append(
                f"| {r.shape} | {r.variant} | {r.median_ms:.1f} | {r.min_ms:.1f}-{r.max_ms:.1f} "
                f"| {ratio} | {r.samples} |"
            )
        lines.append("")
    others = [r for r in rows if r not in e2e]
    if others:
        lines += ["| measurement | shape | median | details |", "| --- | --- | ---: | --- |"]
        for r in others:
            details = ", ".join(f"{k}={v}" for k, v in r.extra.items())
            lines.append(f"| {r.variant} | {r.shape} | {r.median_ms:.3f} | {details} |")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[Row], path: str, meta: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'video-sidecar[plot]'") from None
    e2e = [r for r in rows if r.ratio_to_upstream_a is not None]
    shapes = list(dict.fromkeys(r.shape for r in e2e))
    variants = list(dict.fromkeys(r.variant for r in e2e))
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        values = [
            next((r.median_ms for r in e2e if r.shape == s and r.variant == variant), 0)
            for s in shapes
        ]
        ax.bar([x + i * width for x in range(len(shapes))], values, width, label=variant)
    ax.set_xticks([x + width * (len(variants) - 1) / 2 for x in range(len(shapes))], shapes)
    ax.set_yscale("log")
    ax.set_ylabel("median ms, GPU/host-ready RGB to MP4 bytes (log)")
    ax.set_title(f"video-sidecar vs upstream paths ({meta['device']}, {meta['date'][:10]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
