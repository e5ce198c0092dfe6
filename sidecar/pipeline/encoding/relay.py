"""An encode's events passed on in order until its job ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ...events import Chunk, Progress
from ..admission.plans import EncodeOutcome


async def relay(
    events: asyncio.Queue[Progress | Chunk],
    runner: asyncio.Task[EncodeOutcome],
    reader: asyncio.Task[int] | None,
) -> AsyncIterator[Progress | Chunk]:
    """The job's events in order until it ends; a failed stream reader fails the request."""
    watch: set[asyncio.Future[Any]] = {runner} if reader is None else {runner, reader}
    while not runner.done():
        getter = asyncio.ensure_future(events.get())
        try:
            done, _ = await asyncio.wait({getter, *watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            yield getter.result()
        if reader is not None and reader in done:
            watch.discard(reader)
            error = reader.exception()
            if error is not None:
                raise error
    while not events.empty():
        yield events.get_nowait()
