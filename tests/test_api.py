"""The public surface and the import rules."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import client
from client import _errors
from client._options import EncodeOptions  # the shared parameter set the signatures mirror

CLIENT_DIR = Path(client.__file__).parent
TWINS = (client.SidecarClient, client.AsyncSidecarClient)


def test_public_api_is_pinned() -> None:
    assert sorted(client.__all__) == [
        "AlreadyExists", "AsyncSidecarClient", "Attachment", "Cancelled", "DeadlineExceeded",
        "EncodeResult", "FailedPrecondition", "FrameRange", "InvalidArgument", "InvalidVideo",
        "Lease", "Live", "NotFound", "OutOfRange", "Preview", "Reason", "RequestError",
        "ResourceExhausted", "ServerError", "SidecarClient", "SidecarClosed", "SidecarError",
        "SidecarUnavailable", "SpriteSheet", "Status", "Thumbnail", "Timings", "TransportError",
        "export_to_video",
    ]  # fmt: skip
    for name in client.__all__:
        # Reason is the wire vocabulary's, shared with the daemon.
        home = "sidecar.vocabulary" if name == "Reason" else "client"
        assert getattr(client, name).__module__.startswith(home)


def _public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_twins_have_the_same_methods() -> None:
    sync, aio = TWINS
    assert _public_methods(sync) == _public_methods(aio)
    for name in _public_methods(sync):
        a, b = getattr(sync, name), getattr(aio, name)
        if callable(a):
            assert inspect.signature(a).parameters.keys() == inspect.signature(b).parameters.keys()


@pytest.mark.parametrize("method", ["encode", "stream", "encode_leased"])
@pytest.mark.parametrize("cls", TWINS, ids=lambda cls: cls.__name__)
def test_signatures_list_every_encode_option(cls: type, method: str) -> None:
    """The public methods take every field of EncodeOptions, keyword, with its default
    and type: the parameter set is defined once and shown explicitly everywhere."""
    function = getattr(cls, method)
    params = inspect.signature(function).parameters
    assert function.__qualname__ == f"{cls.__name__}.{method}"
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    for field in dataclasses.fields(EncodeOptions):
        param = params[field.name]
        assert param.default == field.default, field.name
        assert param.annotation == field.type, field.name
        assert param.kind is param.KEYWORD_ONLY or field.name == "fps"
        assert f"{field.name}" in (function.__doc__ or ""), field.name


def test_errors_carry_a_status_code_enum() -> None:
    for name in client.__all__:
        obj = getattr(client, name)
        if isinstance(obj, type) and issubclass(obj, client.SidecarError):
            assert isinstance(obj.code, grpc.StatusCode), name
    err = _errors.error_for(grpc.StatusCode.DATA_LOSS, "lost")
    assert type(err) is client.ServerError and err.code is grpc.StatusCode.DATA_LOSS
    assert _errors.reason_in([("video-sidecar-error", "LEASE_BUSY")]) is client.Reason.LEASE_BUSY
    assert _errors.reason_in([("video-sidecar-error", "FROM_THE_FUTURE")]) is None


def _client_imports(path: Path) -> set[str]:
    """The client modules `path` imports, anywhere (type-checking imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {name.split(".")[0] for name in names}
    return found


def test_no_import_cycle_in_the_client() -> None:
    graph = {p.stem: _client_imports(p) for p in CLIENT_DIR.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_no_client_module_is_over_400_lines() -> None:
    for path in CLIENT_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


def test_no_client_function_or_class_is_overlong() -> None:
    """Functions of at most 60 lines, classes of at most 250: split by concern."""
    long = []
    for path in CLIENT_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = 250 if isinstance(node, ast.ClassDef) else 60
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (node.end_lineno or first) - first + 1 > limit:
                    long.append(f"{path.name}: {node.name}")
    assert long == []


def test_exception_tree_matches_its_documentation() -> None:
    doc = _errors.__doc__ or ""
    for name in client.__all__:
        obj = getattr(client, name)
        if isinstance(obj, type) and issubclass(obj, client.SidecarError):
            assert name in doc
    assert issubclass(client.InvalidVideo, client.InvalidArgument)
    assert issubclass(client.SidecarUnavailable, client.TransportError)
    assert issubclass(client.SidecarClosed, client.SidecarError)
    guide = (Path(__file__).resolve().parent.parent / "docs" / "client.md").read_text()
    start = guide.index("SidecarError\n├")
    tree = guide[start : guide.index("```", start)]  # the tree the guide draws
    for name in client.__all__:
        obj = getattr(client, name)
        if isinstance(obj, type) and issubclass(obj, client.SidecarError):
            assert name in tree, name


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
    mods = _modules_after("import sidecar.face.server, sidecar.tools.cli, sidecar.tools.demo")
    assert "torch" not in mods
    assert "av" in mods  # sanity: the check sees real imports
