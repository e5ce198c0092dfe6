"""The public surface and the import rules."""

from __future__ import annotations

import subprocess
import sys

import client
from client import _errors


def test_public_api_is_pinned() -> None:
    assert sorted(client.__all__) == [
        "AlreadyExists", "AsyncSidecarClient", "Attachment", "Cancelled", "DeadlineExceeded",
        "EncodeResult", "FailedPrecondition", "FrameRange", "InvalidArgument", "InvalidVideo",
        "Lease", "NotFound", "OutOfRange", "RequestError", "ResourceExhausted", "ServerError",
        "SidecarClient", "SidecarError", "SidecarUnavailable", "Status", "Timings",
        "TransportError",
    ]  # fmt: skip
    for name in client.__all__:
        assert getattr(client, name).__module__.startswith("client")


def test_exception_tree_matches_its_documentation() -> None:
    doc = _errors.__doc__ or ""
    for name in client.__all__:
        obj = getattr(client, name)
        if isinstance(obj, type) and issubclass(obj, client.SidecarError):
            assert name in doc
    assert issubclass(client.InvalidVideo, client.InvalidArgument)
    assert issubclass(client.SidecarUnavailable, client.TransportError)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(out.stdout.split())


def test_client_never_imports_av_or_torch() -> None:
    mods = _modules_after("import client, client.patterns")
    assert "av" not in mods and "torch" not in mods


def test_sidecar_never_imports_torch() -> None:
    mods = _modules_after("import sidecar.server, sidecar.cli, sidecar.demo")
    assert "torch" not in mods
    assert "av" in mods  # sanity: the check sees real imports
