"""Client trees side by side: eight clients of one worker process, back to back and in waves.

    python -m bench.client_ab --device cuda --clients . /tmp/base [--rounds 4]
                              [--shape 448x256x4] [--json FILE]

A change in the client (how it converts, copies, takes the GIL) shows most where a
worker runs many clients on threads. Each `--clients` entry is a directory holding a
`client/` package: "." for this tree, another commit's through
`git worktree add /tmp/base REV`. Its `client/` is copied apart and put first on the
path of a fresh worker process, which runs `bench.cold`'s burst (eight clients, a wave
after 1 s idle, `--waves - 1` later waves, 20 back-to-back requests each, then as many
warm waves) against a fresh daemon of this tree. Rounds alternate the trees, so that
each sees the same machine; the daemon and the frames are the same for all.

Per tree and round: the first wave's median, the later waves' median, the steady
8-client median, the warm waves' median, and the `copy` stage's median in the steady
requests and in the second wave (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import write_run
from .daemons import daemon

HERE = Path(__file__).resolve().parent.parent


def _client_copy(tree: str, into: Path) -> Path:
    """`tree`'s client package, copied into a folder of its own: put first on a path, it
    shadows this tree's `client` while `bench` and the proto come from this tree."""
    source = Path(tree).resolve() / "client"
    if not (source / "__init__.py").is_file():
        raise SystemExit(f"{tree}: no client/ package there")
    home = into / f"tree{len(list(into.iterdir()))}"
    shutil.copytree(source, home / "client", ignore=shutil.ignore_patterns("__pycache__"))
    return home


def burst(home: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One run of the burst with the client at `home`, on a fresh daemon."""
    path = os.pathsep.join([str(home), str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)}
    with daemon() as process:
        command = [sys.executable, "-m", "bench.cold", "--role", "burst", "--socket",
                   process.socket, "--device", args.device, "--shape", args.shape,
                   "--idle", "1", "--waves", str(args.waves)]  # fmt: skip
        # Not from this tree's folder: the working directory would come first on the path.
        out = subprocess.run(
            command, check=False, capture_output=True, text=True, env=env, cwd=scratch
        )
    if out.returncode != 0:
        raise SystemExit(f"the burst failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def row(tree: str, rnd: int, home: Path, result: dict[str, Any]) -> dict[str, Any]:
    used = Path(result.get("client", "")).resolve()
    if used != (home / "client").resolve():
        raise SystemExit(f"{tree}: the worker imported the client at {used}, not the tree's")
    waves, stages = result["waves_ms"], result["stages_ms"]
    return {
        "tree": tree,
        "round": rnd,
        "first_wave_ms": round(waves[0], 2),
        "later_waves_ms": round(statistics.median(waves[1:] or waves), 2),
        "steady_ms": round(result["steady_ms"], 2),
        "warm_waves_ms": round(statistics.median(result["warm_waves_ms"]), 2),
        "copy_steady_ms": stages[len(waves)].get("copy_ms", 0.0),
        "copy_wave_ms": stages[min(1, len(waves) - 1)].get("copy_ms", 0.0),
    }


def table(rows: list[dict[str, Any]]) -> str:
    keys = ["steady_ms", "later_waves_ms", "first_wave_ms", "warm_waves_ms",
            "copy_steady_ms", "copy_wave_ms"]  # fmt: skip
    lines = ["| tree | " + " | ".join(k.removesuffix("_ms") for k in keys) + " |",
             "| --- |" + " ---: |" * len(keys)]  # fmt: skip
    for tree in dict.fromkeys(r["tree"] for r in rows):
        mine = [r for r in rows if r["tree"] == tree]
        cells = [f"{min(r[k] for r in mine):.1f}-{max(r[k] for r in mine):.1f}" for k in keys]
        lines.append(f"| {tree} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.client_ab", description=__doc__.split("\n")[0]
    )
    p.add_argument("--clients", nargs="+", required=True, help="trees holding a client/")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--shape", default="448x256x4")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--waves", type=int, default=4, help="waves after idle, and warm waves")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vs-ab-") as tmp:
        trees, scratch = Path(tmp) / "trees", Path(tmp) / "cwd"
        trees.mkdir()
        scratch.mkdir()
        homes = [_client_copy(tree, trees) for tree in args.clients]
        labels = [f"{i}:{tree}" for i, tree in enumerate(args.clients)]
        for rnd in range(args.rounds):
            for label, home in zip(labels, homes, strict=True):
                rows.append(row(label, rnd, home, burst(home, args, scratch)))
                print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        write_run(args.json, "bench.client_ab", argv or sys.argv[1:], args.device, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
