"""Genie's recorded graph as a `SemGraph`, and the analysis of every step a program runs.

- `from_recorded(nodes, outputs=())`: the recorder's nodes (`genie.graph.Node`: what
  `genie.get_graph().nodes` or a cut's `nodes` hold) as a `SemGraph`. Each node's op is its
  schema name (`Node.name`, "aten::addmm"); its tensor arguments are `Value`s; its other
  arguments become attributes by schema name. A value no node of the list makes is a graph
  input: "weight" when the recorder marked it a weight (residency PersistentWeight: a
  parameter uploaded by `module.to`), "buffer" when it is a KV cache (StatefulKvCache), else
  "input". Shapes come from `Value.shape` (the recorder's shape inference); a value whose
  shape only the node knows (an op with data-dependent output sizes) gets shape () and the
  analysis treats it as a scalar. An op writes the inputs whose storage is among its `writes`.
  Every value no node of the list makes is an input: a cut's resident values, or values an
  earlier part of the program made.
- `residency_ids(cut, outputs)`: the KV caches and gradients of a cut, as the runtime marks
  them on the wire (the analysis in place of a pass of the recorder's own).
- `StepLog`: installed with `observe(log)`, it receives every cut a runtime sends (each step
  of a program: a `generate()` step is one cut, read at its token) and keeps the analysis of
  each (`analyze`, cached by structure then by shapes), in order.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .cache import Annotated, analyze
from .graph import SemGraph
from .patterns import AttentionPattern, KVCachePattern
from .phases import regions
from .residency import CLASSES, assign
from ..graph import KV_CACHE as _KV_CACHE, WEIGHT as _WEIGHT

_KV, _ATTENTION = KVCachePattern(), AttentionPattern()


def _kind_of(value) -> str:
    residency = value.residency
    if residency == _WEIGHT:
        return "weight"
    if residency == _KV_CACHE:
        return "buffer"
    return "input"


def _is_value(x) -> bool:
    return type(x).__name__ == "Value" and hasattr(x, "storage") and hasattr(x, "residency")


def _dtype(value) -> str:
    return str(value.dtype).replace("torch.", "")


def from_recorded(nodes, outputs=()) -> SemGraph:
    """The recorder's `nodes` (program order) as a SemGraph; `outputs` are Values the program
    reads (see the module docstring)."""
    return _built(nodes, outputs)[0]


def _built(nodes, outputs) -> tuple[SemGraph, dict]:
    """(the SemGraph of `nodes`, {recorder Value: its SemGraph value id})."""
    ids: dict = {}
    values: dict[int, dict] = {}
    records = []
    made = {v for n in nodes for v in n.outputs}

    def vid(v) -> int:
        found = ids.get(v)
        if found is None:
            found = ids[v] = len(ids)
            shape = v.shape
            record = {"shape": tuple(shape) if shape is not None else (), "dtype": _dtype(v)}
            if v not in made:
                record["kind"] = _kind_of(v)
            values[found] = record
        return found

    for n in nodes:
        schema = n.op._schema
        inputs, names, attrs, writes = [], [], {}, []
        written = set(n.writes)
        shown = list(n.args) + [n.kwargs.get(a.name) for a in schema.arguments[len(n.args):]]
        for arg, value in zip(schema.arguments, shown):
            items = value if isinstance(value, (list, tuple)) and any(_is_value(x) for x in value) else None
            if _is_value(value) or items is not None:
                for x in (items if items is not None else [value]):
                    if not _is_value(x):
                        continue
                    inputs.append(vid(x))
                    names.append(arg.name)
                    if x.storage in written:
                        writes.append(inputs[-1])
            elif value is not None and not hasattr(value, "shape"):
                attrs[arg.name] = value
        outs = [vid(v) for v in n.outputs]
        records.append({"op": n.name, "inputs": inputs, "outputs": outs, "attrs": attrs, "arg_names": names,
                        "writes": sorted(set(writes))})
    return SemGraph.from_nodes(records, values, [ids[v] for v in outputs if v in ids]), ids


def residency_ids(cut, outputs) -> dict[int, int]:
    """The semantic residency of a runtime's `cut` (genie._C.Cut): {wire value id: class} for
    the values of its graph that `residency.assign` (the rules explain uses) makes "kv_cache"
    (2: the KV-cache pattern's caches and their appends) or "gradient" (3: what the backward
    region makes), every value on such a value's storage included (views, in-place updates).
    `outputs`: the Values the cut returns or keeps. The runtime puts these classes on the wire
    in this cut and in every later cut of its structure (Recording.set_residency). Empty, with
    nothing built, when the cut has neither an attention with a cache write nor a backward op
    (the ops' names tell)."""
    names = {n.name for n in cut.nodes}
    kv = not names.isdisjoint(_KV.ops) and not names.isdisjoint(_ATTENTION.ops)
    if not kv and not any("_backward" in name for name in names):
        return {}
    graph, ids = _built(cut.nodes, outputs)
    classes = assign(graph, _KV.match(graph) if kv else [], regions(graph))
    value_of = {sid: v for v, sid in ids.items()}
    storage_class: dict = {}
    for sid, name in classes.items():
        if name in ("kv_cache", "gradient"):
            storage_class.setdefault(value_of[sid].storage, CLASSES[name])
    out = {}
    for v in ids:
        cls = storage_class.get(v.storage)
        if cls is not None and (i := cut.value_id(v)) is not None:
            out[i] = cls
    return out


@dataclass
class Step:
    """One cut a runtime sent: its device, its graph and the analysis."""

    device: str
    graph: SemGraph
    annotated: Annotated


@dataclass
class StepLog:
    """The analysed steps, in the order their cuts were sent (see `observe`)."""

    steps: list[Step] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # cuts that could not be analysed, and why
    limit: int = 4096

    def __call__(self, device, nodes, returned) -> None:
        if len(self.steps) >= self.limit or not nodes:
            return
        try:
            graph = from_recorded(nodes, returned)
            self.steps.append(Step(str(device), graph, analyze(graph)))
        except Exception as error:  # analysis never breaks the program it watches
            self.errors.append(f"{type(error).__name__}: {error}")

    def phases(self) -> list[str]:
        """The phase of each step ("prefill", "decode", "vision", "forward", ...)."""
        return [s.annotated.phase for s in self.steps]


_lock = threading.Lock()


def observe(log: StepLog | None) -> None:
    """Makes every runtime pass each cut it sends to `log` (None: stop)."""
    from .. import runtime
    with _lock:
        runtime.set_cut_observer(log)
