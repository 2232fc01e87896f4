#!/usr/bin/env python3
"""One PutTensors of several tensors against one of a single tensor of the same bytes.

A payload of several tensors travels in parts (UCX's iov datatype): sent from each tensor's
own storage and received into each new tensor's storage, with no staging copy on either side
(docs/node.md "Threads"). This script puts, through ``genie._C.Client`` to a real genie-node
on loopback, ``--parts`` tensors of ``--mib / --parts`` MiB each in one request, and one tensor
of ``--mib`` MiB in one request, alternated ``--rounds`` times, each put's handles freed before
the next; bandwidth = payload bytes / the put's wall time (request to Ack), GB/s = 10^9 B/s.

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_upload_parts.py --mib 64 --parts 4 --rounds 20
    UCX_NET_DEVICES=lo UCX_TLS=sm .venv/bin/python perf/bench_upload_parts.py
"""
from __future__ import annotations

import argparse
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
    import genie._C as _C  # installed (pip install -e .)
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import genie._C as _C


def put_seconds(client, tensors: list[torch.Tensor]) -> float:
    handles = [os.urandom(16) for _ in tensors]
    start = time.perf_counter()
    client.put([(handle, tensor, 0) for handle, tensor in zip(handles, tensors)])
    seconds = time.perf_counter() - start
    client.free(handles, wait=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--node", default=str(ROOT / "build" / "bin" / "genie-node"), help="genie-node binary")
    parser.add_argument("--mib", type=int, default=64, help="payload MiB per put (default: %(default)s)")
    parser.add_argument("--parts", type=int, default=4, help="tensors in the multi-tensor put (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=20, help="alternated rounds (default: %(default)s)")
    args = parser.parse_args()

    node = subprocess.Popen([args.node, "--listen", "127.0.0.1:0", "--log-level", "error"], stdout=subprocess.PIPE,
                            text=True)
    try:
        match = re.match(r"genie-node listening on (\S+):(\d+)", node.stdout.readline())
        if not match:
            raise RuntimeError("genie-node did not start")
        client = _C.Client(match.group(1), int(match.group(2)))
        payload = args.mib << 20
        cases = {f"1 x {args.mib} MiB": [torch.rand(payload // 4)],
                 f"{args.parts} x {args.mib // args.parts} MiB": [torch.rand(payload // 4 // args.parts)
                                                                   for _ in range(args.parts)]}
        for tensors in cases.values():  # warm-up: the node's allocations, the connection's buffers
            put_seconds(client, tensors)
        seconds = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, tensors in cases.items():
                seconds[name].append(put_seconds(client, tensors))
        best = {}
        for name, values in seconds.items():
            rates = sorted(payload / s / 1e9 for s in values)
            best[name] = rates[-1]
            print(f"{name:>14}: best {rates[-1]:.2f} GB/s, median {statistics.median(rates):.2f}, "
                  f"worst {rates[0]:.2f} ({args.rounds} puts)")
        single, multi = best.values()
        print(f"several / one (best): {multi / single:.2f}; UCX_TLS={os.environ.get('UCX_TLS', 'default')}")
        client.close()
    finally:
        node.terminate()
        node.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
