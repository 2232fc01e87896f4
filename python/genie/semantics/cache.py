"""`analyze(graph) -> Annotated`: semantic analysis behind a two-level cache (seed 000 §4.5).

Level 1 (structure): keyed by a Weisfeiler–Lehman hash of the graph (Shervashidze et al.,
"Weisfeiler-Lehman Graph Kernels", JMLR 2011). Vertices are the graph inputs (label: kind,
written or not, rank) and the nodes (label: `Node.key`: the op, its structural attributes,
its outputs' ranks).
Each of `WL_ROUNDS` rounds relabels a vertex with the BLAKE2b digest of its label, its
inputs' labels in argument order (with which output of the producer) and the sorted multiset
of its readers' labels (with the argument slot). The key is BLAKE2b over the sorted multiset
of final labels, the vertex count and the rounds: independent of op order and value ids.
It caches what does not depend on shapes: pattern matches (nodes, roles, confidence), each
node's region (forward/backward/optimizer) and residency per value.

WL labels can agree on graphs that are not isomorphic (two triangles and a hexagon of the
same op), so a level-1 hit is confirmed exactly: the graph's canonical form must equal the one
stored with the entry. The canonical form lists the nodes in a depth-first post-order from the
graph's outputs (inputs visited in argument order; nodes no output depends on, such as
in-place writes nobody reads, visited after, smallest WL label first), values numbered in that
order, and per node its label, input numbers and output count. Equal forms are an explicit
isomorphism, which also maps the entry's node and value ids onto the graph's. A graph whose
form differs is a miss (counted as a collision) and gets its own entry.

Before hashing, two exact memos are tried: the graph's raw form (`SemGraph.structure`, labels
with its own value ids: a graph captured again from the same program) and its program-order
form (values renumbered by first use: the same program with other ids). Both are compared
whole (dict keys), so they only ever return the entry that graph's structure was confirmed for.

Level 2 (shapes): keyed by (level-1 entry, the shapes and dtypes of all values in the entry's
value order: `SemGraph.shapes` when the graph's ops are in the entry's order), compared exactly. It caches what shapes decide: costs per node, match details
(heads, sequence lengths), phases per node and of the graph.

Counters (`stats()`): hits, misses, collisions per level; latency (µs, the whole `analyze`
call, keys included) of full hits, of level-1 hits that miss level 2, and of misses.

Over 600 lines: the structure keys (WL hash, canonical form), the entries and `AnalysisCache`,
and `Annotated` with its placement groups (`to_groups`) share the private entry types: an
`Annotated` is a level-1 and a level-2 entry read through the `_Mapping` the canonical form gave.
"""
from __future__ import annotations

import hashlib
import heapq
import struct
import threading
import time
from collections import OrderedDict
from types import MappingProxyType
from typing import Sequence

from .cost import Cost, graph_costs, total as total_cost
from .phases import assign as assign_phases, regions as phase_regions
from .residency import CLASSES as RESIDENCY_CLASSES, assign as assign_residency
from .graph import PASSTHROUGH_OPS, VIEW_OPS, SemGraph, encode_shapes, label_id
from .groups import CLIENT, Edge, Group, GroupGraph
from .patterns import Match, find_matches, patterns, registry_generation

WL_ROUNDS = 3
_PACK = struct.Struct("<q")


def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


_LABELS: dict[str, int] = {}


def _label(text: str) -> int:
    """A vertex's initial WL label: 64 bits of BLAKE2b of its text (memoized)."""
    v = _LABELS.get(text)
    if v is None:
        if len(_LABELS) > 65536:
            _LABELS.clear()
        v = _LABELS[text] = _digest64(text.encode())
    return v


# ---- structure keys -------------------------------------------------------------------------------

def _input_label(graph: SemGraph, vid: int) -> str:
    v = graph.values[vid]
    return f"input:{v.kind}:{int(v.mutated)}:{len(v.shape)}"


def program_form(graph: SemGraph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(form, value order): the graph's exact structure in program order as one flat tuple of
    ints, and the value ids in the order the form numbers them (`graph.value_order`: inputs by
    first use, then node outputs). Form: input count, each input's label id, then per node its
    label id, input count, input numbers, output count; then the output numbers and the
    backward flag. Equal forms are the same graph up to value ids and sizes."""
    order = graph.value_order
    num = {vid: i for i, vid in enumerate(order)}
    form = [len(graph.inputs)]
    form.extend([label_id(_input_label(graph, v)) for v in graph.inputs])
    ext = form.extend
    for n in graph.nodes:
        ext((label_id(n.key), len(n.inputs)))
        ext([num[i] for i in n.inputs])
        form.append(len(n.outputs))
    form.append(-1)
    form.extend([num[o] for o in graph.outputs])
    form.append(int(graph.backward))
    return tuple(form), order


def _adjacency(graph: SemGraph) -> tuple[list[list[tuple[int, int, int]]], list[list[tuple[int, int, int]]], int]:
    """Vertex ids: inputs 0..I-1, node i -> I+i. In-edges (src, out index, slot) and
    out-edges (dst, slot, out index) per vertex."""
    n_in = len(graph.inputs)
    src_of: dict[int, tuple[int, int]] = {vid: (i, 0) for i, vid in enumerate(graph.inputs)}
    for n in graph.nodes:
        for k, o in enumerate(n.outputs):
            src_of[o] = (n_in + n.index, k)
    total = n_in + len(graph.nodes)
    ins: list[list[tuple[int, int, int]]] = [[] for _ in range(total)]
    outs: list[list[tuple[int, int, int]]] = [[] for _ in range(total)]
    for n in graph.nodes:
        dst = n_in + n.index
        for slot, vid in enumerate(n.inputs):
            s, k = src_of[vid]
            ins[dst].append((s, k, slot))
            outs[s].append((dst, slot, k))
    return ins, outs, n_in


def wl_labels(graph: SemGraph, rounds: int = WL_ROUNDS) -> tuple[list[int], list[list], list[list], int]:
    """Final WL labels per vertex (inputs first, then nodes), with the adjacency used."""
    ins, outs, n_in = _adjacency(graph)
    labels = [_label(_input_label(graph, v)) for v in graph.inputs]
    labels += [_label(n.key) for n in graph.nodes]
    pack = _PACK.pack
    for _ in range(rounds):
        new = []
        for v in range(len(labels)):
            parts = [pack(labels[v]), b"|"]
            parts.extend(pack(labels[s]) + bytes((k & 255, slot & 255)) for s, k, slot in ins[v])
            parts.append(b"|")
            parts.extend(sorted(pack(labels[d]) + bytes((slot & 255, k & 255)) for d, slot, k in outs[v]))
            new.append(_digest64(b"".join(parts)))
        labels = new
    return labels, ins, outs, n_in


def wl_hash(graph: SemGraph, rounds: int = WL_ROUNDS) -> str:
    """The level-1 key: hex BLAKE2b of the sorted multiset of final WL labels."""
    labels = wl_labels(graph, rounds)[0]
    return _wl_digest(labels, len(graph.inputs), rounds)


def _wl_digest(labels: list[int], n_in: int, rounds: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<3q", len(labels), n_in, rounds))
    for x in sorted(labels):
        h.update(_PACK.pack(x))
    return h.hexdigest()


def canonical_form(graph: SemGraph, labels: list[int], n_in: int) -> tuple[tuple, list[int], list[int]]:
    """(form, node order, value order): the graph in its canonical order (module docstring).

    The order is a depth-first post-order from the graph's outputs (in output order), each
    node's inputs visited in argument order: fixed by the structure, not by program order or
    value ids. Nodes no output depends on (in-place writes whose results nobody reads) are
    then visited from the one with the smallest (WL label, numbers of its inputs), program
    order breaking what still ties. Node order lists program indices; value order lists
    value ids by canonical number.
    """
    nodes = graph.nodes
    values = graph.values
    visited = [False] * len(nodes)
    num: dict[int, int] = {}
    vals: list[int] = []
    node_order: list[int] = []
    body: list[tuple] = []

    def emit(i: int) -> None:
        n = nodes[i]
        for v in n.inputs:
            if v not in num:
                num[v] = len(vals)
                vals.append(v)
        for o in n.outputs:
            num[o] = len(vals)
            vals.append(o)
        node_order.append(i)
        body.append((n.key, tuple([num[v] for v in n.inputs]), len(n.outputs)))

    def visit(root: int) -> None:
        visited[root] = True
        stack = [(root, 0)]
        while stack:
            i, k = stack[-1]
            ins = nodes[i].inputs
            if k < len(ins):
                stack[-1] = (i, k + 1)
                p = values[ins[k]].producer
                if p >= 0 and not visited[p]:
                    visited[p] = True
                    stack.append((p, 0))
            else:
                stack.pop()
                emit(i)

    for o in graph.outputs:
        p = values[o].producer
        if p >= 0 and not visited[p]:
            visit(p)
    rest = [i for i in range(len(nodes)) if not visited[i]]
    while rest:
        def key(i: int) -> tuple:
            return (labels[n_in + i], tuple(num.get(v, -1) for v in nodes[i].inputs), i)

        if len(rest) > 64:  # one ordering pass for many side-effect roots
            for i in sorted(rest, key=key):
                if not visited[i]:
                    visit(i)
        else:
            visit(min(rest, key=key))
        rest = [i for i in rest if not visited[i]]
    in_labels = []
    for vid in graph.inputs:
        if vid not in num:  # inputs no node reads
            num[vid] = len(vals)
            vals.append(vid)
    for vid in vals:
        if values[vid].producer < 0:
            in_labels.append((num[vid], _input_label(graph, vid)))
    form = (tuple(in_labels), tuple(body), tuple(num[o] for o in graph.outputs), graph.backward)
    return form, node_order, vals


def shape_key(graph: SemGraph, value_order: Sequence[int] | None) -> bytes:
    """The level-2 key part: shapes and dtypes of every value in `value_order` (`encode_shapes`);
    None: the graph's program order, its own `shapes` encoding."""
    return graph.shapes if value_order is None else encode_shapes(graph.values, value_order)


# ---- entries ----------------------------------------------------------------------------------------

def _frozen(m: Match) -> Match:
    """A match whose roles and detail cannot be changed (they are shared through the cache)."""
    return m._replace(roles=MappingProxyType(dict(m.roles)), detail=MappingProxyType(dict(m.detail)))


class _Level1:
    """A structure's analysis: matches, regions, residency (in the entry graph's ids)."""

    __slots__ = ("key", "canon", "canon_nodes", "canon_vals", "prog_vals", "matches", "regions", "residency",
                 "level2", "members")

    def __init__(self, key: str, canon: tuple, canon_nodes: list[int], canon_vals: list[int],
                 prog_vals: tuple[int, ...], matches: list[Match], regions: tuple[str, ...],
                 residency: dict[int, str]) -> None:
        self.key = key
        self.canon = canon
        self.canon_nodes = canon_nodes
        self.canon_vals = canon_vals
        self.prog_vals = prog_vals        # the entry graph's value ids in program-form order
        self.matches = matches
        self.regions = regions
        self.residency = residency
        self.level2: OrderedDict[tuple, _Level2] = OrderedDict()
        self.members: list[tuple[str, tuple[int, ...]]] | None = None


class _Level2:
    __slots__ = ("costs", "matches", "node_phases", "phase")

    def __init__(self, costs: tuple, matches: list[Match], node_phases: tuple[str, ...], phase: str) -> None:
        self.costs = costs
        self.matches = matches
        self.node_phases = node_phases
        self.phase = phase


class _Mapping:
    """Entry ids -> this graph's ids (None: the identity)."""

    __slots__ = ("nodes", "values")

    def __init__(self, nodes: dict[int, int] | None, values: dict[int, int] | None) -> None:
        self.nodes = nodes
        self.values = values

    @property
    def identity(self) -> bool:
        return self.nodes is None and self.values is None

    def node(self, i: int) -> int:
        return i if self.nodes is None else self.nodes[i]

    def value(self, v: int) -> int:
        return v if self.values is None else self.values[v]

    def match(self, m: Match) -> Match:
        if self.identity:
            return m
        return m._replace(nodes=tuple(sorted(self.node(i) for i in m.nodes)),
                          roles=MappingProxyType({k: self.value(v) for k, v in m.roles.items()}))

    def per_node(self, seq: Sequence, n: int) -> tuple:
        if self.nodes is None:
            return tuple(seq)
        out = [None] * n
        for old, new in self.nodes.items():
            out[new] = seq[old]
        return tuple(out)


class _Latency:
    """Count, mean, max and a bounded sample of latencies (µs)."""

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.max = 0.0
        self.sample: list[float] = []

    def add(self, us: float) -> None:
        self.n += 1
        self.total += us
        self.max = max(self.max, us)
        if len(self.sample) < 4096:
            self.sample.append(us)
        else:
            self.sample[self.n % 4096] = us

    def summary(self) -> dict:
        s = sorted(self.sample)
        return {"n": self.n, "mean_us": self.total / self.n if self.n else 0.0,
                "p50_us": s[len(s) // 2] if s else 0.0, "max_us": self.max}


class AnalysisCache:
    """The two-level analysis cache (module docstring). Thread-safe; bounded (LRU):
    `max_structures` level-1 entries, `max_shapes` level-2 entries per structure."""

    def __init__(self, max_structures: int = 256, max_shapes: int = 64) -> None:
        self.max_structures = max_structures
        self.max_shapes = max_shapes
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Drops every entry and zeroes the counters."""
        self._by_wl: OrderedDict[str, list[_Level1]] = OrderedDict()
        self._by_raw: OrderedDict[bytes, tuple[_Level1, _Mapping, tuple[int, ...] | None]] = OrderedDict()
        self._by_program: OrderedDict[tuple[int, ...], tuple[_Level1, _Mapping, tuple[int, ...]]] = OrderedDict()
        self._generation = registry_generation()
        self.counts = {"l1_hits": 0, "l1_misses": 0, "l1_collisions": 0, "l2_hits": 0, "l2_misses": 0}
        self.latency = {"hit": _Latency(), "l1_hit_l2_miss": _Latency(), "miss": _Latency()}

    def stats(self) -> dict:
        """Counters, hit rates and latencies (µs) per level (module docstring)."""
        c = dict(self.counts)
        l1 = c["l1_hits"] + c["l1_misses"]
        l2 = c["l2_hits"] + c["l2_misses"]
        c["l1_hit_rate"] = c["l1_hits"] / l1 if l1 else 0.0
        c["l2_hit_rate"] = c["l2_hits"] / l2 if l2 else 0.0
        c["structures"] = sum(len(v) for v in self._by_wl.values())
        c["latency"] = {k: v.summary() for k, v in self.latency.items()}
        return c

    # -- lookup ------------------------------------------------------------------------------------

    def _level1(self, graph: SemGraph) -> tuple[_Level1, _Mapping, tuple[int, ...] | None, bool]:
        """(entry, entry->graph mapping, graph's value order for the level-2 key (`_l2_order`), hit?)."""
        raw = graph.structure
        seen = self._by_raw.get(raw)
        if seen is not None:  # this very structure with these value ids was seen
            self._by_raw.move_to_end(raw)
            return seen[0], seen[1], seen[2], True
        entry, mapping, l2_order, hit = self._level1_form(graph)
        self._by_raw[raw] = (entry, mapping, l2_order)
        while len(self._by_raw) > 4 * self.max_structures:
            self._by_raw.popitem(last=False)
        return entry, mapping, l2_order, hit

    def _level1_form(self, graph: SemGraph) -> tuple[_Level1, _Mapping, tuple[int, ...] | None, bool]:
        """`_level1` without the raw-form memo: the program-order form, then WL and the canonical form."""
        form, order = program_form(graph)
        known = self._by_program.get(form)
        if known is not None:  # this exact program-order structure was seen: node i is node i
            self._by_program.move_to_end(form)
            entry, first, first_order = known
            if order == first_order:
                mapping = first
            else:
                here = dict(zip(first_order, order))  # the first graph's value ids -> this graph's
                vals = here if first.values is None else {e: here[f] for e, f in first.values.items()}
                mapping = _Mapping(first.nodes, vals)
            return entry, mapping, self._l2_order(entry, mapping), True
        labels, _, _, n_in = wl_labels(graph)
        key = _wl_digest(labels, n_in, WL_ROUNDS)
        canon, node_order, val_order = canonical_form(graph, labels, n_in)
        for entry in self._by_wl.get(key, ()):
            if entry.canon == canon:
                nodes = {old: new for old, new in zip(entry.canon_nodes, node_order)}
                vals = {old: new for old, new in zip(entry.canon_vals, val_order)}
                ident_nodes = all(k == v for k, v in nodes.items())
                ident_vals = all(k == v for k, v in vals.items())
                mapping = _Mapping(None if ident_nodes else nodes, None if ident_vals else vals)
                self._remember(form, entry, mapping, order)
                return entry, mapping, self._l2_order(entry, mapping), True
        if key in self._by_wl:
            self.counts["l1_collisions"] += 1
        entry = self._analyze_structure(graph, key, canon, node_order, val_order, order)
        self._by_wl.setdefault(key, []).append(entry)
        self._by_wl.move_to_end(key)
        while len(self._by_wl) > self.max_structures:
            self._by_wl.popitem(last=False)
        self._remember(form, entry, _Mapping(None, None), order)
        return entry, _Mapping(None, None), None, False

    def _remember(self, form: tuple, entry: _Level1, mapping: _Mapping, order: tuple[int, ...]) -> None:
        self._by_program[form] = (entry, mapping, order)
        while len(self._by_program) > 4 * self.max_structures:
            self._by_program.popitem(last=False)

    @staticmethod
    def _l2_order(entry: _Level1, mapping: _Mapping) -> tuple[int, ...] | None:
        """This graph's value ids in the entry's program-form value order; None when that is the
        graph's own program order (its ops in the entry's order)."""
        if mapping.nodes is None:
            return None
        return tuple([mapping.value(v) for v in entry.prog_vals])

    @staticmethod
    def _analyze_structure(graph: SemGraph, key: str, canon: tuple, node_order: list[int], val_order: list[int],
                           order: tuple[int, ...]) -> _Level1:
        matches = [_frozen(m) for m in find_matches(graph)]
        regions = phase_regions(graph)
        residency = assign_residency(graph, matches, regions)
        return _Level1(key, canon, node_order, val_order, order, matches, regions, residency)

    # -- analyze -----------------------------------------------------------------------------------

    def analyze(self, graph: SemGraph) -> "Annotated":
        """The annotated graph (module docstring); raises whatever a pattern raises."""
        t0 = time.perf_counter()
        with self._lock:
            if self._generation != registry_generation():
                self.clear()
            entry, mapping, l2_order, hit1 = self._level1(graph)
            self.counts["l1_hits" if hit1 else "l1_misses"] += 1
            skey = shape_key(graph, l2_order)
            l2 = entry.level2.get(skey)
            hit2 = l2 is not None
            if hit2:
                entry.level2.move_to_end(skey)
            else:
                l2 = self._analyze_shapes(graph, entry, mapping)
                entry.level2[skey] = l2
                while len(entry.level2) > self.max_shapes:
                    entry.level2.popitem(last=False)
            self.counts["l2_hits" if hit2 else "l2_misses"] += 1
            out = Annotated(graph, entry, l2, mapping)
            kind = "hit" if hit1 and hit2 else "l1_hit_l2_miss" if hit1 else "miss"
            self.latency[kind].add((time.perf_counter() - t0) * 1e6)
        return out

    @staticmethod
    def _analyze_shapes(graph: SemGraph, entry: _Level1, mapping: _Mapping) -> _Level2:
        """Costs, details and phases in the entry's ids (mapped from this graph)."""
        costs_here = graph_costs(graph)
        n = len(costs_here)
        costs = costs_here if mapping.nodes is None else tuple(costs_here[mapping.node(i)] for i in range(n))
        by_name = {p.name: p for p in patterns()}
        here = [mapping.match(m) for m in entry.matches]
        detailed_here = []
        for m in here:
            p = by_name.get(m.pattern)
            detailed_here.append(m._replace(detail=p.describe(graph, m)) if p is not None else m)
        regions_here = mapping.per_node(entry.regions, len(graph.nodes))
        node_phases_here, phase = assign_phases(graph, detailed_here, regions_here, costs_here)
        # stored in the entry's ids: details carried over to the entry's matches
        matches = [m._replace(detail=MappingProxyType(dict(d.detail))) for m, d in zip(entry.matches, detailed_here)]
        node_phases = node_phases_here if mapping.nodes is None else tuple(
            node_phases_here[mapping.node(i)] for i in range(n))
        return _Level2(costs, matches, node_phases, phase)


# ---- the result -------------------------------------------------------------------------------------

# Which pattern keeps an op that two patterns' matches share (first wins), and the merged kind.
GROUP_PRIORITY = ("conv_block", "attention", "kv_cache", "mlp", "embedding", "norm")
_CREATION_OPS = frozenset({"aten::arange", "aten::scalar_tensor", "aten::empty", "aten::zeros", "aten::ones",
                           "aten::full", "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like",
                           "aten::new_ones", "aten::new_zeros", "aten::new_empty", "aten::lift_fresh_copy"})


class Annotated:
    """A `SemGraph` with its semantics.

    `graph`; `matches` (list of `Match`, with details for this graph's shapes); `regions` (per
    node: forward/backward/optimizer); `node_phases` (per node, `phases.PHASES`); `phase` (the
    graph's); `residency` (value id -> "weight", "kv_cache", "activation" or "gradient");
    `node_costs` (per node `cost.Cost`: FLOP, bytes); `structural_hash` (the level-1 WL key, hex).
    """

    def __init__(self, graph: SemGraph, entry: _Level1, l2: _Level2, mapping: _Mapping) -> None:
        self.graph = graph
        self._entry = entry
        self._mapping = mapping
        self.structural_hash: str = entry.key
        self.phase: str = l2.phase
        n = len(graph.nodes)
        if mapping.identity:
            self.matches: list[Match] = list(l2.matches)
            self.node_costs: tuple[Cost, ...] = l2.costs
            self.node_phases: tuple[str, ...] = l2.node_phases
            self.regions: tuple[str, ...] = entry.regions
        else:
            self.matches = [mapping.match(m) for m in l2.matches]
            self.node_costs = mapping.per_node(l2.costs, n)
            self.node_phases = mapping.per_node(l2.node_phases, n)
            self.regions = mapping.per_node(entry.regions, n)
        self._residency: dict[int, str] | None = None
        self._groups: GroupGraph | None = None

    @property
    def residency(self) -> dict[int, str]:
        if self._residency is None:
            src = self._entry.residency
            if self._mapping.values is None:
                self._residency = dict(src)
            else:
                self._residency = {self._mapping.value(v): c for v, c in src.items()}
        return self._residency

    def residency_class(self, vid: int) -> int:
        """The wire class of value `vid` (`residency.CLASSES`: 0 activation, 1 weight, 2 KV cache, 3 gradient)."""
        return RESIDENCY_CLASSES[self.residency[vid]]

    def matches_of(self, pattern: str) -> list[Match]:
        return [m for m in self.matches if m.pattern == pattern]

    def count(self, pattern: str) -> int:
        return sum(1 for m in self.matches if m.pattern == pattern)

    def cost(self, nodes: Sequence[int] | None = None) -> Cost:
        """Summed `Cost` of `nodes` (all when None)."""
        return total_cost(self.node_costs, nodes)

    @property
    def shape_hash(self) -> str:
        """Hex BLAKE2b of the values' shapes and dtypes in the structure's value order."""
        order = AnalysisCache._l2_order(self._entry, self._mapping)
        return hashlib.blake2b(shape_key(self.graph, order), digest_size=16).hexdigest()

    def groups(self) -> list[tuple[str, tuple[int, ...]]]:
        """(kind, node indices) per placement group, in a topological order (see `group_members`).
        Kept with the structure's cache entry when the graph's op order is the entry's."""
        if self._mapping.nodes is not None:
            return group_members(self.graph, self.matches)
        if self._entry.members is None:
            self._entry.members = group_members(self.graph, self.matches)
        return list(self._entry.members)

    def to_groups(self) -> GroupGraph:
        """The scheduler's input (`groups.GroupGraph`); see `to_groups`."""
        if self._groups is None:
            self._groups = to_groups(self)
        return self._groups

    def summary(self) -> str:
        from .report import summary

        return summary(self)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for m in self.matches:
            counts[m.pattern] = counts.get(m.pattern, 0) + 1
        return f"Annotated({self.graph!r}, phase={self.phase}, matches={counts})"


def group_members(g: SemGraph, matches: Sequence[Match]) -> list[tuple[str, tuple[int, ...]]]:
    """Placement groups: one per pattern instance, overlaps resolved, leftovers as runs.

    1. Matches claim their ops in `GROUP_PRIORITY` order (then other patterns, then program
       order); a match whose ops are all taken (a norm inside a convolution block) makes no group.
    2. Views, copies and tensor creation ops no match took join the group of their readers when
       all of them are in one group.
    3. Remaining ops form groups of consecutive ops in program order ("ops").
    4. Groups that depend on each other both ways (a cycle) are merged (kind of the higher
       priority); groups are ordered topologically (by first op among the ready ones).
    """
    n = len(g.nodes)
    owner = [-1] * n
    kinds: list[str] = []
    prio = {k: i for i, k in enumerate(GROUP_PRIORITY)}
    for m in sorted(matches, key=lambda m: (prio.get(m.pattern, len(prio)), m.nodes)):
        free = [i for i in m.nodes if owner[i] < 0]
        if not any(g.nodes[i].base not in PASSTHROUGH_OPS for i in free):
            continue
        gid = len(kinds)
        kinds.append(m.pattern)
        for i in free:
            owner[i] = gid
    for node in reversed(g.nodes):  # step 2
        if owner[node.index] >= 0 or not (node.base in PASSTHROUGH_OPS or node.base in _CREATION_OPS):
            continue
        readers = {owner[c] for o in node.outputs for c in g.consumers(o)}
        if len(readers) == 1 and -1 not in readers:
            owner[node.index] = readers.pop()
    run = -1
    for i in range(n):  # step 3
        if owner[i] >= 0:
            run = -1
            continue
        if run < 0:
            run = len(kinds)
            kinds.append("ops")
        owner[i] = run
    return _merge_cycles(g, owner, kinds, prio)


def _merge_cycles(g: SemGraph, owner: list[int], kinds: list[str],
                  prio: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    """Step 4 of `group_members`: strongly connected groups merged (Tarjan), topological order."""
    k = len(kinds)
    succ: list[set[int]] = [set() for _ in range(k)]
    for node in g.nodes:
        a = owner[node.index]
        for o in node.outputs:
            for c in g.consumers(o):
                b = owner[c]
                if b != a:
                    succ[a].add(b)
    comp = _tarjan(succ)
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(owner):
        members.setdefault(comp[gid], []).append(i)
    comp_kind: dict[int, str] = {}
    for gid, kind in enumerate(kinds):
        c = comp[gid]
        cur = comp_kind.get(c)
        if cur is None or prio.get(kind, len(prio) + (kind == "ops")) < prio.get(cur, len(prio) + (cur == "ops")):
            comp_kind[c] = kind
    csucc: dict[int, set[int]] = {c: set() for c in members}
    indeg: dict[int, int] = {c: 0 for c in members}
    for a in range(k):
        for b in succ[a]:
            ca, cb = comp[a], comp[b]
            if ca != cb and cb not in csucc[ca]:
                csucc[ca].add(cb)
                indeg[cb] += 1
    heap = [(min(members[c]), c) for c in members if indeg[c] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, c = heapq.heappop(heap)
        out.append((comp_kind[c], tuple(members[c])))
        for d in csucc[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(heap, (min(members[d]), d))
    return out


def _tarjan(succ: list[set[int]]) -> list[int]:
    """Strongly connected component id per vertex (iterative Tarjan)."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    ncomp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = True
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, iter(succ[w])))
                    advanced = True
                    break
                if on[w]:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
    return comp


def to_groups(ann: Annotated) -> GroupGraph:
    """The placement graph of an analysed graph (`groups.GroupGraph`).

    One `Group` per entry of `ann.groups()`: its kind, phase (that of its op with the most
    FLOPs; its first op's where none has any), ops, FLOPs and bytes (sums of `ann.node_costs`),
    the weights it reads (names, dense sizes), the state it reads or writes (KV caches and
    other graph inputs the program writes: names, sizes) and the peak bytes of the
    activations it makes while it runs. Edges carry the bytes of activations and gradients
    one group makes and another reads (each value once per reader group); graph inputs that
    are not weights or state come from `CLIENT`, graph outputs go to it. Weights and state
    are not on edges: they stay where they are resident.
    """
    g = ann.graph
    members = ann.groups()
    owner = [0] * len(g.nodes)
    for gid, (_, nodes) in enumerate(members):
        for i in nodes:
            owner[i] = gid
    res = ann.residency
    outputs = set(g.outputs)
    groups = []
    for gid, (kind, nodes) in enumerate(members):
        groups.append(_make_group(ann, gid, kind, nodes, owner, res, outputs))
    edges: dict[tuple[int, int], int] = {}

    def add(a: int, b: int, nbytes: int) -> None:
        edges[(a, b)] = edges.get((a, b), 0) + nbytes

    for vid, v in g.values.items():
        cls = res.get(vid, "activation")
        if cls in ("weight", "kv_cache") or (v.producer < 0 and v.mutated):
            continue
        src = owner[v.producer] if v.producer >= 0 else CLIENT
        dsts = {owner[c] for c in g.consumers(vid)}
        if vid in outputs and src != CLIENT:
            dsts.add(CLIENT)
        for d in dsts:
            if d != src:
                add(src, d, v.nbytes)
    return GroupGraph(groups=groups, edges=[Edge(a, b, nb) for (a, b), nb in sorted(edges.items())])


def _make_group(ann: Annotated, gid: int, kind: str, nodes: tuple[int, ...], owner: list[int],
                res: dict[int, str], outputs: set[int]) -> Group:
    g = ann.graph
    c = ann.cost(nodes)
    weights: dict[str, int] = {}
    state: dict[str, int] = {}
    for i in nodes:
        for vid in g.nodes[i].inputs:
            o = _resident_root(g, vid, res)
            src = g.values[o]
            if src.producer >= 0:
                continue
            name = src.name or f"%{o}"
            if res.get(o) == "weight":
                weights.setdefault(name, src.nbytes)
            elif res.get(o) == "kv_cache" or src.mutated:
                state.setdefault(name, src.nbytes)
    best = max(nodes, key=lambda i: (ann.node_costs[i].flops, -i))
    phase = ann.node_phases[best] if ann.node_costs[best].flops > 0 else ann.node_phases[nodes[0]]
    return Group(id=gid, kind=kind, phase=phase, ops=tuple(nodes), flops=c.flops, bytes_accessed=c.bytes,
                 weights=tuple(weights), weight_bytes=sum(weights.values()), state=tuple(state),
                 state_bytes=sum(state.values()),
                 activation_bytes=_peak_activation_bytes(g, nodes, owner, res, outputs))


def _resident_root(g: SemGraph, vid: int, res: dict[int, str]) -> int:
    """The graph input a weight or state value is (a view of, or an update of): through views and
    copies, in-place writes (their written input) and a KV cache's out-of-place writes (`index_copy`,
    `slice_scatter`, `cat`: the carried input)."""
    for _ in range(64):
        o = g.origin(vid)
        p = g.values[o].producer
        if p < 0 or res.get(o) not in ("weight", "kv_cache"):
            return o
        n = g.nodes[p]
        if n.writes:
            vid = n.writes[0]
        else:
            carried = [i for i in n.inputs if res.get(g.origin(i)) == res.get(o) and i != o]
            if not carried:
                return o
            vid = carried[0]
    return vid


def _peak_activation_bytes(g: SemGraph, nodes: tuple[int, ...], owner: list[int], res: dict[int, str],
                           outputs: set[int]) -> int:
    """Peak bytes of the activations/gradients the group's ops make, freeing a value after its
    last reader in the group when no other group reads it and the program does not return it."""
    gid = owner[nodes[0]]
    last: dict[int, int] = {}
    keep: set[int] = set()
    for i in nodes:
        for o in g.nodes[i].outputs:
            readers = g.consumers(o)
            if o in outputs or any(owner[r] != gid for r in readers):
                keep.add(o)
            last[o] = max(readers) if readers else i
    live = peak = 0
    frees: dict[int, int] = {}
    for i in nodes:
        node = g.nodes[i]
        if node.base not in VIEW_OPS and not node.writes:
            for o in node.outputs:
                if res.get(o, "activation") in ("activation", "gradient"):
                    nb = g.values[o].nbytes
                    live += nb
                    if o not in keep:
                        frees[last[o]] = frees.get(last[o], 0) + nb
        peak = max(peak, live)
        live -= frees.pop(i, 0)
    return peak


# ---- module-level cache -------------------------------------------------------------------------------

_DEFAULT = AnalysisCache()


def default_cache() -> AnalysisCache:
    """The process-wide cache `analyze` uses by default."""
    return _DEFAULT


def analyze(graph: SemGraph, *, cache: AnalysisCache | None = None) -> Annotated:
    """Patterns, phases, residency and costs of `graph`, through `cache` (default: the process-wide one)."""
    return (cache or _DEFAULT).analyze(graph)


def cache_stats() -> dict:
    """`AnalysisCache.stats()` of the process-wide cache."""
    return _DEFAULT.stats()


def clear_cache() -> None:
    _DEFAULT.clear()
