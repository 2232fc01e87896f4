#!/usr/bin/env python3
"""genie.semantics: the analysis cache's hit rates and latencies on real models.

Three workloads, each graph captured with fake tensors (`genie.semantics.capture`) and analysed
through one `AnalysisCache`:

1. shapes: GPT-2 124M prefills into a StaticCache (batch x prompt length), ResNet-50 (batch, 224x224),
   MiniLM (all-MiniLM-L6-v2's BertModel architecture; batch x sequence length), all models built
   from their configurations with random weights (the analysis reads no weight). Two passes over
   the same configurations: the first sees each structure and each shape once, the second repeats.
2. decode: GPT-2 124M, a 19-token prompt and 64 greedy decode steps with a StaticCache; one graph
   per step (the prefill, then each step), each captured and analysed, the real model run eagerly
   between captures (on one thread) to advance the cache and pick the next token.
3. latency: the analysis of a GPT-2 124M decode graph on an empty cache (miss), on a cache holding
   its structure at other shapes (level-1 hit, level-2 miss), and again (hit), median of --repeats;
   and the level-1 paths a hit can take: the same graph object's structure (raw form), the same
   structure with other value ids (program form), the same structure with its ops reordered
   (WL hash + canonical form).

Latencies are whole `analyze` calls, microseconds; a graph's flat encodings (`SemGraph.structure`,
`SemGraph.shapes`: the keys' bytes) are made when it is built, their cost is reported beside
(encode_at_build_us), and the whole key is their sum. Targets: hit <= 1 ms, miss on GPT-2 124M
<= 200 ms, decode hits >= 90%.

    .venv/bin/python perf/bench_semantics.py                  # table, docs/perf/semantics.json
    .venv/bin/python perf/bench_semantics.py out.json --steps 16 --repeats 5
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
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from genie.semantics import AnalysisCache, SemGraph, capture  # noqa: E402
from genie.semantics.graph import encode_shapes, renumbered  # noqa: E402

DEFAULT_JSON = ROOT / "docs" / "perf" / "semantics.json"
PROMPT = (464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 4874, 2402, 257, 640, 11, 612, 373, 257, 1310)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).eval()


def static_cache(model, batch: int, max_len: int):
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=max_len)
    cache.early_initialization(batch, cfg.n_head, cfg.n_embd // cfg.n_head, torch.float32, torch.device("cpu"))
    return cache


def resnet50():
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def minilm():
    from transformers import BertConfig, BertModel

    from genie.demo.models import minilm_model_dir

    torch.manual_seed(0)
    return BertModel(BertConfig.from_pretrained(minilm_model_dir())).eval()


def shape_workload(batches: dict, seqs: dict) -> list[tuple[str, tuple, SemGraph, float]]:
    """(model, config, graph, capture seconds) for every configuration."""
    out = []
    g2, rn, ml = gpt2(), resnet50(), minilm()
    for b in batches["gpt2"]:
        for s in seqs["gpt2"]:
            t = time.perf_counter()
            g = capture(g2, torch.zeros(b, s, dtype=torch.long), cache=static_cache(g2, b, 128), use_cache=True)
            out.append(("gpt2", (b, s), g, time.perf_counter() - t))
    for b in batches["resnet50"]:
        t = time.perf_counter()
        g = capture(rn, torch.randn(b, 3, 224, 224))
        out.append(("resnet50", (b, 224), g, time.perf_counter() - t))
    for b in batches["minilm"]:
        for s in seqs["minilm"]:
            ids = torch.ones(b, s, dtype=torch.long)
            t = time.perf_counter()
            g = capture(ml, ids, attention_mask=torch.ones_like(ids))
            out.append(("minilm", (b, s), g, time.perf_counter() - t))
    return out


def run_shapes(graphs) -> dict:
    cache = AnalysisCache()
    passes = []
    for p in range(2):
        before = dict(cache.counts)
        rows = []
        for model, cfg, g, cap_s in graphs:
            c0 = dict(cache.counts)
            t = time.perf_counter()
            ann = cache.analyze(g)
            us = (time.perf_counter() - t) * 1e6
            level = ("hit" if cache.counts["l2_hits"] > c0["l2_hits"] else
                     "l1 hit, l2 miss" if cache.counts["l1_hits"] > c0["l1_hits"] else "miss")
            rows.append({"model": model, "config": cfg, "nodes": len(g.nodes), "phase": ann.phase,
                         "result": level, "analyze_us": round(us, 1), "capture_s": round(cap_s, 3),
                         "matches": {k: ann.count(k) for k in ("attention", "kv_cache", "conv_block", "mlp",
                                                               "embedding", "norm") if ann.count(k)}})
        d = {k: cache.counts[k] - before[k] for k in before}
        passes.append({"rows": rows, "l1_hit_rate": d["l1_hits"] / len(graphs),
                       "l2_hit_rate": d["l2_hits"] / len(graphs), **d})
    return {"passes": passes, "stats": cache.stats()}


@torch.no_grad()
def run_decode(steps: int) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the real steps on one thread: OpenMP workers spinning after a step
    try:                       # would share the cores with the analysis being timed
        return _run_decode(steps)
    finally:
        torch.set_num_threads(threads)


def _run_decode(steps: int) -> dict:
    model = gpt2()
    cache = static_cache(model, 1, len(PROMPT) + steps + 1)
    cache_analysis = AnalysisCache()
    ids = torch.tensor([PROMPT])
    rows = []
    capture_s = []
    for step in range(steps + 1):
        t = time.perf_counter()
        g = capture(model, ids, cache=cache, use_cache=True)
        capture_s.append(time.perf_counter() - t)
        c0 = dict(cache_analysis.counts)
        t = time.perf_counter()
        ann = cache_analysis.analyze(g)
        us = (time.perf_counter() - t) * 1e6
        rows.append({"step": step, "tokens": ids.shape[1], "phase": ann.phase, "analyze_us": round(us, 1),
                     "l1_hit": cache_analysis.counts["l1_hits"] > c0["l1_hits"],
                     "l2_hit": cache_analysis.counts["l2_hits"] > c0["l2_hits"]})
        logits = model(ids, cache=cache, use_cache=True).logits          # the real step
        ids = logits[:, -1:].argmax(-1)
    s = cache_analysis.stats()
    n = len(rows)
    return {"graphs": n, "l1_hit_rate": s["l1_hits"] / n, "l2_hit_rate": s["l2_hits"] / n,
            "phases": {p: sum(r["phase"] == p for r in rows) for p in {r["phase"] for r in rows}},
            "hit_latency_us": s["latency"]["hit"], "capture_s_median": statistics.median(capture_s),
            "rows": rows, "stats": s}


@torch.no_grad()
def run_latency(repeats: int) -> dict:
    model = gpt2()
    decode = capture(model, torch.tensor([[464]]), cache=static_cache(model, 1, 128), use_cache=True)
    decode2 = capture(model, torch.tensor([[464]]), cache=static_cache(model, 1, 128), use_cache=True)
    other_shape = capture(model, torch.tensor([[464, 2068]]), cache=static_cache(model, 1, 128), use_cache=True)

    def med(fn) -> float:
        xs = []
        for _ in range(repeats):
            xs.append(fn())
        return statistics.median(xs)

    def timed(cache: AnalysisCache, g: SemGraph) -> float:
        t = time.perf_counter()
        cache.analyze(g)
        return (time.perf_counter() - t) * 1e6

    def miss() -> float:
        return timed(AnalysisCache(), decode)

    def l2_miss() -> float:
        c = AnalysisCache()
        c.analyze(other_shape)
        return timed(c, decode)

    def encode() -> float:   # the part of the key made when a graph is built (SemGraph.structure, .shapes)
        t = time.perf_counter()
        decode._encode_structure()
        encode_shapes(decode.values, decode.value_order)
        return (time.perf_counter() - t) * 1e6

    def build() -> float:    # building the whole SemGraph from its records, encodings included
        t = time.perf_counter()
        SemGraph(decode.nodes, decode.values, decode.outputs)
        return (time.perf_counter() - t) * 1e6

    warm = AnalysisCache()
    warm.analyze(decode)
    out = {"nodes": len(decode.nodes), "values": len(decode.values),
           "encode_at_build_us": med(encode), "build_semgraph_us": med(build),
           "miss_us": med(miss), "l1_hit_l2_miss_us": med(l2_miss),
           "hit_same_graph_us": med(lambda: timed(warm, decode)),
           "hit_raw_form_us": med(lambda: timed(warm, decode2))}
    paths = {}
    for name, reorder in (("hit_program_form_us", False), ("hit_canonical_form_us", True)):
        xs = []
        for r in range(repeats):
            g, _, _ = renumbered(decode, r, reorder)
            before = warm.counts["l1_hits"]
            xs.append(timed(warm, g))
            assert warm.counts["l1_hits"] == before + 1, name
        paths[name] = statistics.median(xs)
    out.update(paths)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="?", default=str(DEFAULT_JSON), help="where to write the results")
    ap.add_argument("--steps", type=int, default=64, help="decode steps")
    ap.add_argument("--repeats", type=int, default=15, help="repeats of each latency measurement")
    args = ap.parse_args()
    batches = {"gpt2": (1, 2, 4), "resnet50": (1, 2, 4, 8), "minilm": (1, 4, 16)}
    seqs = {"gpt2": (16, 32, 64), "minilm": (16, 32, 64)}
    t0 = time.perf_counter()
    shapes = run_shapes(shape_workload(batches, seqs))
    decode = run_decode(args.steps)
    latency = run_latency(args.repeats)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": "python perf/bench_semantics.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "cpus": os.cpu_count()},
        "shapes": shapes, "decode": decode, "latency": latency,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"{'workload':<34} {'graphs':>6} {'L1 hits':>8} {'L2 hits':>8}")
    for i, p in enumerate(shapes["passes"]):
        n = len(p["rows"])
        label = f"shapes, pass {i + 1} (3 models)"
        print(f"{label:<34} {n:>6} {p['l1_hit_rate']:>8.0%} {p['l2_hit_rate']:>8.0%}")
    print(f"{'GPT-2 124M decode, ' + str(args.steps) + ' steps':<34} {decode['graphs']:>6} "
          f"{decode['l1_hit_rate']:>8.0%} {decode['l2_hit_rate']:>8.0%}")
    print()
    for p in shapes["passes"][:1]:
        for r in p["rows"]:
            print(f"  {r['model']:<9} {str(r['config']):<9} {r['nodes']:>5} ops  {r['phase']:<8} {r['result']:<16}"
                  f" {r['analyze_us'] / 1e3:8.2f} ms  capture {r['capture_s']:.2f} s  {r['matches']}")
    print()
    h = decode["hit_latency_us"]
    print(f"decode hits: p50 {h['p50_us']:.0f} us, max {h['max_us']:.0f} us ({h['n']} hits); "
          f"capture p50 {decode['capture_s_median']:.2f} s; phases {decode['phases']}")
    lat = latency
    print(f"GPT-2 124M decode graph ({lat['nodes']} ops), median of {args.repeats}:")
    for k in ("miss_us", "l1_hit_l2_miss_us", "hit_same_graph_us", "hit_raw_form_us", "hit_program_form_us",
              "hit_canonical_form_us", "encode_at_build_us", "build_semgraph_us"):
        print(f"  {k:<24} {lat[k] / 1e3:8.3f} ms")
    path = pathlib.Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {path} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
