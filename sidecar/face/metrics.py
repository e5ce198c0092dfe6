"""Prometheus metrics, served over HTTP when `--metrics HOST:PORT` is set.

prometheus-client is an optional extra (the `metrics` extra: `pip install '.[metrics]'` in
a checkout); nothing here is imported unless metrics are asked for, and `serve` asks for
it (`require_client`) before it makes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import StartupError
from ..pipeline.status import RELEASE_ALREADY_FREED
from .status_codes import STATUS_OF, errors_by_code

if TYPE_CHECKING:
    from ..service import Sidecar

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Every gRPC code an error can end in, and every outcome an encode request can log. Their
# series exist from the start, at 0: rate() over a series that appears only with its first
# event shows nothing on an idle daemon, and misses that first event.
ERROR_CODES = tuple(sorted({code.name for code in STATUS_OF.values()}))
REQUEST_CODES = ("OK", *ERROR_CODES)


MISSING = (
    "--metrics needs prometheus-client, which is not installed where the daemon runs: "
    "pip install prometheus-client (it is the [metrics] extra: pip install '.[metrics]' "
    "in a checkout of video-sidecar)"
)


def require_client() -> Any:
    """prometheus_client; StartupError, saying how to install it, where it is missing."""
    try:
        import prometheus_client
    except ImportError:
        raise StartupError(MISSING) from None
    return prometheus_client


class Metrics:
    """Request counters and an encode-time histogram, plus the daemon's state at scrape."""

    def __init__(self, sidecar: Sidecar) -> None:
        prom = require_client()
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "video_sidecar_requests",
            "Encode requests by final gRPC status code",
            ["code"],
            registry=self.registry,
        )
        for code in REQUEST_CODES:
            self.requests.labels(code=code)
        self.encode_seconds = prom.Histogram(
            "video_sidecar_encode_seconds",
            "Time from an encode request to its result",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.frames = prom.Counter("video_sidecar_frames", "Frames encoded", registry=self.registry)
        self.bytes = prom.Counter(
            "video_sidecar_output_bytes", "Encoded bytes produced", registry=self.registry
        )
        self.lease_wait_seconds = prom.Histogram(
            "video_sidecar_lease_wait_seconds",
            "Time a lease request waited in the queue for room, when it had to wait",
            buckets=BUCKETS,
            registry=self.registry,
        )
        sidecar.on_lease_wait(self.lease_wait_seconds.observe)
        self.registry.register(_StateCollector(sidecar, prom))

    def observe(self, code: str, seconds: float, frames: int, nbytes: int) -> None:
        self.requests.labels(code=code).inc()
        if code == "OK":
            self.encode_seconds.observe(seconds)
            self.frames.inc(frames)
            self.bytes.inc(nbytes)

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            self._prom.start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1",
                                         registry=self.registry)  # fmt: skip
        except (OSError, OverflowError, ValueError) as exc:
            raise StartupError(f"cannot serve metrics on {address!r}: {exc}") from None


class _StateCollector:
    """Pool occupancy, leases and encodes, read from the daemon when scraped."""

    def __init__(self, sidecar: Sidecar, prom: Any) -> None:
        from prometheus_client import core

        self.sidecar = sidecar
        self.core = core

    def collect(self) -> Iterator[Any]:
        core, s = self.core, self.sidecar.status()
        pool = core.GaugeMetricFamily(
            "video_sidecar_pool_bytes", "Slab pool bytes", labels=["state"]
        )
        pool.add_metric(["total"], s.pool.total_bytes)
        pool.add_metric(["leased"], s.pool.leased_bytes)
        yield pool
        yield core.GaugeMetricFamily(
            "video_sidecar_leases_active", "Leases held now", value=s.pool.active_leases
        )
        yield core.CounterMetricFamily(
            "video_sidecar_lease_expiries", "Leases reclaimed after their TTL",
            value=s.leases_expired,
        )  # fmt: skip
        yield core.CounterMetricFamily(
            "video_sidecar_leases_granted", "Leases granted", value=s.leases_granted
        )
        yield core.GaugeMetricFamily(
            "video_sidecar_encodes_active", "Encodes running now", value=s.active_encodes
        )
        yield core.GaugeMetricFamily(
            "video_sidecar_encodes_queued", "Encodes waiting for a slot", value=s.queued_encodes
        )
        yield core.GaugeMetricFamily(
            "video_sidecar_lease_waiters",
            "Lease requests waiting for room now",
            value=len(s.lease_waiters),
        )
        refusals = core.CounterMetricFamily(
            "video_sidecar_lease_refusals",
            "Lease requests the queue gave up on, by why (wait, stall, cancelled)",
            labels=["reason"],
        )
        counts = dict.fromkeys(("wait", "stall", "cancelled"), 0) | s.lease_queue.refusals
        for reason, count in sorted(counts.items()):
            refusals.add_metric([reason], count)
        yield refusals
        errors = core.CounterMetricFamily(
            "video_sidecar_errors", "Errors answered, by gRPC status code", labels=["code"]
        )
        counts = dict.fromkeys(ERROR_CODES, 0) | errors_by_code(s.stats.errors)
        for code, count in sorted(counts.items()):
            errors.add_metric([code], count)
        yield errors
        routine = core.CounterMetricFamily(
            "video_sidecar_routine",
            "Routine outcomes, not errors: releases of leases the daemon had freed itself "
            "(answered NOT_FOUND, which clients take as done), spares left unused",
            labels=["kind"],
        )
        routine.add_metric([RELEASE_ALREADY_FREED], s.stats.routine[RELEASE_ALREADY_FREED])
        routine.add_metric(["spare_expired"], s.spares_expired)
        yield routine
