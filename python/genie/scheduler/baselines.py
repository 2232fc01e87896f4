"""Baseline placements to compare genie.scheduler.placement.schedule against.

Both obey the same constraints as the scheduler (co-location components, residency, memory:
genie.scheduler.placement) and differ only in how they choose among the nodes with room;
both are judged by the same cost model (genie.scheduler.schedule.evaluate), so their
`estimated_s` and `period_s` compare with the scheduler's.
"""
from __future__ import annotations

from ..semantics.groups import GroupGraph
from .cluster import Cluster
from .placement import NodeMemory, PlacementError, Problem, no_room_message, prepare
from .schedule import ExecutionSchedule, evaluate


def round_robin(graph: GroupGraph, cluster: Cluster, goal: str = "latency") -> ExecutionSchedule:
    """Components in graph order to the nodes in turn (the next node with room after the
    previous choice). Raises PlacementError when a component has no node with room left."""
    problem = prepare(graph, cluster)
    room, turn, chosen = NodeMemory(problem), 0, []
    n_nodes = len(cluster.nodes)
    for c in range(len(problem.members)):
        if problem.forced[c] is not None:
            node = _take(problem, c, [problem.forced[c]], room)
        else:
            node = _take(problem, c, [(turn + k) % n_nodes for k in range(n_nodes)], room)
            turn = node + 1
        chosen.append(node)
    return _evaluated(problem, chosen, goal, "round-robin")


def greedy_by_memory(graph: GroupGraph, cluster: Cluster, goal: str = "latency") -> ExecutionSchedule:
    """Each component in graph order to the node with the most free memory left (ties: the
    first node). Raises PlacementError when a component has no node with room left."""
    problem = prepare(graph, cluster)
    room, chosen = NodeMemory(problem), []
    for c in range(len(problem.members)):
        if problem.forced[c] is not None:
            candidates = [problem.forced[c]]
        else:
            left = room.left()
            candidates = sorted(range(len(left)), key=lambda i: (-left[i], i))
        chosen.append(_take(problem, c, candidates, room))
    return _evaluated(problem, chosen, goal, "greedy-by-memory")


def _take(problem: Problem, c: int, candidates, room: NodeMemory) -> int:
    """The first candidate with room for component c, which takes it."""
    for node in candidates:
        if room.fits_on(c, node):
            room.take(c, node)
            return node
    raise PlacementError(no_room_message(problem, c, room, "has no node with room left"))


def _evaluated(problem: Problem, chosen: list[int], goal: str, algorithm: str) -> ExecutionSchedule:
    names = [n.name for n in problem.cluster.nodes]
    placement = {g: names[chosen[problem.comp_of[g]]] for g in range(len(problem.graph.groups))}
    return evaluate(problem.graph, problem.cluster, placement, goal=goal, algorithm=algorithm, info=problem.info)
