#!/usr/bin/env python3
"""Reliability benchmarks against one real genie-node: many clients at once (load) and a long decode (soak).

Both start their own ``genie-node --listen 127.0.0.1:0`` and read its process from /proc
(resident memory, threads, open descriptors); the clients are separate processes using the
Python frontend (``genie.init(server=...)``, tensors on ``remote_accelerator:0``).

  load   ``--clients`` processes connect (started a few at a time), each uploads a small model
         (seeded per client) and checks one warm-up step; when all are connected (a barrier)
         each runs steps for ``--seconds``, checking EVERY result against the same step on the
         CPU (``torch.testing.assert_close``). Reports steps, steps/s, mismatches, errors, the
         step latency p50/p99, the node's RSS / threads / fds at start, with all connected, at
         peak and after all left, and the sessions ``genie-node --stats`` counts after they left.
  soak   one client generates greedily with GPT-2 (``genie.demo``'s loader: 124M, random
         weights, seed 0) in rounds of ``--decode-per-round`` decode steps until ``--steps``,
         checking every round's tokens against the first round's and sampling the node's and
         the client's RSS after every round; reports the RSS after warm-up (round 2), its
         min / max / end over the rest and its least-squares slope over rounds 3..end.

    UCX_NET_DEVICES=lo perf/bench_reliability.py load --clients 64 --seconds 60 --json load.json
    UCX_NET_DEVICES=lo perf/bench_reliability.py soak --steps 10000 --json soak.json
    UCX_NET_DEVICES=lo perf/bench_reliability.py load --clients 4 --seconds 5     # a quick look

Client processes of ``load`` come from a ``forkserver`` that has imported torch (and
transformers) once, with one thread (OMP/OpenBLAS threads 1), before any genie import: each
client is still its own process with its own genie session and UCX context (genie is imported
after the fork), but shares torch's ~0.3 GiB of import-time memory with the others. With
``--start-method spawn`` every client imports torch itself: ~0.4 GiB private memory each,
64 of them ~26 GiB. Exit status 0 when every check passed, 1 when one failed, 2 on a set-up
error.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import multiprocessing as mp
import os
import pathlib
import platform
import queue as queue_module
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_NODE = ROOT / "build" / "bin" / "genie-node"
DEVICE = "remote_accelerator:0"
LISTENING = re.compile(r"genie-node listening on (\S+):(\d+)")


# --------------------------------------------------------------------------------------------
# The node: one genie-node process, read from /proc

def proc_sample(pid: int) -> dict:
    """The process's resident memory (VmRSS, KiB), threads and open descriptors, from /proc/<pid>."""
    sample = {"time": time.time()}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                sample["rss_kib"] = int(value.split()[0])
            elif key == "Threads":
                sample["threads"] = int(value)
    try:
        sample["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        sample["fds"] = None
    return sample


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith("MemAvailable:")).split()[1])


def pss_kib(pid: int) -> int | None:
    """Proportional set size (shared pages divided among their processes), KiB; ``None`` if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return int(next(line for line in f if line.startswith("Pss:")).split()[1])
    except (OSError, StopIteration):
        return None


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    total = sum(fields[:8])                                      # guest time is already in user
    return total - idle, total


def process_jiffies(pid: int | str = "self") -> int:
    """utime + stime of the process (its threads included), in clock ticks; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def other_cpu_share(before: dict, after: dict) -> float | None:
    """The machine's CPU time between two ``cpu_snapshot`` s that was NOT ours, as a share of all of it (0..1)."""
    total = after["total"] - before["total"]
    if total <= 0:
        return None
    ours = sum(after["pids"].get(pid, 0) - before["pids"].get(pid, 0) for pid in after["pids"] if pid in before["pids"])
    return max(0.0, (after["busy"] - before["busy"] - ours) / total)


def cpu_snapshot(pids) -> dict:
    busy, total = machine_jiffies()
    return {"busy": busy, "total": total, "pids": {pid: process_jiffies(pid) for pid in pids}}


def rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


class Node:
    """A ``genie-node --listen 127.0.0.1:0`` started by this script; its standard error goes to ``log``."""

    def __init__(self, binary: str | os.PathLike, log: str | os.PathLike, extra_args=(), start_timeout: float = 30.0):
        self.binary = str(binary)
        self.log_path = str(log)
        self.command = [self.binary, "--listen", "127.0.0.1:0", "--log-level", "warn", *extra_args]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                        env=env)
        self.pid = self.process.pid
        line = self._first_line(start_timeout)
        match = LISTENING.search(line)
        if not match:
            self.stop()
            raise RuntimeError(f"genie-node did not say where it listens (stdout: {line!r}; stderr: {self.stderr_tail()!r})")
        self.host, self.port = match.group(1), int(match.group(2))
        self.address = f"{self.host}:{self.port}"
        self.banner = line.strip()
        # Nothing else is printed on stdout; drain it anyway so that the node can never block on it.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def _first_line(self, timeout: float) -> str:
        result: list[bytes] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return result[0].decode(errors="replace") if result else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def sample(self) -> dict | None:
        try:
            return proc_sample(self.pid) if self.alive() else None
        except (OSError, ValueError):
            return None

    def stats(self, timeout: float = 30.0) -> dict:
        """``genie-node --stats``, parsed. Its own connection is a session too: ``sessions`` counts it."""
        done = subprocess.run([self.binary, "--stats", self.address], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"genie-node --stats failed ({done.returncode}): {done.stderr.strip()}")
        stats: dict = {"resident_bytes": {}}
        for line in done.stdout.splitlines():
            if line.startswith("resident bytes"):
                _, _, name, value = line.split(None, 3)
                stats["resident_bytes"][name] = int(value)
            elif line.strip():
                key, value = line.rsplit(None, 1)
                stats[key.strip().replace(" (s)", "_s").replace(" ", "_")] = float(value) if "." in value else int(value)
        return stats

    def wait_sessions(self, sessions: int, timeout: float) -> dict:
        """Poll ``--stats`` until it counts ``sessions`` (its own included) or ``timeout`` passes; the last stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats.get("sessions") == sessions or time.monotonic() > deadline:
                return stats
            time.sleep(0.5)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then the exit status (SIGKILL after ``timeout``)."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def stderr_tail(self, lines: int = 40) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            text = pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stderr_counts(self) -> dict:
        if not self._log.closed:
            self._log.flush()
        text = pathlib.Path(self.log_path).read_text(errors="replace")
        return {level: len(re.findall(rf"\] \[{level}\]", text)) for level in ("warning", "error", "critical")}


class Monitor:
    """Samples the node every ``interval`` seconds on a thread; keeps every sample with the phase it fell in."""

    def __init__(self, node: Node, interval: float = 0.2):
        self.node, self.interval = node, interval
        self.samples: list[dict] = []
        self.phase = "start"
        self.mem_available_min_kib = None   # the machine's MemAvailable, lowest seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            sample = self.node.sample()
            available = mem_available_kib()
            self.mem_available_min_kib = min(self.mem_available_min_kib or available, available)
            if sample is not None:
                sample["phase"] = self.phase
                self.samples.append(sample)
            self._stop.wait(self.interval)

    def peak(self) -> dict:
        """The largest RSS, threads and fds seen (each its own maximum)."""
        return {key: max((s[key] for s in self.samples if s.get(key) is not None), default=None)
                for key in ("rss_kib", "threads", "fds")}


# --------------------------------------------------------------------------------------------
# Small statistics

def percentile(values, q: float):
    """Nearest-rank percentile (q in 0..100) of ``values``; ``None`` when empty."""
    values = sorted(values)
    if not values:
        return None
    rank = max(1, math.ceil(q / 100 * len(values)))
    return values[rank - 1]


def least_squares_slope(xs, ys) -> float | None:
    """The slope of the least-squares line through (xs, ys); ``None`` for fewer than two points."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def machine() -> dict:
    """Where it ran (the same fields on both subcommands)."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    with open("/proc/meminfo") as f:
        mem_total_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    try:
        status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "transport", "include",
                                 "tools", "python", "schemas"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        status = ""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "uncommitted_product_files": [line[3:] for line in status.splitlines()],
        "host": platform.node(),
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "mem_total_kib": mem_total_kib,
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "ucx_net_devices": os.environ.get("UCX_NET_DEVICES"),
    }


def provenance(node_binary: str) -> dict:
    """What ran: the genie-node binary and the genie package the clients import (paths, modification times)."""
    import importlib.util

    def mtime(path):
        try:
            return datetime.datetime.fromtimestamp(os.stat(path).st_mtime, datetime.timezone.utc).isoformat(
                timespec="seconds")
        except OSError:
            return None

    spec = importlib.util.find_spec("genie")   # finds, does not import (no torch here)
    package = pathlib.Path(spec.origin).parent if spec and spec.origin else None
    # genie._C may live apart from the sources (an editable install keeps it in site-packages).
    places = [pathlib.Path(p) / "genie" for p in spec.submodule_search_locations or []] if spec else []
    places += [pathlib.Path(p) / "genie" for p in sys.path if p]
    extension = next((so for place in places if place.is_dir() for so in sorted(place.glob("_C*.so"))), None)
    return {"node_binary": str(node_binary), "node_binary_mtime": mtime(node_binary),
            "genie_package": str(package) if package else None,
            "genie_extension": str(extension) if extension else None,
            "genie_extension_mtime": mtime(extension) if extension else None}


def format_kib(kib) -> str:
    if kib is None:
        return "-"
    return f"{kib / 1024:.1f} MiB" if abs(kib) < 1024 * 1024 else f"{kib / 1024 / 1024:.2f} GiB"


def format_ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def print_table(title: str, headers, rows, file=None) -> None:
    """A ``rich`` table (plain columns where rich is missing); every column after the first is right-aligned."""
    file = file or sys.stdout
    rows = [tuple(str(x) for x in row) for row in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=file)
        widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
        for row in (headers, *rows):
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)), file=file)
        return
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(file=file, width=120).print(table)


def write_json(document: dict, path: str | None) -> None:
    if not path:
        return
    text = json.dumps(document, indent=2)
    if path == "-":
        print(text)
    else:
        pathlib.Path(path).write_text(text + "\n")


def quiet_environment() -> None:
    """Offline, no progress bars (inherited by the clients)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def import_genie():
    """``import genie`` from the installed package, else from this checkout's python/."""
    try:
        import genie
    except ImportError:
        sys.path.insert(0, str(ROOT / "python"))
        import genie
    return genie


# --------------------------------------------------------------------------------------------
# load: many client processes against one node

LOAD_MODELS = ("gpt2-tiny", "mlp")


def build_load_model(kind: str, seed: int):
    """The client's model (CPU, eval) and a function ``make_input(generator)`` for its step input.

    gpt2-tiny: ``transformers.GPT2Model(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128))``,
    a forward of 2 sequences of 16 random token ids, the output its last hidden state [2, 16, 64].
    mlp: Linear(64, 256) - GELU - Linear(256, 64) on a [8, 64] random batch.
    Weights come from ``torch.manual_seed(seed)``: every client has its own.
    """
    import torch

    torch.manual_seed(seed)
    if kind == "gpt2-tiny":
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, bos_token_id=0, eos_token_id=0)
        model = GPT2Model(config).eval()
        return model, lambda g: torch.randint(0, 128, (2, 16), generator=g)
    if kind == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
        return model, lambda g: torch.randn(8, 64, generator=g)
    raise ValueError(f"unknown model {kind!r}")


def load_step(model, x, device):
    """One forward on ``device``; the result as a CPU tensor (the materialization point)."""
    out = model(x.to(device))
    out = getattr(out, "last_hidden_state", out)
    return out.cpu()


def load_client(index: int, address: str, kind: str, seed: int, seconds: float, start_slots, connected, go,
                abort, results, go_timeout: float) -> None:
    """One client process: connect, upload, one checked warm-up step, the barrier, then checked steps for ``seconds``.

    Puts one dict on ``results``: steps, mismatches, errors, latencies (seconds, every step),
    the loop's seconds and the first few problems. ``start_slots`` (a semaphore) staggers the
    start: it is held from the genie import to the end of the warm-up step. The barrier: the
    client counts itself in ``connected`` and waits for the parent to set ``go`` (``abort``
    set too: a client failed to connect, no steps are run).
    """
    report = {"index": index, "pid": os.getpid(), "steps": 0, "mismatches": 0, "errors": 0, "latencies": [],
              "loop_s": 0.0, "problems": [], "connected": False}
    try:
        with start_slots:
            started = time.monotonic()
            import torch

            torch.set_num_threads(1)
            genie = import_genie()
            from copy import deepcopy

            model, make_input = build_load_model(kind, seed)
            generator = torch.Generator().manual_seed(seed)
            genie.init(server=address)
            with torch.no_grad():
                remote = deepcopy(model).to(DEVICE)
                x = make_input(generator)
                torch.testing.assert_close(load_step(remote, x, DEVICE), load_step(model, x, "cpu"))
            report["connected"] = True
            report["start_s"] = time.monotonic() - started
        with connected.get_lock():
            connected.value += 1
        if not go.wait(go_timeout) or abort.value:
            raise RuntimeError("not started: the other clients did not all connect")
        begin = time.monotonic()
        deadline = begin + seconds
        with torch.no_grad():
            while time.monotonic() < deadline:
                x = make_input(generator)
                t0 = time.perf_counter()
                try:
                    got = load_step(remote, x, DEVICE)
                except Exception as error:  # noqa: BLE001 - counted and reported
                    report["errors"] += 1
                    if len(report["problems"]) < 5:
                        report["problems"].append(f"step {report['steps']}: {type(error).__name__}: {error}")
                    if report["errors"] >= 20:
                        break
                    continue
                report["latencies"].append(time.perf_counter() - t0)
                report["steps"] += 1
                try:
                    torch.testing.assert_close(got, load_step(model, x, "cpu"))
                except AssertionError as error:
                    report["mismatches"] += 1
                    if len(report["problems"]) < 5:
                        report["problems"].append(f"step {report['steps']}: mismatch: {error}")
        report["loop_s"] = time.monotonic() - begin
        genie.shutdown()
    except Exception as error:  # noqa: BLE001 - reported to the parent
        report["errors"] += 1
        report["problems"].append(f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=8)}")
    results.put(report)


def thread_names(pid: int) -> dict:
    """How many of the process's threads carry each name (/proc/<pid>/task/*/comm)."""
    names: dict[str, int] = {}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            names[name] = names.get(name, 0) + 1
    except OSError:
        pass
    return dict(sorted(names.items(), key=lambda kv: -kv[1]))


@contextlib.contextmanager
def killing(processes: list):
    """On the way out (an exception included), SIGKILL every process of ``processes`` still alive."""
    try:
        yield processes
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()


def timed_stats(node: Node, box: dict) -> None:
    """``node.stats()`` into ``box["stats"]``, its wall time into ``box["seconds"]`` (an error as ``box["error"]``)."""
    t0 = time.monotonic()
    try:
        box["stats"] = node.stats(timeout=600.0)
    except Exception as error:  # noqa: BLE001 - reported
        box["error"] = f"{type(error).__name__}: {error}"
    box["seconds"] = time.monotonic() - t0


def wait_connected(args, processes, connected, results, node: Node) -> tuple[bool, dict]:
    """Wait until every client counted itself connected; ``False`` (and the reports of the clients that
    failed) as soon as one reports, one process ends, the node ends, or ``--start-timeout`` passes."""
    deadline = time.monotonic() + args.start_timeout
    reports: dict[int, dict] = {}
    last_print = 0
    while connected.value < args.clients:
        try:
            report = results.get(timeout=0.5)
            reports[report["index"]] = report
            return False, reports
        except queue_module.Empty:
            pass
        if time.monotonic() > deadline or not node.alive() or any(p.exitcode is not None for p in processes):
            return False, reports
        if connected.value >= last_print + 8:
            last_print = connected.value
            print(f"load: {connected.value} clients connected", file=sys.stderr, flush=True)
    return True, reports


def run_load(args) -> dict:
    """The ``load`` subcommand's measurement; returns the result document. The node is stopped whatever happens."""
    quiet_environment()
    host = machine()
    log = args.node_log or tempfile.mkstemp(prefix="genie-node-load-", suffix=".log")[1]
    node = Node(args.node, log)
    try:
        return measure_load(args, node, log, host)
    finally:
        node.stop()


def measure_load(args, node: Node, log: str, host: dict) -> dict:
    print(f"load: {node.banner} (pid {node.pid}, stderr {log})", file=sys.stderr, flush=True)
    document = {"subcommand": "load", "machine": host, "command": sys.argv, "clients": args.clients,
                "seconds": args.seconds, "model": args.model, "start_method": args.start_method,
                "start_concurrency": args.start_concurrency, "node": {"command": node.command, "stderr_file": log},
                "provenance": provenance(args.node)}
    # One thread in the process the clients are forked from, and in each client (2 cores, 64 clients).
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    ctx = mp.get_context(args.start_method)
    if args.start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "transformers.models.gpt2.modeling_gpt2"]
                                   if args.model == "gpt2-tiny" else ["torch"])
    start_slots = ctx.Semaphore(args.start_concurrency)
    connected, go, abort = ctx.Value("i", 0), ctx.Event(), ctx.Value("b", 0)
    results = ctx.Queue()
    reports: dict[int, dict] = {}
    processes = []
    cpu_at_go = cpu_at_end = None
    with Monitor(node) as monitor, killing(processes):
        time.sleep(1.0)
        at_start = node.sample()
        t_start = time.monotonic()
        monitor.phase = "connecting"
        for i in range(args.clients):
            p = ctx.Process(target=load_client, name=f"load-client-{i}",
                            args=(i, node.address, args.model, args.seed + i, args.seconds, start_slots, connected,
                                  go, abort, results, args.start_timeout + args.finish_timeout))
            p.start()
            processes.append(p)
        connected_ok, reported = wait_connected(args, processes, connected, results, node)
        reports.update(reported)
        t_connected = time.monotonic()
        # All connected and idle at the barrier: the node's view now. (--stats is a process of its own
        # that loads libtorch; once 64 clients are busy on 2 cores it takes ~1 min to start.)
        at_barrier = node.sample()
        at_barrier_threads = thread_names(node.pid)
        stats_box: dict = {}
        if node.alive():
            timed_stats(node, stats_box)
        stats_connected, stats_connected_s = stats_box.get("stats"), stats_box.get("seconds")
        if not connected_ok:
            abort.value = 1
        our_pids = [node.pid, os.getpid()] + [p.pid for p in processes]
        cpu_at_go = cpu_snapshot(our_pids)
        go.set()
        monitor.phase = "running"
        time.sleep(min(2.0, args.seconds / 2))
        all_connected = node.sample()
        clients_pss = [pss_kib(p.pid) for p in processes]
        clients_rss = []
        for p in processes:
            try:
                clients_rss.append(rss_kib(p.pid))
            except (OSError, RuntimeError):   # ended (a zombie has no VmRSS)
                pass
        print(f"load: {connected.value} of {args.clients} clients connected in {t_connected - t_start:.0f} s; "
              f"{'running ' + format(args.seconds, 'g') + ' s' if connected_ok else 'aborted'}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.seconds + args.finish_timeout
        while len(reports) < args.clients and time.monotonic() < deadline:
            try:
                report = results.get(timeout=1.0)
            except queue_module.Empty:
                if not any(p.is_alive() for p in processes) and results.empty():
                    break
                continue
            if len(reports) == len(reported):   # the first client done with its steps
                cpu_at_end = cpu_snapshot(our_pids)
                monitor.phase = "leaving"
            reports[report["index"]] = report
        for p in processes:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()
        monitor.phase = "after"
        stats_after = node.wait_sessions(1, args.finish_timeout) if node.alive() else None
        time.sleep(1.0)
        after = node.sample()
    node_alive = node.alive()
    exit_code = node.stop()
    latencies = [x for r in reports.values() for x in r["latencies"]]
    loop_s = max((r["loop_s"] for r in reports.values()), default=0.0)
    per_client_steps = [r["steps"] for r in reports.values()]
    missing = sorted(set(range(args.clients)) - set(reports))
    document.update({
        "all_connected": connected_ok,
        "connect_s": t_connected - t_start,
        "reports": len(reports),
        "missing_clients": missing,
        "client_exit_codes": sorted({p.exitcode for p in processes}, key=str),
        "total_steps": sum(per_client_steps),
        "steps_per_s": sum(per_client_steps) / loop_s if loop_s else None,
        "measured_s": loop_s,
        "steps_per_client_min": min(per_client_steps, default=None),
        "steps_per_client_max": max(per_client_steps, default=None),
        "mismatches": sum(r["mismatches"] for r in reports.values()),
        "errors": sum(r["errors"] for r in reports.values()) + len(missing),
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "latency_max_s": max(latencies, default=None),
        "client_latency_p50_s": {"min": min((percentile(r["latencies"], 50) for r in reports.values() if r["latencies"]), default=None),
                                 "max": max((percentile(r["latencies"], 50) for r in reports.values() if r["latencies"]), default=None)},
        "client_latency_p99_s": {"min": min((percentile(r["latencies"], 99) for r in reports.values() if r["latencies"]), default=None),
                                 "max": max((percentile(r["latencies"], 99) for r in reports.values() if r["latencies"]), default=None)},
        "client_start_s_max": max((r.get("start_s", 0.0) for r in reports.values()), default=None),
        "problems": {r["index"]: r["problems"] for r in reports.values() if r["problems"]},
        "node_samples": {"start": at_start, "all_connected": at_barrier, "running": all_connected,
                         "peak": monitor.peak(), "after": after},
        "stats_all_connected": stats_connected,
        "stats_all_connected_s": stats_connected_s,
        "stats_all_connected_error": stats_box.get("error"),
        "node_thread_names_all_connected": at_barrier_threads,
        "clients_pss_sum_kib": sum(x for x in clients_pss if x is not None),
        "clients_rss_mean_kib": sum(clients_rss) / len(clients_rss) if clients_rss else None,
        "mem_available_min_kib": monitor.mem_available_min_kib,
        # The machine's CPU time in the measured window spent by processes other than the node,
        # the clients and this script (another program on the machine), as a share of all of it.
        "other_cpu_share": other_cpu_share(cpu_at_go, cpu_at_end) if cpu_at_go and cpu_at_end else None,
        "stats_after": stats_after,
        # --stats' own connection is a session of its own: the clients' sessions are one fewer.
        "client_sessions_after": (stats_after["sessions"] - 1) if stats_after else None,
        "node_alive_at_end": node_alive,
        "node_exit_code": exit_code,
        "node_stderr_counts": node.stderr_counts(),
        "node_stderr_tail": node.stderr_tail(),
        "node_timeline": [{k: s.get(k) for k in ("time", "phase", "rss_kib", "threads", "fds")}
                          for s in monitor.samples[::5]],
    })
    document["passed"] = bool(connected_ok and not missing and document["mismatches"] == 0 and document["errors"] == 0
                              and node_alive and exit_code == 0 and document["client_sessions_after"] == 0)
    return document


def print_load(doc: dict, out=None) -> None:
    out = out or sys.stdout
    rows = [
        ("clients (processes)", f"{doc['clients']} ({doc['start_method']}, {doc['reports']} reported)"),
        ("model", doc["model"]),
        ("all connected after", f"{doc['connect_s']:.0f} s"),
        ("measured", f"{doc['measured_s']:.1f} s"),
        ("total steps", doc["total_steps"]),
        ("steps/s (all clients)", f"{doc['steps_per_s']:.1f}" if doc["steps_per_s"] else "-"),
        ("steps per client min/max", f"{doc['steps_per_client_min']} / {doc['steps_per_client_max']}"),
        ("mismatches", doc["mismatches"]),
        ("errors", doc["errors"]),
        ("step latency p50 / p99", f"{format_ms(doc['latency_p50_s'])} / {format_ms(doc['latency_p99_s'])}"),
        ("step latency max", format_ms(doc["latency_max_s"])),
        ("clients' own p50 (min-max)", f"{format_ms(doc['client_latency_p50_s']['min'])} - "
                                       f"{format_ms(doc['client_latency_p50_s']['max'])}"),
        ("clients' own p99 (min-max)", f"{format_ms(doc['client_latency_p99_s']['min'])} - "
                                       f"{format_ms(doc['client_latency_p99_s']['max'])}"),
        ("clients' memory, all connected", f"PSS sum {format_kib(doc['clients_pss_sum_kib'])}, "
                                           f"RSS mean {format_kib(doc['clients_rss_mean_kib'])}"),
        ("machine MemAvailable, lowest", format_kib(doc["mem_available_min_kib"])),
        ("CPU used by other programs, measured window", "-" if doc["other_cpu_share"] is None
         else f"{doc['other_cpu_share']:.1%}"),
        ("--stats sessions, all connected", (doc["stats_all_connected"] or {}).get("sessions", "-")),
        ("--stats sessions after (own incl.)", doc["stats_after"]["sessions"] if doc["stats_after"] else "-"),
        ("client sessions after", doc["client_sessions_after"]),
        ("resident bytes / graphs cached after", f"{sum((doc['stats_after'] or {}).get('resident_bytes', {}).values())} / "
                                                 f"{(doc['stats_after'] or {}).get('graphs_cached', '-')}"),
        ("node alive / exit on SIGTERM", f"{doc['node_alive_at_end']} / {doc['node_exit_code']}"),
        ("node stderr warning/error lines", f"{doc['node_stderr_counts']['warning']} / {doc['node_stderr_counts']['error']}"),
    ]
    print_table(f"bench_reliability load: {doc['clients']} clients x {doc['seconds']:g} s on one genie-node",
                ("what", "value"), rows, file=out)
    node_rows = []
    for name in ("start", "all_connected", "running", "peak", "after"):
        s = doc["node_samples"][name] or {}
        node_rows.append((name.replace("_", " "), format_kib(s.get("rss_kib")), s.get("threads", "-"), s.get("fds", "-")))
    print_table("genie-node process (/proc): at start, all connected (at the barrier), 2 s into the run, "
                "peak (each its own), after all left", ("when", "RSS", "threads", "fds"), node_rows, file=out)
    print("genie-node threads, all connected: " + ", ".join(f"{n} x {name}" for name, n in
                                                           doc["node_thread_names_all_connected"].items()), file=out)
    for index, problems in sorted(doc["problems"].items())[:5]:
        print(f"client {index}: " + " | ".join(p.splitlines()[0] for p in problems[:3]), file=out)
    m = doc["machine"]
    print(f"machine: {m['cpu_model']}, {m['cpu_count']} cores, {format_kib(m['mem_total_kib'])}, "
          f"commit {m['commit']}, {m['date']}; {'PASSED' if doc['passed'] else 'FAILED'}", file=out)


# --------------------------------------------------------------------------------------------
# soak: one client decoding GPT-2 for many steps

def soak_client(address: str, node_pid: int, steps: int, decode_per_round: int, n_layer: int, results) -> None:
    """Greedy GPT-2 decoding in rounds of ``decode_per_round`` decode steps (one prefill each) until ``steps``.

    Puts on ``results``: one ``("setup", {...})``, then ``("round", {...})`` after every round
    (its tokens equal to the first round's or not, seconds, median decode step, the client's
    and the node's RSS read right after the round), then ``("done", {...})``, or
    ``("error", text)``.
    """
    try:
        import torch

        genie = import_genie()
        from genie.demo import models

        started = time.monotonic()
        workload = models.load_gpt2(max_new_tokens=decode_per_round + 1, n_layer=n_layer)
        cpu_tokens = models.gpt2_generate(workload.model, workload.prompt, "cpu", decode_per_round + 1)[0].tolist()
        genie.init(server=address)
        node_before_upload = rss_kib(node_pid)
        remote = models.to_device(workload.model, DEVICE)
        genie.synchronize()
        results.put(("setup", {"parameters": sum(p.numel() for p in workload.model.parameters()),
                               "n_layer": n_layer, "setup_s": time.monotonic() - started,
                               "node_rss_before_upload_kib": node_before_upload,
                               "node_rss_after_upload_kib": rss_kib(node_pid), "client_rss_kib": rss_kib(),
                               "torch_threads": torch.get_num_threads()}))
        first = None
        done_steps = 0
        round_index = 0
        while done_steps < steps:
            round_index += 1
            recorder = models.StepRecorder()
            t0 = time.perf_counter()
            tokens = models.gpt2_generate(remote, workload.prompt, DEVICE, decode_per_round + 1, recorder)[0].cpu().tolist()
            seconds = time.perf_counter() - t0
            done_steps += decode_per_round
            if first is None:
                first = tokens
            step_seconds = sorted(recorder.step_seconds())
            node = proc_sample(node_pid)
            cpu = cpu_snapshot([node_pid, os.getpid(), os.getppid()])
            results.put(("round", {
                "cpu": cpu,
                "round": round_index, "steps_done": done_steps, "seconds": seconds,
                "step_median_s": step_seconds[len(step_seconds) // 2] if step_seconds else None,
                "step_max_s": step_seconds[-1] if step_seconds else None,
                "tokens_equal_first": tokens == first,
                "differing_positions": sum(a != b for a, b in zip(tokens, first)),
                "first_round_equals_cpu": (tokens == cpu_tokens) if round_index == 1 else None,
                "node_rss_kib": node["rss_kib"], "node_threads": node["threads"], "node_fds": node["fds"],
                "client_rss_kib": rss_kib(),
            }))
        genie.shutdown()
        results.put(("done", {"rounds": round_index, "steps": done_steps, "tokens_first_round": first[:16]}))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        results.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=8)}"))


def rss_summary(rounds: list, key: str, warmup_rounds: int = 2) -> dict:
    """RSS after warm-up (after round ``warmup_rounds``), min / max / end over the later rounds, and the
    least-squares slope over rounds ``warmup_rounds + 1``..end in KiB per 1,000 decode steps."""
    if len(rounds) <= warmup_rounds:
        return {"after_warmup_kib": rounds[-1][key] if rounds else None, "min_kib": None, "max_kib": None,
                "end_kib": rounds[-1][key] if rounds else None, "slope_kib_per_1000_steps": None}
    rest = rounds[warmup_rounds:]
    slope = least_squares_slope([r["steps_done"] for r in rest], [r[key] for r in rest])
    return {
        "first_round_kib": rounds[0][key],
        "after_warmup_kib": rounds[warmup_rounds - 1][key],
        "min_kib": min(r[key] for r in rest),
        "max_kib": max(r[key] for r in rest),
        "end_kib": rounds[-1][key],
        "end_minus_warmup_kib": rounds[-1][key] - rounds[warmup_rounds - 1][key],
        "slope_kib_per_1000_steps": None if slope is None else slope * 1000,
        "fit_rounds": f"{warmup_rounds + 1}..{len(rounds)}",
    }


def run_soak(args) -> dict:
    """The ``soak`` subcommand's measurement; returns the result document. The node is stopped whatever happens."""
    quiet_environment()
    host = machine()
    log = args.node_log or tempfile.mkstemp(prefix="genie-node-soak-", suffix=".log")[1]
    node = Node(args.node, log)
    try:
        return measure_soak(args, node, log, host)
    finally:
        node.stop()


def measure_soak(args, node: Node, log: str, host: dict) -> dict:
    print(f"soak: {node.banner} (pid {node.pid}, stderr {log})", file=sys.stderr, flush=True)
    document = {"subcommand": "soak", "machine": host, "command": sys.argv, "steps_asked": args.steps,
                "decode_per_round": args.decode_per_round, "n_layer": args.n_layer,
                "model": f"GPT-2 ({'124M, ' if args.n_layer == 12 else ''}GPT2Config(n_layer={args.n_layer})), random "
                         f"weights (torch.manual_seed(0)), genie.demo.models.load_gpt2",
                "node": {"command": node.command, "stderr_file": log}, "provenance": provenance(args.node)}
    time.sleep(1.0)
    node_start = node.sample()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=soak_client, name="soak-client",
                          args=(node.address, node.pid, args.steps, args.decode_per_round, args.n_layer, results))
    t0 = time.monotonic()
    process.start()
    with killing([process]):
        return soak_rounds(args, node, process, results, t0, document, node_start)


def soak_rounds(args, node: Node, process, results, t0: float, document: dict, node_start: dict | None) -> dict:
    """Collects the soak client's reports until it is done, then the node's state after it left."""
    rounds, setup, done, error = [], None, None, None
    while done is None and error is None:
        try:
            kind, payload = results.get(timeout=5.0)
        except queue_module.Empty:
            if not process.is_alive():
                error = f"the client exited ({process.exitcode}) without reporting"
            elif not node.alive():
                error = f"genie-node exited ({node.process.returncode}) during the soak"
            continue
        if kind == "setup":
            setup = payload
            print(f"soak: model uploaded ({payload['parameters'] / 1e6:.1f} M parameters) in {payload['setup_s']:.0f} s",
                  file=sys.stderr, flush=True)
        elif kind == "round":
            rounds.append(payload)
            if payload["round"] % 10 == 0 or payload["round"] <= 2:
                print(f"soak: round {payload['round']}, {payload['steps_done']} steps, "
                      f"{time.monotonic() - t0:.0f} s, node RSS {format_kib(payload['node_rss_kib'])}, "
                      f"client RSS {format_kib(payload['client_rss_kib'])}, "
                      f"step {format_ms(payload['step_median_s'])}", file=sys.stderr, flush=True)
        elif kind == "done":
            done = payload
        else:
            error = payload
    elapsed = time.monotonic() - t0
    process.join(timeout=60)
    if process.is_alive():
        process.kill()
        process.join()
    stats_after = node.wait_sessions(1, 30.0) if node.alive() else None
    time.sleep(1.0)
    node_after = node.sample()
    node_alive = node.alive()
    exit_code = node.stop()
    step_medians = sorted(r["step_median_s"] for r in rounds if r["step_median_s"] is not None)
    document.update({
        "setup": setup, "error": error, "done": done,
        "rounds": len(rounds), "steps": rounds[-1]["steps_done"] if rounds else 0, "seconds": elapsed,
        "decode_step_median_s": step_medians[len(step_medians) // 2] if step_medians else None,
        "mismatched_rounds": sum(not r["tokens_equal_first"] for r in rounds),
        # CPU time of other programs (not the node, the client, this script) from the end of round 2
        # (round 1 if fewer) to the last round, as a share of the machine's.
        "other_cpu_share": other_cpu_share(rounds[min(1, len(rounds) - 1)]["cpu"], rounds[-1]["cpu"])
        if len(rounds) >= 2 else None,
        "first_round_equals_cpu": rounds[0]["first_round_equals_cpu"] if rounds else None,
        "node_rss": {"before_client_kib": node_start["rss_kib"] if node_start else None,
                     **rss_summary(rounds, "node_rss_kib"),
                     "after_client_left_kib": node_after["rss_kib"] if node_after else None},
        "client_rss": rss_summary(rounds, "client_rss_kib"),
        "node_threads_min_max": [min((r["node_threads"] for r in rounds), default=None),
                                 max((r["node_threads"] for r in rounds), default=None)],
        "node_fds_min_max": [min((r["node_fds"] for r in rounds), default=None),
                             max((r["node_fds"] for r in rounds), default=None)],
        "stats_after": stats_after,
        "client_sessions_after": (stats_after["sessions"] - 1) if stats_after else None,
        "node_alive_at_end": node_alive, "node_exit_code": exit_code,
        "node_stderr_counts": node.stderr_counts(), "node_stderr_tail": node.stderr_tail(),
        "per_round": rounds,
    })
    document["passed"] = bool(error is None and done is not None and document["mismatched_rounds"] == 0
                              and node_alive and exit_code == 0 and document["client_sessions_after"] == 0)
    return document


def print_soak(doc: dict, out=None) -> None:
    out = out or sys.stdout
    setup = doc["setup"] or {}
    rows = [
        ("model", doc["model"]),
        ("parameters", f"{setup.get('parameters', 0) / 1e6:.1f} M"),
        ("decode steps / rounds", f"{doc['steps']} / {doc['rounds']} ({doc['decode_per_round']} per round + 1 prefill)"),
        ("seconds", f"{doc['seconds']:.0f} s"),
        ("decode step (median of round medians)", format_ms(doc["decode_step_median_s"])),
        ("CPU used by other programs, rounds 2..end", "-" if doc["other_cpu_share"] is None
         else f"{doc['other_cpu_share']:.1%}"),
        ("rounds with other tokens than round 1", doc["mismatched_rounds"]),
        ("round 1 tokens = CPU's", doc["first_round_equals_cpu"]),
        ("node threads min/max", " / ".join(str(x) for x in doc["node_threads_min_max"])),
        ("node fds min/max", " / ".join(str(x) for x in doc["node_fds_min_max"])),
        ("client sessions after", doc["client_sessions_after"]),
        ("node alive / exit on SIGTERM", f"{doc['node_alive_at_end']} / {doc['node_exit_code']}"),
        ("node stderr warning/error lines", f"{doc['node_stderr_counts']['warning']} / {doc['node_stderr_counts']['error']}"),
    ]
    if doc["error"]:
        rows.append(("error", doc["error"].splitlines()[0]))
    print_table(f"bench_reliability soak: {doc['steps_asked']} decode steps on one genie-node", ("what", "value"),
                rows, file=out)
    rss_rows = []
    for who, key in (("genie-node", "node_rss"), ("client", "client_rss")):
        r = doc[key]
        slope = r.get("slope_kib_per_1000_steps")
        rss_rows.append((who, format_kib(r.get("after_warmup_kib")), format_kib(r.get("min_kib")),
                         format_kib(r.get("max_kib")), format_kib(r.get("end_kib")),
                         "-" if slope is None else f"{slope:+.1f}"))
    print_table("RSS: after round 2, then over rounds 3..end (slope: least squares, KiB per 1,000 decode steps)",
                ("process", "after warm-up", "min", "max", "end", "slope"), rss_rows, file=out)
    n = doc["node_rss"]
    print(f"genie-node RSS: {format_kib(n.get('before_client_kib'))} before the client, "
          f"{format_kib((setup or {}).get('node_rss_after_upload_kib'))} after the upload, "
          f"{format_kib(n.get('after_client_left_kib'))} after it left", file=out)
    m = doc["machine"]
    print(f"machine: {m['cpu_model']}, {m['cpu_count']} cores, {format_kib(m['mem_total_kib'])}, "
          f"commit {m['commit']}, {m['date']}; {'PASSED' if doc['passed'] else 'FAILED'}", file=out)


# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", default=str(DEFAULT_NODE), help="the genie-node binary (default: %(default)s)")
    parser.add_argument("--node-log", metavar="PATH", help="genie-node's standard error (default: a temporary file)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout)")
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="many client processes at once against one node")
    load.add_argument("--clients", type=int, default=64)
    load.add_argument("--seconds", type=float, default=60.0, help="measured time, after all clients connected")
    load.add_argument("--model", choices=LOAD_MODELS, default="gpt2-tiny")
    load.add_argument("--seed", type=int, default=1000, help="client i seeds torch with seed+i")
    load.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver")
    load.add_argument("--start-concurrency", type=int, default=2, help="clients setting up at the same time")
    load.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for all clients to connect")
    load.add_argument("--finish-timeout", type=float, default=300.0,
                      help="seconds past --seconds for the clients to finish and for the sessions to end")
    soak = sub.add_parser("soak", help="one client decoding GPT-2 for many steps")
    soak.add_argument("--steps", type=int, default=10000, help="decode steps in all")
    soak.add_argument("--decode-per-round", type=int, default=100, help="decode steps per generate() call")
    soak.add_argument("--n-layer", type=int, default=12, help="GPT-2 layers (12: the 124M model)")
    args = parser.parse_args(argv)
    if args.command == "load" and (args.clients < 1 or args.seconds <= 0 or args.start_concurrency < 1):
        parser.error("--clients and --start-concurrency must be at least 1, --seconds positive")
    if args.command == "soak" and (args.steps < 1 or args.decode_per_round < 1):
        parser.error("--steps and --decode-per-round must be at least 1")
    if not pathlib.Path(args.node).exists() or not shutil.which(args.node):
        parser.error(f"no genie-node at {args.node} (build it: tools/setup.sh)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not os.environ.get("UCX_NET_DEVICES"):
        print("bench_reliability: UCX_NET_DEVICES is not set (UCX_NET_DEVICES=lo keeps it on loopback)",
              file=sys.stderr)
    out = sys.stderr if args.json == "-" else sys.stdout
    try:
        if args.command == "load":
            document = run_load(args)
            print_load(document, out)
        else:
            document = run_soak(args)
            print_soak(document, out)
    except (RuntimeError, OSError) as error:
        print(f"bench_reliability: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    write_json(document, args.json)
    return 0 if document["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
