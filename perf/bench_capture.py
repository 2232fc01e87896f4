#!/usr/bin/env python3
"""Capture overhead: microseconds per recorded op, LazyTensor vs a do-nothing dispatch subclass.

For each op in a fixed set (elementwise, matmul, views, reductions, normalization, attention),
the same call is timed on
  - `LazyTensor` (genie): interception, shape inference (cached after the first call), recording;
  - `NopTensor`: a wrapper subclass whose `__torch_dispatch__` only makes an output wrapper of
    the right shape: the cost of reaching Python dispatch at all, which every subclass pays.
The figure of merit is the median over ops of (LazyTensor - NopTensor) µs per op (target
<= 10 µs, issue 4). Capture only: the pending graph is dropped between batches, nothing runs
on the node (the embedded node is started for the uploads of the inputs only).

    .venv/bin/python perf/bench_capture.py [--repeat 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import genie

DEV = "remote_accelerator:0"


class NopTensor(torch.Tensor):
    """Does nothing but return fresh wrappers shaped like the op's outputs on CPU (looked up in
    `OUTPUTS`): what any dispatch subclass pays (reaching Python, making output tensors)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, like: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, strides=like.stride(), dtype=like.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = OUTPUTS[func]
        if isinstance(out, torch.Tensor):
            return NopTensor(out)
        return tree_map(lambda t: NopTensor(t) if isinstance(t, torch.Tensor) else t, out)


OUTPUTS: dict = {}


class _RecordOutputs(TorchDispatchMode):
    """Notes each op's CPU outputs, for NopTensor to imitate."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        OUTPUTS[func] = out
        return out


def cases():
    """(name, fn(a, b, c) -> output, input shapes)."""
    return [
        ("add", lambda a, b, c: a + b, [(64, 64), (64, 64)]),
        ("mul_scalar", lambda a, b, c: a * 0.5, [(64, 64)]),
        ("mm", lambda a, b, c: a @ b, [(64, 64), (64, 64)]),
        ("view", lambda a, b, c: a.view(32, 128), [(64, 64)]),
        ("transpose", lambda a, b, c: a.transpose(0, 1), [(64, 64)]),
        ("relu", lambda a, b, c: torch.relu(a), [(64, 64)]),
        ("sum_dim", lambda a, b, c: a.sum(-1), [(64, 64)]),
        ("softmax", lambda a, b, c: torch.softmax(a, -1), [(64, 64)]),
        ("cat", lambda a, b, c: torch.cat([a, b], 0), [(64, 64), (64, 64)]),
        ("addmm", lambda a, b, c: torch.addmm(c, a, b), [(64, 64), (64, 64), (64,)]),
        ("layer_norm", lambda a, b, c: F.layer_norm(a, (64,)), [(64, 64)]),
        ("sdpa", lambda a, b, c: F.scaled_dot_product_attention(a, b, c),
         [(1, 4, 16, 32), (1, 4, 16, 32), (1, 4, 16, 32)]),
    ]


def time_per_call(fn, args, repeat: int, after_batch=None) -> float:
    """Median over 5 batches of µs per call."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn(*args)
        samples.append((time.perf_counter() - start) / repeat * 1e6)
        if after_batch:
            after_batch()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2000, help="calls per batch")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    runtime = genie.runtime.runtime_for(torch.device(DEV))
    runtime.max_pending = 10 ** 9  # capture only: the batch is dropped below, never run

    def drop_pending():
        runtime.pending.clear()

    rows = []
    for name, fn, shapes in cases():
        cpu = [torch.randn(s) for s in shapes] + [None] * (3 - len(shapes))
        lazy = [t.to(DEV) if t is not None else None for t in cpu]
        with _RecordOutputs():
            fn(*cpu)
        nop = [NopTensor(t) if t is not None else None for t in cpu]
        with torch.no_grad():
            fn(*lazy)  # warm the shape cache
            lazy_us = time_per_call(fn, lazy, args.repeat, drop_pending)
            nop_us = time_per_call(fn, nop, args.repeat)
        rows.append({"op": name, "lazy_us": lazy_us, "nop_us": nop_us, "overhead_us": lazy_us - nop_us})
        drop_pending()

    overheads = [r["overhead_us"] for r in rows]
    result = {
        "benchmark": "capture overhead per recorded op (LazyTensor - do-nothing dispatch subclass)",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}",
        "command": "perf/bench_capture.py --repeat %d" % args.repeat,
        "ops": rows,
        "median_overhead_us": statistics.median(overheads),
        "target_us": 10.0,
    }
    print(f"{'op':<12} {'LazyTensor µs':>14} {'do-nothing µs':>14} {'overhead µs':>12}")
    for r in rows:
        print(f"{r['op']:<12} {r['lazy_us']:>14.2f} {r['nop_us']:>14.2f} {r['overhead_us']:>12.2f}")
    print(f"median overhead: {result['median_overhead_us']:.2f} µs per op (target <= 10 µs)")
    print(result["machine"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
