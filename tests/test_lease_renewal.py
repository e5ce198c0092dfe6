"""A client that keeps calling never loses its leases to the TTL; a silent one does."""

from __future__ import annotations

import time

import grpc
import pytest

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc


def test_calls_renew_leases_and_silence_reclaims_them(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(lease_ttl=1.5)
    with grpc.insecure_channel(f"unix:{d.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)
        busy = s.Attach(pb.AttachRequest(client_name="busy")).client_token
        quiet = s.Attach(pb.AttachRequest(client_name="quiet")).client_token
        held = s.Lease(pb.LeaseRequest(client_token=busy, size=4096))
        lost = s.Lease(pb.LeaseRequest(client_token=quiet, size=4096))
        deadline = time.monotonic() + 4.0  # well past the TTL
        while time.monotonic() < deadline:  # working: leasing and releasing other regions
            other = s.Lease(pb.LeaseRequest(client_token=busy, size=4096))
            s.Release(pb.ReleaseRequest(client_token=busy, lease_id=other.lease_id))
            time.sleep(0.3)
        s.Release(pb.ReleaseRequest(client_token=busy, lease_id=held.lease_id))
        with pytest.raises(grpc.RpcError) as err:
            s.Release(pb.ReleaseRequest(client_token=quiet, lease_id=lost.lease_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
