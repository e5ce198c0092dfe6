"""The client's I/O-free core: one session with a daemon, written once for both twins.

`ClientCore` holds the state (the attachment, slab mappings, CUDA state, the spare
lease) and the logic of the calls as `Steps` (see `_steps`): attach, re-attach after a
daemon restart, leases and the spare lease, fork awareness, inspection, closing. It never
touches the network; `SidecarClient` and `AsyncSidecarClient` perform its ops.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import Reason

from ._audio import Pcm
from ._channel import fork_generation, resolve_target
from ._convert import Conversion
from ._cuda import CudaHost, CudaVideo
from ._errors import (
    FailedPrecondition,
    NotFound,
    ServerError,
    SidecarError,
    SidecarUnavailable,
    error_from_session,
)
from ._framed import framed_path
from ._leasing import CLEANUP_TIMEOUT, give_back_all, lease_over_grpc, room_within
from ._options import VideoFormat, check_lease
from ._results import attachment_from_proto, status_from_proto
from ._slabs import SlabMap
from ._spare import Spare
from ._steps import Call, Exchange, Exclusive, Steps, Work
from ._types import Attachment, Lease, Status
from ._video import VideoSource, prepare_video, warn_caller

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSPORTS = ("auto", "shm", "inline")
# A lease's wait with no bound of its own: as long as the pool moves, within the call's
# timeout. The daemon refuses it once nothing in the pool has moved for its max wait.
UNBOUNDED_WAIT = 24 * 3600.0
MAX_WAIT_MS = 2**32 - 1  # LeaseRequest.wait_ms is a uint32


def _cuda_in_use() -> bool:
    """Whether this process has started CUDA (through torch): a GPU worker."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def audio_in(pcm: Pcm, lease: Lease) -> list[pb.AudioData]:
    """The audio track written at the start of `lease`, as the request names it."""
    lease.array[: pcm.nbytes] = pcm.data.reshape(-1).view("u1")
    return [pb.AudioData(range=pb.AudioRange(lease_id=lease.id, offset=0, size=pcm.nbytes))]


class ClientCore:
    """Target, attachment, slab mappings, CUDA state, the spare lease, fork detection."""

    def __init__(
        self,
        target: str | None,
        *,
        client_name: str,
        timeout: float | None,
        lease_wait: float | None,
        transport: str,
        sessions: bool = True,
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
        # One-reply ways this daemon has not refused as UNIMPLEMENTED (an older one), and
        # the driver can make: `sessions`, whether it keeps EncodeSession calls.
        self._one_reply_ways = {"EncodeSession", "EncodeOnce"} if sessions else {"EncodeOnce"}
        # The daemon's framed socket (see `_framed`), as the last Attach named it; "" once
        # it could not be reached, until the next Attach.
        self.framed = ""

    def one_reply_way(self, deadline: float | None) -> str:
        """How to ask for an encode answered in one reply: "Framed" (the framed socket),
        "EncodeSession" (a kept call; it has no per-request deadline, so only without
        one), "EncodeOnce", or "" when the daemon has none of them (then `Encode`)."""
        if self.framed:
            return "Framed"
        if deadline is None and "EncodeSession" in self._one_reply_ways:
            return "EncodeSession"
        return "EncodeOnce" if "EncodeOnce" in self._one_reply_ways else ""

    def unimplemented(self, way: str, why: str = "") -> None:
        """The daemon lacks `way` (or its framed socket cannot be reached): ask the next."""
        if way == "Framed":
            log.info("%s; using gRPC until the next attach", why or "no framed socket")
            self.framed = ""
        self._one_reply_ways.discard(way)

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

    def _attach(self, stale: Attachment | None) -> Steps[Attachment]:
        # Under the lock. One that another call made meanwhile will do, unless stale.
        if self.attachment is not None and self.attachment is not stale:
            return self.attachment
        request = pb.AttachRequest(client_name=self.client_name, pid=os.getpid())
        resp = yield Call("Attach", request, self.unary_timeout)
        attachment = attachment_from_proto(resp)
        if self.transport != "inline":
            try:
                self.slabs.map(attachment.instance_id, attachment.shm_dir, list(attachment.slabs))
            except SidecarUnavailable:
                if self.transport == "shm":
                    raise
                # Not on the daemon's host (or not in its IPC namespace): send frames inline.
                log.info("shared memory out of reach, sending frames inline: %s", self.target)
                self.inline = True
        self.attachment = attachment
        self.framed = framed_path(self.target, resp.framed_socket, resp.framed_version)
        self.spare.drop()  # leases belong to the old token
        if not self.inline and _cuda_in_use():  # a GPU worker: none of it in a request
            yield Work(self._cuda_host().warm_up, long=True)
        return attachment

    def reattached(self, steps: Callable[[], Steps[T]]) -> Steps[T]:
        """Run `steps`, once more after attaching again if the daemon no longer knows our
        token (it restarted). Calls that fail together attach anew once."""
        used = self.attachment
        try:
            return (yield from steps())
        except SidecarError as err:
            if err.reason is not Reason.NOT_ATTACHED:
                raise
        stale = used if used is not None else self.attachment
        yield Exclusive(self._attach(stale))
        return (yield from steps())

    # -- leases --------------------------------------------------------------------------

    def lease_for_caller(self, nbytes: int, wait: float | None) -> Steps[Lease]:
        """`lease()` of either client: checked, and only where the slabs are mapped."""
        check_lease(nbytes, wait)
        yield from self.attach()  # learns whether the slabs can be mapped here
        if self.inline:
            raise FailedPrecondition(
                "leases are regions of the daemon's shared memory, which this client does not "
                "map (transport='inline', or the slabs are out of its reach); use encode()"
            )
        return (yield from self.lease(nbytes, wait))

    def lease(self, nbytes: int, wait: float | None = None, limit: float = 1e9) -> Steps[Lease]:
        """A lease, waiting up to `wait` for room; the call takes at most `limit` s in all."""
        return (yield from self.lease_together([nbytes], wait, limit))[0]

    def lease_together(
        self, sizes: list[int], wait: float | None = None, limit: float = 1e9
    ) -> Steps[list[Lease]]:
        """Leases of `sizes`, granted together or not at all, waiting in the daemon's queue
        up to `wait` for room; the call takes at most `limit` s in all."""
        return (yield from self.reattached(lambda: self._lease(sizes, wait, limit)))

    def _lease(self, sizes: list[int], wait: float | None, limit: float) -> Steps[list[Lease]]:
        att = yield from self.attach()
        wait_s = self.lease_wait if wait is None else wait
        request = pb.LeaseRequest(
            client_token=att.client_token,
            size=sizes[0],
            more_sizes=sizes[1:],
            wait_ms=min(int(wait_s * 1e3), MAX_WAIT_MS),
        )
        resp = yield from self._unary("Lease", request, min(limit, wait_s + self.unary_timeout))
        return [self.leased(resp), *map(self.leased, resp.more)]

    def leased(self, resp: pb.LeaseResponse) -> Lease:
        region = self.slabs.region(resp.slab_id, resp.offset, resp.size)
        return Lease(resp.lease_id, resp.slab_id, resp.offset, resp.size, region)

    def release(self, lease: Lease | str, timeout: float | None = None) -> Steps[None]:
        """Give a lease back; one the daemon already freed is not an error."""
        lease_id = lease if isinstance(lease, str) else lease.id
        att = yield from self.attach()
        request = pb.ReleaseRequest(client_token=att.client_token, lease_id=lease_id)
        try:
            yield from self._unary("Release", request, timeout or self.unary_timeout)
        except SidecarError as err:  # NOT_ATTACHED: the daemon restarted, the lease with it
            if not isinstance(err, NotFound) and err.reason is not Reason.NOT_ATTACHED:
                raise

    def _unary(
        self, method: str, request: pb.LeaseRequest | pb.ReleaseRequest, timeout: float
    ) -> Steps[Any]:
        """A Lease or Release: on the framed socket while there is one (a fraction of a
        unary gRPC call's cost), else as the gRPC call. A connection
        the daemon ended before replying never had its request taken (it ends idle ones at
        shutdown, busy ones after their reply): it goes to gRPC, served through the grace."""
        if self.framed:
            try:
                reply: pb.FramedReply = yield Exchange(request, self.framed, timeout)
            except (ServerError, SidecarUnavailable) as err:
                if isinstance(err, ServerError) and err.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.unimplemented("Framed", str(err))  # it never saw the request
            else:
                if reply.HasField("error"):
                    raise error_from_session(reply.error)
                return reply.lease if method == "Lease" else reply.release
        if isinstance(request, pb.LeaseRequest):  # tagged: a lost reply loses no lease
            return (yield from lease_over_grpc(request, timeout))
        return (yield Call(method, request, timeout))

    def give_back(self, leases: Iterable[Lease | str]) -> Steps[None]:
        """Release each lease, as cleanup (see `give_back_all`)."""
        cleanup = min(self.unary_timeout, CLEANUP_TIMEOUT)
        yield from give_back_all(lambda lease: self.release(lease, cleanup), leases)

    def lease_for(
        self, sizes: list[int], use_spare: bool, within: float | None
    ) -> Steps[list[Lease]]:
        """What one request needs, all at once: the spare when there is one region, and
        the spare is fresh and large enough, else new leases, granted together (their wait:
        at most `within`). A spare not used goes back first: nothing is held while waiting."""
        spare, stale = self.spare.take(sizes[0] if use_spare and len(sizes) == 1 else None)
        if stale is not None:
            yield from self.give_back([stale])
        if spare is not None:
            return [spare]
        wait = min(self.lease_wait, within or self.lease_wait)
        leases = self.lease_together(sizes, wait)
        return (yield from room_within(leases, wait < self.lease_wait, within))

    def keep_spare(self, lease: pb.LeaseResponse | None, asked_at: float) -> Steps[None]:
        """Keep the newest spare; one it displaces (concurrent requests) goes back."""
        if lease is None or not lease.lease_id:
            return
        ttl = lease.ttl_ms / 1e3 or (self.attachment.lease_ttl if self.attachment else 0.0)
        displaced = self.spare.keep(self.leased(lease), asked_at, ttl)
        if displaced is not None:
            yield from self.give_back([displaced])

    # -- videos and audio ----------------------------------------------------------------

    def prepare(
        self, video: Any, fmt: VideoFormat, warn: Callable[[str], object] | None = warn_caller
    ) -> VideoSource:
        return prepare_video(
            video,
            pixel_format=fmt.pixel_format,
            layout=fmt.layout,
            value_range=fmt.value_range,
            cuda=self._cuda_video,
            warn=warn,
        )

    def _cuda_video(self, view: Any, conversion: Conversion) -> CudaVideo:
        return self._cuda_host().video(view, conversion)

    def _cuda_host(self) -> CudaHost:
        if self.cuda is None:
            self.cuda = CudaHost(self.slabs)
            self.slabs.before_unmap = self.cuda.unregister
        return self.cuda

    def warm_up(self, device: Any = None) -> Steps[None]:
        """Attach; with a CUDA device, register the slabs and compile the GPU kernel."""
        yield from self.attach()
        if not self.inline and (device is not None or _cuda_in_use()):
            yield Work(functools.partial(self._cuda_host().warm_up, device), long=True)

    @property
    def cuda_registrations(self) -> int:
        return self.cuda.registered_slabs() if self.cuda is not None else 0

    def audio_data(self, pcm: Pcm, keep: Callable[[Lease], object]) -> Steps[list[pb.AudioData]]:
        """The audio track as it travels: inline pieces, or one lease (handed to `keep`)."""
        if self.inline:
            return pcm.inline_pieces()
        lease = yield from self.lease(pcm.nbytes)
        keep(lease)
        return audio_in(pcm, lease)

    # -- inspection and closing ----------------------------------------------------------

    def status(self) -> Steps[Status]:
        resp = yield Call("Status", pb.StatusRequest(), self.unary_timeout)
        return status_from_proto(resp)

    def health(self, service: str) -> Steps[str]:
        request = health_pb2.HealthCheckRequest(service=service)
        resp = yield Call("Check", request, self.timeout or 5.0, service="health")
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    def close(self) -> Steps[None]:
        """Give the spare lease back (never the parent's, in a child after fork), unmap."""
        self.forked()
        spare = self.spare.drop()
        if spare is not None:
            yield from self.give_back([spare])
        self.slabs.close()
