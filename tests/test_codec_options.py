"""`CodecOptions.extra` is an allow-list: options that name files or switch on multi-pass
are refused, allowed ones are checked, rewritten, and really accepted by the encoder."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import av
import av.logging
import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.codec.catalogue import CODECS, CodecSpec, ResolvedCodec
from sidecar.codec.codec_options import ALLOWED, KNOWN_DANGEROUS, KNOWN_DANGEROUS_PARAMS
from sidecar.codec.codec_rules import (
    MAX_OPTIONS,
    MAX_PARAMS,
    SHOW,
    OptionRule,
    Params,
    join_params,
    split_params,
)
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry
from sidecar.errors import InvalidRequest

from .conftest import assert_clean_log, new_prefix
from .helpers import Daemon, decode, output_of

W = H = 64
FRAMES = 3  # x265 cannot mux a 2-frame clip into MP4 ("pts/dts pair unsupported")
LIMITS = Limits(1000, 4096, 4096, 1 << 34)
CONTAINER = {"h264": "mp4", "h265": "mp4", "av1": "mp4", "vp9": "webm"}
ENCODER_OF = {c.encoder: name for name, c in CODECS.items()}

# The requests that wrote files wherever the daemon could before the allow-list.
# {dir} is an absolute directory the test watches. (codec, extra, the field refused)
ATTACKS: list[tuple[str, dict[str, str], str]] = [
    ("h264", {"flags": "+pass1", "stats": "{dir}/x.stats"}, "codec.extra[flags]"),
    ("h264", {"x264-params": "pass=1:stats={dir}/y"}, "codec.extra[x264-params].pass"),
    ("h264", {"x264-params": "dump-yuv={dir}/d.yuv"}, "codec.extra[x264-params].dump-yuv"),
    ("h265", {"x265-params": "csv={dir}/c.csv"}, "codec.extra[x265-params].csv"),
    ("h264", {"flags": "+pass1"}, "codec.extra[flags]"),  # x264_2pass.log in the cwd
]
# More of the same kind, refused at the same gate.
MORE_ATTACKS: list[tuple[str, dict[str, str], str]] = [
    ("h264", {"stats": "{dir}/x.stats"}, "codec.extra[stats]"),
    ("h264", {"passlogfile": "{dir}/p"}, "codec.extra[passlogfile]"),
    ("h264", {"x264opts": "stats={dir}/o"}, "codec.extra[x264opts]"),
    ("h264", {"x264-params": "keyint=5:qpfile={dir}/q"}, "codec.extra[x264-params].qpfile"),
    ("h264", {"x264-params": "cqmfile={dir}/m"}, "codec.extra[x264-params].cqmfile"),
    ("h265", {"x265-stats": "{dir}/s"}, "codec.extra[x265-stats]"),
    ("h265", {"x265-params": "analysis-save={dir}/a"}, "codec.extra[x265-params].analysis-save"),
    ("h265", {"x265-params": "log-level=full"}, "codec.extra[x265-params].log-level"),
    ("av1", {"svtav1-params": "fgs-table={dir}/f"}, "codec.extra[svtav1-params].fgs-table"),
    ("av1", {"svtav1-params": "stat-file={dir}/s"}, "codec.extra[svtav1-params].stat-file"),
    ("av1", {"svtav1-params": "pass=1"}, "codec.extra[svtav1-params].pass"),
    ("vp9", {"ts-parameters": "ts_number_layers=2"}, "codec.extra[ts-parameters]"),
    ("vp9", {"b": "100000"}, "codec.extra[b]"),
    # Smuggling inside an allowed option: escapes, a second '=', NUL, a path.
    ("h264", {"x264-params": "keyint=5\\:stats={dir}/z"}, "codec.extra[x264-params].keyint"),
    ("h264", {"x264-params": "keyint=5=stats"}, "codec.extra[x264-params].keyint"),
    ("h264", {"x264-params": "keyint='5:pass=1'"}, "codec.extra[x264-params].keyint"),
    ("h264", {"x264-params": "keyint=5\x00:stats"}, "codec.extra[x264-params].keyint"),
    ("h264", {"x264-params": "keyint=5:keyint=6"}, "codec.extra[x264-params].keyint"),
    ("h264", {"x264-params": "no-mbtree"}, "codec.extra[x264-params].no-mbtree"),
    ("h264", {"tune": "{dir}/t"}, "codec.extra[tune]"),
    ("h264", {"tune": "film:stats=x"}, "codec.extra[tune]"),
    ("h264", {"aq-mode": "4"}, "codec.extra[aq-mode]"),
    ("h264", {"crf": "abc"}, "codec.extra[crf]"),  # codec.crf is the way to set it
    ("h265", {"x264-params": "keyint=5"}, "codec.extra[x264-params]"),  # another encoder's
]


def fill(attack: dict[str, str], where: Path) -> dict[str, str]:
    return {k: v.replace("{dir}", str(where)) for k, v in attack.items()}


def resolve(codec: str, extra: dict[str, str]) -> dict[str, str]:
    spec = CodecSpec(codec, extra=tuple(sorted(extra.items())))
    return spec.resolve(CONTAINER[codec]).options


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(("codec", "extra", "field"), ATTACKS + MORE_ATTACKS)
def test_attack_refused(tmp_path: Path, codec: str, extra: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve(codec, fill(extra, tmp_path))
    assert caught.value.field == field
    assert str(tmp_path) not in str(caught.value)  # the path is never echoed whole
    assert list(tmp_path.iterdir()) == []


def test_refusal_says_what_is_allowed() -> None:
    with pytest.raises(InvalidRequest, match=r"use .*aq-mode.*tune") as caught:
        resolve("h264", {"stats": "x"})
    assert "'stats' is not an allowed libx264 option" in str(caught.value)
    with pytest.raises(InvalidRequest, match=r"an integer in 0\.\.3"):
        resolve("h264", {"aq-mode": "9"})
    with pytest.raises(InvalidRequest, match=r"not an allowed key; use .*bframes.*keyint"):
        resolve("h264", {"x264-params": "keyint=5:foo=1"})


def test_client_text_is_cut_short() -> None:
    long_key, long_value = "k" * 500 + "/etc/passwd", "/tmp/" + "v" * 500
    for extra in ({long_key: "1"}, {"tune": long_value}, {"x264-params": f"{long_key}=1"}):
        with pytest.raises(InvalidRequest) as caught:
            resolve("h264", extra)
        text = f"{caught.value.field} {caught.value}"
        assert "k" * (SHOW + 1) not in text and "v" * (SHOW + 1) not in text
        assert "/etc/passwd" not in text
    with pytest.raises(InvalidRequest) as caught:
        resolve("h264", {"bad\nkey\x00": "1"})
    assert caught.value.field == r"codec.extra['bad\nkey\x00']"  # repr'd, not raw


def test_counts_and_lengths_are_bounded() -> None:
    too_many = {f"k{i}": "1" for i in range(MAX_OPTIONS + 1)}
    with pytest.raises(InvalidRequest, match="at most 32 options") as caught:
        resolve("h264", too_many)
    assert caught.value.field == "codec.extra"
    pairs = ":".join(["bframes=1"] * (MAX_PARAMS + 1))
    with pytest.raises(InvalidRequest, match="at most 32") as caught:
        resolve("h264", {"x264-params": pairs})
    assert caught.value.field == "codec.extra[x264-params]"
    with pytest.raises(InvalidRequest, match="longer than 1024"):
        resolve("h264", {"x264-params": "keyint=1" + ":" * 1020})
    with pytest.raises(InvalidRequest, match="plain value"):
        resolve("h264", {"g": "0" * 65 + "1"})
    with pytest.raises(InvalidRequest, match="plain value"):
        resolve("h264", {"g": ""})


# -- what is accepted ----------------------------------------------------------------------


def test_values_are_rewritten_canonically() -> None:
    options = resolve(
        "h264",
        {
            "x264-params": "keyint=+48::bframes=02:psy-rd=1.0,0.10:mbtree=Yes:me=UMH:",
            "tune": "Film,FastDecode",
            "aq-strength": ".50",
            "deblock": "-1,+1",
        },
    )
    assert options["x264-params"] == "keyint=48:bframes=2:psy-rd=1,0.1:mbtree=1:me=umh"
    assert options["tune"] == "film,fastdecode"
    assert options["aq-strength"] == "0.5"
    assert options["deblock"] == "-1,1"
    assert "x264-params" not in resolve("h264", {"x264-params": ":"})  # nothing to say


def test_existing_fields_and_daemon_defaults() -> None:
    assert CodecSpec().resolve().options == {
        "preset": "veryfast",
        "crf": "22",
        "aq-strength": "0.7",
    }
    assert CodecSpec(profile="fast").resolve().options == {"preset": "ultrafast", "crf": "18"}
    small = CodecSpec(profile="small", crf=30).resolve().options  # named settings win
    assert small == {"preset": "slow", "crf": "30"}
    assert CodecSpec(bitrate=500_000).resolve().options["b"] == "500000"
    assert "crf" not in CodecSpec(bitrate=500_000).resolve().options
    assert resolve("h265", {}) == {
        "preset": "ultrafast",
        "crf": "20",
        "x265-params": "log-level=error",
    }
    # A client's x265-params joins the daemon's, which keeps its log level.
    merged = resolve("h265", {"x265-params": "keyint=30:bframes=2"})
    assert merged["x265-params"] == "keyint=30:bframes=2:log-level=error"
    vp9 = resolve("vp9", {"cpu-used": "4", "tile-columns": "1"})
    assert vp9 == {
        "deadline": "realtime", "crf": "32", "b": "0", "cpu-used": "4", "row-mt": "1",
        "tile-columns": "1",
    }  # fmt: skip
    assert resolve("av1", {"svtav1-params": "tune=0"})["svtav1-params"] == "tune=0"


@pytest.mark.parametrize("encoder", sorted(ALLOWED))
def test_names_are_real_avoptions(encoder: str) -> None:
    """PyAV ignores an unknown option silently, so check the names against FFmpeg's own."""
    ctx = av.codec.CodecContext.create(encoder, "w")
    real = {o.name for o in (*ctx.supported_options.generic, *ctx.supported_options.private)}
    assert set(ALLOWED[encoder]) <= real
    assert set(KNOWN_DANGEROUS[encoder]) <= real
    assert not set(ALLOWED[encoder]) & set(KNOWN_DANGEROUS[encoder])
    params = [r for r in ALLOWED[encoder].values() if isinstance(r, Params)]
    for rule in params:
        assert not set(rule.allowed) & set(KNOWN_DANGEROUS_PARAMS[encoder])


@pytest.fixture
def ffmpeg_warnings() -> Iterator[list[tuple[int, str, str]]]:
    """FFmpeg's warnings while the test runs (unknown params are only warned about)."""
    level = av.logging.get_level()
    av.logging.set_level(av.logging.WARNING)
    try:
        with av.logging.Capture() as logs:
            yield logs
    finally:
        av.logging.set_level(level)


def encode(path: Path, codec: str, extra: dict[str, str]) -> Path:
    container = CONTAINER[codec]
    geometry = check_geometry(W, H, "rgb24", Fraction(24), LIMITS)
    spec = CodecSpec(codec, extra=tuple(extra.items())).resolve(container)
    out = path / f"out.{container}"
    encoder = VideoEncoder(str(out), geometry, spec, threads=1, container=container)
    for i in range(FRAMES):
        encoder.encode(np.full((H, W, 3), 40 * i, np.uint8))
    encoder.close()
    return out


# What an edge value needs beside it, because the encoder checks some pairs at open:
# x265 wants rc-lookahead > bframes.
COMPANIONS: dict[tuple[str, str], dict[str, str]] = {
    ("h265", "bf"): {"x265-params": "rc-lookahead=20"},
    ("h265", "bframes"): {"x265-params": "rc-lookahead=20"},
    ("h265", "rc-lookahead"): {"x265-params": "bframes=0"},
}


def with_companion(codec: str, name: str, extra: dict[str, str]) -> dict[str, str]:
    extra = dict(extra)
    for key, value in COMPANIONS.get((codec, name), {}).items():
        extra[key] = f"{extra[key]}:{value}" if key in extra else value
    return extra


def cases() -> Iterator[Any]:
    """Every allowed option (and every key of a params option) with its edge values."""
    for encoder, rules in ALLOWED.items():
        codec = ENCODER_OF[encoder]
        for name, rule in rules.items():
            if isinstance(rule, Params):
                for key, inner in rule.allowed.items():
                    extras = [
                        with_companion(codec, key, {name: f"{key}={v}"}) for v in inner.examples()
                    ]
                    yield pytest.param(codec, extras, id=f"{codec}-{name}-{key}")
            else:
                extras = [with_companion(codec, name, {name: v}) for v in rule.examples()]
                yield pytest.param(codec, extras, id=f"{codec}-{name}")


BAD_PARAM = re.compile(r"Error parsing option|Unknown option|Invalid value|Error setting")


@pytest.mark.parametrize(("codec", "extras"), list(cases()))
def test_allowed_option_is_accepted(
    tmp_path: Path, ffmpeg_warnings: list[tuple[int, str, str]], codec: str,
    extras: list[dict[str, str]],
) -> None:  # fmt: skip
    for extra in extras:
        frames, facts = decode(encode(tmp_path, codec, extra))
        assert frames.shape == (FRAMES, H, W, 3), extra
        assert (facts["width"], facts["height"]) == (W, H)
        refused = [m for _, _, m in ffmpeg_warnings if BAD_PARAM.search(m)]
        assert not refused, (extra, refused)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"out.{CONTAINER[codec]}"]


def test_the_warning_catcher_catches(
    tmp_path: Path, ffmpeg_warnings: list[tuple[int, str, str]]
) -> None:
    """An unknown params key only makes FFmpeg warn: the check above must see that."""
    for encoder, params in (("libx264", "x264-params"), ("libsvtav1", "svtav1-params")):
        spec = ResolvedCodec(CODECS[ENCODER_OF[encoder]], {params: "bogus=1"}, None, 0)
        geometry = check_geometry(W, H, "rgb24", Fraction(24), LIMITS)
        VideoEncoder(str(tmp_path / "x.mp4"), geometry, spec, threads=1).abort()
        assert any(BAD_PARAM.search(m) for _, _, m in ffmpeg_warnings), encoder
        ffmpeg_warnings.clear()


def encoder_settings(data: bytes) -> str:
    """x264 and x265 write their settings into the stream as an SEI message."""
    found = re.search(rb"options: ([ -~]+)", data)
    assert found is not None
    return found.group(1).decode()


# (codec, extra, what the encoder reports it used)
REACHES: list[tuple[str, dict[str, str], str]] = [
    (
        "h264",
        {"bf": "2", "refs": "3", "g": "30", "keyint_min": "7"},
        "ref=3 .* bframes=2 .* keyint=30 keyint_min=7",
    ),
    (
        "h264",
        {"aq-mode": "2", "aq-strength": "1.3", "sc_threshold": "33"},
        "scenecut=33 .* aq=2:1.30",
    ),
    (
        "h264",
        {"x264-params": "keyint=24:bframes=1:ref=2:cabac=1"},
        "cabac=1 ref=2 .* bframes=1 .* keyint=24",
    ),
    ("h264", {"tune": "zerolatency", "deblock": "-1,1"}, "deblock=1:-1:1 .* bframes=0"),
    (
        "h265",
        {"bf": "2", "refs": "2", "g": "30", "keyint_min": "7"},
        "ref=2 .* min-keyint=7 keyint=30 .* bframes=2",
    ),
    (
        "h265",
        {"x265-params": "keyint=24:bframes=3:aq-mode=2:sao=1"},
        "log-level=0 .* keyint=24 .* bframes=3 .* sao .* aq-mode=2",
    ),
]


@pytest.mark.parametrize(("codec", "extra", "expected"), REACHES)
def test_options_reach_the_encoder(
    tmp_path: Path, codec: str, extra: dict[str, str], expected: str
) -> None:
    assert re.search(expected, encoder_settings(encode(tmp_path, codec, extra).read_bytes()))


# -- the grammar of real names -------------------------------------------------------------

HOSTILE = [
    "/tmp/x",
    "+pass1",
    "1:stats=/tmp/x",
    "1=2",
    "",
    "1\x00",
    "..",
    "a" * 80,
    "C:\\x",
    "1\\:pass=1",
    "'1:pass=1'",
    "-1",
    "99999999999",
    "nan",
    "1e3",
]
ODD_PARAM_NAMES = ["pass", "stats", "csv", "no-sao", "", "keyint "]


def value_for(rule: OptionRule | None, hostile: bool) -> st.SearchStrategy[str]:
    bad = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12))
    if rule is None or isinstance(rule, Params):
        return bad
    good = st.sampled_from(rule.examples())
    return st.one_of(good, bad) if hostile else good


def names_from(
    allowed: list[str], refused: list[str], hostile: bool
) -> st.SearchStrategy[list[str]]:
    """Up to 4 distinct real names: allowed ones, and refused ones too if `hostile`."""
    name = st.sampled_from(allowed + refused if hostile else allowed)
    return st.lists(name, max_size=4, unique=True) if allowed or hostile else st.just([])


@st.composite
def params_string(
    draw: st.DrawFn, rule: Params | None, encoder: str, hostile: bool
) -> tuple[str, bool]:
    """A params string over real names (allowed and dangerous); whether it must pass."""
    allowed = dict(rule.allowed) if rule else {}
    refused = list(KNOWN_DANGEROUS_PARAMS[encoder]) + ODD_PARAM_NAMES
    clean = rule is not None
    pieces = []
    for name in draw(names_from(sorted(allowed), refused, hostile)):
        inner = allowed.get(name)
        value = draw(value_for(inner, hostile))
        clean = clean and inner is not None and value in inner.examples()
        pieces.append(f"{name}={value}")
    return ":".join(pieces), clean


@st.composite
def requests(draw: st.DrawFn, hostile: bool = True) -> tuple[str, dict[str, str], bool]:
    """(codec, extra over real option names, whether every option is allowed and valid)."""
    codec = draw(st.sampled_from(sorted(CONTAINER)))
    encoder = CODECS[codec].encoder
    allowed = ALLOWED[encoder]
    extra: dict[str, str] = {}
    clean = True
    for name in draw(names_from(sorted(allowed), list(KNOWN_DANGEROUS[encoder]), hostile)):
        rule = allowed.get(name)
        if isinstance(rule, Params) or name in ("x264opts", "ts-parameters"):
            assert rule is None or isinstance(rule, Params)
            extra[name], ok = draw(params_string(rule, encoder, hostile))
        else:
            extra[name] = draw(value_for(rule, hostile))
            ok = rule is not None and extra[name] in rule.examples()
        clean = clean and ok
    return codec, extra, clean


def assert_inside_the_allow_list(
    codec: str, extra: dict[str, str], options: dict[str, str]
) -> None:
    choice = CODECS[codec]
    allowed = ALLOWED[choice.encoder]
    assert not set(extra) & set(KNOWN_DANGEROUS[choice.encoder])
    ours = {choice.preset_option, "crf", *choice.quiet}
    for key, value in options.items():
        assert key in allowed or key in ours, key
        assert "/" not in value and "\x00" not in value and "\\" not in value
        rule = allowed.get(key)
        if isinstance(rule, Params):
            defaults = split_params(choice.quiet.get(key, ""))
            for name, inner in split_params(value).items():
                assert name not in KNOWN_DANGEROUS_PARAMS[choice.encoder] or name in defaults
                if name not in defaults:
                    assert name in rule.allowed and inner.strip()
                    assert rule.allowed[name].check(inner) == inner  # canonical already
        elif key in extra:
            assert rule is not None and rule.check(value) == value
            assert re.fullmatch(r"[a-z0-9.,-]+", value), value


@settings(max_examples=500, deadline=None)
@given(requests())
def test_grammar_never_yields_an_option_outside_the_allow_list(
    request: tuple[str, dict[str, str], bool],
) -> None:
    codec, extra, clean = request
    try:
        options = resolve(codec, extra)
    except InvalidRequest as exc:
        assert not clean, (extra, exc)
        assert exc.field.startswith("codec.extra")
        long_texts = [t for t in (*extra, *extra.values()) if len(t) > SHOW + 5]
        assert not any(t in str(exc) or t in exc.field for t in long_texts)
        return
    assert_inside_the_allow_list(codec, extra, options)


@settings(max_examples=300, deadline=None)
@given(requests(hostile=False))
def test_allowed_requests_pass_and_rewrite_stably(
    request: tuple[str, dict[str, str], bool],
) -> None:
    codec, extra, clean = request
    assert clean
    options = resolve(codec, extra)
    assert_inside_the_allow_list(codec, extra, options)
    # What comes out is canonical: sent again (less the daemon's own params), it comes out
    # the same.
    quiet = CODECS[codec].quiet
    again = {k: v for k, v in options.items() if k in extra}
    params = {k for k, rule in ALLOWED[CODECS[codec].encoder].items() if isinstance(rule, Params)}
    for key in set(again) & set(quiet) & params:
        ours = split_params(quiet[key])
        again[key] = join_params(
            {n: v for n, v in split_params(again[key]).items() if n not in ours}
        )
    assert {k: v for k, v in resolve(codec, again).items() if k in again} == {
        k: options[k] for k in again
    }


# -- the real daemon over raw gRPC ---------------------------------------------------------


@pytest.fixture(scope="module")
def cwd_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    """A daemon whose working directory is an empty folder, so files dropped there show."""
    cwd = tmp_path_factory.mktemp("daemon-cwd")
    d = Daemon(new_prefix())
    try:
        d.start(preexec_fn=partial(os.chdir, cwd))
    except BaseException:
        d.cleanup()  # kills the child too, if it started at all
        raise
    yield d, cwd
    try:
        assert d.stop() == 0, d.log()
        assert d.segments() == []
        assert_clean_log(d)
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def stub(cwd_daemon: tuple[Daemon, Path]) -> Iterator[tuple[pb_grpc.VideoSidecarStub, str]]:
    with grpc.insecure_channel(f"unix:{cwd_daemon[0].socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)  # type: ignore[no-untyped-call]
        yield s, s.Attach(pb.AttachRequest(client_name="codec-options")).client_token


def leased_frames(stub: pb_grpc.VideoSidecarStub, token: str) -> pb.LeaseResponse:
    """A lease holding FRAMES real rgb24 frames, written through the slab file."""
    size = FRAMES * W * H * 3
    lease: pb.LeaseResponse = stub.Lease(
        pb.LeaseRequest(client_token=token, size=size, wait_ms=5000)
    )
    attach = stub.Attach(pb.AttachRequest(client_name="writer"))
    frames = np.stack([np.full((H, W, 3), 60 * i, np.uint8) for i in range(FRAMES)])
    with open(Path(attach.shm_dir) / attach.slabs[lease.slab_id].shm_name, "r+b") as f:
        f.seek(lease.offset)
        f.write(frames.tobytes())
    return lease


def encode_request(token: str, lease_id: str, codec: str, extra: dict[str, str]) -> Any:
    return pb.EncodeRequest(
        client_token=token,
        video=pb.VideoDescriptor(
            width=W, height=H, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1),
            ranges=[pb.FrameRange(lease_id=lease_id, frame_count=FRAMES)],
        ),
        codec=pb.CodecOptions(codec=codec, extra=extra),
        output=pb.OutputSpec(bytes=pb.BytesOutput()),
    )  # fmt: skip


def refused_field(call: Any) -> str:
    """Run a streaming call that must fail with INVALID_ARGUMENT; the field it names."""
    with pytest.raises(grpc.RpcError) as caught:
        for _ in call:
            pass
    err: Any = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return str(info.metadata["field"])


def listing(*dirs: Path) -> list[str]:
    return sorted(str(p) for d in dirs for p in d.rglob("*"))


@pytest.mark.parametrize(("codec", "extra", "field"), ATTACKS)
def test_daemon_refuses_attack_and_keeps_the_lease(
    cwd_daemon: tuple[Daemon, Path],
    stub: tuple[pb_grpc.VideoSidecarStub, str],
    tmp_path: Path,
    codec: str,
    extra: dict[str, str],
    field: str,
) -> None:
    daemon, cwd = cwd_daemon
    s, token = stub
    before = listing(cwd, daemon.output_dir)
    lease = leased_frames(s, token)
    request = encode_request(token, lease.lease_id, codec, fill(extra, tmp_path))
    assert refused_field(s.Encode(request, timeout=30)) == field
    header = pb.StreamHeader(
        client_token=token, width=W, height=H, pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1), codec=request.codec, output=request.output,
    )  # fmt: skip
    chunk = pb.StreamChunk(range=pb.FrameRange(lease_id=lease.lease_id, frame_count=FRAMES))
    stream = iter([pb.StreamRequest(header=header), pb.StreamRequest(chunk=chunk)])
    assert refused_field(s.EncodeStream(stream, timeout=30)) == field
    assert list(tmp_path.iterdir()) == []
    assert listing(cwd, daemon.output_dir) == before
    assert not list(Path.cwd().glob("x264_2pass.log*"))
    s.Release(pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))  # still ours


def test_daemon_encodes_with_allowed_options(
    cwd_daemon: tuple[Daemon, Path], stub: tuple[pb_grpc.VideoSidecarStub, str]
) -> None:
    """The same path with allowed options encodes, and the options reach x264."""
    cwd = cwd_daemon[1]
    s, token = stub
    lease = leased_frames(s, token)
    extra = {"tune": "zerolatency", "x264-params": "keyint=12:ref=2"}
    data = output_of(s.Encode(encode_request(token, lease.lease_id, "h264", extra), timeout=30))
    frames, facts = decode(data)
    assert frames.shape == (FRAMES, H, W, 3) and facts["codec"] == "h264"
    settings_text = encoder_settings(data)
    assert "keyint=12" in settings_text and "ref=2" in settings_text
    assert list(cwd.iterdir()) == []
    # The lease went to the encode: releasing it again finds nothing.
    with pytest.raises(grpc.RpcError) as caught:
        s.Release(pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
