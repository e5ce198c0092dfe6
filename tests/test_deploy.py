"""The deployment files: the systemd unit verifies, the manifests hold what they promise."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import new_prefix
from .helpers import Daemon

yaml = pytest.importorskip("yaml")
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "systemd" / "video-sidecar.service").read_text()
    for line in ("Type=notify", "RuntimeDirectory=video-sidecar", "User=video-sidecar",
                 "Group=video-sidecar", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "ReadWritePaths=/var/lib/video-sidecar"):  # fmt: skip
        assert line in unit, line
    assert "PrivateDevices=yes" not in unit  # it would hide /dev/shm from the workers
    # Verify against this machine: its interpreter's script, and a user that exists here.
    script = Path(sys.executable).with_name("video-sidecar")
    local = (
        unit.replace("/opt/video-sidecar/bin/video-sidecar", str(script))
        .replace("User=video-sidecar", "User=root")
        .replace("Group=video-sidecar", "Group=root")
    )
    path = tmp_path / "video-sidecar.service"
    path.write_text(local)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_env_file_names_real_settings() -> None:
    from sidecar.config import Config

    names = {Config.env_name(f) for f in Config.__dataclass_fields__} | {"VIDEO_SIDECAR_CONFIG"}
    for raw in (DEPLOY / "systemd" / "video-sidecar.env").read_text().splitlines():
        line = raw.lstrip("#").strip()
        if line.startswith("VIDEO_SIDECAR_"):
            assert line.split("=", 1)[0] in names, line


def test_ready_notification(tmp_path: Path) -> None:
    """Type=notify: the daemon says READY=1 on $NOTIFY_SOCKET once it serves."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(30)
        daemon = Daemon(new_prefix())
        try:
            daemon.start(env={"NOTIFY_SOCKET": address})
            assert b"READY=1" in listener.recv(4096)
            assert daemon.stop() == 0
            assert b"STOPPING=1" in listener.recv(4096)
        finally:
            daemon.cleanup()


def load_all(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def containers_by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec["containers"]}


def assert_health_probes(container: dict[str, Any]) -> None:
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["video-sidecar", "health"]


def test_pod_shares_shm_and_socket() -> None:
    (pod,) = load_all("kubernetes/pod.yaml")
    assert pod["kind"] == "Pod"
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert "sizeLimit" in volumes["dshm"]["emptyDir"]
    assert "emptyDir" in volumes["sidecar-socket"]
    containers = containers_by_name(spec)
    for c in containers.values():
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["dshm"] == "/dev/shm" and mounts["sidecar-socket"] == "/run/video-sidecar"
    assert_health_probes(containers["video-sidecar"])
    assert containers["video-sidecar"]["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["fsGroup"] == 10001
    assert spec["terminationGracePeriodSeconds"] > 30


def test_daemonset_uses_host_paths() -> None:
    (ds,) = load_all("kubernetes/daemonset.yaml")
    assert ds["kind"] == "DaemonSet"
    spec = ds["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths["slabs"].startswith("/dev/shm/") and paths["socket"] == "/run/video-sidecar"
    (sidecar,) = spec["containers"]
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert env["VIDEO_SIDECAR_SHM_DIR"] == "/dev/shm/video-sidecar"
    assert_health_probes(sidecar)
    assert ds["spec"]["selector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("name", ["pod.yaml", "daemonset.yaml"])
def test_manifests_match_the_kubernetes_schema(name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    for doc in load_all(f"kubernetes/{name}"):
        validator.validate(doc, validator.latest_version(), strict=True)


def test_kubeconform_if_installed() -> None:
    if not shutil.which("kubeconform"):
        pytest.skip("kubeconform is not installed")
    files = [str(DEPLOY / "kubernetes" / f) for f in ("pod.yaml", "daemonset.yaml")]
    result = subprocess.run(
        ["kubeconform", "-strict", "-summary", *files], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_shares_ipc_and_sizes_shm() -> None:
    (compose,) = load_all("container/compose.yaml")
    sidecar, worker = compose["services"]["sidecar"], compose["services"]["worker"]
    assert sidecar["ipc"] == "shareable" and worker["ipc"] == "service:sidecar"
    assert sidecar["shm_size"]
    socket_mount = "sidecar-socket:/run/video-sidecar"
    assert socket_mount in sidecar["volumes"] and socket_mount in worker["volumes"]
    assert worker["user"].endswith(":10001")
    assert worker["depends_on"]["sidecar"]["condition"] == "service_healthy"


def test_dockerfile() -> None:
    text = (DEPLOY / "container" / "Dockerfile").read_text()
    assert text.startswith("#") and "\nFROM python:3.12-slim" in text
    user = next(line for line in text.splitlines() if line.startswith("USER "))
    assert "root" not in user and user.split()[1].split(":")[0] != "0"
    assert 'CMD ["video-sidecar", "health"]' in text and "HEALTHCHECK" in text
    assert 'ENTRYPOINT ["video-sidecar"]' in text
