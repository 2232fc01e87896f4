#!/usr/bin/env python3
"""Capture against eager, op for op, on the ops of a GPT-2 decode step; and Genie's client time per step.

Part 1, per op. One decode-step forward of GPT-2 124M (random weights, a KV cache of the prompt)
runs on the CPU under a dispatch mode that notes every aten call (op, arguments). Then each
noted call is timed twice in one process, alternated in batches: eager (the call on the CPU
tensors) and captured (the same call on LazyTensors of the same shapes: recorded by Genie, not
run; the pending graph is dropped between batches). Both sides call the OpOverload from Python
under no_grad, so both pay the same Python and dispatcher entry; the figure is the median over
the step's ops of captured / eager µs per call (target <= 1.1x).

Part 2, per step. `generate` runs on remote_accelerator:0 with the recorder's kernel timed
(`genie._C.set_recorder_timing`): Genie's own client time per decode step = the time spent in
the PrivateUse1 kernel (recording; reads, which the device runtime in C++ answers inside the
kernel: the cut's passes, the request, commit; Python's paths of uploads), minus the time spent
waiting for the node's replies (`genie._C.runtime_counters` wait_ns, and Python's requests);
the model's own Python is not counted (target <= 1.5 ms). Beside it: the client process's CPU
time per step (`time.process_time`, every thread, the model's Python included) and the calls
the C++ runtime made into its Python policy.

    .venv/bin/python perf/bench_capture.py [--repeat 200] [--tokens 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import subprocess
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import genie
from genie import _C
from genie.demo.measure import machine
from genie.runtime import Runtime, runtime_for

DEV = "remote_accelerator:0"


class _NoteCalls(TorchDispatchMode):
    """Notes every aten call (func, args, kwargs) and runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def decode_step_calls(model, prompt):
    """The aten calls of one decode-step forward (after a prefill), with their CPU arguments."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        mode = _NoteCalls()
        with mode:
            model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
    return mode.calls


def to_lazy(calls):
    """The calls with every CPU tensor argument uploaded once (0-dim CPU tensors stay: constants),
    and device arguments pointing at the remote device."""
    uploaded = {}

    def convert(a):
        if isinstance(a, torch.Tensor):
            if a.dim() == 0 and not a.requires_grad:
                return a
            if id(a) not in uploaded:
                uploaded[id(a)] = a.detach().clone().to(DEV)
            return uploaded[id(a)]
        if isinstance(a, torch.device):
            return torch.device(DEV)
        return a

    return [(f, tree_map(convert, args), tree_map(convert, kwargs)) for f, args, kwargs in calls]


def time_call(func, args, kwargs, repeat: int) -> float:
    """µs per call over `repeat` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        func(*args, **kwargs)
    return (time.perf_counter() - start) / repeat * 1e6


def per_op(calls, lazy_calls, repeat: int, rounds: int, recording) -> list[dict]:
    rows = []
    with torch.no_grad():
        for (func, args, kwargs), (_, largs, lkwargs) in zip(calls, lazy_calls):
            func(*largs, **lkwargs)  # plans the shapes (the cache a repeated step hits)
            eager, captured = [], []
            for _ in range(rounds):
                eager.append(time_call(func, args, kwargs, repeat))
                captured.append(time_call(func, largs, lkwargs, repeat))
                recording.discard_pending()  # capture only: nothing runs on the node
                recording.drain_dead()
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            rows.append({"op": str(func), "shapes": shapes, "eager_us": statistics.median(eager),
                         "capture_us": statistics.median(captured)})
            rows[-1]["ratio"] = rows[-1]["capture_us"] / rows[-1]["eager_us"]
    return rows


def client_time_per_step(model, prompt, tokens: int) -> dict:
    """Genie's own client time per decode step of `generate` on the device (see the docstring),
    and the client process's CPU time per step beside it (every thread; the model's and
    HuggingFace's Python included)."""
    from genie.demo.models import StepRecorder, gpt2_generate
    request = Runtime._request
    waiting = [0]  # Python's requests (uploads); the C++ runtime counts its own waits

    def timed_request(self, method, *args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return request(self, method, *args, **kwargs)
        finally:
            waiting[0] += time.perf_counter_ns() - start

    device_model = model.to(DEV)
    # Warm-up: the timed generation's every step (its recorder's ops included), so that its plans,
    # graphs and first-cut analyses are made before the timing.
    gpt2_generate(device_model, prompt, DEV, tokens, StepRecorder())
    recorder = StepRecorder()
    Runtime._request = timed_request
    _C.set_recorder_timing(True)
    before, ops_before, waited_before = _C.recorder_counters(), genie.client_stats(), waiting[0]
    # The C++ runtime's own waits (a frontend without it, run by perf/ab_frontends.py: none).
    counters = getattr(_C, "runtime_counters", lambda: {"wait_ns": 0, "policy_calls": 0})
    runtime_before, cpu_before = counters(), time.process_time()
    try:
        gpt2_generate(device_model, prompt, DEV, tokens, recorder)
        cpu = time.process_time() - cpu_before
        after, ops_after, runtime_after = _C.recorder_counters(), genie.client_stats(), counters()
        waited = waiting[0] - waited_before + runtime_after["wait_ns"] - runtime_before["wait_ns"]
    finally:
        _C.set_recorder_timing(False)
        Runtime._request = request
    steps = tokens  # the prefill counts as one step too: per step over all of them
    kernel_ms = (after["kernel_ns"] - before["kernel_ns"] - waited) / steps / 1e6
    ops = (ops_after["ops_recorded_cpp"] + ops_after["ops_handled_python"]
           - ops_before["ops_recorded_cpp"] - ops_before["ops_handled_python"]) / steps
    return {"tokens": tokens, "client_ms_per_step": kernel_ms, "process_cpu_ms_per_step": cpu / steps * 1e3,
            "wait_ms_per_step": waited / steps / 1e6, "ops_per_step": ops,
            "policy_calls_per_step": (runtime_after["policy_calls"] - runtime_before["policy_calls"]) / steps,
            "step_ms_median": statistics.median(recorder.step_seconds()) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200, help="calls per timed batch (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternated (eager, captured) batches per op")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated for part 2 (default %(default)s)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    from genie.demo.models import load_gpt2
    workload = load_gpt2()
    model, prompt = workload.model, workload.prompt
    recording = runtime_for(torch.device(DEV)).recording

    calls = decode_step_calls(model, prompt)
    rows = per_op(calls, to_lazy(calls), args.repeat, args.rounds, recording)
    ratios = [r["ratio"] for r in rows]
    by_op = collections.defaultdict(list)
    for r in rows:
        by_op[r["op"]].append(r["ratio"])
    step = client_time_per_step(model, prompt, args.tokens)

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    result = {
        "benchmark": "capture vs eager per op (the ops of a GPT-2 124M decode step) and Genie's client time per step",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": machine(),
        "command": f"perf/bench_capture.py --repeat {args.repeat} --rounds {args.rounds} --tokens {args.tokens}",
        "ops_in_step": len(rows),
        "median_ratio": statistics.median(ratios),
        "median_eager_us": statistics.median(r["eager_us"] for r in rows),
        "median_capture_us": statistics.median(r["capture_us"] for r in rows),
        "ratio_target": 1.1,
        "per_op_kind": {op: {"calls": len(v), "median_ratio": statistics.median(v)} for op, v in sorted(by_op.items())},
        "step": step,
        "client_ms_target": 1.5,
        "ops": rows,
    }
    print(f"{'op':<44} {'calls':>5} {'captured/eager':>15}")
    for op, v in sorted(by_op.items(), key=lambda kv: -len(kv[1])):
        print(f"{op:<44} {len(v):>5} {statistics.median(v):>14.2f}x")
    print(f"ops in the decode step: {len(rows)}; median captured/eager: {result['median_ratio']:.2f}x "
          f"(eager {result['median_eager_us']:.2f} µs, captured {result['median_capture_us']:.2f} µs; target <= 1.1x)")
    print(f"client time per decode step: {step['client_ms_per_step']:.2f} ms (target <= 1.5 ms; the process's CPU "
          f"{step['process_cpu_ms_per_step']:.1f} ms per step; {step['ops_per_step']:.0f} ops; waiting for the node "
          f"{step['wait_ms_per_step']:.1f} ms; {step['policy_calls_per_step']:.2f} calls into the Python policy; "
          f"step {step['step_ms_median']:.1f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
