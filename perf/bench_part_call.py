#!/usr/bin/env python3
"""The client CPU of recording a compiled part's call: the capture's direct call against the dispatcher.

A compiled GPT-2 decode step records one `genie::call_graph` op whose inputs are every weight and
KV-cache tensor of the model (185 for 12 layers). genie.compile records it straight from the
part's arguments (`genie._C.PartCall`); PyTorch's dispatcher path (`torch.ops.genie.call_graph`:
argument parsing, the autograd fallback, the recorder's plan key and cache over every input) is
what it falls back to when the direct call declines the arguments. This script times both on
the same model, in one process: each round decodes ``--tokens`` tokens with a StaticCache once
by each path (alternated; the order flips every round), and reports per path the medians over
the decode steps of
- ``record_us``: the calling thread's CPU in the part's call (genie.compile's ExecutorPart),
- ``read_us``: the calling thread's CPU in reading the step's token (genie.runtime's fetch: the
  cut, the request, waiting for the reply),
- ``step_cpu_ms``: the process's CPU per decode step (``time.process_time``: every thread, the
  model's and HuggingFace's Python and Dynamo included),
and checks that both paths generate the same ids and which path recorded each call (the part's
``dispatched`` count, genie.compile_stats()). The node is the embedded CPU node; the packages are
not waited for (the client's side is the same whichever engine runs the part).

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_part_call.py
    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_part_call.py --embd 64 --heads 4 --rounds 5   # a small node step
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

DEV = "remote_accelerator:0"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12, help="GPT-2 layers (default: 12, GPT-2 124M)")
    parser.add_argument("--embd", type=int, default=768, help="hidden size (default: 768)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per decode (default: 32)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (default: 3)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    return parser.parse_args(argv)


class _Declines:
    """A PartCall stand-in that declines every call: the part then records through the dispatcher."""

    @staticmethod
    def call(args):
        return NotImplemented


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import genie
    from transformers import GPT2Config, GPT2LMHeadModel
    from genie import runtime
    from genie.demo import models
    from genie.compile import compiler
    from bench_compile import gpt2_decode

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads)
    model = GPT2LMHeadModel(config).eval().to(DEV)
    prompt = torch.tensor([models.PROMPT_IDS[:10]])  # genie.demo's GPT-2 prompt, its first 10 tokens
    compiled = torch.compile(model, backend="genie", dynamic=False)

    path = ["direct"]
    record_s: list[float] = []
    direct_calls: dict[int, object] = {}  # id(capture) -> its PartCall
    forward = compiler.ExecutorPart.forward

    def timed_forward(self, *a):
        for capture in self.captures.values():
            direct_calls.setdefault(id(capture), capture.call)
            capture.call = direct_calls[id(capture)] if path[0] == "direct" else _Declines
        start = time.thread_time()
        try:
            return forward(self, *a)
        finally:
            record_s.append(time.thread_time() - start)

    compiler.ExecutorPart.forward = timed_forward
    read_s: list[float] = []
    fetch = runtime.Runtime.fetch

    def timed_fetch(self, tensor):
        start = time.thread_time()
        try:
            return fetch(self, tensor)
        finally:
            read_s.append(time.thread_time() - start)

    runtime.Runtime.fetch = timed_fetch

    def dispatched() -> int:
        return sum(p["dispatched"] for g in genie.compile_stats()["graphs"] for p in g["parts"])

    for _ in range(2):  # compile, capture, register; warm both paths
        for p in ("direct", "dispatcher"):
            path[0] = p
            gpt2_decode(model, compiled, DEV, prompt, args.tokens)
    results = {p: {"record_s": [], "read_s": [], "step_cpu_s": [], "dispatched": 0} for p in ("direct", "dispatcher")}
    ids = {}
    for r in range(args.rounds):
        for p in (("direct", "dispatcher") if r % 2 == 0 else ("dispatcher", "direct")):
            path[0] = p
            record_s.clear()
            read_s.clear()
            before = dispatched()
            got, _, cpu, _ = gpt2_decode(model, compiled, DEV, prompt, args.tokens)
            results[p]["dispatched"] += dispatched() - before
            results[p]["record_s"].extend(record_s[1:])  # the prefill's call excluded
            results[p]["read_s"].extend(read_s[1:])  # the prefill's token excluded
            results[p]["step_cpu_s"].extend(cpu)
            ids[p] = got
    summary = {
        "model": f"GPT-2, {args.layers} layers, n_embd {args.embd}, {args.tokens}-token decodes",
        "rounds": args.rounds,
        "same_ids": bool(torch.equal(ids["direct"], ids["dispatcher"])),
    }
    for p, res in results.items():
        summary[p] = {"record_us": statistics.median(res["record_s"]) * 1e6,
                      "read_us": statistics.median(res["read_s"]) * 1e6,
                      "step_cpu_ms": statistics.median(res["step_cpu_s"]) * 1e3,
                      "calls_dispatched": res["dispatched"]}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    genie.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
