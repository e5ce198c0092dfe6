"""The client's I/O-free core, its first half: one attachment to a daemon.

`AttachedCore` holds the target, the attachment and the slabs it maps, the CUDA state
that registers them, fork awareness, and what this daemon and client serve for a request
answered in one reply. `ClientCore` (`_core`) adds leases, videos and inspection.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import Reason

from ._channel import fork_generation, no_daemon, resolve_target
from ._cuda import CudaHost, process_host
from ._errors import DeadlineExceeded, SidecarError, SidecarUnavailable
from ._framed import framed_path
from ._results import attachment_from_proto
from ._slabs import PROCESS_MAPS, SlabMap
from ._spare import Spare
from ._steps import Call, Exclusive, Steps
from ._types import Attachment

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSPORTS = ("auto", "shm", "inline")
# A lease's wait with no bound of its own: as long as the pool moves, within the call's
# timeout. The daemon refuses it once nothing in the pool has moved for its max wait.
UNBOUNDED_WAIT = 24 * 3600.0


def cuda_in_use() -> bool:
    """Whether this process has started CUDA (through torch): a GPU worker."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


class AttachedCore:
    """Target, attachment, slab mappings, CUDA state, fork detection, the framed socket."""

    def __init__(
        self,
        target: str | None,
        *,
        client_name: str,
        timeout: float | None,
        lease_wait: float | None,
        transport: str,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: use {', '.join(TRANSPORTS)}")
        self.transport = transport
        self.inline = transport == "inline"  # frames travel inside gRPC messages
        self.target = resolve_target(target)
        self.client_name = client_name or f"pid-{os.getpid()}"
        self.timeout = timeout
        # None: as long as the pool keeps moving (the daemon refuses a waiter once
        # nothing in it has moved for its --max-lease-wait), within a call's timeout.
        self.lease_wait = UNBOUNDED_WAIT if lease_wait is None else lease_wait
        self.slabs = SlabMap()
        self.cuda: CudaHost | None = None
        self.attachment: Attachment | None = None
        self._generation = fork_generation()
        self.spare = Spare()
        # The daemon's framed socket (see `_framed`), as the last Attach named it; "" once
        # it could not be reached, until the next Attach.
        self.framed = ""

    # -- the framed socket -----------------------------------------------------------------

    def framed_in_reach(self) -> bool:
        """Whether requests go to the framed socket now: named by the last Attach, and
        not lost since."""
        return bool(self.framed)

    def framed_lost(self, why: str = "") -> None:
        """The framed socket could not be reached (its requests never got there): gRPC
        serves until the next Attach."""
        log.info("%s; using gRPC until the next attach", why or "no framed socket")
        self.framed = ""

    @property
    def framed_reply_max(self) -> int:
        """The largest reply the framed socket sends, as the daemon announced it."""
        return self.attachment.framed_reply_max_bytes if self.attachment else 0

    @property
    def unary_timeout(self) -> float:
        return self.timeout or 10.0

    # -- fork awareness ------------------------------------------------------------------

    def forked(self) -> bool:
        """True once in a child after fork: the parent's token and spare lease are not
        this process's to use or give back. The child keeps the inherited slab mappings
        (they stay valid); `CudaHost` forgets the CUDA registrations on its own."""
        if self._generation == fork_generation():
            return False
        self._generation = fork_generation()
        self.attachment = None
        self.spare.drop()
        return True

    # -- attach --------------------------------------------------------------------------

    def attach(self, *, refresh: bool = False) -> Steps[Attachment]:
        """Attach (once) and map the daemon's slabs; `refresh` attaches anew."""
        self.forked()
        if self.attachment is not None and not refresh:
            return self.attachment
        stale = self.attachment if refresh else None
        attachment: Attachment = yield Exclusive(self._attach(stale))
        return attachment

    def _attach(self, stale: Attachment | None, wait: float | None = None) -> Steps[Attachment]:
        """Attach, under the lock; `wait`: seconds to wait for a daemon that restarts."""
        # One that another call made meanwhile will do, unless stale.
        if self.attachment is not None and self.attachment is not stale:
            return self.attachment
        request = pb.AttachRequest(client_name=self.client_name, pid=os.getpid())
        try:
            timeout = wait or self.unary_timeout
            resp = yield Call("Attach", request, timeout, wait_for_ready=bool(wait))
        except DeadlineExceeded:
            if not wait:
                raise
            unavailable = SidecarUnavailable(f"{no_daemon(self.target)} (waited {wait:g}s)")
            unavailable.unsent = True
            raise unavailable from None
        attachment = attachment_from_proto(resp)
        if self.transport != "inline":
            self._map_slabs(attachment)
        self.attachment = attachment
        self.framed = framed_path(self.target, resp.framed_socket, resp.framed_version)
        self.spare.drop()  # leases belong to the old token
        if self.inline:
            return attachment
        if cuda_in_use():  # a GPU worker: registrations, kernels; none of it in a request
            self.cuda_host().warm_in_background()
        else:  # the page tables, before later requests' copies reach them
            PROCESS_MAPS.populate_in_background()
        return attachment

    def _map_slabs(self, attachment: Attachment) -> None:
        try:
            self.slabs.map(attachment.instance_id, attachment.shm_dir, list(attachment.slabs))
        except SidecarUnavailable:
            if self.transport == "shm":
                raise
            # Not on the daemon's host (or not in its IPC namespace): send frames inline.
            log.info("shared memory out of reach, sending frames inline: %s", self.target)
            self.inline = True

    def reattached(self, steps: Callable[[], Steps[T]], within: float | None = None) -> Steps[T]:
        """Run `steps`, once more after attaching again if the daemon no longer knows our
        token (it restarted), or could not be reached at all while this client had
        attached before (it is restarting; nothing was sent): then the attach waits up to
        `within` (else the unary timeout) for it to answer. Calls that fail together
        attach anew once."""
        used = self.attachment
        try:
            return (yield from steps())
        except SidecarError as err:
            restarting = err.unsent and used is not None
            if err.reason is not Reason.NOT_ATTACHED and not restarting:
                raise
        stale = used if used is not None else self.attachment
        yield Exclusive(self._attach(stale, wait=within or self.unary_timeout))
        return (yield from steps())

    def cuda_host(self) -> CudaHost:
        if self.cuda is None:
            self.cuda = process_host()  # shared by the process's clients, as its mappings
        return self.cuda
