"""`genie.explain(fn, *args, **kwargs)`: what Genie understands of a program, and where it would run it.

    report = genie.explain(model, input_ids)          # CPU module and tensors: analysed, not run
    report = genie.explain(lambda: model.generate(ids.to(dev), max_new_tokens=8))  # remote: run
    print(report)                                     # steps, patterns, phases, residency, costs, schedule
    report.write_json("gpt2.json"); report.write_dot("gpt2.dot")

Two ways in, chosen by where the tensors are:
- CPU modules and tensors are analysed as if on `remote_accelerator`: `genie.semantics.capture`
  traces `fn` on fake tensors (nothing runs, nothing changes, no node is needed): one step.
- When `fn` reads or makes `remote_accelerator` tensors, or is what `torch.compile` returned
  (a CPU model compiled with backend="genie" runs on the node), it runs for real, and every
  cut the runtimes send (a step: `generate()` sends one per token, at its read) is analysed
  as it is sent (`genie.semantics.recorded`); what is still pending at the end, `fn`'s result
  included, is flushed as a last step.

Each step's analysis (`genie.semantics.analyze`, cached by structure and shapes) gives its
patterns, phase, residency per value and costs (FLOP, bytes).

Compiled code (`torch.compile(backend="genie")`) sends steps too, but a compiled part reaches
the node as one opaque `genie::call_graph` op: what it is shows in the compiled section
instead. `compiled` lists the compiled functions (one per graph Dynamo handed the backend) that
ran during the call: those Dynamo compiled during it and those compiled before whose parts ran
(a compiled `fn` explained again is there, a Dynamo cache hit), not every compiled function of
the process. Each with its parts and where they run, why an op runs eagerly, the patterns and
phase of its aten graphs (`genie.semantics` on the FX graphs the backend received, at compile
time), the graph break that ended it and why, its captures (hits and misses over the call) and
compile times (genie.compile.records.ran_since); per node part, `node`: each captured
geometry as its node runs it (its package, found in the node's cache or built in how long; the
executor while the package is built, or why it runs there) with its calls per engine
(Stats.parts). `compiled_graph_breaks`: Dynamo's graph breaks
counted during the call (a break before anything was traced makes no graph, so no function);
`compiled_nodes`: per device, the node's compiled-part counters over the call (package or
executor runs, packages built (cache misses) and loaded; node-wide: other clients' too). The schedule is
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
import sys
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


def _is_compiled(fn) -> bool:
    """Whether `fn` is what torch.compile returned (an OptimizedModule or a compiled function):
    Dynamo's code cannot be traced on fake tensors, and with backend="genie" a CPU model runs
    on the node, so it runs for real."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:  # Dynamo not loaded: nothing was compiled
        return False
    return isinstance(fn, eval_frame.OptimizedModule) or hasattr(fn, "_torchdynamo_orig_callable")


@dataclass
class Explanation:
    """The analysed steps of one program and, given a cluster, the schedule of its largest step.

    `steps`: `genie.semantics.recorded.Step`s (device, SemGraph, Annotated) in order; `mode`:
    "captured" (analysed on fake tensors) or "recorded" (run on the nodes); `schedule`: an
    `ExecutionSchedule` or None; `errors`: steps that could not be analysed, and why.
    `compiled`: the compiled functions that ran during the call (the module docstring; fields
    in genie.compile.records.ran_since), `compiled_graph_breaks` Dynamo's graph breaks counted
    during it (reason -> count), `compiled_nodes` per device the node's compiled-part counters
    over it (`package_calls`, `executor_calls`, `packages_built`, `packages_loaded`,
    `compile_failures`); all empty for a captured program."""

    steps: list[Step]
    mode: str
    schedule: object | None = None
    schedule_note: str = ""
    errors: list[str] = field(default_factory=list)
    compiled: list[dict] = field(default_factory=list)
    compiled_graph_breaks: dict[str, int] = field(default_factory=dict)
    compiled_nodes: dict[str, dict[str, int]] = field(default_factory=dict)

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
        lines += _compiled_lines(self)
        for e in self.errors:
            lines.append(f"not analysed: {e}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The report as plain data: per step its device, phase, ops, matches (pattern,
        confidence, node indices, detail), residency bytes per class and cost; the schedule's
        placement and estimate; the compiled section (`compiled`, `compiled_graph_breaks`,
        `compiled_nodes`) as it is."""
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
        out = {"mode": self.mode, "steps": steps, "errors": list(self.errors), "compiled": self.compiled,
               "compiled_graph_breaks": dict(self.compiled_graph_breaks), "compiled_nodes": self.compiled_nodes}
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
    if _has_remote(fn, args, kwargs) or _is_compiled(fn):
        from . import runtime
        since, nodes_before = _compiled_mark()
        log = StepLog()
        observe(log)
        try:
            result = fn(*args, **kwargs)  # held until the flush: what fn returns is computed too
            for rt in runtime.all_runtimes():
                rt.flush()
            del result
        finally:
            observe(None)
        report = Explanation(list(log.steps), "recorded", errors=list(log.errors))
        _add_compiled(report, since, nodes_before)
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


# ---- the compiled section ---------------------------------------------------------------

_NODE_COUNTERS = ("package_calls", "executor_calls", "packages_built", "packages_loaded", "compile_failures")


def _compiled_mark():
    """(the backend's books now, or None when genie.compile is not loaded: it compiled nothing
    yet; the connected nodes' compiled-part counters when it is loaded, else {})."""
    books = sys.modules.get("genie.compile")
    if books is None:
        return None, {}
    return books.mark(), _node_counters(None)


def _node_counters(errors: list[str] | None) -> dict[str, dict[str, int]]:
    """The compiled-part counters of every connected node (one Stats request each; pending ops
    stay pending). A node that cannot answer raises (GenieError: before the program runs, as
    any request would) or, given `errors`, is left out with its error added there."""
    from . import runtime
    out = {}
    for rt in runtime.all_runtimes():
        if rt.client is None:
            continue
        try:
            with runtime.lock:
                stats = rt.stats()
        except Exception as e:  # after the program ran: the section says so, its result stands
            if errors is None:
                raise
            errors.append(f"compiled section: {rt.device}'s counters: {e}")
            continue
        out[str(rt.device)] = {k: int(stats.get(k, 0)) for k in _NODE_COUNTERS}
    return out


def _add_compiled(report: Explanation, since, nodes_before: dict) -> None:
    """Fills `report`'s compiled section with what genie.compile's books say ran since `since`
    (None: the backend was loaded during the call, so everything it did is new). A node first
    connected during the call counts from its start."""
    books = sys.modules.get("genie.compile")
    if books is None:
        return
    if since is None:
        from .compile.records import Mark
        since = Mark(0, {}, {})
    report.compiled = books.ran_since(since)
    report.compiled_graph_breaks = books.graph_breaks_since(since)
    _add_part_facts(report)
    if report.compiled:
        for device, after in _node_counters(report.errors).items():
            before = nodes_before.get(device, dict.fromkeys(_NODE_COUNTERS, 0))
            report.compiled_nodes[device] = {k: after[k] - before[k] for k in _NODE_COUNTERS}


def _add_part_facts(report: Explanation) -> None:
    """Gives each node part of `report.compiled` its node's facts, `node`: one dict per captured
    geometry (Stats.parts: `state` "package", "building" or "executor", `package_calls`,
    `executor_calls` since the node first ran it, `cuda_graph_replays` (of the package calls),
    `build_s`, `from_cache`, `reason`), from one
    Stats request per device. A node that cannot answer is left out, its error in `errors`."""
    from . import runtime
    wanted: dict[str, list[dict]] = {}
    for f in report.compiled:
        for g in f["graphs"]:
            for p in g["parts"]:
                if p["engine"] == "node" and p["graphs"]:
                    wanted.setdefault(g["device"], []).append(p)
    for device, parts in wanted.items():
        graphs = list(dict.fromkeys(gid for p in parts for gid in p["graphs"]))[:1024]
        try:
            with runtime.lock:
                facts = runtime.runtime_for(torch.device(device)).stats(graphs)["parts"]
        except Exception as e:  # after the program ran: the section says so, its result stands
            report.errors.append(f"compiled section: {device}'s part facts: {e}")
            continue
        by_graph: dict[str, list[dict]] = {}
        for fact in facts:
            fact = dict(fact, graph=fact["graph"].hex())
            by_graph.setdefault(fact["graph"], []).append(fact)
        for p in parts:
            p["node"] = [fact for gid in p["graphs"] for fact in by_graph.get(gid, [])]


def _part_fact(fact: dict) -> str:
    """One captured geometry of a node part, as its node runs it (one line)."""
    calls = f"{fact['package_calls']} call(s) by its package, {fact['executor_calls']} by the executor"
    if fact["state"] == "package":
        built = "found in the node's cache" if fact["from_cache"] else f"built in {fact['build_s']:.1f} s"
        graphs = f", {fact['cuda_graph_replays']} of them CUDA graph replays" if fact.get("cuda_graph_replays") else ""
        return f"package ({built}); {calls}{graphs}" + (f"; {fact['reason']}" if fact["reason"] else "")
    if fact["state"] == "building":
        return f"its package is being built, the executor runs it meanwhile; {calls}"
    return f"executor ({fact['reason'] or 'no package'}); {calls}"


def _compiled_lines(report: Explanation) -> list[str]:
    """The compiled section of `str(report)`: per function its aten graphs' phase and patterns,
    parts (engine, where, calls, captured-graph runs and new captures, why not on the node),
    graph break and times; Dynamo's graph breaks and the nodes' package counters over the call."""
    if not report.compiled and not report.compiled_graph_breaks:
        return []
    lines = [f'compiled: {len(report.compiled)} function(s) ran compiled code (torch.compile backend="genie")']
    for f in report.compiled:
        cache = (f"compiled during this call (Dynamo cache miss; backend {f['backend_s']:.3f} s)" if f["compiled_now"]
                 else "compiled before (Dynamo cache hit)")
        inputs = ", CPU inputs moved there per call" if f["host_inputs"] else ""
        lines.append(f"  [{f['index']}] {f['name']} ({f['location']}), compile {f['compile_id']}, "
                     f"on {f['device']}{inputs}: {cache}")
        for g in f["graphs"]:
            patterns = ", ".join(f"{k} {v}" for k, v in sorted(g["patterns"].items())) or "none"
            analysis = (f"phase {g['phase']}, patterns {patterns}" if g["analysis_error"] is None
                        else f"not analysed ({g['analysis_error']})")
            lines.append(f"    {g['kind']} graph: {analysis}; partitioned in {g['compile_s']:.3f} s, "
                         f"analysed in {g['analysis_s']:.3f} s")
            for p in g["parts"]:
                counts = f"calls {p['calls']}"
                if p["engine"] != "eager":
                    counts += f", captured graph runs {p['hits']}, new captures {p['captures']}"
                    if p["captures"]:
                        counts += f" in {p['capture_s']:.3f} s"
                lines.append(f"      {p['name']:<9} {p['engine']:<8} {p['ops']:>4} op(s)  {counts}")
                lines.append(f"        on {p['where']}")
                for fact in p.get("node", []):
                    lines.append(f"        node: {_part_fact(fact)}")
                if p["why"]:
                    lines.append(f"        why: {p['why']}")
        if f["graph_break"]:
            lines.append(f"    ends at a graph break: {f['graph_break']}")
            if f["break_at"]:
                lines.append(f"      at {f['break_at']}")
    if report.compiled_graph_breaks:
        lines.append("  graph breaks Dynamo counted during the call:")
        lines += [f"    {n} x {reason}" for reason, n in report.compiled_graph_breaks.items()]
    for device, c in report.compiled_nodes.items():
        lines.append(f"  node {device} during the call: call_graph runs by package {c['package_calls']}, by executor "
                     f"{c['executor_calls']}; packages built {c['packages_built']} (cache misses), loaded "
                     f"{c['packages_loaded']} (found in the cache when more than built), failures "
                     f"{c['compile_failures']}")
    return lines
