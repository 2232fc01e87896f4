#!/usr/bin/env python3
"""Model benchmarks: each model on a Genie device against the same model on the local CPU, in one run.

For each model the weights move to the device once (``.to(device)``, measured); both sides
then get one warm-up run with the same inputs, and ``--repeat`` rounds follow, each one local
run and one device run, so every round gives a device/local ratio under the same conditions.
Numbers are medians over the rounds.

  minilm    embed 16 sentences (all-MiniLM-L6-v2)
  gpt2      greedy generation of 32 tokens with a KV cache (GPT-2 124M, random weights):
            time per decode step (median over the steps of a run), bytes sent / received and
            round trips per step, bytes sent over the whole run against the parameter bytes
  resnet50  forward of a batch of 8 photographs (224x224)

    perf/bench_models.py --device remote_accelerator:0 --repeat 5 --json results.json
    perf/bench_models.py --device cpu --quick      # the harness alone

Counters (``genie.client_stats()``) are shown as "-" on a local device. The loaders and the
run/check code are ``genie.demo``'s (python/genie/demo); this file is the CLI.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

try:
    import genie.demo  # noqa: F401 - installed (pip install -e .)
except ImportError:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

from genie.demo import harness, models  # noqa: E402
from genie.demo.__main__ import prepare_device  # noqa: E402
from genie.demo.measure import (COUNTER_KEYS, Counters, format_bytes, format_count, format_seconds,  # noqa: E402
                                machine, median, median_counters)
from genie.demo.table import print_table  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="remote_accelerator:0", help="target device (default: %(default)s)")
    parser.add_argument("--models", default=",".join(models.MODEL_NAMES), help="comma-separated subset of %(default)s")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of (local run, device run) after warm-up")
    parser.add_argument("--quick", action="store_true", help="small inputs: 4 sentences, 2 images, 4 new tokens")
    parser.add_argument("--max-new-tokens", type=int, help="GPT-2 tokens to generate (default 32, --quick 4)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the local runs (default: torch's)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(models.MODEL_NAMES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(models.MODEL_NAMES)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def bench_model(name: str, args, counters: Counters) -> dict:
    """Upload, warm up, then ``args.repeat`` rounds of local + device runs of one model."""
    workload = harness.load(name, args.quick, args.max_new_tokens)
    local_counters = Counters("cpu")
    parameter_bytes = models.parameter_bytes(workload.model)
    model, uploaded = harness.upload(workload, args.device, counters)
    harness.run_once(workload, workload.model, "cpu", local_counters)
    harness.run_once(workload, model, args.device, counters)
    rounds = []
    for _ in range(args.repeat):
        local = harness.run_once(workload, workload.model, "cpu", local_counters)
        device = harness.run_once(workload, model, args.device, counters)
        rounds.append((local, device))
    check = harness.check(workload, rounds[0][0].result, rounds[0][1].result)
    result = {
        "model": name,
        "parameter_bytes": parameter_bytes,
        "upload": {"seconds": uploaded.seconds, "counters": uploaded.counters},
        "passed": check.passed, "check": check.summary,
        "local_s": [r[0].seconds for r in rounds],
        "device_s": [r[1].seconds for r in rounds],
        "ratio": [d.seconds / lo.seconds for lo, d in rounds],
        "device_counters": median_counters([r[1].counters for r in rounds]),
    }
    sent = result["device_counters"]["bytes_sent"] if result["device_counters"] else None
    result["run_bytes_sent_per_parameter_byte"] = sent / parameter_bytes if sent is not None else None
    if isinstance(workload, models.GPT2):
        local_steps = [median(r[0].step_seconds) for r in rounds]
        device_steps = [median(r[1].step_seconds) for r in rounds]
        result["step"] = {
            "steps_per_run": len(rounds[0][1].step_seconds),
            "local_s": local_steps, "device_s": device_steps,
            "ratio": [d / lo for lo, d in zip(local_steps, device_steps)],
            "device_counters": median_counters([c for r in rounds for c in r[1].step_counters]),
        }
    del model
    return result


def node_time(counters: dict) -> str:
    """The node's execution time within a run (RunResult.exec_us summed), or "-"."""
    us = counters.get("node_exec_us")
    return "-" if us is None else format_seconds(us / 1e6)


def print_results(results: list, args, counters: Counters, host: dict, out) -> None:
    rows = []
    for r in results:
        c = r["device_counters"] or {}
        ratio = r["ratio"]
        rows.append((r["model"], "run", format_seconds(median(r["local_s"])), format_seconds(median(r["device_s"])),
                     f"{median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})",
                     format_bytes(c.get("bytes_sent")), format_bytes(c.get("bytes_received")),
                     format_count(c.get("round_trips")), node_time(c), "ok" if r["passed"] else "FAIL " + r["check"]))
        if "step" in r:
            s = r["step"]
            sc = s["device_counters"] or {}
            rows.append(("", f"decode step (median of {s['steps_per_run']})", format_seconds(median(s["local_s"])),
                         format_seconds(median(s["device_s"])),
                         f"{median(s['ratio']):.2f}x ({min(s['ratio']):.2f}-{max(s['ratio']):.2f})",
                         format_bytes(sc.get("bytes_sent")), format_bytes(sc.get("bytes_received")),
                         format_count(sc.get("round_trips")), node_time(sc), ""))
        uc = r["upload"]["counters"] or {}
        rows.append(("", f"upload, {format_bytes(r['parameter_bytes'])} of weights", "-",
                     format_seconds(r["upload"]["seconds"]), "-", format_bytes(uc.get("bytes_sent")),
                     format_bytes(uc.get("bytes_received")), format_count(uc.get("round_trips")), "-", ""))
    title = (f"bench_models: {args.device} vs local cpu, median of {args.repeat} rounds after one warm-up each "
             f"(ratio: median (min-max) of per-round device/local)")
    print_table(title, ("model", "what", "local cpu", args.device, "device/local", "sent", "received", "round trips",
                        "node exec", "check"), rows, file=out)
    for r in results:
        if r["run_bytes_sent_per_parameter_byte"] is not None:
            print(f"{r['model']}: bytes sent per run / parameter bytes = {r['run_bytes_sent_per_parameter_byte']:.4f}",
                  file=out)
    if not counters.available:
        print(f"counters: - ({counters.unavailable_reason})", file=out)
    print(f"machine: {host['cpu_model']}, {host['cpu_count']} cores, torch threads {host['torch_threads']}, "
          f"load {host['load_average_1m']}, torch {host['torch']}, {host['date']}", file=out)


def main(argv=None) -> int:
    args = parse_args(argv)
    harness.quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prepare_device(args.device)
    except Exception as error:
        print(f"bench_models: cannot set up device {args.device}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    counters = Counters(args.device)
    host = machine()
    results = []
    for name in args.models:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(bench_model(name, args, counters))
    host["load_average_1m_end"] = machine()["load_average_1m"]
    print_results(results, args, counters, host, sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        document = {"machine": host, "device": args.device, "repeat": args.repeat, "quick": args.quick,
                    "counter_keys": list(COUNTER_KEYS), "counters_available": counters.available, "models": results}
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            pathlib.Path(args.json).write_text(text + "\n")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
