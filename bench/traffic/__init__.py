"""The traffic suite: what a generation server sends under contention, and what fails.

python -m bench --suite traffic --device cuda --json traffic.json
python -m bench --suite traffic --idle 5 --requests 4 --json traffic.json  # a short cpu run

Each pattern runs against a fresh daemon started here, then the same way through
upstream_a (`variants.UpstreamA`, in the same threads and processes), side by side:

1. `mixed_default_pool`: `clients` clients spread over `workers` worker processes (each
   thread its own `SidecarClient`), each sending back to back `requests` requests of a mix:
   small clips (448x256x4, 672x384x4) and long videos (1344x768x122 and 1344x768x362 on
   cuda; 448x256x48 and 448x256x96 on cpu), each as a whole-video `encode` and as a stream
   of `CHUNK`-frame writes. Client k starts at kind k of the mix and takes the next one for
   each request, so every kind is sent by several clients at once. The daemon's own pool.
2. `mixed_small_pool`: the same on a small pool (`--small-pool`; 4x8MiB on cpu, 4x64MiB on
   cuda), where requests wait for leases.
3. `steady_long_default_pool` and `steady_long_large_pool`: every client sends the
   reference video (1344x768x122 on cuda, 448x256x48 on cpu) whole, back to back, on the
   daemon's own pool and on one with room for all of them at once (`LARGE_POOL`): what
   waiting for memory costs when every request wants the same.
4. `bursts_after_idle`: `BURST_CLIENTS` clients of 448x256x4 encodes: a steady phase (each
   client back to back), then every client and the daemon idle `idle_s` seconds, then
   `waves` waves back to back (every client sends one request at once; the next wave when
   all have answered). The first wave's median and each later one's against the steady
   median, and against upstream_a's first wave.
5. `first_after_start`: one client on a daemon just started (health answering): its first
   request of each of `FIRST_SHAPES`, then `STEADY_REQUESTS` more of each; the first
   against the steady median.

On cuda the inputs are CUDA tensors: uint8 for the small clips, bf16 in [-1, 1] with
`value_range=(-1, 1)` for the long videos, as a diffusion VAE gives them (upstream_a
converts those to uint8 on the GPU first, inside its timed request; it has no streams, so
a stream request is the whole video through path A for it). On cpu, numpy uint8 arrays.

Every request counts: one that raises is a failed request (its error text kept), never
the end of the run. Requests have a deadline (`--request-timeout`, 120 s); no request
starts after `PHASE_BUDGET_S` in one phase (those are counted as skipped); a phase's
processes that have not reported within its limit are stopped and their missing requests
counted as failed. Recorded per pattern and variant: requests, failed (and the first error),
skipped, p50 and p99 latency of the requests that succeeded, those against upstream_a's,
the client's lease time (`Timings.lease_ms`: waiting for and granting leases), output bytes,
PSNR of worker 0's first output of each kind, and the same per kind; and every request.

Its parts: `plans` (what each client sends), `workers` (the processes and threads that
send it), `phases` (running them, against a fresh daemon), `summary` (the records as a
row), `suite` (every pattern, side by side) and `tables` (the rows in Markdown).
"""

from __future__ import annotations

from .plans import (
    BURST_CLIENTS,
    CHUNK,
    PATTERNS,
    REQUEST_TIMEOUT_S,
    SIDES,
    STEADY_REQUESTS,
    WAVES,
    default_clients,
    kinds_for,
)
from .suite import traffic
from .summary import LOG_FIELDS
from .tables import markdown

__all__ = [
    "BURST_CLIENTS",
    "CHUNK",
    "LOG_FIELDS",
    "PATTERNS",
    "REQUEST_TIMEOUT_S",
    "SIDES",
    "STEADY_REQUESTS",
    "WAVES",
    "default_clients",
    "kinds_for",
    "markdown",
    "traffic",
]
