"""Lowering a cut of the pending graph to a wire `Graph`, and graph reuse.

`lower(nodes)` numbers values as the wire format does (graph inputs 0..n-1, then each node's
outputs in order) and returns a `Lowered`: the graph's inputs (resident tensors by handle;
weights baked into the graph as bound inputs; CPU constants carried inline), a structural
`key` and the graph's ints in walk order.

Graph reuse (DESIGN.md "a graph whose structure was seen before is run by id"): the key is the
graph with every int argument replaced by a marker; weight handles are part of it, other
inputs are not. `GraphCache` remembers, per key, the ints of the first graph seen and which
positions have since changed; those positions become scalar inputs (`ScalarSlot`), so a decode
loop whose sequence length grows by one each step registers its graph once or twice and then
only sends the changed ints (RunGraph.scalars) and its input handles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .graph import Constant, Node, Value


class _IntMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<int>"


INT = _IntMarker()


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to graph value `id` inside a lowered graph."""

    id: int


@dataclass(slots=True)
class Lowered:
    """A lowered cut. `inputs[i]` is ("weight", handle), ("handle", handle) or ("inline", tensor)."""

    key: tuple
    ints: list[int]
    inputs: list[tuple[str, object]]
    value_ids: dict[int, int]  # id(Value) -> graph value id
    num_inputs: int


def lower(nodes: list[Node], extra_inputs: list[Value] = ()) -> Lowered:
    """Lowers `nodes` (program order). `extra_inputs` are resident values to add as inputs
    (values the caller wants returned that no node reads)."""
    value_ids: dict[int, int] = {}
    inputs: list[tuple[str, object]] = []
    input_keys: list[tuple] = []
    produced: set[int] = set()

    def add_input(a) -> None:
        if type(a) is Value:
            if id(a) in value_ids or id(a) in produced:
                return
            if a.error is not None:
                raise a.error
            if a.handle is None:
                raise RuntimeError(f"value {a!r} is neither pending nor resident (lost)")
            kind = "weight" if a.residency == 1 else "handle"
            value_ids[id(a)] = len(inputs)
            inputs.append((kind, a.handle))
            input_keys.append((kind, a.handle) if kind == "weight" else (kind, a.dtype))
        elif type(a) is Constant:
            if id(a) in value_ids:
                return
            value_ids[id(a)] = len(inputs)
            inputs.append(("inline", a.tensor))
            input_keys.append(("inline", a.tensor.dtype))
        elif type(a) in (list, tuple):
            for x in a:
                add_input(x)

    for v in extra_inputs:
        add_input(v)
    for node in nodes:
        for a in node.args:
            add_input(a)
        for a in node.kwargs.values():
            add_input(a)
        for o in node.outputs:
            produced.add(id(o))

    next_id = len(inputs)
    ints: list[int] = []
    entries = []

    def enc(a, in_float_list: bool = False):
        t = type(a)
        if t is Value or t is Constant:
            return Ref(value_ids[id(a)])
        if t is int and not in_float_list:
            ints.append(a)
            return INT
        if t in (list, tuple):
            has_float = any(type(x) is float for x in a)
            return tuple(enc(x, has_float) for x in a)
        if t is torch.device:
            return torch.device(a.type)
        return a

    for node in nodes:
        args = tuple(enc(a) for a in node.args)
        kwargs = tuple((k, enc(v)) for k, v in node.kwargs.items())
        entries.append((node.op, args, kwargs, node.num_outputs))
        for o in node.outputs:
            value_ids[id(o)] = next_id
            next_id += 1
    key = (tuple(input_keys), tuple(entries))
    return Lowered(key, ints, inputs, value_ids, len(inputs))


@dataclass
class _Family:
    """Graphs of one structural key: the first ints seen and the positions that changed."""

    base: list[int]
    lifted: frozenset[int] = frozenset()
    ids: dict[frozenset[int], bytes] = field(default_factory=dict)


class GraphCache:
    """Registered graphs by structure; decides which ints travel as scalars.

    `prepare(lowered)` returns (lifted positions, scalars to bind, graph id or None when the
    graph must be registered first with `encode(lowered, lifted)`; then `remember`).
    """

    def __init__(self) -> None:
        self._families: dict[tuple, _Family] = {}

    def clear(self) -> None:
        self._families.clear()

    def __len__(self) -> int:
        return sum(len(f.ids) for f in self._families.values())

    def prepare(self, lowered: Lowered) -> tuple[frozenset[int], list[tuple[int, int]], bytes | None]:
        family = self._families.get(lowered.key)
        if family is None:
            family = _Family(list(lowered.ints))
            self._families[lowered.key] = family
        else:
            changed = {i for i, (a, b) in enumerate(zip(lowered.ints, family.base)) if a != b}
            if not changed <= family.lifted:
                family.lifted = family.lifted | changed
        lifted = family.lifted
        positions = sorted(lifted)
        scalars = [(slot, lowered.ints[pos]) for slot, pos in enumerate(positions)]
        return lifted, scalars, family.ids.get(lifted)

    def remember(self, lowered: Lowered, lifted: frozenset[int], graph_id: bytes) -> None:
        self._families[lowered.key].ids[lifted] = graph_id


def encode(lowered: Lowered, lifted: frozenset[int], name: str = "") -> bytes:
    """Serializes a lowered graph with the `lifted` int positions as scalar inputs."""
    from . import _C

    slot_of = {pos: slot for slot, pos in enumerate(sorted(lifted))}
    counter = iter(range(len(lowered.ints)))

    def conv(a):
        t = type(a)
        if t is Ref:
            return _C.TensorRef(a.id)
        if a is INT:
            pos = next(counter)
            slot = slot_of.get(pos)
            return lowered.ints[pos] if slot is None else _C.ScalarSlot(slot)
        if t is tuple:
            return [conv(x) for x in a]
        return a

    nodes = []
    for op, args, kwargs, num_outputs in lowered.key[1]:
        schema = op._schema
        encoded = [("", conv(a)) for a in args] + [(k, conv(v)) for k, v in kwargs]
        nodes.append((schema.name, schema.overload_name, encoded, num_outputs))
    # No input descriptors: graphs stay shape-generic (the node checks shapes as it runs ops).
    inputs = [(None, handle if kind == "weight" else None) for kind, handle in lowered.inputs]
    return _C.encode_graph(inputs, len(lifted), nodes, name)
