"""From the daemon's replies to the client's result types, with the client's own timings."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.json_format import MessageToDict

from sidecar.api.v1 import sidecar_pb2 as pb

from ._errors import ServerError
from ._slabs import SlabInfo
from ._types import Attachment, EncodeResult, Preview, Status, Timings

# Fields the client's types take as the daemon's messages name them.
DAEMON_STAGES = tuple(
    f"{stage}_ms"
    for stage in ("queue", "validate", "open", "convert", "encode", "mux", "finalize", "previews")
)
PREVIEW_FIELDS = (
    "kind", "mime_type", "size_bytes", "width", "height", "tile_width", "tile_height",
    "columns", "rows",
)  # fmt: skip
RESULT_FIELDS = (
    "frames", "width", "height", "codec", "container", "size_bytes", "request_id",
    "audio_samples",
)  # fmt: skip
STATUS_FIELDS = (
    "server_version", "instance_id", "uptime_s", "active_encodes", "queued_encodes",
    "max_concurrent_encodes", "live_clients", "encoder_processes", "clients_attached",
    "output_dir", "shm_dir", "shm_prefix",
)  # fmt: skip


def same_named(message: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    """`fields` of `message`, by name: for a type whose fields are named as its."""
    return {name: getattr(message, name) for name in fields}


class Clock:
    """The client's stages of one call, in milliseconds (see `Timings`)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.lease_ms = 0.0
        self.copy_ms = 0.0
        self.transfer_ms = 0.0
        self._transfer_began: float | None = None
        self._stopped: float | None = None

    @contextlib.contextmanager
    def leasing(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.lease_ms += (time.perf_counter() - t0) * 1e3

    @contextlib.contextmanager
    def copying(self) -> Iterator[None]:
        """Around a copy into a lease (or a wait for one to land); the first one of a
        transfer starts it."""
        t0 = time.perf_counter()
        if self._transfer_began is None:
            self._transfer_began = t0
        try:
            yield
        finally:
            self.copy_ms += (time.perf_counter() - t0) * 1e3

    def transferred(self) -> None:
        """Every frame of the transfer is in the leases."""
        if self._transfer_began is not None:
            self.transfer_ms += (time.perf_counter() - self._transfer_began) * 1e3
            self._transfer_began = None

    def stop(self) -> None:
        """The call is over for the caller (what follows is bookkeeping)."""
        self._stopped = time.perf_counter()

    def total_ms(self) -> float:
        ended = time.perf_counter() if self._stopped is None else self._stopped
        return (ended - self.started) * 1e3


class ResultBuilder:
    """Consumes an Encode reply stream; `result()` assembles the EncodeResult."""

    def __init__(
        self,
        on_progress: Callable[[int, int], None] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> None:
        self._on_progress = on_progress
        self._on_chunk = on_chunk
        # The video's length when the client knows it and the daemon does not (a whole
        # video sent as a stream): progress then has a total from the start.
        self.frames_total = 0
        self._chunks: list[bytes] = []
        self._received = 0
        self._result: pb.EncodeResult | None = None
        self.next_lease: pb.LeaseResponse | None = None
        self.data_lease: pb.LeaseResponse | None = None  # the output is in it
        # Previews that came in `data_lease` after the output, by their place in the result.
        self._leased_previews: dict[int, bytes] = {}

    def feed(self, event: pb.EncodeEvent) -> bytes | None:
        """Take one reply; returns the bytes of an output chunk, if it was one."""
        kind = event.WhichOneof("event")
        if kind == "progress":
            if self._on_progress is not None:
                total = event.progress.frames_total or self.frames_total
                self._on_progress(event.progress.frames_done, total)
        elif kind == "chunk":
            if event.chunk.offset != self._received:
                raise ServerError(
                    f"output chunk at {event.chunk.offset}, expected {self._received}"
                )
            self._take_chunk(event.chunk.data)
            return event.chunk.data
        elif kind == "result":
            self.take_result(event.result)
        return None

    @property
    def output_in_next_lease(self) -> bool:
        """The output came in the lease granted for the next request."""
        lease, spare = self.data_lease, self.next_lease
        return lease is not None and spare is not None and lease.lease_id == spare.lease_id

    @property
    def has_result(self) -> bool:
        return self._result is not None

    @property
    def wants_events(self) -> bool:
        """Progress or chunks were asked for: the reply must be a stream."""
        return self._on_progress is not None or self._on_chunk is not None

    def take_result(self, result: pb.EncodeResult) -> None:
        """The result: the last reply of a stream, or a framed request's only one."""
        # The leases first: a callback below that raises must not make us forget them.
        if result.HasField("data_lease"):
            self.data_lease = result.data_lease
        if result.HasField("next_lease"):
            self.next_lease = result.next_lease
        data = result.data  # each read of a bytes field is a copy
        if data:  # the output, sent with the result
            self._take_chunk(data)
        self._result = result
        if self._on_progress is not None:
            self._on_progress(result.frames, result.frames)

    def take_from_lease(self, region: Any) -> None:
        """Copy the output out of `data_lease`'s mapped region, and the previews that
        follow it there, before it goes back (or is reused as the spare)."""
        assert self._result is not None
        self._take_chunk(bytes(region[: self._result.size_bytes]))
        for i, preview in enumerate(self._result.previews):
            if preview.in_lease:
                start = preview.lease_offset
                self._leased_previews[i] = bytes(region[start : start + preview.size_bytes])

    def _take_chunk(self, data: bytes) -> None:
        self._chunks.append(data)
        self._received += len(data)
        if self._on_chunk is not None:
            self._on_chunk(data)

    def result(self, clock: Clock) -> EncodeResult:
        r = self._result
        if r is None:
            raise ServerError("the daemon ended the encode without a result")
        data = b"".join(self._chunks) if not r.path else None
        if data is not None and len(data) != r.size_bytes:
            raise ServerError(f"received {len(data)} bytes, the daemon reported {r.size_bytes}")
        timings = Timings(
            lease_ms=clock.lease_ms,
            copy_ms=clock.copy_ms,
            daemon_ms=r.timings.total_ms,
            transfer_ms=clock.transfer_ms,
            total_ms=clock.total_ms(),
            **same_named(r.timings, DAEMON_STAGES),
        )
        return EncodeResult(
            data=data,
            path=r.path or None,
            duration=r.duration_s,
            timings=timings,
            previews=tuple(self._preview(i, p) for i, p in enumerate(r.previews)),
            **same_named(r, RESULT_FIELDS),
        )

    def _preview(self, index: int, p: pb.Preview) -> Preview:
        """A preview of the result: its bytes from the result or the output's lease, or
        the file it was written to."""
        data: bytes | None = None
        if not p.path:
            data = self._leased_previews.get(index) if p.in_lease else p.data
            if data is None or len(data) != p.size_bytes:
                got = "none" if data is None else len(data)
                raise ServerError(
                    f"the {p.kind} has {got} bytes, the daemon reported {p.size_bytes}"
                )
        return Preview(
            data=data,
            path=p.path,
            frames=tuple(p.frames),
            times_s=tuple(p.times_s),
            **same_named(p, PREVIEW_FIELDS),
        )


def attachment_from_proto(resp: pb.AttachResponse) -> Attachment:
    lim = resp.limits
    return Attachment(
        client_token=resp.client_token,
        instance_id=resp.instance_id,
        shm_dir=resp.shm_dir,
        slabs=tuple(SlabInfo(s.id, s.shm_name, s.size) for s in resp.slabs),
        max_lease_bytes=lim.max_lease_bytes,
        alignment=lim.alignment or 1,
        max_frames=lim.max_frames,
        max_width=lim.max_width,
        max_height=lim.max_height,
        lease_ttl=lim.lease_ttl_ms / 1e3,
        max_lease_wait=lim.max_lease_wait_ms / 1e3,
        server_version=resp.server_version,
        framed_reply_max_bytes=resp.framed_reply_max_bytes,
    )


def status_from_proto(resp: pb.StatusResponse) -> Status:
    def as_dict(message: Any) -> dict[str, Any]:
        return MessageToDict(  # type: ignore[no-any-return]
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    counters = as_dict(resp.counters)
    counters = {
        k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in counters.items()
    }
    counters["errors"] = {k: int(v) for k, v in resp.counters.errors.items()}
    counters["lease_refusals"] = {k: int(v) for k, v in resp.counters.lease_refusals.items()}
    return Status(
        pool={k: int(v) for k, v in as_dict(resp.pool).items()},
        counters=counters,
        **same_named(resp, STATUS_FIELDS),
        lease_waiters=[
            {"client": w.client, "bytes": w.bytes, "regions": w.regions, "waited_s": w.waited_s}
            for w in resp.lease_waiters
        ],
    )
