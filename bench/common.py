"""What every suite shares: shapes, content, device handling, timing, machine facts."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from client.patterns import moving_pattern

ROOT = Path(__file__).resolve().parent.parent

# The upstream ablation shapes, W x H x frames.
SHAPES = ["448x256x4", "672x384x4", "1344x768x1", "448x256x16", "1344x768x122", "1344x768x362"]

# Concurrent traffic is measured after this long: encoder processes grow to the traffic.
CONCURRENT_WARMUP_S = 3.0


# Frame content: smooth moving colour waves, optionally with per-pixel grain (in 8-bit levels)
# that makes x264 work harder, as real generated frames do.
CONTENTS = {"smooth": 0.0, "noisy": 4.0}
# How e2e sends its requests.
PATTERNS = {
    "steady": "each variant's samples back to back, one block per variant",
    "spaced": "variants interleaved per sample, the daemon idle between its requests",
}
# What runs recorded before --content and --pattern existed used.
LEGACY_CONTENT = "mild noise (2.0)"
LEGACY_PATTERN = "spaced"


def parse_shape(shape: str) -> tuple[int, int, int]:
    w, h, t = (int(v) for v in shape.split("x"))
    return w, h, t


@dataclass
class Row:
    variant: str
    shape: str
    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    ratio_to_upstream_a: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    suite: str = ""  # e2e, transfer, throughput, stream, memory, node; "" in old files
    content: str = ""  # a key of CONTENTS; "" where it does not apply, or in old files


def summarise(variant: str, shape: str, times_ms: list[float], **extra: Any) -> Row:
    return Row(
        variant=variant,
        shape=shape,
        median_ms=round(statistics.median(times_ms), 3),
        min_ms=round(min(times_ms), 3),
        max_ms=round(max(times_ms), 3),
        samples=len(times_ms),
        extra=extra,
    )


class Device:
    """Where frames start: host memory ('cpu') or a CUDA tensor ('cuda', on GPU `index`)."""

    def __init__(self, kind: str, index: int = 0) -> None:
        self.kind = kind
        self.index = index
        self.torch: Any = None
        if kind == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: no CUDA device is visible")
            self.torch = torch

    def video(self, shape: str, content: str = "smooth", seed: int = 0) -> Any:
        """Moving colour waves, with the grain that `content` names (CONTENTS); never zeros."""
        w, h, t = parse_shape(shape)
        frames = moving_pattern(t, h, w, noise=CONTENTS[content], seed=seed)
        if self.torch is None:
            return frames
        return self.torch.from_numpy(frames).to(f"cuda:{self.index}")

    def ready(self) -> None:
        """Wait until the frames exist (GPU-ready) before a timer starts."""
        if self.torch is not None:
            self.torch.cuda.synchronize(self.index)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def machine() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "threads_per_core": _threads_per_core(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        import av

        facts["av"] = av.__version__
    except ImportError:
        pass
    try:
        import torch

        facts["torch"] = torch.__version__
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return facts


def _threads_per_core() -> int:
    """Hardware threads sharing a core with the first usable CPU, as the kernel sees them
    (a VM may hide siblings): 32 cores of 2 threads do less x264 work than 32 of one."""
    cpu = min(os.sched_getaffinity(0))
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        siblings = path.read_text().strip()
    except OSError:
        return 1
    count = 0
    for part in siblings.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        return out.stdout.strip()
    except OSError:
        return ""


def run_meta(module: str, argv: Sequence[str], device: str) -> dict[str, Any]:
    """What a recorded run names besides its figures: when, the command, the machine, the
    commit and the encoder settings."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"python -m {module} " + shlex.join(argv),
        "device": device,
        "machine": machine(),
        "commit": git_commit(),
        "encoding": encode_settings(),
    }


def write_run(
    path: str | Path, module: str, argv: Sequence[str], device: str, payload: dict[str, Any]
) -> None:
    """A recorded run of `module` that keeps its own keys (`payload`) beside `run_meta`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"meta": run_meta(module, argv, device), **payload}, indent=2))


def write_json(path: str | Path, meta: dict[str, Any], rows: list[Row]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "rows": [asdict(r) for r in rows]}
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def read_json(path: str | Path) -> tuple[dict[str, Any], list[Row]]:
    """A recorded run. Older files lack some keys; they get the values those runs used.

    A file without "rows" (e.g. the reliability record) is shown as it is: its plain
    values as the metadata, each of its objects as one row of details.
    """
    payload = json.loads(Path(path).read_text())
    if "rows" not in payload:
        meta = {k: v for k, v in payload.items() if not isinstance(v, dict)}
        rows = [
            Row(variant=k, shape="-", median_ms=float(v.get("p50_ms", math.nan)),
                min_ms=math.nan, max_ms=math.nan, samples=0, extra=v)
            for k, v in payload.items() if isinstance(v, dict)
        ]  # fmt: skip
        return with_meta_defaults(meta), rows
    rows = [_row(r) for r in payload["rows"]]
    meta = with_meta_defaults(dict(payload.get("meta") or {}))
    # Runs recorded before --pattern, --content and --concurrency: what they did then.
    meta.setdefault("content", [LEGACY_CONTENT])
    if any(r.suite == "e2e" or r.variant.startswith("upstream") for r in rows):
        meta.setdefault("pattern", LEGACY_PATTERN)
        meta.setdefault("concurrency", 1)
    return meta, rows


def _row(data: dict[str, Any]) -> Row:
    known = {f.name for f in dataclasses.fields(Row)}
    return Row(**{k: v for k, v in data.items() if k in known})


def with_meta_defaults(meta: dict[str, Any]) -> dict[str, Any]:
    """The keys every table header reads, with placeholders where a file lacks them."""
    facts = meta.get("machine", {})
    if not isinstance(facts, dict):  # written as a description in words
        facts = {"description": str(facts)}
    return {"date": "?", "command": "?", "device": "?", "commit": "", **meta, "machine": facts}


PROFILE_ENV = "VIDEO_SIDECAR_PROFILE"  # the daemon's --profile, as its environment says it


def encode_settings(
    width: int = 0, height: int = 0, frames: int = 0, first: np.ndarray | None = None
) -> dict[str, Any]:
    """The x264 settings every variant uses for a video of this size and length: those of
    the daemon's profile (`--profile` sets $VIDEO_SIDECAR_PROFILE, which the bench's
    daemons read too), so that upstream_a and ffmpeg_pipe encode exactly as the sidecar
    does. `first`: the video's first rgb24 frame, which the daemon measures for grain
    (sidecar/codec/grain.py)."""
    from sidecar.codec.catalogue import CodecSpec
    from sidecar.codec.grain import is_grainy
    from sidecar.vocabulary import DEFAULT_PROFILE, PIXEL_FORMATS

    name = os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    codec = CodecSpec(profile=name).resolve(video=(width, height, frames))
    if first is not None and is_grainy(first, PIXEL_FORMATS["rgb24"], first.shape[0]):
        codec = codec.measured(True)
    return {"codec": "libx264", "profile": name, "options": codec.options, "fps": 24}


def as_host(video: Any) -> np.ndarray:
    host: np.ndarray = video.cpu().numpy() if hasattr(video, "cpu") else video
    return host


def run_together(work: Sequence[Callable[[], None]], go: threading.Barrier) -> None:
    """Run each callable on its own thread; the first error aborts `go` (so the others
    stop waiting at it) and is raised once all have ended."""
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)
            go.abort()

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in work]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def stop_processes(procs: Sequence[BaseProcess], grace_s: float, term_s: float | None) -> None:
    """Wait `grace_s` for each process to end; terminate one still running and wait
    `term_s` more (None: as long as it takes), then kill it if it still runs."""
    for p in procs:
        p.join(timeout=grace_s)
        if p.exitcode is None:
            p.terminate()
            p.join(timeout=term_s)
        if p.exitcode is None:
            p.kill()
            p.join()
