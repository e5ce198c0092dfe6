"""What a newcomer meets at the command line: every mistake gets one clear line on stderr
and a non-zero status, never a traceback; nothing is left behind (daemons, segments,
directories, temporary files)."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client import SidecarClient
from sidecar.config import Config
from sidecar.tools.launcher import DaemonProcess, auto_shm_prefix

from .conftest import new_prefix
from .helpers import SHM_DIR, Daemon, SlowHandshake, decode

CLI = [sys.executable, "-m", "sidecar"]


def cli(
    args: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """The real CLI with no VIDEO_SIDECAR_* settings of the caller's, a private state
    dir (where auto-started daemons log), a private output root and small slabs."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("VIDEO_SIDECAR_")}
    base |= {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "VIDEO_SIDECAR_OUTPUT_DIR": str(tmp_path / "out"),
        "VIDEO_SIDECAR_SLABS": "2",
        "VIDEO_SIDECAR_SLAB_SIZE": "16MiB",
    }
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout,
        env={**base, **(env or {})}, cwd=cwd or tmp_path, check=False,
    )  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The failure's stderr: exactly one line, no traceback; returns it."""
    assert result.returncode != 0, result.stdout
    if code is not None:
        assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def usage_error(result: subprocess.CompletedProcess[str]) -> str:
    """A usage mistake: one line naming it and pointing at --help; status 2."""
    line = one_line_error(result, 2)
    assert line.endswith("--help)"), line
    return line


def clip(path: Path, frames: int = 4) -> Path:
    np.save(path, np.zeros((frames, 32, 32, 3), np.uint8))
    return path


def prefix_segments(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{prefix}.*"))


# -- 1. booleans ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--insecure"], True),
        (["--no-insecure"], False),
        (["--insecure", "true"], True),  # the older spelling, still accepted
        (["--insecure", "NO"], False),
        (["--insecure=false"], False),
        (["--insecure=1", "--log-json"], True),
    ],
)
def test_boolean_flags_are_bare_with_a_no_form(
    tmp_path: Path, flags: list[str], expected: bool
) -> None:
    result = cli(["config", "--json", *flags], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f'"insecure": {"true" if expected else "false"}' in result.stdout
    assert '"insecure": "flag"' in result.stdout


def test_serve_takes_a_bare_insecure(make_daemon: Callable[..., Daemon]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = make_daemon(tcp=f"127.0.0.1:{port}", insecure=True)
    assert "--insecure" in d.args() and "true" not in d.args()
    assert "WITHOUT TLS" in d.log()


def test_the_launcher_writes_booleans_as_bare_flags() -> None:
    args = DaemonProcess("/s.sock", insecure="true", log_json=False, slabs=2).args()
    assert args[-6:] == ["--socket", "/s.sock", "--insecure", "--no-log-json", "--slabs", "2"]
    assert Config.to_args({"encoder_threads": -1}) == ["--encoder-threads=-1"]


@pytest.mark.parametrize("word", ["true", "TRUE", "yes", "Yes", "1"])
def test_environment_booleans_true(tmp_path: Path, word: str) -> None:
    result = cli(["config", "--json"], tmp_path, {"VIDEO_SIDECAR_LOG_JSON": word})
    assert result.returncode == 0 and '"log_json": true' in result.stdout, result.stderr


@pytest.mark.parametrize("word", ["false", "False", "no", "NO", "0"])
def test_environment_booleans_false(tmp_path: Path, word: str) -> None:
    result = cli(["config", "--json"], tmp_path, {"VIDEO_SIDECAR_LOG_JSON": word})
    assert result.returncode == 0 and '"log_json": false' in result.stdout, result.stderr


@pytest.mark.parametrize("word", ["maybe", "on", "2", "t"])
def test_environment_boolean_nonsense_names_the_variable(tmp_path: Path, word: str) -> None:
    line = one_line_error(cli(["config"], tmp_path, {"VIDEO_SIDECAR_INSECURE": word}), 2)
    assert "VIDEO_SIDECAR_INSECURE" in line and "not a boolean" in line


def test_inline_boolean_nonsense_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(cli(["serve", "--insecure=maybe"], tmp_path), 2)
    assert "--no-insecure" in line


def test_config_file_booleans_are_toml_booleans(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('insecure = "yes"\n')
    line = one_line_error(cli(["config", "--config", str(cfg)], tmp_path), 2)
    assert "insecure must be true or false" in line
    cfg.write_text("insecure = true\n")
    result = cli(["config", "--config", str(cfg)], tmp_path)
    assert result.returncode == 0 and "insecure = true  # file" in result.stdout


# -- 2. --value-range -1,1 ----------------------------------------------------------------


def test_value_range_takes_a_negative_value_after_a_space(daemon: Daemon, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    video = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    np.save(tmp_path / "f.npy", (video.astype(np.float32) / 127.5 - 1))
    for i, spelling in enumerate((["--value-range", "-1,1"], ["--value-range=-1,1"])):
        out = tmp_path / f"f{i}.mp4"
        result = cli(["encode", "f.npy", "-o", str(out), "--socket", daemon.socket, "--crf",
                      "0", *spelling], tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
    frames0, _ = decode(tmp_path / "f0.mp4")
    frames1, _ = decode(tmp_path / "f1.mp4")
    assert np.array_equal(frames0, frames1)
    # Read as -1..1, mid-grey stays mid-grey; read as 0..1 it would be clipped bright.
    assert abs(float(frames0.mean()) - float(video.mean())) < 8
    assert "-1,1" in cli(["encode", "--help"], tmp_path).stdout
    bad = usage_error(cli(["encode", "f.npy", "--value-range", "1,0"], tmp_path))
    assert "LOW must be below HIGH" in bad
    # Left at 0..1, the video is refused, never encoded misread, in the command's flags.
    result = cli(["encode", "f.npy", "-o", "f2.mp4", "--socket", daemon.socket], tmp_path)
    error = one_line_error(result, 2)
    assert "--value-range -1,1" in error and "value_range=" not in error and ".py" not in error
    assert not (tmp_path / "f2.mp4").exists()
    refused = cli(["encode", "f.npy", "--socket", daemon.socket, "--layout", "XYZ"], tmp_path)
    assert "layout" in one_line_error(refused, 2)


def test_input_refusals_are_given_in_the_commands_words(daemon: Daemon, tmp_path: Path) -> None:
    """The client names `value_range=(0, 1)`; the command line says `--value-range 0,1`,
    and names no parameter of the client's for an odd size."""
    np.save(tmp_path / "f.npy", np.zeros((4, 32, 32, 3), np.float32))
    args = ["encode", "f.npy", "--socket", daemon.socket, "--value-range", "0,255"]
    line = one_line_error(cli(args, tmp_path))
    assert "--value-range 0,1 or --value-range -1,1" in line, line
    assert "value_range" not in line and "as uint8" in line, line
    np.save(tmp_path / "odd.npy", np.zeros((4, 255, 447, 3), np.uint8))
    args = ["encode", "odd.npy", "--socket", daemon.socket, "--pixel-format", "rgb24"]
    line = one_line_error(cli(args, tmp_path))
    assert "even width" in line and "crop to 446x254" in line and "pixel_format" not in line


# -- 3. inputs ---------------------------------------------------------------------------


def test_a_layout_hint_is_given_as_a_flag(daemon: Daemon, tmp_path: Path) -> None:
    """The client names `layout='CTHW'`; the command line says `--layout CTHW`."""
    np.save(tmp_path / "two.npy", np.zeros((4, 256, 448, 2), np.uint8))
    line = one_line_error(cli(["encode", "two.npy", "--socket", daemon.socket], tmp_path))
    assert "--layout CTHW" in line and "layout=" not in line, line


def test_a_file_that_is_not_an_array_says_what_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "fake.npy").write_text("hello")
    for name in ("notes.txt", "fake.npy"):
        line = one_line_error(cli(["encode", name, "--socket", "none.sock"], tmp_path), 2)
        assert ".npy" in line and ".npz" in line and ".pt" in line, line
        assert "allow_pickle" not in line


def test_pickles_are_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    np.save(tmp_path / "objects.npy", np.array([Evil()], dtype=object), allow_pickle=True)
    line = one_line_error(cli(["encode", "objects.npy", "--socket", "x.sock"], tmp_path), 2)
    assert "Python objects" in line
    if _has_torch():
        (tmp_path / "evil.pt").write_bytes(pickle.dumps(Evil()))
        line = one_line_error(cli(["encode", "evil.pt", "--socket", "x.sock"], tmp_path), 2)
        assert "weights_only" in line
    assert not marker.exists()


def test_npz_inputs(daemon: Daemon, tmp_path: Path) -> None:
    video = np.zeros((3, 32, 32, 3), np.uint8)
    np.savez(tmp_path / "one.npz", whatever=video)
    np.savez(tmp_path / "named.npz", frames=video, audio=np.zeros(10))
    np.savez(tmp_path / "many.npz", a=video, b=video)
    np.savez(tmp_path / "both.npz", video=video, frames=video)
    for name in ("one", "named"):
        result = cli(["encode", f"{name}.npz", "--socket", daemon.socket], tmp_path)
        assert result.returncode == 0, result.stderr
        assert len(decode(tmp_path / f"{name}.mp4")[0]) == 3
    line = one_line_error(cli(["encode", "many.npz", "--socket", daemon.socket], tmp_path), 2)
    assert "2 arrays (a, b)" in line and "'video'" in line
    line = one_line_error(cli(["encode", "both.npz", "--socket", daemon.socket], tmp_path), 2)
    assert "both 'video' and 'frames'" in line


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_torch_tensor_input(daemon: Daemon, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save(torch.rand(1, 3, 4, 32, 32, dtype=torch.bfloat16) * 2 - 1, tmp_path / "t.pt")
    result = cli(["encode", "t.pt", "--socket", daemon.socket, "--value-range", "-1,1"],
                 tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(decode(tmp_path / "t.mp4")[0]) == 4


def test_torch_input_without_torch(tmp_path: Path) -> None:
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch is not installed')\n")
    (tmp_path / "t.pt").write_bytes(b"PK\x03\x04")
    result = cli(["encode", "t.pt", "--socket", "x.sock"], tmp_path,
                 {"PYTHONPATH": f"{tmp_path / 'no-torch'}{os.pathsep}{os.getcwd()}"})  # fmt: skip
    line = one_line_error(result, 2)
    assert "need torch" in line and ".npy" in line


# -- 4. help -----------------------------------------------------------------------------


def test_help_explains_every_option_and_shows_defaults(tmp_path: Path) -> None:
    encode = " ".join(cli(["encode", "--help"], tmp_path).stdout.split())
    for flag, text in {
        "--fps FPS": "frames per second [default: 24.0]",
        "--crf CRF": "quality: lower is better",
        "--preset PRESET": "speed against size",
        "--sample-rate HZ": "sample rate of --audio",
        "--overwrite": "replace the output file",
        "--timeout": None,
    }.items():
        if text is None:
            assert flag not in encode
        else:
            assert f"{flag} {text}" in encode, flag
    assert ".npz" in encode and ".pt" in encode
    health = cli(["health", "--help"], tmp_path).stdout
    assert "seconds to wait" in health and "[default: 5.0]" in health
    serve = cli(["serve", "--help"], tmp_path).stdout
    assert "--insecure, --no-insecure" in serve and "[default: 64MiB;" in serve
    assert "--insecure true|false" in " ".join(serve.split())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["serve", "--sokcet", "x"], "video-sidecar serve: unknown flag --sokcet; did you mean "
         "--socket? (see video-sidecar serve --help)"),
        (["serve", "--slab-sise=4MiB"], "video-sidecar serve: unknown flag --slab-sise; did you "
         "mean --slab-size? (see video-sidecar serve --help)"),
        (["status", "--jsno"], "video-sidecar status: unknown flag --jsno; did you mean --json? "
         "(see video-sidecar status --help)"),
        (["encode", "x.npy", "--overwirte"], "video-sidecar encode: unknown flag --overwirte; "
         "did you mean --overwrite? (see video-sidecar encode --help)"),
        (["health", "--zzzzqq"], "video-sidecar health: unknown flag --zzzzqq "
         "(see video-sidecar health --help)"),
        (["encode", "a.npy", "b.npy"], "video-sidecar encode: unexpected argument: b.npy "
         "(see video-sidecar encode --help)"),
    ],
)  # fmt: skip
def test_an_unknown_flag_names_the_nearest_and_the_commands_help(
    tmp_path: Path, args: list[str], said: str
) -> None:
    assert usage_error(cli(args, tmp_path)) == said


def test_a_bad_size_says_what_a_size_looks_like(tmp_path: Path) -> None:
    line = usage_error(cli(["serve", "--slab-size", "16X"], tmp_path))
    assert "16MiB" in line and "1GiB" in line and "parse_size" not in line
    line = one_line_error(cli(["config"], tmp_path, {"VIDEO_SIDECAR_SLAB_SIZE": "big"}), 2)
    assert "VIDEO_SIDECAR_SLAB_SIZE" in line and "16MiB" in line


def test_slab_counts_and_sizes_a_pool_can_use(tmp_path: Path) -> None:
    """A slab is whole pages, and a pool a bounded number of slabs: said before anything
    is made (a million slabs once took 3.6 s and 422 MB before the /dev/shm check)."""
    line = one_line_error(cli(["serve", "--slab-size", "1.3M"], tmp_path), 2)
    assert "4KiB pages" in line and "1363968" in line
    line = one_line_error(cli(["serve", "--slabs", "100000000"], tmp_path), 2)
    assert "1 to 1024" in line
    assert "socket path" in usage_error(cli(["health", "--socket", ""], tmp_path))
    assert "must name a path" in one_line_error(cli(["serve", "--socket", ""], tmp_path), 2)


def test_names_and_ports_are_checked_before_anything_starts(tmp_path: Path) -> None:
    """Exit 2 and nothing made: not a daemon started, then refused (status 1)."""
    assert "letters, digits" in usage_error(
        cli(["encode", "x.npy", "--shm-prefix", "a/b"], tmp_path)
    )
    for flag in ("--tcp", "--metrics"):
        result = cli(["serve", flag, "127.0.0.1:99999", "--insecure"], tmp_path)
        assert "port of 1 to 65535" in one_line_error(result, 2)


def test_metrics_without_their_client_are_said_before_anything_is_made(tmp_path: Path) -> None:
    """Checked before the socket and the pool: even a pool that cannot be made (no such
    --shm-dir) is not tried, and nothing is left."""
    blocked = tmp_path / "shim" / "prometheus_client"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('not installed here')\n")
    sock = tmp_path / "run" / "s.sock"
    args = ["serve", "--metrics", "127.0.0.1:9464", "--socket", str(sock), "--shm-dir",
            str(tmp_path / "no-shm"), "--shm-prefix", new_prefix(), "--slabs", "1",
            "--slab-size", "1MiB"]  # fmt: skip
    result = cli(args, tmp_path, {"PYTHONPATH": str(tmp_path / "shim")}, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "--metrics needs prometheus-client" in result.stderr
    assert "pip install prometheus-client" in result.stderr
    assert "pip install '.[metrics]' in a checkout" in result.stderr
    assert "Traceback" not in result.stderr and "no-shm" not in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_bad_numbers_are_usage_errors(tmp_path: Path) -> None:
    assert "positive" in usage_error(cli(["health", "--timeout", "-1"], tmp_path))
    assert "positive" in usage_error(cli(["encode", "x.npy", "--fps", "0"], tmp_path))
    assert "at least 1" in usage_error(cli(["demo", "--frames", "0"], tmp_path))
    assert "whole number" in usage_error(cli(["config", "--slabs", "2.5"], tmp_path))
    assert "finite" in usage_error(cli(["config", "--lease-ttl", "nan"], tmp_path))
    line = one_line_error(cli(["encode", "x.npy", "--audio", "a.npy"], tmp_path), 2)
    assert "--sample-rate" in line


# -- 5./6a. the output file ----------------------------------------------------------------


def test_output_is_checked_before_anything_is_encoded(tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    (tmp_path / "taken.mp4").write_bytes(b"keep me")
    absent = str(tmp_path / "absent" / "s.sock")  # no daemon: none may be started
    cases = {
        "exists; pass --overwrite": ["-o", "taken.mp4"],
        "directory missingdir does not exist": ["-o", "missingdir/a.mp4"],
        "is a directory": ["-o", str(tmp_path)],
        "is the input file": ["-o", "clip.npy", "--overwrite"],
        "not a regular file": ["-o", os.devnull, "--overwrite"],
    }
    for expected, args in cases.items():
        result = cli(["encode", "clip.npy", "--socket", absent, *args], tmp_path, timeout=30)
        line = one_line_error(result, 2)
        assert expected in line, line
    assert (tmp_path / "taken.mp4").read_bytes() == b"keep me"
    assert not (tmp_path / "absent").exists(), "a daemon was started for a refused output"
    assert not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-o", "out.avi"], "-o 'out.avi' ends in .avi, which no container writes: name it .mp4"),
        (["-o", "out.mkv", "--container", "webm"], "-o 'out.mkv' ends in .mkv, which no "
         "container writes"),
        (["-o", "out.mp4", "--container", "webm"], "-o 'out.mp4' ends in .mp4, but --container "
         "is webm: name it .webm or drop --container"),
        (["-o", "out.webm", "--container", "mp4"], "but --container is mp4: name it .mp4"),
        (["-o", "noext"], "-o 'noext' has no extension, which says what plays it: name it "
         "'noext.mp4'"),
        (["-o", "noext", "--container", "webm"], "name it 'noext.webm'"),
    ],
)  # fmt: skip
def test_an_output_name_that_says_no_container_or_another_is_refused(
    daemon: Daemon, tmp_path: Path, args: list[str], said: str
) -> None:
    clip(tmp_path / "clip.npy")
    result = cli(["encode", "clip.npy", "--socket", daemon.socket, *args], tmp_path)
    line = one_line_error(result, 2)
    assert line == f"video-sidecar: {said}" or said in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.npy"]


def test_fragmented_mp4_goes_in_an_mp4_file(daemon: Daemon, tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    args = ["encode", "clip.npy", "-o", "f.mp4", "--container", "fmp4", "--socket", daemon.socket]
    result = cli(args, tmp_path)
    assert result.returncode == 0 and "h264 in fmp4" in result.stdout, result.stderr
    assert (tmp_path / "f.mp4").read_bytes()[4:8] == b"ftyp"


def test_overwrite_replaces(daemon: Daemon, tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    (tmp_path / "clip.mp4").write_bytes(b"old")
    result = cli(["encode", "clip.npy", "--socket", daemon.socket, "--overwrite"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(decode(tmp_path / "clip.mp4")[0]) == 4
    assert not list(tmp_path.glob(".*.part"))


def test_webm_output_name_picks_the_container(daemon: Daemon, tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    result = cli(["encode", "clip.npy", "-o", "out.webm", "--socket", daemon.socket], tmp_path)
    assert result.returncode == 0 and "vp9 in webm" in result.stdout, result.stderr
    assert (tmp_path / "out.webm").read_bytes()[:4] == b"\x1a\x45\xdf\xa3"
    result = cli(["encode", "clip.npy", "--container", "webm", "--socket", daemon.socket],
                 tmp_path)  # fmt: skip
    assert result.returncode == 0 and "wrote clip.webm (vp9 in webm" in result.stdout


# -- 6b. a second socket while a daemon runs ----------------------------------------------


def test_wrong_socket_with_a_taken_prefix_is_one_line_and_leaves_nothing(
    daemon: Daemon, tmp_path: Path
) -> None:
    clip(tmp_path / "clip.npy")
    wrong = tmp_path / "wrong" / "deeper" / "s.sock"
    result = cli(["encode", "clip.npy", "--socket", str(wrong)], tmp_path,
                 {"VIDEO_SIDECAR_SHM_PREFIX": daemon.prefix})  # fmt: skip
    line = one_line_error(result, 1)
    assert f"already owns shm prefix '{daemon.prefix}'" in line, line
    assert "log:" in line
    assert not (tmp_path / "wrong").exists(), "the socket directory was left behind"
    assert not (tmp_path / "clip.mp4").exists() and not list(tmp_path.glob(".*.part"))
    with daemon.client() as c:  # the running daemon is untouched
        assert c.health() == "SERVING"


@pytest.mark.parametrize("given", ["wrong/s.sock", "WRONG"])
def test_wrong_socket_gets_its_own_prefix(daemon: Daemon, tmp_path: Path, given: str) -> None:
    # "WRONG" is a file here, as the help says (--socket PATH), not a host to look up.
    clip(tmp_path / "clip.npy")
    wrong = tmp_path / given
    prefix = auto_shm_prefix(str(wrong))
    assert prefix.startswith(f"video-sidecar-{os.getuid()}-") and prefix != daemon.prefix
    try:
        result = cli(["encode", "clip.npy", "--socket", given], tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr
        assert f"shm prefix {prefix}" in result.stderr
        log = tmp_path / "state" / "video-sidecar" / f"{prefix}.log"
        assert str(log) in result.stderr and "serving on" in log.read_text()
        assert "sidecar.face.server" not in result.stderr  # its log went to the file
    finally:
        leaked = prefix_segments(prefix)
        for name in leaked:
            (SHM_DIR / name).unlink(missing_ok=True)
    assert not leaked, f"the auto-started daemon left {leaked}"
    assert not wrong.exists() and not (tmp_path / "wrong").exists()


def test_daemons_on_two_sockets_each_take_a_prefix_of_their_own(tmp_path: Path) -> None:
    """`serve --socket` with no prefix set derives one from the socket, as `encode` and
    `demo` do for a daemon they start: a second daemon beside the first just works."""
    daemons = [
        DaemonProcess(str(tmp_path / name / "s.sock"), output_dir=str(tmp_path / "out"),
                      slabs=1, slab_size="4MiB", encoder_processes=0)
        for name in ("a", "b")
    ]  # fmt: skip
    prefixes = [auto_shm_prefix(d.socket) for d in daemons]
    assert len(set(prefixes)) == 2
    settings = {k: "" for k in os.environ if k.startswith("VIDEO_SIDECAR_")}
    try:
        with open(tmp_path / "daemons.log", "ab") as log:
            for d in daemons:
                d.start(60, env=settings, output=log)
        for d, prefix in zip(daemons, prefixes, strict=True):
            with SidecarClient(d.socket) as c:
                assert c.encode(np.zeros((2, 32, 32, 3), np.uint8)).frames == 2
            assert prefix_segments(prefix), prefix
        configured = cli(["config", "--socket", daemons[1].socket], tmp_path).stdout
        assert f'shm_prefix = "{prefixes[1]}"  # default' in configured
    finally:
        for d in daemons:
            if d.process is not None:
                d.force_stop()
        leaked = [name for prefix in prefixes for name in prefix_segments(prefix)]
        for name in leaked:
            (SHM_DIR / name).unlink(missing_ok=True)
    assert not leaked, (tmp_path / "daemons.log").read_text()


def test_troubleshooting_says_every_command_derives_the_prefix() -> None:
    """The advice for a prefix another daemon owns names `serve` among the commands that
    derive it from the socket, and the settings that name one instead."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md").read_text()
    item = next(i for i in text.split("\n- ") if "already owns shm prefix" in i)
    for said in ("`serve`", "`encode`", "`demo`", "--shm-prefix", "VIDEO_SIDECAR_SHM_PREFIX"):
        assert said in item, said


def test_no_daemon_is_started_for_a_network_address(tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    result = cli(["encode", "clip.npy", "--socket", "127.0.0.1:1"], tmp_path, timeout=60)
    line = one_line_error(result, 1)
    assert "no daemon answers at 127.0.0.1:1" in line and "--tcp 127.0.0.1:1" in line


def test_encode_takes_an_shm_prefix(tmp_path: Path) -> None:
    clip(tmp_path / "clip.npy")
    prefix = new_prefix()
    sock = tmp_path / "s" / "s.sock"
    result = cli(["encode", "clip.npy", "--socket", str(sock), "--shm-prefix", prefix], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"shm prefix {prefix}" in result.stderr
    assert prefix_segments(prefix) == [] and not sock.parent.exists()


# -- 6c. Ctrl-C -----------------------------------------------------------------------------


STOPS = {  # signal: (status, last line)
    signal.SIGINT: (130, "video-sidecar: interrupted"),
    signal.SIGTERM: (143, "video-sidecar: stopped by SIGTERM"),  # a job's timeout, kill
    signal.SIGHUP: (129, "video-sidecar: stopped by SIGHUP"),  # the terminal closed
}


@pytest.mark.parametrize("sig", list(STOPS), ids=lambda s: signal.Signals(s).name)
def test_ctrl_c_during_encode_is_one_line_and_stops_the_daemon(tmp_path: Path, sig: int) -> None:
    # Noise at a slow preset: an encode that takes long enough to interrupt.
    rng = np.random.default_rng(0)
    np.save(tmp_path / "noise.npy", rng.integers(0, 256, (96, 360, 640, 3), dtype=np.uint8))
    prefix = new_prefix()
    sock = tmp_path / "run" / "s.sock"
    base = {k: v for k, v in os.environ.items() if not k.startswith("VIDEO_SIDECAR_")}
    env = base | {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "VIDEO_SIDECAR_OUTPUT_DIR": str(tmp_path / "out"),
        "VIDEO_SIDECAR_SHM_PREFIX": prefix,
        "VIDEO_SIDECAR_SLABS": "2",
        "VIDEO_SIDECAR_SLAB_SIZE": "64MiB",
    }
    command = [*CLI, "encode", "noise.npy", "--socket", str(sock), "--preset", "veryslow"]
    # Its own process group, as a shell gives a foreground job: the terminal's Ctrl-C
    # goes to that group, which the auto-started daemon must not be part of.
    # A runner started in the background (`&` without job control) ignores SIGINT, and a
    # child would inherit that; a Python handler here becomes the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 60
        with SidecarClient(str(sock), timeout=2) as probe:
            while True:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the daemon never came up"
                try:
                    if probe.status().active_encodes + probe.status().queued_encodes:
                        break
                except Exception:
                    pass
                time.sleep(0.1)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    status, last_line = STOPS[sig]
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == last_line
    assert "sidecar.face.server" not in stderr  # the daemon's log went to its file
    assert prefix_segments(prefix) == [], "the auto-started daemon left segments"
    assert not sock.exists() and not sock.parent.exists()
    assert not (tmp_path / "noise.mp4").exists() and not list(tmp_path.glob(".*.part"))


# -- 6d. no daemon ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "health"])
def test_no_daemon_says_how_to_start_one(tmp_path: Path, command: str) -> None:
    sock = str(tmp_path / "none.sock")
    line = one_line_error(cli([command, "--socket", sock], tmp_path, timeout=60), 1)
    assert f"no daemon answers at {sock}" in line
    assert f"video-sidecar serve --socket {sock}" in line
    assert "failed to connect" not in line


class _Refused:
    """A socket whose connect is refused as one this user may not open is."""

    def __init__(self, *args: Any) -> None:
        pass

    def settimeout(self, timeout: float) -> None:
        pass

    def connect(self, path: str) -> None:
        raise PermissionError(13, "Permission denied")

    def close(self) -> None:
        pass


def test_a_socket_this_user_may_not_open_is_said_so_and_gets_no_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root opens any socket: the refusal is the kernel's to a user, made here."""
    from client import SidecarUnavailable
    from sidecar.tools import cli as cli_module
    from sidecar.tools import launcher

    sock = str(tmp_path / "theirs.sock")
    said = (f"permission denied on {sock}: the daemon's user or its --shm-group must "
            "include you")  # fmt: skip
    assert launcher.permission_denied(sock) == ""  # nothing there: no daemon, no refusal
    monkeypatch.setattr(launcher.net, "socket", _Refused)
    assert launcher.permission_denied(sock) == said
    with pytest.raises(launcher.DaemonStartError, match=r"^permission denied on "):
        launcher.AutoDaemon(sock)
    assert cli_module._unreachable(sock, SidecarUnavailable("failed to connect"), 5) == said
    assert not list(tmp_path.iterdir()) and not (tmp_path / "state").exists()


NOBODY = 65534


def _as_nobody() -> list[str]:
    """setpriv's words for running as `nobody`; a skip, saying why, where that cannot be."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to act as another user")
    who = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run([*who, *CLI, "--version"], capture_output=True, text=True,
                           timeout=60, check=False)  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:120]
        pytest.skip(f"the user nobody cannot run this checkout's Python ({last})")
    return who


def test_another_users_socket_is_permission_denied_not_no_daemon(tmp_path: Path) -> None:
    """A socket nobody may open: `status` and `encode` as nobody say so, and `encode`
    starts no daemon of its own over it."""
    who = _as_nobody()
    place = Path(tempfile.mkdtemp(prefix="vs-denied-"))
    try:
        os.chmod(place, 0o777)
        sock = place / "s.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(sock))
        listener.listen(1)
        os.chmod(sock, 0)
        clip(place / "clip.npy")
        os.chmod(place / "clip.npy", 0o644)
        said = (f"video-sidecar: permission denied on {sock}: the daemon's user or its "
                "--shm-group must include you")  # fmt: skip
        env = {"XDG_STATE_HOME": str(place / "state"), "HOME": str(place)}
        for args in (["status"], ["encode", "clip.npy"]):
            result = subprocess.run(
                [*who, *CLI, *args, "--socket", str(sock)], capture_output=True, text=True,
                timeout=60, cwd=place, check=False,
                env={**{k: v for k, v in os.environ.items() if not k.startswith("VIDEO_")},
                     **env},
            )  # fmt: skip
            assert one_line_error(result, 1) == said, args
        assert not (place / "state").exists(), "a daemon was started over the socket"
        assert not (place / "clip.mp4").exists() and not list(place.glob(".*.part"))
        listener.close()
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_health_waits_for_a_daemon_slow_to_answer(daemon: Daemon, tmp_path: Path) -> None:
    """The probe a container runs on a host busy encoding: a handshake that takes its
    time is waited for within `--timeout`, not reported as no daemon."""
    proxy = SlowHandshake(tmp_path / "slow.sock", daemon.socket, delay_s=0.6)
    try:
        result = cli(["health", "--socket", str(proxy.path)], tmp_path)
    finally:
        proxy.close()
    assert (result.returncode, result.stdout.strip()) == (0, "SERVING"), result.stderr


# -- 7. the demo's output --------------------------------------------------------------------


def test_demo_replaces_its_one_file(daemon: Daemon, tmp_path: Path) -> None:
    args = ["demo", "--socket", daemon.socket, "--frames", "3", "--width", "64",
            "--height", "64"]  # fmt: skip
    before = set(daemon.output_dir.rglob("*.mp4")) if daemon.output_dir.exists() else set()
    for _ in range(2):
        result = cli(args, tmp_path)
        assert result.returncode == 0, result.stderr
    after = set(daemon.output_dir.rglob("*.mp4")) - before
    demo_file = (daemon.output_dir / "demo" / "demo.mp4").resolve()
    assert {p.resolve() for p in after} <= {demo_file} and demo_file.exists()
    assert f"wrote {demo_file}" in result.stdout
    assert "demo/demo.mp4" in " ".join(cli(["demo", "--help"], tmp_path).stdout.split())

    named = [*args, "-o", f"named-{os.getpid()}.mp4"]
    assert cli(named, tmp_path).returncode == 0
    line = one_line_error(cli(named, tmp_path), 2)  # as encode says it
    assert "exists" in line and "--overwrite" in line
    assert cli([*named, "--overwrite"], tmp_path).returncode == 0


# -- 8. other rough edges ----------------------------------------------------------------------


def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.Popen([*CLI, "config"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # as `video-sidecar config | head -0` would
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
