#!/usr/bin/env python3
"""genie.scheduler: placement time on simulated clusters, and the cost model's makespan of the
scheduler against round-robin and greedy-by-memory on the same cluster and graph.

Graphs: GPT-2-shaped prefills (width 768, 1,024 tokens, vocabulary 50,257; per layer seven groups:
norm, KV cache, attention, residual add, norm, MLP, residual add; embedding tied to the head; the
client reads the last position's logits) with as many layers as give about --groups groups
(default 150, 500, 2,000). Clusters:
genie.scheduler.simulated(n, seed) for each --nodes (default 10, 100, 1,000). For each pair and
goal ("latency", "throughput"): the best and median of --repeats wall-clock times of
`schedule(...)`, its estimated time of one run and pipelined period, and those of the two
baselines (docs/scheduler.md). Target: placement <= 1 s at 1,000 nodes.

    .venv/bin/python perf/bench_scheduler.py                       # table, docs/perf/scheduler.json
    .venv/bin/python perf/bench_scheduler.py --nodes 1000 --groups 2000 --repeats 5
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from genie.scheduler import greedy_by_memory, round_robin, schedule, simulated  # noqa: E402
from genie.semantics.groups import CLIENT, Edge, Group, GroupGraph  # noqa: E402

DEFAULT_JSON = ROOT / "docs" / "perf" / "scheduler.json"


def gpt2_like(groups: int, d: int = 768, seq: int = 1024, vocab: int = 50257) -> GroupGraph:
    """A prefill of ~`groups` groups (3 + 7 per layer); float32; costs from the shapes."""
    layers = max(1, round((groups - 3) / 7))
    out: list[Group] = []
    edges: list[Edge] = []
    hid = seq * d * 4

    def add(kind, flops, accessed, weights=(), wbytes=0, state=(), sbytes=0, act=hid, inputs=()):
        gid = len(out)
        out.append(Group(gid, kind, "prefill", (gid,), float(flops), int(accessed), tuple(weights), int(wbytes),
                         tuple(state), int(sbytes), int(act)))
        edges.extend(Edge(src, gid, int(n)) for src, n in inputs)
        return gid

    emb = vocab * d * 4
    x = add("embedding", seq * d, hid + seq * d * 4, ["wte"], emb, inputs=[(CLIENT, seq * 8)])
    for i in range(layers):
        kv = 2 * seq * d * 4
        n1 = add("norm", 8 * seq * d, 2 * hid, [f"h{i}.ln1"], 2 * d * 4, inputs=[(x, hid)])
        cache = add("kv_cache", 2 * seq * d, kv + hid, state=[f"kv{i}"], sbytes=kv, inputs=[(n1, hid)])
        attn = add("attention", 8 * seq * d * d + 4 * seq * seq * d, 16 * d * d + kv + 2 * hid, [f"h{i}.attn"],
                   16 * d * d, [f"kv{i}"], kv, act=3 * hid + seq * seq * 4, inputs=[(n1, hid), (cache, kv)])
        r1 = add("ops", seq * d, 3 * hid, inputs=[(x, hid), (attn, hid)])
        n2 = add("norm", 8 * seq * d, 2 * hid, [f"h{i}.ln2"], 2 * d * 4, inputs=[(r1, hid)])
        mlp = add("mlp", 16 * seq * d * d, 32 * d * d + 5 * hid, [f"h{i}.mlp"], 32 * d * d, act=4 * hid,
                  inputs=[(n2, hid)])
        x = add("ops", seq * d, 3 * hid, inputs=[(r1, hid), (mlp, hid)])
    lnf = add("norm", 8 * seq * d, 2 * hid, ["ln_f"], 2 * d * 4, inputs=[(x, hid)])
    head = add("ops", 2 * seq * d * vocab, emb + seq * vocab * 4, ["wte"], emb, act=seq * vocab * 4,
               inputs=[(lnf, hid)])
    edges.append(Edge(head, CLIENT, vocab * 4))  # the program reads the last position's logits
    return GroupGraph(out, edges)


def timed(fn, repeats: int):
    """(result of the last call, [seconds of each call])."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, times


def measure(n_nodes: int, graph: GroupGraph, goal: str, repeats: int, seed: int) -> dict:
    cluster = simulated(n_nodes, seed)
    sched, times = timed(lambda: schedule(graph, cluster, goal), repeats)
    rr, gm = round_robin(graph, cluster, goal), greedy_by_memory(graph, cluster, goal)
    return {"nodes": n_nodes, "groups": len(graph.groups), "goal": goal, "algorithm": sched.algorithm,
            "place_s_best": min(times), "place_s_median": statistics.median(times), "nodes_used": len(sched.nodes()),
            "estimated_s": sched.estimated_s, "period_s": sched.period_s,
            "round_robin": {"estimated_s": rr.estimated_s, "period_s": rr.period_s},
            "greedy_by_memory": {"estimated_s": gm.estimated_s, "period_s": gm.period_s}}


def table(rows: list[dict]) -> str:
    head = (f"{'nodes':>5} {'groups':>6} {'goal':<10} {'algorithm':<18} {'place s':>8} {'used':>4} "
            f"{'sched ms':>9} {'rr ms':>9} {'greedy ms':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        key = "period_s" if r["goal"] == "throughput" else "estimated_s"
        lines.append(f"{r['nodes']:>5} {r['groups']:>6} {r['goal']:<10} {r['algorithm']:<18} "
                     f"{r['place_s_median']:>8.3f} {r['nodes_used']:>4} {r[key] * 1e3:>9.3f} "
                     f"{r['round_robin'][key] * 1e3:>9.3f} {r['greedy_by_memory'][key] * 1e3:>9.3f}")
    lines.append("ms: estimated time of one run (latency) or pipelined period (throughput), same cost model")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000],
                        help="cluster sizes (default: %(default)s)")
    parser.add_argument("--groups", type=int, nargs="+", default=[150, 500, 2000],
                        help="approximate group counts (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="timed placements per case (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="simulated cluster seed (default: %(default)s)")
    parser.add_argument("--json", type=pathlib.Path, default=DEFAULT_JSON,
                        help="results (default: docs/perf/scheduler.json)")
    args = parser.parse_args(argv)
    graphs = [gpt2_like(g) for g in args.groups]
    rows = [measure(n, g, goal, args.repeats, args.seed) for n in args.nodes for g in graphs
            for goal in ("latency", "throughput")]
    print(table(rows))
    import numpy
    command = [".venv/bin/python", "perf/bench_scheduler.py"] + (argv if argv is not None else sys.argv[1:])
    report = {"date": datetime.date.today().isoformat(), "command": " ".join(command),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
              "python": platform.python_version(), "numpy": numpy.__version__, "seed": args.seed, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
