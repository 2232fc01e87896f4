"""``python -m genie.demo``: three real models run locally and on a Genie device, compared.

For each model (MiniLM sentence embeddings, GPT-2 greedy generation, ResNet-50 top-5), the
same inputs run on the CPU and on ``--device`` in one process. Each side gets one warm-up run
with the same inputs, then ``--rounds`` rounds of (local run, device run) follow, alternated so
that a machine whose speed drifts slows both sides alike; times are medians over the rounds
(wall time, result back on the CPU). Checks, every round: MiniLM cosine(local, device) ≥
0.9999 per sentence; GPT-2 token ids identical; ResNet-50 top-5 identical per image. Exit status: 0 all checks pass, 1 a check failed or a run raised,
2 the device could not be set up.

    python -m genie.demo                          # remote_accelerator:0, all models
    python -m genie.demo --device cpu --quick     # the harness alone, small inputs
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

from . import harness, models
from .table import print_table
from .measure import Counters, format_bytes, format_count, format_seconds, is_local, machine


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m genie.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="remote_accelerator:0", help="target device (default: %(default)s)")
    parser.add_argument("--models", default=",".join(models.MODEL_NAMES),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)")
    parser.add_argument("--quick", action="store_true",
                        help="small inputs: 4 sentences, 2 images, 4 new tokens (for tests)")
    parser.add_argument("--max-new-tokens", type=int, help="GPT-2 tokens to generate (default 32, --quick 4)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measured rounds of (local run, device run) after the warm-ups (default %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(models.MODEL_NAMES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(models.MODEL_NAMES)}")
    return args


def prepare_device(device: str) -> None:
    """Import Genie for a remote device (registers it) and connect (``genie.init()`` where it exists)."""
    if is_local(device):
        return
    import genie

    init = getattr(genie, "init", None)
    if init is not None:
        init()


def describe_inputs(workload) -> str:
    if isinstance(workload, models.MiniLM):
        return f"embed {len(workload.sentences)} sentences"
    if isinstance(workload, models.GPT2):
        return f"generate {workload.max_new_tokens} tokens"
    return f"forward batch {workload.images.shape[0]}"


def run_model(name: str, args, counters: Counters) -> dict:
    """Load, warm up each side, run ``args.rounds`` alternated (local, device) rounds, check
    every round. Returns the model's report (medians over the rounds)."""
    workload = harness.load(name, args.quick, args.max_new_tokens)
    report = {"model": name, "inputs": describe_inputs(workload),
              "parameter_bytes": models.parameter_bytes(workload.model), "rounds": args.rounds}
    harness.run_once(workload, workload.model, "cpu", Counters("cpu"))            # warm-up
    local_runs, device_runs = [], []
    try:
        model, uploaded = harness.upload(workload, args.device, counters)
        report["upload"] = {"seconds": uploaded.seconds, "counters": uploaded.counters}
        harness.run_once(workload, model, args.device, counters)                    # warm-up
        for _ in range(args.rounds):
            local_runs.append(harness.run_once(workload, workload.model, "cpu", Counters("cpu")))
            device_runs.append(harness.run_once(workload, model, args.device, counters))
    except Exception as error:  # the report names the failure; the other models still run
        if local_runs:
            report["local"] = run_report(harness.merge(local_runs))
        report.update(passed=False, error=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc())
        return report
    local, device = harness.merge(local_runs), harness.merge(device_runs)
    report["local"] = run_report(local)
    report["device"] = run_report(device)
    report["ratio"] = device.seconds / local.seconds if local.seconds > 0 else None
    checks = [harness.check(workload, lo.result, dev.result) for lo, dev in zip(local_runs, device_runs)]
    result = next((c for c in checks if not c.passed), checks[0])   # the first failing round, if any
    report.update(passed=all(c.passed for c in checks), check=result.summary, check_lines=result.lines,
                  check_details=result.details)
    del model
    return report


def run_report(stats: harness.RunStats) -> dict:
    out = {"seconds": stats.seconds, "counters": stats.counters}
    steps = stats.step_summary()
    if steps is not None:
        out["step"] = steps
    return out


def print_report(reports: list, args, counters: Counters, out) -> None:
    rows = []
    for r in reports:
        if "device" not in r:
            local_s = r["local"]["seconds"] if "local" in r else None
            rows.append((r["model"], r["inputs"], format_seconds(local_s), "error", "-", "-", "-", "-",
                         "FAIL"))
            continue
        dev = r["device"]
        c = dev["counters"] or {}
        rows.append((r["model"], r["inputs"], format_seconds(r["local"]["seconds"]), format_seconds(dev["seconds"]),
                     f"{r['ratio']:.2f}x", format_bytes(c.get("bytes_sent")), format_bytes(c.get("bytes_received")),
                     format_count(c.get("round_trips")), ("ok  " if r["passed"] else "FAIL ") + r["check"]))
        if "step" in dev:
            local_step, dev_step = r["local"]["step"]["median_s"], dev["step"]["median_s"]
            sc = dev["step"]["counters"] or {}
            ratio = f"{dev_step / local_step:.2f}x" if local_step and dev_step else "-"
            rows.append(("", f"decode step (median of {dev['step']['steps']})", format_seconds(local_step),
                         format_seconds(dev_step), ratio, format_bytes(sc.get("bytes_sent")),
                         format_bytes(sc.get("bytes_received")), format_count(sc.get("round_trips")), ""))
        up = r.get("upload") or {}
        uc = up.get("counters") or {}
        rows.append(("", f".to(device), {format_bytes(r['parameter_bytes'])} of weights", "-",
                     format_seconds(up.get("seconds")), "-", format_bytes(uc.get("bytes_sent")),
                     format_bytes(uc.get("bytes_received")), format_count(uc.get("round_trips")), ""))
    headers = ("model", "run", "local cpu", args.device, "device/local", "sent", "received", "round trips", "check")
    title = (f"Genie demo: each side warmed up once with the same inputs, then {args.rounds} alternated rounds "
             "(wall time, medians)")
    print_table(title, headers, rows, file=out)
    if not counters.available:
        print(f"counters: - ({counters.unavailable_reason})", file=out)
    for r in reports:
        c = (r.get("device") or {}).get("counters") or {}
        if "ops_recorded_cpp" in c:
            total = c["ops_recorded_cpp"] + c["ops_handled_python"]
            share = c["ops_recorded_cpp"] / total if total else 0.0
            print(f"{r['model']}: ops per run recorded in C++ {c['ops_recorded_cpp']} of {total} ({share:.1%}), "
                  f"handed to Python {c['ops_handled_python']} (reads and host transfers)", file=out)
    for r in reports:
        for line in r.get("check_lines", []):
            print(line, file=out)
        if "error" in r:
            print(f"{r['model']}: device run failed: {r['error']}", file=out)
            print(r["traceback"], file=sys.stderr)


def main(argv=None) -> int:
    args = parse_args(argv)
    harness.quiet_libraries()
    try:
        prepare_device(args.device)
    except Exception as error:
        print(f"genie.demo: cannot set up device {args.device}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    counters = Counters(args.device)
    out = sys.stderr if args.json == "-" else sys.stdout   # stdout stays JSON only
    reports = []
    for name in args.models:
        print(f"running {name} on cpu and {args.device} ...", file=out, flush=True)
        reports.append(run_model(name, args, counters))
    print_report(reports, args, counters, out)
    passed = all(r["passed"] for r in reports)
    print("all checks passed" if passed else "CHECKS FAILED: " + ", ".join(r["model"] for r in reports if not r["passed"]),
          file=out)
    if args.json:
        document = {"machine": machine(), "device": args.device, "quick": args.quick,
                    "timing": f"one warm-up run per side, then {args.rounds} alternated (local, device) rounds; "
                              "medians over the rounds; decode step = median over every round's steps",
                    "counters_available": counters.available, "passed": passed,
                    "models": [{k: v for k, v in r.items() if k not in ("check_lines", "traceback")} for r in reports]}
        text = json.dumps(document, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
