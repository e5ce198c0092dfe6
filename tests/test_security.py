"""Who may touch what: modes, ownership, confinement, limits, TCP only with TLS."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from client import OutOfRange, SidecarClient, TransportError
from client.patterns import moving_pattern

from .conftest import new_prefix
from .helpers import SHM_DIR, Daemon, decode


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_group_mode_for_slabs_and_socket(make_daemon, tmp_path: Path) -> None:
    group = __import__("grp").getgrgid(os.getgid()).gr_name
    sock_dir = tmp_path / "run" / "vs"
    d = make_daemon(shm_group=group, socket=str(sock_dir / "s.sock"))
    for name in d.segments():
        assert mode(SHM_DIR / name) in (0o660, 0o600)  # the lock stays 0600
        if not name.endswith(".lock"):
            assert mode(SHM_DIR / name) == 0o660
            assert os.stat(SHM_DIR / name).st_gid == os.getgid()
    assert mode(sock_dir) == 0o770
    assert mode(sock_dir / "s.sock") == 0o660


def another_group() -> int:
    """A group this process is not in by default, to give the daemon's files to."""
    import grp

    for entry in grp.getgrall():
        if entry.gr_gid not in (0, os.getgid()):
            return entry.gr_gid
    pytest.skip("needs a group besides the process's own")


needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv (util-linux) to act as another user",
)
NOBODY = 65534


@functools.cache
def _nobody_cannot_run_us() -> str:
    """Why the user `nobody` cannot run this checkout's Python and import it (a checkout in a
    private directory: `mktemp -d`, a home directory), or "" when it can."""
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-c", "import client, sidecar"],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    if probe.returncode == 0:
        return ""
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return f"the user nobody cannot run this checkout's Python ({last[:120]})"


def as_nobody() -> None:
    """Skip, saying why, where `nobody` cannot read the checkout."""
    why = _nobody_cannot_run_us()
    if why:
        pytest.skip(f"{why}: a checkout in a private directory; clone it somewhere readable")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may pass through (as /run is), unlike pytest's tmp_path."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="vs-group-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_setpriv
def test_a_member_of_the_group_reaches_a_socket_in_a_directory_the_daemon_made(
    make_daemon, open_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """The directory the daemon makes for its socket is given to --shm-group too, not only
    the socket: its members must be able to enter it."""
    import grp

    as_nobody()

    gid = another_group()
    sock_dir = open_dir / "run"
    d = make_daemon(shm_group=grp.getgrgid(gid).gr_name, socket=str(sock_dir / "s.sock"))
    st = os.stat(sock_dir)
    assert stat.S_IMODE(st.st_mode) == 0o770 and st.st_gid == gid
    probe = (
        "import sys; from client import SidecarClient\n"
        "with SidecarClient(sys.argv[1], timeout=10) as c: print(c.health())"
    )
    member = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={gid}"]
    stranger = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for who, answers in ((member, "SERVING"), (stranger, None)):
        run = subprocess.run(
            [*who, sys.executable, "-c", probe, d.socket],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        if answers:
            assert run.stdout.strip() == answers, run.stderr
        else:
            assert run.returncode != 0 and "SERVING" not in run.stdout


@needs_setpriv
def test_a_daemon_outside_its_shm_group_says_so(make_daemon, open_dir: Path) -> None:  # type: ignore[no-untyped-def]
    import grp

    as_nobody()

    group = grp.getgrgid(another_group()).gr_name
    d = make_daemon(start=False, shm_group=group, socket=str(open_dir / "s.sock"))
    for path in (open_dir, d.dir):
        os.chown(path, NOBODY, NOBODY)
    run = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *d.args()],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert run.returncode == 1
    assert f"group {group!r} (--shm-group): the daemon's user is not in that group" in run.stderr
    assert "Traceback" not in run.stderr and d.segments() == []


def test_private_socket_directory(make_daemon, tmp_path: Path) -> None:
    sock_dir = tmp_path / "fresh"
    d = make_daemon(socket=str(sock_dir / "s.sock"))
    assert mode(sock_dir) == 0o700 and mode(d.socket) == 0o600


def test_sweep_never_follows_a_planted_link(tmp_path: Path) -> None:
    """A segment-named symlink planted in /dev/shm is removed; its target is untouched."""
    prefix = new_prefix()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    planted = SHM_DIR / f"{prefix}.deadbeef.0"
    planted.symlink_to(victim)
    d = Daemon(prefix).start()
    try:
        assert not planted.is_symlink() and victim.read_bytes() == b"precious"
        assert d.stop() == 0
    finally:
        planted.unlink(missing_ok=True)
        d.cleanup()


def test_only_own_segments_are_swept() -> None:
    prefix = new_prefix()
    unrelated = SHM_DIR / f"{prefix}-other.deadbeef.0"  # a different prefix
    odd = SHM_DIR / f"{prefix}.notours"  # not the segment pattern
    for path in (unrelated, odd):
        path.write_bytes(b"x")
    d = Daemon(prefix).start()
    try:
        assert unrelated.exists() and odd.exists()
        assert d.stop() == 0
    finally:
        unrelated.unlink(missing_ok=True)
        odd.unlink(missing_ok=True)
        d.cleanup()


@pytest.mark.parametrize(
    ("limit", "video", "field"),
    [
        ({"max_frames": 10}, moving_pattern(11, 32, 32), "frames"),
        ({"max_width": 64}, moving_pattern(1, 32, 66), "width"),
        ({"max_height": 64}, moving_pattern(1, 66, 32), "height"),
        ({"max_request_bytes": 10000}, moving_pattern(4, 32, 32), "raw bytes"),
    ],
)
def test_configured_limits(make_daemon, limit: dict, video: np.ndarray, field: str) -> None:
    d = make_daemon(**limit)
    with d.client() as c:
        with pytest.raises(OutOfRange, match=field):
            c.encode(video)
        assert c.encode(moving_pattern(2, 32, 32)).frames == 2


def test_tcp_needs_tls_or_insecure(tmp_path: Path) -> None:
    daemon = Daemon(new_prefix(), tcp=f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(RuntimeError, match="exited with status 2"):
            daemon.start()
    finally:
        daemon.cleanup()


def test_tcp_insecure_when_asked(make_daemon) -> None:
    port = free_port()
    d = make_daemon(tcp=f"127.0.0.1:{port}", insecure="true")
    assert "WITHOUT TLS" in d.log()
    with SidecarClient(f"127.0.0.1:{port}", transport="inline") as c:
        frames, _ = decode(c.encode(moving_pattern(3, 32, 32)).data or b"")
    assert len(frames) == 3


def test_tcp_with_tls(make_daemon, tmp_path: Path) -> None:
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    d = make_daemon(tcp=f"127.0.0.1:{port}", tls_cert=str(cert), tls_key=str(key))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with SidecarClient(f"localhost:{port}", credentials=credentials) as c:
        assert c.health() == "SERVING"
        assert c.encode(moving_pattern(2, 32, 32)).frames == 2
    plain = SidecarClient(f"localhost:{port}", timeout=3)  # no TLS: refused
    with plain, pytest.raises(TransportError):  # the handshake fails: nothing answers
        plain.health()
    assert d.socket  # the Unix socket serves as before
