#!/usr/bin/env python3
"""A training step on remote_accelerator against the same step on the local CPU, in one run.

GPT-2 from a small config (4 layers, 4 heads, 256 wide, 5000-token vocabulary, SDPA attention,
dropout as configured), batch 4 x 64 tokens, AdamW, tied embeddings re-tied after `.to`.
Median of 10 steps after 3 warm-up steps per side, two rounds; for the device, the traffic of
the last step (bytes sent and received, round trips).

    UCX_NET_DEVICES=lo HF_HUB_OFFLINE=1 .venv/bin/python perf/bench_training.py
"""
import time, statistics, torch, genie, transformers, warnings
warnings.simplefilter("ignore")
from genie.runtime import runtime_for
DEV = "remote_accelerator:0"
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128, attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(cfg)
ids = torch.randint(0, 5000, (4, 64), generator=torch.Generator().manual_seed(1))
def bench(dev, steps=10):
    m = gpt2().to(dev); m.tie_weights(); m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = ids.to(dev); times = []
    rt = runtime_for(torch.device(DEV)) if dev != "cpu" else None
    for i in range(steps + 3):
        c0 = rt.counters() if rt else None
        t = time.perf_counter()
        opt.zero_grad(); loss = m(input_ids=x, labels=x).loss; loss.backward(); opt.step(); loss.item()
        if i >= 3: times.append(time.perf_counter() - t)
        c1 = rt.counters() if rt else None
    per = {k: c1[k] - c0[k] for k in ("bytes_sent", "bytes_received", "round_trips")} if rt else {}
    return statistics.median(times) * 1e3, per
for r in range(2):
    lc, _ = bench("cpu"); ld, per = bench(DEV)
    print(f"round {r}: local {lc:.1f} ms, remote {ld:.1f} ms, ratio {ld/lc:.2f}, per step {per}")
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
