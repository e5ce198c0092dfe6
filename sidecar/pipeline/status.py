"""What the daemon reports about itself: the Attach answer, counters and the status."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..codec.frames import Limits
from ..pool.lease_queue import QueueStats, WaiterView
from ..pool.leases import PoolUsage
from ..pool.shm import Slab
from ..vocabulary import Reason


@dataclass(frozen=True)
class Attachment:
    client_token: str
    instance_id: str
    shm_dir: str
    slabs: list[Slab]
    limits: Limits
    alignment: int
    slab_size: int
    lease_ttl: float
    max_lease_wait: float


# Routine outcomes, counted apart from errors: a client's release of a lease the daemon
# had freed itself (answered NOT_FOUND, which the client takes as done).
RELEASE_ALREADY_FREED = "release_already_freed"


@dataclass
class Stats:
    """Every encode request counted once where it ends, by how: `requests` is
    `encodes_ok` + `encodes_failed` + those still in flight; `encodes_cancelled` are the
    failed ones whose client went away."""

    requests: int = 0
    encodes_ok: int = 0
    encodes_failed: int = 0  # refused, failed, stopped by a deadline, or cancelled
    encodes_cancelled: int = 0
    frames_encoded: int = 0
    bytes_out: int = 0
    errors: Counter[Reason] = field(default_factory=Counter)
    routine: Counter[str] = field(default_factory=Counter)

    def record_success(self, frames: int, size_bytes: int) -> None:
        self.frames_encoded += frames
        self.bytes_out += size_bytes

    def record_end(self, status: str) -> None:
        """A request ended with `status` (a gRPC status code's name, as its log line says)."""
        if status == "OK":
            self.encodes_ok += 1
            return
        self.encodes_failed += 1
        if status == "CANCELLED":
            self.encodes_cancelled += 1

    def record_error(self, reason: Reason) -> None:
        self.errors[reason] += 1

    def record_routine(self, kind: str) -> None:
        self.routine[kind] += 1


@dataclass(frozen=True)
class StatusReport:
    version: str
    instance_id: str
    uptime_s: float
    pool: PoolUsage
    active_encodes: int
    queued_encodes: int
    max_concurrent_encodes: int
    live_clients: int  # holding a lease, busy, or called within the lease TTL
    clients_attached: int  # tokens known, live or not
    stats: Stats
    leases_granted: int
    leases_expired: int
    spares_expired: int = 0  # of leases_expired, spares left unused: routine
    encoder_processes: int = 0
    warm_hits: int = 0
    warm_misses: int = 0
    process_encodes: int = 0
    lease_waiters: list[WaiterView] = field(default_factory=list)
    lease_queue: QueueStats = field(default_factory=QueueStats)
    output_dir: str = ""
    shm_dir: str = ""
    shm_prefix: str = ""
