"""The README and docs/ document every setting and the commands CI relies on."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from sidecar.config import Config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
CONFIGURATION = DOCS["configuration.md"]
CI = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    for f in dataclasses.fields(Config):
        assert Config.flag_name(f.name) in CONFIGURATION, f.name
        env = Config.env_name(f.name)
        short = "_" + env.rsplit("_", 1)[1]  # "VIDEO_SIDECAR_TLS_CERT` / `_KEY"
        assert env in CONFIGURATION or f"/ `{short}`" in CONFIGURATION, env


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```sh\n(python3 -m venv[^\n]+)\n```", README)
    assert len(commands) == 2, "the README shows two commands: the demo and the tests"
    demo, tests = commands
    assert "video-sidecar demo" in demo
    assert tests in CI


def _expanded(pattern: str) -> list[str]:
    """`a-{x,y}.json` as the names it stands for."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [n for part in match[1].split(",") for n in _expanded(head + part + tail)]


def test_every_recorded_result_the_readme_names_exists() -> None:
    root = Path(__file__).resolve().parent.parent
    named = [n for text in (README, *DOCS.values())
             for n in re.findall(r"`(bench/results/[^`\s]+)`", text)]  # fmt: skip
    assert named, "the README and docs point at their recorded results"
    missing = [n for p in named for n in _expanded(p) if not any(root.glob(n))]
    assert not missing, missing


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    assert len(README.splitlines()) <= 250
    for text, base in ((README, ROOT), *((t, ROOT / "docs") for t in DOCS.values())):
        for target in re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", text):
            assert (base / target).exists(), target


def test_the_architecture_table_names_every_module_once() -> None:
    """Each row of docs/architecture.md's module table starts with a path; the names after
    it are its siblings. Together they are every hand-written module of the daemon."""
    named: list[str] = []
    for line in DOCS["architecture.md"].splitlines():
        if not line.startswith("| `sidecar/"):
            continue
        first, *siblings = re.findall(r"`([^`]+)`", line.split(" | ")[0])
        folder = first.rpartition("/")[0]
        named += [first, *(f"{folder}/{name}" for name in siblings)]
    modules = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "sidecar").rglob("*.py")
        if path.name != "__init__.py" and "v1" not in path.parts
    ]
    assert sorted(n for n in named if n.endswith(".py")) == sorted(modules)
