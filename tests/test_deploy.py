"""The deployment files: the systemd unit verifies, the manifests hold what they promise."""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
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


def effective_user(spec: dict[str, Any], container: dict[str, Any]) -> int:
    context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    return int(context.get("runAsUser", 0))


@pytest.mark.parametrize("name", ["pod.yaml", "daemonset.yaml"])
def test_host_paths_are_handed_to_the_daemon(name: str) -> None:
    """The kubelet makes hostPaths root's (0755) and fsGroup skips them: a root init
    container with CHOWN and FOWNER only must hand each one a non-root container mounts
    writable to uid 10001 (tests/test_fresh_node.py runs it). emptyDirs need nothing."""
    for doc in load_all(f"kubernetes/{name}"):
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "DaemonSet" else doc["spec"]
        host = {v["name"] for v in spec["volumes"] if "hostPath" in v}
        if name == "pod.yaml":
            assert not host, "the pod shares emptyDirs, which fsGroup covers"
        inits = spec.get("initContainers", [])
        for container in spec["containers"]:
            if effective_user(spec, container) == 0:
                continue
            for mount in container["volumeMounts"]:
                if mount["name"] not in host or mount.get("readOnly"):
                    continue
                path = mount["mountPath"]
                preparers = [
                    init
                    for init in inits
                    if effective_user(spec, init) == 0
                    and any(m["name"] == mount["name"] for m in init["volumeMounts"])
                    and "chown 10001:10001" in " ".join(init["command"])
                    and path in " ".join(init["command"])
                ]
                assert preparers, f"nothing hands {path} to uid 10001"
        for init in inits:
            context = init["securityContext"]
            assert context["capabilities"]["drop"] == ["ALL"]
            assert set(context["capabilities"]["add"]) <= {"CHOWN", "FOWNER"}
            assert context["allowPrivilegeEscalation"] is False


def test_compose_volumes_start_as_the_daemons() -> None:
    """Docker fills an empty named volume from the image, owner included: the Dockerfile
    must hand each mount point to uid 10001, and compose must not bind host directories."""
    (compose,) = load_all("container/compose.yaml")
    text = (DEPLOY / "container" / "Dockerfile").read_text()
    assert "useradd --system --uid 10001" in text
    chown = re.search(r"chown video-sidecar:video-sidecar ([^&\n]+)", text)
    assert chown is not None
    for entry in compose["services"]["sidecar"]["volumes"]:
        source, target = entry.split(":")[:2]
        assert source in compose["volumes"], f"{source} is not a named volume"
        assert target in chown.group(1).split(), f"the image does not chown {target}"


# -- the systemd install commands in deploy/README.md ------------------------------------


def unit_settings() -> dict[str, str]:
    settings = {}
    for line in (DEPLOY / "systemd" / "video-sidecar.service").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            settings[key] = value
    return settings


def readme_section(title: str) -> str:
    text = (DEPLOY / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def install_commands() -> list[list[str]]:
    (block,) = re.findall(r"```sh\n(.*?)```", readme_section("systemd"), re.S)
    commands = []
    for line in block.splitlines():
        for part in line.split("&&"):
            if words := shlex.split(part, comments=True):
                commands.append(words)
    return commands


def copies(commands: list[list[str]]) -> dict[str, tuple[int, str]]:
    """`install ... SOURCE DEST` commands: SOURCE -> (position, DEST)."""
    found = {}
    for index, words in enumerate(commands):
        if words[0] == "install" and "-d" not in words:
            operands = [w for i, w in enumerate(words[1:], 1)
                        if not w.startswith("-") and words[i - 1] != "-m"]  # fmt: skip
            source, dest = operands
            found[source] = (index, dest)
    return found


def test_readme_installs_what_the_unit_runs() -> None:
    """The README's commands name the unit's paths, user and name: they cannot drift."""
    unit = unit_settings()
    commands = install_commands()
    position = {" ".join(words): index for index, words in enumerate(commands)}

    # ExecStart is a console script of a venv the README makes and installs into.
    program = Path(unit["ExecStart"].split()[0])
    venv = program.parent.parent
    made = position[f"python3 -m venv {venv}"]
    pip = [i for i, w in enumerate(commands) if w[0].endswith("/pip") and w[1] == "install"]
    assert pip and all(commands[i][0] == f"{venv}/bin/pip" and i > made for i in pip)
    assert set(re.findall(r"([^\s`]+/bin/pip) install", readme_section("systemd"))) == {
        f"{venv}/bin/pip"
    }
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    assert f'\n{program.name} = "' in pyproject.split("[project.scripts]", 1)[1]

    # The sysusers file makes the unit's user and group, before the unit starts.
    installed = copies(commands)
    for source in installed:
        assert (DEPLOY.parent / source).is_file(), source
    sysusers = "deploy/systemd/video-sidecar.sysusers"
    at, dest = installed[sysusers]
    assert dest.startswith("/etc/sysusers.d/") and dest.endswith(".conf")
    made_users = position["systemd-sysusers"]
    assert made_users > at
    entries = [line.split()[:2] for line in (DEPLOY.parent / sysusers).read_text().splitlines()
               if line[:1] in ("u", "g")]  # fmt: skip
    assert ["u", unit["User"]] in entries and ["g", unit["Group"]] in entries

    # The env file where EnvironmentFile reads it; the unit under its own name.
    assert installed["deploy/systemd/video-sidecar.env"][1] == unit["EnvironmentFile"].lstrip("-")
    unit_file = "deploy/systemd/video-sidecar.service"
    at_unit, dest = installed[unit_file]
    assert dest == f"/etc/systemd/system/{Path(unit_file).name}"
    reload = position["systemctl daemon-reload"]
    enable = position[f"systemctl enable --now {Path(unit_file).stem}"]
    assert max(at_unit, made_users, *pip) < reload < enable
    assert position[f"usermod -aG {unit['Group']} WORKER_USER"] > made_users

    # The env file's paths lie in the directories systemd makes for the unit.
    env = dict(
        line.split("=", 1)
        for line in (DEPLOY / "systemd" / "video-sidecar.env").read_text().splitlines()
        if line.startswith("VIDEO_SIDECAR_")
    )
    assert env["VIDEO_SIDECAR_SOCKET"].startswith(f"/run/{unit['RuntimeDirectory']}/")
    assert env["VIDEO_SIDECAR_OUTPUT_DIR"].startswith(f"/var/lib/{unit['StateDirectory']}/")


# -- metrics ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_idle_daemon_exports_every_counter_series(make_daemon: Callable[..., Daemon]) -> None:
    """rate() needs a series before the first event: every code starts at 0."""
    pytest.importorskip("prometheus_client")
    from sidecar.face.status_codes import STATUS_OF

    port = free_port()
    make_daemon(metrics=f"127.0.0.1:{port}")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in "#")
    assert samples['video_sidecar_requests_total{code="OK"}'] == "0.0"
    codes = {code.name for code in STATUS_OF.values()}
    assert "CANCELLED" in codes  # the outcome of a cancelled request, logged as such
    for code in codes:
        assert samples[f'video_sidecar_requests_total{{code="{code}"}}'] == "0.0", code
        assert samples[f'video_sidecar_errors_total{{code="{code}"}}'] == "0.0", code
