from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .helpers import SHM_DIR, Daemon
from .twins import TWINS, open_client

# Every daemon a test session starts uses this prefix, so leaks are easy to find.
SESSION_PREFIX = f"vst{os.getpid()}{secrets.token_hex(2)}"
_counter = itertools.count()


def _leaked() -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{SESSION_PREFIX}*"))


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments() -> Iterator[None]:
    """After the whole session, no segment (or lock) with the test prefix may remain."""
    yield
    leaked = _leaked()
    for name in leaked:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not leaked, f"shared-memory segments leaked: {leaked}"


def new_prefix() -> str:
    return f"{SESSION_PREFIX}-{next(_counter)}"


# Lines a healthy daemon never logs, whatever its clients did.
BAD_LOG_LINES = ("Task was destroyed", "never retrieved", "borrowed views", "Traceback")


def assert_clean_log(daemon: Daemon) -> None:
    log = daemon.log()
    for line in BAD_LOG_LINES:
        assert line not in log, f"daemon log holds {line!r}:\n{log[-3000:]}"


@pytest.fixture
def make_daemon() -> Iterator[Callable[..., Daemon]]:
    """Start daemons with their own prefix; each is stopped (and checked) afterwards."""
    started: list[Daemon] = []

    def make(start: bool = True, **options: Any) -> Daemon:
        daemon = Daemon(new_prefix(), **options)
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    for daemon in started:
        try:
            if daemon.process is not None and daemon.process.poll() is None:
                assert daemon.stop() == 0, daemon.log()
                assert_clean_log(daemon)
            assert daemon.segments() == [], "daemon left segments behind"
        finally:
            daemon.cleanup()


@contextlib.contextmanager
def running_daemon(**options: Any) -> Iterator[Daemon]:
    """A daemon for a module's tests, checked as it stops: exit 0, no segment left, a
    clean log."""
    d = Daemon(new_prefix(), **options).start()
    yield d
    try:
        assert d.stop() == 0, d.log()
        assert d.segments() == []
        assert_clean_log(d)
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """One daemon shared by a module's tests (they must leave it as they found it)."""
    with running_daemon() as d:
        yield d


@pytest.fixture(params=TWINS)
def twin(request: pytest.FixtureRequest) -> str:
    """Which client a test runs: "sync" (`SidecarClient`) or "async" (`AsyncSidecarClient`
    behind a blocking face, see `twins`)."""
    return str(request.param)


@pytest.fixture
def connect(twin: str) -> Callable[..., Any]:
    """Opens clients of the twin under test: `with connect(daemon, timeout=5) as c:`."""

    def make(daemon: Daemon, **kwargs: Any) -> Any:
        return open_client(twin, daemon.socket, **kwargs)

    return make


@pytest.fixture
def client(daemon: Daemon, connect: Callable[..., Any]) -> Iterator[Any]:
    """A client of each twin on the module's daemon."""
    with connect(daemon) as c:
        yield c


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# Tests marked `exclusive` compare a time against a bound (one request not held up by
# another, a stop within its grace). Under xdist each runs with no other test beside it:
# every test holds a shared lock on one file (in the run's temp directory, which all
# workers share) from its setup to its teardown, an exclusive one holds it alone. A second
# lock, taken first and held by an exclusive test until it has the first, keeps the other
# workers from starving it.


@pytest.fixture(autouse=True)
def _alone_if_exclusive(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # nothing runs beside a test
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # each worker's is a folder in it
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(shared / "tests.turn", "a") as turn, open(shared / "tests.run", "a") as run:
        fcntl.flock(turn, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
