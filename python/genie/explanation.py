"""`genie.explain(fn, *args, **kwargs)`: what Genie understands of a program, and where it would run it.

    report = genie.explain(model, input_ids)          # CPU module and tensors: analysed, not run
    report = genie.explain(lambda: model.generate(ids.to(dev), max_new_tokens=8))  # remote: run
    print(report)                                     # steps, patterns, phases, residency, costs, schedule
    report.write_json("gpt2.json"); report.write_dot("gpt2.dot")

Two ways in, chosen by where the tensors are:
- CPU modules and tensors are analysed as if on `remote_accelerator`: `genie.semantics.capture`
  traces `fn` on fake tensors (nothing runs, nothing changes, no node is needed): one step.
- When `fn` reads or makes `remote_accelerator` tensors it runs for real, and every cut the
  runtimes send (a step: `generate()` sends one per token, at its read) is analysed as it is
  sent (`genie.semantics.recorded`); what is still pending at the end is flushed as a last step.

Each step's analysis (`genie.semantics.analyze`, cached by structure and shapes) gives its
patterns, phase, residency per value and costs (FLOP, bytes). The schedule is
`genie.scheduler.schedule` of the largest step's groups on `cluster` (a
`genie.scheduler.Cluster`; default: for a program that ran, the nodes it is connected to,
measured by `genie.scheduler.connected_cluster`; for a captured one none, and the report
says so), for `goal`.

Errors: what `fn` raises; `capture`'s ValueError/RuntimeError for a program it cannot trace.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .semantics import analyze, capture
from .semantics.recorded import Step, StepLog, observe
from .semantics.report import summary

_DEVICE = "remote_accelerator"


def _has_remote(fn, args, kwargs) -> bool:
    """Whether any tensor in the arguments, or any parameter/buffer of a module among `fn` and
    the arguments, is on remote_accelerator (a function's closure and the tensors and modules
    among the globals it names count as its arguments)."""
    found = []

    def visit(x, depth=0):
        if found or depth > 3:
            return
        if isinstance(x, torch.Tensor):
            if x.device.type == _DEVICE:
                found.append(x)
        elif isinstance(x, torch.nn.Module):
            for t in x.parameters():
                visit(t)
                break
            for t in x.buffers():
                visit(t)
                break
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y, depth + 1)
        elif isinstance(x, dict):
            for y in x.values():
                visit(y, depth + 1)
        elif callable(x) and hasattr(x, "__code__"):
            for cell in x.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
            names = getattr(x, "__globals__", {})
            for name in x.__code__.co_names:
                if name in names and isinstance(names[name], (torch.Tensor, torch.nn.Module)):
                    visit(names[name], depth + 1)

    visit(fn)
    visit(list(args))
    visit(kwargs)
    return bool(found)


@dataclass
class Explanation:
    """The analysed steps of one program and, given a cluster, the schedule of its largest step.

    `steps`: `genie.semantics.recorded.Step`s (device, SemGraph, Annotated) in order; `mode`:
    "captured" (analysed on fake tensors) or "recorded" (run on the nodes); `schedule`: an
    `ExecutionSchedule` or None; `errors`: steps that could not be analysed, and why."""

    steps: list[Step]
    mode: str
    schedule: object | None = None
    schedule_note: str = ""
    errors: list[str] = field(default_factory=list)

    def phases(self) -> list[str]:
        """Each step's phase ("prefill", "decode", "vision", "forward", "backward", "optimizer")."""
        return [s.annotated.phase for s in self.steps]

    def largest(self) -> Step:
        """The step with the most ops (the one scheduled and drawn by default)."""
        return max(self.steps, key=lambda s: len(s.graph.nodes))

    def __str__(self) -> str:
        lines = [f"genie.explain: {len(self.steps)} step(s), {self.mode}"]
        counts: dict[tuple, int] = {}
        for s in self.steps:
            a = s.annotated
            patterns = {}
            for m in a.matches:
                patterns[m.pattern] = patterns.get(m.pattern, 0) + 1
            row = (s.device, a.phase, len(s.graph.nodes), tuple(sorted(patterns.items())))
            counts[row] = counts.get(row, 0) + 1
        lines.append(f"  {'steps':>5}  {'device':<22} {'phase':<9} {'ops':>5}  patterns")
        for (device, phase, ops, patterns), n in counts.items():
            text = ", ".join(f"{k} {v}" for k, v in patterns) or "-"
            lines.append(f"  {n:>5}  {device:<22} {phase:<9} {ops:>5}  {text}")
        if self.steps:
            lines.append("largest step:")
            lines += ["  " + line for line in summary(self.largest().annotated).splitlines()]
        if self.schedule is not None:
            lines.append("schedule:")
            lines += ["  " + line for line in self.schedule.explain().splitlines()]
        elif self.schedule_note:
            lines.append(f"schedule: {self.schedule_note}")
        for e in self.errors:
            lines.append(f"not analysed: {e}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The report as plain data: per step its device, phase, ops, matches (pattern,
        confidence, node indices, detail), residency bytes per class and cost; the schedule's
        placement and estimate."""
        steps = []
        for s in self.steps:
            a, g = s.annotated, s.graph
            residency: dict[str, int] = {}
            for vid, cls in a.residency.items():
                residency[cls] = residency.get(cls, 0) + g.values[vid].nbytes
            cost = a.cost()
            steps.append({
                "device": s.device, "phase": a.phase, "ops": len(g.nodes),
                "structure": a.structural_hash, "shapes": a.shape_hash,
                "matches": [{"pattern": m.pattern, "confidence": m.confidence, "nodes": list(m.nodes),
                             "detail": {k: v for k, v in m.detail.items() if isinstance(v, (int, float, str))}}
                            for m in a.matches],
                "residency_bytes": residency, "flops": cost.flops, "bytes": cost.bytes,
            })
        out = {"mode": self.mode, "steps": steps, "errors": list(self.errors)}
        if self.schedule is not None:
            out["schedule"] = {"placement": {str(k): v for k, v in self.schedule.placement.items()},
                               "estimated_s": self.schedule.estimated_s, "algorithm": self.schedule.algorithm}
        return out

    def write_json(self, path) -> Path:
        """Writes `to_dict()` as JSON to `path`; returns it."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    def dot(self, step: Step | None = None) -> str:
        """The annotated graph of `step` (default: the largest) in Graphviz's DOT language: one
        box per op, labelled with the op and its output shape, filled by the pattern that
        claims it; edges follow the values."""
        step = step or self.largest()
        g, a = step.graph, step.annotated
        colors = {"attention": "#f4a582", "kv_cache": "#d6604d", "mlp": "#92c5de", "conv_block": "#4393c3",
                  "embedding": "#b8e186", "norm": "#fddbc7"}
        owner: dict[int, str] = {}
        for m in a.matches:
            for i in m.nodes:
                owner.setdefault(i, m.pattern)
        lines = [f'digraph "{a.phase}" {{', "  rankdir=TB; node [shape=box, style=filled, fontsize=10];"]
        for n in g.nodes:
            shape = g.values[n.outputs[0]].shape if n.outputs else ()
            fill = colors.get(owner.get(n.index, ""), "#f7f7f7")
            label = f"{n.op.removeprefix('aten::')}\\n{list(shape)}"
            if n.index in owner:
                label += f"\\n[{owner[n.index]}]"
            lines.append(f'  n{n.index} [label="{label}", fillcolor="{fill}"];')
        for n in g.nodes:
            for v in n.inputs:
                p = g.values[v].producer
                if p >= 0:
                    lines.append(f"  n{p} -> n{n.index};")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def write_dot(self, path, step: Step | None = None) -> Path:
        """Writes `dot(step)` to `path` and, when Graphviz's `dot` program is installed, the
        picture beside it (`path` with suffix .svg). Returns the DOT file's path."""
        path = Path(path)
        path.write_text(self.dot(step))
        if shutil.which("dot"):
            subprocess.run(["dot", "-Tsvg", str(path), "-o", str(path.with_suffix(".svg"))], check=False,
                           timeout=120)
        return path


def explain(fn, *args, cluster=None, goal: str = "latency", **kwargs) -> Explanation:
    """Analyses `fn(*args, **kwargs)` (see the module docstring) and returns the Explanation.
    `cluster`: a genie.scheduler.Cluster to schedule the largest step on (default: the
    connected nodes for a program that ran, none for a captured one); `goal`: "latency" or
    "throughput". Raises what `fn` raises, and capture's errors for a CPU program it cannot trace."""
    if _has_remote(fn, args, kwargs):
        from . import runtime
        log = StepLog()
        observe(log)
        try:
            fn(*args, **kwargs)
            for rt in runtime.all_runtimes():
                rt.flush()
        finally:
            observe(None)
        report = Explanation(list(log.steps), "recorded", errors=list(log.errors))
    else:
        graph = capture(fn, *args, **kwargs)
        report = Explanation([Step(f"{_DEVICE} (as if)", graph, analyze(graph))], "captured")
    from .scheduler import connected_cluster, schedule
    if cluster is None and report.mode == "recorded":
        cluster = connected_cluster()  # the nodes the program ran on, measured (once per process)
    if not report.steps:
        report.schedule_note = "nothing ran"
    elif cluster is None:
        report.schedule_note = "no cluster given (genie.explain(..., cluster=genie.scheduler.Cluster(...)))"
    else:
        report.schedule = schedule(report.largest().annotated.to_groups(), cluster, goal)
    return report
