"""What carries a bytes output back, in the order they are tried (see handback)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from sidecar.pipeline.admission.plans import EncodeOutcome
from sidecar.pipeline.admission.requests import EncodeSpec, OneReply, VideoRequest
from sidecar.pipeline.output.handback import (
    CHUNK_SIZE,
    InChunks,
    InLease,
    InResult,
    OutputHandBack,
    TooLarge,
)

MIB = 1024 * 1024
FRAMED = OneReply(1023 * MIB, lease_past=MIB)


def spec(**kwargs: Any) -> EncodeSpec:
    return EncodeSpec("token", "r", VideoRequest(16, 16, "rgb24", (24, 1)), **kwargs)


def outcome(size: int) -> EncodeOutcome:
    return EncodeOutcome(4, 0.1, size, "", None, 0, {}, data=b"x" * size)


def carriers(request: EncodeSpec, size: int, *, whole: bool = True, waiting: int = 0) -> list[Any]:
    handback = OutputHandBack(
        cast(Any, None), cast(Any, None), cast(Any, SimpleNamespace(waiting=waiting))
    )
    found = handback.carriers(request, outcome(size), whole)
    return [(type(w), getattr(w, "next_lease", None)) for w in found]


@pytest.mark.parametrize(
    ("request_", "size", "whole", "expected"),
    [
        # A stream's output goes in chunks (its client may not map the slabs).
        (spec(), 10, False, [InChunks]),
        (spec(), 2 * MIB, False, [InChunks]),
        # A whole video's client maps the slabs: small inside the result, else a lease.
        (spec(), CHUNK_SIZE, True, [InResult]),
        (spec(), CHUNK_SIZE + 1, True, [InLease, InChunks]),
        # The framed socket's one reply: past 1 MiB a lease, else inside up to its limit.
        (spec(one_reply=FRAMED), MIB, True, [InResult]),
        (spec(one_reply=FRAMED), 2 * MIB, True, [InLease, InResult]),
        (spec(one_reply=FRAMED), 1023 * MIB + 1, True, [InLease, TooLarge]),
    ],
)
def test_each_request_tries_its_carriers_in_order(
    request_: EncodeSpec, size: int, whole: bool, expected: list[type]
) -> None:
    assert [kind for kind, _ in carriers(request_, size, whole=whole)] == expected


def test_the_next_lease_comes_first_for_whole_videos_when_none_waits_for_room() -> None:
    request = spec(next_lease_bytes=4 * MIB, one_reply=FRAMED)
    assert carriers(request, 2 * MIB) == [(InLease, True), (InLease, False), (InResult, None)]
    assert carriers(request, 2 * MIB, waiting=1) == [(InLease, False), (InResult, None)]
    assert carriers(request, 32 * 1024) == [(InResult, None)]  # small: quicker inside the result
    on_encode = spec(next_lease_bytes=4 * MIB)
    assert carriers(on_encode, 2 * MIB) == [(InLease, True), (InLease, False), (InChunks, None)]
    assert carriers(on_encode, 2 * MIB, whole=False) == [(InChunks, None)]


def test_an_output_already_sent_has_nothing_left_to_send() -> None:
    sent = EncodeOutcome(4, 0.1, 5 * MIB, "", None, 0, {})
    handback = OutputHandBack(
        cast(Any, None), cast(Any, None), cast(Any, SimpleNamespace(waiting=0))
    )
    assert [type(w) for w in handback.carriers(spec(one_reply=FRAMED), sent, True)] == [InChunks]


def test_the_request_layer_imports_no_av() -> None:
    """What an encode is asked, its reply limits included, is plain data: no PyAV."""
    import subprocess
    import sys

    code = "import sys, sidecar.pipeline.admission.requests; print('av' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
