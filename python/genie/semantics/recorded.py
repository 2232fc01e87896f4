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
- `kv_cache_ids(cut, outputs)`: the KV caches of a cut, as the runtime marks them on the wire
  (the KV-cache pattern in place of a pass of the recorder's own).
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

_WEIGHT, _KV_CACHE = 1, 2  # genie.graph residency classes
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
                    if x.storage in written and x not in made:
                        writes.append(inputs[-1])
            elif value is not None and not hasattr(value, "shape"):
                attrs[arg.name] = value
        outs = [vid(v) for v in n.outputs]
        records.append({"op": n.name, "inputs": inputs, "outputs": outs, "attrs": attrs, "arg_names": names,
                        "writes": sorted(set(writes))})
    return SemGraph.from_nodes(records, values, [ids[v] for v in outputs if v in ids]), ids


def kv_cache_ids(cut, outputs) -> list[int]:
    """The wire value ids of the KV caches in a runtime's `cut` (genie._C.Cut): every value of
    its graph on the storage of a cache the KV-cache pattern finds (the carried or created
    `key_cache`/`value_cache` of each match, and the outputs of its write ops: the cache after
    this step's append). `outputs`: the Values the cut returns or keeps. The runtime gives them
    residency StatefulKvCache on the wire, in this cut and in every later cut of its structure
    (Recording.set_kv_cache). Empty when the graph has no attention or no cache write, which
    the patterns' op sets tell before any matching."""
    nodes = cut.nodes
    names = {n.name for n in nodes}
    if names.isdisjoint(_KV.ops) or names.isdisjoint(_ATTENTION.ops):
        return []
    graph, ids = _built(nodes, outputs)
    caches: set[int] = set()
    for match in _KV.match(graph):
        caches.update(v for role, v in match.roles.items() if role in ("key_cache", "value_cache"))
        for index in match.nodes:
            caches.update(graph.nodes[index].outputs)
    value_of = {sid: v for v, sid in ids.items()}
    storages = {value_of[sid].storage for sid in caches}
    found = (cut.value_id(v) for v, sid in ids.items() if v.storage in storages)
    return sorted({i for i in found if i is not None})


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
