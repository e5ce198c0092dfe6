"""The DaemonSet on a fresh node: its init container makes the hostPaths usable by uid 10001.

The kubelet creates `DirectoryOrCreate` hostPaths as root, mode 0755, and fsGroup does not
apply to hostPath. Temporary directories made that way stand in for them here. The init
container's command runs on them as the manifest writes it (mount paths mapped to the
stand-ins) with the identity and capabilities the manifest gives it; then the sidecar
container's entrypoint, args and env (the Dockerfile's and the manifest's) run as uid 10001
without capabilities, until it serves; SIGTERM must then stop it cleanly.

Root is needed to make root-owned directories and to switch uid (setpriv). A private mount
namespace (unshare) gives the daemon the image's /etc/group (group video-sidecar = 10001)
and lets uid 10001 reach this interpreter where it lies under a private directory (/root).
"""

from __future__ import annotations

import grp
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent  # the image's /usr/local/bin: the console scripts
UID = GID = 10001
WORKER_UID = 1000  # a worker pod: its own uid, supplementalGroups [10001]
GROUP_NAME = "video-sidecar"  # the image's name for gid 10001 (Dockerfile groupadd)
NODE_DIR_MODE = 0o755  # what the kubelet gives a DirectoryOrCreate hostPath
EMPTYDIR_MODE = 0o777  # what it gives an emptyDir
START_TIMEOUT = 60.0


# -- the manifests ------------------------------------------------------------------------


def pod_spec() -> dict[str, Any]:
    (ds,) = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes/daemonset.yaml").read_text()) if d]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def dockerfile() -> tuple[dict[str, str], list[str]]:
    """The image's ENV and ENTRYPOINT."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "container/Dockerfile").read_text())
    env: dict[str, str] = {}
    entrypoint: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest))
        elif word == "ENTRYPOINT":
            entrypoint = yaml.safe_load(rest)  # exec form: a JSON list
    return env, entrypoint


def security(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's effective securityContext: its own settings win over the pod's."""
    pod = {k: v for k, v in spec.get("securityContext", {}).items() if k != "fsGroup"}
    return {**pod, **container.get("securityContext", {})}


def mount_map(container: dict[str, Any], dirs: dict[str, Path]) -> dict[str, Path]:
    return {m["mountPath"]: dirs[m["name"]] for m in container.get("volumeMounts", [])}


def mapped(text: str, mounts: dict[str, Path]) -> str:
    """`text` with each mount path (a whole path or a prefix of one) replaced by its dir,
    in one pass: a replacement is never mapped again."""
    paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
    pattern = rf"(?<![\w./-])({paths})(?=/|\s|$|[;&|'\"])"
    return re.sub(pattern, lambda m: str(mounts[m.group(1)]), text)


def setpriv(context: dict[str, Any], groups: list[int] | None = None) -> list[str]:
    """setpriv for a container's securityContext: its uid/gid, only the caps it adds."""
    caps = context.get("capabilities", {})
    assert caps.get("drop") == ["ALL"], "containers drop every capability first"
    keep = "".join(f",+{c.lower()}" for c in caps.get("add", []))
    command = ["setpriv", f"--reuid={context['runAsUser']}", f"--regid={context['runAsGroup']}"]
    command.append(f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups")
    command += ["--inh-caps=-all", f"--bounding-set=-all{keep}"]
    if context.get("allowPrivilegeEscalation") is False:
        command.append("--no-new-privs")
    return [*command, "--"]


# -- the node -----------------------------------------------------------------------------


def may_enter(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def namespace_prologue(base: Path) -> str:
    """Shell commands for a private mount namespace: the image's group, and a way through
    any directory on the path to this interpreter that uid 10001 may not enter."""
    group_file = base / "etc-group"
    lines = Path("/etc/group").read_text()
    try:
        grp.getgrnam(GROUP_NAME)
    except KeyError:
        lines += f"{GROUP_NAME}:x:{GID}:\n"
    group_file.write_text(lines)
    group_file.chmod(0o644)
    commands = ["set -e", f"mount --bind {group_file} /etc/group"]
    needed = [VENV_BIN, Path(sys.executable).resolve(), Path(sys.base_prefix).resolve(), REPO]
    blocked: dict[Path, set[str]] = {}
    for path in needed:
        for parent in [*reversed(path.parents), path]:
            if parent.is_dir() and not may_enter(parent, UID, GID):
                blocked.setdefault(parent, set()).add(path.relative_to(parent).parts[0])
                break
    for index, (directory, children) in enumerate(sorted(blocked.items())):
        # An open view of `directory` holding only what the daemon needs from it.
        view = base / f"view{index}"
        view.mkdir(mode=0o755)
        view.chmod(0o755)
        for child in sorted(children):
            (view / child).mkdir()
            source, target = (shlex.quote(str(d / child)) for d in (directory, view))
            commands.append(f"mount --bind {source} {target}")
        commands.append(f"mount --rbind {shlex.quote(str(view))} {shlex.quote(str(directory))}")
    return "\n".join([*commands, 'exec "$@"'])


class Node:
    """Stand-ins for one pod's volumes on a fresh node, and a way to run its processes."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="vsd-node-"))
        self.base.chmod(NODE_DIR_MODE)  # like /var/lib or /run on a node
        self.shm_dirs: list[Path] = []
        self.dirs: dict[str, Path] = {}
        self.host_paths: list[Path] = []
        for volume in spec["volumes"]:
            name = volume["name"]
            if "hostPath" in volume:
                host = volume["hostPath"]["path"]
                if host.startswith("/dev/shm/"):  # on the node's tmpfs, as the slabs must be
                    path = Path(tempfile.mkdtemp(prefix="vsd-node-", dir="/dev/shm"))
                    self.shm_dirs.append(path)
                else:
                    path = self.base / name
                    path.mkdir()
                path.chmod(NODE_DIR_MODE)
                self.host_paths.append(path)
            else:
                assert "emptyDir" in volume, volume
                path = self.base / name
                path.mkdir()
                path.chmod(EMPTYDIR_MODE)
            self.dirs[name] = path
        self.home = self.base / "home"  # HOME as on a read-only root filesystem
        self.home.mkdir(mode=0o755)
        self.wrapper: list[str] = []

    def choose_sandbox(self, probe: list[str], env: dict[str, str]) -> None:
        """Run processes in a private mount namespace if one can be made, else as they are;
        skip if uid 10001 cannot run this interpreter either way."""
        namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     namespace_prologue(self.base), "sh"]  # fmt: skip
        errors = []
        for wrapper in ([namespace] if shutil.which("unshare") else []) + [[]]:
            result = self.run(probe, env, wrapper=wrapper)
            if result.returncode == 0:
                self.wrapper = wrapper
                return
            errors.append(result.stdout[-800:])
        pytest.skip(
            f"uid {UID} cannot run this interpreter and project with the image's group "
            f"(no private mount namespace to provide them?): {errors}"
        )

    def run(
        self, command: list[str], env: dict[str, str], wrapper: list[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*(self.wrapper if wrapper is None else wrapper), *command],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=120, check=False,
        )  # fmt: skip

    def cleanup(self) -> None:
        for path in (self.base, *self.shm_dirs):
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the node's directories are root's, and setpriv switches uid")
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run the containers' processes")
    made = Node(pod_spec())
    try:
        yield made
    finally:
        made.cleanup()


# -- talking to the daemon ----------------------------------------------------------------


def health(socket_path: str) -> str:
    """Health through the project client; grpc health directly if the client is unusable."""
    try:
        from client import SidecarClient
    except Exception:  # mid-refactor, say: the health protocol itself is stable
        return raw_health(socket_path)
    with SidecarClient(socket_path, timeout=2) as probe:
        return probe.health()


def raw_health(socket_path: str) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def wait_serving(process: subprocess.Popen[bytes], socket_path: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last: object = None
    while True:
        assert process.poll() is None, f"daemon exited {process.returncode}:\n{log.read_text()}"
        try:
            last = health(socket_path)
            if last == "SERVING":
                return
        except Exception as exc:  # not listening yet
            last = exc
        assert time.monotonic() < deadline, f"not serving ({last!r}):\n{log.read_text()}"
        time.sleep(0.1)


def owned_by(directory: Path, uid: int) -> set[str]:
    return {p.name for p in directory.iterdir() if p.lstat().st_uid == uid}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A worker pod's view: connect to the socket and map every slab, as uid 1000 in group 10001.
WORKER_PROBE = """
import os, sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
assert reply.status == health_pb2.HealthCheckResponse.SERVING, reply
slabs = [e.path for e in os.scandir(sys.argv[2]) if not e.name.endswith(".lock")]
assert slabs, "no slabs"
for path in slabs:
    os.close(os.open(path, os.O_RDWR | os.O_NOFOLLOW))
import socket, struct
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as framed:  # bytes that are no message
    framed.settimeout(5)
    framed.connect(sys.argv[1] + ".framed")
    framed.sendall(b"VSF2" + struct.pack(">I", 3) + b"\\xff\\x00\\x01")
    header = b""
    while len(header) < 4:
        more = framed.recv(4 - len(header))
        assert more, "the framed socket hung up"
        header += more
assert 0 < struct.unpack(">I", header)[0] < 4096, header
print("worker ok", len(slabs))
"""


# -- the test -----------------------------------------------------------------------------


def test_daemonset_serves_on_a_fresh_node(node: Node) -> None:
    spec = pod_spec()
    (init,) = spec["initContainers"]
    (sidecar,) = spec["containers"]
    image_env, entrypoint = dockerfile()
    assert entrypoint == ["video-sidecar"] and "command" not in sidecar
    mounts = mount_map(sidecar, node.dirs)

    # The sidecar's environment: the image's, then the manifest's, paths mapped. Smaller
    # slabs (memory on a shared test machine) and a free metrics port; the rest as written.
    # Only the container's own values are mapped: this machine's paths (the interpreter,
    # perhaps under /tmp like a mount path) stay as they are.
    env = image_env | {e["name"]: e["value"] for e in sidecar["env"]}
    env = {k: mapped(v, mounts) for k, v in env.items() if k != "PATH"}
    env |= {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(node.home), "LANG": "C.UTF-8"}
    if "/tmp" in mounts:
        env["TMPDIR"] = str(mounts["/tmp"])
    env |= {"VIDEO_SIDECAR_SLABS": "2", "VIDEO_SIDECAR_SLAB_SIZE": "16MiB",
            "VIDEO_SIDECAR_METRICS": f"127.0.0.1:{free_port()}"}  # fmt: skip
    assert env["VIDEO_SIDECAR_SHM_GROUP"] == GROUP_NAME
    socket_path = env["VIDEO_SIDECAR_SOCKET"]
    shm_dir = Path(env["VIDEO_SIDECAR_SHM_DIR"])
    assert shm_dir in node.shm_dirs, "the slabs live on the node's /dev/shm (a tmpfs)"
    volume_dirs = set(node.dirs.values())
    assert Path(socket_path).parent in volume_dirs, socket_path
    assert Path(env["VIDEO_SIDECAR_OUTPUT_DIR"]) in volume_dirs

    daemon_context = security(spec, sidecar)
    as_daemon = setpriv(daemon_context)
    assert daemon_context["runAsUser"] == UID and daemon_context["runAsGroup"] == GID
    assert daemon_context.get("capabilities", {}).get("add") is None
    serve = [str(VENV_BIN / entrypoint[0]), *sidecar["args"]]
    # The same interpreter (a libpython it may not read can make the loader pick another),
    # the project, and the image's group.
    same = f"import grp, sidecar.face.server, sys; grp.getgrnam({GROUP_NAME!r}); "
    same += f"assert sys.version == {sys.version!r} and sys.prefix == {sys.prefix!r}, sys.version"
    node.choose_sandbox([*as_daemon, sys.executable, "-c", same], env)

    # Before the init container: the node's directories are root's, and the daemon fails.
    for path in node.host_paths:
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, NODE_DIR_MODE)
    failed = node.run([*as_daemon, *serve], env)
    assert failed.returncode != 0, failed.stdout
    assert "not writable" in failed.stdout or "Permission" in failed.stdout, failed.stdout

    # The init container, as written, on the mapped paths; twice, as on a pod restart.
    init_context = security(spec, init)
    assert init_context["runAsUser"] == 0 and init_context["runAsNonRoot"] is False
    init_command = [mapped(arg, mount_map(init, node.dirs))
                    for arg in [*init.get("command", []), *init.get("args", [])]]  # fmt: skip
    for _ in range(2):
        result = node.run([*setpriv(init_context), *init_command], env={"PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, result.stdout
    for mount in init["volumeMounts"]:  # what the workers may do is tried below
        st = node.dirs[mount["name"]].stat()
        assert (st.st_uid, st.st_gid) == (UID, GID), mount
        assert st.st_mode & 0o700 == 0o700 and not st.st_mode & 0o002, oct(st.st_mode)

    # The sidecar container: serves, and stops cleanly on SIGTERM.
    before = {d: owned_by(d, UID) for d in (Path("/dev/shm"), Path(tempfile.gettempdir()))}
    log = node.base / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*node.wrapper, *as_daemon, *serve], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_serving(process, socket_path, log)
        argv = Path(f"/proc/{process.pid}/cmdline").read_text().split("\0")
        assert Path(argv[0]).name.startswith("python"), argv  # SIGTERM reaches the daemon
        status = Path(f"/proc/{process.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{UID}\s+{UID}\s", status, re.M), status
        assert re.search(r"^CapEff:\s+0+$", status, re.M), status

        entries = {p.name: p.stat() for p in shm_dir.iterdir()}
        # One instance's lock: the default prefix, with the socket's own suffix where the
        # socket is not the default one (`config.shm_prefix_for`).
        locks = [name for name in entries if name.endswith(".lock")]
        assert len(locks) == 1 and locks[0].startswith(f"video-sidecar-{UID}"), entries
        slabs = [st for name, st in entries.items() if not name.endswith(".lock")]
        assert len(slabs) == 2
        for st in slabs:
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, GID, 0o660)
        for path in (socket_path, f"{socket_path}.framed"):
            sock = Path(path).stat()
            assert (sock.st_uid, sock.st_gid, stat.S_IMODE(sock.st_mode)) == (UID, GID, 0o660)

        # The readiness probe as the kubelet runs it, in the sidecar container.
        probe = node.run([*as_daemon, *sidecar["readinessProbe"]["exec"]["command"]], env)
        assert probe.returncode == 0, probe.stdout
        # A worker on the node: another uid, in group 10001 (supplementalGroups).
        worker = {**daemon_context, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID}
        worker_run = node.run(
            [*setpriv(worker, groups=[GID]), sys.executable, "-c", WORKER_PROBE, socket_path,
             str(shm_dir)], env,
        )  # fmt: skip
        assert worker_run.returncode == 0, worker_run.stdout

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert list(shm_dir.iterdir()) == [], "slabs or the lock file were left behind"
    assert not Path(socket_path).exists() and not Path(f"{socket_path}.framed").exists()
    # Nothing written outside its volumes (the root filesystem is read-only in the pod).
    for directory, owned in before.items():
        assert owned_by(directory, UID) == owned, directory
    assert "Traceback" not in log.read_text(), log.read_text()
