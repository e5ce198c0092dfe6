"""The daemon's rooms, read top-down, are its layers: no module imports one above it, the
tools alone import the client, and the client imports only the generated API and the
shared vocabulary (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Highest first. A module may import its own layer and the ones below it.
LAYERS = [
    ("__main__",),
    ("tools",),
    ("face",),
    ("service",),
    ("config", "pool_sizing"),
    ("pipeline",),
    ("codec",),
    ("pool",),
    ("config_values", "vocabulary", "errors", "logs", "events", "api", "__init__"),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def layer(module: str) -> int:
    """The rank of `sidecar.X...` by its room (or base module)."""
    parts = module.split(".")
    assert parts[0] == "sidecar", module
    room = parts[1] if len(parts) > 1 else "__init__"
    return RANK.get(room, RANK["__init__"])  # else a name the package itself holds


def imports(path: Path, package: str) -> set[str]:
    """The absolute modules `path` (in `package`) imports, relative ones resolved."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if node.module is None:  # from . import x: x is a module
                    found.update(f"{module}.{alias.name}" for alias in node.names)
                    continue
                found.add(module)
            elif node.module:
                found.add(node.module)
    return found


def sidecar_modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "sidecar").rglob("*.py"):
        if "api" in path.parts:
            continue
        rel = path.relative_to(ROOT).with_suffix("")
        out[".".join(rel.parts)] = path
    return out


def test_no_module_imports_a_layer_above_it() -> None:
    wrong = []
    for name, path in sidecar_modules().items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        own = layer(name.removesuffix(".__init__"))
        for target in imports(path, package):
            if target.startswith("sidecar.") and layer(target) < own:
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_only_the_tools_import_the_client_and_nothing_imports_the_bench() -> None:
    wrong = []
    for name, path in sidecar_modules().items():
        package = name.rsplit(".", 1)[0]
        for target in imports(path, package):
            if target.split(".")[0] == "bench":
                wrong.append(f"{name} imports {target}")
            if target.split(".")[0] == "client" and not name.startswith("sidecar.tools."):
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_the_client_imports_only_the_api_and_the_vocabulary() -> None:
    wrong = []
    for path in (ROOT / "client").glob("*.py"):
        for target in imports(path, "client"):
            if target.startswith("sidecar") and not target.startswith(
                ("sidecar.api", "sidecar.vocabulary")
            ):
                wrong.append(f"client.{path.stem} imports {target}")
    assert wrong == []
