"""An encode's domain events on their way to its call, and the one log line and metrics
every encode gets, whatever its transport and however it ended."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Cancelled, EncodeFailed, InvalidRequest, LeaseNotFound, SidecarError
from ..events import Chunk, Progress
from ..pipeline.admission.requests import Result
from ..service import Sidecar
from ..vocabulary import Reason
from .calls import CallEnd
from .status_codes import status_of

log = logging.getLogger(f"{__package__}.servicer")  # the encode lines, under one name

_REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")

Observer = Callable[[str, float, int, int], None]  # code, seconds, frames, bytes
# An encode's domain events, given the event that stops it.
Events = Callable[[threading.Event], AsyncIterator[Any]]


@dataclass(frozen=True)
class EncodeCall:
    """An encode as its call has it: the id it is logged under, when it came, and its
    domain events."""

    request_id: str
    received_at: float
    events: Events


def request_id_for(given: str) -> str:
    """The id to log under: the client's if it is valid, else one made up."""
    return given if _REQUEST_ID_RE.match(given) else secrets.token_hex(8)


def check_request_id(given: str) -> None:
    if given and not _REQUEST_ID_RE.match(given):
        raise InvalidRequest(
            "request_id", "must be 1-128 printable ASCII characters without spaces, or empty"
        )


class Outcomes:
    """Encodes' events passed on, and how each ended recorded (log, metrics, totals)."""

    def __init__(self, sidecar: Sidecar, observer: Observer | None = None) -> None:
        self.sidecar = sidecar
        self.observer = observer  # e.g. Prometheus metrics

    async def recorded(
        self, encode: EncodeCall, end: CallEnd, when_sent: Callable[[Callable[[], None]], None]
    ) -> AsyncIterator[Progress | Chunk | Result]:
        """An encode's domain events, its log line, metrics and count among the totals
        (once, by how it ended; a result before it goes out). A domain error is raised
        once recorded (a stop by the call's deadline as that, see `CallEnd.why`), and a
        bug of ours as EncodeFailed: the caller sends it, as a status or a reply. A
        result's `after` goes to `when_sent`, which runs it once the answer has gone out."""
        request_id = encode.request_id
        self.sidecar.received()
        outcome = "CANCELLED"  # ended before its result: the client went away
        error = ""
        frames = size = 0  # frames: encoded so far, as its progress said, until its result
        counted = False  # its end counted in the totals (a result: before it goes out)
        try:
            async for event in encode.events(end.event()):
                if isinstance(event, Progress):
                    frames = max(frames, event.frames_done)
                elif isinstance(event, Result):
                    outcome, frames, size = "OK", event.frames, event.size_bytes
                    self.sidecar.ended(outcome)
                    counted = True
                    if event.after is not None:
                        when_sent(event.after)
                yield event
        except SidecarError as exc:
            answer = end.why(await _left_first(exc, end))
            outcome = status_of(answer).name
            error = str(answer)
            if answer is exc:
                raise
            raise answer from None
        except asyncio.CancelledError:  # gRPC ended the call: the client left, or its deadline
            answer = end.why(Cancelled("cancelled"))
            outcome = status_of(answer).name
            if answer.reason is not Reason.CANCELLED:  # counted as a failed call would be
                self.sidecar.record_error(answer)
            raise
        except Exception as exc:  # a bug of ours: say so, as INTERNAL, never UNKNOWN
            log.exception("encode %s failed unexpectedly", request_id)
            outcome = "INTERNAL"
            error = f"unexpected {type(exc).__name__}"
            raise EncodeFailed(f"internal error: {error}") from None
        finally:
            room = self.sidecar.room_wait_ended(request_id)
            if outcome == "CANCELLED" and room is not None:
                outcome, error = "RESOURCE_EXHAUSTED", f"its client's lease wait ran out: {room}"
            if not counted:
                self.sidecar.ended(outcome)
            report = functools.partial(
                self._report, request_id, outcome, error, frames, size, encode.received_at
            )
            if outcome == "OK":  # after the reply has gone: the client need not wait for it
                asyncio.get_running_loop().call_soon(report)
            else:
                report()

    def _report(
        self, request_id: str, outcome: str, error: str, frames: int, size: int, since: float
    ) -> None:
        """The encode's log line and metrics. An encode with a result logs its frames
        (`frames=`); one that ended without (refused, cancelled, stopped, failed) logs
        those its encoder had taken by its last progress event (`frames_at_least=`), a
        lower bound: those events come at most every `events.PROGRESS_INTERVAL`."""
        seconds = time.perf_counter() - since
        counted = "frames" if outcome == "OK" else "frames_at_least"
        log.info(
            "encode request_id=%s status=%s %s=%d bytes=%d ms=%.1f%s",
            request_id,
            outcome,
            counted,
            frames,
            size,
            seconds * 1e3,
            f" error={error!r}" if error else "",
            extra={
                "request_id": request_id,
                "status": outcome,
                counted: frames,
                "bytes": size,
                "ms": round(seconds * 1e3, 1),
                **({"error": error} if error else {}),
            },
        )
        if self.observer is not None:
            self.observer(outcome, seconds, frames, size)


# How long a stream's lease not found waits for the call's cancel (see `_left_first`).
LEFT_FIRST_WAIT_S = 2.0


async def _left_first(exc: SidecarError, end: CallEnd) -> SidecarError:
    """`exc`, or a cancel where the client left first: a client that leaves a stream gives
    back the leases it took, and its Release may overtake a chunk naming one that gRPC
    had received but the stream had not yet read, while the call's cancel is still on
    its way here. So a lease not found waits up to `LEFT_FIRST_WAIT_S` to tell which
    (0.1 s, then 0.5 s, were too short on two cores held by other work: the cancel came
    later than the Release, which went on another connection)."""
    if not isinstance(exc, LeaseNotFound):
        return exc
    until = asyncio.get_running_loop().time() + LEFT_FIRST_WAIT_S
    while not end.left():
        if asyncio.get_running_loop().time() >= until:
            return exc
        await asyncio.sleep(0.005)
    return Cancelled("cancelled by the client")
