"""The backend's books: what it compiled (per Dynamo graph), and what of it ran in a window.

Written at compile time (the backend, `compile_graph`), never per call: a call only bumps the
runners' counters (`Part.calls`; `Part.slow_calls` off the hot path). `genie.explain` takes a
`mark()` before it runs a program and `ran_since(mark)` after: the compiled functions that ran
in between, with their counts over that window (docs/compile.md, "What explain shows").

- `CompiledFunction`: one graph Dynamo handed the backend (a frame's first compile, a
  recompile, each side of a graph break), named by its code object; its aten graphs.
- `CompiledGraph`: one aten graph AOTAutograd made of it (forward, backward, inference), with
  the semantic analysis of that graph (genie.semantics: patterns, phase) and its parts.
- `Part`: one runner of an aten graph: a node part or an op run eagerly, and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Part:
    """One part of a compiled aten graph. `engine`: "node" (captured: each call records one
    `genie::call_graph` op), "recorded" (a node part that cannot stand alone: its ops are
    recorded each call) or "eager" (one op Genie's eager path runs: a host read, a Python
    custom op); `ops` its FX nodes' targets; `why`: why it is not a captured node part (the
    partitioner's reason for an eager op, capture's reason for a recorded part), else None.
    Counters: `calls` (every call), `slow_calls` (calls that ran no captured graph: a new
    geometry captured, a recorded run), `dispatched` (captured calls recorded through PyTorch's
    dispatcher because the capture's direct call (`_C.PartCall`) declined the arguments: a lost
    input, a gradient needed), `captures` (argument geometries captured and registered
    on the node: the part's cache misses; `calls - slow_calls` are its hits), `capture_s`
    (seconds spent in the calls that captured or tried to: running the FX graph on LazyTensors,
    the capture and the RegisterGraph round trip); `graphs`: the graph ids (hex) of its
    captures, one per geometry, which name it on its node (Stats.parts: the engine that runs
    each, its build)."""

    name: str
    engine: str
    ops: list[str]
    calls: int = 0
    why: str | None = None
    slow_calls: int = 0
    dispatched: int = 0
    captures: int = 0
    capture_s: float = 0.0
    graphs: list[str] = field(default_factory=list)

    def counters(self) -> tuple[int, int, int, float]:
        return self.calls, self.slow_calls, self.captures, self.capture_s


@dataclass
class CompiledGraph:
    """One aten graph the backend compiled: `kind` "forward", "backward" or "inference";
    `compile_id` Dynamo's ("0/1": frame 0, its second compile); `device` the
    remote_accelerator device its node parts run on. `phase` and `patterns` (pattern name ->
    matches) are genie.semantics' analysis of the whole aten graph (`from_fx` + `analyze`),
    `analysis_error` why there is none; `compile_s` seconds to partition it and install its
    runners, `analysis_s` seconds of the analysis."""

    compile_id: str
    kind: str
    device: str
    parts: list[Part] = field(default_factory=list)
    phase: str | None = None
    patterns: dict[str, int] = field(default_factory=dict)
    analysis_error: str | None = None
    compile_s: float = 0.0
    analysis_s: float = 0.0


@dataclass
class CompiledFunction:
    """One graph Dynamo handed the backend. `index`: its order in this process; `name` and
    `location` ("file:line"): the code object Dynamo traced, by its qualified name ("f",
    "Block.forward"; a graph break's second half is Dynamo's resume function,
    `torch_dynamo_resume_in_<fn>_at_<line>`); `compile_id` Dynamo's;
    `device` where its node parts run; `host_inputs`: its inputs are on the CPU (moved to
    `device` each call); `graph_break`: the break that ended the graph (Dynamo's reason, first
    line) and `break_at` where ("file:line: source"), both None when the frame returned;
    `backend_s`: seconds in the backend (AOTAutograd's trace, partitioning and analysis of its
    forward or inference graph; a backward graph is compiled at the first backward and counts in
    its own `compile_s`); `input_kinds`: per Dynamo placeholder "weight", "buffer" or "input"."""

    index: int
    name: str
    location: str
    compile_id: str
    device: str
    host_inputs: bool
    graph_break: str | None = None
    break_at: str | None = None
    backend_s: float = 0.0
    input_kinds: list[str] = field(default_factory=list)
    graphs: list[CompiledGraph] = field(default_factory=list)


def describe_dynamo_graph(gm: torch.fx.GraphModule) -> dict:
    """What Dynamo says of the graph it hands the backend: the code object's `name` and
    `location`, `compile_id`, the graph break that ended it (`graph_break`, `break_at`: None
    when its frame returned) and `input_kinds` per placeholder. Reads Dynamo's tracing state
    (the current InstructionTranslator, `gm.compile_subgraph_reason`): "?" where a torch
    version does not offer it."""
    name, location = "?", "?"
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        name, location = _code_of(InstructionTranslator.current_tx())
    except Exception:  # not inside Dynamo's tracing (a backend called by hand), another torch
        pass
    compile_id = gm.meta.get("dynamo_compile_id") or torch._guards.CompileContext.current_compile_id()
    reason = getattr(gm, "compile_subgraph_reason", None)
    graph_break = break_at = None
    if reason is not None and getattr(reason, "graph_break", False):
        graph_break = str(reason.reason).strip().splitlines()[0] if str(reason.reason).strip() else "?"
        stack = getattr(reason, "user_stack", None) or []
        if stack:
            frame = stack[-1]
            break_at = f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return {"name": name, "location": location, "compile_id": str(compile_id) if compile_id is not None else "?",
            "graph_break": graph_break, "break_at": break_at, "input_kinds": _input_kinds(gm)}


def _code_of(tx) -> tuple[str, str]:
    """(name, "file:line") of the code Dynamo traces in `tx`: its qualified name without the
    enclosing functions ("Block.forward", "f"). A torch.nn module's call that torch.compile
    wraps in `external_utils.wrap_inline` is named by the module's forward instead."""
    code = tx.f_code
    if code.co_filename.endswith("external_utils.py") and code.co_freevars == ("fn",) and tx.closure:
        wrapped = tx.closure[0].cell_contents
        wrapped = type(wrapped).forward if isinstance(wrapped, torch.nn.Module) else wrapped
        code = getattr(wrapped, "__code__", code)
    name = getattr(code, "co_qualname", code.co_name).rsplit(".<locals>.", 1)[-1]
    return name, f"{code.co_filename}:{code.co_firstlineno}"


def _input_kinds(gm: torch.fx.GraphModule) -> list[str]:
    """Per placeholder of a Dynamo graph: "weight" (an nn.Parameter), "buffer" (a module's
    buffer, by its source's name) or "input"."""
    kinds = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        try:
            example = n.meta["grapharg"].example
        except Exception:  # no GraphArg (a graph built by hand), or its example is gone
            example = None
        if isinstance(example, torch.nn.Parameter) or "_parameters_" in n.name:
            kinds.append("weight")
        elif "_buffers_" in n.name:
            kinds.append("buffer")
        else:
            kinds.append("input")
    return kinds


# ---- windows ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Mark:
    """The books at one moment: how many functions there were, each part's counters
    (by id of the Part), and Dynamo's graph-break counter (reason -> count)."""

    functions: int
    parts: dict[int, tuple[int, int, int, float]]
    graph_breaks: dict[str, int]


def mark(functions: list[CompiledFunction]) -> Mark:
    """A `Mark` of `functions` (the backend's books) now."""
    parts = {id(p): p.counters() for f in functions for g in f.graphs for p in g.parts}
    return Mark(len(functions), parts, dict(torch._dynamo.utils.counters["graph_break"]))


def graph_breaks_since(since: Mark) -> dict[str, int]:
    """Dynamo's graph breaks counted since `since` (all backends), by reason's first line."""
    out: dict[str, int] = {}
    for reason, count in torch._dynamo.utils.counters["graph_break"].items():
        added = count - since.graph_breaks.get(reason, 0)
        if added > 0:
            key = str(reason).strip().splitlines()[0] if str(reason).strip() else "?"
            out[key] = out.get(key, 0) + added
    return out


def ran_since(functions: list[CompiledFunction], since: Mark) -> list[dict]:
    """The functions of `functions` compiled after `since` or whose parts ran after it, as
    plain data: the function's fields (`compiled_now`: compiled in the window, else a Dynamo
    cache hit) and per aten graph its kind, phase, patterns and parts with the window's
    `calls`, `hits` (calls that ran a captured graph), `captures` and `capture_s`, besides
    the totals since the part was made (`total_calls`, `total_captures`) and its captures'
    graph ids (`graphs`, hex)."""
    out = []
    for function in functions:
        compiled_now = function.index >= since.functions
        graphs, ran = [], compiled_now
        for g in function.graphs:
            parts = []
            for p in g.parts:
                calls0, slow0, captures0, capture_s0 = since.parts.get(id(p), (0, 0, 0, 0.0))
                calls, slow = p.calls - calls0, p.slow_calls - slow0
                ran = ran or calls > 0
                parts.append({"name": p.name, "engine": p.engine, "where": _where(p, g, function), "why": p.why,
                              "ops": len(p.ops), "calls": calls, "hits": calls - slow if p.engine == "node" else 0,
                              "captures": p.captures - captures0, "capture_s": p.capture_s - capture_s0,
                              "total_calls": p.calls, "total_captures": p.captures, "graphs": list(p.graphs)})
            graphs.append({"kind": g.kind, "compile_id": g.compile_id, "device": g.device, "phase": g.phase,
                           "patterns": dict(g.patterns), "analysis_error": g.analysis_error,
                           "compile_s": g.compile_s, "analysis_s": g.analysis_s, "parts": parts})
        if ran:
            out.append({"index": function.index, "name": function.name, "location": function.location,
                        "compile_id": function.compile_id, "device": function.device,
                        "host_inputs": function.host_inputs, "compiled_now": compiled_now,
                        "graph_break": function.graph_break, "break_at": function.break_at,
                        "backend_s": function.backend_s, "graphs": graphs})
    return out


def _where(part: Part, graph: CompiledGraph, function: CompiledFunction) -> str:
    if part.engine == "node":
        return f"{graph.device} (one genie::call_graph; the node runs a package or its executor)"
    if part.engine == "recorded":
        return f"{graph.device} (recorded op by op each call)"
    return f"eager (Genie's eager path in this process; its aten ops run on {graph.device})"
