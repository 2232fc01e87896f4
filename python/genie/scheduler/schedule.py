"""The execution schedule (seed 000 §5.2) and the cost model's evaluation of a placement.

`evaluate(graph, cluster, placement)` turns a placement {group id: node name} into an
`ExecutionSchedule`: the stages, the transfers, which node keeps which weights and state, and
the predicted time of one run. Every placement algorithm (genie.scheduler.placement and the
baselines) is judged by this one function, so their `estimated_s` compare.

The run is simulated as list scheduling without contention on links: groups start in
`order` (a topological order); a group starts when its node is free and its inputs have
arrived; an input from another end arrives `latency_s + nbytes / bytes_per_s` after its
producer finished (Hockney; inputs from the client are there at time 0 plus their transfer);
a group runs for its roofline time (genie.scheduler.cluster.compute_s).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..semantics.groups import CLIENT, Edge, GroupGraph
from .cluster import CLIENT_NAME, Cluster, compute_s

STRATEGIES = ("sequential", "pipeline", "parallel")
GOALS = ("latency", "throughput")


@dataclass(frozen=True)
class PlacedGroup:
    """Group `group` runs on node `node`; `strategy` is its stage's ("sequential": the stage
    is one node's run of groups; "parallel": the stage's groups run on several nodes at once;
    "pipeline": stages overlap across successive runs)."""

    group: int
    node: str
    strategy: str


@dataclass(frozen=True)
class Transfer:
    """`nbytes` (B) moved from `src_node` to `dst_node` ("client" for the program's process),
    estimated to take `seconds` (s).

    `edge`: the graph edge it carries (None for a state transfer between two schedules).
    `kind`: "input" (client to node), "output" (node to client), "activation" (node to node)
    or "kv_cache" (a state tensor moving between nodes; `name` is the state's name).
    Node-to-node transfers go directly between the two nodes, never through the client.
    """

    edge: Edge | None
    src_node: str
    dst_node: str
    nbytes: int
    seconds: float
    kind: str
    name: str | None = None


@dataclass
class ExecutionSchedule:
    """Where each group runs, in which stages, what moves, what stays (units: s, B).

    `goal`: "latency" or "throughput". `algorithm`: what produced it.
    `stages`: lists of `PlacedGroup`; stage k's groups depend only on stages <= k (topological
    levels, consecutive levels on one same node merged).
    `placement`: {group id: node name}. `transfers`: every edge whose two ends differ.
    `residency`: {node: names of the weights and state it must keep}.
    `resident_bytes`: {node: bytes of those names not resident there before}.
    `memory_bytes`: {node: bytes the schedule needs there: `resident_bytes` plus the largest
    activation of its groups (they run one after another; a group's transients are freed
    when its consumers have run, its outputs to other ends travel as `transfers`)}.
    `estimated_s`: predicted wall time of one run of the graph (the latency objective).
    `period_s`: predicted time between successive runs when runs are pipelined: the busiest
    node's compute or the busiest directed link's bytes / bandwidth (the throughput
    objective). `order`: the groups in the order the estimate ran them.
    `start_s` / `finish_s`: {group id: predicted start / finish time of one run}.
    """

    goal: str
    algorithm: str
    stages: list[list[PlacedGroup]]
    placement: dict[int, str]
    transfers: list[Transfer]
    residency: dict[str, frozenset[str]]
    resident_bytes: dict[str, int]
    memory_bytes: dict[str, int]
    estimated_s: float
    period_s: float
    order: list[int] = field(default_factory=list)
    start_s: dict[int, float] = field(default_factory=dict)
    finish_s: dict[int, float] = field(default_factory=dict)

    def nodes(self) -> list[str]:
        """The nodes the schedule uses, in order of first use."""
        return list(dict.fromkeys(self.placement[g] for g in self.order))

    def objective(self) -> float:
        """The value its goal minimises: `estimated_s` (latency) or `period_s` (throughput)."""
        return self.period_s if self.goal == "throughput" else self.estimated_s

    def explain(self, max_transfers: int = 20) -> str:
        """Readable text: the estimate, each stage, the transfers and the residency."""
        lines = [f"{self.algorithm} schedule for {self.goal}: {len(self.placement)} groups on "
                 f"{len(self.nodes())} node(s) in {len(self.stages)} stage(s); one run {_ms(self.estimated_s)}, "
                 f"pipelined period {_ms(self.period_s)}"]
        for k, stage in enumerate(self.stages):
            by_node: dict[str, list[int]] = {}
            for pg in stage:
                by_node.setdefault(pg.node, []).append(pg.group)
            parts = [f"{node}: groups {_ranges(gids)}" for node, gids in by_node.items()]
            lines.append(f"  stage {k} [{stage[0].strategy}] " + "; ".join(parts))
        moved = [t for t in self.transfers if t.kind in ("activation", "kv_cache")]
        lines.append(f"  transfers: {len(self.transfers)} ({len(moved)} node to node)")
        for t in self.transfers[:max_transfers]:
            what = t.name if t.name else (f"{_end(t.edge.src)} -> {_end(t.edge.dst)}" if t.edge else "")
            lines.append(f"    {t.kind} {what}: {t.src_node} -> {t.dst_node}, {_bytes(t.nbytes)} ({_ms(t.seconds)})")
        if len(self.transfers) > max_transfers:
            lines.append(f"    ... and {len(self.transfers) - max_transfers} more")
        for node, names in self.residency.items():
            lines.append(f"  {node} keeps {len(names)} weight/state tensor(s), "
                         f"{_bytes(self.resident_bytes[node])} new; needs {_bytes(self.memory_bytes[node])}")
        return "\n".join(lines)


@dataclass
class DisaggregatedSchedule:
    """A prefill graph and a decode graph of one model on their own nodes (units: s, B).

    `prefill` / `decode`: each phase's `ExecutionSchedule` (one node each).
    `kv_transfers`: one "kv_cache" `Transfer` per cache the decode reads and the prefill
    wrote, from the prefill node directly to the decode node, after the prefill (empty when
    both phases share a node). `decode_steps`: decode runs counted in `estimated_s`, the
    predicted time of the prefill, the cache transfers (one after another) and the steps.
    """

    prefill: ExecutionSchedule
    decode: ExecutionSchedule
    kv_transfers: list[Transfer]
    decode_steps: int
    estimated_s: float

    @property
    def prefill_node(self) -> str:
        return self.prefill.nodes()[0]

    @property
    def decode_node(self) -> str:
        return self.decode.nodes()[0]

    def explain(self) -> str:
        kv = sum(t.nbytes for t in self.kv_transfers)
        kv_s = sum(t.seconds for t in self.kv_transfers)
        return "\n".join([
            f"disaggregated: prefill on {self.prefill_node} ({_ms(self.prefill.estimated_s)}), "
            f"{len(self.kv_transfers)} KV cache transfer(s) {self.prefill_node} -> {self.decode_node} "
            f"({_bytes(kv)}, {_ms(kv_s)}), decode on {self.decode_node} ({_ms(self.decode.estimated_s)} per step); "
            f"{self.decode_steps} step(s) predicted {_ms(self.estimated_s)}",
            self.prefill.explain(), self.decode.explain()])


@dataclass(frozen=True)
class GraphInfo:
    """What is derived once from a graph (`analyse`): each group's in- and out-edges
    (`adjacency`), its weight and state names (`group_names`), each name's bytes
    (`name_sizes`)."""

    ins: list[list[Edge]]
    outs: list[list[Edge]]
    names: list[tuple[str, ...]]
    sizes: dict[str, int]


def analyse(graph: GroupGraph) -> GraphInfo:
    """The graph's `GraphInfo`. Raises ValueError as `adjacency` does."""
    ins, outs = adjacency(graph)
    return GraphInfo(ins, outs, [group_names(g) for g in graph.groups], name_sizes(graph))


def name_sizes(graph: GroupGraph) -> dict[str, int]:
    """Bytes of each weight and state name (B).

    A group lists its names and their total size only. A name read alone by some group gets
    that group's size; the names of a group that reads several share what the known ones
    leave of its total equally. A name read by several groups gets the largest of its
    estimates.
    """
    exact: dict[str, int] = {}
    for names, total in _name_lists(graph):
        if len(names) == 1:
            exact[names[0]] = max(exact.get(names[0], 0), total)
    sizes = dict(exact)
    for names, total in _name_lists(graph):
        unknown = [n for n in names if n not in exact]
        if len(names) > 1 and unknown:
            share = max(0, total - sum(exact[n] for n in names if n in exact)) // len(unknown)
            for n in unknown:
                sizes[n] = max(sizes.get(n, 0), share)
    return sizes


def _name_lists(graph: GroupGraph):
    for g in graph.groups:
        for names, total in ((g.weights, g.weight_bytes), (g.state, g.state_bytes)):
            if names:
                yield tuple(dict.fromkeys(names)), total


def group_names(group) -> tuple[str, ...]:
    """The weight and state names a group reads, each once."""
    return tuple(dict.fromkeys(group.weights + group.state))


def adjacency(graph: GroupGraph) -> tuple[list[list[Edge]], list[list[Edge]]]:
    """(in-edges, out-edges) of each group; client edges included on their group's side.
    Raises ValueError when a group's id is not its index, an edge names an unknown group or
    goes from a later group to an earlier one."""
    n = len(graph.groups)
    for i, g in enumerate(graph.groups):
        if g.id != i:
            raise ValueError(f"group at index {i} has id {g.id}: ids must be the indices")
    ins: list[list[Edge]] = [[] for _ in range(n)]
    outs: list[list[Edge]] = [[] for _ in range(n)]
    for e in graph.edges:
        for end in (e.src, e.dst):
            if end != CLIENT and not 0 <= end < n:
                raise ValueError(f"edge {e} names an unknown group")
        if e.dst != CLIENT:
            ins[e.dst].append(e)
        if e.src != CLIENT:
            outs[e.src].append(e)
        if CLIENT not in (e.src, e.dst) and e.src >= e.dst:
            raise ValueError(f"edge {e} goes backwards: groups must be in a topological order")
    return ins, outs


def evaluate(graph: GroupGraph, cluster: Cluster, placement: dict[int, str], *, order: list[int] | None = None,
             goal: str = "latency", algorithm: str = "given", info: GraphInfo | None = None) -> ExecutionSchedule:
    """The `ExecutionSchedule` of `placement` and its cost-model estimates (see the module).

    `order`: a topological order of the groups to run them in (default: the graph's).
    `info`: `analyse(graph)`, when the caller has it already.
    Raises ValueError for an unknown goal, a group without a node or an unknown node name,
    KeyError for a node not in `cluster`. Does not check memory or co-location
    (genie.scheduler.placement.check_schedule does).
    """
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r} is not one of {GOALS}")
    n = len(graph.groups)
    order = list(range(n)) if order is None else list(order)
    if sorted(order) != list(range(n)) or set(placement) != set(range(n)):
        raise ValueError("order and placement must cover every group exactly once")
    info = info or analyse(graph)
    ins = info.ins
    start, finish, transfers = _simulate(graph, cluster, placement, order, ins)
    outputs = _output_transfers(graph, cluster, placement)
    transfers += outputs
    estimated = max(list(finish.values()) + [finish[t.edge.src] + t.seconds for t in outputs], default=0.0)
    residency, new_bytes, memory = _memory(graph, cluster, placement, info)
    return ExecutionSchedule(
        goal=goal, algorithm=algorithm, stages=_stages(graph, placement, order, ins, goal),
        placement=dict(placement), transfers=transfers, residency=residency, resident_bytes=new_bytes,
        memory_bytes=memory, estimated_s=estimated, period_s=_period(graph, cluster, placement, transfers),
        order=order, start_s=start, finish_s=finish)


def _simulate(graph, cluster, placement, order, ins):
    free_at: dict[str, float] = {}
    start: dict[int, float] = {}
    finish: dict[int, float] = {}
    transfers: list[Transfer] = []
    for gid in order:
        node = placement[gid]
        ready = 0.0
        for e in ins[gid]:
            src_node = CLIENT_NAME if e.src == CLIENT else placement[e.src]
            if e.src != CLIENT and e.src not in finish:
                raise ValueError(f"order runs group {gid} before its input group {e.src}")
            produced = 0.0 if e.src == CLIENT else finish[e.src]
            moved = cluster.transfer_s(src_node, node, e.nbytes)
            if src_node != node:
                kind = "input" if e.src == CLIENT else "activation"
                transfers.append(Transfer(e, src_node, node, e.nbytes, moved, kind))
            ready = max(ready, produced + moved)
        start[gid] = max(free_at.get(node, 0.0), ready)
        finish[gid] = start[gid] + compute_s(graph.groups[gid], cluster.node(node))
        free_at[node] = finish[gid]
    return start, finish, transfers


def _output_transfers(graph, cluster, placement) -> list[Transfer]:
    """A transfer for each edge to the client, in the graph's edge order."""
    return [Transfer(e, placement[e.src], CLIENT_NAME, e.nbytes,
                     cluster.transfer_s(placement[e.src], CLIENT_NAME, e.nbytes), "output")
            for e in graph.edges if e.dst == CLIENT and e.src != CLIENT]


def _memory(graph, cluster, placement, info: GraphInfo):
    sizes = info.sizes
    names_on: dict[str, set[str]] = {}
    activations: Counter = Counter()
    for gid, node in placement.items():
        names_on.setdefault(node, set()).update(info.names[gid])
        activations[node] = max(activations[node], graph.groups[gid].activation_bytes)
    residency, new_bytes, memory = {}, {}, {}
    for node, names in names_on.items():
        already = cluster.node(node).resident
        residency[node] = frozenset(names)
        new_bytes[node] = sum(sizes.get(x, 0) for x in names if x not in already)
        memory[node] = new_bytes[node] + activations[node]
    return residency, new_bytes, memory


def _period(graph, cluster, placement, transfers) -> float:
    busy: Counter = Counter()
    for gid, node in placement.items():
        busy[node] += compute_s(graph.groups[gid], cluster.node(node))
    for t in transfers:
        busy[(t.src_node, t.dst_node)] += t.nbytes / cluster.link(t.src_node, t.dst_node).bytes_per_s
    return max(busy.values(), default=0.0)


def _stages(graph, placement, order, ins, goal) -> list[list[PlacedGroup]]:
    """Topological levels (seed 000 §5.5: a level's groups are ready together), consecutive
    levels merged while they all run on the same single node."""
    level: dict[int, int] = {}
    for gid in order:
        level[gid] = max((level[e.src] + 1 for e in ins[gid] if e.src != CLIENT), default=0)
    levels: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for gid in order:
        levels[level[gid]].append(gid)
    merged: list[list[int]] = []
    last_nodes: set[str] = set()
    for gids in levels:
        nodes = {placement[g] for g in gids}
        if merged and len(nodes) == 1 and last_nodes == nodes:
            merged[-1].extend(gids)
        else:
            merged.append(gids)
            last_nodes = nodes
    result = []
    for gids in merged:
        if goal == "throughput":
            strategy = "pipeline"
        else:
            strategy = "parallel" if len({placement[g] for g in gids}) > 1 else "sequential"
        result.append([PlacedGroup(g, placement[g], strategy) for g in gids])
    return result


def _end(gid: int) -> str:
    return "client" if gid == CLIENT else f"group {gid}"


def _ranges(gids: list[int]) -> str:
    spans, first, last = [], None, None
    for g in sorted(gids):
        if last is not None and g == last + 1:
            last = g
            continue
        if first is not None:
            spans.append(f"{first}" if first == last else f"{first}-{last}")
        first = last = g
    if first is not None:
        spans.append(f"{first}" if first == last else f"{first}-{last}")
    return ", ".join(spans)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
