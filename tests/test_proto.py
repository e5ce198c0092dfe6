"""Generated code is checked in and must match a fresh regeneration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_current() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the test extra")
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_reflection_lists_the_service(daemon) -> None:
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert "video_sidecar.v1.VideoSidecar" in names
    assert "grpc.health.v1.Health" in names
