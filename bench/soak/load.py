"""The fuzz soak's load: its clients, an innocent one beside them, the daemon's memory."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.tools.launcher import DaemonProcess

from .fuzzer import Fuzzer
from .wire import Framed

INNOCENT_EVERY_S = 0.05


def innocent(socket_path: str, stop: Any, answers: Any) -> None:
    """A client with nothing to do with the hostile ones, every `INNOCENT_EVERY_S`: a
    Status and a framed Release. Its waits are the others' doing; they go to `answers`."""
    waits: list[float] = []
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub, framed = pb_grpc.VideoSidecarStub(channel), Framed(f"{socket_path}.framed")
        token = stub.Attach(pb.AttachRequest(client_name="innocent")).client_token
        release = pb.FramedRequest(release=pb.ReleaseRequest(client_token=token, tag="t"))
        data = framing.pack(release)
        framed.ask(data, 30)  # connected
        while not stop.wait(INNOCENT_EVERY_S):
            try:
                t = time.monotonic()
                stub.Status(pb.StatusRequest(), timeout=30)
                waits.append(time.monotonic() - t)
                t = time.monotonic()
                framed.ask(data, 30)
                waits.append(time.monotonic() - t)
            except grpc.RpcError:
                break  # the daemon is gone
        framed.close()
    answers.put(waits)


def memory(pid: int, t0: float, requests: int) -> dict[str, Any]:
    """Resident memory (KiB: VmRSS = RssAnon + RssFile + RssShmem), threads and open fds."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    out = {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    out |= {"threads": int(fields["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    return {"t": round(time.monotonic() - t0, 1), "n": requests, **out}


@dataclass
class Load:
    """What the load left: its clients with their tallies, the daemon's memory samples, and
    the innocent client's waits."""

    fuzzers: list[Fuzzer]
    started: float  # on the monotonic clock, as the samples' times count from
    samples: list[dict[str, Any]]
    warm_t: list[float]  # when the daemon counts as warm, once it does
    requests: int
    seconds: float
    end: dict[str, Any]  # the memory sample as the load ended
    waits: list[float]


def run_load(args: argparse.Namespace, daemon: DaemonProcess, root: Path) -> Load:
    """The fuzzing clients' requests until `--minutes` or `--requests`, with the daemon's
    memory sampled meanwhile and an innocent client beside them."""
    samples: list[dict[str, Any]] = []
    warm_t: list[float] = []
    done, t0, finished, lock = [0], time.monotonic(), threading.Event(), threading.Lock()

    def progress() -> float:
        elapsed = time.monotonic() - t0
        return max(elapsed / (args.minutes * 60 or 1e99), done[0] / (args.requests or 1e99))

    def sample() -> None:
        while daemon.running():
            samples.append(memory(daemon.pid, t0, done[0]))
            if not warm_t and (progress() >= 0.1 or samples[-1]["t"] >= 60):
                warm_t.append(samples[-1]["t"])
            if finished.wait(args.sample_every):
                return

    def work(f: Fuzzer) -> None:
        while progress() < 1.0 and daemon.running():
            f.run_one()
            with lock:
                done[0] += 1

    # In a process of its own: the fuzzing clients' Python (building requests, random
    # bytes) would otherwise hold up its timing through their shared GIL.
    spawn = multiprocessing.get_context("spawn")
    stop, answers = spawn.Event(), spawn.Queue()
    bystander = spawn.Process(target=innocent, args=(daemon.socket, stop, answers), daemon=True)
    bystander.start()

    seeds = [args.seed * 1000 + n for n in range(args.workers)]
    fuzzers = [Fuzzer(daemon.socket, root / "cwd", seed) for seed in seeds]
    threads = [threading.Thread(target=work, args=(f,)) for f in fuzzers]
    for th in [*threads, threading.Thread(target=sample, daemon=True)]:
        th.start()
    for th in threads:
        th.join()
    finished.set()
    stop.set()
    waits: list[float] = (
        answers.get(timeout=60) if bystander.is_alive() or not answers.empty() else []
    )
    bystander.join(30)
    seconds, end = time.monotonic() - t0, memory(daemon.pid, t0, done[0])
    return Load(fuzzers, t0, samples, warm_t, done[0], seconds, end, waits)


def tally(fuzzers: list[Fuzzer]) -> tuple[Counter[str], Counter[str], list[str]]:
    """Every client's answers by kind, the offending ones, and the problems seen."""
    codes, offending, problems = Counter[str](), Counter[str](), []
    for f in fuzzers:
        codes.update(f.codes)
        offending.update(f.offending)
        problems += f.problems
    return codes, offending, problems
