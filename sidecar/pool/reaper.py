"""The lease reaper: leases of clients gone or silent for the TTL go back to the pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .leases import LeaseTable

log = logging.getLogger(__name__)


async def reap_expired(leases: LeaseTable, alive: Callable[[], set[str]], ttl: float) -> None:
    """Forever: renew the leases of the tokens `alive()` names (waiting on their own encode
    or in the queue for room is not silence), then reclaim the expired ones."""
    interval = min(1.0, ttl / 4)
    while True:
        await asyncio.sleep(interval)
        for token in alive():
            leases.renew(token)
        expired = leases.expire()
        spares = sum(lease.spare for lease in expired)
        if spares:  # a spare the client never came back for: normal
            log.debug("reclaimed %d unused spare leases", spares)
        if len(expired) > spares:
            log.warning(
                "reclaimed %d expired leases (clients gone or silent for %.0fs)",
                len(expired) - spares,
                ttl,
            )
