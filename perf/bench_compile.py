#!/usr/bin/env python3
"""torch.compile(backend="genie") against local torch.compile(backend="inductor") and local eager.

Models (built from their configs, random weights, as genie.demo builds them): GPT-2 124M
decoding ``--tokens`` tokens greedily with HuggingFace's StaticCache (``max_cache_len`` =
prompt + tokens; the prefill eager, each decode step one compiled forward and a read of the
token, as ``generate`` does), ResNet-50 on a batch of 8 images, MiniLM on its 16 sentences.

Three sides per model, in one process on this machine, alternated ``--rounds`` times after
warm-ups: local eager and local inductor on ``--device`` (default cpu), and Genie compiled
(the model on ``remote_accelerator:0``, the embedded node on loopback, its device
``--device`` too: GENIE_EMBEDDED_DEVICE; timed once every call runs by the node's AOT Inductor
package). ``--mode`` is torch.compile's, given to both compiled sides: "reduce-overhead" on
CUDA means CUDA graphs locally (Inductor's cudagraph trees) and on the node (the package's run
captured and replayed; the node's ``cuda_graph_replays`` are reported). Reported per model:
the median time per call (GPT-2: per decode step, steps 1..tokens-1) of each side and the
ratios; for Genie, bytes sent per call, the client process's CPU time per call
(``time.process_time``: every thread of this process, the model's and HuggingFace's Python
included; for GPT-2 split into Dynamo's share, the calling thread's CPU outside the backend's
compiled callable: guards, frame setup, rebuilding the outputs, which local inductor pays too,
and Genie's, the rest; of Genie's, the compiled call's own, the calling thread's CPU inside the
backend's callable: ``compiled_call_cpu_ms``), the node's execution time of each step's graph
(``node_exec_ms``: its RunResult), the node's engine counts over the timed calls (GPT-2:
package calls per generation; ResNet-50 and MiniLM: ``package_calls`` and ``executor_calls``),
recompiles, the largest difference from local eager (and, ResNet-50 and MiniLM, from local
inductor: ``max_abs_diff_inductor``); compile times: the client's first call (Dynamo,
AOTAutograd, capture), the node's package build from an empty cache ("cold": first call until
the first call the package ran) and after a node restart with the cache kept ("warm": the
package loaded from disk). GPT-2 also checks that the three sides generate the same ids.

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_compile.py                 # all three, docs/perf/compile.json
    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_compile.py --models gpt2 --tokens 32 --rounds 3
    UCX_NET_DEVICES=lo python perf/bench_compile.py --models gpt2 --device cuda:0 --mode reduce-overhead   # a GPU machine
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "docs" / "perf" / "compile.json"
DEV = "remote_accelerator:0"
MODELS = ("gpt2", "resnet50", "minilm")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of %(default)s")
    parser.add_argument("--tokens", type=int, default=32, help="GPT-2 tokens generated (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds per side (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per round, ResNet-50 and MiniLM "
                        "(default: %(default)s)")
    parser.add_argument("--build-timeout", type=float, default=1800, help="seconds to wait for a package "
                        "(default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="the local sides' and the node's device: cpu or cuda:N "
                        "(default: %(default)s)")
    parser.add_argument("--mode", default="default", help="torch.compile's mode for both compiled sides "
                        "(default: %(default)s)")
    parser.add_argument("--json", type=pathlib.Path, default=DEFAULT_JSON, help="results (default: docs/perf/compile.json)")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(MODELS)}")
    if args.tokens < 3:
        parser.error("--tokens must be at least 3")
    return args


# ---- workloads ---------------------------------------------------------------------------------

class Workload:
    """`prepare(model, device, forward)` -> a callable running one timed call and returning
    what is compared; GPT-2's `generate` runs a whole decode and returns (ids, step times)."""


# Thread CPU seconds spent inside the compiled callables a `timed` backend returned: what the
# backend's runtime costs the calling thread, as opposed to Dynamo's own (guards, frame setup,
# rebuilding the outputs), which run around it.
_INSIDE = [0.0]


def timed(backend):
    """`backend` whose compiled callables add their calling thread's CPU time to _INSIDE."""
    def timed_backend(gm, example_inputs, **kwargs):  # kwargs: torch.compile's mode or options
        compiled = backend(gm, example_inputs, **kwargs)

        def run(*args):
            start = time.thread_time()
            try:
                return compiled(*args)
            finally:
                _INSIDE[0] += time.thread_time() - start
        return run
    return timed_backend


def memo_backend(gm, example_inputs, **kwargs):
    """A torch.compile backend that runs its graph once and then only returns those outputs: what
    any backend pays for Dynamo (guards, frame setup, rebuilding the outputs), and nothing else."""
    memo: list = []

    def run(*args):
        if not memo:
            memo.append(gm(*args))
        return memo[0]
    return run


def gpt2_decode(model, forward, device, prompt, tokens: int, dynamo: list | None = None,
                inside: list | None = None, node_exec: list | None = None):
    """Greedy decode with a StaticCache; returns (ids [1, tokens], decode step seconds, client
    CPU seconds per decode step, bytes sent per decode step (0 on the CPU)). `dynamo`: gets the
    thread CPU seconds of each step's call spent outside the compiled callables (a `timed`
    backend's): Dynamo's share; `inside`: those spent inside them (the backend's call);
    `node_exec`: the node's execution seconds of each step's graph (its RunResult)."""
    import genie
    import torch
    from transformers import StaticCache
    n = prompt.shape[1]
    with torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=n + tokens)
        out = model(input_ids=prompt.to(device), past_key_values=cache, use_cache=True,
                    cache_position=torch.arange(n).to(device))
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        ids, steps, cpu, sent = [token.cpu()], [], [], []
        remote = str(device).startswith("remote")
        for i in range(tokens - 1):
            before = genie.client_stats() if remote else None
            wall, proc = time.perf_counter(), time.process_time()
            position = torch.tensor([n + i]).to(device)
            call, inside_before = time.thread_time(), _INSIDE[0]
            out = forward(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True)
            if dynamo is not None:
                dynamo.append(time.thread_time() - call - (_INSIDE[0] - inside_before))
            if inside is not None:
                inside.append(_INSIDE[0] - inside_before)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            ids.append(token.cpu())
            steps.append(time.perf_counter() - wall)
            cpu.append(time.process_time() - proc)
            after = genie.client_stats() if remote else None
            sent.append(after["bytes_sent"] - before["bytes_sent"] if remote else 0)
            if node_exec is not None and remote:
                node_exec.append((after["node_exec_us"] - before["node_exec_us"]) / 1e6)
    return torch.cat(ids, dim=1), steps, cpu, sent


def node_stats():
    import genie
    return genie.memory_stats(DEV)


def until_packages_run(call, parts: int, timeout_s: float) -> float:
    """Calls `call()` until one call ran `parts` parts by packages; returns the seconds it took."""
    start = time.monotonic()
    while True:
        before = node_stats()["package_calls"]
        call()
        if node_stats()["package_calls"] - before >= parts:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"bench_compile: no call ran by packages in {timeout_s:.0f} s: {node_stats()}")
        time.sleep(0.5)


def measure_gpt2(args) -> dict:
    import torch
    import genie
    from genie.demo import models
    workload = models.load_gpt2()
    local_model, prompt = workload.model.to(args.device), workload.prompt
    local_inductor = torch.compile(local_model, backend="inductor", dynamic=False, mode=args.mode)
    # The floor of any torch.compile backend: the same model, compiled with outputs memoized.
    memo_model = models.load_gpt2().model.to(args.device)
    local_memo = torch.compile(memo_model, backend=memo_backend, dynamic=False)
    remote = models.load_gpt2().model.to(DEV)
    # backend="genie" itself, timed: the client CPU per call splits into Dynamo's and Genie's.
    from genie.compile.compiler import backend as genie_backend
    compiled = torch.compile(remote, backend=timed(genie_backend), dynamic=False, mode=args.mode)
    result: dict = {"model": "gpt2", "what": f"decode step, {args.tokens} tokens, StaticCache",
                    "device": args.device, "mode": args.mode}

    # Every decode uses the same cache length (max_cache_len = prompt + tokens): the shapes of
    # the warm-ups are the timed runs' (another length is a recompile and another package).
    t0 = time.perf_counter()
    gpt2_decode(local_model, local_inductor, args.device, prompt, args.tokens)
    result["local_inductor_compile_s"] = time.perf_counter() - t0
    gpt2_decode(memo_model, local_memo, args.device, prompt, args.tokens)
    compile_before = genie.compile_stats()
    t0 = time.perf_counter()
    gpt2_decode(remote, compiled, DEV, prompt, args.tokens)
    result["client_first_call_s"] = time.perf_counter() - t0
    # Cold: the node builds the package (decode steps keep running by the executor meanwhile).
    result["node_build_cold_s"] = until_packages_run(lambda: gpt2_decode(remote, compiled, DEV, prompt, args.tokens),
                                                     args.tokens - 1, args.build_timeout)
    sides = {"eager": (local_model, local_model, args.device), "inductor": (local_model, local_inductor, args.device),
             "genie": (remote, compiled, DEV), "memo": (memo_model, local_memo, args.device)}
    steps = {k: [] for k in sides}
    memo_cpu: list = []
    ids = {}
    cpu_per_step, sent, package_calls, graph_replays, dynamo_cpu, call_cpu, node_exec = [], [], [], [], [], [], []
    recompiles_before = genie.compile_stats()["recompiles"]
    for _ in range(args.rounds):
        for name, (model, forward, device) in sides.items():
            if name == "genie":
                before_client, before_node = genie.client_stats(), node_stats()
            got, step_s, cpu_s, sent_b = gpt2_decode(model, forward, device, prompt, args.tokens,
                                                     *((dynamo_cpu, call_cpu, node_exec) if name == "genie" else ()))
            ids[name] = got
            steps[name].extend(step_s)
            if name == "memo":
                memo_cpu.extend(cpu_s)
            if name == "genie":
                after_client, after_node = genie.client_stats(), node_stats()
                cpu_per_step.extend(cpu_s)
                sent.extend(sent_b)
                package_calls.append(after_node["package_calls"] - before_node["package_calls"])
                graph_replays.append(after_node["cuda_graph_replays"] - before_node["cuda_graph_replays"])
    result.update(
        {f"{k}_ms": statistics.median(v) * 1e3 for k, v in steps.items()},
        same_ids=bool(torch.equal(ids["genie"], ids["eager"])),
        inductor_same_ids=bool(torch.equal(ids["inductor"], ids["eager"])),
        client_cpu_ms_per_call=statistics.median(cpu_per_step) * 1e3,
        dynamo_cpu_ms_per_call=statistics.median(dynamo_cpu) * 1e3,
        compiled_call_cpu_ms=statistics.median(call_cpu) * 1e3,
        node_exec_ms=statistics.median(node_exec) * 1e3,
        genie_cpu_ms_per_call=(statistics.median(cpu_per_step) - statistics.median(dynamo_cpu)) * 1e3,
        memo_cpu_ms_per_call=statistics.median(memo_cpu) * 1e3,
        genie_over_memo_cpu_ms=(statistics.median(cpu_per_step) - statistics.median(memo_cpu)) * 1e3,
        bytes_sent_per_call=statistics.median(sent),
        package_calls_per_run=package_calls,
        cuda_graph_replays_per_run=graph_replays,
        recompiles_in_timed_runs=genie.compile_stats()["recompiles"] - recompiles_before,
        recompiles_total=genie.compile_stats()["recompiles"] - compile_before["recompiles"],
    )
    # Warm: a new node (the embedded one restarted) finds the package in its cache.
    genie.shutdown()
    torch._dynamo.reset()
    remote = models.load_gpt2().model.to(DEV)
    compiled = torch.compile(remote, backend="genie", dynamic=False, mode=args.mode)
    t0 = time.perf_counter()
    gpt2_decode(remote, compiled, DEV, prompt, args.tokens)
    result["node_load_warm_s"] = until_packages_run(lambda: gpt2_decode(remote, compiled, DEV, prompt, args.tokens),
                                                    args.tokens - 1, args.build_timeout) + (time.perf_counter() - t0)
    result["warm_packages_built"] = node_stats()["packages_built"]
    return result


def measure_batch(args, name: str) -> dict:
    """ResNet-50 (batch 8) or MiniLM (16 sentences): one forward per call."""
    import torch
    import genie
    from genie.demo import models
    if name == "resnet50":
        workload = models.load_resnet50()
        local_model = workload.model.to(args.device)
        inputs = {"x": torch.cat([workload.images] * 2)[:8]}
        remote_model = models.load_resnet50().model.to(DEV)
        call = lambda m, dev, i: m(i["x"].to(dev))  # noqa: E731
    else:
        workload = models.load_minilm()
        local_model = workload.model.to(args.device)
        inputs = workload.encoded
        remote_model = models.load_minilm().model.to(DEV)
        call = lambda m, dev, i: m(**{k: v.to(dev) for k, v in i.items()}).last_hidden_state  # noqa: E731
    result: dict = {"model": name, "what": "resnet50 batch 8" if name == "resnet50" else "minilm 16 sentences",
                    "device": args.device, "mode": args.mode}
    local_inductor = torch.compile(local_model, backend="inductor", dynamic=False, mode=args.mode)
    compiled = torch.compile(remote_model, backend="genie", dynamic=False, mode=args.mode)
    with torch.no_grad():
        t0 = time.perf_counter()
        expected = call(local_inductor, args.device, inputs)
        result["local_inductor_compile_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        call(compiled, DEV, inputs).cpu()
        result["client_first_call_s"] = time.perf_counter() - t0
        result["node_build_cold_s"] = until_packages_run(lambda: call(compiled, DEV, inputs).cpu(), 1,
                                                         args.build_timeout)
        sides = {"eager": (local_model, args.device), "inductor": (local_inductor, args.device), "genie": (compiled, DEV)}
        times = {k: [] for k in sides}
        outs = {}
        cpu, sent, engines = [], [], {"package_calls": 0, "executor_calls": 0}
        for name_ in sides:  # warm-up
            call(sides[name_][0], sides[name_][1], inputs).cpu()
        for _ in range(args.rounds):
            for side, (model, dev) in sides.items():
                for _ in range(args.calls):
                    before, node_before = genie.client_stats(), node_stats() if side == "genie" else None
                    wall, proc = time.perf_counter(), time.process_time()
                    outs[side] = call(model, dev, inputs).cpu()
                    times[side].append(time.perf_counter() - wall)
                    if side == "genie":
                        cpu.append(time.process_time() - proc)
                        sent.append(genie.client_stats()["bytes_sent"] - before["bytes_sent"])
                        node_after = node_stats()
                        for engine in engines:
                            engines[engine] += node_after[engine] - node_before[engine]
    result.update({f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()},
                  max_abs_diff=float((outs["genie"] - outs["eager"]).abs().max()),
                  max_abs_diff_inductor=float((outs["genie"] - outs["inductor"]).abs().max()),
                  timed_calls=args.rounds * args.calls, **engines,
                  client_cpu_ms_per_call=statistics.median(cpu) * 1e3, bytes_sent_per_call=statistics.median(sent))
    del expected
    return result


def git_commit() -> str:
    import subprocess
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    # The embedded node's package cache: empty, so that the first build is a cold one.
    cache = tempfile.mkdtemp(prefix="genie-bench-compile-")
    os.environ["GENIE_NODE_COMPILE_CACHE"] = cache
    os.environ["GENIE_EMBEDDED_DEVICE"] = args.device
    os.environ.setdefault("GENIE_LOG_LEVEL", "warn")
    import torch
    import genie  # noqa: F401 - the device
    from genie.demo.harness import quiet_libraries
    quiet_libraries()
    results = []
    for name in args.models:
        r = measure_gpt2(args) if name == "gpt2" else measure_batch(args, name)
        r["genie_vs_inductor"] = r["genie_ms"] / r["inductor_ms"]
        r["genie_vs_eager"] = r["genie_ms"] / r["eager_ms"]
        r["inductor_vs_eager"] = r["inductor_ms"] / r["eager_ms"]
        results.append(r)
        print(json.dumps(r), flush=True)
    from op_coverage import machine  # perf/, beside this script
    report = {"date": datetime.date.today().isoformat(), "commit": git_commit(), "machine": machine(),
              "torch": torch.__version__, "command": " ".join(["perf/bench_compile.py"] + (argv or sys.argv[1:])),
              "results": results}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'model':10} {'eager ms':>9} {'inductor':>9} {'genie':>9} {'g/ind':>6} {'g/eager':>7} {'cpu ms':>7} {'sent B':>7}")
    for r in results:
        print(f"{r['model']:10} {r['eager_ms']:9.2f} {r['inductor_ms']:9.2f} {r['genie_ms']:9.2f} "
              f"{r['genie_vs_inductor']:6.2f} {r['genie_vs_eager']:7.2f} {r['client_cpu_ms_per_call']:7.2f} "
              f"{r['bytes_sent_per_call']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
