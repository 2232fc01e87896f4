#!/usr/bin/env python3
"""A one-op round trip back to back and after idleness: what a request pays for sleeping threads.

A decode loop records its next step for milliseconds before it sends, so each step's request
finds the node idle. This script times the request ``(x + 1).item()`` (one RunGraph whose
result comes back) on a real genie-node, from Python:

- back to back: ``--n`` requests, one after another;
- after the client slept: ``--n`` requests, each after ``--idle-ms`` of ``time.sleep`` (the
  client's threads and the node's may all sleep meanwhile);
- after the client was busy: each after ``--idle-ms`` of the client's thread spinning in
  Python, as a client recording its next step is busy while the node idles.

The same op on local CPU tensors, back to back and after the same waits, is timed in each
round too: what waking up costs the machine itself (caches, CPU frequency and idle states, a
virtual CPU descheduled while idle), which no remote path can do better than. The node runs
on CPU 0 and this script on CPU 1 (``--no-pin``: wherever the scheduler puts them).

Both against two nodes started by the script, alternated ``--rounds`` times in the same run:
``--idle-poll-us 0`` (a session thread polls 200 µs after each request, then sleeps) and the
node's default (it goes on polling for up to twice the last gap, capped by --idle-poll-us;
docs/node.md "Threads"). Medians per round; the JSON holds every sample's median and p90.

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_idle.py --rounds 3
    UCX_NET_DEVICES=lo UCX_TLS=sm .venv/bin/python perf/bench_idle.py --json /tmp/idle.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
try:
    import genie  # installed (pip install -e ., or tools/gpu-check.sh's build-gpu/site)
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import genie


def start_node(binary: str, extra: list[str], cpu: int | None = None) -> tuple[subprocess.Popen, str]:
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--log-level", "warn", *extra],
                               stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    line = process.stdout.readline()
    match = re.match(r"genie-node listening on (\S+:\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"genie-node did not start: {line!r}")
    return process, match.group(1)


def spin(seconds: float) -> None:
    """The calling thread stays busy (and its CPU awake) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


WAITS = {"back to back": None, "client slept": time.sleep, "client busy": spin}


def round_trips(n: int, idle_s: float, wait=None, device: str = "remote_accelerator:0") -> list[float]:
    x = torch.ones(1, device=device)
    for _ in range(20):  # warm: the graph is registered, the connection's buffers exist
        (x + 1).item()
    times = []
    for _ in range(n):
        if wait is not None:
            wait(idle_s)
        start = time.perf_counter()
        (x + 1).item()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_us": statistics.median(ordered) * 1e6, "p90_us": ordered[int(0.9 * (len(ordered) - 1))] * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--node", default=str(ROOT / "build" / "bin" / "genie-node"), help="genie-node binary")
    parser.add_argument("--n", type=int, default=200, help="requests per measurement (default: %(default)s)")
    parser.add_argument("--idle-ms", type=float, default=5.0, help="sleep before each idle request (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of both nodes (default: %(default)s)")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the node to CPU 0 and this script to CPU 1")
    args = parser.parse_args()
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {1})

    configs = {"poll 200 µs (--idle-poll-us 0)": ["--idle-poll-us", "0"], "adaptive (default)": []}
    results = []

    def measure(round_index: int, name: str, device: str) -> None:
        row = {"round": round_index + 1, "node": name}
        for wait_name, wait in WAITS.items():
            row[wait_name] = summary(round_trips(args.n, args.idle_ms / 1e3, wait, device))
        hot = row["back to back"]["median_us"]
        results.append(row)
        print(f"round {round_index + 1} {name:30s} back to back {hot:6.1f} µs   after {args.idle_ms:g} ms: "
              + "   ".join(f"{w} {row[w]['median_us']:6.1f} µs ({row[w]['median_us'] / hot:.2f}x)"
                         for w in list(WAITS)[1:]), flush=True)

    for round_index in range(args.rounds):
        for name, extra in configs.items():
            process, address = start_node(args.node, extra, 0 if pin else None)
            try:
                genie.init(server=address)
                measure(round_index, name, "remote_accelerator:0")
            finally:
                genie.shutdown()
                process.terminate()
                process.wait(timeout=10)
        measure(round_index, "local CPU op (no node)", "cpu")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        args.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "command": " ".join(sys.argv), "idle_ms": args.idle_ms, "n": args.n, "pinned": pin, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
