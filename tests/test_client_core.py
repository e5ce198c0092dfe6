"""The client's I/O-free core, driven by a scripted transport instead of a daemon.

These reach into the client's private modules on purpose: they test the core both public
clients run on, through both ways of running it, without a network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from client import (
    FailedPrecondition,
    NotFound,
    Reason,
    ResourceExhausted,
    ServerError,
    SidecarUnavailable,
)
from client._core import ClientCore
from client._errors import error_for
from client._steps import (
    Call,
    Exchange,
    Exclusive,
    Op,
    Replies,
    Steps,
    run_awaiting,
    run_blocking,
)
from sidecar.api.v1 import sidecar_pb2 as pb

Answers = Callable[[], Callable[[Call], Any]]


def run_both(steps: Callable[[], Steps[Any]], answers: Answers) -> list[list[str]]:
    """Run fresh `steps` blocking, then awaiting, each against fresh `answers`; the RPCs
    each run made, in order."""
    made: list[list[str]] = []
    answer: Callable[[Call], Any]

    def blocking(op: Op) -> Any:
        if isinstance(op, Exclusive):
            return run_blocking(op.steps, blocking)
        assert isinstance(op, Call)
        made[-1].append(op.method)
        return answer(op)

    async def awaiting(op: Op) -> Any:
        if isinstance(op, Exclusive):
            return await run_awaiting(op.steps, awaiting)
        assert isinstance(op, Call)
        made[-1].append(op.method)
        await asyncio.sleep(0)
        return answer(op)

    made.append([])
    answer = answers()
    run_blocking(steps(), blocking)
    made.append([])
    answer = answers()
    asyncio.run(run_awaiting(steps(), awaiting))
    return made


def refusing(*refusals: Exception) -> Answers:
    """Attach always works; Status calls raise `refusals` in turn, then answer."""

    def answers() -> Callable[[Call], Any]:
        left = list(refusals)

        def answer(call: Call) -> Any:
            if call.method == "Attach":
                return pb.AttachResponse(client_token="t" * 32, instance_id="i")
            if left:
                raise left.pop(0)
            return pb.StatusResponse(server_version="test")

        return answer

    return answers


def core() -> ClientCore:
    return ClientCore(
        "unix:/nowhere.sock", client_name="t", timeout=None, lease_wait=1.0, transport="inline"
    )


def test_an_unknown_token_is_attached_anew_once_and_the_call_retried() -> None:
    def steps() -> Steps[Any]:
        c = core()
        yield from c.attach()
        return (yield from c.reattached(c.status))

    not_attached = FailedPrecondition("unknown token", reason=Reason.NOT_ATTACHED)
    made = run_both(steps, refusing(not_attached))
    assert made == [["Attach", "Status", "Attach", "Status"]] * 2


def test_other_refusals_are_not_retried() -> None:
    busy = error_for(grpc.StatusCode.FAILED_PRECONDITION, "busy", Reason.LEASE_BUSY)

    def steps() -> Steps[Any]:
        c = core()
        with pytest.raises(FailedPrecondition) as info:
            yield from c.reattached(c.status)
        assert info.value.reason is Reason.LEASE_BUSY
        return None

    assert run_both(steps, refusing(busy)) == [["Status"]] * 2


def test_grpc_errors_reach_the_steps_translated() -> None:
    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.NOT_FOUND

        def details(self) -> str:
            return "no such lease"

        def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
            return (("video-sidecar-error", "LEASE_NOT_FOUND"),)

    def steps() -> Steps[Any]:
        c = core()
        yield from c.attach()
        yield from c.release("0" * 32)  # NotFound is not an error for a release
        with pytest.raises(NotFound) as info:
            yield from c.status()
        assert info.value.code is grpc.StatusCode.NOT_FOUND
        assert info.value.reason is Reason.LEASE_NOT_FOUND
        return None

    def answer(call: Call) -> Any:
        if call.method == "Attach":
            return pb.AttachResponse(client_token="t" * 32, instance_id="i")
        raise Refused()

    assert run_both(steps, lambda: answer) == [["Attach", "Release", "Status"]] * 2


def test_calls_refused_together_attach_anew_once() -> None:
    """After a daemon restart, every call in flight finds its token unknown: one of them
    attaches again, the others take that attachment."""
    c = core()
    lock = asyncio.Lock()
    made: list[str] = []

    async def perform(op: Op) -> Any:
        if isinstance(op, Exclusive):
            async with lock:
                return await run_awaiting(op.steps, perform)
        assert isinstance(op, Call)
        made.append(op.method)
        await asyncio.sleep(0.01)
        if op.method == "Attach":
            return pb.AttachResponse(client_token=f"{made.count('Attach')}" * 32)
        if made.count("Status") <= 3:
            raise FailedPrecondition("unknown token", reason=Reason.NOT_ATTACHED)
        return pb.StatusResponse()

    async def main() -> None:
        await run_awaiting(c.attach(), perform)
        calls = [run_awaiting(c.reattached(c.status), perform) for _ in range(3)]
        await asyncio.gather(*calls)

    asyncio.run(main())
    assert made.count("Attach") == 2 and made.count("Status") == 6
    assert c.attachment is not None and c.attachment.client_token == "2" * 32


def _ask_one_reply(c: ClientCore, timeout: float | None = None) -> Steps[Any]:
    from client._results import Clock, ResultBuilder
    from client._send import send_request

    request = pb.EncodeRequest(client_token="t" * 32)
    return send_request(c, request, Clock(), ResultBuilder(None), timeout)


RESULT = pb.EncodeResult(frames=4, data=b"mp4", size_bytes=3)


def test_a_framed_error_reply_is_raised_as_the_tree_says() -> None:
    error = pb.FramedError(
        code=grpc.StatusCode.NOT_FOUND.value[0],
        message="no lease 'x'",
        reason=pb.ERROR_REASON_LEASE_NOT_FOUND,
    )
    c = core()
    c.framed = "/run/x.sock.framed"
    with pytest.raises(NotFound, match="no lease 'x'") as info:
        run_blocking(_ask_one_reply(c), lambda op: pb.FramedReply(error=error))
    assert info.value.reason is Reason.LEASE_NOT_FOUND
    # A code or reason newer than this client: a ServerError keeping the code, no reason.
    newer = pb.FramedError(code=42, message="new", reason=999)  # type: ignore[arg-type]
    with pytest.raises(ServerError) as unknown:
        run_blocking(_ask_one_reply(c), lambda op: pb.FramedReply(error=newer))
    assert unknown.value.code is grpc.StatusCode.UNKNOWN and unknown.value.reason is None


def test_one_reply_goes_on_the_framed_socket_then_on_encode_once_it_is_lost() -> None:
    """Any video answered in one reply goes to the framed socket; once that socket is
    unreachable, on Encode's reply stream, with or without a deadline."""
    asked: list[str] = []

    def perform(op: Op) -> Any:
        if isinstance(op, Exchange):
            asked.append(f"Exchange {op.framed}")
            return pb.FramedReply(result=RESULT)
        asked.append(op.method if isinstance(op, Call) else type(op).__name__)
        if isinstance(op, Replies):
            op.feed(pb.EncodeEvent(result=RESULT))
            return None
        raise AssertionError(f"unexpected {op}")

    c = core()
    c.framed = "/run/x.sock.framed"
    assert run_blocking(_ask_one_reply(c, timeout=5), perform).frames == 4
    c.framed_lost("gone")
    assert run_blocking(_ask_one_reply(c), perform).frames == 4
    assert run_blocking(_ask_one_reply(c, timeout=5), perform).frames == 4
    assert asked == ["Exchange /run/x.sock.framed", "Replies", "Replies"]


def _attached(framed_version: int) -> tuple[ClientCore, list[str], Callable[[Op], Any]]:
    """A core attached to a daemon naming a framed socket of `framed_version`, and a
    driver that records each op and answers leases and releases on either way (a framed
    connection that cannot be opened reads as UNIMPLEMENTED)."""
    c, made = core(), []
    grant = pb.LeaseResponse(lease_id="l" * 32, slab_id=0, offset=0, size=64)

    def perform(op: Op) -> Any:
        if isinstance(op, Exclusive):
            return run_blocking(op.steps, perform)
        if isinstance(op, Exchange):
            made.append("framed:" + type(op.request).__name__)
            if "unreachable" in op.framed:
                raise error_for(grpc.StatusCode.UNIMPLEMENTED, "no such file")
            if "ended" in op.framed:  # closed by a daemon shutting down, before a reply
                raise SidecarUnavailable("the daemon ended the framed connection")
            if isinstance(op.request, pb.LeaseRequest):
                return pb.FramedReply(lease=grant)
            return pb.FramedReply(release=pb.ReleaseResponse())
        assert isinstance(op, Call)
        made.append(op.method)
        if op.method == "Attach":
            return pb.AttachResponse(
                client_token="t" * 32,
                instance_id="i",
                framed_socket="x.sock.framed",
                framed_version=framed_version,
                framed_reply_max_bytes=1 << 30,
            )
        return grant if op.method == "Lease" else pb.ReleaseResponse()

    c.leased = lambda resp: resp  # type: ignore[method-assign]  # no slabs mapped here
    c.target = "unix:/run/x.sock"
    return c, made, perform


@pytest.mark.parametrize(
    "version,made_then,framed",
    [
        (2, ["framed:LeaseRequest", "framed:ReleaseRequest"], "/run/x.sock.framed"),
        (0, ["Lease", "Release"], ""),  # an older daemon: VSF1 only, which this client leaves
    ],
    ids=["vsf2", "vsf1-only"],
)
def test_leases_and_releases_go_on_the_framed_socket_of_a_daemon_that_speaks_vsf2(
    version: int, made_then: list[str], framed: str
) -> None:
    c, made, perform = _attached(framed_version=version)
    run_blocking(c.lease(64), perform)
    run_blocking(c.release("l" * 32), perform)
    assert made == ["Attach", *made_then]
    assert c.framed == framed


def test_an_unreachable_framed_socket_sends_leases_over_grpc_until_the_next_attach() -> None:
    c, made, perform = _attached(framed_version=2)
    run_blocking(c.attach(), perform)
    c.framed = "/run/unreachable.framed"
    run_blocking(c.lease(64), perform)
    run_blocking(c.lease(64), perform)
    assert made == ["Attach", "framed:LeaseRequest", "Lease", "Lease"]
    a_lease_error = pb.FramedReply(
        error=pb.FramedError(
            code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
            message="pool full",
            reason=pb.ERROR_REASON_POOL_EXHAUSTED,
        )
    )
    c.framed = "/run/x.sock.framed"
    with pytest.raises(ResourceExhausted, match="pool full") as info:
        run_blocking(c.lease(64), lambda op: a_lease_error)
    assert info.value.reason is Reason.POOL_EXHAUSTED


def test_a_framed_connection_ended_before_its_reply_sends_the_lease_over_grpc() -> None:
    """A daemon shutting down ends idle framed connections without taking their request;
    a stream still leasing in its grace period gets its lease over gRPC."""
    c, made, perform = _attached(framed_version=2)
    run_blocking(c.attach(), perform)
    c.framed = "/run/ended.framed"
    run_blocking(c.lease(64), perform)
    assert made == ["Attach", "framed:LeaseRequest", "Lease"]
    assert c.framed == ""


def test_frames_still_landing_are_counted_on_the_framed_socket_or_waited_for_first() -> None:
    """On the framed socket the driver runs the landing between request and reply; on
    any other way (the socket unreachable) the core waits for the frames first, once."""
    from client._results import Clock, ResultBuilder
    from client._send import send_request
    from client._steps import Work

    def ask(c: ClientCore, made: list[str], framed_works: bool) -> None:
        landed: list[bool] = []

        def landing() -> None:
            if not landed:
                landed.append(True)
                made.append("landed")

        def perform(op: Op) -> Any:
            if isinstance(op, Work):
                made.append("Work")
                return op.run()
            if isinstance(op, Exchange):
                made.append("Exchange framed")
                if not framed_works:
                    raise error_for(grpc.StatusCode.UNIMPLEMENTED, "no such file")
                assert op.landing is landing
                op.landing()  # as the drivers do, after sending
                return pb.FramedReply(result=RESULT)
            assert isinstance(op, Replies)
            made.append("Replies")
            assert landed, "a request on another way before its frames landed"
            op.feed(pb.EncodeEvent(result=RESULT))
            return None

        request = pb.EncodeRequest(client_token="t" * 32, landed_count_offset=64)
        steps = send_request(
            c,
            request,
            Clock(),
            ResultBuilder(None),
            None,
            landing=landing,  # type: ignore[arg-type]
        )
        assert run_blocking(steps, perform).frames == 4

    made: list[str] = []
    c = core()
    c.framed = "/run/x.sock.framed"
    ask(c, made, framed_works=True)
    assert made == ["Exchange framed", "landed"]
    made.clear()
    ask(c, made, framed_works=False)
    assert made == ["Exchange framed", "Work", "landed", "Replies"]


@pytest.mark.parametrize(
    ("failure", "withdrawn"),
    [
        (None, False),
        (error_for(grpc.StatusCode.DEADLINE_EXCEEDED, "late"), True),
        (error_for(grpc.StatusCode.CANCELLED, "cancelled"), True),
        (error_for(grpc.StatusCode.UNAVAILABLE, "connection broke"), True),
        (KeyboardInterrupt(), True),
        (asyncio.CancelledError(), True),
        (error_for(grpc.StatusCode.RESOURCE_EXHAUSTED, "pool full", Reason.POOL_EXHAUSTED), False),
        (error_for(grpc.StatusCode.INVALID_ARGUMENT, "size"), False),
    ],
)
def test_a_lease_over_grpc_whose_reply_is_lost_is_released_by_its_tag(
    failure: BaseException | None, withdrawn: bool
) -> None:
    """Only the daemon's refusal says nothing was granted; after anything else the lease
    may exist, unknown to the client, and is released by the request's tag."""
    from client._leasing import lease_over_grpc

    request = pb.LeaseRequest(client_token="t" * 32, size=4096)
    steps = lease_over_grpc(request, 5.0)
    lease_call = next(steps)
    assert isinstance(lease_call, Call) and lease_call.method == "Lease"
    tag = lease_call.request.tag  # type: ignore[attr-defined]
    assert len(tag) == 24 and not request.tag
    if failure is None:
        with pytest.raises(StopIteration) as done:
            steps.send(pb.LeaseResponse(lease_id="l" * 32))
        assert done.value.value.lease_id == "l" * 32
        return
    if not withdrawn:
        with pytest.raises(type(failure)):
            steps.throw(failure)
        return
    release = steps.throw(failure)
    assert isinstance(release, Call) and release.method == "Release"
    assert release.request.tag == tag and not release.request.lease_id  # type: ignore[attr-defined]
    assert release.timeout is not None and release.timeout <= 2.0
    with pytest.raises(type(failure)):  # the release's own failure is not the caller's error
        steps.throw(error_for(grpc.StatusCode.UNAVAILABLE, "still down"))


def test_a_cancel_that_comes_as_framed_work_completes_is_not_lost() -> None:
    """`within` (the async framed connection's timeout) against the case Python 3.11's
    `asyncio.wait_for` gets wrong: the work completes and the caller is cancelled in the
    same turn of the loop. The caller must see its cancel, not the work's result."""
    from client._framed import within

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[int] = loop.create_future()
        caller = asyncio.create_task(within(reply, 5.0))
        await asyncio.sleep(0)  # the caller is waiting
        reply.set_result(1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        with pytest.raises(asyncio.TimeoutError):
            await within(loop.create_future(), 0.01)
        assert await within(asyncio.sleep(0, "done"), None) == "done"

    asyncio.run(main())


def test_leases_given_back_as_cleanup_all_go_back_through_a_cancel() -> None:
    """`give_back_all`: a cancel (or Ctrl-C) during one release stops none of the rest and
    goes on after them; a refusal is skipped; a daemon that does not answer in time ends
    the cleanup there (each release would wait out its own timeout)."""
    from client import DeadlineExceeded
    from client._leasing import give_back_all

    def released(failures: dict[str, BaseException]) -> tuple[list[str], BaseException | None]:
        tried: list[str] = []

        def release(lease: Any) -> Steps[None]:
            tried.append(lease)
            if lease in failures:
                raise failures[lease]
            return None
            yield  # a generator of steps

        steps = give_back_all(release, ["a", "b", "c", "d"])
        try:
            run_blocking(steps, lambda op: None)
        except BaseException as exc:
            return tried, exc
        return tried, None

    cancel = asyncio.CancelledError()
    assert released({"a": cancel, "c": KeyboardInterrupt()}) == (["a", "b", "c", "d"], cancel)
    refused = error_for(grpc.StatusCode.FAILED_PRECONDITION, "busy", Reason.LEASE_BUSY)
    assert released({"b": refused}) == (["a", "b", "c", "d"], None)
    tried, error = released({"b": DeadlineExceeded("no answer")})
    assert tried == ["a", "b"] and error is None
