"""The client's I/O-free core: one session with a daemon, written once for both twins.

`ClientCore` holds the state (the attachment, slab mappings, CUDA state, the spare
lease; see `AttachedCore`) and the logic of the calls as `Steps` (see `_steps`): attach,
re-attach after a daemon restart, leases and the spare lease, fork awareness,
inspection, closing. It never touches the network; `SidecarClient` and
`AsyncSidecarClient` perform its ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import Reason

from ._attached import AttachedCore, cuda_in_use
from ._audio import Pcm
from ._convert import Conversion
from ._cuda_video import CudaVideo
from ._errors import (
    FailedPrecondition,
    NotFound,
    ServerError,
    SidecarError,
    SidecarUnavailable,
    error_from_reply,
)
from ._leasing import (
    CLEANUP_TIMEOUT,
    REFUSAL_MARGIN_S,
    give_back_all,
    lease_over_grpc,
    room_within,
)
from ._options import VideoFormat, check_lease
from ._results import status_from_proto
from ._slabs import PROCESS_MAPS
from ._steps import Call, Exchange, Steps, Work
from ._types import Lease, Status
from ._video import VideoSource, prepare_video

MAX_WAIT_MS = 2**32 - 1  # LeaseRequest.wait_ms is a uint32


def audio_in(pcm: Pcm, lease: Lease) -> list[pb.AudioData]:
    """The audio track written at the start of `lease`, as the request names it."""
    lease.array[: pcm.nbytes] = pcm.data.reshape(-1).view("u1")
    return [pb.AudioData(range=pb.AudioRange(lease_id=lease.id, offset=0, size=pcm.nbytes))]


class ClientCore(AttachedCore):
    """An attachment (see `AttachedCore`), with leases, videos, inspection and closing."""

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
        # The daemon's refusal, which says what to do, must come back before the call's
        # own time is up: it waits a little less than that time.
        wait_s = max(0.0, min(wait_s, limit - REFUSAL_MARGIN_S))
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
                reply: pb.FramedReply = yield Exchange(
                    request, self.framed, timeout, self.framed_reply_max
                )
            except (ServerError, SidecarUnavailable) as err:
                if isinstance(err, ServerError) and err.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.framed_lost(str(err))  # it never saw the request
            else:
                if reply.HasField("error"):
                    raise error_from_reply(reply.error)
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

    def prepare(self, video: Any, fmt: VideoFormat) -> VideoSource:
        return prepare_video(
            video,
            pixel_format=fmt.pixel_format,
            layout=fmt.layout,
            value_range=fmt.value_range,
            cuda=self._cuda_video,
        )

    def _cuda_video(self, view: Any, conversion: Conversion) -> CudaVideo:
        host = self.cuda_host()
        host.serve(view.device)
        return CudaVideo(view, conversion, host)

    def warm_up(self, device: Any = None) -> Steps[None]:
        """Attach; with a CUDA device, register the slabs and load the GPU kernels; else
        fill in the slabs' page tables."""
        yield from self.attach()
        if self.inline:
            return
        if device is not None or cuda_in_use():
            yield Work(functools.partial(self.cuda_host().warm_up, device), long=True)
        else:
            yield Work(PROCESS_MAPS.populate, long=True)

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
