#!/usr/bin/env python3
"""genie-bench's window, iterations and warm-up swept, to choose its defaults by measurement.

Runs genie-bench (server and client on loopback, UCX_NET_DEVICES=lo) once per point of the
grid  UCX_TLS x window x volume x warm-up x size,  in --repeat rounds. Within a round every
configuration runs once, in an order shuffled per round (seeded), so that the VM's slow drift
spreads over all configurations instead of favouring whichever ran first. Each run starts a
fresh server (`--server --once`) and one client, as a user's run does.

Iterations of a configuration: `volume / size` clamped to [--min-iterations,
--max-iterations], as genie-bench's own default ("by size"); `default` runs genie-bench
without -n, -w and --window, i.e. whatever the binary defaults to. Warm-up: `10%` of the
iterations (at least 10), a byte volume (`256M`: that many bytes' worth of messages, at least
10), or a count (`50`).

    perf/scripts/sweep_bench_defaults.py --tls tcp,sm --windows 8,16,32,64 --repeat 5
    perf/scripts/sweep_bench_defaults.py --windows 32 --volume 1G,4G --warmup 10%,50% --json out.json
    perf/scripts/sweep_bench_defaults.py --windows default --volume default --bench old=/tmp/genie-bench
    perf/scripts/sweep_bench_defaults.py --summarize out.json     # the table again, nothing run

Prints a Markdown table per UCX_TLS: for each configuration and size the median over the
rounds (MB/s, MB = 2^20 bytes; 8-byte latency in µs, half round trip), the min-max range,
and the median wall time of one client run (seconds, UCX start-up and warm-up included).
Both ends busy-poll, so on a small machine any other program's CPU time spoils a run: before
each run the script waits until other programs use fewer than --max-other CPUs, records the
CPUs they used during the run (/proc/stat less the two genie-bench processes' own time), and
leaves runs above --max-other out of the table (not out of --json). Another benchmark at the
same time spoils them too: run it under `flock /tmp/genie-perf.lock` where others measure on
the same machine.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib
import platform
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENIE_BENCH = ROOT / "build" / "bin" / "genie-bench"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """'64K' -> 65536, '1M' -> 2^20, '8' -> 8 (K, M, G are powers of 2, as genie-bench's --sizes)."""
    match = re.fullmatch(r"(\d+)([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 8, 64K, 1M, 4G)")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def format_bytes(size: int) -> str:
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


# ---- the machine's other load ------------------------------------------------------------

def cpu_seconds() -> tuple[float, float]:
    """(busy, stolen): CPU seconds on all CPUs since boot that programs used (/proc/stat: user
    nice system irq softirq) and that the hypervisor gave to other guests (steal)."""
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick, fields[7] / tick


def busy_seconds() -> float:
    return cpu_seconds()[0]


def children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_until_quiet(max_cores: float, timeout: float) -> float:
    """Waits (up to `timeout` s) until other programs use under `max_cores` CPUs over 0.5 s;
    returns the last sample (CPUs busy)."""
    deadline = time.monotonic() + timeout
    while True:
        before = busy_seconds()
        time.sleep(0.5)
        cores = (busy_seconds() - before) / 0.5
        if cores < max_cores or time.monotonic() > deadline:
            return cores


# ---- one genie-bench run ------------------------------------------------------------------

def start_server(bench: str, env: dict) -> tuple[subprocess.Popen, int]:
    """Starts `genie-bench --server --once --port 0` and returns it with the port it reports."""
    server = subprocess.Popen([bench, "--server", "--once", "--port", "0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    for line in server.stderr:
        match = re.search(r"serving on port (\d+)", line)
        if match:
            # Keep draining stderr so that later warnings never block the server.
            threading.Thread(target=server.stderr.read, daemon=True).start()
            return server, int(match.group(1))
        if time.monotonic() > deadline:
            break
    server.kill()
    raise RuntimeError(f"{bench} --server did not report its port")


def run_bench(bench: str, tls: str, test: str, size: int, window, iterations, warmup, window_bytes=None) -> dict:
    """One client run against a fresh server; genie-bench's JSON result plus wall_s."""
    env = dict(os.environ, UCX_TLS=tls, UCX_NET_DEVICES="lo")
    (busy_before, stolen_before), ours_before, span_start = cpu_seconds(), children_seconds(), time.monotonic()
    server, port = start_server(bench, env)
    command = [bench, "127.0.0.1", "--port", str(port), "--tests", test, "--sizes", str(size), "--json"]
    if iterations is not None:
        command += ["--iterations", str(iterations), "--warmup", str(warmup)]
    if window is not None:
        command += ["--window", str(window)]
    if window_bytes is not None and test == "bandwidth":
        command += ["--window-bytes", window_bytes]
    try:
        start = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - start
    except BaseException:
        server.kill()  # interrupted: the server would wait for a client forever
        server.wait()
        raise
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    span = time.monotonic() - span_start
    busy_after, stolen_after = cpu_seconds()
    others = (busy_after - busy_before) - (children_seconds() - ours_before)
    result = json.loads(done.stdout)[0]
    result["wall_s"] = wall
    result["other_cores"] = max(others, 0.0) / span  # CPUs that other programs used meanwhile
    result["stolen_cores"] = (stolen_after - stolen_before) / span  # CPUs the hypervisor took
    return result


# ---- the grid -----------------------------------------------------------------------------

def iterations_for(volume: int, size: int, low: int, high: int) -> int:
    return max(low, min(high, volume // max(size, 1)))


def warmup_for(spec: str, iterations: int, size: int) -> int:
    if spec.endswith("%"):
        return max(iterations * int(spec[:-1]) // 100, 10)
    if re.fullmatch(r"\d+", spec):
        return int(spec)
    return max(parse_bytes(spec) // max(size, 1), 10)


def configurations(args) -> list[dict]:
    """Every (bench, window, volume, warm-up) of the command line, as dicts with a label."""
    configs = []
    for (bench_label, bench), window, volume, warmup in itertools.product(
            args.bench, args.windows, args.volume, args.warmup):
        if volume == "default" and warmup != args.warmup[0]:
            continue  # without -n, the warm-up is genie-bench's own: one configuration is enough
        label = f"w={window} n={'default' if volume == 'default' else format_bytes(volume)}"
        if volume != "default":
            label += f" warm={warmup}"
        if len(args.bench) > 1:
            label = f"{bench_label} {label}"
        configs.append({"label": label, "bench": bench, "bench_label": bench_label,
                        "window": None if window == "default" else int(window),
                        "volume": None if volume == "default" else volume, "warmup": warmup})
    return configs


def measure(args) -> list[dict]:
    configs = configurations(args)
    shuffle = random.Random(args.seed)
    runs = []
    points = [(test, size) for test in ("latency",) for size in args.latency_sizes]
    points += [("bandwidth", size) for size in args.sizes]
    for round_no in range(args.repeat):
        for tls in args.tls:
            order = list(configs)
            shuffle.shuffle(order)
            for config in order:
                for test, size in points:
                    iterations = warmup = None
                    if config["volume"] is not None:
                        volume = config["volume"] if test == "bandwidth" else args.latency_volume
                        iterations = iterations_for(volume, size, args.min_iterations, args.max_iterations)
                        warmup = warmup_for(config["warmup"], iterations, size)
                    window = config["window"] if test == "bandwidth" else None
                    wait_until_quiet(args.max_other, args.quiet_timeout)
                    run = {"round": round_no, "tls": tls, "config": config["label"], "window": config["window"],
                           "volume": config["volume"], "warmup_spec": config["warmup"], "warmup": warmup,
                           "test": test, "size": size, "iterations": iterations}
                    try:
                        run.update(run_bench(config["bench"], tls, test, size, window, iterations, warmup,
                                             args.window_bytes))
                        value = (f"{run['latency_us']:.2f} us" if test == "latency"
                                 else f"{run['bandwidth_mbs']:.0f} MB/s")
                        value += (f" {run['wall_s']:6.2f} s others {run['other_cores']:.2f} CPUs"
                                  f" stolen {run['stolen_cores']:.2f}")
                    except RuntimeError as error:  # a failed run is a result too: counted in the table
                        run["error"] = str(error).strip().splitlines()[-1]
                        value = "FAILED: " + run["error"]
                    runs.append(run)
                    print(f"round {round_no} {tls:<4} {config['label']:<32} {test:<9} {format_bytes(size):>4} "
                          f"n={run['iterations']} {value}", file=sys.stderr, flush=True)
    return runs


# ---- the table ----------------------------------------------------------------------------

def natural_key(label: str) -> list:
    """'w=8 n=1G' before 'w=16 n=1G': numbers compare as numbers, units by size."""
    return [parse_bytes(part) if re.fullmatch(r"\d+[KMG]?", part) else part
            for part in re.split(r"(\d+[KMG]?)", label)]


def summarize(all_runs: list[dict], max_other: float, baseline: str | None = None) -> str:
    """Markdown: per UCX_TLS, one row per configuration; per point median (min-max), wall time.
    Runs during which other programs used `max_other` CPUs or more are left out."""
    out = []
    for tls in dict.fromkeys(r["tls"] for r in all_runs):
        every = [r for r in all_runs if r["tls"] == tls]
        failed = [r for r in every if "error" in r]
        mine = [r for r in every if "error" not in r and r["other_cores"] < max_other]
        points = list(dict.fromkeys((r["test"], r["size"]) for r in every))
        configs = list(dict.fromkeys(r["config"] for r in every))
        rounds = len({r["round"] for r in every})
        head = ["configuration"]
        for test, size in points:
            head.append(f"latency {format_bytes(size)} B, µs" if test == "latency"
                        else f"bw {format_bytes(size)}, MB/s")
        head.append("client wall time, s")
        out.append(f"UCX_TLS={tls}, {rounds} rounds: median (min-max) of the {len(mine)} runs of {len(every)} "
                   f"during which other programs used < {max_other} CPUs; {len(failed)} runs failed\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for config in sorted(configs, key=natural_key):
            cells, wall_per_round = [config], {}
            for test, size in points:
                sample = [r for r in mine if r["config"] == config and r["test"] == test and r["size"] == size]
                key = "latency_us" if test == "latency" else "bandwidth_mbs"
                values = [r[key] for r in sample]
                digits = 2 if test == "latency" else 0
                cell = (f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-"
                        f"{max(values):,.{digits}f})" if values else "-")
                sample = [r for r in every if r["config"] == config and r["test"] == test and r["size"] == size
                          and "error" not in r]
                errors = sum(1 for r in failed if r["config"] == config and r["test"] == test and r["size"] == size)
                cells.append(cell + (f", **{errors} failed**" if errors else ""))
                for r in sample:
                    wall_per_round[r["round"]] = wall_per_round.get(r["round"], 0) + r["wall_s"]
            cells.append(f"{statistics.median(wall_per_round.values()):.1f}" if wall_per_round else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out += paired_ratios(mine, points, sorted(configs, key=natural_key), baseline)
    return "\n".join(out)


def paired_ratios(runs: list[dict], points: list, configs: list[str], baseline: str | None) -> list[str]:
    """Markdown lines: each configuration against `baseline` (default: the first) as the ratio
    of the two runs of the same round, median (min-max) over the rounds where both counted.
    Pairing takes out the machine's slow drift, which moves both runs of a round alike."""
    baseline = baseline or configs[0]
    if baseline not in configs or len(configs) < 2:
        return []
    value = {(r["config"], r["test"], r["size"], r["round"]):
             r["latency_us"] if r["test"] == "latency" else r["bandwidth_mbs"] for r in runs}
    out = [f"Against `{baseline}` in the same round (ratio, > 1 is faster; latency as baseline / value): "
           "median (min-max)\n", "| configuration | " + " | ".join(
               f"{test} {format_bytes(size)}" for test, size in points) + " |", "|" + "---|" * (len(points) + 1)]
    for config in configs:
        if config == baseline:
            continue
        cells = [config]
        for test, size in points:
            ratios = []
            for (c, t, z, round_no), v in value.items():
                b = value.get((baseline, t, z, round_no))
                if c == config and (t, z) == (test, size) and b:
                    ratios.append(b / v if test == "latency" else v / b)
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), {len(ratios)} "
                         f"rounds" if ratios else "-")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tls", type=comma_list, default=["tcp", "sm"], help="UCX_TLS values (default: tcp,sm)")
    parser.add_argument("--windows", type=comma_list, default=["8", "16", "32", "64"],
                        help="bandwidth messages in flight; 'default' passes no --window (default: 8,16,32,64)")
    parser.add_argument("--volume", type=comma_list, default=["1G"],
                        help="bytes moved per bandwidth run, iterations = volume / size; 'default' passes no "
                             "-n/-w (default: 1G)")
    parser.add_argument("--warmup", type=comma_list, default=["10%"],
                        help="warm-up: percent of iterations, bytes (256M) or a count (default: 10%%)")
    parser.add_argument("--window-bytes", metavar="BYTES",
                        help="passed to genie-bench's bandwidth runs (0 lifts its bound on bytes in flight; "
                             "default: genie-bench's own; builds before --window-bytes existed take none)")
    parser.add_argument("--min-iterations", type=int, default=100, help="lower clamp of iterations (default: 100)")
    parser.add_argument("--max-iterations", type=int, default=100000, help="upper clamp (default: 100000)")
    parser.add_argument("--sizes", type=comma_list, default=["64K", "1M", "64M"],
                        help="bandwidth payload sizes (default: 64K,1M,64M)")
    parser.add_argument("--latency-sizes", type=comma_list, default=["8"],
                        help="latency payload sizes, window not used (default: 8; '' for none)")
    parser.add_argument("--latency-volume", type=parse_bytes, default=None,
                        help="bytes per latency run (default: the first --volume)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each configuration runs once per round")
    parser.add_argument("--seed", type=int, default=1, help="seed of the per-round order (default: 1)")
    parser.add_argument("--bench", action="append", default=None, metavar="[LABEL=]PATH",
                        help=f"genie-bench binary, repeatable to alternate builds (default: {GENIE_BENCH})")
    parser.add_argument("--max-other", type=float, default=0.2,
                        help="before each run wait until other programs use fewer CPUs than this; runs during "
                             "which they used more are left out of the table (default: 0.2)")
    parser.add_argument("--quiet-timeout", type=float, default=120,
                        help="longest wait for a quiet machine before a run, s (default: 120)")
    parser.add_argument("--baseline", metavar="LABEL",
                        help="configuration the others are compared with round by round (default: the first "
                             "in the table, e.g. 'w=8 n=1G warm=10%%')")
    parser.add_argument("--json", help="write every run (and the command) to this JSON file")
    parser.add_argument("--summarize", metavar="JSON", help="print the table of a saved --json file; run nothing")
    args = parser.parse_args()

    if args.summarize:
        saved = json.loads(pathlib.Path(args.summarize).read_text())
        print(f"Command: `{saved['command']}` (commit {saved['commit']}, {saved['date']})\n")
        print(summarize(saved["runs"], args.max_other, args.baseline))
        return 0

    args.sizes = [parse_bytes(s) for s in args.sizes]
    args.latency_sizes = [parse_bytes(s) for s in args.latency_sizes]
    args.volume = [v if v == "default" else parse_bytes(v) for v in args.volume]
    if args.latency_volume is None:
        args.latency_volume = next((v for v in args.volume if v != "default"), 1 << 30)
    benches = args.bench or [str(GENIE_BENCH)]
    args.bench = [tuple(b.split("=", 1)) if "=" in b else (pathlib.Path(b).name, b) for b in benches]
    for _, bench in args.bench:
        if not pathlib.Path(bench).exists():
            sys.exit(f"{bench} is missing: build it (ninja -C build genie-bench)")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    started = datetime.datetime.now(datetime.timezone.utc)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the server of the run in progress
    runs = measure(args)
    command = "perf/scripts/sweep_bench_defaults.py " + " ".join(sys.argv[1:])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "command": command, "commit": commit, "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs", "runs": runs}, indent=1) + "\n")
    print(f"Command: `{command}` (commit {commit}, {started:%Y-%m-%d %H:%M UTC})\n")
    print(summarize(runs, args.max_other, args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
