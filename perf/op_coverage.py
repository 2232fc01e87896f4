#!/usr/bin/env python3
"""Op coverage of the `remote_accelerator` device against PyTorch's OpInfo database.

For every entry of `torch.testing._internal.common_methods_invocations.op_db` (one row per
OpInfo name + variant) this runs the op's float32 sample inputs on the CPU, then on
`remote_accelerator:0` (every tensor of the sample moved there, recursively), brings the
result(s) back with `.cpu()` and compares them with `torch.testing.assert_close`.

    UCX_NET_DEVICES=lo HF_HUB_OFFLINE=1 .venv/bin/python perf/op_coverage.py \
        --json perf/op_coverage.json --markdown docs/perf/op_coverage.md

Rules (also written into the report):
- an op passes when each of its first `--samples` (default 8) samples passes;
- OpInfos without float32 on the CPU are "n/a (no float32)"; a sample whose CPU reference
  raises is skipped, an op all of whose samples do is "n/a (cpu reference failed)"; an op
  none of whose samples touches the remote device (no tensor in the sample and no
  `device=` argument to redirect) is "n/a (not exercised remotely)";
- a `device=` keyword argument naming the CPU is redirected to the remote device (factory ops);
- random ops (names containing rand, normal, bernoulli, dropout, ...) and samples whose CPU
  result changes with the seed (the reference runs under seed 1234, again under 4321, and
  under 1, 2, 3 too when the OpInfo wraps its op in wrapper_set_seed, which this harness turns
  into a plain call: dropout_p > 0, fractional_max_pool, pca_lowrank) run remotely under
  torch.manual_seed(1234) as well, which seeds the node's generator: on a CPU node they must
  equal the CPU reference exactly (the same generator algorithm); on another device (CUDA's
  generator draws other numbers) they compare only shapes and dtypes, as do ops returning
  uninitialized memory (empty*) everywhere;
- when the remote call fails because PyTorch wants an argument on the host ("... to be on
  cpu", tensor_split's indices) it is retried with only the sample's input on the device;
- tolerances: the largest float32 `toleranceOverride` among the OpInfo's decorators, else
  assert_close's float32 defaults; NaNs compare equal; only tensors and numbers are compared;
- each sample runs under a `signal.alarm` of `--timeout` seconds (20 by default).

The functions `load_op_db`, `select_ops` and `run_opinfo` are the harness that
tests/python/test_op_coverage.py imports.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import signal
import sys
import time
import traceback
import warnings

import torch

DEVICE = "remote_accelerator:0"
DEFAULT_SAMPLES = 8
DEFAULT_TIMEOUT_S = 20
TARGET = 0.95

# Substrings of OpInfo names whose CPU results are random (or uninitialized memory).
RANDOM_MARKERS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential",
                  "geometric", "cauchy", "poisson", "rrelu", "empty", "random", "fractional", "lowrank")
UNINITIALIZED_MARKERS = ("empty",)  # their values are whatever the memory held: never compared


# ---- loading op_db ----------------------------------------------------------------------------

def load_op_db():
    """PyTorch's op_db (its test utilities need `expecttest`, in python/requirements-test.txt)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal import common_methods_invocations as cmi
    # The random OpInfos wrap their op in wrapper_set_seed (torch.manual_seed(42) first), which
    # makes the CPU reference repeatable but says nothing of the node's generator. Without the
    # reseeding, _cpu_is_random sees these samples change with the seed and compares shapes only.
    cmi.wrapper_set_seed = _call_unseeded
    return cmi.op_db


_seeded_calls = [0]  # how many times an OpInfo called wrapper_set_seed (it declares the op random)


def _call_unseeded(op, *args, **kwargs):
    _seeded_calls[0] += 1
    return op(*args, **kwargs)


def row_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def select_ops(op_db, names=None, limit=None):
    """The rows to run: those named (an OpInfo name selects all its variants; "name.variant"
    selects one), in op_db order, then the first `limit`."""
    rows = list(op_db)
    if names:
        wanted = set(names)
        rows = [o for o in rows if o.name in wanted or row_name(o) in wanted]
    if limit is not None:
        rows = rows[:limit]
    return rows


# ---- moving samples and results ---------------------------------------------------------------

def _map(obj, fn):
    """`fn` applied to every tensor in obj (lists, tuples, dicts recursively)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_map(x, fn) for x in obj]
    if isinstance(obj, tuple):
        mapped = [_map(x, fn) for x in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*mapped)
        try:
            return type(obj)(mapped)  # torch.return_types structseqs, plain tuples
        except TypeError:
            return tuple(mapped)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.clone()


def _to_remote(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEVICE)


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


def _remote_kwargs(kwargs: dict) -> dict:
    out = _map(kwargs, _to_remote)
    dev = out.get("device")
    if dev is not None and torch.device(dev).type == "cpu":
        out["device"] = DEVICE
    return out


def _has_remote(obj) -> bool:
    found = []
    _map(obj, lambda t: found.append(t.device.type == "remote_accelerator") or t)
    return any(found)


def _leaves(obj, out: list) -> list:
    """Tensors and numbers of a result, in order (None, strings, dtypes... are left out)."""
    if isinstance(obj, torch.Tensor) or (isinstance(obj, (bool, int, float, complex))):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _leaves(x, out)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _leaves(obj[k], out)
    return out


# ---- comparing --------------------------------------------------------------------------------

def is_random(opinfo) -> bool:
    name = row_name(opinfo).lower()
    return any(m in name for m in RANDOM_MARKERS)


def is_uninitialized(opinfo) -> bool:
    name = row_name(opinfo).lower()
    return any(m in name for m in UNINITIALIZED_MARKERS)


def node_draws_like_the_cpu() -> bool:
    """Whether remote_accelerator:0 is a CPU node: seeded the same, it draws the CPU's numbers."""
    import genie
    return genie.get_device(0).device == "cpu"


def tolerances(opinfo):
    """(atol, rtol) for float32 from the OpInfo's toleranceOverride decorators, else None."""
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo
    atol = rtol = None
    for d in getattr(opinfo, "decorators", ()) or ():
        decorators = d.decorators if isinstance(d, DecorateInfo) else [d]
        for x in decorators:
            if isinstance(x, toleranceOverride) and torch.float32 in x.d:
                tol = x.d[torch.float32]
                atol = tol.atol if atol is None else max(atol, tol.atol)
                rtol = tol.rtol if rtol is None else max(rtol, tol.rtol)
    return None if atol is None else (atol, rtol)


def compare(actual, expected, random: bool, tol) -> None:
    """Raises AssertionError when the remote result differs from the CPU reference."""
    a, e = _leaves(actual, []), _leaves(expected, [])
    if len(a) != len(e):
        raise AssertionError(f"result structure: {len(a)} tensors/numbers remotely, {len(e)} on the CPU")
    for i, (x, y) in enumerate(zip(a, e)):
        if random:
            if isinstance(y, torch.Tensor):
                if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                    got = (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
                    raise AssertionError(f"output {i}: {got} vs {(tuple(y.shape), y.dtype)} on the CPU")
            continue
        kw = {"atol": tol[0], "rtol": tol[1]} if tol else {}
        try:
            torch.testing.assert_close(x, y, equal_nan=True, **kw)
        except AssertionError as err:
            bits = " (the CPU result has the conjugate bit set)" if isinstance(y, torch.Tensor) and y.is_conj() else \
                " (the CPU result has the negative bit set)" if isinstance(y, torch.Tensor) and y.is_neg() else ""
            raise AssertionError(f"output {i}{bits}: {str(err).strip()}") from None


# ---- running one op ---------------------------------------------------------------------------

class SampleTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise SampleTimeout("sample timed out")


def _one_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # assert_close's first line is generic ("Tensor-likes are not close!"): keep the next one.
    line = " ".join(lines[:2]) if lines and lines[0].endswith(("not close!", "not equal!")) and len(lines) > 1 \
        else (lines[0] if lines else "")
    line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _genie_frames(error: BaseException) -> list[str]:
    """"module.function" of the genie frames the exception passed through, innermost last."""
    frames = []
    for fs in traceback.extract_tb(error.__traceback__):
        path = fs.filename.replace(os.sep, "/")
        if "/genie/" in path and "/op_coverage" not in path:
            frames.append(f"{os.path.splitext(os.path.basename(path))[0]}.{fs.name}")
    return frames


def categorize(error: BaseException, stage: str) -> str:
    """A reason category for a failing sample."""
    text = str(error)
    low = text.lower()
    frames = _genie_frames(error)
    if isinstance(error, SampleTimeout):
        return "timeout"
    if stage == "compare":
        if "conjugate bit" in low or "negative bit" in low:
            return "mismatch (conj/neg bit view)"
        return "mismatch (wrong values)" if "not close" in low or "not equal" in low else \
            "mismatch (shape/dtype/structure)"
    if "sparse" in low:
        return "sparse layout"
    if "is invalid for input of size" in low and any(f.startswith("runtime.") for f in frames):
        return "meta shape differs from the node's"
    code = getattr(error, "code", None)
    if code is not None and type(error).__name__ == "GenieRemoteError":
        return f"remote {code}"
    if type(error).__name__ == "GenieConnectionError":
        return "connection lost"
    if "wire dtype" in low:
        return "unsupported dtype (wire)"
    if "no meta kernel" in low or "data-dependent" in low or "_record_with_remote_shapes" in " ".join(frames):
        return "no meta kernel/data-dependent"
    if any(f.endswith("infer_shapes") for f in frames):
        return "shape inference (meta)"
    if "same device" in low or "devices" in low and "expected" in low:
        return "device mixing"
    if any(f.startswith("lower.") or f.endswith(".encode") for f in frames) or "cannot encode" in low \
            or "unsupported argument" in low:
        return "unsupported argument (lowering)"
    if frames:
        return f"frontend {type(error).__name__} ({frames[-1]})"
    if stage == "to_remote":
        return "moving the sample to the device"
    return f"{type(error).__name__} outside genie"


def run_opinfo(opinfo, max_samples: int = DEFAULT_SAMPLES, timeout_s: int = DEFAULT_TIMEOUT_S,
               exact_random: bool | None = None) -> dict:
    """Runs one OpInfo row on the CPU and on the remote device. Returns a JSON-able dict:
    name, status ("pass", "fail", "n/a (...)"), and for failures the sample index, exception
    type, one-line reason, category, stage. `exact_random`: compare random results' values
    (default: when the node is a CPU node, `node_draws_like_the_cpu`).

    Every read goes to the node: host evaluation (genie.host_eval) would answer the integer
    ops of small samples on the host's CPU, and the node's kernels would go untested."""
    from genie import host_eval

    saved = host_eval.is_enabled()
    host_eval.set_enabled(False)
    try:
        return _run_opinfo(opinfo, max_samples, timeout_s, exact_random)
    finally:
        host_eval.set_enabled(saved)


def _run_opinfo(opinfo, max_samples: int, timeout_s: int, exact_random: bool | None) -> dict:
    import genie  # noqa: F401  (registers the device; the node starts on first use)

    if exact_random is None:
        exact_random = node_draws_like_the_cpu()
    uninitialized = is_uninitialized(opinfo)
    result = {"name": row_name(opinfo), "op": opinfo.name, "variant": opinfo.variant_test_name,
              "random": is_random(opinfo), "samples_run": 0, "cpu_failed_samples": 0}
    start = time.perf_counter()
    try:
        supported = torch.float32 in opinfo.supported_dtypes("cpu")
    except Exception:  # noqa: BLE001
        supported = False
    if not supported:
        result.update(status="n/a (no float32)", time_s=0.0)
        return result
    tol = tolerances(opinfo)
    if tol:
        result["tolerance"] = {"atol": tol[0], "rtol": tol[1]}

    previous = signal.signal(signal.SIGALRM, _alarm)
    exercised = False
    failure = None
    try:
        try:
            signal.alarm(timeout_s)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = list(itertools.islice(
                    opinfo.sample_inputs("cpu", torch.float32, requires_grad=False), max_samples or None))
        except Exception as error:  # noqa: BLE001
            result.update(status="n/a (sample generation failed)", reason=_one_line(error))
            return result
        finally:
            signal.alarm(0)
        for index, sample in enumerate(samples):
            stage = "cpu"
            try:
                signal.alarm(timeout_s)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    # The remote copy is made before the CPU run: in-place ops mutate their inputs.
                    stage = "to_remote"
                    r_input = _map(sample.input, _to_remote)
                    r_args = _map(tuple(sample.args), _to_remote)
                    r_kwargs = _remote_kwargs(dict(sample.kwargs))
                    stage = "cpu"
                    try:
                        expected = _cpu_run(opinfo, sample, seed=1234)
                    except SampleTimeout:
                        raise
                    except Exception:  # noqa: BLE001 - the reference itself fails: skip the sample
                        result["cpu_failed_samples"] += 1
                        continue
                    random = result["random"] or _cpu_is_random(opinfo, sample, expected)
                    if random and not result["random"]:
                        result["random_samples"] = result.get("random_samples", 0) + 1
                    stage = "remote"
                    torch.manual_seed(1234)  # as the CPU reference's run: seeds the node's generator too
                    try:
                        actual = opinfo(r_input, *r_args, **r_kwargs)
                    except RuntimeError as error:
                        if "to be on cpu" not in str(error).lower():
                            raise
                        # An argument PyTorch wants on the host (tensor_split's indices): keep
                        # every tensor but the input there, as a CUDA user would.
                        r_args, r_kwargs = tuple(sample.args), dict(sample.kwargs)
                        actual = opinfo(r_input, *r_args, **r_kwargs)
                        result["cpu_args_retry"] = True
                    if _has_remote((r_input, r_args, r_kwargs, actual)):
                        exercised = True
                        result["samples_remote"] = result.get("samples_remote", 0) + 1
                    stage = "to_cpu"
                    actual = _map(actual, _to_cpu)
                    stage = "compare"
                    result["samples_run"] += 1
                    compare(actual, expected, uninitialized or (random and not exact_random), tol)
            except Exception as error:  # noqa: BLE001 - every failure is recorded
                failure = {"sample": index, "stage": stage, "exception": type(error).__name__,
                           "reason": _one_line(error), "category": categorize(error, stage),
                           "sample_desc": _describe_sample(sample)}
                break
            finally:
                signal.alarm(0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        result["time_s"] = round(time.perf_counter() - start, 3)

    if failure is not None:
        result.update(status="fail", **failure)
    elif result["samples_run"] == 0 and result["cpu_failed_samples"]:
        result["status"] = "n/a (cpu reference failed)"
    elif result["samples_run"] == 0:
        result["status"] = "n/a (no samples)"
    elif not exercised:
        result["status"] = "n/a (not exercised remotely)"
    else:
        result["status"] = "pass"
    return result


def _cpu_run(opinfo, sample, seed: int):
    torch.manual_seed(seed)
    return opinfo(_map(sample.input, _clone), *_map(tuple(sample.args), _clone), **_map(dict(sample.kwargs), _clone))


def _cpu_is_random(opinfo, sample, expected) -> bool:
    """True when a CPU run under another seed gives other values (dropout_p > 0,
    fractional_max_pool's random samples, randomized low-rank algorithms, ...). One more seed
    for every op; four for the ops whose OpInfo calls wrapper_set_seed (small random samples
    can repeat under two seeds)."""
    before = _seeded_calls[0]
    seeds = [4321]
    try:
        i = 0
        while i < len(seeds):
            compare(_cpu_run(opinfo, sample, seed=seeds[i]), expected, False, None)
            i += 1
            if i == 1 and _seeded_calls[0] != before:
                seeds += [1, 2, 3]
        return False
    except SampleTimeout:
        raise
    except Exception:  # noqa: BLE001
        return True


def _describe_sample(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}{str(x.dtype).replace('torch.', '')}"
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(d(y) for y in x) + "]"
        return repr(x)
    parts = [d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:197] + "..."


# ---- report -----------------------------------------------------------------------------------

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def totals(results: list[dict]) -> dict:
    passed = sum(r["status"] == "pass" for r in results)
    failed = sum(r["status"] == "fail" for r in results)
    na = len(results) - passed - failed
    rate = passed / (passed + failed) if passed + failed else 0.0
    return {"tried": len(results), "passed": passed, "failed": failed, "n/a": na, "pass_rate": rate}


def markdown(meta: dict, results: list[dict]) -> str:
    t = meta["totals"]
    out = [
        "# Op coverage of remote_accelerator against PyTorch's OpInfo database",
        "",
        f"- Date: {meta['date']}",
        f"- Command: `{meta['command']}`",
        f"- Machine: {meta['machine']} (the embedded genie-node on loopback, executing on its CPU)",
        f"- torch {meta['torch']}; {t['tried']} op_db rows (OpInfo name + variant); wall time {meta['wall_s']:.0f} s",
        f"- Per op: float32 CPU samples, the first {meta['samples']} of each (an op passes when all of "
        f"them pass); {meta['timeout_s']} s alarm per sample. Random ops (names containing "
        + ", ".join(m for m in RANDOM_MARKERS if m not in UNINITIALIZED_MARKERS) + ") and samples whose CPU "
        "result changes with the seed (reference under seed 1234, rerun under 4321, and also 1, 2, 3 for "
        "OpInfos that use wrapper_set_seed, which is disabled) run remotely under torch.manual_seed(1234) "
        "too, which seeds the node's generator: "
        + ("their values must equal the CPU reference (a CPU node draws with the CPU's generator). "
           if meta.get("exact_random") else "they compare shapes and dtypes only (the node's generator is not "
           "the CPU's). ")
        + "Ops returning uninitialized memory (" + ", ".join(m + "*" for m in UNINITIALIZED_MARKERS)
        + ") compare shapes and dtypes only. "
        "When PyTorch wants an argument on the host ('to be on cpu'), the sample is retried with "
        "only its input on the device. "
        "Tolerances: the OpInfo's largest float32 toleranceOverride, else assert_close's defaults; "
        "equal_nan=True. `device='cpu'` keyword arguments are redirected to the remote device.",
        "",
        "## Totals",
        "",
        "| tried | passed | failed | n/a | pass rate = passed / (passed + failed) | target |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {t['tried']} | {t['passed']} | {t['failed']} | {t['n/a']} | **{100 * t['pass_rate']:.1f}%** | "
        f">= {100 * TARGET:.0f}% ({'met' if t['pass_rate'] >= TARGET else 'not met'}) |",
        "",
    ]
    na: dict[str, list[str]] = {}
    for r in results:
        if r["status"].startswith("n/a"):
            na.setdefault(r["status"], []).append(r["name"])
    if na:
        out += ["n/a breakdown:", ""]
        for status, names in sorted(na.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(f"`{n}`" for n in names[:40]) + (f", ... ({len(names) - 40} more)" if len(names) > 40 else "")
            out.append(f"- {status}: {len(names)}: {shown}")
        out.append("")

    fails = [r for r in results if r["status"] == "fail"]
    by_cat: dict[str, list[dict]] = {}
    for r in fails:
        by_cat.setdefault(r["category"], []).append(r)
    cats = sorted(by_cat.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    out += ["## Failures by category", "", "| category | ops |", "|---|---:|"]
    out += [f"| {c} | {len(rs)} |" for c, rs in cats]
    out.append("")
    for c, rs in cats:
        out += [f"### {c} ({len(rs)})", "", "| op | sample | stage | reason |", "|---|---:|---|---|"]
        for r in sorted(rs, key=lambda r: r["name"]):
            reason = r["reason"].replace("|", "\\|").replace("`", "'")
            out.append(f"| `{r['name']}` | {r['sample']} | {r['stage']} | {reason} |")
        out.append("")
    extra = meta.get("more_samples")
    if extra:
        xt = extra["meta"]["totals"]
        ours = {r["name"]: r for r in results}
        more = [r for r in extra["results"] if r["status"] == "fail" and ours.get(r["name"], {}).get("status") == "pass"]
        out += [f"## With every sample ({extra['meta']['command'].split('perf/op_coverage.py', 1)[1].strip()})", "",
                f"The same sweep with all of each op's samples ({extra['meta']['date']}, "
                f"{extra['meta']['wall_s']:.0f} s): passed {xt['passed']}, failed {xt['failed']}, n/a {xt['n/a']}, "
                f"pass rate {100 * xt['pass_rate']:.1f}%. Ops that pass above but fail with more samples:", ""]
        if more:
            out += ["| op | sample | category | reason |", "|---|---:|---|---|"]
            for r in sorted(more, key=lambda r: r["name"]):
                reason = r["reason"].replace("|", "\\|").replace("`", "'")
                out.append(f"| `{r['name']}` | {r['sample']} | {r['category']} | {reason} |")
        else:
            out.append("none.")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (or name.variant)")
    p.add_argument("--limit", type=int, help="only the first N op_db rows")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples per op (default 8; 0: all)")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds per sample (default 20)")
    p.add_argument("--json", help="write the per-op results here")
    p.add_argument("--markdown", help="write the Markdown report here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--more-samples-json", help="a --json of a run with more samples (--samples 0): its extra "
                   "failures are appended to the Markdown report")
    a = p.parse_args(argv)

    op_db = load_op_db()
    rows = select_ops(op_db, a.ops.split(",") if a.ops else None, a.limit)
    import genie  # noqa: F401
    exact_random = node_draws_like_the_cpu()
    start = time.perf_counter()
    results = []
    for i, opinfo in enumerate(rows):
        r = run_opinfo(opinfo, a.samples, a.timeout, exact_random)
        results.append(r)
        if not a.quiet:
            extra = f"  [{r['category']}] {r['reason']}" if r["status"] == "fail" else ""
            print(f"[{i + 1}/{len(rows)}] {r['name']}: {r['status']} ({r.get('time_s', 0):.2f}s){extra}", flush=True)
    wall = time.perf_counter() - start
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["UCX_NET_DEVICES=lo HF_HUB_OFFLINE=1", ".venv/bin/python", "perf/op_coverage.py"]
                            + (argv if argv is not None else sys.argv[1:])),
        "machine": machine(), "torch": torch.__version__, "python": platform.python_version(),
        "samples": a.samples, "timeout_s": a.timeout, "wall_s": round(wall, 1), "totals": totals(results),
        "target": TARGET, "exact_random": exact_random,
    }
    if a.more_samples_json:
        with open(a.more_samples_json) as f:
            meta["more_samples"] = json.load(f)
    t = meta["totals"]
    print(f"tried {t['tried']}, passed {t['passed']}, failed {t['failed']}, n/a {t['n/a']}, "
          f"pass rate {100 * t['pass_rate']:.1f}% (target >= {100 * TARGET:.0f}%), {wall:.0f} s", flush=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"meta": {k: v for k, v in meta.items() if k != "more_samples"}, "results": results}, f,
                      indent=1, default=str)
    if a.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(a.markdown)), exist_ok=True)
        with open(a.markdown, "w") as f:
            f.write(markdown(meta, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
