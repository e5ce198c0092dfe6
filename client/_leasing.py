"""A Lease sent as the gRPC call, named so that a lost reply loses no lease; a wait for
room that a call's timeout cuts short; leases given back as cleanup.

The framed socket frees a lease granted in a connection's last reply when the connection
ends unread (see `sidecar.face.framed`). A gRPC call has no such end: the daemon may grant the
lease just as the client gives up on the call (a cancel, a deadline, Ctrl-C), and the
client's other calls would then renew a lease it never learnt of until it went quiet.
So the request carries a random tag, and a call that failed without the daemon's answer
releases by that tag whatever it may have granted.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterable
from typing import TypeVar

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import STALL_TEXT, Reason

from ._errors import (
    DeadlineExceeded,
    RequestError,
    ResourceExhausted,
    SidecarError,
    TransportError,
)
from ._steps import Call, Steps
from ._types import Lease

T = TypeVar("T")

# A cleanup release's own wait: a daemon that answers at all does in about a millisecond,
# and a hung one should not hold a failing call up for long.
CLEANUP_TIMEOUT = 2.0


# How long before a call's own deadline its wait for room ends: time for the daemon's
# refusal to come back.
REFUSAL_MARGIN_S = 0.25


def lease_over_grpc(request: pb.LeaseRequest, timeout: float) -> Steps[pb.LeaseResponse]:
    """The Lease call for `request`, tagged; on a failure that is not the daemon's refusal
    (a `RequestError` grants nothing), the tag is released before the error goes on."""
    tagged = pb.LeaseRequest()
    tagged.CopyFrom(request)
    tagged.tag = secrets.token_hex(12)
    try:
        resp: pb.LeaseResponse = yield Call("Lease", tagged, timeout)
    except GeneratorExit:  # the steps were dropped unfinished: nothing more may be done
        raise
    except BaseException as err:
        if not isinstance(err, RequestError):
            withdraw = pb.ReleaseRequest(client_token=request.client_token, tag=tagged.tag)
            with contextlib.suppress(Exception):  # best effort: the TTL reclaims it otherwise
                yield Call("Release", withdraw, min(timeout, CLEANUP_TIMEOUT))
        raise
    return resp


def room_within(
    lease: Steps[T], cut: bool, timeout: float | None, *, started: bool = False
) -> Steps[T]:
    """`lease`, whose wait for room was cut short by a call's `timeout` when `cut`. Before
    the request began, a pool still full when that time is up stays what it is,
    `ResourceExhausted` with reason POOL_EXHAUSTED, which says what to do (wait longer, a
    larger pool), reworded to name the timeout that ended the wait. A stream that has
    `started` waits for the room its own encode frees: its time running out there is the
    call's deadline passing, `DeadlineExceeded`."""
    try:
        return (yield from lease)
    except ResourceExhausted as err:
        if not cut or err.reason is not Reason.POOL_EXHAUSTED or STALL_TEXT in err.message:
            raise
        if started:
            raise DeadlineExceeded(
                f"the timeout of {timeout:g} s passed while the stream waited for room for "
                f"its next chunk: {err.message}"
            ) from None
        err.reword(
            f"the timeout of {timeout:g} s passed while waiting for room in the pool: {err.message}"
        )
        raise


def give_back_all(
    release: Callable[[Lease | str], Steps[None]], leases: Iterable[Lease | str]
) -> Steps[None]:
    """Release each lease, as cleanup: a failure to is not the caller's error. A cancel or
    Ctrl-C meanwhile (anyio cancels at every await) stops none of the rest, and goes on
    after them; once the daemon does not answer in time, the rest are left to its TTL
    instead of each waiting out its own timeout."""
    pending: BaseException | None = None
    for lease in leases:
        try:
            yield from release(lease)
        except TransportError:
            break
        except SidecarError:
            continue
        except GeneratorExit:
            raise
        except BaseException as exc:
            pending = pending or exc
    if pending is not None:
        raise pending
