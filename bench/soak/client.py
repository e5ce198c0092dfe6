"""One fuzzing client's connections, tallies and leases."""

from __future__ import annotations

import mmap
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .requests import LEASE, full_size_requests
from .wire import Framed

SERVER_ERRORS = {"UNKNOWN", "INTERNAL", "DATA_LOSS"}
REFUSED = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION", "ALREADY_EXISTS"}


class SoakClient:
    """One client thread's connections: its own channel, token, slab mappings, random stream
    and tallies."""

    def __init__(self, socket_path: str, scratch: Path, seed: int) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub = pb_grpc.VideoSidecarStub(self.channel)
        self.scratch, self.r, self.seed = scratch, random.Random(seed), seed
        attached = self.stub.Attach(pb.AttachRequest(client_name=f"soak-{seed}"))
        self.token = attached.client_token
        self.maps: dict[int, mmap.mmap] = {}
        for slab in attached.slabs:
            with open(os.path.join(attached.shm_dir, slab.shm_name), "r+b") as f:
                self.maps[slab.id] = mmap.mmap(f.fileno(), slab.size)
        self.codes: Counter[str] = Counter()
        self.offending: Counter[str] = Counter()
        self.problems: list[str] = []
        self.held: set[str] = set()
        self.framed = Framed(f"{socket_path}.framed")
        self.left_open: list[socket.socket] = []  # framed connections with a half-sent message
        self.full = full_size_requests(self.token)  # made once: building one holds the GIL
        # request id: (sent, left, how)
        self.abandoned_at: dict[str, tuple[float, float, str]] = {}
        self.raw_framed = Framed(f"{socket_path}.framed", raw=True)

    def close(self) -> None:
        for lease_id in sorted(self.held):
            self.release(lease_id, "cleanup")
        self.framed.close()
        self.raw_framed.close()
        for sock in self.left_open:
            sock.close()
        self.channel.close()
        for m in self.maps.values():
            m.close()

    def call(self, kind: str, fn: Callable[..., Any], request: Any, detail: str = "") -> str:
        try:
            result = fn(request, timeout=30)
            results = [result] if isinstance(result, pb.EncodeResult) else []  # a framed one
            if not hasattr(result, "DESCRIPTOR") and not isinstance(result, bytes):
                # A reply stream.
                results = [e.result for e in result if isinstance(e, pb.EncodeEvent)]
            spares = []
            for one in results:
                if one.HasField("next_lease"):
                    spares.append(one.next_lease.lease_id)
                if one.HasField("data_lease"):  # an output to read, then free
                    spares.append(one.data_lease.lease_id)
            code = "OK"
            for lease_id in dict.fromkeys(spares):  # granted with the result: ours to give back
                if self.release(lease_id, "release-next") != "OK":
                    self.problems.append("(c) a lease granted with a result was not releasable")
        except grpc.RpcError as err:
            code = err.code().name
        self.codes[f"{kind}:{code}"] += 1
        if code in SERVER_ERRORS:
            self.offending[f"{kind} {detail}".strip() + f" -> {code}"] += 1
        return code

    def lease(self, frames: bytes = b"") -> pb.LeaseResponse:
        request = pb.LeaseRequest(client_token=self.token, size=LEASE, wait_ms=5000)
        lease = self.stub.Lease(request, timeout=30)
        self.held.add(lease.lease_id)
        self.maps[lease.slab_id][lease.offset : lease.offset + len(frames)] = frames
        return lease

    def release(self, lease_id: str, kind: str = "release-own", token: str | None = None) -> str:
        self.held.discard(lease_id)
        request = pb.ReleaseRequest(client_token=self.token, lease_id=lease_id)
        request.client_token = request.client_token if token is None else token
        return self.call(kind, self.stub.Release, request)

    def settle(self, kind: str, lease_id: str, code: str) -> None:
        """Give a lease back; one named by a refused request must still be ours."""
        released = self.release(lease_id)
        if code in REFUSED and released != "OK":
            self.problems.append(f"(c) {kind} refused with {code}, then Release said {released}")

    def cancelled_stream(
        self, messages: Iterable[pb.StreamRequest], hold_s: float, timeout: float, wait: float
    ) -> Any:
        """An EncodeStream call that sends `messages`, keeps its side open (`hold_s` at
        most), and is cancelled `wait` seconds after it began: its client gone while the
        daemon may be encoding. Returns the cancelled call."""
        gate = threading.Event()

        def feed() -> Iterator[pb.StreamRequest]:
            yield from messages
            gate.wait(hold_s)

        reply = self.stub.EncodeStream(feed(), timeout=timeout)
        time.sleep(wait)
        reply.cancel()
        gate.set()
        return reply
