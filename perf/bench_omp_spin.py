#!/usr/bin/env python3
"""The embedded node's OpenMP spin (GOMP_SPINCOUNT) against a compiled call's latency.

The embedded genie-node shares this host's cores with the program. After each parallel region
a libgomp worker polls GOMP_SPINCOUNT times before it sleeps (libgomp's default, 300,000, is
milliseconds), so after a step the node's worker may still hold a core when the program needs
it for the reply and its next step; the embedded node therefore gets GOMP_SPINCOUNT=10000
(python/genie/_session.py). This benchmark alternates ``--settings`` (GOMP_SPINCOUNT values
for the node; 300000 is libgomp's default) in one process: for each setting, in
each round (the order reversed every other round), it restarts the embedded node with that
environment, compiles the model again with ``backend="genie"`` (the package comes from the
node's disk cache), waits until calls run by the package, then times local
``torch.compile(backend="inductor")`` and Genie alternately, twice each. The local side's
libgomp keeps this process's environment throughout.

Workloads (perf/bench_compile.py's): ``gpt2``, a 32-token StaticCache decode (per decode
step); ``minilm``, MiniLM on its 16 sentences with the hidden states read (10 calls).
Reported per setting: medians of local inductor, Genie, the node's execution (its RunResult),
Genie / inductor, and Genie minus the node's execution (the client's CPU before the request
and the round trip around the execution).

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_omp_spin.py --model gpt2 --rounds 4
    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_omp_spin.py --model minilm --settings 300000,50000,10000
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_compile  # noqa: E402 - perf/, beside this script

DEV = bench_compile.DEV


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("gpt2", "minilm"), default="gpt2")
    parser.add_argument("--settings", default="300000,50000,10000",
                        help="GOMP_SPINCOUNT values for the node, comma-separated (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="alternated rounds (default: %(default)s)")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here")
    args = parser.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    for s in args.settings:
        if not s.isdigit():
            parser.error(f"--settings: {s!r} is not a count")
    return args


class Gpt2:
    parts = 31  # decode steps per generation, each run by the package

    def __init__(self):
        import torch
        from genie.demo import models
        workload = models.load_gpt2()
        self.local, self.prompt = workload.model, workload.prompt
        self.inductor = torch.compile(self.local, backend="inductor", dynamic=False)
        self.remote = None

    def compile_remote(self):
        import torch
        from genie.demo import models
        self.remote = models.load_gpt2().model.to(DEV)
        self.compiled = torch.compile(self.remote, backend="genie", dynamic=False)

    def run_local(self) -> list[float]:
        return bench_compile.gpt2_decode(self.local, self.inductor, "cpu", self.prompt, 32)[1]

    def run_remote(self, node_exec: list) -> list[float]:
        return bench_compile.gpt2_decode(self.remote, self.compiled, DEV, self.prompt, 32, node_exec=node_exec)[1]


class MiniLM:
    parts = 1
    calls = 10

    def __init__(self):
        import torch
        from genie.demo import models
        workload = models.load_minilm()
        self.inputs, self.local = workload.encoded, workload.model
        self.inductor = torch.compile(self.local, backend="inductor", dynamic=False)

    def compile_remote(self):
        import torch
        from genie.demo import models
        self.compiled = torch.compile(models.load_minilm().model.to(DEV), backend="genie", dynamic=False)

    def _call(self, model, device):
        return model(**{k: v.to(device) for k, v in self.inputs.items()}).last_hidden_state.cpu()

    def run_local(self) -> list[float]:
        times = []
        for _ in range(self.calls):
            start = time.perf_counter()
            self._call(self.inductor, "cpu")
            times.append(time.perf_counter() - start)
        return times

    def run_remote(self, node_exec: list) -> list[float]:
        import genie
        times = []
        for _ in range(self.calls):
            before, start = genie.client_stats()["node_exec_us"], time.perf_counter()
            self._call(self.compiled, DEV)
            times.append(time.perf_counter() - start)
            node_exec.append((genie.client_stats()["node_exec_us"] - before) / 1e6)
        return times


def summary(samples: dict) -> dict:
    m = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    return {"inductor_ms": m["inductor"], "genie_ms": m["genie"], "node_exec_ms": m["node_exec"],
            "genie_vs_inductor": m["genie"] / m["inductor"], "genie_minus_exec_ms": m["genie"] - m["node_exec"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GENIE_NODE_COMPILE_CACHE", tempfile.mkdtemp(prefix="genie-bench-omp-spin-"))
    os.environ.setdefault("GENIE_LOG_LEVEL", "warn")
    import torch
    import genie
    from genie.demo.harness import quiet_libraries
    quiet_libraries()
    workload = Gpt2() if args.model == "gpt2" else MiniLM()
    samples = {s: {"inductor": [], "genie": [], "node_exec": []} for s in args.settings}
    per_round = []
    with torch.no_grad():
        workload.run_local()  # local inductor's compile
        for r in range(args.rounds):
            for setting in args.settings if r % 2 == 0 else args.settings[::-1]:
                genie.shutdown()  # the next use starts an embedded node with this environment
                os.environ["GOMP_SPINCOUNT"] = setting
                workload.compile_remote()
                bench_compile.until_packages_run(lambda: workload.run_remote([]), workload.parts, 1800)
                these = {"inductor": [], "genie": [], "node_exec": []}
                for _ in range(2):
                    these["inductor"] += workload.run_local()
                    these["genie"] += workload.run_remote(these["node_exec"])
                for k, v in these.items():
                    samples[setting][k] += v
                row = {"round": r, "setting": setting, **summary(these)}
                per_round.append(row)
                print(json.dumps(row), flush=True)
    genie.shutdown()
    results = {s: summary(samples[s]) for s in args.settings}
    print(f"{'GOMP_SPINCOUNT':>14} {'inductor':>9} {'genie':>9} {'exec':>9} {'g/ind':>6} {'g-exec':>7}")
    for s, m in results.items():
        print(f"{s:>14} {m['inductor_ms']:9.2f} {m['genie_ms']:9.2f} {m['node_exec_ms']:9.2f} "
              f"{m['genie_vs_inductor']:6.3f} {m['genie_minus_exec_ms']:7.2f}")
    if args.json:
        from op_coverage import machine  # perf/, beside this script
        report = {"date": datetime.date.today().isoformat(), "commit": bench_compile.git_commit(),
                  "machine": machine(), "torch": torch.__version__,
                  "command": " ".join(["perf/bench_omp_spin.py"] + (argv or sys.argv[1:])),
                  "model": args.model, "results": results, "rounds": per_round}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
