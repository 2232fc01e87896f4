"""Measuring a run: wall time, Genie's client counters, and the machine it ran on.

The counters come from the frontend: ``genie.client_stats()`` returns cumulative
``bytes_sent``, ``bytes_received``, ``round_trips`` and ``node_exec_us`` (the node's execution
time, µs); a run's share is the difference of two
snapshots. On a local device (``cpu``), or where ``genie`` cannot be imported or has no
``client_stats`` yet, there are no counters and every snapshot is ``None``.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

COUNTER_KEYS = ("bytes_sent", "bytes_received", "round_trips")
# Reported too where the frontend has them.
OPTIONAL_COUNTER_KEYS = ("messages_sent", "graphs_registered", "node_exec_us", "ops_recorded_cpp",
                         "ops_handled_python")


def is_local(device: str) -> bool:
    return torch.device(device).type == "cpu"


class Counters:
    """Snapshots of ``genie.client_stats()`` for runs on ``device``; ``None`` where there are none."""

    def __init__(self, device: str):
        self._client_stats = None
        self._synchronize = None
        self.unavailable_reason = "local device"
        if is_local(device):
            return
        try:
            import genie
        except ImportError as error:
            self.unavailable_reason = f"genie not importable ({error})"
            return
        self._client_stats = getattr(genie, "client_stats", None)
        self._synchronize = getattr(genie, "synchronize", None)
        self.unavailable_reason = None if self._client_stats else "genie.client_stats missing"

    @property
    def available(self) -> bool:
        return self._client_stats is not None

    def synchronize(self) -> None:
        """Wait for pending remote work (``genie.synchronize()``); nothing on a local device."""
        if self._synchronize is not None:
            self._synchronize()

    def snapshot(self) -> dict | None:
        if self._client_stats is None:
            return None
        stats = self._client_stats()
        keys = COUNTER_KEYS + tuple(k for k in OPTIONAL_COUNTER_KEYS if k in stats)
        return {key: int(stats[key]) for key in keys}


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """``after - before`` per counter, or ``None`` when either snapshot is missing."""
    if before is None or after is None:
        return None
    return {key: after[key] - before[key] for key in after if key in before}


@dataclass
class Timed:
    """One measured run: its result, wall seconds, and counter deltas (``None`` on a local device)."""
    result: object
    seconds: float
    counters: dict | None


def timed(fn, counters: Counters):
    """Run ``fn()`` (which must return CPU data, so the remote work is complete) and measure it."""
    counters.synchronize()
    before = counters.snapshot()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    counters.synchronize()
    return Timed(result, seconds, counter_delta(before, counters.snapshot()))


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def median_counters(deltas: list) -> dict | None:
    """Per-counter median of a list of counter deltas (``None`` entries skipped)."""
    deltas = [d for d in deltas if d is not None]
    if not deltas:
        return None
    keys = [key for key in deltas[0] if all(key in d for d in deltas)]
    return {key: statistics.median(d[key] for d in deltas) for key in keys}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """Where the local side ran: CPU model, cores, torch threads, load, versions, date (UTC)."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def format_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_count(n) -> str:
    return "-" if n is None else f"{n:g}"


def format_seconds(s) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"
