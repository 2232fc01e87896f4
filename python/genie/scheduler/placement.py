"""Placement: which node runs each group of a GroupGraph (docs/scheduler.md).

Constraints, for every algorithm here and in genie.scheduler.baselines:

- co-location: groups that read a common weight or state name form one *component* and run
  on one node (union-find over the names); so a KV cache stays with its attention and a
  tied embedding with its head; no weight is ever placed on two nodes;
- residency: a component reading a name already resident on a node runs on that node
  (weights are never moved once resident); names resident there cost no new memory;
- pinned: `pinned` {group id: node} fixes its component's node;
- memory: a node's `memory_free` must hold the new weights and state placed there plus the
  largest activation of the groups placed there (genie.scheduler.schedule.evaluate's
  `memory_bytes`: groups on one node run one after another and free their transients).

Objectives, from the cost model of genie.scheduler.schedule.evaluate (roofline compute,
Hockney transfers): "latency" minimises the predicted time of one run (the DAG's makespan);
"throughput" minimises the period of pipelined runs (the busiest node's compute or the
busiest link's bytes / bandwidth).

Algorithms. `schedule` runs both of these and keeps the schedule with the better objective
(ties: the first made for the goal: HEFT for latency, the partition for throughput):

1. HEFT list scheduling (H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-effective and
   low-complexity task scheduling for heterogeneous computing", IEEE TPDS 13(3), 2002):
   groups in decreasing upward rank (mean compute plus the longest mean path to the end),
   each to the node with the earliest finish time (non-insertion variant). Adapted to the
   constraints: a component's node is chosen when its first group is, among the nodes with
   room for the whole component, by that group's finish time plus the roofline time of the
   component's other groups there plus the longest transfer of its results to the client
   (the client is HEFT's exit task); its later groups follow it. HEFT suits the latency
   goal: it minimises each group's finish on heterogeneous nodes and links. It costs
   O(groups x nodes); the finish times on all nodes are computed at once with numpy, so no
   candidate pruning is needed at 1,000 nodes.
2. Contiguous pipeline partition (the linear-partitioning bottleneck problem, as PipeDream
   splits a layer sequence into stages: D. Narayanan et al., "PipeDream: generalized
   pipeline parallelism for DNN training", SOSP 2019): the groups in topological order are
   cut into consecutive stages, one per node, nodes taken in a given order; a binary search
   (to 1 %) on the bottleneck T finds the smallest T for which a greedy pass (each stage takes
   groups while its compute stays <= T and its memory fits) places everything with no link
   carrying more than T per run. Three node orders are tried, the best kept: by the
   graph's total roofline time on each node; by its time alone there with its client
   transfers (a node with a slow client link is a poor first or last stage); and a chain
   in which consecutive nodes have fast links (`_linked_order`). For a model larger than
   one node's memory this is the split by cost that the throughput goal needs; weights are
   never duplicated because components are placed whole. For the latency goal no T is
   searched: each node takes all it can hold (fewest stages and transfers). It costs
   O((groups + nodes) x log(1/precision)) per order.

Both are heuristics: HEFT is greedy (a cheap component placed first can take the memory a
heavier one needed), the partition keeps stages contiguous.

`schedule_disaggregated` places a prefill and a decode graph of one model on two nodes
(policy in its docstring). `apply_schedule` returns the cluster after a schedule's weights
and state are resident, so that a second client's graph can be placed around the first.

Over 600 lines: the two algorithms, the disaggregated placement and the checks share one
`Problem` (components, forced nodes, pins), its `CostArrays` and `NodeMemory`, which are the
constraints above; each algorithm alone is a page.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from ..semantics.groups import CLIENT, GroupGraph
from .cluster import CLIENT_NAME, Cluster
from .schedule import (GOALS, DisaggregatedSchedule, ExecutionSchedule, GraphInfo, Transfer, analyse, evaluate,
                       group_names, name_sizes)


class PlacementError(RuntimeError):
    """No placement satisfies the constraints (memory, co-location, residency, pins)."""


@dataclass
class Problem:
    """A graph's constraints on a cluster, shared by the placement algorithms.

    `comp_of[g]`: the component of group g. `members[c]`: its groups, ascending.
    `persist[c]`: bytes of its weights and state new to its node. `act[c]`: the largest
    activation of its groups (B); `need(c)`: the two together, what it needs on an empty node.
    `forced[c]`: the node index it must run on (pin or residency), or None.
    `ins` / `outs`: each group's in- and out-edges. `free`: each node's memory_free (B).
    `info`: what genie.scheduler.schedule.analyse derived from the graph.
    """

    graph: GroupGraph
    cluster: Cluster
    comp_of: list[int]
    members: list[list[int]]
    persist: list[int]
    act: list[int]
    forced: list[int | None]
    ins: list
    outs: list
    free: list[int]
    info: GraphInfo

    def need(self, c: int) -> int:
        return self.persist[c] + self.act[c]


def prepare(graph: GroupGraph, cluster: Cluster, pinned: dict[int, str] | None = None) -> Problem:
    """Components, their memory and their forced nodes.

    Raises ValueError for an unknown group or node in `pinned`, or an empty cluster;
    PlacementError when a component's pins or resident names disagree about its node, or it
    fits on no node even with nothing else placed.
    """
    if not cluster.nodes:
        raise ValueError("the cluster has no nodes")
    info = analyse(graph)
    comp_of, members = _components(graph)
    sizes = info.sizes
    _check_pins(graph, cluster, pinned or {})
    resident_on: dict[str, set[int]] = {}
    for i, node in enumerate(cluster.nodes):
        for name in node.resident:
            resident_on.setdefault(name, set()).add(i)
    forced = [_forced_node(graph, cluster, m, pinned or {}, resident_on) for m in members]
    persist, act = [], []
    for c, m in enumerate(members):
        resident = cluster.nodes[forced[c]].resident if forced[c] is not None else frozenset()
        names = {x for g in m for x in info.names[g]}
        persist.append(sum(sizes.get(x, 0) for x in names if x not in resident))
        act.append(max(graph.groups[g].activation_bytes for g in m))
    problem = Problem(graph, cluster, comp_of, members, persist, act, forced, info.ins, info.outs,
                      [n.memory_free for n in cluster.nodes], info)
    for c in range(len(members)):
        _check_fits_somewhere(problem, c)
    return problem


def _components(graph: GroupGraph) -> tuple[list[int], list[list[int]]]:
    """(component of each group, groups of each component): union-find over shared names;
    components numbered in the order of their first group."""
    parent = list(range(len(graph.groups)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_reader: dict[str, int] = {}
    for g in graph.groups:
        for name in group_names(g):
            other = first_reader.setdefault(name, g.id)
            a, b = root(other), root(g.id)
            if a != b:
                parent[max(a, b)] = min(a, b)
    comp_index: dict[int, int] = {}
    comp_of, members = [], []
    for g in range(len(graph.groups)):
        r = root(g)
        if r not in comp_index:
            comp_index[r] = len(members)
            members.append([])
        comp_of.append(comp_index[r])
        members[comp_index[r]].append(g)
    return comp_of, members


def _forced_node(graph, cluster, member_ids, pinned, resident_on) -> int | None:
    """The node a component must use: where its pins and its resident names agree."""
    reasons: list[tuple[str, set[int]]] = []
    for g in member_ids:
        if g in pinned:
            reasons.append((f"group {g} pinned to {pinned[g]!r}", {_node_index(cluster, pinned[g])}))
        for name in group_names(graph.groups[g]):
            where = resident_on.get(name)
            if where:
                reasons.append((f"{name!r} resident on {sorted(cluster.nodes[i].name for i in where)}", where))
    if not reasons:
        return None
    allowed = set.intersection(*(w for _, w in reasons))
    if not allowed:
        raise PlacementError(f"group {member_ids[0]} and the groups sharing its weights/state cannot run on one "
                             f"node: " + "; ".join(r for r, _ in reasons))
    return min(allowed)


def _node_index(cluster: Cluster, name: str) -> int:
    try:
        return cluster.index(name)
    except KeyError:
        raise ValueError(f"pinned to unknown node {name!r}") from None


def _check_pins(graph, cluster, pinned):
    for g, node in pinned.items():
        if not 0 <= g < len(graph.groups):
            raise ValueError(f"pinned names unknown group {g}")
        _node_index(cluster, node)


def _check_fits_somewhere(problem: Problem, c: int):
    cluster, need = problem.cluster, problem.need(c)
    where = [problem.forced[c]] if problem.forced[c] is not None else range(len(cluster.nodes))
    if any(need <= problem.free[i] for i in where):
        return
    raise PlacementError(no_room_message(problem, c, problem.free, "fits on no node"))


class NodeMemory:
    """What is placed on each node so far: new persistent bytes and the largest activation (B)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.free = list(problem.free)
        self.persist = [0] * len(self.free)
        self.peak = [0] * len(self.free)
        self._arrays = None  # numpy copies for `fits`, made on first use

    def fits(self, c: int) -> np.ndarray:
        """Whether component c fits on each node."""
        if self._arrays is None:
            self._arrays = tuple(np.array(x, dtype=np.float64) for x in (self.free, self.persist, self.peak))
        free, persist, peak = self._arrays
        p = self.problem
        return persist + p.persist[c] + np.maximum(peak, p.act[c]) <= free

    def fits_on(self, c: int, n: int) -> bool:
        p = self.problem
        return self.persist[n] + p.persist[c] + max(self.peak[n], p.act[c]) <= self.free[n]

    def take(self, c: int, n: int) -> None:
        self.persist[n] += self.problem.persist[c]
        self.peak[n] = max(self.peak[n], self.problem.act[c])
        if self._arrays is not None:
            self._arrays[1][n], self._arrays[2][n] = self.persist[n], self.peak[n]

    def left(self) -> list[int]:
        """Free bytes left on each node."""
        return [f - a - b for f, a, b in zip(self.free, self.persist, self.peak)]


def no_room_message(problem: Problem, c: int, free, what: str) -> str:
    """The PlacementError text: the group, the bytes it needs, the largest free memory."""
    g = problem.members[c][0]
    group = problem.graph.groups[g]
    free = free.left() if isinstance(free, NodeMemory) else list(free)
    best = max(range(len(free)), key=lambda i: (free[i], -i))
    others = len(problem.members[c]) - 1
    shared = f" with the {others} group(s) sharing its weights/state" if others else ""
    where = ""
    if problem.forced[c] is not None:
        node = problem.cluster.nodes[problem.forced[c]]
        where = f"; it must run on {node.name!r} (pinned or resident), which has {int(free[problem.forced[c]])} B free"
    return (f"group {g} ({group.kind}, {group.phase}) {what}: it needs {problem.need(c)} B{shared}{where}; "
            f"the largest free memory is {int(free[best])} B on {problem.cluster.nodes[best].name!r}")


class CostArrays:
    """The cost model over all nodes at once, as numpy arrays (s, B/s).

    `W[g, n]`: roofline time of group g on node n. `row(m)`: (latency, bandwidth) from node
    m to every node, by the rules of Cluster.link. `client_lat` / `client_bw`: the client
    links. Memory: groups x nodes x 8 B for W.
    """

    def __init__(self, graph: GroupGraph, cluster: Cluster):
        nodes = cluster.nodes
        self.flops = np.array([n.flops_per_s for n in nodes], dtype=np.float64)
        self.bw = np.array([n.bytes_per_s for n in nodes], dtype=np.float64)
        f = np.array([g.flops for g in graph.groups], dtype=np.float64)
        b = np.array([g.bytes_accessed for g in graph.groups], dtype=np.float64)
        self.W = np.maximum(f[:, None] / self.flops[None, :], b[:, None] / self.bw[None, :])
        client = [cluster.link(CLIENT_NAME, n.name) for n in nodes]
        self.client_lat = np.array([lk.latency_s for lk in client], dtype=np.float64)
        self.client_bw = np.array([lk.bytes_per_s for lk in client], dtype=np.float64)
        self._listed: dict[int, list[tuple[int, float, float]]] = {}
        for lk in cluster.links:
            if CLIENT_NAME not in (lk.a, lk.b):
                i, j = cluster.index(lk.a), cluster.index(lk.b)
                self._listed.setdefault(i, []).append((j, lk.latency_s, lk.bytes_per_s))
                self._listed.setdefault(j, []).append((i, lk.latency_s, lk.bytes_per_s))
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def row(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(latency (s), bandwidth (B/s)) from node m to each node (kept for reuse)."""
        if m not in self._rows:
            self._rows[m] = self.link_arrays(m)
        return self._rows[m]

    def link_arrays(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """`row(m)`, computed anew (not kept)."""
        lat = np.maximum(self.client_lat[m], self.client_lat)
        bw = np.minimum(self.client_bw[m], self.client_bw)
        for j, lt, bj in self._listed.get(m, ()):
            lat[j], bw[j] = lt, bj
        return lat, bw

    def arrival(self, m: int, nbytes: int) -> np.ndarray:
        """Seconds for `nbytes` from node m (-1: the client) to each node; 0 to m itself."""
        if m < 0:
            return self.client_lat + nbytes / self.client_bw
        lat, bw = self.row(m)
        t = lat + nbytes / bw
        t[m] = 0.0
        return t


def schedule(graph: GroupGraph, cluster: Cluster, goal: str = "latency",
             pinned: dict[int, str] | None = None) -> ExecutionSchedule:
    """Place `graph` on `cluster` for `goal` ("latency" or "throughput"); see the module.

    `pinned`: {group id: node name} that must be kept. Deterministic for a given input.
    Raises ValueError for an unknown goal, group or node; PlacementError (naming the group,
    the bytes it needs and the largest free memory) when no placement satisfies the
    constraints.
    """
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r} is not one of {GOALS}")
    problem = prepare(graph, cluster, pinned)
    if not graph.groups:
        return evaluate(graph, cluster, {}, goal=goal, algorithm="empty")
    costs = CostArrays(graph, cluster)
    makers = [heft, pipeline_partition] if goal == "latency" else [pipeline_partition, heft]
    found, errors = [], []
    for make in makers:
        try:
            found.append(make(problem, costs, goal))
        except PlacementError as e:
            errors.append(e)
    if not found:
        raise errors[0]
    return min(found, key=lambda s: s.objective())  # min keeps the first of equals


def heft(problem: Problem, costs: CostArrays, goal: str = "latency") -> ExecutionSchedule:
    """HEFT with the co-location, residency, pin and memory constraints (module docstring).
    Raises PlacementError when a component has no node with room left."""
    graph, n_nodes = problem.graph, len(problem.cluster.nodes)
    rank = _upward_rank(problem, costs)
    waiting = [sum(1 for e in ins if e.src != CLIENT) for ins in problem.ins]
    ready = [(-rank[g], g) for g in range(len(graph.groups)) if waiting[g] == 0]
    heapq.heapify(ready)
    free_at = np.zeros(n_nodes)
    memory = NodeMemory(problem)
    comp_node: dict[int, int] = {}
    node_of: list[int] = [-1] * len(graph.groups)
    finish: list[float] = [0.0] * len(graph.groups)
    order: list[int] = []
    while ready:
        _, g = heapq.heappop(ready)
        eft = np.maximum(free_at, _ready_times(problem, costs, g, node_of, finish)) + costs.W[g]
        c = problem.comp_of[g]
        if c not in comp_node:
            comp_node[c] = _choose_node(problem, costs, c, g, eft, memory)
            memory.take(c, comp_node[c])
        n = comp_node[c]
        node_of[g], finish[g] = n, float(eft[n])
        free_at[n] = finish[g]
        order.append(g)
        for e in problem.outs[g]:
            if e.dst != CLIENT:
                waiting[e.dst] -= 1
                if waiting[e.dst] == 0:
                    heapq.heappush(ready, (-rank[e.dst], e.dst))
    names = [nd.name for nd in problem.cluster.nodes]
    placement = {g: names[node_of[g]] for g in range(len(graph.groups))}
    return evaluate(graph, problem.cluster, placement, order=order, goal=goal, algorithm="heft", info=problem.info)


def _upward_rank(problem: Problem, costs: CostArrays) -> list[float]:
    """HEFT's rank_u: mean compute time over the nodes plus the largest (mean transfer +
    rank) over the successors; mean transfer from the mean client-link latency and bandwidth."""
    mean_w = costs.W.mean(axis=1).tolist()
    lat, bw = float(costs.client_lat.mean()), float(costs.client_bw.mean())
    rank = [0.0] * len(mean_w)
    for g in range(len(mean_w) - 1, -1, -1):
        tail = max((lat + e.nbytes / bw + rank[e.dst] for e in problem.outs[g] if e.dst != CLIENT), default=0.0)
        rank[g] = mean_w[g] + tail
    return rank


def _ready_times(problem, costs, g, node_of, finish) -> np.ndarray:
    """When all inputs of group g could be on each node (s)."""
    ready = np.zeros(len(problem.cluster.nodes))
    for e in problem.ins[g]:
        if e.src == CLIENT:
            np.maximum(ready, costs.arrival(-1, e.nbytes), out=ready)
        else:
            np.maximum(ready, finish[e.src] + costs.arrival(node_of[e.src], e.nbytes), out=ready)
    return ready


def _choose_node(problem, costs, c, g, eft, memory: NodeMemory) -> int:
    """The node for component c, decided at its first group g: the smallest earliest finish
    of g plus the compute of the component's other groups plus the longest of its
    transfers to the client, among nodes with room for all of it."""
    forced = problem.forced[c]
    if forced is not None:
        if not memory.fits_on(c, forced):
            raise PlacementError(no_room_message(problem, c, memory, "has no room left where it must run"))
        return forced
    score = eft
    others = [m for m in problem.members[c] if m != g]
    if others:
        score = score + costs.W[others].sum(axis=0)
    to_client = [e.nbytes for m in problem.members[c] for e in problem.outs[m] if e.dst == CLIENT]
    if to_client:
        score = score + costs.arrival(-1, max(to_client))
    score = np.where(memory.fits(c), score, np.inf)
    best = int(np.argmin(score))
    if not math.isfinite(score[best]):
        raise PlacementError(no_room_message(problem, c, memory, "has no node with room left"))
    return best


def pipeline_partition(problem: Problem, costs: CostArrays, goal: str = "throughput") -> ExecutionSchedule:
    """Contiguous stages by a binary search on the bottleneck (module docstring), over three
    node orders; the best result by the goal's objective.
    Raises PlacementError when even an unbounded bottleneck leaves a component without room."""
    found, errors = [], []
    orders = _node_orders(problem, costs, goal)
    for k in range(3):
        if k == 2:
            if not found:
                break
            orders.append(_linked_order(problem, costs, orders[0], stages=2 * len(found[0].nodes())))
        if any(orders[k] == other for other in orders[:k]):
            continue
        try:
            found.append(_partition(problem, costs, goal, orders[k]))
        except PlacementError as e:
            errors.append(e)
    if not found:
        raise errors[0]
    return min(found, key=lambda sched: sched.objective())


def _node_orders(problem: Problem, costs: CostArrays, goal: str) -> list[list[int]]:
    """Nodes by the graph's total compute on each, and by its time alone on each with its
    client transfers (one run for "latency"; the longer of compute and client-link
    occupancy per run for "throughput"); ties by index."""
    compute = costs.W.sum(axis=0)
    ins = sum(e.nbytes for e in problem.graph.edges if e.src == CLIENT and e.dst != CLIENT)
    outs = sum(e.nbytes for e in problem.graph.edges if e.dst == CLIENT and e.src != CLIENT)
    if goal == "throughput":
        alone = np.maximum(compute, np.maximum(ins, outs) / costs.client_bw)  # links are full duplex
    else:
        alone = compute + 2 * costs.client_lat + (ins + outs) / costs.client_bw
    return [np.argsort(key, kind="stable").tolist() for key in (compute, alone)]


def _linked_order(problem: Problem, costs: CostArrays, by_compute: list[int], stages: int) -> list[int]:
    """Nodes chained so that consecutive stages have fast links. A node's cost as a stage is
    its share of the compute (total / `stages`) plus the Hockney time of a typical cut (the
    median bytes crossing a point of the topological order) over a link. The chain starts
    at the node, among the 64 fastest, whose own share plus its best outgoing link's time
    for that cut is smallest; each next node minimises its cost over the link from the
    previous one. The first 4 * stages + 8 nodes are chained; the rest follow by compute."""
    total = costs.W.sum(axis=0)
    cut = _median_cut_bytes(problem)

    def link_s(m):
        lat, bw = costs.link_arrays(m)
        t = lat + cut / bw
        t[m] = np.inf
        return t

    def start_cost(m):
        return float(total[m]) / stages + float(link_s(m).min()) if len(total) > 1 else 0.0

    def stage_cost(m):
        return total / stages + link_s(m)

    first = min(by_compute[:64], key=lambda m: (start_cost(m), m))
    order, used = [first], np.zeros(len(total), dtype=bool)
    used[first] = True
    for _ in range(min(len(total), 4 * stages + 8) - 1):
        score = np.where(used, np.inf, stage_cost(order[-1]))
        order.append(int(np.argmin(score)))
        used[order[-1]] = True
    return order + [n for n in by_compute if not used[n]]


def _median_cut_bytes(problem: Problem) -> float:
    """The median over the points between consecutive groups of the bytes crossing it."""
    n = len(problem.graph.groups)
    delta = [0] * (n + 1)
    for e in problem.graph.edges:
        if CLIENT not in (e.src, e.dst):
            delta[e.src + 1] += e.nbytes
            delta[e.dst + 1] -= e.nbytes
    crossing, running = [], 0
    for i in range(1, n):
        running += delta[i]
        crossing.append(running)
    return float(np.median(crossing)) if crossing else 0.0


def _partition(problem: Problem, costs: CostArrays, goal: str, nodes: list[int]) -> ExecutionSchedule:
    """The pipeline partition over `nodes` in that order. For "latency" the bottleneck is not
    searched: each node takes all it can hold (fewest stages, fewest transfers, the
    earliest nodes' speed for the most work)."""
    packer = _Packer(problem, costs, nodes)
    best = packer.pack(math.inf)
    if best is None:
        raise PlacementError(packer.failure)
    hi = packer.bottleneck
    lo = float(costs.W.min(axis=1).max())  # no stage is shorter than its longest group anywhere
    for _ in range(40 if goal == "throughput" else 0):
        if hi - lo <= 1e-2 * hi:
            break
        mid = (lo + hi) / 2
        placed = packer.pack(mid)
        if placed is None:
            lo = mid
        else:
            best, hi = placed, packer.bottleneck
    names = [nd.name for nd in problem.cluster.nodes]
    placement = {g: names[best[c]] for g, c in enumerate(problem.comp_of)}
    return evaluate(problem.graph, problem.cluster, placement, goal=goal, algorithm="pipeline-partition",
                    info=problem.info)


class _Packer:
    """One greedy pass of the pipeline partition for a bottleneck T (s)."""

    def __init__(self, problem: Problem, costs: CostArrays, nodes: list[int]):
        self.problem, self.costs, self.nodes = problem, costs, nodes
        comp_of = problem.comp_of
        # per group: (component of the source or -1 for the client, bytes) of each input,
        # and the bytes of each output to the client
        self.inputs = [[(-1 if e.src == CLIENT else comp_of[e.src], e.nbytes) for e in ins] for ins in problem.ins]
        self.to_client = [[e.nbytes for e in outs if e.dst == CLIENT] for outs in problem.outs]
        self._times: dict[tuple[int, int], float] = {}
        self._links: dict[tuple[int, int], float] = {}
        self.failure = ""
        self.bottleneck = 0.0

    def comp_time(self, c: int, n: int) -> float:
        """Roofline time of component c on node n (s)."""
        key = (c, n)
        if key not in self._times:
            self._times[key] = float(sum(self.costs.W[g, n] for g in self.problem.members[c]))
        return self._times[key]

    def link_s_per_byte(self, a: int, b: int) -> float:
        """1 / bandwidth from a to b (s/B); -1 is the client."""
        key = (a, b)
        if key not in self._links:
            if a < 0 or b < 0:
                bw = self.costs.client_bw[max(a, b)]
            else:
                bw = self.costs.row(a)[1][b]
            self._links[key] = 1.0 / float(bw)
        return self._links[key]

    def pack(self, limit: float) -> list[int] | None:
        """The node index of each component, with every node's compute and every link's
        per-run occupancy <= limit; or None (and `failure` says why)."""
        p = self.problem
        memory, busy, link_busy = NodeMemory(p), [0.0] * len(p.free), {}
        comp_node = [-1] * len(p.members)
        j = 0
        for g, c in enumerate(p.comp_of):
            if comp_node[c] < 0:
                n = p.forced[c]
                if n is None:
                    while j < len(self.nodes) and not self._fits(c, self.nodes[j], memory, busy, limit):
                        j += 1
                    if j == len(self.nodes):
                        self.failure = no_room_message(p, c, memory, "has no node with room left in a pipeline split")
                        return None
                    n = self.nodes[j]
                elif not self._fits(c, n, memory, busy, limit):
                    self.failure = no_room_message(p, c, memory, "has no room left where it must run")
                    return None
                comp_node[c] = n
                memory.take(c, n)
                busy[n] += self.comp_time(c, n)
            if not self._add_transfers(g, comp_node, link_busy, limit):
                return None
        self.bottleneck = max(busy + list(link_busy.values()))
        return comp_node

    def _fits(self, c, n, memory, busy, limit) -> bool:
        return busy[n] + self.comp_time(c, n) <= limit and memory.fits_on(c, n)

    def _add_transfers(self, g, comp_node, link_busy, limit) -> bool:
        """Adds group g's inputs from other ends and its outputs to the client to the links'
        occupancy; False when one exceeds `limit`."""
        n = comp_node[self.problem.comp_of[g]]
        moves = [(-1 if src < 0 else comp_node[src], n, nbytes) for src, nbytes in self.inputs[g]]
        moves += [(n, -1, nbytes) for nbytes in self.to_client[g]]
        for a, b, nbytes in moves:
            if a == b:
                continue
            t = link_busy.get((a, b), 0.0) + nbytes * self.link_s_per_byte(a, b)
            link_busy[(a, b)] = t
            if t > limit:
                self.failure = f"a link carries more than {limit} s per run"
                return False
        return True


def check_schedule(graph: GroupGraph, cluster: Cluster, sched: ExecutionSchedule,
                   pinned: dict[int, str] | None = None) -> None:
    """Checks a schedule against the constraints, independently of how it was made.

    Raises PlacementError listing every violation: a group without a known node, a weight
    or state name on two nodes, a name run away from the node where it is resident, a pin
    not kept, or a node whose new weights/state plus largest activation exceed its memory_free.
    """
    problems = []
    where: dict[str, set[str]] = {}
    for g in graph.groups:
        node = sched.placement.get(g.id)
        if node is None or node not in {n.name for n in cluster.nodes}:
            problems.append(f"group {g.id} has no known node ({node!r})")
            continue
        for name in group_names(g):
            where.setdefault(name, set()).add(node)
    for name, nodes in where.items():
        if len(nodes) > 1:
            problems.append(f"{name!r} is on {sorted(nodes)}")
        resident = {n.name for n in cluster.nodes if name in n.resident}
        if resident and not nodes <= resident:
            problems.append(f"{name!r} is resident on {sorted(resident)} but runs on {sorted(nodes)}")
    for g, node in (pinned or {}).items():
        if sched.placement.get(g) != node:
            problems.append(f"group {g} is pinned to {node!r} but placed on {sched.placement.get(g)!r}")
    problems += _memory_problems(graph, cluster, sched.placement)
    if problems:
        raise PlacementError("schedule breaks its constraints: " + "; ".join(problems))


def _memory_problems(graph, cluster, placement) -> list[str]:
    sizes = name_sizes(graph)
    used: dict[str, int] = {}
    names_on: dict[str, set[str]] = {}
    for gid, node in placement.items():
        used[node] = max(used.get(node, 0), graph.groups[gid].activation_bytes)
        names_on.setdefault(node, set()).update(group_names(graph.groups[gid]))
    out = []
    for node, names in names_on.items():
        spec = cluster.node(node)
        total = used[node] + sum(sizes.get(x, 0) for x in names if x not in spec.resident)
        if total > spec.memory_free:
            out.append(f"{node!r} needs {total} B but has {spec.memory_free} B free")
    return out


def apply_schedule(cluster: Cluster, sched: ExecutionSchedule) -> Cluster:
    """The cluster once `sched`'s weights and state are resident: each node's `resident`
    gains its `residency` and its `memory_free` loses the schedule's `resident_bytes`
    (activations are transient and not kept). Raises PlacementError when a node would go
    below zero free memory."""
    nodes = []
    for node in cluster.nodes:
        names = sched.residency.get(node.name)
        if not names:
            nodes.append(node)
            continue
        free = node.memory_free - sched.resident_bytes.get(node.name, 0)
        if free < 0:
            raise PlacementError(f"{node.name!r}: the schedule needs {-free} B more than its memory_free")
        nodes.append(replace(node, memory_free=free, resident=node.resident | names))
    return replace(cluster, nodes=tuple(nodes))


def schedule_disaggregated(prefill: GroupGraph, decode: GroupGraph, cluster: Cluster, *,
                           decode_steps: int = 1) -> DisaggregatedSchedule:
    """Prefill and decode of one model on separate nodes, the KV caches moved once.

    Policy (disaggregated serving as in DistServe: Y. Zhong et al., OSDI 2024, and
    Splitwise: P. Patel et al., ISCA 2024): each phase runs whole on one node that can hold
    it (its weights, state and largest activation; resident names are free there). Tp(n) and
    Td(n) are the phase's predicted time on node n (roofline compute of all its groups plus
    its client inputs and outputs): prefill is compute-bound, so Tp is smallest on the node
    with the most FLOP/s; decode is memory-bound, so Td is smallest on the node with the
    most bandwidth and the fastest client link. The pair (prefill node p, decode node d)
    minimises Tp(p) + KV(p, d) + decode_steps * Td(d), where KV is the time to send every
    cache from p to d, with p != d whenever two distinct nodes can hold the phases (the
    interference between the phases, the reason to disaggregate, is not in a one-request
    cost model); the same node only when no such pair exists. Each phase holds its own
    copy of the weights; the caches (state names the decode reads that the prefill wrote or
    created) move once, directly from p to d, after the prefill.

    Raises ValueError for decode_steps < 1, PlacementError when a phase fits on no node.
    """
    if decode_steps < 1:
        raise ValueError("decode_steps must be at least 1")
    tp, fits_p = _single_node_times(prefill, cluster)
    td, fits_d = _single_node_times(decode, cluster)
    caches = _shared_state(prefill, decode)
    p, d = _choose_pair(cluster, tp, fits_p, td, fits_d, caches, decode_steps, prefill, decode)
    names = [n.name for n in cluster.nodes]
    pre = evaluate(prefill, cluster, {g.id: names[p] for g in prefill.groups}, algorithm="disaggregated-prefill")
    dec = evaluate(decode, cluster, {g.id: names[d] for g in decode.groups}, algorithm="disaggregated-decode")
    kv = [Transfer(None, names[p], names[d], size, cluster.transfer_s(names[p], names[d], size), "kv_cache", name)
          for name, size in caches.items()] if p != d else []
    total = pre.estimated_s + sum(t.seconds for t in kv) + decode_steps * dec.estimated_s
    return DisaggregatedSchedule(pre, dec, kv, decode_steps, total)


def _single_node_times(graph: GroupGraph, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(time of the whole graph on each node (s), whether it fits each node)."""
    costs = CostArrays(graph, cluster)
    t = costs.W.sum(axis=0)
    for e in graph.edges:
        if CLIENT in (e.src, e.dst) and e.src != e.dst:
            t = t + costs.arrival(-1, e.nbytes)
    sizes = name_sizes(graph)
    names = {x for g in graph.groups for x in group_names(g)}
    act = max((g.activation_bytes for g in graph.groups), default=0)
    need = np.array([act + sum(sizes.get(x, 0) for x in names if x not in n.resident) for n in cluster.nodes])
    return t, need <= np.array([n.memory_free for n in cluster.nodes])


def _shared_state(prefill: GroupGraph, decode: GroupGraph) -> dict[str, int]:
    """{cache name: bytes} for each state name the decode reads that the prefill made: a name
    the prefill writes too (a cache given to both), or one it never takes (a cache the prefill
    creates, as `transformers.DynamicCache` does, is no input of it: the decode's name and size
    are the prefill's output's); in the decode's order, sized as the decode reads them."""
    prefill_names = {x for g in prefill.groups for x in group_names(g)}
    written = {x for g in prefill.groups for x in g.state}
    sizes = {**name_sizes(decode), **name_sizes(prefill)}
    read = dict.fromkeys(x for g in decode.groups for x in g.state if x in written or x not in prefill_names)
    return {x: sizes.get(x, 0) for x in read}


def _choose_pair(cluster, tp, fits_p, td, fits_d, caches, steps, prefill, decode) -> tuple[int, int]:
    for phase, fits, graph in (("prefill", fits_p, prefill), ("decode", fits_d, decode)):
        if not fits.any():
            raise PlacementError(f"the {phase} graph ({len(graph.groups)} groups) fits on no single node")
    k = 8  # candidates per phase: the k fastest for it (enough for the pair's minimum in practice)
    cand_p = [int(i) for i in np.argsort(np.where(fits_p, tp, np.inf), kind="stable")[:k] if fits_p[i]]
    cand_d = [int(i) for i in np.argsort(np.where(fits_d, td, np.inf), kind="stable")[:k] if fits_d[i]]
    names = [n.name for n in cluster.nodes]

    def cost(p, d):
        kv = sum(cluster.transfer_s(names[p], names[d], size) for size in caches.values())
        return float(tp[p]) + kv + steps * float(td[d])

    pairs = [(p, d) for p in cand_p for d in cand_d]
    split = [pd for pd in pairs if pd[0] != pd[1]]
    return min(split or pairs, key=lambda pd: (cost(*pd), pd))
