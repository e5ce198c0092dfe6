"""The result an encode's client gets: what it made, its timings, and the leases that
are now the client's."""

from __future__ import annotations

import time
from collections.abc import Callable

from ...pool.leases import Lease
from ..admission.planner import Accepted
from ..admission.plans import EncodeOutcome
from ..admission.requests import Result
from .handback import HandedBack


def result_of(
    accepted: Accepted,
    outcome: EncodeOutcome,
    received_at: float,
    handed: HandedBack,
    next_lease: Lease | None,
    after: Callable[[], None] | None,
) -> Result:
    """`accepted`'s result: its output as `handed` back, and `next_lease` for the client's
    next request (the one the output is in, when it went there)."""
    spec, plan = accepted.spec, accepted.plan
    return Result(
        request_id=spec.request_id,
        path=outcome.path,
        size_bytes=outcome.size_bytes,
        frames=outcome.frames,
        duration_s=outcome.duration_s,
        codec=plan.codec.choice.name,
        container=plan.container,
        width=plan.geometry.width,
        height=plan.geometry.height,
        audio_samples=outcome.audio_samples,
        timings_ms={
            "validate_ms": accepted.validate_ms,
            **outcome.timings_ms,
            "total_ms": (time.perf_counter() - received_at) * 1e3,
        },
        next_lease=handed.lease if handed.next_lease else next_lease,
        data=handed.data,
        data_lease=handed.lease,
        previews=tuple(outcome.previews),
        after=after,
    )
