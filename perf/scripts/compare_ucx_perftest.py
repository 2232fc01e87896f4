#!/usr/bin/env python3
"""genie-bench against ucx_perftest on the same UCX transport, in one run, as ratios and a plot.

For each UCX_TLS (default: tcp and sm) on loopback and each message size (default 8 B, 4 KiB,
64 KiB, 1 MiB, 8 MiB, 64 MiB) it runs, one after the other:
  ucx_perftest tag_lat, tag_bw and ucp_am_bw
  genie-bench  latency, bandwidth
and prints genie-bench / ucx_perftest: bandwidth against the higher of tag_bw and ucp_am_bw,
latency against tag_lat. The targets (bandwidth at 1 MiB and 64 MiB >= 0.95; 8-byte latency
<= 1.10 on tcp and within 0.2 µs on sm) are marked in their rows. Both tools report half
round trips in microseconds and MB/s with MB = 2^20 bytes.

Latency rows also show `ucp_am_lat -e` with as many bytes as a genie-bench Ping carries (its
FlatBuffer header, 48 B, plus the payload): UCX's own active-message round trip for Genie's
message size, which is what genie-bench's latency adds its handling to.

ucx_perftest runs twice per point: with `-e` (endpoints with peer error handling, the mode
Genie's endpoints use, so the same UCX configuration: the primary ratio) and without (UCX's
fastest configuration, shown for reference).

    perf/scripts/compare_ucx_perftest.py [--tls tcp,sm] [--repeat 3] [--sizes 8,1M,64M]
        [--markdown FILE] [--json docs/perf/transport.json] [--png docs/perf/transport.png]
    perf/scripts/compare_ucx_perftest.py --tls sm --append      # add sm to the saved tcp runs
    perf/scripts/compare_ucx_perftest.py --plot-only docs/perf/transport.json   # nothing run

Each number is the best of --repeat rounds (highest bandwidth, lowest latency; --stat median
for medians), with the spread of the rounds beside it; a round runs every tool once per point
(alternated), so the machine's drift spreads over all of them. Server and client are pinned
to CPUs 0 and 1 (--no-pin leaves them to the scheduler). Every run is saved to --json, and
the PNG (log-x sizes; bandwidth and latency panels, one line per tool and UCX_TLS) is drawn from it;
--plot-only draws the PNG and prints the table again from a saved JSON. Iterations per point:
bandwidth about 1 GiB moved (100..100,000 messages), latency about 256 MiB (20..20,000).
On the 2-vCPU development VM a round takes about 4 minutes on tcp (0.8 GB/s) and 1.5 on sm.
Only loopback is used (UCX_NET_DEVICES=lo). ucx_perftest is the one of the UCX that build/
links: PyPI's libucx-cu13 in .venv (GENIE_UCX=pypi, the default), else the one on PATH (a
system UCX).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENIE_BENCH = ROOT / "build" / "bin" / "genie-bench"
MIB = 1 << 20
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# The tools of the table and the plot, in their order.
TOOLS = ("genie-bench", "ucx_perftest -e", "ucx_perftest")
# Latency only: ucp_am_lat -e with a genie-bench Ping's bytes (header + payload).
SAME_BYTES = "ucp_am_lat -e, Genie's bytes"
# (test, size) -> the target on genie-bench / ucx_perftest -e.
TARGETS = {("tcp", "latency", 8): "<= 1.10", ("sm", "latency", 8): "<= +0.2 µs",
           ("bandwidth", MIB): ">= 0.95", ("bandwidth", 64 * MIB): ">= 0.95"}


def parse_bytes(text):
    """'64K' -> 65536, '1M' -> 2^20, '8' -> 8 (powers of 2, as genie-bench's --sizes)."""
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 8, 64K, 1M)")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def format_bytes(size):
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


# ---- running the tools --------------------------------------------------------------------

def find_perftest():
    """ucx_perftest of the venv's libucx-cu13 (the UCX genie-bench links by default) and the
    folder of its libraries (the wheel's binary has no RPATH to them: without it, it would load
    a system libucp), else PATH's ucx_perftest."""
    python = ROOT / ".venv" / "bin" / "python"
    if python.exists():
        out = subprocess.run([str(python), "-c", "import libucx, os; print(os.path.dirname(libucx.__file__))"],
                             capture_output=True, text=True)
        folder = pathlib.Path(out.stdout.strip())
        if out.returncode == 0 and (folder / "bin" / "ucx_perftest").exists():
            return str(folder / "bin" / "ucx_perftest"), str(folder / "lib")
    return "ucx_perftest", None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tls, perftest_libs):
    env = dict(os.environ, UCX_TLS=tls, UCX_NET_DEVICES="lo")
    if perftest_libs:
        env["LD_LIBRARY_PATH"] = perftest_libs + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


PIN = True  # server on CPU 0, client on CPU 1 (main() sets it from --no-pin)


def pinned_to(cpu):
    """preexec_fn that binds the child (and the threads it starts) to `cpu`; None unpinned."""
    if not PIN or (os.cpu_count() or 1) < 2:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def run_pair(server_cmd, client_cmd, env, timeout=300):
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=pinned_to(0))
    try:
        time.sleep(0.7)
        out = subprocess.run(client_cmd, env=env, capture_output=True, text=True, timeout=timeout,
                             preexec_fn=pinned_to(1))
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, client_cmd))} failed:\n{out.stderr}")
    except BaseException:
        server.kill()  # interrupted or failed: the server would wait for a client forever
        server.wait()
        raise
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    return out.stdout


def perftest(perftest_bin, libs, tls, test, size, iterations, error_handling):
    """Returns (latency_us, bandwidth_mbs) from ucx_perftest's 'Final:' line."""
    port = free_port()
    env = env_for(tls, libs)
    flags = []
    if error_handling:
        flags = ["-e"]
        env["UCX_MM_ERROR_HANDLING"] = "y"  # as Genie sets it: shared memory with peer errors
    out = run_pair([perftest_bin, "-p", str(port)] + flags,
                   [perftest_bin, "-p", str(port), "127.0.0.1", "-t", test, "-s", str(size), "-n",
                    str(iterations), "-w", str(max(iterations // 10, 10))] + flags, env)
    for line in out.splitlines():
        if line.startswith("Final:"):
            fields = line.split()
            # Final: iters  lat50  lat_avg  lat_overall  bw_avg  bw_overall  rate_avg  rate_overall
            return float(fields[4]), float(fields[6])
    raise RuntimeError(f"no 'Final:' line from ucx_perftest {test}:\n{out}")


def genie(tls, test, size, iterations, window):
    """Returns (latency_us, bandwidth_mbs, lanes, header_bytes); window None: genie-bench's default."""
    port = free_port()
    command = [GENIE_BENCH, "127.0.0.1", "--port", str(port), "--tests", test, "--sizes", str(size),
               "--iterations", str(iterations), "--warmup", str(max(iterations // 10, 10)), "--json"]
    if window is not None:
        command += ["--window", str(window)]
    out = run_pair([GENIE_BENCH, "--server", "--once", "--port", str(port)], command, env_for(tls, None))
    result = json.loads(out)[0]
    return result["latency_us"], result["bandwidth_mbs"], result["transports"], result["header_bytes"]


def iterations_for(test, size):
    if test == "latency":
        return max(20, min(20000, (256 * MIB) // max(size, 1)))
    return max(100, min(100000, (1 << 30) // max(size, 1)))


def measure(args):
    """Every run as a record {round, tls, test, size, tool, name, iterations, value, lanes};
    value in µs (latency) or MB/s (bandwidth)."""
    perftest_bin, libs = find_perftest()
    runs = []

    def record(round_no, tls, test, size, tool, name, n, value, lanes=""):
        runs.append({"round": round_no, "tls": tls, "test": test, "size": size, "tool": tool, "name": name,
                     "iterations": n, "value": value, "lanes": lanes})
        unit = "us" if test == "latency" else "MB/s"
        print(f"round {round_no} {tls:<4} {test:<9} {format_bytes(size):>4} {tool:<16} {name:<10} "
              f"{value:12.2f} {unit}", file=sys.stderr, flush=True)

    for round_no in range(args.repeat):
        for tls in args.tls.split(","):
            for size in args.sizes:
                n = iterations_for("latency", size)
                lat, _, lanes, header = genie(tls, "latency", size, n, None)
                record(round_no, tls, "latency", size, "genie-bench", "latency", n, lat, lanes)
                for e in (True, False):
                    lat, _ = perftest(perftest_bin, libs, tls, "tag_lat", size, n, e)
                    record(round_no, tls, "latency", size, TOOLS[1] if e else TOOLS[2], "tag_lat", n, lat)
                lat, _ = perftest(perftest_bin, libs, tls, "ucp_am_lat", size + header, n, True)
                record(round_no, tls, "latency", size, SAME_BYTES, f"ucp_am_lat -s {size + header}", n, lat)
                n = iterations_for("bandwidth", size)
                _, bw, lanes, _ = genie(tls, "bandwidth", size, n, args.window)
                record(round_no, tls, "bandwidth", size, "genie-bench", "bandwidth", n, bw, lanes)
                for e in (True, False):
                    for name in ("tag_bw", "ucp_am_bw"):
                        _, bw = perftest(perftest_bin, libs, tls, name, size, n, e)
                        record(round_no, tls, "bandwidth", size, TOOLS[1] if e else TOOLS[2], name, n, bw)
    return runs


# ---- from the runs: medians, the table, the plot ------------------------------------------

def summarize(runs, stat="best"):
    """{(tls, test, size, tool): (value, name, lanes, min, max)}: value is the best round
    (highest bandwidth, lowest latency) or, with stat="median", the median; for ucx_perftest's
    bandwidth the better of tag_bw and ucp_am_bw (min and max are that test's)."""
    by_name = {}
    for r in runs:
        by_name.setdefault((r["tls"], r["test"], r["size"], r["tool"], r["name"]), []).append(r)
    best = {}
    for (tls, test, size, tool, name), sample in by_name.items():
        values = [r["value"] for r in sample]
        if stat == "median":
            value = statistics.median(values)
        else:
            value = min(values) if test == "latency" else max(values)
        key = (tls, test, size, tool)
        if key not in best or (value < best[key][0] if test == "latency" else value > best[key][0]):
            best[key] = (value, name, sample[0]["lanes"], min(values), max(values))
    return best


def table(runs, stat="best"):
    best = summarize(runs, stat)
    lines = ["| UCX_TLS | test | size (B) | genie-bench | ucx_perftest -e | ratio | ucx_perftest | ratio "
             f"| {SAME_BYTES} | target | genie lanes |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(entry, unit, named=True):
        value, name, _, low, high = entry
        spread = f" [{low:.2f}-{high:.2f}]" if high > low else ""
        return f"{value:.2f} {unit}{spread}" + (f" ({name})" if named else "")

    for tls, test, size in dict.fromkeys((r["tls"], r["test"], r["size"]) for r in runs):
        if any((tls, test, size, tool) not in best for tool in TOOLS):
            continue
        g, p_e, p = (best[(tls, test, size, tool)] for tool in TOOLS)
        unit = "µs" if test == "latency" else "MB/s"
        ratio_e = f"{g[0] / p_e[0]:.3f}" + (f" ({g[0] - p_e[0]:+.2f} µs)" if test == "latency" else "")
        same = best.get((tls, test, size, SAME_BYTES))
        target = TARGETS.get((tls, test, size), TARGETS.get((test, size), ""))
        lines.append(f"| {tls} | {test} | {size} | {cell(g, unit, named=False)} | {cell(p_e, unit)} "
                     f"| {ratio_e} | {cell(p, unit)} | {g[0] / p[0]:.3f} | {cell(same, unit) if same else ''} "
                     f"| {target} | {g[2]} |")
    return "\n".join(lines)


def plot(saved, png):
    """Bandwidth (MB/s) and latency (µs) against message size, log-log, one line per tool and
    UCX_TLS (best rounds or medians as saved["stat"], bars from the lowest to the highest run;
    ucx_perftest's bandwidth the better of tag_bw and ucp_am_bw)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stat = saved.get("stat", "median")
    best = summarize(saved["runs"], stat)
    tls_list = list(dict.fromkeys(r["tls"] for r in saved["runs"]))
    sizes = sorted({r["size"] for r in saved["runs"]})
    colors = dict(zip(TOOLS, ("tab:blue", "tab:orange", "tab:green")))
    styles = dict(zip(tls_list, ("-", "--", ":", "-.")))
    markers = dict(zip(tls_list, ("o", "s", "^", "D")))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, test, unit in ((axes[0], "bandwidth", "MB/s (MB = 2^20 B)"), (axes[1], "latency", "µs, half round trip")):
        for tls in tls_list:
            for tool in TOOLS:
                points = [(s, *best[(tls, test, s, tool)]) for s in sizes if (tls, test, s, tool) in best]
                if points:
                    x = [p[0] for p in points]
                    y = [p[1] for p in points]
                    spread = [[p[1] - p[4] for p in points], [p[5] - p[1] for p in points]]
                    ax.errorbar(x, y, yerr=spread, color=colors[tool], linestyle=styles[tls], marker=markers[tls],
                                capsize=2, elinewidth=0.8, label=f"{tool}, UCX_TLS={tls}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [format_bytes(s) for s in sizes])
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(unit)
        ax.set_title(test)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"genie-bench vs ucx_perftest on loopback: commit {saved['commit']}, {saved['date']}, "
                 f"{saved['machine']}; {stat} of {saved['repeat']}{', pinned' if saved.get('pinned') else ''}, "
                 "bars: lowest to highest run", fontsize=10)
    fig.tight_layout()
    pathlib.Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def write_markdown(path, saved, png, text):
    """Inserts a dated section above the first '## ' heading (the history, newest first)."""
    path = pathlib.Path(path)
    image = os.path.relpath(pathlib.Path(png).resolve(), path.resolve().parent)
    section = (f"## {saved['date']} (commit {saved['commit']}): {saved['machine']}, "
               f"{saved.get('stat', 'median')} of {saved['repeat']}\n\n"
               f"Command: `{saved['command']}`\n\n![genie-bench vs ucx_perftest]({image})\n\n{text}\n\n")
    old = path.read_text() if path.exists() else ""
    at = old.find("\n## ")
    path.write_text(old[:at + 1] + section + old[at + 1:] if at >= 0 else old + "\n" + section)


def merged(old, new):
    """`old`'s runs and `new`'s together; commands, commits and dates of both named."""
    both = dict(old, runs=old["runs"] + new["runs"], repeat=min(old["repeat"], new["repeat"]))
    for key in ("command", "commit", "date"):
        if new[key] != old[key]:
            both[key] = f"{old[key]}; {new[key]}" if key == "command" else f"{old[key]} and {new[key]}"
    return both


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tls", default="tcp,sm", help="UCX_TLS values, comma-separated (default: tcp,sm)")
    parser.add_argument("--sizes", default="8,4K,64K,1M,8M,64M",
                        help="message sizes, comma-separated (default: 8,4K,64K,1M,8M,64M)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, alternated (default: 3)")
    parser.add_argument("--stat", choices=("best", "median"), default="best",
                        help="each number: the best round or the median (default: best)")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave server and client to the scheduler (default: CPUs 0 and 1)")
    parser.add_argument("--window", type=int, default=None,
                        help="genie-bench messages in flight (default: genie-bench's own)")
    parser.add_argument("--json", default=str(ROOT / "docs" / "perf" / "transport.json"),
                        help="where every run is saved (default: docs/perf/transport.json)")
    parser.add_argument("--png", default=str(ROOT / "docs" / "perf" / "transport.png"),
                        help="where the plot goes (default: docs/perf/transport.png)")
    parser.add_argument("--append", action="store_true",
                        help="add this run's results to those already in --json (another UCX_TLS, say) "
                             "instead of replacing them")
    parser.add_argument("--plot-only", metavar="JSON",
                        help="draw --png and print the table from a saved --json file; run nothing")
    parser.add_argument("--markdown", help="also insert the results as a dated section at the top of this "
                                           "file's history (above its first '## ' heading)")
    args = parser.parse_args()

    global PIN
    PIN = not args.no_pin
    if args.plot_only:
        saved = json.loads(pathlib.Path(args.plot_only).read_text())
    else:
        if not GENIE_BENCH.exists():
            sys.exit(f"{GENIE_BENCH} is missing: run tools/setup.sh")
        args.sizes = [parse_bytes(s) for s in args.sizes.split(",")]
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        started = datetime.datetime.now(datetime.timezone.utc)
        # SIGTERM unwinds like Ctrl-C, so that the server of the run in progress is stopped.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        runs = measure(args)
        saved = {"command": "perf/scripts/compare_ucx_perftest.py " + " ".join(sys.argv[1:]), "commit": commit,
                 "date": started.strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": f"{platform.node()}, {os.cpu_count()} CPUs", "repeat": args.repeat, "stat": args.stat,
                 "pinned": PIN and (os.cpu_count() or 1) >= 2, "runs": runs}
        if args.append and pathlib.Path(args.json).exists():
            saved = merged(json.loads(pathlib.Path(args.json).read_text()), saved)
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(saved, indent=1) + "\n")
    text = table(saved["runs"], saved.get("stat", "median"))
    print(text)
    plot(saved, args.png)
    print(f"\nplot: {args.png}", file=sys.stderr)
    if args.markdown:
        write_markdown(args.markdown, saved, args.png, text)


if __name__ == "__main__":
    main()
