"""What the traffic suite sends: its patterns' constants, and each client's plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common import encode_settings

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


# -- what the workers are told ----------------------------------------------------------------


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
