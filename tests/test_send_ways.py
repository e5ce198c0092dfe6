"""Which way an encode goes: the chooser's table, the framed socket lost and found, and
the real client against a daemon taking the way the chooser names."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from client import SidecarClient
from client import _steps as ops
from client._choice import SendFacts, WayName, choose_way
from client._core import ClientCore
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb

from .helpers import recorded_ways

FRAMED, REPLIES, STREAM = WayName.FRAMED, WayName.REPLIES, WayName.STREAM


def _never_asked() -> bool:
    raise AssertionError("the framed socket was asked of, though the choice does not turn on it")


def facts(
    framed: bool | None, *, mapped: bool = True, fits: bool = True, events: bool = False
) -> SendFacts:
    """Facts with the framed socket in reach or not; None: the choice must not ask."""
    return SendFacts(
        slabs_mapped=mapped,
        fits_in_pool=fits,
        wants_events=events,
        framed=_never_asked if framed is None else lambda: framed,
    )


# The chooser's table: (the framed socket in reach, or None where the choice must not
# ask; whether the slabs are mapped; whether the video fits the pool; events asked for)
# and the way it must pick.
TABLE = [
    # Frames sent inline, or too many to lease at once: a stream, whatever else holds.
    (None, False, True, False, STREAM),
    (None, False, True, True, STREAM),
    (None, True, False, False, STREAM),
    (None, True, False, True, STREAM),
    # Progress or chunks asked for: Encode's reply stream, even with the framed socket.
    (None, True, True, True, REPLIES),
    # One reply: the framed socket where it is in reach, else Encode.
    (True, True, True, False, FRAMED),
    (False, True, True, False, REPLIES),
]


def _row_id(row: tuple[Any, ...]) -> str:
    framed, mapped, fits, events, expected = row
    said = [
        "inline" if not mapped else "",
        "over-pool" if not fits else "",
        "events" if events else "",
        "" if framed is None else ("framed" if framed else "no-framed"),
    ]
    return f"{'-'.join(word for word in said if word)}->{expected.value}"


@pytest.mark.parametrize("row", TABLE, ids=[_row_id(row) for row in TABLE])
def test_the_chooser_picks_by_the_table(row: tuple[Any, ...]) -> None:
    framed, mapped, fits, events, expected = row
    assert choose_way(facts(framed, mapped=mapped, fits=fits, events=events)) is expected


def _core() -> ClientCore:
    return ClientCore(
        "unix:/nowhere.sock", client_name="t", timeout=None, lease_wait=1.0, transport="inline"
    )


def test_a_framed_socket_out_of_reach_is_no_longer_offered() -> None:
    core = _core()
    core.framed = "/run/x.sock.framed"
    assert core.framed_in_reach()
    core.framed_lost("no such file")
    assert core.framed == "" and not core.framed_in_reach()


def _way_of(op: ops.Op) -> WayName | None:
    """The way an op sends an encode on; None for any other op."""
    if isinstance(op, ops.Exchange) and isinstance(op.request, pb.EncodeRequest):
        return FRAMED
    if isinstance(op, ops.Replies):
        return REPLIES
    if isinstance(op, ops.OpenStream):
        return STREAM
    return None


CLIP = moving_pattern(4, 64, 96)
LONG = moving_pattern(64, 256, 256)


def _progress(done: int, total: int) -> None:
    pass


@pytest.mark.parametrize(
    ("daemon_options", "client_options", "video", "encode_options", "expected"),
    [
        ({}, {}, CLIP, {}, FRAMED),
        ({}, {}, LONG, {"timeout": 30}, FRAMED),
        ({"framed_socket": False}, {}, CLIP, {}, REPLIES),
        ({"framed_socket": False}, {}, LONG, {}, REPLIES),
        ({}, {}, CLIP, {"on_progress": _progress}, REPLIES),
        ({}, {"transport": "inline"}, CLIP, {}, STREAM),
    ],
    ids=["framed", "framed-long", "grpc", "grpc-long", "progress", "inline"],
)
def test_the_client_takes_the_way_the_chooser_names(
    make_daemon: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    daemon_options: dict[str, Any],
    client_options: dict[str, Any],
    video: np.ndarray,
    encode_options: dict[str, Any],
    expected: WayName,
) -> None:
    """A real daemon: the way the chooser named (`recorded_ways`) is the way the
    client's ops really took."""
    chosen = recorded_ways(monkeypatch)
    taken: list[WayName] = []
    perform = SidecarClient._perform

    def recording(self: SidecarClient, op: ops.Op) -> Any:
        way = _way_of(op)
        if way is not None:
            taken.append(way)
        return perform(self, op)

    monkeypatch.setattr(SidecarClient, "_perform", recording)
    d = make_daemon(**daemon_options)
    with d.client(**client_options) as c:
        result = c.encode(video, **encode_options)
    assert result.frames == len(video)
    assert [WayName(way) for way in chosen] == taken == [expected]


def test_a_framed_socket_lost_since_it_was_chosen_is_not_asked() -> None:
    """A way is chosen before the request's leases are granted; by the time it is asked,
    the framed socket may have proved out of reach (a lease on it): Encode is asked."""
    from client._encode import Outgoing, call_encode
    from client._results import Clock, ResultBuilder
    from client._send import request_way
    from client._steps import run_blocking
    from client._ways import REQUEST_WAYS

    core = _core()
    core.framed = "/run/x.sock.framed"
    case = SendFacts(
        slabs_mapped=True, fits_in_pool=True, wants_events=False, framed=core.framed_in_reach
    )
    assert choose_way(case) is FRAMED
    core.framed_lost("lost meanwhile")
    rechoose = functools.partial(request_way, case)
    out = Outgoing(pb.EncodeRequest(), ResultBuilder(None), Clock(), None, None, rechoose)
    result = pb.EncodeResult(frames=4, data=b"mp4", size_bytes=3)
    taken: list[WayName | None] = []

    def perform(op: ops.Op) -> Any:
        taken.append(_way_of(op))
        assert isinstance(op, ops.Replies)
        op.feed(pb.EncodeEvent(result=result))
        return None

    assert run_blocking(call_encode(core, out, REQUEST_WAYS[FRAMED]), perform).frames == 4
    assert taken == [REPLIES]


def test_an_unreachable_framed_socket_sends_the_request_on_grpc() -> None:
    """The framed connection could not be opened (it never saw the request): the same
    request goes on Encode, and later ones too until the next Attach."""
    import grpc

    from client._encode import Outgoing, call_encode
    from client._errors import error_for
    from client._results import Clock, ResultBuilder
    from client._send import request_way
    from client._steps import run_blocking
    from client._ways import REQUEST_WAYS

    core = _core()
    core.framed = "/run/x.sock.framed"
    case = SendFacts(
        slabs_mapped=True, fits_in_pool=True, wants_events=False, framed=core.framed_in_reach
    )
    out = Outgoing(
        pb.EncodeRequest(), ResultBuilder(None), Clock(), None, None,
        functools.partial(request_way, case),
    )  # fmt: skip
    result = pb.EncodeResult(frames=4, data=b"mp4", size_bytes=3)
    taken: list[WayName | None] = []

    def perform(op: ops.Op) -> Any:
        taken.append(_way_of(op))
        if isinstance(op, ops.Exchange):
            raise error_for(grpc.StatusCode.UNIMPLEMENTED, "framed socket: no such file")
        op.feed(pb.EncodeEvent(result=result))  # type: ignore[union-attr]
        return None

    assert run_blocking(call_encode(core, out, REQUEST_WAYS[FRAMED]), perform).frames == 4
    assert taken == [FRAMED, REPLIES] and not core.framed_in_reach()
