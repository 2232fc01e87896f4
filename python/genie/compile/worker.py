"""The compile worker: one wire graph in, one AOT Inductor package out.

genie-node starts it on its own host to compile a registered graph ahead of time; it then
loads the package with `torch::inductor::AOTIModelPackageLoader` and runs it in place of the
executor (docs/compile.md, "Later slices").

    python -m genie.compile.worker --graph GRAPH.bin --spec SPEC.json --out PACKAGE.pt2 [--verbose]

GRAPH.bin: a serialized wire Graph (schemas/genie.fbs; the bytes RegisterGraph carries),
  decoded with genie._C.decode_graph. Every input is a tensor bound per call (no
  GraphInput.handle) and num_scalar_inputs is 0.
SPEC.json: {"device": "cpu" | "cuda:0",
            "inputs": [{"dtype": "float32", "sizes": [..], "strides": [..], "storage_offset": 0}, ...],
            "outputs": [value id, ...], "mode": "default"}
  one input per graph input, in order; outputs are wire value ids (graph inputs 0..n-1, then
  each node's outputs in order, a tuple or Tensor[] return one id per tensor); mode is one of
  torch.compile's (genie.compile.options.MODES; the max-autotune ones set Inductor's
  max_autotune, the others compile the same package).

The graph is replayed as a torch.fx GraphModule, one `torch.ops.<ns>.<op>.<overload>` call per
node, bound as the node's executor binds it (src/node/executor.cc): arguments named "" are
positional, named ones keywords; a number given for a Tensor argument stays a number (the
op's Python binding makes it the wrapped-number tensor the executor makes); every Device
argument becomes the spec's device. The module returns the tuple of spec["outputs"]; it is
exported (torch.export.export, strict=False) on empty tensors of the spec's sizes and strides
and compiled with torch._inductor.aoti_compile_and_package into a temporary file beside
PACKAGE.pt2, renamed onto it once complete. The package's metadata
(AOTIModelPackageLoader::get_metadata) holds "genie.outputs": per output
"dtype:s0,s1,...:st0,st1,..." (its dtype, sizes and strides as eager gives them, found on
FakeTensors), joined by ";", e.g. "float32:4,5:5,1;int64::" for a 4x5 and a 0-dim output.

Success: exit 0 and one JSON line on stdout, {"package": PACKAGE.pt2, "compile_s": seconds,
"nodes": number of graph nodes}; whatever the compilers print goes to stderr. Failure: exit 1
and one line on stderr, "genie.compile.worker: <what failed>: <exception>" (the node index and
op when a node fails), with the traceback above it under --verbose.
"""
from __future__ import annotations

import argparse
import json
import logging
import operator
import os
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager

import torch

from .. import _C
from .options import MODES

PREFIX = "genie.compile.worker: "
METADATA_KEY = "genie.outputs"
_MAX_REASON_CHARS = 2000


class WorkerError(Exception):
    """A failure the worker reports as one line: what failed, and why."""


# ---- inputs ----------------------------------------------------------------------------

def read_graph(path: str):
    """(inputs, nodes) of the wire graph in `path`, refused unless its inputs are all tensors
    bound per call and it takes no scalar inputs."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise WorkerError(f"graph {path}: {e.strerror}") from e
    try:
        inputs, num_scalar_inputs, nodes = _C.decode_graph(data)
    except ValueError as e:
        raise WorkerError(f"graph {path}: {e}") from e
    if num_scalar_inputs != 0:
        raise WorkerError(f"graph {path}: takes {num_scalar_inputs} scalar inputs; a package binds tensors only "
                          "(num_scalar_inputs must be 0)")
    for i, (_, handle) in enumerate(inputs):
        if handle is not None:
            raise WorkerError(f"graph {path}: inputs[{i}] is bound to resident handle {handle.hex()}; "
                              "a package takes every input per call")
    return inputs, nodes


def _int_list(value, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise WorkerError(f"{what}: expected a list of ints, got {value!r}")
    return value


def read_spec(path: str, graph_inputs: list) -> dict:
    """SPEC.json checked against the graph: device, inputs (dtype, sizes, strides,
    storage_offset), outputs and mode, as the module docstring describes."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except OSError as e:
        raise WorkerError(f"spec {path}: {e.strerror}") from e
    except ValueError as e:
        raise WorkerError(f"spec {path}: not JSON ({e})") from e
    if not isinstance(spec, dict):
        raise WorkerError(f"spec {path}: expected a JSON object")
    try:
        device = torch.device(str(spec.get("device", "cpu")))
    except (RuntimeError, TypeError) as e:
        raise WorkerError(f"spec {path}: device {spec.get('device')!r}: {e}") from e
    mode = spec.get("mode", "default")
    if mode not in MODES:
        raise WorkerError(f"spec {path}: unknown mode {mode!r}; accepted: {', '.join(MODES)}")
    inputs = spec.get("inputs")
    if not isinstance(inputs, list):
        raise WorkerError(f"spec {path}: 'inputs' must be a list")
    if len(inputs) != len(graph_inputs):
        raise WorkerError(f"spec {path}: gives {len(inputs)} inputs, the graph takes {len(graph_inputs)}")
    checked = []
    for i, (entry, (graph_dtype, _)) in enumerate(zip(inputs, graph_inputs)):
        what = f"spec {path}: inputs[{i}]"
        if not isinstance(entry, dict):
            raise WorkerError(f"{what}: expected an object")
        dtype = getattr(torch, str(entry.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise WorkerError(f"{what}: unknown dtype {entry.get('dtype')!r}")
        if graph_dtype is not None and graph_dtype != dtype:
            raise WorkerError(f"{what}: dtype {_dtype_name(dtype)}, the graph expects {_dtype_name(graph_dtype)}")
        sizes = _int_list(entry.get("sizes"), f"{what}.sizes")
        strides = _int_list(entry.get("strides"), f"{what}.strides")
        offset = entry.get("storage_offset", 0)
        if len(strides) != len(sizes) or any(s < 0 for s in sizes + strides) or not isinstance(offset, int) or offset < 0:
            raise WorkerError(f"{what}: sizes {sizes}, strides {strides}, storage_offset {offset!r} "
                              "do not describe a tensor")
        checked.append((dtype, sizes, strides, offset))
    outputs = spec.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        raise WorkerError(f"spec {path}: 'outputs' must name at least one value id")
    _int_list(outputs, f"spec {path}: outputs")
    return {"device": device, "inputs": checked, "outputs": outputs, "mode": mode}


def example_inputs(spec: dict) -> list[torch.Tensor]:
    """Uninitialized tensors with the spec's dtypes, sizes, strides and storage offsets."""
    tensors = []
    for dtype, sizes, strides, offset in spec["inputs"]:
        if offset == 0:
            tensors.append(torch.empty_strided(sizes, strides, dtype=dtype, device=spec["device"]))
            continue
        span = 0 if 0 in sizes else 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
        base = torch.empty(offset + span, dtype=dtype, device=spec["device"])
        tensors.append(base.as_strided(sizes, strides, offset))
    return tensors


# ---- the FX graph ----------------------------------------------------------------------

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _op_name(op: str, overload: str) -> str:
    return f"{op}.{overload or 'default'}"


def resolve_op(op: str, overload: str, where: str):
    """torch.ops.<ns>.<name>.<overload or default>; WorkerError when none is registered."""
    namespace, sep, name = op.partition("::")
    if not sep or not namespace or not name:
        raise WorkerError(f"{where}: op name {op!r} is not 'namespace::name'")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        raise WorkerError(f"{where}: no such operator or overload is registered") from None


def _element_type(jit_type):
    """The type inside Optional[...], or the type itself."""
    return jit_type.getElementType() if jit_type.kind() == "OptionalType" else jit_type


def _is_tensor(jit_type) -> bool:
    return _element_type(jit_type).kind() == "TensorType"


class _Builder:
    """Adds the wire nodes to an fx.Graph; values[id] is the fx value of wire value `id`."""

    def __init__(self, device: torch.device, num_inputs: int):
        self.graph = torch.fx.Graph()
        self.device = device
        self.values = [self.graph.placeholder(f"input_{i}") for i in range(num_inputs)]

    def add(self, index: int, op: str, overload: str, args: list, num_outputs: int) -> None:
        where = f"nodes[{index}] ({_op_name(op, overload)})"
        overload_fn = resolve_op(op, overload, where)
        schema = overload_fn._schema
        positional, keywords, next_positional = [], {}, 0
        for name, value in args:
            if name:
                param = next((p for p in schema.arguments if p.name == name), None)
                if param is None:
                    raise WorkerError(f"{where}: the schema has no argument '{name}'")
                keywords[name] = self._value(value, param.type, f"{where} argument '{name}'")
                continue
            while next_positional < len(schema.arguments) and schema.arguments[next_positional].kwarg_only:
                next_positional += 1
            if next_positional >= len(schema.arguments):
                raise WorkerError(f"{where}: {len(positional) + 1} positional arguments given, "
                                  f"the schema takes {len(schema.arguments)}")
            param = schema.arguments[next_positional]
            next_positional += 1
            positional.append(self._value(value, param.type, f"{where} argument '{param.name}'"))
        node = self.graph.call_function(overload_fn, tuple(positional), keywords)
        node.meta["genie.node"] = where
        self.values.extend(self._outputs(node, schema, num_outputs, where))

    def _value(self, value, jit_type, where: str):
        element = _element_type(jit_type)
        if isinstance(value, list):
            inner = element.getElementType() if element.kind() == "ListType" else element
            return [self._value(v, inner, where) for v in value]
        if value is None:
            return None
        if isinstance(value, _C.TensorRef):
            return self.values[value.value]
        # No ScalarSlot: read_graph refused scalar inputs, and the verifier any slot past them.
        if element.kind() == "DeviceObjType" and isinstance(value, (torch.device, str)):
            return self.device  # the executor's rewrite: tensors live on the node's device
        return value  # numbers for Tensor arguments included: the binding wraps them as the executor does

    def _outputs(self, node, schema, num_outputs: int, where: str) -> list:
        """The fx values of the node's wire outputs: the result itself, or getitem paths into its
        tuple and Tensor[] returns, one per tensor."""
        returns = [r.type for r in schema.returns]
        for r in returns:
            if not _is_tensor(r) and not (r.kind() == "ListType" and _is_tensor(r.getElementType())):
                raise WorkerError(f"{where}: returns {r}, not a tensor; a package returns tensors only")
        lists = [i for i, r in enumerate(returns) if r.kind() == "ListType"]
        if len(lists) > 1:
            raise WorkerError(f"{where}: returns {len(lists)} Tensor[]; at most one is supported")
        list_length = num_outputs - (len(returns) - len(lists))
        if (lists and list_length < 0) or (not lists and len(returns) != num_outputs):
            raise WorkerError(f"{where}: returns {len(returns)} values, the graph gives it {num_outputs} outputs")
        paths = []
        for i, r in enumerate(returns):
            paths += [(i, j) for j in range(list_length)] if r.kind() == "ListType" else [(i,)]
        if lists:
            node.meta["genie.list_length"] = list_length
        outputs = []
        for path in paths:
            value = node
            for k in (path[1:] if len(returns) == 1 else path):
                value = self.graph.call_function(operator.getitem, (value, k))
                value.meta["genie.node"] = where
            outputs.append(value)
        return outputs


def build_graph_module(inputs: list, nodes: list, spec: dict) -> torch.fx.GraphModule:
    """The GraphModule replaying the wire graph, returning the tuple of spec["outputs"]."""
    builder = _Builder(spec["device"], len(inputs))
    for index, (op, overload, args, num_outputs) in enumerate(nodes):
        builder.add(index, op, overload, args, num_outputs)
    outputs = []
    for k, value_id in enumerate(spec["outputs"]):
        if not 0 <= value_id < len(builder.values):
            raise WorkerError(f"spec outputs[{k}]: value {value_id} is not in the graph (ids 0..{len(builder.values) - 1})")
        outputs.append(builder.values[value_id])
    builder.graph.output(tuple(outputs))
    builder.graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), builder.graph)


class _NamedInterpreter(torch.fx.Interpreter):
    """Runs the module naming the wire node that fails, and checking Tensor[] lengths."""

    def run_node(self, n):
        try:
            result = super().run_node(n)
        except WorkerError:
            raise
        except Exception as e:
            raise WorkerError(f"{n.meta.get('genie.node', n.name)}: {_reason(e)}") from e
        expected = n.meta.get("genie.list_length")
        if expected is not None:
            found = result if isinstance(result, (list, tuple)) and len(n.target._schema.returns) == 1 else None
            if found is not None and len(found) != expected:
                raise WorkerError(f"{n.meta['genie.node']}: produced {len(found)} tensors, the graph expects {expected}")
        return result


def eager_outputs(gm: torch.fx.GraphModule, examples: list[torch.Tensor]) -> str:
    """genie.outputs: each output's dtype, sizes and strides as eager gives them (on FakeTensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in examples]
    with mode:
        outputs = _NamedInterpreter(gm).run(*fakes)
    entries = []
    for k, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            raise WorkerError(f"spec outputs[{k}]: value is {type(out).__name__}, not a tensor")
        sizes = ",".join(str(int(s)) for s in out.shape)
        strides = ",".join(str(int(s)) for s in out.stride())
        entries.append(f"{_dtype_name(out.dtype)}:{sizes}:{strides}")
    return ";".join(entries)


# ---- compile ---------------------------------------------------------------------------

def _reason(e: BaseException) -> str:
    """One line: the exception's class and first non-empty line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text[:_MAX_REASON_CHARS]


@contextmanager
def _stdout_to_stderr():
    """Sends fd 1 (Python's and the compilers' it spawns) to stderr, keeping stdout for the result."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _inductor_configs(mode: str, outputs: str) -> dict:
    configs = {"aot_inductor.metadata": {METADATA_KEY: outputs}}
    if mode.startswith("max-autotune"):
        configs["max_autotune"] = True
    return configs


def compile_package(graph_path: str, spec_path: str, out_path: str) -> dict:
    """Builds PACKAGE.pt2 (atomically) and returns the result line's fields."""
    start = time.monotonic()
    inputs, nodes = read_graph(graph_path)
    spec = read_spec(spec_path, inputs)
    gm = build_graph_module(inputs, nodes, spec)
    examples = example_inputs(spec)
    outputs = eager_outputs(gm, examples)
    try:
        exported = torch.export.export(gm, tuple(examples), strict=False)
    except Exception as e:
        raise WorkerError(f"torch.export.export: {_reason(e)}") from e
    directory = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out_path)}.", suffix=".tmp.pt2", dir=directory)
    os.close(fd)
    try:
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=tmp,
                                                     inductor_configs=_inductor_configs(spec["mode"], outputs))
        except Exception as e:
            raise WorkerError(f"aoti_compile_and_package: {_reason(e)}") from e
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"package": out_path, "compile_s": round(time.monotonic() - start, 3), "nodes": len(nodes)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors fail as any other: exit 1, one line
        raise WorkerError(f"arguments: {message}")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m genie.compile.worker",
                     description="Compiles a Genie wire graph into an AOT Inductor package (.pt2).")
    parser.add_argument("--graph", required=True, help="serialized wire Graph (RegisterGraph's bytes)")
    parser.add_argument("--spec", required=True, help="JSON: device, inputs (dtype, sizes, strides, "
                                                      "storage_offset), outputs (value ids), mode")
    parser.add_argument("--out", required=True, help="the package to write (.pt2), replaced atomically")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of a failure")
    verbose = "--verbose" in (sys.argv[1:] if argv is None else argv)
    if not verbose:  # FakeTensor logs a failing op's traceback, which the reason line already names
        logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    try:
        args = parser.parse_args(argv)
        with _stdout_to_stderr():
            result = compile_package(args.graph, args.spec, args.out)
    except Exception as e:
        if verbose:
            traceback.print_exc()
        # torch.fx's Interpreter appends "While executing ..." lines to what passes through it.
        reason = str(e).splitlines()[0] if isinstance(e, WorkerError) else f"unexpected error: {_reason(e)}"
        print(PREFIX + reason, file=sys.stderr, flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
