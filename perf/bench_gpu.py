#!/usr/bin/env python3
"""GPU benchmark: Genie's embedded node on one CUDA GPU against UCX and local CUDA eager, in one run.

Four parts, each figure beside its baseline measured in the same run on the same machine:

  upload         host tensors (float32) of 1, 16, 64 and 256 MiB (256 not with --quick) put into
                 the node's GPU memory: ``t.to("remote_accelerator:0")`` (one PutTensors request,
                 answered once the node has copied the bytes into its device) then
                 ``genie.synchronize()``; best of ``--rounds`` after one warm-up, with the median and
                 the worst, in GB/s (10^9 B/s). ``genie.client_stats()`` confirms that each timed
                 call sent the tensor's bytes. Beside it: a local ``t.to("cuda:0")`` of the same
                 pageable tensor (the node's own last hop). On a CUDA node, both of the node's
                 upload paths (``genie-node --gpu-upload``): ``staged`` (into host memory, then one
                 copy up) and ``direct`` (UCX writes the device memory), one node each.
  ucx_perftest   the baseline of the upload: UCX's ``ucx_perftest -t tag_bw -m host,cuda`` (host
                 send buffer, CUDA receive buffer), libucx's binary, server and client on loopback,
                 the same sizes; and ``-m host`` (host to host) for reference. Its 'Final:' line's
                 overall bandwidth (MB/s, MB = 2^20 B) is converted to GB/s. A failed run (no CUDA
                 transport, say) is recorded with its output.
  decode         GPT-2 124M greedy decode, perf/bench_decode.py run with ``--local-device cuda:0``
                 and ``GENIE_EMBEDDED_DEVICE=cuda:0``: median step time on the node against local
                 CUDA eager, and whether both generated the same token ids.
  models         perf/bench_models.py's models (MiniLM, GPT-2, ResNet-50; random weights, no
                 download) with ``--local-device cuda:0``: times on both sides and its output checks.
  compile        GPT-2 124M decode with torch.compile, perf/bench_compile.py ``--device cuda:0``:
                 ``backend="genie"`` (the node on the GPU runs the AOT Inductor package) against
                 local ``backend="inductor"`` and local eager on the same GPU, in mode "default"
                 and in mode "reduce-overhead" (CUDA graphs on both sides); the same ids, the
                 node's package calls and CUDA graph replays, the package build times.

The environment (date, commit, GPU, driver, CUDA, torch, UCX and its transports) and every
table's command go to docs/perf/gpu.md and docs/perf/gpu.json, and to ``--out DIR`` as well.
Each part runs on its own: a failure is recorded (its traceback or output) and the others still
run; the exit status is 1 if any part failed, 2 without a CUDA device (unless --dry-run-cpu).

``--dry-run-cpu`` runs every part on the CPU (node and local side on cpu, ``ucx_perftest -m host``)
to check the script where there is no GPU; it writes only to ``--out`` (or a temporary folder),
never to docs/perf.

    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_gpu.py --quick --out "$OUT"     # on the GPU machine
    UCX_NET_DEVICES=lo .venv/bin/python perf/bench_gpu.py --dry-run-cpu --quick --out /tmp/gpu-dry
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "perf"
MIB = 1 << 20
PARTS = ("upload", "ucx_perftest", "decode", "models", "compile")


def say(message: str) -> None:
    print(f"bench_gpu: {message}", file=sys.stderr, flush=True)


class PartFailed(Exception):
    """A part that measured something and still failed: ``result`` is kept beside the error."""

    def __init__(self, result: dict, message: str):
        super().__init__(message)
        self.result = result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds, 8 tokens (under 3 minutes)")
    parser.add_argument("--dry-run-cpu", action="store_true",
                        help="everything on the CPU, ucx_perftest -m host; writes only to --out or a temporary folder")
    parser.add_argument("--out", metavar="DIR", type=pathlib.Path, help="also write gpu.md and gpu.json here")
    parser.add_argument("--rounds", type=int, help="upload rounds per size (default 10, --quick 5)")
    parser.add_argument("--parts", default="upload,ucx_perftest,decode,models,compile",
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--perftest-mem", help="ucx_perftest -m of the baseline (default host,cuda; dry run: host)")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    if args.rounds is None:
        args.rounds = 5 if args.quick else 10
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.dry_run_cpu and args.out and args.out.resolve() == DOCS.resolve():
        parser.error("--dry-run-cpu never writes to docs/perf")
    return args


@dataclass
class Mode:
    """Where each side runs: the node's device (GENIE_EMBEDDED_DEVICE), the local eager side's
    device, and ucx_perftest's memory types (the baseline first)."""
    gpu: bool
    node_device: str
    local_device: str
    perftest_mems: tuple
    sizes: tuple
    quick: bool
    rounds: int
    command: str

    @classmethod
    def of(cls, args, command: str) -> "Mode":
        gpu = not args.dry_run_cpu
        baseline = args.perftest_mem or ("host,cuda" if gpu else "host")
        mems = (baseline,) if baseline == "host" else (baseline, "host")
        sizes = tuple(n * MIB for n in ((1, 16, 64) if args.quick else (1, 16, 64, 256)))
        device = "cuda:0" if gpu else "cpu"
        return cls(gpu, device, device, mems, sizes, args.quick, args.rounds, command)


def size_label(size: int) -> str:
    return f"{size // MIB} MiB"


def gbps(size: int, seconds: float) -> float:
    return size / seconds / 1e9


# --------------------------------------------------------------------------------------------
# The environment

def run_text(command: list, env=None, timeout=30) -> str:
    """First line of ``command``'s standard output, or 'unavailable (why)'."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({type(error).__name__}: {error})"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return f"unavailable (exit {out.returncode}: {out.stderr.strip()[:200]})"
    return lines[0].strip()


def libucx_folder() -> pathlib.Path | None:
    try:
        import libucx
    except ImportError:
        return None
    return pathlib.Path(libucx.__file__).parent


def ucx_tool(name: str) -> tuple[str, dict]:
    """(path of a UCX tool, environment to run it in): libucx's bin/ with its lib/ on
    LD_LIBRARY_PATH (the wheel's binaries have no RPATH to it), else the tool on PATH."""
    env = dict(os.environ)
    folder = libucx_folder()
    if folder is not None and (folder / "bin" / name).exists():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(folder / "lib"), env.get("LD_LIBRARY_PATH")]))
        return str(folder / "bin" / name), env
    return shutil.which(name) or name, env


def ucx_version() -> str:
    tool, env = ucx_tool("ucx_info")
    try:
        out = subprocess.run([tool, "-v"], capture_output=True, text=True, timeout=30, env=env)
        for line in out.stdout.splitlines():
            if line.startswith("# Library version:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    folder = libucx_folder()
    return f"unknown (libucx {'absent' if folder is None else 'present, ucx_info failed'})"


def environment(mode: Mode) -> dict:
    import torch

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": run_text(["git", "rev-parse", "--short", "HEAD"]),
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "none (CPU build)",
        "nvidia_smi": run_text(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "ucx": ucx_version(), "ucx_tls": os.environ.get("UCX_TLS", "default"),
        "ucx_net_devices": os.environ.get("UCX_NET_DEVICES", "default"),
        "node_device": mode.node_device, "local_device": mode.local_device, "cpu_count": os.cpu_count(),
    }
    if env["commit"].startswith("unavailable"):
        env["commit"] = "unknown"
    if mode.gpu:
        try:
            props = torch.cuda.get_device_properties(0)
            env.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                       gpu_capability=f"{props.major}.{props.minor}")
        except Exception as error:  # noqa: BLE001 - recorded; the parts will fail on their own
            env["gpu"] = f"unknown ({type(error).__name__}: {error})"
    else:
        env["gpu"] = "none (dry run on the CPU)"
    return env


# --------------------------------------------------------------------------------------------
# Part 1: uploads into the node's memory, and a local copy to the local device

def spread(seconds: list, size: int) -> dict:
    """Bandwidths (GB/s) of the timed rounds: best, median, worst, and the seconds themselves."""
    rates = sorted((gbps(size, s) for s in seconds), reverse=True)
    return {"best_gbps": rates[0], "median_gbps": statistics.median(rates), "worst_gbps": rates[-1],
            "seconds": seconds}


def upload_once(tensor, device: str) -> tuple[float, int]:
    """(seconds, bytes sent) of one upload: ``tensor.to(device)``, then ``genie.synchronize()``;
    the uploaded copy is freed (untimed) before returning."""
    import genie

    before = genie.client_stats()["bytes_sent"]
    start = time.perf_counter()
    uploaded = tensor.to(device)
    genie.synchronize()
    seconds = time.perf_counter() - start
    sent = genie.client_stats()["bytes_sent"] - before
    del uploaded
    genie.synchronize()
    return seconds, sent


def local_copy_once(tensor, device: str) -> float:
    """Seconds of ``tensor.to(device)`` (a copy on the CPU), synchronized on a CUDA device."""
    import torch

    cuda = device.startswith("cuda")
    start = time.perf_counter()
    copied = tensor.to(device, copy=True)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    del copied
    return seconds


def import_genie():
    try:
        import genie  # installed (pip install -e .)
    except ImportError:
        sys.path.insert(0, str(ROOT / "python"))
        import genie
    return genie


def measure_upload(mode: Mode) -> dict:
    """Per size: Genie's uploads and the local copies, as ``spread``s (see the module docstring).
    On a CUDA node both of the node's upload paths, one node each (``--gpu-upload``, through
    GENIE_NODE_GPU_UPLOAD): ``staged`` (host memory, then one copy up) and ``direct`` (UCX
    writes device memory)."""
    import torch

    genie = import_genie()
    device = "remote_accelerator:0"
    paths = ["staged", "direct"] if torch.device(mode.node_device).type == "cuda" else ["staged"]
    rows = {size: {"size": size} for size in mode.sizes}
    node_info = {}
    for path in paths:
        os.environ["GENIE_NODE_GPU_UPLOAD"] = path  # the embedded node's environment
        genie.init()
        try:
            node = genie.get_device(0)
            if torch.device(node.device).type != torch.device(mode.node_device).type:
                raise RuntimeError(f"the node runs on {node.device!r}, not {mode.node_device!r}: is GENIE_SERVER set?")
            node_info = {"address": node.address, "device": node.device}
            key = "genie" if path == "staged" else f"genie_{path}"
            for size in mode.sizes:
                say(f"upload {size_label(size)} ({path}): {mode.rounds} rounds after a warm-up")
                tensor = torch.rand(size // 4)
                upload_once(tensor, device)
                uploads = [upload_once(tensor, device) for _ in range(mode.rounds)]
                short = [sent for _, sent in uploads if sent < size]
                if short:
                    raise RuntimeError(f"an upload of {size} bytes sent only {min(short)} bytes in its timed window")
                rows[size][key] = spread([s for s, _ in uploads], size)
                rows[size]["bytes_sent_per_upload"] = statistics.median(sent for _, sent in uploads)
                if path == "staged":
                    local_copy_once(tensor, mode.local_device)
                    rows[size]["local_copy"] = spread([local_copy_once(tensor, mode.local_device)
                                                       for _ in range(mode.rounds)], size)
                say(f"  genie ({path}) best {rows[size][key]['best_gbps']:.2f} GB/s")
                del tensor
        finally:
            genie.shutdown()
            os.environ.pop("GENIE_NODE_GPU_UPLOAD", None)
    return {"command": mode.command, "node": node_info, "paths": paths, "rows": list(rows.values())}


# --------------------------------------------------------------------------------------------
# Part 2: ucx_perftest tag_bw, host to the node's memory type

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest_iterations(size: int, quick: bool) -> tuple[int, int]:
    """(iterations, warm-up iterations): about 256 MiB (--quick) or 1 GiB moved, 10 to 1000 messages."""
    n = max(10, min(1000, (256 * MIB if quick else 1 << 30) // size))
    return n, max(2, n // 10)


def perftest_client_args(mem: str, size: int, quick: bool) -> list:
    n, warmup = perftest_iterations(size, quick)
    return ["-t", "tag_bw", "-m", mem, "-s", str(size), "-n", str(n), "-w", str(warmup)]


def perftest_once(mem: str, size: int, quick: bool) -> dict:
    """One ucx_perftest server + client pair on loopback: {"mb_s", "gbps", "iterations"} from
    the client's 'Final:' line, or {"error": the output} when it fails."""
    tool, env = ucx_tool("ucx_perftest")
    env.setdefault("UCX_NET_DEVICES", "lo")
    port = str(free_port())
    client = [tool, "-p", port, "127.0.0.1", *perftest_client_args(mem, size, quick)]
    try:
        server = subprocess.Popen([tool, "-p", port], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
    except OSError as error:
        return {"error": f"{tool}: {error}"}
    out = None
    try:
        time.sleep(0.7)
        out = subprocess.run(client, env=env, capture_output=True, text=True, timeout=120)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired as error:
        text = f"timed out after {error.timeout} s"
    finally:
        try:  # the server ends with its client; one whose client failed may wait for another
            server.wait(timeout=10 if out is not None and out.returncode == 0 else 2)
        except subprocess.TimeoutExpired:
            server.kill()
        server_text = server.communicate()[0] or ""
    for line in (out.stdout if out is not None else "").splitlines():
        if line.startswith("Final:"):
            # Final: iters  lat50  lat_avg  lat_overall  bw_avg  bw_overall  rate_avg  rate_overall
            mb_s = float(line.split()[6])
            return {"mb_s": mb_s, "gbps": mb_s * MIB / 1e9, "iterations": int(line.split()[1])}
    lines = (text.strip() + "\nserver:\n" + server_text.strip()).splitlines()
    tail = "\n".join([line for line in lines if not line.startswith(("+", "|"))][-30:])  # no table borders
    return {"error": f"{shlex.join(client)} (exit {out.returncode if out else 'timeout'}):\n{tail}"}


def measure_perftest(mode: Mode) -> dict:
    """Every memory type at every size; a failed point records its error and the rest go on."""
    tool, _ = ucx_tool("ucx_perftest")
    results, errors = {}, []
    for mem in mode.perftest_mems:
        results[mem] = {}
        for size in mode.sizes:
            say(f"ucx_perftest -m {mem} {size_label(size)}")
            point = perftest_once(mem, size, mode.quick)
            results[mem][str(size)] = point
            if "error" in point:
                errors.append(f"-m {mem}, {size_label(size)}: {point['error']}")
                say("  failed: " + point["error"].splitlines()[-1])
            else:
                say(f"  {point['gbps']:.2f} GB/s")
    volume = "256 MiB" if mode.quick else "1 GiB"
    command = (f"ucx_perftest -p PORT (server), ucx_perftest -p PORT 127.0.0.1 -t tag_bw -m MEM -s SIZE -n N -w W "
               f"(client; N moves about {volume}, 10 to 1000 messages; W = max(2, N/10)); e.g. 1 MiB: "
               f"{shlex.join(perftest_client_args(mode.perftest_mems[0], MIB, mode.quick))}")
    doc = {"tool": tool, "command": command, "results": results}
    if errors:
        raise PartFailed(doc, "ucx_perftest failed at some points:\n\n" + "\n\n".join(errors))
    return doc


# --------------------------------------------------------------------------------------------
# Parts 3 and 4: bench_decode.py and bench_models.py, as subprocesses with --json

def run_script(script: str, arguments: list, mode: Mode, json_path: pathlib.Path, timeout: int,
               summarize) -> dict:
    """Runs perf/<script> with GENIE_EMBEDDED_DEVICE set, echoing its output; returns
    ``summarize`` of its JSON document with "command" added. Raises PartFailed (with the
    summarized document, if any) when it exits non-zero."""
    command = [sys.executable, str(ROOT / "perf" / script), *arguments, "--json", str(json_path)]
    shown = f"GENIE_EMBEDDED_DEVICE={mode.node_device} perf/{script} {shlex.join(arguments)} --json FILE"
    env = dict(os.environ, GENIE_EMBEDDED_DEVICE=mode.node_device, PYTHONUNBUFFERED="1")
    say(f"running {shown}")
    tail = deque(maxlen=40)
    with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        watchdog = threading.Timer(timeout, process.kill)
        watchdog.start()
        try:
            for line in process.stdout:
                print(f"  | {line.rstrip()}", file=sys.stderr, flush=True)
                tail.append(line.rstrip())
        finally:
            watchdog.cancel()
            process.wait()
    if process.returncode < 0:
        tail.append(f"(killed: signal {-process.returncode}; the limit is {timeout} s)")
    doc = json.loads(json_path.read_text()) if json_path.exists() and json_path.stat().st_size else {}
    doc["command"] = shown
    if process.returncode != 0:
        raise PartFailed(summarize(doc), f"{shown} exited with {process.returncode}; its last lines:\n" + "\n".join(tail))
    return summarize(doc)


def measure_decode(mode: Mode, folder: pathlib.Path) -> dict:
    tokens, rounds = (8, 3) if mode.quick else (32, 5)
    arguments = ["--tokens", str(tokens), "--rounds", str(rounds), "--local-device", mode.local_device, "--no-plot"]
    return run_script("bench_decode.py", arguments, mode, folder / "decode.json", 300 if mode.quick else 900,
                      summarize_decode)


def summarize_decode(doc: dict) -> dict:
    """The prefill and the median decode step (over steps 1..) on both sides, and the ids."""
    if "per_step" not in doc:
        return doc

    def median_of(key, rows):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    rows = []
    for what, steps in (("prefill (step 0)", doc["per_step"][:1]),
                        (f"decode step (median of steps 1-{len(doc['per_step']) - 1})", doc["per_step"][1:])):
        rows.append({"what": what, "local_s": median_of("local_seconds", steps),
                     "remote_s": median_of("device_seconds", steps),
                     "node_exec_us": median_of("device_node_exec_us", steps),
                     "round_trips": median_of("device_round_trips", steps)})
    first = doc["rounds"][0]
    return {"command": doc["command"], "tokens": doc["tokens"], "rounds": doc["rounds_count"], "rows": rows,
            "ids_equal": doc["ids_equal"], "local_ids": first["local"]["ids"], "remote_ids": first["device"]["ids"]}


def measure_models(mode: Mode, folder: pathlib.Path) -> dict:
    arguments = ["--repeat", "2" if mode.quick else "3", "--local-device", mode.local_device, "--no-history"]
    if mode.quick:
        arguments.insert(0, "--quick")
    return run_script("bench_models.py", arguments, mode, folder / "models.json", 400 if mode.quick else 1200,
                      summarize_models)


def summarize_models(doc: dict) -> dict:
    """Per model: median seconds on both sides, the check; GPT-2's decode step as its own row."""
    if "models" not in doc:
        return doc
    rows = []
    for r in doc["models"]:
        if "skipped" in r:
            rows.append({"model": r["model"], "what": "skipped", "note": r["skipped"]})
            continue
        rows.append({"model": r["model"], "what": "run", "local_s": statistics.median(r["local_s"]),
                     "remote_s": statistics.median(r["device_s"]), "passed": r["passed"], "check": r["check"],
                     "note": r.get("note", "")})
        if "step" in r:
            rows.append({"model": r["model"], "what": f"decode step (median of {r['step']['steps_per_run']})",
                         "local_s": statistics.median(r["step"]["local_s"]),
                         "remote_s": statistics.median(r["step"]["device_s"]), "passed": r["passed"], "check": "",
                         "note": ""})
    return {"command": doc["command"], "repeat": doc["repeat"], "quick": doc["quick"], "rows": rows}


def measure_compile(mode: Mode, folder: pathlib.Path) -> dict:
    """perf/bench_compile.py's GPT-2 on the node's device, once per compile mode (the dry run:
    mode "default" only: CUDA graphs need a GPU)."""
    tokens, rounds = (8, 2) if mode.quick else (32, 3)
    out, failures = {"modes": {}}, []
    for compile_mode in (("default", "reduce-overhead") if mode.gpu else ("default",)):
        arguments = ["--models", "gpt2", "--device", mode.local_device, "--mode", compile_mode, "--tokens", str(tokens),
                     "--rounds", str(rounds), "--build-timeout", "400"]
        try:
            out["modes"][compile_mode] = run_script("bench_compile.py", arguments, mode,
                                                    folder / f"compile-{compile_mode}.json", 900, summarize_compile)
        except PartFailed as failed:  # the other mode still runs
            out["modes"][compile_mode] = failed.result
            failures.append(str(failed))
    if failures:
        raise PartFailed(out, "\n\n".join(failures))
    return out


def summarize_compile(doc: dict) -> dict:
    """bench_compile's GPT-2 result with its command."""
    results = doc.get("results") or [{}]
    return dict(results[0], command=doc.get("command", ""))


def run_part(name: str, measure) -> dict:
    """{"status": "ok" | "failed", "seconds", "result", "error": traceback or None}."""
    say(f"part {name} ...")
    start = time.monotonic()
    try:
        result, error = measure(), None
    except PartFailed as failed:
        result, error = failed.result, str(failed)
    except Exception:  # noqa: BLE001 - each part records its failure and the others still run
        result, error = None, traceback.format_exc()
    seconds = time.monotonic() - start
    say(f"part {name}: {'ok' if error is None else 'FAILED'} ({seconds:.1f} s)")
    if error is not None:
        print(error, file=sys.stderr, flush=True)
    return {"status": "ok" if error is None else "failed", "seconds": seconds, "result": result, "error": error}


# --------------------------------------------------------------------------------------------
# The report

def ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def ratio(remote, local) -> str:
    return "-" if remote is None or not local else f"{remote / local:.2f}x"


def table(headers: list, rows: list) -> list:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def not_measured(doc: dict, part: str) -> str:
    return "No result (see Errors)." if part in doc["parts"] else "Not run (`--parts`)."


def upload_section(doc: dict) -> list:
    mode = doc["mode"]
    upload = doc["parts"].get("upload", {}).get("result") or {}
    perftest = doc["parts"].get("ucx_perftest", {}).get("result") or {}
    mems = mode["perftest_mems"]
    local = mode["local_device"]
    lines = ["## Upload into the node's memory", "",
             f"Command: `{mode['command']}` (part upload: `t.to(\"remote_accelerator:0\")` then "
             f"`genie.synchronize()`, node on `{mode['node_device']}`; best of {mode['rounds']} after a warm-up, "
             f"(median, worst) in brackets; GB/s = 10^9 B/s). Baseline: "
             + (f"`{perftest['command']}`" if perftest.get("command") else "ucx_perftest (no result)")
             + ", at the sizes below (its MB/s = 2^20 B/s, converted).", ""]
    by_size = {r["size"]: r for r in upload.get("rows", [])}
    direct = "direct" in upload.get("paths", [])
    headers = ["size", "Genie upload GB/s" + (" (staged)" if direct else "")] + \
        (["Genie upload GB/s (direct)"] if direct else []) + [f"local t.to('{local}') GB/s"] + \
        [f"ucx_perftest -m {m} GB/s" for m in mems] + [f"Genie{' direct' if direct else ''} / perftest -m {mems[0]}"]

    def cell(s):
        return f"{s['best_gbps']:.2f} ({s['median_gbps']:.2f}, {s['worst_gbps']:.2f})" if s else "-"

    rows = []
    for size in mode["sizes"]:
        row = by_size.get(size) or {}
        points = [perftest.get("results", {}).get(m, {}).get(str(size), {}) for m in mems]
        cells = [f"{p['gbps']:.2f}" if "gbps" in p else ("failed" if "error" in p else "-") for p in points]
        base = points[0].get("gbps")
        best = row.get("genie_direct" if direct else "genie")
        rows.append([size_label(size), cell(row.get("genie"))] + ([cell(row.get("genie_direct"))] if direct else [])
                    + [cell(row.get("local_copy")), *cells, f"{best['best_gbps'] / base:.2f}" if best and base else "-"])
    lines += table(headers, rows)
    if upload.get("node"):
        lines += ["", f"Node: {upload['node']['device']} at {upload['node']['address']}; bytes sent per timed upload "
                  "(client_stats): " + ", ".join(f"{size_label(r['size'])}: {r['bytes_sent_per_upload']:.0f} B"
                                                 for r in upload.get("rows", []))]
    return lines + [""]


def decode_section(doc: dict) -> list:
    mode = doc["mode"]
    decode = doc["parts"].get("decode", {}).get("result") or {}
    lines = ["## GPT-2 124M decode: node against local eager on the same device", ""]
    if "rows" not in decode:
        return lines + [not_measured(doc, "decode"), ""]
    lines += [f"Command: `{decode['command']}` ({decode['tokens']} tokens, medians over {decode['rounds']} rounds "
              "after a warm-up each).", ""]
    rows = [[r["what"], ms(r["local_s"]), ms(r["remote_s"]), ratio(r["remote_s"], r["local_s"]),
             "-" if r["node_exec_us"] is None else ms(r["node_exec_us"] / 1e6),
             "-" if r["round_trips"] is None else f"{r['round_trips']:g}"] for r in decode["rows"]]
    lines += table(["step", f"local eager {mode['local_device']}", f"Genie (node on {mode['node_device']})",
                    "remote/local", "node exec", "round trips"], rows)
    lines += ["", f"Token ids equal in every round: **{'yes' if decode['ids_equal'] else 'NO'}** "
              f"(first round: local {decode['local_ids']}, remote {decode['remote_ids']})."]
    return lines + [""]


def models_section(doc: dict) -> list:
    mode = doc["mode"]
    models = doc["parts"].get("models", {}).get("result") or {}
    lines = ["## Models: node against local eager on the same device", ""]
    if "rows" not in models:
        return lines + [not_measured(doc, "models"), ""]
    lines += [f"Command: `{models['command']}` (medians over {models['repeat']} rounds after a warm-up each; "
              "checks as bench_models: MiniLM cosine >= 0.9999, GPT-2 ids equal, ResNet-50 top-5 equal).", ""]
    rows = []
    for r in models["rows"]:
        if r["what"] == "skipped":
            rows.append([r["model"], "skipped", "-", "-", "-", r["note"]])
            continue
        check = ("ok " if r["passed"] else "FAIL ") + r["check"] if r["check"] else ""
        rows.append([r["model"], r["what"], ms(r["local_s"]), ms(r["remote_s"]), ratio(r["remote_s"], r["local_s"]),
                     "; ".join(filter(None, [check, r["note"]]))])
    lines += table(["model", "what", f"local eager {mode['local_device']}", f"Genie (node on {mode['node_device']})",
                    "remote/local", "check"], rows)
    return lines + [""]


def compile_section(doc: dict) -> list:
    mode = doc["mode"]
    measured = (doc["parts"].get("compile", {}).get("result") or {}).get("modes", {})
    lines = ["## GPT-2 124M decode compiled: torch.compile(backend=\"genie\") against local inductor and eager", ""]
    rows = []
    for compile_mode, r in measured.items():
        if not r or "genie_ms" not in r:
            continue
        replays = r.get("cuda_graph_replays_per_run", [])
        rows.append([f"`{compile_mode}`", f"{r['eager_ms']:.2f} ms", f"{r['inductor_ms']:.2f} ms", f"{r['genie_ms']:.2f} ms",
                     f"{r['genie_vs_inductor']:.2f}x", f"{r['genie_vs_eager']:.2f}x",
                     "yes" if r["same_ids"] else "NO", f"{r['client_cpu_ms_per_call']:.2f} ms",
                     f"{r['bytes_sent_per_call']:.0f} B", ", ".join(map(str, r.get("package_calls_per_run", []))),
                     ", ".join(map(str, replays)) or "-", f"{r['node_build_cold_s']:.1f} s"])
    if not rows:
        return lines + [not_measured(doc, "compile"), ""]
    commands = "; ".join(f"`{r['command']}`" for r in measured.values() if r and r.get("command"))
    lines += [f"Commands: {commands}. Medians per decode step (steps 1 to tokens-1), the three sides alternated "
              "in one process after warm-ups.", ""]
    lines += table(["mode", f"local eager {mode['local_device']}", "local inductor", f"Genie (node on {mode['node_device']})",
                    "Genie/inductor", "Genie/eager", "same ids", "client CPU per step", "sent per step",
                    "package calls per run", "CUDA graph replays per run", "node package build"], rows)
    return lines + [""]


def markdown(doc: dict) -> str:
    env, mode = doc["environment"], doc["mode"]
    memory = f", {env['gpu_memory_bytes'] / (1 << 30):.1f} GiB" if "gpu_memory_bytes" in env else ""
    lines = ["# GPU benchmark: Genie's embedded node on one GPU against UCX and local eager", ""]
    if doc["dry_run"]:
        lines += ["**Dry run on the CPU** (`--dry-run-cpu`): node and local side on cpu, `ucx_perftest -m host`. "
                  "No figure here was measured on a GPU.", ""]
    lines += [f"Written by perf/bench_gpu.py; `{mode['command']}`. Parts: "
              + ", ".join(f"{name} {part['status']} ({part['seconds']:.0f} s)" for name, part in doc["parts"].items())
              + ".", ""]
    lines += table(["", ""], [
        ["date (UTC)", env["date"]], ["commit", env["commit"]], ["host", f"{env['host']}, {env['cpu_count']} CPUs"],
        ["GPU", f"{env['gpu']}{memory}" + (f", compute capability {env['gpu_capability']}"
                                           if "gpu_capability" in env else "")],
        ["nvidia-smi (name, driver, memory)", env["nvidia_smi"]],
        ["torch / its CUDA", f"{env['torch']} / {env['torch_cuda']}"], ["Python", env["python"]],
        ["UCX", f"{env['ucx']}; UCX_TLS {env['ucx_tls']}; UCX_NET_DEVICES {env['ucx_net_devices']}"],
        ["node / local eager device", f"GENIE_EMBEDDED_DEVICE={env['node_device']} / {env['local_device']}"]])
    lines.append("")
    lines += upload_section(doc) + decode_section(doc) + models_section(doc) + compile_section(doc)
    failed = {name: part for name, part in doc["parts"].items() if part["error"]}
    if failed:
        lines += ["## Errors", ""]
        for name, part in failed.items():
            lines += [f"### {name}", "", "```", part["error"].rstrip(), "```", ""]
    return "\n".join(lines)


def write_report(doc: dict, folders: list) -> None:
    text = markdown(doc)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu.md").write_text(text)
        (folder / "gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
        say(f"wrote {folder / 'gpu.md'} and {folder / 'gpu.json'}")
    print(text, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    import torch

    if not args.dry_run_cpu and not torch.cuda.is_available():
        print(f"bench_gpu: no CUDA device (torch {torch.__version__}, torch.version.cuda {torch.version.cuda}); "
              "run on a GPU machine, or pass --dry-run-cpu to check the script on the CPU", file=sys.stderr)
        return 2
    mode = Mode.of(args, shlex.join(["perf/bench_gpu.py", *(sys.argv[1:] if argv is None else argv)]))
    os.environ["GENIE_EMBEDDED_DEVICE"] = mode.node_device
    if os.environ.pop("GENIE_SERVER", None):
        say("GENIE_SERVER unset: this benchmark measures the embedded node")
    say(f"{'dry run on the CPU' if args.dry_run_cpu else 'GPU run'}: node {mode.node_device}, local "
        f"{mode.local_device}, ucx_perftest -m {', '.join(mode.perftest_mems)}, sizes "
        f"{', '.join(map(size_label, mode.sizes))}")
    doc = {"benchmark": "Genie's embedded node on one GPU against ucx_perftest and local eager",
           "dry_run": args.dry_run_cpu, "mode": mode.__dict__, "environment": environment(mode), "parts": {}}
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as scratch:
        measures = {"upload": lambda: measure_upload(mode), "ucx_perftest": lambda: measure_perftest(mode),
                    "decode": lambda: measure_decode(mode, pathlib.Path(scratch)),
                    "models": lambda: measure_models(mode, pathlib.Path(scratch)),
                    "compile": lambda: measure_compile(mode, pathlib.Path(scratch))}
        for name in args.parts:
            doc["parts"][name] = run_part(name, measures[name])
    doc["passed"] = all(part["status"] == "ok" for part in doc["parts"].values())
    folders = [] if args.dry_run_cpu else [DOCS]
    if args.out:
        folders.append(args.out)
    if not folders:
        folders.append(pathlib.Path(tempfile.mkdtemp(prefix="bench_gpu-dry-")))
    write_report(doc, folders)
    failed = [name for name, part in doc["parts"].items() if part["status"] != "ok"]
    say("all parts ok" if not failed else f"failed: {', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
