"""A file's extension says its container: one rule (`sidecar.vocabulary.file_container`)
for the client's `path=`, the daemon's `output.file.path` from any client, and the framed
socket. The command line's `-o` is in test_cli_errors.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from client import InvalidArgument, SidecarClient
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.vocabulary import (
    CONTAINERS,
    FILE_EXTENSIONS,
    WIRE_WORDS,
    FileNameError,
    file_container,
)

from .helpers import Daemon, RawFramed, decode

CLIP = moving_pattern(3, 48, 64)
WEBM_MAGIC = b"\x1a\x45\xdf\xa3"  # EBML


def is_mp4(data: bytes) -> bool:
    return data[4:8] == b"ftyp"


# -- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["client.md", "configuration.md"])
def test_the_documentation_states_the_rule_as_the_code_has_it(page: str) -> None:
    """Each extension with the container it picks and those it takes, as in
    `FILE_EXTENSIONS`; the client's page points at the table and calls no container the
    default of a file."""
    text = (Path(__file__).resolve().parent.parent / "docs" / page).read_text()
    flat = " ".join(text.split())
    for ext, names in FILE_EXTENSIONS.items():
        assert f"`{ext}`" in flat, ext
        assert f"`{ext}` is `{names[0]}`" in flat or f"| `{ext}` | `{names[0]}` |" in flat, ext
        takes = " or ".join(f"`{n}`" for n in names)
        assert f"`{ext}` takes {takes}" in flat or ", ".join(f"`{n}`" for n in names) in flat
    assert all(f"`{name}`" in flat for name in CONTAINERS)
    if page == "client.md":
        assert "configuration.md#file-names-and-containers" in flat
        assert '`container="mp4"` (default' not in flat
        assert file_container("jobs/X.WEBM") == "webm" and "in any case" in flat


@pytest.mark.parametrize(
    ("path", "container", "written"),
    [
        ("jobs/x.mp4", "", "mp4"),
        ("jobs/x.webm", "", "webm"),
        ("jobs/X.WEBM", "", "webm"),
        ("jobs/x.mp4", "fmp4", "fmp4"),
        ("jobs/x.mp4", "mp4", "mp4"),
        ("jobs/x.webm", "webm", "webm"),
        ("a.b/x.tar.mp4", "", "mp4"),
    ],
)
def test_the_extension_picks_or_agrees(path: str, container: str, written: str) -> None:
    assert file_container(path, container) == written


@pytest.mark.parametrize(
    ("path", "container", "said"),
    [
        ("jobs/w.mp4", "webm", "ends in .mp4, but container is webm: name it .webm or drop"),
        ("jobs/w.webm", "mp4", "ends in .webm, but container is mp4: name it .mp4"),
        ("jobs/w.webm", "fmp4", "ends in .webm, but container is fmp4: name it .mp4"),
        ("out.avi", "", "ends in .avi, which no container writes: name it .mp4"),
        ("out.mkv", "webm", "ends in .mkv, which no container writes"),
        ("out.m4v", "", "ends in .m4v, which no container writes"),
        ("jobs/noext", "", "has no extension, which says what plays it: name it 'jobs/noext.mp4'"),
        ("jobs/noext", "webm", "name it 'jobs/noext.webm'"),
        ("jobs/.mp4", "", "has no extension"),
        ("a.d/x", "", "has no extension"),
    ],
)
def test_the_extension_refuses(path: str, container: str, said: str) -> None:
    with pytest.raises(FileNameError, match=r"^path ") as info:
        file_container(path, container)
    assert said in str(info.value)


def test_the_daemon_says_it_in_the_wire_words() -> None:
    with pytest.raises(FileNameError) as info:
        file_container("w.mp4", "webm", WIRE_WORDS)
    assert "but output.container is webm: name it .webm or leave output.container unset" in str(
        info.value
    )


# -- the client ------------------------------------------------------------------------------


@pytest.fixture
def name() -> str:
    return f"names-{secrets.token_hex(4)}"


def test_a_webm_path_writes_webm(daemon: Daemon, name: str) -> None:
    with daemon.client() as c:
        result = c.encode(CLIP, fps=24, path=f"{name}/x.webm")
    assert result.container == "webm" and result.codec == "vp9"
    assert (daemon.output_dir / name / "x.webm").read_bytes()[:4] == WEBM_MAGIC
    assert len(decode(daemon.output_dir / name / "x.webm")[0]) == len(CLIP)


def test_a_stream_to_a_webm_path_writes_webm(daemon: Daemon, name: str) -> None:
    with daemon.client() as c, c.stream(fps=24, path=f"{name}/s.webm") as s:
        s.write(CLIP)
    assert s.result is not None and s.result.container == "webm"
    assert (daemon.output_dir / name / "s.webm").read_bytes()[:4] == WEBM_MAGIC


def test_fragmented_mp4_goes_in_an_mp4_file(daemon: Daemon, name: str) -> None:
    with daemon.client() as c:
        result = c.encode(CLIP, fps=24, path=f"{name}/f.mp4", container="fmp4")
    assert result.container == "fmp4"
    assert is_mp4((daemon.output_dir / name / "f.mp4").read_bytes())


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        (
            {"path": "w.mp4", "container": "webm"},
            "path 'w.mp4' ends in .mp4, but container is webm: name it .webm or drop container=",
        ),
        ({"path": "x.avi"}, "path 'x.avi' ends in .avi, which no container writes"),
        ({"path": "x.mov", "container": "mp4"}, "ends in .mov, which no container writes"),
    ],
)
def test_the_client_refuses_a_name_before_anything_is_leased(
    daemon: Daemon, name: str, kwargs: dict[str, Any], said: str
) -> None:
    with daemon.client() as c:
        with pytest.raises(InvalidArgument) as info:
            c.encode(CLIP, fps=24, **{**kwargs, "path": f"{name}/{kwargs['path']}"})
        assert said.replace("path '", f"path '{name}/") in str(info.value)
    assert not (daemon.output_dir / name).exists()


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_a_name_without_extension_is_refused_naming_the_one_to_add(
    daemon: Daemon, name: str, container: str
) -> None:
    ext = {"mp4": ".mp4", "webm": ".webm"}[container]
    with daemon.client() as c, pytest.raises(InvalidArgument) as info:
        c.encode(CLIP, fps=24, path=f"{name}/noext", container=container)
    assert "has no extension" in str(info.value)
    assert f"'{name}/noext{ext}'" in str(info.value)
    assert not list((daemon.output_dir / name).glob("*"))


# -- any client: raw gRPC and the framed socket -----------------------------------------------


@pytest.fixture
def raw(daemon: Daemon) -> Iterator[tuple[pb_grpc.VideoSidecarStub, SidecarClient]]:
    """The generated stub, and a client that leases and fills regions for it."""
    with (
        grpc.insecure_channel(f"unix:{daemon.socket}") as channel,
        daemon.client() as c,
    ):
        yield pb_grpc.VideoSidecarStub(channel), c


def raw_request(c: SidecarClient, path: str, container: int) -> pb.EncodeRequest:
    lease = c.lease(CLIP.nbytes)
    lease.array[: CLIP.nbytes] = CLIP.reshape(-1)
    video = pb.VideoDescriptor(
        width=64, height=48, pixel_format=pb.PIXEL_FORMAT_RGB24, fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=str(lease.id), frame_count=len(CLIP))],
    )  # fmt: skip
    output = pb.OutputSpec(file=pb.FileOutput(path=path), container=container)  # type: ignore[arg-type]
    return pb.EncodeRequest(client_token=c.attach().client_token, video=video, output=output)


@pytest.mark.parametrize(
    ("file", "container", "said"),
    [
        ("w.mp4", pb.CONTAINER_WEBM, "ends in .mp4, but output.container is webm: name it .webm"),
        ("w.webm", pb.CONTAINER_MP4, "ends in .webm, but output.container is mp4: name it .mp4"),
        ("w.webm", pb.CONTAINER_FRAGMENTED_MP4, "but output.container is fmp4"),
        ("w.avi", pb.CONTAINER_UNSPECIFIED, "ends in .avi, which no container writes"),
        ("noext", pb.CONTAINER_UNSPECIFIED, "has no extension"),
        ("noext", pb.CONTAINER_WEBM, "noext.webm'"),
    ],
)
def test_the_daemon_refuses_a_raw_request_whose_name_disagrees(
    raw: tuple[pb_grpc.VideoSidecarStub, SidecarClient],
    daemon: Daemon,
    name: str,
    file: str,
    container: int,
    said: str,
) -> None:
    stub, c = raw
    request = raw_request(c, f"{name}/{file}", container)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Encode(request, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("output.file.path: "), info.value.details()
    assert said in info.value.details()
    assert not (daemon.output_dir / name / file).exists()
    # Refused before its lease was taken: it is still the client's to release.
    stub.Release(pb.ReleaseRequest(client_token=request.client_token,
                                   lease_id=request.video.ranges[0].lease_id))  # fmt: skip


def encoded(stub: pb_grpc.VideoSidecarStub, request: pb.EncodeRequest) -> pb.EncodeResult:
    """An Encode call's result (its last event)."""
    events = list(stub.Encode(request, timeout=30))
    assert events[-1].HasField("result")
    return events[-1].result


@pytest.mark.parametrize(
    ("file", "written"), [("u.webm", "webm"), ("u.mp4", "mp4"), ("U.WebM", "webm")]
)
def test_a_raw_request_naming_no_container_gets_the_extensions(
    raw: tuple[pb_grpc.VideoSidecarStub, SidecarClient],
    daemon: Daemon,
    name: str,
    file: str,
    written: str,
) -> None:
    stub, c = raw
    result = encoded(stub, raw_request(c, f"{name}/{file}", pb.CONTAINER_UNSPECIFIED))
    assert result.container == written
    data = (daemon.output_dir / name / file).read_bytes()
    assert data[:4] == WEBM_MAGIC if written == "webm" else is_mp4(data)


def test_bytes_naming_no_container_are_mp4(
    raw: tuple[pb_grpc.VideoSidecarStub, SidecarClient],
) -> None:
    stub, c = raw
    request = raw_request(c, "unused.mp4", pb.CONTAINER_UNSPECIFIED)
    request.output.bytes.SetInParent()
    result = encoded(stub, request)
    assert result.container == "mp4" and is_mp4(result.data)


def test_the_framed_socket_refuses_a_name_that_disagrees(
    raw: tuple[pb_grpc.VideoSidecarStub, SidecarClient], daemon: Daemon, name: str
) -> None:
    _, c = raw
    request = raw_request(c, f"{name}/w.mp4", pb.CONTAINER_WEBM)
    framed = RawFramed(f"{daemon.socket}.framed", timeout=30)
    try:
        framed.send(pb.FramedRequest(encode=request).SerializeToString())
        reply = framed.reply()
    finally:
        framed.close()
    assert reply is not None and reply.HasField("error"), reply
    assert reply.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "ends in .mp4, but output.container is webm" in reply.error.message
    assert not (daemon.output_dir / name).joinpath("w.mp4").exists()


def test_a_client_goes_on_after_a_refused_name(daemon: Daemon, name: str) -> None:
    with daemon.client() as c:
        with pytest.raises(InvalidArgument, match=r"name it \.mp4"):
            c.stream(fps=24, path=f"{name}/a.webm", container="fmp4")
        with pytest.raises(InvalidArgument, match="has no extension"):
            c.encode(CLIP, fps=24, path=f"{name}/a")
        result = c.encode(np.ascontiguousarray(CLIP), fps=24, path=f"{name}/a.webm")
    assert result.container == "webm"
    assert sorted(p.name for p in (daemon.output_dir / name).iterdir()) == ["a.webm"]
