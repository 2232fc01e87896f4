"""Lowering a cut of the pending graph to a wire `Graph`, and graph reuse.

`lower(nodes)` numbers values as the wire format does (graph inputs 0..n-1, then each node's
outputs in order) and returns a `Lowered`: the graph's inputs (resident tensors by handle;
weights baked into the graph as bound inputs; CPU constants carried inline), a structural
`key` and the graph's numbers (int arguments, int list elements, float arguments) in walk
order.

Graph reuse (DESIGN.md "a graph whose structure was seen before is run by id"): the key is the
graph with every such number replaced by a marker (INT or FLOAT); weight handles are part of
it, other inputs are not. `GraphCache` remembers, per key, the numbers of the first graph seen
and which positions have since changed; those positions become scalar inputs (`ScalarSlot`),
so a decode loop whose sequence length grows by one each step, or an optimizer step whose
bias correction and step size change every step (Adam), registers its graph once or twice
and then only sends the changed numbers (RunGraph.scalars) and its input handles. Floats
inside float lists stay literal (the wire's float lists have no scalar slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import _C
from .graph import KEEP, KEEP_AND_DESCRIBE, RETURN, RETURN_AND_KEEP, Constant, Node, Storage, Value, new_handle


class _IntMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<int>"


INT = _IntMarker()


class _FloatMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<float>"


FLOAT = _FloatMarker()


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a value of a lowered graph: graph input `index` (`output` False) or the
    `index`-th value the graph's nodes produce (`output` True). Wire value id: `index` for an
    input, num_inputs + `index` for a produced value."""

    output: bool
    index: int


# Ref(False, i) and Ref(True, i) at index i, made once and shared by every lowering (genie._C
# appends to them as graphs grow).
_INPUT_REFS: list[Ref] = []
_OUTPUT_REFS: list[Ref] = []


@dataclass(slots=True)
class Lowered:
    """A lowered cut. `inputs[i]` is ("weight", handle), ("handle", handle) or ("inline", tensor);
    `ops[i]` is node i's OpOverload (the key holds `id(op)`: hashing an OpOverload runs Python)."""

    key: tuple
    numbers: list[int | float]  # the graph's liftable numbers in walk order (INT / FLOAT in the key)
    inputs: list[tuple[str, object]]
    value_ids: dict[int, int]  # id(Value) -> wire value id
    num_inputs: int
    ops: list


def lower(nodes: list[Node], extra_inputs: list[Value] = ()) -> Lowered:
    """Lowers `nodes` (program order) in one walk. `extra_inputs` are resident values to add
    as inputs (values the caller wants returned that no node reads). Raises the value's error
    for a lost input, RuntimeError for a value that is neither pending nor resident.

    Inputs are numbered in order of first use (extra inputs first), produced values in node
    order. Each argument becomes: a `Ref` for a Value or Constant; INT for an int and FLOAT
    for a float (their values appended to `numbers`), except inside a list holding a float,
    whose numbers stay literal; a tuple for a list or tuple; `torch.device(type)` for a device
    (the node uses its own index); anything else itself. The key is (per input
    ("weight", handle) | ("handle", dtype) | ("inline", dtype), per node (id(op), args,
    ((name, kwarg), ...), num_outputs)). Implemented in C++ (`genie._C.lower`,
    python/csrc/cut_fast.cc): it walks every argument of every node of the cut."""
    key, numbers, inputs, value_ids, num_inputs, ops = _C.lower(nodes, extra_inputs)
    return Lowered(key, numbers, inputs, value_ids, num_inputs, ops)


@dataclass
class _Family:
    """Graphs of one structural key: the first numbers seen and the positions that changed."""

    base: list[int | float]
    lifted: frozenset[int] = frozenset()
    ids: dict[frozenset[int], bytes] = field(default_factory=dict)


class GraphCache:
    """Registered graphs by structure; decides which numbers travel as scalars.

    `prepare(lowered)` returns (lifted positions, scalars to bind, graph id or None when the
    graph must be registered first with `encode(lowered, lifted)`; then `remember`).
    """

    def __init__(self) -> None:
        self._families: dict[tuple, _Family] = {}
        # The last key and its family: a loop runs one structure again and again, and
        # comparing with the last key walks it once, where a lookup hashes it and compares.
        self._last: tuple[tuple, _Family] | None = None

    def clear(self) -> None:
        self._families.clear()
        self._last = None

    def __len__(self) -> int:
        return sum(len(f.ids) for f in self._families.values())

    def prepare(self, lowered: Lowered) -> tuple[frozenset[int], list[tuple[int, int]], bytes | None]:
        last = self._last
        family = last[1] if last is not None and last[0] == lowered.key else self._families.get(lowered.key)
        if family is None:
            family = _Family(list(lowered.numbers))
            self._families[lowered.key] = family
        else:
            lifted = family.lifted
            # A number differs when a literal of the first graph cannot stand for it: unequal
            # (NaN differs from itself, so a NaN position is lifted) or a zero of the other
            # sign. Positions already lifted stay lifted.
            changed = {i for i, (a, b) in enumerate(zip(lowered.numbers, family.base))
                       if (a != b or (a == 0 and type(a) is float and _sign_differs(a, b))) and i not in lifted}
            if changed:
                family.lifted = lifted | changed
        self._last = (lowered.key, family)
        lifted = family.lifted
        positions = sorted(lifted)
        scalars = [(slot, lowered.numbers[pos]) for slot, pos in enumerate(positions)]
        return lifted, scalars, family.ids.get(lifted)

    def remember(self, lowered: Lowered, lifted: frozenset[int], graph_id: bytes) -> None:
        self._families[lowered.key].ids[lifted] = graph_id


def _sign_differs(a: float, b) -> bool:
    """Zeros of opposite sign: -0.0 == 0.0, but 1 / -0.0 is -inf, so a literal 0.0 cannot
    stand for -0.0."""
    return math.copysign(1.0, a) != math.copysign(1.0, b)


def encode(lowered: Lowered, lifted: frozenset[int], name: str = "") -> bytes:
    """Serializes a lowered graph with the `lifted` int positions as scalar inputs."""
    slot_of = {pos: slot for slot, pos in enumerate(sorted(lifted))}
    counter = iter(range(len(lowered.numbers)))

    n = lowered.num_inputs

    def conv(a):
        t = type(a)
        if t is Ref:
            return _C.TensorRef(n + a.index if a.output else a.index)
        if a is INT or a is FLOAT:
            pos = next(counter)
            slot = slot_of.get(pos)
            return lowered.numbers[pos] if slot is None else _C.ScalarSlot(slot)
        if t is tuple:
            return [conv(x) for x in a]
        return a

    nodes = []
    for op, (_, args, kwargs, num_outputs) in zip(lowered.ops, lowered.key[1]):
        schema = op._schema
        encoded = [("", conv(a)) for a in args] + [(k, conv(v)) for k, v in kwargs]
        nodes.append((schema.name, schema.overload_name, encoded, num_outputs))
    # No input descriptors: graphs stay shape-generic (the node checks shapes as it runs ops).
    inputs = [(None, handle if kind == "weight" else None) for kind, handle in lowered.inputs]
    return _C.encode_graph(inputs, len(lifted), nodes, name)


# ---- a cut as a RunGraph request ------------------------------------------------------------

class Cut:
    """A prepared cut: the RunGraph arguments (graph_id, bindings, scalars, specs, frees), the
    Value of each output spec, the (value, handle, residency) it keeps resident, and the weight
    handles its graph binds itself."""

    __slots__ = ("request", "spec_values", "kept", "weights")

    def __init__(self, request: tuple, spec_values: list[Value], kept: list[tuple], weights: tuple = ()) -> None:
        self.request = request
        self.spec_values = spec_values
        self.kept = kept
        self.weights = weights

    def keep(self) -> None:
        """The run was sent (and succeeded, or is asynchronous): kept values get their handles."""
        for v, handle, residency in self.kept:
            v.handle = handle
            v.residency = residency


def output_specs(nodes: list[Node], value_ids: dict[int, int], returned: list[Value], described: list[Value]):
    """RunGraph.outputs for a cut: `returned` values come back (and stay resident if a tensor
    holds them), `described` stay resident and report their descriptors, every other value a
    live tensor holds stays resident. Returns (specs, the value of each spec, kept values)."""
    specs, values, kept = [], [], []

    def add(v: Value, action: int) -> None:
        handle = new_handle() if action != RETURN else None
        specs.append((value_ids[id(v)], action, handle, v.residency))
        values.append(v)
        if handle is not None:
            kept.append((v, handle, v.residency))

    for v in returned:
        add(v, RETURN_AND_KEEP if v.tensors > 0 and v.node is not None else RETURN)
    for v in described:
        add(v, KEEP_AND_DESCRIBE)
    seen = {id(v) for v in values}
    for node in nodes:
        for v in node.outputs:
            if v.tensors > 0 and id(v) not in seen:
                add(v, KEEP)
    return specs, values, kept


_C.configure_cut(Node, Value, Storage, Constant, Ref, INT, FLOAT, _INPUT_REFS, _OUTPUT_REFS, torch.device)
