#!/usr/bin/env python3
"""The scheduler's placement against round-robin and greedy-by-memory, run for real on unequal
genie-node processes on loopback, with the cost model's error.

Nodes (made unequal by CPU and memory): "fast" may use every core (`taskset` over all CPUs);
"slow" one core and one intra-op thread; "small" one core and a --memory-limit of
--small-fraction of the model's weights. The cluster is measured once by
`genie.scheduler.connected_cluster` (rates, links, free memory). Model: a GPT-2 built from its
config (--layers, --width, --vocab), on the host; one call = a forward of --tokens tokens whose
last position's logits are read. For each round, in turn per algorithm (the scheduler's
`schedule`, `round_robin`, `greedy_by_memory`, goal "latency"): a fresh copy of the model is
placed with `genie.place(..., algorithm=...)`, warmed up, and --calls calls are timed; the
copy is then dropped and the nodes' memory freed. Reported per algorithm: the median over
rounds of each round's median call (ms), the spread (min-max of the round medians), the
realized schedule's estimate (ms) and the cost model's error ((estimate - measured) / measured).

    .venv/bin/python perf/bench_placement.py                         # table, docs/perf/placement.json
    .venv/bin/python perf/bench_placement.py --rounds 5 --calls 20 --out docs/perf/placement.md
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import os
import pathlib
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

DEFAULT_JSON = ROOT / "docs" / "perf" / "placement.json"


def start_node(binary: str, cpus: str, threads: int, limit: int | None) -> tuple[subprocess.Popen, str]:
    command = ["taskset", "-c", cpus, binary, "--listen", "127.0.0.1:0", "--log-level", "error"]
    if limit:
        command += ["--memory-limit", str(limit)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"genie-node did not start: {line!r}")
    return process, match.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--small-fraction", type=float, default=0.4)
    parser.add_argument("--node", default=str(ROOT / "build" / "bin" / "genie-node"))
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--out", help="also write this Markdown report")
    parser.add_argument("--machine", default=platform.node())
    args = parser.parse_args()

    import torch
    import transformers

    import genie
    from genie.scheduler import connected_cluster, greedy_by_memory, round_robin, schedule

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=max(1, args.width // 64),
                                     vocab_size=args.vocab, n_positions=max(128, args.tokens))
    model = transformers.GPT2LMHeadModel(config).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits[:, -1]
    cores = os.cpu_count() or 1
    specs = {"fast": (f"0-{cores - 1}", cores, None), "slow": (str(cores - 1), 1, None),
             "small": ("0", 1, int(weights * args.small_fraction))}
    nodes = {name: start_node(args.node, *spec) for name, spec in specs.items()}
    algorithms = {"scheduler": schedule, "round-robin": round_robin, "greedy-by-memory": greedy_by_memory}
    results: dict[str, dict] = {name: {"round_ms": []} for name in algorithms}
    try:
        genie.init(server=",".join(address for _, address in nodes.values()))
        cluster = connected_cluster()
        for _ in range(args.rounds):
            for name, algorithm in algorithms.items():
                copy_ = copy.deepcopy(model)
                placed = genie.place(copy_, ids, cluster=cluster, algorithm=algorithm)
                with torch.no_grad():
                    for _ in range(2):
                        out = copy_(ids).logits[:, -1].cpu()
                    times = []
                    for _ in range(args.calls):
                        start = time.perf_counter()
                        out = copy_(ids).logits[:, -1].cpu()
                        times.append(time.perf_counter() - start)
                torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)
                r = results[name]
                r["round_ms"].append(statistics.median(times) * 1e3)
                r["estimate_ms"] = placed.realized.estimated_s * 1e3
                r["blocks"] = {path: str(dev) for path, dev in placed.blocks.items()}
                r["nodes_used"] = len(placed.devices())
                placed.remove()
                del copy_, placed, out
                gc.collect()
                genie.synchronize()
    finally:
        genie.shutdown()
        for process, _ in nodes.values():
            process.terminate()
            process.wait(timeout=10)
    for r in results.values():
        r["median_ms"] = statistics.median(r["round_ms"])
        r["model_error"] = (r["estimate_ms"] - r["median_ms"]) / r["median_ms"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"date": datetime.date.today().isoformat(), "commit": commit, "machine": args.machine,
              "command": "perf/bench_placement.py " + shlex.join(sys.argv[1:]), "weights_bytes": weights,
              "nodes": {name: {"cpus": spec[0], "threads": spec[1], "memory_limit": spec[2]}
                        for name, spec in specs.items()},
              "node_names": {f"remote_accelerator:{i}": name for i, name in enumerate(specs)},
              "cluster": {n.name: {"flops_per_s": n.flops_per_s, "bytes_per_s": n.bytes_per_s,
                                   "memory_free": n.memory_free} for n in cluster.nodes},
              "args": vars(args), "results": results}
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"| placement | nodes used | call (ms), median of {args.rounds} round medians | spread (ms) | "
             "cost model (ms) | model error |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['nodes_used']} | {r['median_ms']:.2f} | {min(r['round_ms']):.2f}-"
                     f"{max(r['round_ms']):.2f} | {r['estimate_ms']:.2f} | {r['model_error']:+.0%} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        names = report["node_names"]
        where = "\n".join(f"- {name}: " + ", ".join(sorted({f"{names.get(d, d)}" for d in r["blocks"].values()}))
                          for name, r in results.items())
        pathlib.Path(args.out).write_text(
            f"# Placement on unequal real nodes\n\n- Date: {report['date']}; commit {commit}\n"
            f"- Machine: {args.machine}\n- Command: `{report['command']}`\n"
            f"- Model: GPT-2 config, {args.layers} layers, width {args.width}, vocabulary {args.vocab} "
            f"({weights / 2**20:.1f} MiB of weights); a call = a {args.tokens}-token forward, last logits read\n"
            f"- Nodes: fast = all {cores} CPUs; slow = 1 CPU, 1 thread; small = 1 CPU, memory limit "
            f"{args.small_fraction:.0%} of the weights\n\n{table}\n\nWhere each placement ran its blocks:\n\n{where}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
