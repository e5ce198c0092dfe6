"""The daemon's rooms, read top-down, are its layers: no module imports one above it, the
tools alone import the client, and the client imports only the generated API and the
shared vocabulary and framing (docs/architecture.md). No module walks in a circle of
imports, type-only ones included."""

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
    ("config",),
    ("pipeline",),
    ("codec",),
    ("pool",),
    ("config_values", "vocabulary", "framing", "errors", "logs", "events", "api", "__init__"),
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
                for alias in node.names:  # `from sidecar import framing` imports a module
                    sub = f"{node.module}.{alias.name}"
                    is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists()
                    found.add(sub if is_module else node.module)
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


def test_the_client_imports_only_the_api_the_vocabulary_and_the_framing() -> None:
    wrong = []
    for path in (ROOT / "client").glob("*.py"):
        for target in imports(path, "client"):
            if target.startswith("sidecar") and not target.startswith(
                ("sidecar.api", "sidecar.vocabulary", "sidecar.framing")
            ):
                wrong.append(f"client.{path.stem} imports {target}")
    assert wrong == []


# -- no circles ----------------------------------------------------------------------------


def project_modules() -> dict[str, Path]:
    """Every hand-written module of the daemon, the client and the bench, by dotted name
    (a package by its own name)."""
    out = {}
    for top in ("sidecar", "client", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if {"api", "v1"} <= set(path.parts):
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the others, anywhere in it: under `TYPE_CHECKING` and
    inside functions too, since a reader following them walks the same circle. `from p
    import m` names the module `p.m` where that is one."""
    known = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else base)
        graph[name] = {target for target in found if target in known and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_walks_in_a_circle_of_imports() -> None:
    assert circles(import_graph()) == []


def test_a_circle_would_be_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    # The graph sees a type-only import: routes names the job only for its annotations.
    assert "sidecar.pipeline.encoding.jobs" in import_graph()["sidecar.pipeline.encoding.routes"]


def test_the_face_asks_the_sidecar_never_its_parts() -> None:
    """`sidecar.leases.free_unused(...)` from the face would tie it to a part: it calls
    `Sidecar`'s own methods, and reads its configuration."""
    wrong = []
    for path in (ROOT / "sidecar" / "face").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
                continue
            owner = node.value.value
            named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if named == "sidecar" and node.value.attr != "config":
                wrong.append(f"{path.name}:{node.lineno} sidecar.{node.value.attr}.{node.attr}")
    assert wrong == []
