"""What the rate-distortion-time suite (`bench.rdt`) reads from an encode, and its
tables: each variant's time, bytes, PSNR and SSIM, and as ratios to the anchor,
`export_to_video` (as it runs, else its emulation)."""

from __future__ import annotations

import io

import av
import numpy as np

from .common import Row


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 10 * float(np.log10(255**2 / max(mse, 1e-12)))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of the luma of every 8th frame, over 7x7 windows (as scikit-image's
    default, without needing it)."""
    weights = np.array([0.2126, 0.7152, 0.0722], np.float64)
    return float(np.mean([_ssim(a[i] @ weights, b[i] @ weights) for i in range(0, len(a), 8)]))


def _ssim(x: np.ndarray, y: np.ndarray, win: int = 7) -> float:
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def mean(z: np.ndarray) -> np.ndarray:  # the mean of each win x win window
        s = np.pad(z, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
        return (s[win:, win:] - s[:-win, win:] - s[win:, :-win] + s[:-win, :-win]) / win**2

    mx, my = mean(x), mean(y)
    n = win * win
    vx = (mean(x * x) - mx * mx) * n / (n - 1)
    vy = (mean(y * y) - my * my) * n / (n - 1)
    cov = (mean(x * y) - mx * my) * n / (n - 1)
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean())


# -- the tables ----------------------------------------------------------------------------


def summary(rows: list[Row], default: str = "sidecar_balanced") -> str:
    """One line per shape and content: the default's time, bytes and PSNR beside upstream
    A's at the same settings and the anchor's, as the README gives them."""
    lines = [
        "| shape | content | export_to_video | upstream A, same settings | sidecar default |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for shape in dict.fromkeys(r.shape for r in rows):
        for name in dict.fromkeys(r.content for r in rows):
            some = [r for r in rows if r.shape == shape and r.content == name]
            anchor = anchor_of(some)
            found = {r.variant: r for r in some}
            upstream = found.get(default.replace("sidecar_", "upstream_a_"))
            ours = found.get(default)
            if anchor is None or upstream is None or ours is None:
                continue
            cells = [_cell(r, anchor) for r in (anchor, upstream, ours)]
            lines.append(f"| {shape} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: Row, anchor: Row) -> str:
    e, a = row.extra, anchor.extra
    if row is anchor:
        return f"{row.median_ms:.0f} ms, {e['bytes'] / 1024:.0f} KiB, {e['psnr_db']:.2f} dB"
    return (
        f"{row.median_ms / anchor.median_ms:.2f}x time, {e['bytes'] / a['bytes']:.2f}x size, "
        f"{e['psnr_db'] - a['psnr_db']:+.2f} dB"
    )


def anchor_of(rows: list[Row]) -> Row | None:
    for name in ("export_to_video", "export_emulated"):
        found = [r for r in rows if r.variant == name]
        if found:
            return found[0]
    return None


def table(rows: list[Row]) -> str:
    """One shape and content: each variant's time, bytes and PSNR, and as ratios to the
    anchor (export_to_video as it runs, else its emulation)."""
    anchor = anchor_of(rows)
    lines = [
        f"\n{rows[0].shape} {rows[0].content} (anchor: {anchor.variant if anchor else 'none'})",
        "| variant | ms | bytes | PSNR dB | SSIM | time | size | PSNR |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        e = r.extra
        ratio = ""
        if anchor is not None and anchor.extra["bytes"]:
            a = anchor.extra
            ratio = (
                f" {r.median_ms / anchor.median_ms:.2f}x | {e['bytes'] / a['bytes']:.2f}x"
                f" | {e['psnr_db'] - a['psnr_db']:+.2f} |"
            )
        ssim_text = f"{e['ssim']:.4f}"
        lines.append(
            f"| {r.variant} | {r.median_ms:.0f} | {e['bytes']} | {e['psnr_db']:.2f} | "
            f"{ssim_text} |{ratio or ' | | |'}"
        )
    return "\n".join(lines)
