#!/usr/bin/env python3
"""genie-bench against ucx_perftest on the same UCX transport, in one run, as ratios.

For each UCX_TLS (default: tcp and sm) on loopback it runs, one after the other:
  ucx_perftest tag_lat (8 B), tag_bw and ucp_am_bw (1 MiB, 64 MiB)
  genie-bench  latency (8 B), bandwidth (1 MiB, 64 MiB)
and prints genie-bench / ucx_perftest: bandwidth against the higher of tag_bw and
ucp_am_bw (target >= 0.95), latency against tag_lat (target <= 1.10). Both tools report
half round trips in microseconds and MB/s with MB = 2^20 bytes.

ucx_perftest runs twice per point: with `-e` (endpoints with peer error handling, the mode
Genie's endpoints use, so the same UCX configuration: the primary ratio) and without (UCX's
fastest configuration, shown for reference).

    perf/scripts/compare_ucx_perftest.py [--tls tcp,sm] [--repeat 3] [--markdown FILE]

Each pair of numbers is the median of --repeat runs. Only loopback is used
(UCX_NET_DEVICES=lo). ucx_perftest is the one of the UCX that build/ links: PyPI's libucx-cu13
in .venv (GENIE_UCX=pypi, the default), else the one on PATH (a system UCX).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENIE_BENCH = ROOT / "build" / "bin" / "genie-bench"
MIB = 1 << 20


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


UCX_PERFTEST, UCX_PERFTEST_LIBS = find_perftest()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tls):
    env = dict(os.environ, UCX_TLS=tls, UCX_NET_DEVICES="lo")
    if UCX_PERFTEST_LIBS:
        env["LD_LIBRARY_PATH"] = UCX_PERFTEST_LIBS + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


def run_pair(server_cmd, client_cmd, env, timeout=300):
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.7)
        out = subprocess.run(client_cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, client_cmd))} failed:\n{out.stderr}")
        return out.stdout
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def perftest(tls, test, size, iterations, error_handling):
    """Returns (latency_us, bandwidth_mbs) from ucx_perftest's 'Final:' line."""
    port = free_port()
    env = env_for(tls)
    flags = []
    if error_handling:
        flags = ["-e"]
        env["UCX_MM_ERROR_HANDLING"] = "y"  # as Genie sets it: shared memory with peer errors
    out = run_pair([UCX_PERFTEST, "-p", str(port)] + flags,
                   [UCX_PERFTEST, "-p", str(port), "127.0.0.1", "-t", test, "-s", str(size), "-n",
                    str(iterations), "-w", str(max(iterations // 10, 10))] + flags, env)
    for line in out.splitlines():
        if line.startswith("Final:"):
            fields = line.split()
            # Final: iters  lat50  lat_avg  lat_overall  bw_avg  bw_overall  rate_avg  rate_overall
            return float(fields[4]), float(fields[6])
    raise RuntimeError(f"no 'Final:' line from ucx_perftest {test}:\n{out}")


def genie(tls, test, size, iterations, window):
    port = free_port()
    out = run_pair([GENIE_BENCH, "--server", "--once", "--port", str(port)],
                   [GENIE_BENCH, "127.0.0.1", "--port", str(port), "--tests", test, "--sizes", str(size),
                    "--iterations", str(iterations), "--warmup", str(max(iterations // 10, 10)),
                    "--window", str(window), "--json"], env_for(tls))
    result = json.loads(out)[0]
    return result["latency_us"], result["bandwidth_mbs"], result["transports"]


def iterations_for(size):
    return max(100, min(100000, (1 << 30) // max(size, 1)))


def median_of(repeat, fn):
    runs = [fn() for _ in range(repeat)]
    return tuple(statistics.median(r[i] for r in runs) for i in range(2)) + tuple(runs[0][2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tls", default="tcp,sm")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=32, help="genie-bench messages in flight")
    parser.add_argument("--markdown", help="append the results as a markdown section to this file")
    args = parser.parse_args()
    if not GENIE_BENCH.exists():
        sys.exit(f"{GENIE_BENCH} is missing: run tools/setup.sh")

    rows = []
    for tls in args.tls.split(","):
        lat_iters = 20000
        g_lat = median_of(args.repeat, lambda: genie(tls, "latency", 8, lat_iters, 1))
        p_lat = {e: median_of(args.repeat, lambda: perftest(tls, "tag_lat", 8, lat_iters, e)) for e in (True, False)}
        rows.append((tls, "latency", 8, g_lat[0], "tag_lat", p_lat[True][0], "tag_lat", p_lat[False][0],
                     "<= 1.10", g_lat[2]))
        for size in (MIB, 64 * MIB):
            n = iterations_for(size)
            g = median_of(args.repeat, lambda: genie(tls, "bandwidth", size, n, args.window))
            best = {}
            for e in (True, False):
                tag = median_of(args.repeat, lambda: perftest(tls, "tag_bw", size, n, e))
                am = median_of(args.repeat, lambda: perftest(tls, "ucp_am_bw", size, n, e))
                best[e] = (tag[1], "tag_bw") if tag[1] >= am[1] else (am[1], "ucp_am_bw")
            rows.append((tls, "bandwidth", size, g[1], best[True][1], best[True][0], best[False][1], best[False][0],
                         ">= 0.95", g[2]))

    header = ("| UCX_TLS | test | size (B) | genie-bench | ucx_perftest -e | ratio | ucx_perftest | ratio | target "
              "| genie lanes |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [header]
    for tls, test, size, g, name_e, p_e, name, p, target, lanes in rows:
        unit = "µs" if test == "latency" else "MB/s"
        lines.append(f"| {tls} | {test} | {size} | {g:.2f} {unit} | {p_e:.2f} {unit} ({name_e}) | {g / p_e:.3f} "
                     f"| {p:.2f} {unit} ({name}) | {g / p:.3f} | {target} | {lanes} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(args.markdown, "a") as f:
            f.write(f"\n### {stamp}, {platform.node()} ({os.cpu_count()} cores), median of {args.repeat}\n\n")
            f.write(f"Command: `perf/scripts/compare_ucx_perftest.py --tls {args.tls} --repeat {args.repeat} "
                    f"--window {args.window}`\n\n{table}\n")


if __name__ == "__main__":
    main()
