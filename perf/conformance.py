#!/usr/bin/env python3
"""Eager parity of `remote_accelerator` against PyTorch's device-generic test suites (issue 23).

Runs PyTorch's own device-generic test files (`test_view_ops.py`, `test_indexing.py`,
`test_shape_ops.py`, `test_binary_ufuncs.py`, `test_reductions.py`, `test_type_promotion.py`,
`test_torch.py`) from a PyTorch source tree given by path, once with only the CPU
(`PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu`, the baseline) and once with only `remote_accelerator`,
and writes per file pass/fail/skip counts, run times, the CPU/device parity and the failures
grouped by cause to a Markdown report with a JSON file beside it.

    flock /tmp/genie-perf.lock .venv/bin/python perf/conformance.py \\
        --pytorch-tests /work/pytorch-tests/<commit>/test --files test_shape_ops.py \\
        --timeout-s 900 --merge --out docs/perf/conformance.md

How a file runs: each (file, device) pair is a subprocess, `python perf/conformance.py --worker`,
in the file's folder with `PYTORCH_TESTING_DEVICE_ONLY_FOR=<device>` and `UCX_NET_DEVICES=lo`.
The worker imports `genie` first (so `instantiate_device_type_tests` sees the PrivateUse1 backend
and adds `PrivateUse1TestBase`), then runs pytest in-process (`-p no:cacheprovider`) with a small
plugin (`_Recorder`) that appends one JSON line per test event to a file: a file cut off by its
time cap still leaves the outcomes of the tests that finished. A worker that dies (a crash, a
signal) is restarted without the tests already done; the test that was running is recorded as
failed ("worker died"). Each test runs under a `signal.alarm` of `--test-timeout-s`.

The suites are not part of this project: point `--pytorch-tests` at a PyTorch checkout's `test/`
(the release matching the installed torch where possible). The report names the files' git blob
ids so the exact versions can be found again.

Failures are grouped by cause: exception type + the first line of its message with numbers,
shapes, dtypes and addresses replaced by placeholders (`normalize_message`), with the innermost
Genie frame the exception passed through, a count and an example test id.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import fcntl
import gzip
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import pytest

DEFAULT_FILES = ("test_view_ops.py", "test_indexing.py", "test_shape_ops.py", "test_binary_ufuncs.py",
                 "test_reductions.py", "test_type_promotion.py", "test_torch.py")
DEVICES = ("cpu", "remote_accelerator")
DEFAULT_TIMEOUT_S = 900
DEFAULT_TEST_TIMEOUT_S = 120
TARGET = 0.99
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Outcomes a test can have in the report.
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


# ---- the worker: one file on one device, in this process ---------------------------------------

class TestTimeout(Exception):
    """A test ran past --test-timeout-s."""


class _Recorder:
    """pytest plugin: one JSON line per event (collected, start, result, finish), flushed at once.

    A result line: {"event": "result", "id": nodeid, "outcome": one of OUTCOMES, "time_s": float,
    and for failures "exc_type", "message" (the exception's text, at most 2,000 characters),
    "genie_frame" (innermost genie frame, "module.function"), "where" (setup/call/teardown);
    for skips "reason"}."""

    def __init__(self, events_path: str, exclude: set[str], test_timeout_s: int) -> None:
        self._f = open(events_path, "a", buffering=1)
        self._exclude = exclude
        self._test_timeout_s = test_timeout_s
        self._reports: dict[str, list] = {}

    def _write(self, record: dict) -> None:
        self._f.write(json.dumps(record, default=str) + "\n")
        self._f.flush()

    def pytest_collection_modifyitems(self, session, config, items):
        if self._exclude:
            items[:] = [it for it in items if it.nodeid not in self._exclude]

    def pytest_collection_finish(self, session):
        self._write({"event": "collected", "n": len(session.items)})

    def pytest_runtest_logstart(self, nodeid, location):
        self._write({"event": "start", "id": nodeid})

    def _alarm(self, signum, frame):
        raise TestTimeout(f"test ran past {self._test_timeout_s} s")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """The alarm covers the test body only."""
        if self._test_timeout_s:
            signal.signal(signal.SIGALRM, self._alarm)
            signal.alarm(self._test_timeout_s)
        try:
            return (yield)
        finally:
            signal.alarm(0)

    def pytest_runtest_makereport(self, item, call):
        info = {"when": call.when, "duration": call.duration}
        if call.excinfo is not None:
            error = call.excinfo.value
            # assertEqual's "Comparing ... resulted in the unexpected exception above": the cause is the one above.
            inner = error.__cause__ or error.__context__
            if inner is not None and str(error).startswith("Comparing"):
                error = inner
            info["exc_type"] = type(error).__name__
            try:
                info["message"] = str(error)[:2000]
            except Exception:  # noqa: BLE001 - a message that fails to print
                info["message"] = "<unprintable message>"
            info["genie_frame"] = _genie_frame(call.excinfo.tb)
            if call.excinfo.errisinstance(TestTimeout):
                info["exc_type"] = "TestTimeout"
        self._reports.setdefault(item.nodeid, []).append(info)

    def pytest_runtest_logreport(self, report):
        infos = self._reports.setdefault(report.nodeid, [])
        for info in infos:
            if info["when"] == report.when:
                info["outcome"] = report.outcome
                if hasattr(report, "wasxfail"):
                    info["wasxfail"] = True
                if report.skipped and isinstance(report.longrepr, tuple):
                    info["reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
                break

    def pytest_runtest_logfinish(self, nodeid, location):
        infos = self._reports.pop(nodeid, [])
        self._write(_result_record(nodeid, infos))

    def pytest_sessionfinish(self, session, exitstatus):
        self._write({"event": "finish", "exitstatus": int(exitstatus)})
        self._f.close()


def _genie_frame(tb) -> str | None:
    frame = None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/genie/" in path:
            frame = f"{os.path.splitext(os.path.basename(path))[0]}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return frame


def _result_record(nodeid: str, infos: list[dict]) -> dict:
    """One test's outcome from its setup/call/teardown reports."""
    record = {"event": "result", "id": nodeid, "time_s": round(sum(i.get("duration", 0.0) for i in infos), 3)}
    by_when = {i["when"]: i for i in infos}
    call = by_when.get("call")
    bad = [i for i in infos if i.get("outcome") == "failed"]
    if call is not None and call.get("wasxfail"):
        record["outcome"] = "xfailed" if call.get("outcome") == "skipped" else "xpassed"
    elif bad:
        first = bad[0]
        record["outcome"] = "failed" if first["when"] == "call" else "error"
        record.update({k: first[k] for k in ("exc_type", "message", "genie_frame", "when") if k in first})
    elif any(i.get("outcome") == "skipped" for i in infos):
        skipped = next(i for i in infos if i.get("outcome") == "skipped")
        record["outcome"] = "skipped"
        record["reason"] = skipped.get("reason", "")
    else:
        record["outcome"] = "passed"
    return record


def run_worker(test_file: str, device: str, events_path: str, exclude_path: str | None,
               test_timeout_s: int) -> int:
    """Runs one test file with pytest in this process; returns pytest's exit status."""
    os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = device
    if device != "cpu":
        import genie  # noqa: F401  (registers PrivateUse1 before common_device_type is imported)
    exclude: set[str] = set()
    if exclude_path:
        with open(exclude_path) as f:
            exclude = {line.rstrip("\n") for line in f if line.strip()}
    folder, name = os.path.split(os.path.abspath(test_file))
    os.chdir(folder)
    sys.path.insert(0, folder)
    sys.argv = [name]  # torch's common_utils parses sys.argv when imported
    return int(pytest.main([name, "-p", "no:cacheprovider", "-q", "--tb=no", "-o", "addopts=",
                            "-o", "console_output_style=classic"],
                           plugins=[_Recorder(events_path, exclude, test_timeout_s)]))


# ---- the driver: subprocesses, caps, restarts --------------------------------------------------

def _worker_env(device: str) -> dict:
    env = dict(os.environ)
    env.update({"PYTORCH_TESTING_DEVICE_ONLY_FOR": device, "UCX_NET_DEVICES": "lo", "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1", "GENIE_PROGRESS": "0"})
    return env


def _read_events(path: str) -> list[dict]:
    events = []
    if not os.path.exists(path):
        return events
    with open(path) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut off by a kill
                pass
    return events


class _Lock:
    """An exclusive flock on `path` (the perf lock other benchmarks take), or nothing."""

    def __init__(self, path: str | None) -> None:
        self._path, self._fd = path, None

    def __enter__(self):
        if self._path:
            self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def run_file(test_file: str, device: str, timeout_s: int, test_timeout_s: int, log_dir: str,
             lock_path: str | None = None, quiet: bool = False) -> dict:
    """Runs `test_file` on `device` within `timeout_s` seconds of wall time (the lock wait not
    counted). Returns {"device", "collected", "results": [result records], "time_s",
    "timed_out", "restarts", "worker_deaths": [...], "log"}."""
    name = os.path.basename(test_file)
    stem = f"{os.path.splitext(name)[0]}.{device}"
    events_path = os.path.join(log_dir, stem + ".events.jsonl")
    log_path = os.path.join(log_dir, stem + ".log")
    exclude_path = os.path.join(log_dir, stem + ".exclude")
    for p in (events_path, exclude_path):
        if os.path.exists(p):
            os.remove(p)
    results: dict[str, dict] = {}
    deaths: list[dict] = []
    collected = None
    timed_out = False
    restarts = 0
    with _Lock(lock_path), open(log_path, "w") as log:
        start = time.perf_counter()
        while True:
            left = timeout_s - (time.perf_counter() - start)
            if left <= 0:
                timed_out = True
                break
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", os.path.abspath(test_file),
                   "--device", device, "--events", events_path, "--test-timeout-s", str(test_timeout_s)]
            if results:
                with open(exclude_path, "w") as f:
                    f.write("\n".join(results) + "\n")
                cmd += ["--exclude", exclude_path]
            proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.abspath(test_file)), env=_worker_env(device),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc, timed_out = None, True
            events = _read_events(events_path)
            started, finished = None, False
            for e in events:
                if e["event"] == "collected" and collected is None:
                    collected = e["n"]
                elif e["event"] == "start":
                    started = e["id"]
                elif e["event"] == "result":
                    results[e["id"]] = e
                    started = None if started == e["id"] else started
                elif e["event"] == "finish":
                    finished = True
            if timed_out or finished or rc in (0, 1, 5):
                break
            if started is None or collected is None:  # died outside a test: nothing to skip past
                deaths.append({"rc": rc, "test": started})
                break
            # The worker died inside a test: record it and go on without it.
            deaths.append({"rc": rc, "test": started})
            results[started] = {"event": "result", "id": started, "outcome": "failed", "exc_type": "WorkerDied",
                                "message": f"the test process ended with status {rc}", "time_s": 0.0}
            restarts += 1
            os.remove(events_path)
            if not quiet:
                print(f"  {name} [{device}]: worker died in {started} (rc {rc}); restarting", flush=True)
        wall = time.perf_counter() - start
    tail = ""
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    return {"device": device, "collected": collected, "results": list(results.values()), "time_s": round(wall, 1),
            "timed_out": timed_out, "restarts": restarts, "worker_deaths": deaths, "log": log_path,
            "log_tail": tail if collected is None else ""}


# ---- summarizing -------------------------------------------------------------------------------

_DTYPE = re.compile(r"\b(torch\.)?(float|int|uint|complex|bfloat|qint|quint)\d+(x\d+)?\b|\b(torch\.)?(bool|half|double|"
                    r"long|short|cfloat|cdouble|chalf|bfloat16)\b")


# The lines torch's TestCase appends to a failure: how to rerun it, not its cause.
_REPRO_LINES = ("To execute this test", "PYTORCH_TEST_WITH", "python test/", "This message can be suppressed")


def normalize_message(exc_type: str, message: str, limit: int = 160) -> str:
    """`exc_type: first line` with numbers, shapes, dtypes and addresses replaced, so that one
    cause in many tests (or dtypes, or sizes) makes one group."""
    lines = [ln.strip() for ln in (message or "").splitlines()
             if ln.strip() and not ln.strip().startswith(_REPRO_LINES)]
    if lines and (lines[0].endswith(("not close!", "not equal!")) or len(lines[0]) < 16) and len(lines) > 1:
        line = lines[0] + " " + lines[1]
    else:
        line = lines[0] if lines else ""
    line = re.sub(r"0x[0-9a-fA-F]+", "<addr>", line)
    line = _DTYPE.sub("<dtype>", line)
    line = re.sub(r"remote_accelerator:\d+", "remote_accelerator", line)
    line = re.sub(r"\[[\d\s,\-]*\]", "[...]", line)
    line = re.sub(r"\((?:\s*-?\d+\s*,)+\s*(?:-?\d+)?\s*\)", "(...)", line)
    line = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e[-+]?\d+)?%?", "N", line)
    text = f"{exc_type}: {line}" if line else exc_type
    return text if len(text) <= limit else text[:limit - 3] + "..."


_CLASS_DEVICE = re.compile(r"(CPU|PRIVATEUSE1|REMOTE_ACCELERATOR)$")


def generic_id(nodeid: str, device: str) -> str:
    """The test's id with the device taken out: `TestShapeOps::test_flip_<dev>_float32`, the same
    for the CPU's and the device's instance of one test."""
    parts = nodeid.split("::")
    cls = _CLASS_DEVICE.sub("", parts[-2]) if len(parts) > 1 else ""
    test = re.sub(rf"_{re.escape(device)}(?=_|$)", "_<dev>", parts[-1])
    return f"{cls}::{test}"


def only_marker(reason: str) -> str | None:
    """'onlyCPU' / 'onlyCUDA' when a skip reason is that decorator's (common_device_type.onlyOn)."""
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith("Only runs on "):
        where = reason[len("Only runs on "):].strip()
        if where == "cpu":
            return "onlyCPU"
        if where == "cuda":
            return "onlyCUDA"
        return f"onlyOn({where})"
    return None


def summarize_run(run: dict) -> dict:
    """Counts, failure groups and skip reasons of one run_file result."""
    counts = collections.Counter(r["outcome"] for r in run["results"])
    groups: dict[str, dict] = {}
    skips = collections.Counter()
    for r in sorted(run["results"], key=lambda r: r["id"]):
        if r["outcome"] in ("failed", "error", "xpassed"):
            key = normalize_message(r.get("exc_type", "XPASS" if r["outcome"] == "xpassed" else "?"),
                                    r.get("message", "unexpected success"))
            g = groups.setdefault(key, {"cause": key, "count": 0, "example": r["id"], "genie_frames": set()})
            g["count"] += 1
            if r.get("genie_frame"):
                g["genie_frames"].add(r["genie_frame"])
        elif r["outcome"] == "skipped":
            skips[normalize_message("", r.get("reason", ""), 120).lstrip(": ")] += 1
    ran = counts["passed"] + counts["failed"] + counts["error"] + counts["xfailed"] + counts["xpassed"]
    ok = counts["passed"] + counts["xfailed"]
    collected = run["collected"] or 0
    return {
        "device": run["device"], "collected": collected,
        **{k: counts.get(k, 0) for k in OUTCOMES},
        "not_run": max(0, collected - len(run["results"])),
        "ran": ran, "pass_rate": round(ok / ran, 4) if ran else None,
        "time_s": run["time_s"], "timed_out": run["timed_out"], "restarts": run["restarts"],
        "worker_deaths": run["worker_deaths"],
        "failure_groups": sorted(({**g, "genie_frames": sorted(g["genie_frames"])} for g in groups.values()),
                                 key=lambda g: (-g["count"], g["cause"])),
        "skip_reasons": dict(skips.most_common()),
        "log_tail": run.get("log_tail", ""),
    }


def parity(cpu_run: dict, dev_run: dict, device: str) -> dict:
    """Tests that ran on the CPU vs on the device; which of the CPU's did not run on the device and
    why (onlyCPU / onlyCUDA / other skip / not instantiated for the device)."""
    def ran(run, dev):
        return {generic_id(r["id"], dev): r for r in run["results"] if r["outcome"] != "skipped"}

    def skipped(run, dev):
        return {generic_id(r["id"], dev): r for r in run["results"] if r["outcome"] == "skipped"}

    cpu_ran, dev_ran = ran(cpu_run, "cpu"), ran(dev_run, device)
    dev_skipped = skipped(dev_run, device)
    marks = collections.Counter()
    for r in dev_run["results"]:
        if r["outcome"] == "skipped":
            m = only_marker(r.get("reason", ""))
            if m:
                marks[m] += 1
    missing = collections.Counter()
    examples: dict[str, str] = {}
    for gid in sorted(set(cpu_ran) - set(dev_ran)):
        if gid in dev_skipped:
            reason = dev_skipped[gid].get("reason", "")
            why = only_marker(reason) or "skipped: " + normalize_message("", reason, 100).lstrip(": ")
        else:
            why = "not instantiated for the device (dtypes or decorators) or not reached"
        missing[why] += 1
        examples.setdefault(why, gid)
    bad = ("failed", "error", "xpassed")
    dev_bad = {g for g, r in dev_ran.items() if r["outcome"] in bad}
    cpu_bad = {g for g, r in cpu_ran.items() if r["outcome"] in bad}
    # The tests that ran on the device and pass on the CPU: a test the CPU fails too fails for
    # the test file's commit not being the installed torch's.
    cpu_good = set(dev_ran) - cpu_bad
    rate = round(len(cpu_good - dev_bad) / len(cpu_good), 4) if cpu_good else None
    return {"cpu_ran": len(cpu_ran), "device_ran": len(dev_ran), "device_only_marked": dict(marks),
            "failing_on_device": len(dev_bad), "failing_on_cpu_too": len(dev_bad & cpu_bad),
            "pass_rate_where_cpu_passes": rate,
            "ran_on_cpu_not_on_device": {k: {"count": v, "example": examples[k]} for k, v in missing.most_common()},
            "ran_on_device_not_on_cpu": len(set(dev_ran) - set(cpu_ran))}


def read_sources(folder: str) -> dict[str, str]:
    """{file name: where it comes from} from `folder`/SOURCES ('test_x.py: owner/repo@commit' per line)."""
    path = os.path.join(folder, "SOURCES")
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if ":" in line and not line.startswith("#"):
                    name, where = line.split(":", 1)
                    out[name.strip()] = where.strip()
    return out


def git_blob_id(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---- report ------------------------------------------------------------------------------------

def _machine() -> str:
    """The CPU, cores and kernel, as perf/op_coverage.py reports them."""
    import op_coverage  # perf/, beside this script (imports torch)
    return op_coverage.machine()


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _rate(s: dict) -> str:
    return "-" if s.get("pass_rate") is None else f"{100 * s['pass_rate']:.1f}%"


def markdown(meta: dict, files: dict, top: int = 12) -> str:
    out = [
        "# Eager parity: PyTorch's device-generic suites on remote_accelerator",
        "",
        f"- Date: {meta['date']}; Genie commit {meta['commit']}",
        f"- Machine: {meta['machine']}",
        f"- torch {meta['torch']} ({meta['torch_git']}); the embedded genie-node on loopback, executing on its CPU",
        f"- Test files: {meta['source']}",
        f"- Command: `{meta['command']}`",
        f"- Per file and device: one pytest process (restarted past a test that kills it), capped at "
        f"{meta['timeout_s']} s of wall time; {meta['test_timeout_s']} s alarm per test. The CPU baseline runs "
        "the same file with `PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu`; the device run with "
        "`PYTORCH_TESTING_DEVICE_ONLY_FOR=remote_accelerator` and `import genie` before the suite.",
        f"- Pass rate = (passed + xfailed) / tests that ran (not skipped); target >= {100 * TARGET:.0f}% per file.",
        *[f"- {n}" for n in meta.get("notes", [])],
        "",
        "## Per file",
        "",
        "| file | device | collected | passed | failed | errors | skipped | xfail | not run | pass rate | time (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in files.items():
        for dev, s in f["runs"].items():
            cap = " (cap)" if s["timed_out"] else ""
            out.append(f"| {name} | {dev} | {s['collected']} | {s['passed']} | {s['failed']} | {s['error']} | "
                       f"{s['skipped']} | {s['xfailed']} | {s['not_run']} | {_rate(s)} | {s['time_s']:.0f}{cap} |")
    out += ["", "`not run`: collected but cut off by the file's time cap (marked `(cap)`) or left after the test "
            "process died. Failures on the CPU come from the test file and the installed torch not being the same "
            "commit (see the sources above); the parity table counts the device's failures that fail on the CPU too.",
            "", "## Parity with the CPU", "",
            "Tests that ran (not skipped) on the CPU and on the device; the device's skips marked onlyCPU and "
            "onlyCUDA; the device's pass rate over the tests it ran that pass on the CPU (a test the CPU fails "
            "too fails for the test file's commit); the CPU's tests that did not run on the device, by reason.", "",
            "| file | ran on CPU | ran on device | onlyCPU | onlyCUDA | failing on the device (of which failing on the CPU too) | device pass rate where the CPU passes | CPU's tests not run on the device |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, f in files.items():
        p = f.get("parity")
        if not p:
            continue
        why = "; ".join(f"{_cell(k)}: {v['count']}" for k, v in list(p["ran_on_cpu_not_on_device"].items())[:4]) or "none"
        marks = p["device_only_marked"]
        out.append(f"| {name} | {p['cpu_ran']} | {p['device_ran']} | {marks.get('onlyCPU', 0)} | "
                   f"{marks.get('onlyCUDA', 0)} | {p.get('failing_on_device', '-')} ({p.get('failing_on_cpu_too', '-')}) "
                   f"| {_rate({'pass_rate': p.get('pass_rate_where_cpu_passes')})} | {why} |")
    out += ["", "## Failures by cause", ""]
    for name, f in files.items():
        for dev, s in f["runs"].items():
            if dev == "cpu" and not s["failure_groups"]:
                continue
            groups = s["failure_groups"]
            bad = s["failed"] + s["error"] + s["xpassed"]
            out += [f"### {name} on {dev}: {bad} failing, {len(groups)} causes", ""]
            if s.get("log_tail"):
                out += ["The run collected nothing; the end of its log:", "", "```",
                        s["log_tail"].strip()[-1500:], "```", ""]
            if not groups:
                out += ["none.", ""]
                continue
            out += ["| tests | cause | genie frame | example |", "|---:|---|---|---|"]
            for g in groups[:top]:
                frames = ", ".join(g["genie_frames"][:2]) or "-"
                out.append(f"| {g['count']} | {_cell(g['cause'])} | {_cell(frames)} | `{_cell(g['example'])}` |")
            if len(groups) > top:
                rest = sum(g["count"] for g in groups[top:])
                out.append(f"| {rest} | ({len(groups) - top} more causes, in the JSON) | | |")
            out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Wrap runs in `flock /tmp/genie-perf.lock` or pass --lock: the suites are "
                                       "CPU-heavy.")
    p.add_argument("--pytorch-tests", help="the folder holding PyTorch's test_*.py (a checkout's test/)")
    p.add_argument("--files", default=",".join(DEFAULT_FILES),
                   help="comma-separated test files in that folder (default: the seven device-generic suites)")
    p.add_argument("--device", default="both", choices=("both",) + DEVICES,
                   help="run the CPU baseline, the device, or both (default both, the CPU first)")
    p.add_argument("--timeout-s", type=int, default=DEFAULT_TIMEOUT_S,
                   help=f"wall-time cap per file and device, seconds (default {DEFAULT_TIMEOUT_S})")
    p.add_argument("--test-timeout-s", type=int, default=DEFAULT_TEST_TIMEOUT_S,
                   help=f"alarm per test, seconds (default {DEFAULT_TEST_TIMEOUT_S}; 0: none)")
    p.add_argument("--out", default="docs/perf/conformance.md",
                   help="Markdown report; the JSON (counts) and .raw.json.gz (per-test outcomes) go beside it")
    p.add_argument("--merge", action="store_true",
                   help="keep the JSON's earlier results for files and devices not run now")
    p.add_argument("--source", default="",
                   help="where the test files come from (repository, commit), for the report; a SOURCES file in "
                        "--pytorch-tests ('test_x.py: owner/repo@commit' per line) names it per file")
    p.add_argument("--machine", default=None, help="the machine, in words, for the report (default: from /proc/cpuinfo)")
    p.add_argument("--lock", help="hold an flock on this file while each file runs (e.g. /tmp/genie-perf.lock)")
    p.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "genie-conformance"),
                   help="pytest logs and event files (default $TMPDIR/genie-conformance)")
    p.add_argument("--note", action="append", default=[],
                   help="a line for the report's notes (repeatable): what was not run and why, where files came from")
    p.add_argument("--quiet", action="store_true")
    # The worker mode: perf/conformance.py runs itself, once per file and device.
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--exclude", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        return run_worker(a.worker, a.device, a.events, a.exclude, a.test_timeout_s)
    if not a.pytorch_tests:
        p.error("--pytorch-tests is required")

    import torch

    os.makedirs(a.log_dir, exist_ok=True)
    out_json = os.path.splitext(a.out)[0] + ".json"
    out_raw = os.path.splitext(a.out)[0] + ".raw.json.gz"
    previous, previous_meta = {}, {}
    if a.merge and os.path.exists(out_json):
        with open(out_json) as f:
            loaded = json.load(f)
        previous, previous_meta = loaded.get("files", {}), loaded.get("meta", {})
        if os.path.exists(out_raw):
            with gzip.open(out_raw, "rt") as f:
                for name, raw in json.load(f).items():
                    if name in previous:
                        previous[name]["raw"] = raw
    devices = DEVICES if a.device == "both" else (a.device,)
    sources = read_sources(a.pytorch_tests)
    files: dict[str, dict] = {name: dict(f) for name, f in previous.items()}
    for name in [x.strip() for x in a.files.split(",") if x.strip()]:
        path = os.path.join(a.pytorch_tests, name)
        if not os.path.exists(path):
            print(f"{name}: not in {a.pytorch_tests}, skipped", flush=True)
            continue
        entry = files.setdefault(name, {})
        entry["blob"] = git_blob_id(path)
        if sources.get(name) or a.source:
            entry["source"] = sources.get(name) or a.source
        entry.setdefault("runs", {})
        entry.setdefault("raw", {})
        for dev in devices:
            if not a.quiet:
                print(f"{name} [{dev}] ...", flush=True)
            run = run_file(path, dev, a.timeout_s, a.test_timeout_s, a.log_dir, a.lock, a.quiet)
            entry["raw"][dev] = [{k: r[k] for k in ("id", "outcome", "reason", "exc_type", "genie_frame") if k in r}
                                 for r in run["results"]]
            entry["runs"][dev] = summarize_run(run)
            s = entry["runs"][dev]
            if not a.quiet:
                print(f"{name} [{dev}]: collected {s['collected']}, passed {s['passed']}, failed {s['failed']}, "
                      f"errors {s['error']}, skipped {s['skipped']}, not run {s['not_run']}, {s['time_s']:.0f} s"
                      + (" (cap)" if s["timed_out"] else ""), flush=True)
        raw = entry["raw"]
        if "cpu" in raw and "remote_accelerator" in raw:
            entry["parity"] = parity({"results": raw["cpu"]}, {"results": raw["remote_accelerator"]},
                                     "remote_accelerator")
    order = [n for n in DEFAULT_FILES if n in files] + sorted(n for n in files if n not in DEFAULT_FILES)
    files = {n: files[n] for n in order}
    described = [f"{n}: {f.get('source') or 'unknown'} (git blob {f['blob'][:12]})" for n, f in files.items()]
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": _git_head(),
        "machine": a.machine or _machine(),
        "torch": torch.__version__, "torch_git": (torch.version.git_version or "")[:12],
        "source": "; ".join(described),
        "command": shlex.join([".venv/bin/python", "perf/conformance.py"] + (argv if argv is not None else sys.argv[1:])),
        "timeout_s": a.timeout_s, "test_timeout_s": a.test_timeout_s, "target": TARGET, "notes": a.note,
    }
    names = [x.strip() for x in a.files.split(",") if x.strip()]
    if not names and previous_meta:  # a re-render (--merge --files ''): the measurement's own facts stay
        meta.update({k: previous_meta[k] for k in ("date", "commit", "machine", "command", "timeout_s",
                                                    "test_timeout_s") if k in previous_meta})
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    # Per-test outcomes (what --merge needs for the parity of a file run again) go to a gzip file
    # beside the JSON: 13,000 tests per device for test_binary_ufuncs alone.
    raw = {name: f.get("raw", {}) for name, f in files.items()}
    with gzip.open(out_raw, "wt") as f:
        json.dump(raw, f, separators=(",", ":"))
    with open(out_json, "w") as f:
        json.dump({"meta": meta, "files": {name: {k: v for k, v in f.items() if k != "raw"}
                                            for name, f in files.items()}}, f, indent=1, default=str)
    with open(a.out, "w") as f:
        f.write(markdown(meta, files))
    print(f"wrote {a.out}, {out_json} and {out_raw}", flush=True)
    return 0


def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
