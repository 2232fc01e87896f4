#!/usr/bin/env python3
"""A/B of two Genie frontends on the models of the main job, or on capture, alternated in one run.

`--bench models` (the default): each round runs `perf/bench_models.py --repeat N` once with
frontend A (this checkout) and once with frontend B (another checkout, e.g. an older commit
built beside this one), in alternating order, each in a fresh process with its own embedded
node; a round gives each model's device time (median over the process's measured runs: MiniLM
and ResNet-50 per run, GPT-2 per decode step), the device/local ratio measured in the same
process, and the device time less the node's execution time (what Genie's client and the
transport add; the node's compute drifts most on a shared VM).

`--bench capture`: each round runs this checkout's `perf/bench_capture.py` once per frontend
(one method for both), in the same alternation: the median over a GPT-2 decode step's ops of
the µs to record one call (against eager's µs for the same call in the same process), and
Genie's client time per decode step of `generate`.

The report is the median over the rounds of B's and A's figures and of A/B per round.

    perf/ab_frontends.py --b-python /work/ab/run_9bc3abb.sh --b-root /work/ab/9bc3abb \\
        --models minilm,resnet50 --rounds 5 --json docs/perf/ab.json
    perf/ab_frontends.py --bench capture --b-python ... --b-root ... --rounds 5

`--b-python` is the command that runs Python with frontend B importable as `genie` (for a
worktree of an older commit: a launcher that puts its python/ first on the path and its own
genie._C beside it); `--b-root` the checkout whose perf/bench_models.py it runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_capture(python: list[str], root: pathlib.Path, repeat: int, env: dict) -> dict:
    """One bench_capture.py process: {"capture per op": (median captured seconds per call,
    captured/eager), "client time per step": (Genie's client seconds per decode step, that over
    the step's wall time)}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        script = pathlib.Path(__file__).resolve().parent / "bench_capture.py"  # the same method for A and B
        subprocess.run([*python, str(script), "--repeat", str(repeat), "--rounds", "3",
                        "--tokens", "16", "--json", out.name], check=True, env=env, capture_output=True, text=True,
                       timeout=1800)
        data = json.load(open(out.name))
    step = data["step"]
    return {"capture per op": (data["median_capture_us"] * 1e-6, data["median_ratio"], None),
            "client time per step": (step["client_ms_per_step"] * 1e-3, step["client_ms_per_step"] / step["step_ms_median"],
                                     None)}


def run_bench(python: list[str], root: pathlib.Path, models: str, repeat: int, env: dict) -> dict:
    """One bench_models.py process: {model: (device seconds, device/local ratio, seconds of it not
    spent executing on the node)}, medians of its `repeat` measured runs (GPT-2: of its decode
    steps). The third is the device time less the node's execution time (RunResult.exec_us, the
    median counters): Genie's client and the transport, apart from the node's compute, whose
    time on this VM drifts most."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([*python, str(root / "perf/bench_models.py"), "--models", models, "--repeat", str(repeat),
                        "--json", out.name, "--no-history"], check=True, env=env, capture_output=True, text=True,
                       timeout=1800)
        data = json.load(open(out.name))
    results = {}
    for entry in data["models"]:
        part = entry.get("step", entry)
        device = statistics.median(part["device_s"])
        node_us = (part.get("device_counters") or {}).get("node_exec_us")
        results[entry["model"]] = (device, statistics.median(part["ratio"]),
                                   None if node_us is None else device - node_us * 1e-6)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--b-python", required=True, help="command running Python with frontend B as genie")
    parser.add_argument("--b-root", required=True, type=pathlib.Path, help="frontend B's checkout")
    parser.add_argument("--b-name", default="B", help="B's name in the report (a commit)")
    parser.add_argument("--bench", choices=("models", "capture"), default="models")
    parser.add_argument("--models", default="minilm,resnet50")
    parser.add_argument("--rounds", type=int, default=5, help="alternated (A, B) pairs of processes")
    parser.add_argument("--repeat", type=int, default=2,
                        help="measured runs per process (bench_models.py --repeat; capture: calls per timed batch)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    env = {**os.environ, "UCX_NET_DEVICES": os.environ.get("UCX_NET_DEVICES", "lo"), "HF_HUB_OFFLINE": "1"}
    a_python = [sys.executable]
    b_python = args.b_python.split()
    rounds = []
    for i in range(args.rounds):
        order = [("A", a_python, ROOT), ("B", b_python, args.b_root)]
        if i % 2:
            order.reverse()
        if args.bench == "capture":
            got = {name: run_capture(python, root, args.repeat, env) for name, python, root in order}
        else:
            got = {name: run_bench(python, root, args.models, args.repeat, env) for name, python, root in order}
        rounds.append(got)
        print(f"round {i + 1}: " + "; ".join(
            f"{m}: A {got['A'][m][0] * 1e3:.4g} ms, B {got['B'][m][0] * 1e3:.4g} ms" for m in got["A"]), flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "a": commit, "b": args.b_name, "rounds": args.rounds, "bench": args.bench,
              "command": "perf/ab_frontends.py " + " ".join(sys.argv[1:]), "models": {}}
    for model in rounds[0]["A"]:
        a = [r["A"][model][0] for r in rounds]
        b = [r["B"][model][0] for r in rounds]
        report["models"][model] = {
            "a_ms": statistics.median(a) * 1e3, "b_ms": statistics.median(b) * 1e3,
            "a_over_b": statistics.median([x / y for x, y in zip(a, b)]),
            "a_over_b_range": [min(x / y for x, y in zip(a, b)), max(x / y for x, y in zip(a, b))],
            "a_device_over_local": statistics.median(r["A"][model][1] for r in rounds),
            "b_device_over_local": statistics.median(r["B"][model][1] for r in rounds),
        }
        if rounds[0]["A"][model][2] is not None:  # the device time less the node's execution
            a_off, b_off = [r["A"][model][2] for r in rounds], [r["B"][model][2] for r in rounds]
            report["models"][model].update(a_off_node_ms=statistics.median(a_off) * 1e3,
                                           b_off_node_ms=statistics.median(b_off) * 1e3)
        m = report["models"][model]
        versus = "captured/eager or of the step" if args.bench == "capture" else "device/local"
        print(f"{model}: A ({commit}) {m['a_ms']:.4g} ms, B ({args.b_name}) {m['b_ms']:.4g} ms, A/B {m['a_over_b']:.3f} "
              f"({m['a_over_b_range'][0]:.3f}-{m['a_over_b_range'][1]:.3f}); {versus} A {m['a_device_over_local']:.2f}x, "
              f"B {m['b_device_over_local']:.2f}x"
              + (f"; off the node A {m['a_off_node_ms']:.2f} ms, B {m['b_off_node_ms']:.2f} ms" if "a_off_node_ms" in m
                 else ""))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
