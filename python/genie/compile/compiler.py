"""The `genie` Dynamo backend: Dynamo's FX graph -> AOTAutograd's aten graphs -> parts -> runners.

    compiled = torch.compile(model, backend="genie", options={"node": 0})

1. `backend(gm, example_inputs, mode, options)` is what Dynamo calls once per graph it captured
   (a first compile, a recompile, each side of a graph break). Inputs on remote_accelerator:N
   run on that device; inputs on the CPU (a model whose parameters are on the CPU) run on
   `remote_accelerator:<node>`: each call moves the CPU tensors there (`tensor.to(device)`: a
   parameter is uploaded once and stays resident, shared with the eager path, by genie.uploads'
   weight cache; small activations travel inline with the run) and moves the outputs back, so
   the call returns what eager CPU returns.
2. AOTAutograd (`torch._dynamo.backends.common.aot_autograd`) turns the graph into aten graphs:
   forward and backward when a gradient flows, one inference graph otherwise; in-place updates
   of inputs are kept in the inference graph (`keep_inference_input_mutations`).
3. `compile_graph` splits each aten graph (genie.compile.partition): node parts become
   `ExecutorPart`s, the rest stays in the outer graph as `EagerOp`s, Genie's eager path.
4. Runners. A node part (`ExecutorPart`) is captured once per argument geometry as a wire
   graph registered on the node; later calls record one `genie::call_graph` op, which the node
   runs by an AOT Inductor package it builds, or by its executor until then (docs/compile.md).

`stats()` reports the graphs, recompiles, graph breaks and which engine ran each part. Per
Dynamo graph the backend keeps, at compile time, a `records.CompiledFunction`: its code
object, the graph break that ended it, its aten graphs with genie.semantics' patterns and
phase, their parts and why an op runs eagerly; `mark()` and `ran_since()` give genie.explain
the ones that ran in a window.
"""
from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map

from .. import _C
from ..device import note_call_graph_outputs
from .fake import install as install_fake_fix
from .options import CompileOptions, parse_options
from .partition import is_part, partition, retarget_devices
from .records import CompiledFunction, CompiledGraph, Mark, Part, describe_dynamo_graph
from .records import graph_breaks_since as _graph_breaks_since, mark as _mark, ran_since as _ran_since

_DEVICE = "remote_accelerator"


# ---- what ran -------------------------------------------------------------------------------

@dataclass
class _Books:
    dynamo_graphs: int = 0  # backend calls: Dynamo graphs
    recompiles: int = 0     # of them, compiles of a frame compiled before (guards failed)
    graphs: list[CompiledGraph] = field(default_factory=list)
    functions: list[CompiledFunction] = field(default_factory=list)  # one per Dynamo graph
    graph_breaks_at_start: int = 0


_books = _Books()


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def stats() -> dict:
    """What the backend did in this process: `dynamo_graphs` (graphs Dynamo handed to it),
    `recompiles` (of them, recompiles of a frame), `graph_breaks` (Dynamo's graph breaks since
    the first genie compile, all backends), `aten_graphs` (forward/backward/inference graphs
    compiled), `parts` and `calls` by engine ("node", "recorded", "eager"), and `graphs`: per
    aten graph, its compile id, kind, device and parts (name, engine, ops, calls, `dispatched`:
    captured calls recorded through PyTorch's dispatcher instead of the capture's direct call
    (records.Part), and `why`: why it is not a captured node part, the partitioner's reason for
    an eager op)."""
    parts: dict[str, int] = {"node": 0, "recorded": 0, "eager": 0}
    calls: dict[str, int] = {"node": 0, "recorded": 0, "eager": 0}
    for graph in _books.graphs:
        for part in graph.parts:
            parts[part.engine] += 1
            calls[part.engine] += part.calls
    return {
        "dynamo_graphs": _books.dynamo_graphs,
        "recompiles": _books.recompiles,
        "graph_breaks": _graph_breaks() - _books.graph_breaks_at_start if _books.dynamo_graphs else 0,
        "aten_graphs": len(_books.graphs),
        "parts": parts,
        "calls": calls,
        "graphs": [{"compile_id": g.compile_id, "kind": g.kind, "device": g.device,
                    "parts": [{"name": p.name, "engine": p.engine, "ops": list(p.ops), "calls": p.calls,
                               "dispatched": p.dispatched, "why": p.why}
                              for p in g.parts]} for g in _books.graphs],
    }


def reset_stats() -> None:
    """Forgets what `stats()` counted and the compiled functions `ran_since` reports (not the
    compiled graphs: torch._dynamo.reset() does that)."""
    global _books
    _books = _Books()


def mark() -> Mark:
    """The backend's books now, for `ran_since` (genie.explain takes one before it runs a
    program). O(parts compiled in this process)."""
    return _mark(_books.functions)


def ran_since(since: Mark) -> list[dict]:
    """The compiled functions (Dynamo graphs) compiled or called since `since`, with their
    parts' counts over that window (genie.compile.records.ran_since describes the fields)."""
    return _ran_since(_books.functions, since)


def graph_breaks_since(since: Mark) -> dict[str, int]:
    """Dynamo's graph breaks counted since `since` (all backends), by reason."""
    return _graph_breaks_since(since)


# ---- runners --------------------------------------------------------------------------------

@dataclass
class _Capture:
    """A part captured for one geometry of its arguments: registered graph `graph`, whose
    input i is argument `arg_of_input[i]` or, past them, `constants[i - len(arg_of_input)]`
    (0-dim constants the ops read, uploaded once); its outputs are wire values `output_ids`."""

    graph: str
    arg_of_input: list[int]
    constants: list[torch.Tensor]
    output_ids: list[int]
    written: list[int]  # the arguments the part writes in place (a KV cache's copy_ write-back)
    call: "_C.PartCall"  # records genie::call_graph for a call's arguments, without dispatch
    runtime: object  # the genie.runtime.Runtime the graph is registered with, in session `serial`
    serial: int


def _varies(val) -> bool:
    """Whether an FX placeholder's value may differ in geometry between calls of its graph."""
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*val.shape, *val.stride()))
    return not isinstance(val, (torch.Tensor, type(None)))  # an int or SymInt argument, anything else


class ExecutorPart(torch.nn.Module):
    """A node part. A call with arguments of a geometry not seen before (tensor sizes, strides
    and dtypes, the values of int arguments: a part traced with dynamic shapes takes them) runs
    the FX graph on the LazyTensors (its aten ops are recorded and run as eager's are) and
    captures those ops as one graph, registered on the node (`_C` Recording.capture_part). A
    later call of that geometry records one op, `genie::call_graph(graph, outputs, inputs)`,
    straight from its arguments (`_C.PartCall`: no dispatch, no shape inference; through
    PyTorch's dispatcher only when it declines them, records.Part.dispatched), which the node
    runs by an AOT Inductor package or, until it is built, by its executor
    (src/node/compiled_parts.h): nothing of the part is recorded or sent again. Write-backs
    (partition.py: `copy_` of an updated KV cache into an argument) are captured with the part,
    which then writes those arguments in place (call_graph's `written`). A part that cannot
    stand alone (an output aliases an input, an op other than a write-back writes an input, an
    argument that is not a remote tensor or an int) keeps running its FX graph; `why` says why.
    At most `MAX_CAPTURES` geometries are captured per part; others run the FX graph."""

    MAX_CAPTURES = 32

    def __init__(self, gm: torch.fx.GraphModule, part: Part, mode: str = "default") -> None:
        super().__init__()
        self.gm = gm
        self.part = part
        self.mode = mode  # the graph's name: the node's compile worker reads it
        self.captures: dict[tuple, _Capture] = {}
        self.why: str | None = None
        # The arguments whose geometry may change between calls: ints and tensors with symbolic
        # sizes or strides (a graph traced with dynamic shapes). Dynamo's guards fix the rest.
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.varying: list[int] | None = [k for k, n in enumerate(placeholders) if _varies(n.meta.get("val"))]
        if any("val" not in n.meta for n in placeholders):
            self.varying = None  # no trace metadata: every argument is looked at

    def forward(self, *args):
        self.part.calls += 1
        key = self._key(args) if self.why is None else None
        capture = self.captures.get(key) if key is not None else None
        if capture is not None and capture.runtime.session_serial != capture.serial:
            # Registered in a node session that has ended (genie.shutdown, a lost node): every
            # capture is made again in the current one.
            self.captures.clear()
            capture = None
        if capture is not None:
            out = capture.call.call(args)
            if out is NotImplemented:  # not the capture's tensors (an error, or autograd on): the dispatcher's path
                self.part.dispatched += 1
                inputs = [args[i] for i in capture.arg_of_input] + capture.constants
                out = torch.ops.genie.call_graph(capture.graph, capture.output_ids, inputs,
                                                 [args[i] for i in capture.written])
            return (tuple(out) if self.tuple_output else out[0]) if self.returns else None
        self.part.slow_calls += 1  # off the hot path: a new geometry, or a part that runs recorded
        capturing = key is not None and len(self.captures) < self.MAX_CAPTURES
        started = time.perf_counter() if capturing else 0.0
        # What the part reads: the arguments' values before its write-backs rebind them.
        read = [_C.lazy_value(a) if isinstance(a, torch.Tensor) else None for a in args] if capturing else None
        since = _C.next_seq()
        out = self.gm(*args)
        if capturing:
            captured = self._capture(args, read, out, since)
            if isinstance(captured, str):
                self.why = self.part.why = captured
                self.part.engine = "recorded"
            else:
                self.captures[key] = captured
                self.part.engine = "node"
                self.part.captures += 1
                self.part.graphs.append(captured.graph)
            self.part.capture_s += time.perf_counter() - started
        return out

    def _key(self, args) -> tuple | None:
        key = []
        for a in (args if self.varying is None else [args[k] for k in self.varying]):
            if isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), tuple(a.stride()), a.dtype, a.device))
            elif type(a) is int:
                key.append(a)
            else:
                return None
        return tuple(key)

    def _capture(self, args, read: list, out, since: int) -> _Capture | str:
        """Captures the part just recorded (its ops from seq `since` on, which read the values
        `read` of `args`; see the class docstring); a reason when it cannot."""
        from ..runtime import lock, runtime_for
        outs = () if out is None else out if isinstance(out, (tuple, list)) else (out,)
        tensor_args = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if any(read[k] is None for k in tensor_args) or not all(_C.is_lazy(o) for o in outs):
            return "an argument or a result is not a remote tensor"
        devices = {args[k].device for k in tensor_args} | {o.device for o in outs}
        if len(devices) != 1:
            return f"tensors on {len(devices)} devices"
        device = devices.pop()
        runtime = runtime_for(device)
        with lock:
            captured = runtime.recording.capture_part([read[k] for k in tensor_args],
                                                      [runtime.value_of(o) for o in outs], self.mode, since)
            if isinstance(captured, str):
                return captured
            graph_bytes, input_ids, inline_inputs, output_ids, written, _ = captured
            graph_id = runtime._request("register_graph", graph_bytes)
            if runtime.lineage is not None:  # a node rebuilt from the lineage registers it again
                runtime.lineage.graph(graph_id, graph_bytes)
            graph = graph_id.hex()
        arg_of_input = [-1] * (max(input_ids, default=-1) + 1)
        for k, input_id in zip(tensor_args, input_ids):
            arg_of_input[input_id] = k
        if any(i < 0 for i in arg_of_input):
            return "the graph's inputs are not the part's arguments"
        constants = [t.to(device) for t in inline_inputs]
        inputs = [args[i] for i in arg_of_input] + constants
        written_args = [tensor_args[i] for i in written]
        capture = _Capture(graph, arg_of_input, constants, list(output_ids), written_args,
                           _C.PartCall(graph, list(output_ids), arg_of_input, constants, written_args, inputs,
                                       list(outs)), runtime, runtime.session_serial)
        self.tuple_output = isinstance(out, (tuple, list))
        self.returns = out is not None
        note_call_graph_outputs(graph, inputs, outs)
        return capture


class EagerOp:
    """An op the node cannot run as part of a graph: called as eager calls it (Genie's eager
    path: a host read materializes, a Python custom op runs its Python implementation)."""

    def __init__(self, target, part: Part) -> None:
        self.target = target
        self.part = part
        self.__name__ = f"eager_{getattr(target, '__name__', 'op')}"

    def __call__(self, *args, **kwargs):
        self.part.calls += 1
        return self.target(*args, **kwargs)


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str, device: torch.device, mode: str = "default",
                  function: CompiledFunction | None = None):
    """AOTAutograd's compiler for one aten graph: analyses it (genie.semantics), partitions it
    and installs the runners; the graph joins `function`'s books. Returns the callable
    AOTAutograd calls with the graph's inputs."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    graph = CompiledGraph(str(compile_id) if compile_id is not None else "?", kind, str(device))
    _analyse(graph, gm, function.input_kinds if function is not None and kind != "backward" else None)
    started = time.perf_counter()
    why: dict[str, str] = {}
    split = partition(gm, why)
    for name, module in list(split.named_children()):
        if is_part(name):
            part = Part(name, "recorded", [str(n.target) for n in module.graph.nodes if n.op == "call_function"])
            setattr(split, name, ExecutorPart(module, part, mode))
            graph.parts.append(part)
    for node in split.graph.nodes:
        if node.op == "call_function" and not _is_plumbing(node.target):
            part = Part(f"eager_{len(graph.parts)}", "eager", [str(node.target)],
                        why=why.get(node.name, "left outside the node parts by the partitioner"))
            node.target = EagerOp(node.target, part)
            graph.parts.append(part)
    split.recompile()
    graph.compile_s = time.perf_counter() - started
    _books.graphs.append(graph)
    if function is not None:
        function.graphs.append(graph)
    return make_boxed_func(split.forward)  # AOTAutograd's calling convention: one list, freed as it goes


def _analyse(graph: CompiledGraph, gm: torch.fx.GraphModule, input_kinds: list[str] | None) -> None:
    """genie.semantics' analysis of aten graph `gm` (its patterns and phase) into `graph`; the
    analysis is cached by structure and shapes (a recompile of the same graph is a hit). Its
    failure is recorded (`analysis_error`), never raised: the compile goes on without it.
    `input_kinds`: per placeholder, from the Dynamo graph (AOTAutograd keeps their order in a
    forward or inference graph); used only when the counts agree."""
    from ..semantics import analyze, from_fx  # not at import: `import genie.compile` stays light
    started = time.perf_counter()
    try:
        placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        kinds = input_kinds if input_kinds is not None and len(input_kinds) == placeholders else None
        annotated = analyze(from_fx(gm, input_kinds=kinds, backward=graph.kind == "backward"))
        graph.phase = annotated.phase
        for m in annotated.matches:
            graph.patterns[m.pattern] = graph.patterns.get(m.pattern, 0) + 1
    except Exception as e:  # an aten graph the analysis does not understand: reported, not fatal
        graph.analysis_error = f"{type(e).__name__}: {e}"
    graph.analysis_s = time.perf_counter() - started


def _is_plumbing(target) -> bool:
    import operator
    return target is operator.getitem


# ---- the backend ----------------------------------------------------------------------------

def backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """Dynamo's backend `genie` (the `torch_dynamo_backends` entry point). Returns the callable
    Dynamo runs for `gm`. Raises ValueError for unknown options (genie.compile.options), and
    when `options["node"]` differs from the device of remote inputs."""
    opts = parse_options(mode, options)
    install_fake_fix()  # installed by `import genie.compile`; again for a backend() called directly
    started = time.perf_counter()
    _note_dynamo_graph()
    remote = _remote_device(example_inputs)
    if remote is not None:
        if opts.node is not None and opts.node != remote.index:
            raise ValueError(f"torch.compile(backend='genie'): options['node']={opts.node} but the inputs are on "
                             f"{remote}")
        function = _new_function(gm, remote, host_inputs=False)
        compiled = _aot(gm, example_inputs, remote, opts.mode, function)
    else:
        target = torch.device(_DEVICE, opts.node if opts.node is not None else _C.current_device())
        function = _new_function(gm, target, host_inputs=True)
        compiled = _HostInputs(_compile_for_host_inputs(gm, example_inputs, target, opts.mode, function), target)
    function.backend_s = time.perf_counter() - started
    return compiled


def _new_function(gm: torch.fx.GraphModule, device: torch.device, host_inputs: bool) -> CompiledFunction:
    """The books' record of Dynamo graph `gm` (records.describe_dynamo_graph), kept in order."""
    facts = describe_dynamo_graph(gm)
    function = CompiledFunction(len(_books.functions), facts["name"], facts["location"], facts["compile_id"],
                                str(device), host_inputs, facts["graph_break"], facts["break_at"],
                                input_kinds=facts["input_kinds"])
    _books.functions.append(function)
    return function


def _note_dynamo_graph() -> None:
    if _books.dynamo_graphs == 0:
        _books.graph_breaks_at_start = _graph_breaks()
    _books.dynamo_graphs += 1
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is not None and getattr(compile_id, "frame_compile_id", 0):
        _books.recompiles += 1


def _remote_device(example_inputs) -> torch.device | None:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == _DEVICE:
            return x.device
    return None


def _aot(gm, example_inputs, device: torch.device, mode: str, function: CompiledFunction | None = None):
    compiler = functools.partial(compile_graph, device=device, mode=mode, function=function)
    return aot_autograd(fw_compiler=functools.partial(compiler, kind="forward"),
                        bw_compiler=functools.partial(compiler, kind="backward"),
                        inference_compiler=functools.partial(compiler, kind="inference"),
                        keep_inference_input_mutations=True)(gm, example_inputs)


def _compile_for_host_inputs(gm, example_inputs, target: torch.device, mode: str,
                             function: CompiledFunction | None = None):
    """A graph traced on CPU inputs, compiled for `target`: its CPU factory calls name `target`,
    and AOTAutograd traces it on FakeTensors of the inputs moved to `target`."""
    retarget_devices(gm, target)
    fake_mode = torch._guards.detect_fake_mode(example_inputs)

    def moved(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        if not isinstance(x, FakeTensor):  # a parameter Dynamo passes as it is
            x = fake_mode.from_tensor(x, static_shapes=True)
        with fake_mode:
            y = x.detach().to(target)
        return y.requires_grad_(x.requires_grad)

    return _aot(gm, [moved(x) for x in example_inputs], target, mode, function)


class _HostInputs:
    """Runs a graph compiled for `target` on CPU inputs: moves them to `target`, and the outputs
    back to the CPU, as eager CPU returns them. Both moves are differentiable: gradients reach
    the CPU parameters. A parameter is uploaded once (genie.uploads' weight cache, keyed by its
    host bytes and version, the cache `module.to` uses too): this runner holds the uploaded
    value, so it stays resident between calls, until the parameter changes (an optimizer step
    on the CPU) or the runner is freed."""

    def __init__(self, compiled, target: torch.device) -> None:
        self.compiled = compiled
        self.target = target
        # id(parameter) -> (a weak reference to it, its uploaded value, detached)
        self._held: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def __call__(self, *args):
        moved = [self._move(a) for a in args]
        out = self.compiled(*moved)
        return tree_map(lambda o: o.to("cpu") if isinstance(o, torch.Tensor) and o.device == self.target else o,
                        out)

    def _move(self, a):
        if not isinstance(a, torch.Tensor) or a.device.type != "cpu":
            return a
        moved = a.to(self.target)
        if isinstance(a, torch.nn.Parameter):
            if len(self._held) >= 4096:  # forget the parameters that are gone
                self._held = {k: e for k, e in self._held.items() if e[0]() is not None}
            self._held[id(a)] = (weakref.ref(a), moved.detach())
        return moved
