#!/usr/bin/env python3
"""A training step on remote_accelerator against the same step on the local CPU, in one run.

GPT-2 from a small config (4 layers, 4 heads, 256 wide, 5000-token vocabulary, SDPA attention,
dropout as configured), batch 4 x 64 tokens, AdamW, tied embeddings re-tied after `.to`.
Median of `--steps` steps after 3 warm-up steps per side, `--rounds` rounds; for the device, the
traffic of the last step (bytes sent and received, round trips).

    UCX_NET_DEVICES=lo HF_HUB_OFFLINE=1 .venv/bin/python perf/bench_training.py
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

DEVICE = "remote_accelerator:0"
WARMUP_STEPS = 3


def gpt2():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128,
                                     attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config)


def bench(device: str, ids, steps: int) -> tuple[float, dict]:
    """Median step time (ms) on `device`, and the last step's traffic (device only)."""
    import torch
    from genie.runtime import runtime_for

    model = gpt2().to(device)
    model.tie_weights()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = ids.to(device)
    runtime = runtime_for(torch.device(device)) if device != "cpu" else None
    times, before, after = [], None, None
    for i in range(steps + WARMUP_STEPS):
        before = runtime.counters() if runtime else None
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        loss.item()
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
        after = runtime.counters() if runtime else None
    traffic = {k: after[k] - before[k] for k in ("bytes_sent", "bytes_received", "round_trips")} if runtime else {}
    return statistics.median(times) * 1e3, traffic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per side and round (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each local then remote (default 2)")
    args = parser.parse_args()

    import torch
    import genie  # noqa: F401 - registers remote_accelerator

    warnings.simplefilter("ignore")
    ids = torch.randint(0, 5000, (4, 64), generator=torch.Generator().manual_seed(1))
    for r in range(args.rounds):
        local, _ = bench("cpu", ids, args.steps)
        remote, traffic = bench(DEVICE, ids, args.steps)
        print(f"round {r}: local {local:.1f} ms, remote {remote:.1f} ms, ratio {remote / local:.2f}, "
              f"per step {traffic}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
