"""Which way an encode goes: the chooser's table, what the core offers, and the real
client against a daemon taking the way the chooser names."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from client import SidecarClient
from client import _steps as ops
from client._choice import SendFacts, WayName, choose_way, one_reply_way
from client._core import ClientCore
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb

from .helpers import recorded_ways

FRAMED, SESSION, ONCE, REPLIES, STREAM = (
    WayName.FRAMED,
    WayName.SESSION,
    WayName.ONCE,
    WayName.REPLIES,
    WayName.STREAM,
)


def _never_asked() -> frozenset[WayName]:
    raise AssertionError("the ways served were asked, though the choice does not turn on them")


def facts(
    served: frozenset[WayName] | None,
    *,
    mapped: bool = True,
    fits: bool = True,
    events: bool = False,
    small: bool = True,
    deadline: bool = False,
) -> SendFacts:
    """Facts whose one-reply ways served are `served`; None: the choice must not ask."""
    return SendFacts(
        slabs_mapped=mapped,
        fits_in_pool=fits,
        wants_events=events,
        small=small,
        has_deadline=deadline,
        served=_never_asked if served is None else lambda: served,
    )


# The one-reply ways a daemon serves: all three, an older one without the framed socket
# or sessions, and one with none of them.
ALL = frozenset({FRAMED, SESSION, ONCE})
GRPC = frozenset({SESSION, ONCE})
ONLY_ONCE = frozenset({ONCE})
NONE = frozenset[WayName]()

# The chooser's table: (the one-reply ways served, or None where the choice must not ask
# for them; whether the slabs are mapped; whether the video fits the pool; events asked
# for; a small output) and the way it must pick.
TABLE = [
    # Frames sent inline, or too many to lease at once: a stream, whatever else holds.
    (None, False, True, False, True, STREAM),
    (None, False, True, True, False, STREAM),
    (None, True, False, False, True, STREAM),
    (None, True, False, False, False, STREAM),
    # Progress or chunks asked for: a reply stream, even with the framed socket there.
    (None, True, True, True, True, REPLIES),
    (None, True, True, True, False, REPLIES),
    # The framed socket takes any output in one reply.
    (ALL, True, True, False, True, FRAMED),
    (ALL, True, True, False, False, FRAMED),
    # gRPC one-reply ways only for outputs that cannot outgrow one reply.
    (GRPC, True, True, False, True, SESSION),
    (GRPC, True, True, False, False, REPLIES),
    (ONLY_ONCE, True, True, False, True, ONCE),
    (ONLY_ONCE, True, True, False, False, REPLIES),
    # A daemon with none of them.
    (NONE, True, True, False, True, REPLIES),
    (NONE, True, True, False, False, REPLIES),
]


def _row_id(row: tuple[Any, ...]) -> str:
    served, mapped, fits, events, small, expected = row
    said = [
        "inline" if not mapped else "",
        "over-pool" if not fits else "",
        "events" if events else "",
        "small" if small else "large",
        "" if served is None else f"served={'+'.join(sorted(w.value for w in served)) or 'none'}",
    ]
    return f"{'-'.join(word for word in said if word)}->{expected.value}"


@pytest.mark.parametrize("row", TABLE, ids=[_row_id(row) for row in TABLE])
def test_the_chooser_picks_by_the_table(row: tuple[Any, ...]) -> None:
    served, mapped, fits, events, small, expected = row
    case = facts(served, mapped=mapped, fits=fits, events=events, small=small)
    assert choose_way(case) is expected


def test_a_deadline_passes_over_the_kept_session() -> None:
    # A request on a kept session cannot carry a deadline.
    assert choose_way(facts(GRPC, deadline=True)) is ONCE
    assert choose_way(facts(ALL, deadline=True)) is FRAMED


def _core(*, sessions: bool = True) -> ClientCore:
    return ClientCore(
        "unix:/nowhere.sock",
        client_name="t",
        timeout=None,
        lease_wait=1.0,
        transport="inline",
        sessions=sessions,
    )


@pytest.mark.parametrize(
    ("framed", "deadline", "sessions", "refused", "expected"),
    [
        ("/run/x.sock.framed", None, True, [], FRAMED),
        ("/run/x.sock.framed", 5.0, False, [SESSION, ONCE], FRAMED),
        ("", None, True, [], SESSION),  # a kept call: the blocking client's
        ("", 5.0, True, [], ONCE),  # a request on a kept call cannot carry a deadline
        ("", None, False, [], ONCE),  # the asyncio client keeps no sessions
        ("", None, True, [SESSION], ONCE),  # an older daemon
        ("", None, True, [SESSION, ONCE], REPLIES),  # an older one still
        ("", 5.0, True, [ONCE], REPLIES),
    ],
)
def test_the_offer_is_the_cheapest_one_reply_way_served(
    framed: str, deadline: float | None, sessions: bool, refused: list[WayName], expected: WayName
) -> None:
    core = _core(sessions=sessions)
    core.framed = framed
    for way in refused:
        core.unimplemented(way, "older daemon")
    assert one_reply_way(core.served_ways(), deadline is not None) is expected
    assert core.serves(expected)
    assert not any(core.serves(way) for way in refused)


def test_a_framed_socket_out_of_reach_is_no_longer_offered() -> None:
    core = _core()
    core.framed = "/run/x.sock.framed"
    core.unimplemented(FRAMED, "no such file")
    assert core.framed == "" and not core.serves(FRAMED)
    assert one_reply_way(core.served_ways(), False) is SESSION


def _way_of(op: ops.Op) -> WayName | None:
    """The way an op sends an encode on; None for any other op."""
    if isinstance(op, ops.Exchange) and isinstance(op.request, pb.EncodeRequest):
        return FRAMED
    if isinstance(op, ops.SessionAsk):
        return SESSION
    if isinstance(op, ops.Call) and op.method == "EncodeOnce":
        return ONCE
    if isinstance(op, ops.Replies):
        return REPLIES
    if isinstance(op, ops.OpenStream):
        return STREAM
    return None


CLIP = moving_pattern(4, 64, 96)
# Past the 4 MiB (as 4:2:0 pictures) that gRPC one-reply calls are kept to.
LONG = moving_pattern(64, 256, 256)


def _progress(done: int, total: int) -> None:
    pass


@pytest.mark.parametrize(
    ("daemon_options", "client_options", "video", "encode_options", "small", "expected"),
    [
        ({}, {}, CLIP, {}, True, FRAMED),
        ({}, {}, LONG, {}, False, FRAMED),
        ({"framed_socket": False}, {}, CLIP, {}, True, SESSION),
        ({"framed_socket": False}, {}, CLIP, {"timeout": 30}, True, ONCE),
        ({"framed_socket": False}, {}, LONG, {}, False, REPLIES),
        ({}, {}, CLIP, {"on_progress": _progress}, True, REPLIES),
        ({}, {"transport": "inline"}, CLIP, {}, True, STREAM),
    ],
    ids=["framed", "framed-long", "session", "deadline", "grpc-long", "progress", "inline"],
)
def test_the_client_takes_the_way_the_chooser_names(
    make_daemon: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    daemon_options: dict[str, Any],
    client_options: dict[str, Any],
    video: np.ndarray,
    encode_options: dict[str, Any],
    small: bool,
    expected: WayName,
) -> None:
    """A real daemon: the offer the client asked for (`recorded_ways`), given to the
    chooser with the request's facts, names the way the client's ops really took."""
    offers = recorded_ways(monkeypatch)
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
        inline = c.inline
    assert result.frames == len(video)
    assert len(offers) <= 1  # asked once, when the choice turned on it
    # The way offered, as ways served: the chooser then picks it back.
    served = frozenset({WayName(offers[0])}) if offers else None
    chosen = choose_way(
        facts(
            served,
            mapped=not inline,
            events="on_progress" in encode_options,
            small=small,
        )
    )
    assert taken == [chosen] and chosen is expected


@pytest.mark.parametrize(
    ("framed", "refused_before", "chosen", "then"),
    [
        ("/run/x.sock.framed", [], FRAMED, SESSION),
        ("", [], SESSION, ONCE),
        ("", [SESSION], ONCE, REPLIES),
    ],
)
def test_a_way_lost_since_it_was_chosen_is_not_asked(
    framed: str, refused_before: list[WayName], chosen: WayName, then: WayName
) -> None:
    """A way is chosen before the request's leases are granted; by the time it is asked,
    a framed socket may have proved out of reach (a lease on it), or a request in flight
    may have learnt that the daemon lacks a way: the next one is asked instead."""
    from client._encode import Outgoing, call_encode
    from client._results import Clock, ResultBuilder
    from client._send import request_way
    from client._steps import run_blocking
    from client._ways import REQUEST_WAYS

    core = _core()
    core.framed = framed
    for way in refused_before:
        core.unimplemented(way)
    assert one_reply_way(core.served_ways(), False) is chosen
    case = SendFacts(
        slabs_mapped=True,
        fits_in_pool=True,
        wants_events=False,
        small=True,
        has_deadline=False,
        served=core.served_ways,
    )
    core.unimplemented(chosen, "lost meanwhile")
    rechoose = functools.partial(request_way, case)
    out = Outgoing(pb.EncodeRequest(), ResultBuilder(None), Clock(), None, None, rechoose)
    result = pb.EncodeResult(frames=4, data=b"mp4", size_bytes=3)
    taken: list[WayName | None] = []

    def perform(op: ops.Op) -> Any:
        taken.append(_way_of(op))
        if isinstance(op, ops.Replies):
            op.feed(pb.EncodeEvent(result=result))
            return None
        return pb.SessionReply(result=result) if isinstance(op, ops.SessionAsk) else result

    assert run_blocking(call_encode(core, out, REQUEST_WAYS[chosen]), perform).frames == 4
    assert taken == [then]
