#!/usr/bin/env python3
"""A one-op round trip back to back and after idleness: what a request pays for sleeping threads.

A decode loop records its next step for milliseconds before it sends, so each step's request
finds the node idle. This script times the request ``(x + 1).item()`` (one RunGraph whose
result comes back) on a real genie-node, from Python:

- back to back: ``--n`` requests, one after another;
- after idleness: ``--n`` requests, each after ``--idle-ms`` of ``time.sleep`` (the client's
  threads and the node's may sleep meanwhile).

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


def start_node(binary: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--log-level", "warn", *extra],
                               stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    match = re.match(r"genie-node listening on (\S+:\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"genie-node did not start: {line!r}")
    return process, match.group(1)


def round_trips(n: int, idle_s: float) -> list[float]:
    x = torch.ones(1, device="remote_accelerator:0")
    for _ in range(20):  # warm: the graph is registered, the connection's buffers exist
        (x + 1).item()
    times = []
    for _ in range(n):
        if idle_s:
            time.sleep(idle_s)
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
    args = parser.parse_args()

    configs = {"poll 200 µs (--idle-poll-us 0)": ["--idle-poll-us", "0"], "adaptive (default)": []}
    results = []
    for round_index in range(args.rounds):
        for name, extra in configs.items():
            process, address = start_node(args.node, extra)
            try:
                genie.init(server=address)
                hot = summary(round_trips(args.n, 0.0))
                cold = summary(round_trips(args.n, args.idle_ms / 1e3))
            finally:
                genie.shutdown()
                process.terminate()
                process.wait(timeout=10)
            row = {"round": round_index + 1, "node": name, "back_to_back": hot, "after_idle": cold,
                   "ratio": cold["median_us"] / hot["median_us"]}
            results.append(row)
            print(f"round {round_index + 1} {name:32s} back to back {hot['median_us']:7.1f} µs   "
                  f"after {args.idle_ms:g} ms idle {cold['median_us']:7.1f} µs (p90 {cold['p90_us']:7.1f})   "
                  f"ratio {row['ratio']:.2f}", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        args.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "command": " ".join(sys.argv), "idle_ms": args.idle_ms, "n": args.n, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
