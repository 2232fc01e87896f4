#!/usr/bin/env python3
"""GPT-2 decode step by step: each step's time on a Genie device against local eager, and its traffic.

GPT-2 124M (``genie.demo``'s: random weights, its 19-token prompt, greedy ``generate`` with a
KV cache, no end-of-sequence stop) generates ``--tokens`` tokens on the device and on the local
CPU (``--local-device``: another local device, e.g. ``cuda:0``; the model and inputs are moved
there and its queue is synchronized before each step's time is read), in ``--rounds`` alternated
rounds (local, device) after one warm-up of each side.

Steps. Step 0 is the prefill (the prompt; ``generate``'s setup included), step k > 0 decodes
token k. A step ends when ``generate``'s loop has its result: at the return of the model's
``_has_unfinished_sequences`` that follows the loop's stop check, a read of the step's result
(a decode step's one round trip on the device). So a step on the device holds its recording,
the node's execution and the reply; the download of the ids after ``generate`` is in no step.

Per step and round (JSON): wall seconds on both sides; on the device also the deltas of
``genie.client_stats()`` (bytes sent and received, round trips, the node's execution µs) and
Genie's own client time (seconds in the PrivateUse1 kernel, ``genie._C.set_recorder_timing``,
less the seconds waiting in requests: perf/bench_capture.py's definition; the model's and
HuggingFace's Python are not in it). The PNG (``--plot``) has two panels over the step index:
step time (device median and min-max over the rounds, local eager, client time, node
execution) and bytes sent / received per step.

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_decode.py --tokens 64 --rounds 5
    .venv/bin/python perf/bench_decode.py --plot-only      # the PNG again from the JSON
    GENIE_EMBEDDED_DEVICE=cuda:0 perf/bench_decode.py --local-device cuda:0 --json /tmp/d.json --no-plot
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "docs" / "perf" / "decode.json"
DEFAULT_PLOT = ROOT / "docs" / "perf" / "decode.png"
STEP_COUNTERS = ("bytes_sent", "bytes_received", "round_trips", "node_exec_us")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="remote_accelerator:0", help="target device (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternated (local, device) runs after the warm-ups "
                        "(default: %(default)s)")
    parser.add_argument("--local-device", default="cpu",
                        help="device of the local eager baseline, e.g. cuda:0 (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the local runs (default: torch's)")
    parser.add_argument("--json", metavar="PATH", type=pathlib.Path, default=DEFAULT_JSON,
                        help="results, written (read with --plot-only) (default: docs/perf/decode.json)")
    parser.add_argument("--plot", metavar="PATH", type=pathlib.Path, default=DEFAULT_PLOT,
                        help="the PNG (default: docs/perf/decode.png)")
    parser.add_argument("--plot-only", action="store_true", help="draw the PNG from --json; run nothing")
    parser.add_argument("--no-plot", action="store_true", help="draw no PNG (matplotlib not needed)")
    args = parser.parse_args(argv)
    if args.tokens < 2:
        parser.error("--tokens must be at least 2 (the prefill and one decode step)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


# --------------------------------------------------------------------------------------------
# Measuring one generation

class ClientClock:
    """Genie's own client time, cumulative ns: the PrivateUse1 kernel's time less the time waiting
    in ``Runtime._request`` (outermost calls). Inside ``with``, the kernel is timed and requests
    are wrapped; ``snapshot()`` is ``None`` where ``genie._C`` has no ``set_recorder_timing``."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.wait_ns = 0
        self._depth = 0
        self._C = None
        self._saved = None

    def __enter__(self):
        if not self.enabled:
            return self
        from genie import _C
        from genie.runtime import Runtime
        if not hasattr(_C, "set_recorder_timing"):
            self.enabled = False
            return self
        self._C = _C
        request = Runtime._request
        self._saved = Runtime.__dict__.get("_request")
        clock = self

        def timed_request(runtime, *args, **kwargs):
            clock._depth += 1
            start = time.perf_counter_ns()
            try:
                return request(runtime, *args, **kwargs)
            finally:
                clock._depth -= 1
                if clock._depth == 0:
                    clock.wait_ns += time.perf_counter_ns() - start

        Runtime._request = timed_request
        _C.set_recorder_timing(True)
        return self

    def __exit__(self, *exc):
        if self._C is None:
            return
        from genie.runtime import Runtime
        self._C.set_recorder_timing(False)
        if self._saved is None:
            del Runtime._request
        else:
            Runtime._request = self._saved
        self._C = None

    def snapshot(self) -> tuple[int, int] | None:
        """(kernel ns, waiting ns) so far, or ``None``."""
        if self._C is None:
            return None
        return self._C.recorder_counters()["kernel_ns"], self.wait_ns


class StepClock:
    """The step boundaries of one ``generate`` call on ``model`` (see the module's docstring):
    ``mark()`` before the call, then one mark per return of ``_has_unfinished_sequences`` after
    its first (which comes before any step has been read). A mark is (perf_counter seconds,
    counter snapshot or ``None``, client snapshot or ``None``). ``sync``: called before each mark's
    time is read (a local CUDA device's ``torch.cuda.synchronize``), or ``None``."""

    def __init__(self, model, counters, client: ClientClock | None, sync=None):
        self.model, self.counters, self.client, self.sync = model, counters, client, sync
        self.marks: list = []

    def mark(self) -> None:
        if self.sync is not None:
            self.sync()
        self.marks.append((time.perf_counter(), self.counters.snapshot(),
                           self.client.snapshot() if self.client else None))

    @contextlib.contextmanager
    def watching(self):
        original = self.model._has_unfinished_sequences
        calls = [0]

        def has_unfinished_sequences(*args, **kwargs):
            unfinished = original(*args, **kwargs)
            if calls[0] > 0:
                self.mark()
            calls[0] += 1
            return unfinished

        self.model._has_unfinished_sequences = has_unfinished_sequences  # this instance only
        try:
            yield self
        finally:
            del self.model._has_unfinished_sequences

    def steps(self) -> list[dict]:
        """One dict per step: ``seconds``; on a device also the counters' deltas, ``client_s``, ``wait_s``."""
        steps = []
        for (t0, c0, k0), (t1, c1, k1) in zip(self.marks, self.marks[1:]):
            step = {"seconds": t1 - t0}
            if c0 is not None and c1 is not None:
                step.update({key: c1[key] - c0[key] for key in STEP_COUNTERS if key in c0 and key in c1})
            if k0 is not None and k1 is not None:
                waited = k1[1] - k0[1]
                step.update(client_s=(k1[0] - k0[0] - waited) / 1e9, wait_s=waited / 1e9)
            steps.append(step)
        return steps


def generate_steps(workload, model, device: str, counters, client: ClientClock | None, sync=None) -> dict:
    """One greedy ``generate`` of ``workload.max_new_tokens`` tokens, timed step by step; ``sync``
    (or ``None``) is called before every time is read (see StepClock).

    Returns {"seconds": the whole ``generate``, "steps": StepClock.steps(), "ids": [tokens] int}.
    """
    from genie.demo.models import gpt2_generate
    clock = StepClock(model, counters, client, sync)
    counters.synchronize()
    with clock.watching():
        clock.mark()
        start = time.perf_counter()
        ids = gpt2_generate(model, workload.prompt, device, workload.max_new_tokens)
        if sync is not None:
            sync()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": clock.steps(), "ids": ids.cpu()[0].tolist()}


def measure(args) -> dict:
    """Warm-ups, then ``args.rounds`` rounds of (local, device); the JSON document."""
    try:
        import genie.demo  # noqa: F401 - installed (pip install -e .)
    except ImportError:
        sys.path.insert(0, str(ROOT / "python"))
    import torch
    from genie.demo import harness, models
    from genie.demo.__main__ import prepare_device
    from genie.demo.measure import Counters, is_local, machine

    import bench_models  # perf/, beside this script: the commit as its history records it

    harness.quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prepare_device(args.device)
    except Exception as error:
        raise SystemExit(f"bench_decode: cannot set up device {args.device}: {type(error).__name__}: {error}")
    host = machine()
    workload = models.load_gpt2(args.tokens)
    local_counters, counters = bench_models.LocalCounters(args.local_device), Counters(args.device)
    local_model = models.to_device(workload.model, args.local_device)
    local_sync = local_counters.synchronize if local_counters.queued else None
    device_model = models.to_device(workload.model, args.device)
    client = ClientClock(not is_local(args.device))
    generate_steps(workload, local_model, args.local_device, local_counters, None, local_sync)  # warm-ups
    generate_steps(workload, device_model, args.device, counters, None)
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
        local = generate_steps(workload, local_model, args.local_device, local_counters, None, local_sync)
        with client:
            device = generate_steps(workload, device_model, args.device, counters, client)
        rounds.append({"local": local, "device": device})
    host["load_average_1m_end"] = machine()["load_average_1m"]
    ids_equal = all(r["local"]["ids"] == r["device"]["ids"] for r in rounds)
    return {
        "benchmark": "GPT-2 124M generate, per step: device against local eager, and the device's traffic",
        "date": host["date"], "commit": bench_models.git_commit(), "machine": host, "device": args.device,
        "local_device": args.local_device,
        "command": f"perf/bench_decode.py --tokens {args.tokens} --rounds {args.rounds}"
                   + (f" --threads {args.threads}" if args.threads else "")
                   + (f" --local-device {args.local_device}" if args.local_device != "cpu" else ""),
        "tokens": args.tokens, "prompt_tokens": int(workload.prompt.shape[1]), "rounds_count": args.rounds,
        "counters_available": counters.available, "client_time_available": client.enabled,
        "ids_equal": ids_equal, "per_step": per_step_medians(rounds), "rounds": rounds,
    }


# --------------------------------------------------------------------------------------------
# Summaries, the report and the plot

def per_step_medians(rounds: list) -> list[dict]:
    """Per step index: median (and min, max) over the rounds of each side's figures."""
    out = []
    for index in range(min(len(r[side]["steps"]) for r in rounds for side in ("local", "device"))):
        row = {"step": index}
        for side in ("local", "device"):
            steps = [r[side]["steps"][index] for r in rounds]
            for key in steps[0]:
                values = [s[key] for s in steps if s.get(key) is not None]
                if values:
                    row[f"{side}_{key}"] = statistics.median(values)
            seconds = [s["seconds"] for s in steps]
            row[f"{side}_seconds_min"], row[f"{side}_seconds_max"] = min(seconds), max(seconds)
        out.append(row)
    return out


def print_report(doc: dict, out=sys.stdout) -> None:
    from genie.demo.measure import format_bytes, format_count, format_seconds
    from genie.demo.table import print_table
    steps = doc["per_step"]
    decode = steps[1:]

    def med(key, rows):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    def ms(key, rows):
        return format_seconds(med(key, rows))

    table = []
    for what, rows in (("prefill (step 0)", steps[:1]), (f"decode step (median of steps 1-{len(steps) - 1})", decode)):
        local, device = med("local_seconds", rows), med("device_seconds", rows)
        us = med("device_node_exec_us", rows)
        table.append((what, format_seconds(local), format_seconds(device), f"{device / local:.2f}x",
                      ms("device_client_s", rows), "-" if us is None else format_seconds(us / 1e6),
                      format_bytes(med("device_bytes_sent", rows)), format_bytes(med("device_bytes_received", rows)),
                      format_count(med("device_round_trips", rows))))
    local_device = doc.get("local_device", "cpu")
    print_table(f"bench_decode: GPT-2 124M, {doc['tokens']} tokens, {doc['device']} vs local {local_device}, medians "
                f"over {doc['rounds_count']} rounds",
                ("step", f"local {local_device}", doc["device"], "device/local", "client", "node exec", "sent",
                 "received", "round trips"), table, file=out)
    host = doc["machine"]
    print(f"ids equal in every round: {doc['ids_equal']}; machine: {host['cpu_model']}, {host['cpu_count']} cores, "
          f"load {host['load_average_1m']:.2f}, torch {host['torch']}, {doc['date']}, commit {doc['commit']}", file=out)


def byte_label(n: float) -> str:
    """A log axis' tick: 256 B, 2 KiB, 1.5 MiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} MiB"


def plot(doc: dict, path: pathlib.Path) -> None:
    """Two panels over the step index: step time (ms) and bytes per step (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    steps = doc["per_step"]
    x = [s["step"] for s in steps]

    def series(key, scale=1.0):
        return [None if s.get(key) is None else s[key] * scale for s in steps]

    fig, (ax_time, ax_bytes) = plt.subplots(2, 1, sharex=True, figsize=(9, 7), height_ratios=(3, 2))
    local_device = doc.get("local_device", "cpu")
    local_label = "local eager CPU" if local_device == "cpu" else f"local eager {local_device}"
    for side, label, color in (("device", f"Genie ({doc['device']})", "tab:blue"),
                               ("local", local_label, "tab:orange")):
        ax_time.fill_between(x, series(f"{side}_seconds_min", 1e3), series(f"{side}_seconds_max", 1e3), color=color,
                             alpha=0.15, linewidth=0)
        ax_time.plot(x, series(f"{side}_seconds", 1e3), "o-", ms=3, color=color, label=f"{label}, step")
    if any(v is not None for v in series("device_node_exec_us")):
        ax_time.plot(x, series("device_node_exec_us", 1e-3), "--", color="tab:green", label="node execution (Genie)")
    if any(v is not None for v in series("device_client_s")):
        ax_time.plot(x, series("device_client_s", 1e3), ":", color="tab:purple",
                     label="Genie's client time (recorder, request path)")
    ax_time.set_ylabel("ms per step")
    ax_time.set_ylim(bottom=0)
    ax_time.grid(alpha=0.3)
    ax_time.legend(fontsize=8, loc="upper right")
    ax_time.set_title(f"GPT-2 124M generate, {doc['tokens']} tokens after a {doc['prompt_tokens']}-token prompt: "
                      f"median of {doc['rounds_count']} rounds (band: min-max)", fontsize=9)
    for key, label, color in (("device_bytes_sent", "sent", "tab:red"), ("device_bytes_received", "received",
                                                                          "tab:brown")):
        values = series(key)
        if any(v is not None for v in values):
            ax_bytes.plot(x, values, "o-", ms=3, color=color, label=f"bytes {label}")
    ax_bytes.set_yscale("log", base=2)
    ax_bytes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: byte_label(v)))
    ax_bytes.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax_bytes.set_ylabel("bytes per step")
    ax_bytes.set_xlabel("step (0: prefill)")
    ax_bytes.grid(alpha=0.3)
    if ax_bytes.lines:
        shown = [v for line in ax_bytes.lines for v in line.get_ydata() if v]
        ax_bytes.set_ylim(2 ** math.floor(math.log2(min(shown))), 2 ** math.ceil(math.log2(max(shown)) + 0.01))
        trips = [t for t in series("device_round_trips")[1:] if t is not None]
        title = None
        if trips and steps[0].get("device_round_trips") is not None:
            low, high = min(trips), max(trips)
            title = (f"round trips per step: prefill {steps[0]['device_round_trips']:g}, decode "
                     + (f"{low:g}" if low == high else f"{low:g}-{high:g}"))
        ax_bytes.legend(fontsize=8, loc="center right", title=title, title_fontsize=8)
    host = doc["machine"]
    fig.suptitle(f"perf/bench_decode.py, {doc['date'][:16].replace('T', ' ')} UTC, commit {doc['commit']}, "
                 f"{host['cpu_model']} ({host['cpu_count']} cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:  # without importing genie
        plot(json.loads(args.json.read_text()), args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
        return 0
    doc = measure(args)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print_report(doc)
    if args.no_plot:
        print(f"wrote {args.json}", file=sys.stderr)
    else:
        plot(doc, args.plot)
        print(f"wrote {args.json} and {args.plot}", file=sys.stderr)
    return 0 if doc["ids_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
