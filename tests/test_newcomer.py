"""What a first user of the client meets: shapes read as they are meant, refusals that
name the fix, a client that outlives a daemon restart, and one that says how to start a
daemon when none answers."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from client import (
    InvalidVideo,
    SidecarClient,
    SidecarClosed,
    SidecarError,
    SidecarUnavailable,
)
from client._channel import explained
from client._errors import error_for, error_from_rpc
from client.patterns import moving_pattern

from .helpers import Daemon

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


# -- shapes and refusals -------------------------------------------------------------------


def test_two_channels_are_not_read_as_frames_two_pixels_wide(client: Any) -> None:
    with pytest.raises(InvalidVideo) as info:
        client.encode(np.zeros((4, 256, 448, 2), np.uint8))
    message = str(info.value)
    assert "1, 3 or 4 channels" in message
    assert "read as CTHW it would be 256 frames of 2x448 RGBA" in message
    assert "pass layout='CTHW' if that is meant" in message


def test_tiny_frames_only_with_layout(client: Any) -> None:
    five = np.zeros((5, 2, 2, 3), np.uint8)  # 2x2 RGB frames: THWC, the only reading
    with pytest.raises(InvalidVideo, match=r"5 frames of 2x2 RGB; pass layout='THWC'"):
        client.encode(five)
    # 4:2:0 takes even sides of any size: said explicitly, it is encoded.
    assert client.encode(np.zeros((2, 4, 4, 3), np.uint8), layout="THWC").frames == 2


@pytest.mark.parametrize(
    ("video", "options", "fix", "not_said"),
    [
        (np.zeros((256, 448, 3), np.uint8), {}, r"add a time axis, video\[None\]", "layout="),
        (np.zeros((10, 256, 448, 2), np.uint8), {}, r"1 channel\), RGB \(3\) or RGBA", "layout="),
        (np.zeros((4, 255, 447, 3), np.uint8), {}, r"even width.*crop to 446x254.*pad", None),
        (
            np.zeros((4, 255, 447, 3), np.uint8),
            {"pixel_format": "rgb24"},
            r"whatever pixel format travels; crop",
            None,
        ),
        (
            np.zeros((4, 64, 64, 3), np.float32),
            {"value_range": (0, 255)},
            r"as uint8 \(video.astype\(np.uint8\)\)",
            None,
        ),
        (np.zeros((4, 64, 64, 3), np.uint16), {}, r"\(video >> 8\).astype\(np.uint8\)", None),
        (np.zeros((4, 64, 64, 3), np.int16), {}, r"astype\(np.uint8\)", None),
    ],
    ids=["image", "2-channels", "odd", "odd-rgb24", "float-255", "uint16", "int16"],
)
def test_refusals_name_the_fix(
    client: Any, video: np.ndarray, options: dict[str, Any], fix: str, not_said: str | None
) -> None:
    with pytest.raises(InvalidVideo) as info:
        client.encode(video, **options)
    message = str(info.value)
    assert re.search(fix, message), message
    assert not_said is None or not_said not in message, message
    assert "\n" not in message


# -- results and closed clients ------------------------------------------------------------


def test_a_result_prints_its_sizes_not_its_bytes(client: Any) -> None:
    result = client.encode(moving_pattern(12, 64, 96), fps=24)
    assert result.data is not None and len(result.data) > 1000
    text = repr(result)
    assert len(text) < 400, text
    assert f"size={result.size_bytes} bytes" in text
    assert "container='mp4'" in text and "frames=12" in text and "path=None" in text


def test_every_call_on_a_closed_client_raises_sidecar_closed(daemon: Any, connect: Any) -> None:
    video = moving_pattern(4, 64, 64)
    with connect(daemon) as c:  # leaving the block closes it a third time
        c.encode(video)
        c.close()
        c.close()  # a second close does nothing
        calls = {
            "encode": lambda: c.encode(video),
            "status": c.status,
            "health": c.health,
            "attach": c.attach,
            "lease": lambda: c.lease(1024),
            "release": lambda: c.release("nope"),
            "warm_up": c.warm_up,
        }
        for name, call in calls.items():
            with pytest.raises(SidecarClosed, match="is closed") as info:
                call()
            assert isinstance(info.value, SidecarError), name


# -- daemon restarts and missing daemons ----------------------------------------------------


# The daemon with its framed socket, where one-reply encodes go, and without, where they
# go over gRPC (Encode).
TRANSPORTS = pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])


@TRANSPORTS
def test_a_client_carries_on_across_a_daemon_restart(
    make_daemon: Any, connect: Any, framed: bool
) -> None:
    """SIGKILLed, then started again on the same socket: the same client's next encodes
    all succeed at once, although its channel is still waiting to reconnect (it backs
    off up to a second). The new daemon takes the socket's place only once it serves, so
    that the client's channel cannot have found it by itself in the meantime."""
    d = make_daemon(framed_socket=framed)
    video = moving_pattern(6, 64, 64)
    with connect(d) as c:
        assert c.encode(video).frames == 6
        d.kill()  # SIGKILL
        with pytest.raises(SidecarUnavailable):  # the loss, in whichever words
            c.encode(video, timeout=1)
        with pytest.raises(SidecarUnavailable, match="no daemon answers at"):
            c.status()
        time.sleep(3)  # the client's channel now retries once a second at most
        again = Daemon(d.prefix, socket=str(d.dir / "next.sock"), framed_socket=framed).start()
        try:
            os.replace(again.socket, d.socket)  # it serves there from now on
            assert [c.encode(video).frames for _ in range(5)] == [6] * 5
            assert c.encode(video, timeout=5).frames == 6
        finally:
            assert again.stop() == 0, again.log()
            again.cleanup()


@TRANSPORTS
def test_a_restart_is_waited_for_within_the_timeout(
    make_daemon: Any, connect: Any, framed: bool
) -> None:
    """While the daemon is down an encode fails, as unavailable, once its timeout is
    spent, naming how to start one."""
    d = make_daemon(framed_socket=framed)
    video = moving_pattern(4, 64, 64)
    with connect(d, timeout=2) as c:
        c.encode(video)
        d.kill()
        with pytest.raises(SidecarUnavailable):  # the loss, in whichever words
            c.encode(video)
        started = time.monotonic()
        with pytest.raises(SidecarUnavailable, match=r"no daemon answers at .*waited 2s"):
            c.encode(video)
        assert 1.5 < time.monotonic() - started < 10
        d.start()
        assert c.encode(video).frames == 4


def test_a_kept_connection_the_daemon_left_unnoticed_is_sent_again(
    make_daemon: Any, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon dies between the client's check that its kept framed connection is
    still open and the request's send (made certain here: the check always says open).
    The send finds the connection closed, so nothing went: the encode waits for the
    daemon, attaches again and goes on, as one that found no daemon at all does."""
    from client import _framed

    for kind in (_framed.FramedConnection, _framed.AsyncFramedConnection):
        monkeypatch.setattr(kind, "open", property(lambda self: True))
    d = make_daemon()
    video = moving_pattern(6, 64, 64)
    with connect(d) as c:
        assert c.encode(video).frames == 6  # its framed connection kept for the next
        d.kill()
        d.start()
        assert c.encode(video, timeout=10).frames == 6


def test_a_request_gRPC_could_not_write_counts_as_unsent() -> None:
    """A kept gRPC connection whose daemon died unnoticed: gRPC fails the request's
    own write, so it never went and is sent again once a daemon answers. A connection
    lost after a request went out is not: the daemon may have taken it."""
    unwritten = "Stream removed (sendmsg: Broken pipe (32))"
    assert error_from_rpc(_RpcError(grpc.StatusCode.UNAVAILABLE, unwritten)).unsent
    for code, details in (
        (grpc.StatusCode.UNAVAILABLE, "Socket closed"),
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer"),
        (grpc.StatusCode.INTERNAL, unwritten),
    ):
        assert not error_from_rpc(_RpcError(code, details)).unsent, details


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_no_daemon_is_said_as_the_cli_says_it(tmp_path: Path, twin: str, connect: Any) -> None:
    socket = tmp_path / "none.sock"
    nowhere = SimpleNamespace(socket=str(socket))
    with connect(nowhere, timeout=2) as c, pytest.raises(SidecarUnavailable) as info:
        c.encode(moving_pattern(4, 64, 64))
    assert str(info.value) == (
        f"no daemon answers at {socket}: start one with video-sidecar serve --socket {socket}"
    )
    assert info.value.code is grpc.StatusCode.UNAVAILABLE


def test_a_socket_not_ours_is_said_as_permission_denied() -> None:
    raw = "failed to connect to all addresses; last error: UNKNOWN: unix:/x.sock: "
    err = error_for(grpc.StatusCode.UNAVAILABLE, raw + "Permission denied")
    err.unsent = True
    assert str(explained("unix:/x.sock", err)) == (
        "permission denied on /x.sock: the daemon's user or its --shm-group must include you"
    )


def test_no_daemon_with_the_environment_socket(tmp_path: Path, monkeypatch: Any) -> None:
    socket = tmp_path / "env.sock"
    monkeypatch.setenv("VIDEO_SIDECAR_SOCKET", str(socket))
    with SidecarClient(timeout=2) as c:
        assert c.target == f"unix:{socket}"
        with pytest.raises(SidecarUnavailable, match=f"serve --socket {socket}"):
            c.status()


# -- the documentation ----------------------------------------------------------------------


def test_the_client_documentation_names_what_a_newcomer_needs() -> None:
    text = (DOCS / "client.md").read_text()
    for needed in (
        "VIDEO_SIDECAR_SOCKET",
        "~/.local/share/video-sidecar/outputs",
        "SidecarClosed",
        "no daemon answers at",
    ):
        assert needed in text, needed


def test_the_readme_says_which_calls_survive_a_restart() -> None:
    """Which calls wait for a restarting daemon and go on, and which raise: in the README,
    pointing at the whole story in docs/client.md."""
    readme = (ROOT / "README.md").read_text()
    said = next((p for p in readme.split("\n- ") if "restart" in p and "retried" in p), "")
    assert said, "the README says which calls are retried across a daemon restart"
    for call in ("encode()", "lease()", "stream()", "encode_leased()", "status()", "health()"):
        assert call in said, call
    assert "raise" in said and "SidecarUnavailable" in said, said
    anchor = "docs/client.md#when-the-daemon-is-away-restarts-or-the-client-is-closed"
    assert (
        anchor in said
        and "### When the daemon is away, restarts, or the client is closed"
        in (DOCS / "client.md").read_text()
    )


def test_the_readme_says_how_to_install_outside_a_checkout() -> None:
    """Not on PyPI: the README gives the commands for a wheel (named as the build names it
    for this version) and for pip from the repository, with the extras."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    readme = (ROOT / "README.md").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert "not on PyPI" in readme
    assert "pip install build && python -m build --wheel" in readme
    assert f"video_sidecar-{version}-py3-none-any.whl[metrics]" in readme
    assert "pip install 'video-sidecar[metrics] @ git+" in readme
