"""Refused requests are freed at once, on both transports: nothing a refusal raises (its
traceback, the request it names) keeps the request in memory until a full collection,
which an idle daemon almost never runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .helpers import Daemon, RawFramed

# About 8 MB on the wire, some hundreds of MB once decoded: four million empty ranges.
RANGES = 4_000_000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def huge_encode(token: str) -> pb.EncodeRequest:
    request = pb.EncodeRequest(client_token=token, request_id="huge")
    request.video.ranges.add()
    one = request.video.ranges[0]
    request.video.ranges.extend([one] * (RANGES - 1))
    return request


def stub_and_token(d: Daemon) -> tuple[Any, str, grpc.Channel]:
    channel = grpc.insecure_channel(
        f"unix:{d.socket}",
        options=[("grpc.max_send_message_length", 16 << 20)],
    )
    stub = pb_grpc.VideoSidecarStub(channel)  # type: ignore[no-untyped-call]
    token = stub.Attach(pb.AttachRequest(client_name="t")).client_token
    return stub, token, channel


def test_refused_full_size_requests_do_not_stay_in_memory(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon()
    stub, token, channel = stub_and_token(d)
    pid = d.process.pid
    request = huge_encode(token)
    data = pb.FramedRequest(encode=request).SerializeToString()
    assert len(data) < 8 * 1024 * 1024
    time.sleep(0.5)
    before = rss_mib(pid)
    try:
        for _ in range(3):
            try:
                list(stub.Encode(request, timeout=60))
                raise AssertionError("refused, surely")
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            framed = RawFramed(d.socket + ".framed", b"VSF2")
            framed.send(data)
            reply = framed.reply()
            framed.close()
            assert reply.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], reply
    finally:
        channel.close()
    time.sleep(1.0)
    after = rss_mib(pid)
    # Each decoded request is hundreds of MiB: six kept would be gigabytes.
    assert after < before + 150, (before, after)


def huge_options(token: str) -> pb.EncodeRequest:
    request = pb.EncodeRequest(client_token=token, request_id="options")
    request.codec.extra.update({f"k{i}": "v" for i in range(OPTIONS)})
    return request


# About 8 MB: half a million encoder options, each a map entry protobuf builds one by one.
OPTIONS = 500_000


def decode_seconds(message: Any) -> float:
    data = message.SerializeToString()
    started = time.perf_counter()
    type(message).FromString(data)
    return time.perf_counter() - started


@pytest.mark.exclusive
def test_an_innocent_request_is_not_held_up_by_decoding_a_hostile_one(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Hostile full-size requests, over both transports, beside a client that asks for
    status every 20 ms: its longest wait stays well under what decoding four million
    ranges takes (measured here, in this process): before, the daemon's event loop was
    held that long for each."""
    d = make_daemon()
    stub, token, channel = stub_and_token(d)
    hostile = [huge_encode(token), huge_options(token)]
    decode_s = sorted(decode_seconds(hostile[0]) for _ in range(3))[1]
    framed_data = [pb.FramedRequest(encode=m).SerializeToString() for m in hostile]
    answers: list[Any] = []
    done = threading.Event()

    def attack() -> None:
        try:
            for _ in range(2):
                for message, data in zip(hostile, framed_data, strict=True):
                    try:
                        list(stub.Encode(message, timeout=60))
                    except grpc.RpcError as err:
                        answers.append((err.code(), err.details()))
                    framed = RawFramed(d.socket + ".framed", b"VSF2")
                    framed.send(data)
                    answers.append(framed.reply().error)
                    framed.close()
        finally:
            done.set()

    waits = []
    attacker = threading.Thread(target=attack)
    try:
        attacker.start()
        while not done.is_set():
            started = time.perf_counter()
            stub.Status(pb.StatusRequest(), timeout=30)
            waits.append(time.perf_counter() - started)
            time.sleep(0.02)
        attacker.join()
    finally:
        channel.close()
    assert len(answers) == 8
    for answer in answers:
        if isinstance(answer, tuple):
            code, details = answer
            assert code == grpc.StatusCode.INVALID_ARGUMENT, answer
        else:
            code, details = answer.code, answer.message
            assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0], answer
        assert "more than" in details, details
    assert max(waits) < decode_s * 0.6, (max(waits), decode_s, sorted(waits)[-5:])
