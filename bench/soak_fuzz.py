"""Fuzz soak: a real daemon under a long, bounded mix of hostile and valid gRPC requests.

Measures the daemon's memory while it runs (VmRSS and RssAnon from /proc/PID/status every
few seconds: warm start, end, max, and RssAnon again after `--idle` seconds of rest, alone
and with its encoder processes) and
tallies the answers by status code. Both transports are fuzzed: gRPC, and the framed
socket (its own framing broken, full-size requests refused, messages half sent and left).
An innocent client beside them asks for Status and a framed Release every 50 ms and keeps
its waits. Checks: (a) no UNKNOWN/INTERNAL/DATA_LOSS answer, (b) no file created outside
the output root, (c) every refused lease is still releasable and none is left held, (d)
no shared-memory segment left once the daemon stops, (e) with `--idle`, the daemon's
RssAnon once idle at most `--rss-bound` MiB over its warm start, (f) no innocent request
waited more than `--innocent-bound` seconds. Exits 1 when a check fails.

    python -m bench.soak_fuzz --minutes 10 --seed 1 --idle 60 --out soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.tools.launcher import DaemonProcess

from .memory import tree_rss_anon
from .soak.figures import (
    abandoned_figures,
    by_code,
    figures,
    files_under,
    innocent_figures,
    stop_latencies,
)
from .soak.load import memory, run_load, tally

# As tests/helpers.py starts one; --daemon-opt KEY=VALUE adds or overrides.
DAEMON = {"slabs": 4, "slab_size": "16MiB", "lease_ttl": 30, "max_lease_wait": 5}
DAEMON |= {"shutdown_grace": 10, "log_level": "info"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m bench.soak_fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=0.0)
    p.add_argument("--requests", type=int, default=0, help="default 5000 when no --minutes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="client threads sending at once")
    p.add_argument("--sample-every", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--idle", type=float, default=0.0, metavar="SECONDS", help="rest, then sample")
    p.add_argument("--out", default="", help="write the summary and the samples as JSON")
    p.add_argument("--daemon-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--rss-bound",
        type=float,
        default=30.0,
        metavar="MIB",
        help="(e): RssAnon once idle, at most this over the warm start",
    )
    p.add_argument(
        "--innocent-bound",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="(f): the longest an innocent request may wait",
    )
    p.add_argument(
        "--stop-bound",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="(g): the longest an abandoned encode may run on after its client left",
    )
    args = p.parse_args(argv)
    args.requests = args.requests or (0 if args.minutes else 5000)
    root = Path(tempfile.mkdtemp(prefix="vsd-soak-"))
    cwd, out, prefix = root / "cwd", root / "out", f"vsdsoak{os.getpid()}"
    cwd.mkdir()
    options = {**DAEMON, "output_dir": out, "shm_prefix": prefix}
    options |= dict(o.split("=", 1) for o in args.daemon_opt)
    daemon = DaemonProcess(str(root / "sidecar.sock"), **options)
    try:
        with open(root / "daemon.log", "ab") as log:  # relative paths land in cwd
            daemon.start(output=log, preexec_fn=lambda: os.chdir(cwd))
        return soak(args, daemon, root, prefix)
    finally:
        daemon.kill()
        shutil.rmtree(root, ignore_errors=True)


def soak(args: argparse.Namespace, daemon: DaemonProcess, root: Path, prefix: str) -> int:
    out = root / "out"
    before = files_under(root, out)
    load = run_load(args, daemon, root)
    samples, end = load.samples, load.end
    for f in load.fuzzers:
        f.close()
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        pool = pb_grpc.VideoSidecarStub(channel).Status(pb.StatusRequest(), timeout=10).pool
    time.sleep(args.idle)
    idle = memory(daemon.pid, load.started, load.requests)
    idle_tree = tree_rss_anon(daemon.pid)  # RssAnon MiB of the daemon and its processes
    exit_code = daemon.stop()
    created = sorted(files_under(root, out) - before)
    segments = sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}.*"))
    codes, offending, problems = tally(load.fuzzers)
    if pool.active_leases:
        problems.insert(0, f"(c) {pool.active_leases} leases held after the run")
    checks = {
        "a_no_server_errors": not offending,
        "b_no_files_outside_output": not created,
        "c_refused_leases_releasable": not any(p.startswith("(c)") for p in problems),
        "d_no_segments_left": not segments,
    }
    warm_t = (load.warm_t or [0.0])[0]
    warm = figures("RssAnon", samples, warm_t, end)["warm_median"]
    idle_growth = round(idle["RssAnon"] / 1024 - warm, 1)
    if args.idle:
        checks["e_idle_rss_bounded"] = idle_growth <= args.rss_bound
    abandoned = {k: v for f in load.fuzzers for k, v in f.abandoned_at.items()}
    by_way = stop_latencies((root / "daemon.log").read_text(errors="replace"), abandoned)
    stops = sorted(s for way in by_way.values() for s in way)
    checks["g_abandoned_encodes_stop_within_1s"] = not stops or stops[-1] <= args.stop_bound
    waited = sorted(load.waits)
    checks["f_innocent_not_held_up"] = bool(waited) and waited[-1] <= args.innocent_bound
    summary = {
        "command": " ".join(sys.argv), "seed": args.seed, "workers": args.workers,
        "seconds": round(load.seconds, 1), "requests": load.requests, "daemon_exit": exit_code,
        "by_code": by_code(codes), "by_kind": dict(sorted(codes.items())),
        "checks": checks, "offending": dict(offending.most_common()), "problems": problems[:20],
        "files_created": created[:20], "segments_left": segments, "warm_at_s": load.warm_t[:1],
        **{key: figures(key, samples, warm_t, end) for key in ("VmRSS", "RssAnon")},
        "idle": {"seconds": args.idle, "RssAnon": round(idle["RssAnon"] / 1024, 1),
                 "growth_over_warm": idle_growth, "with_processes": idle_tree}, "end": end,
        "abandoned": abandoned_figures(len(abandoned), by_way),
        "innocent": innocent_figures(waited),
    }  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({**summary, "samples": samples}, indent=2) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
