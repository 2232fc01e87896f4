"""The scheduler: which genie-node runs each group of a program's graph (docs/scheduler.md).

    from genie.scheduler import Cluster, NodeSpec, Link, schedule
    sched = schedule(group_graph, cluster, goal="latency")   # or "throughput"
    print(sched.explain())

Input: a genie.semantics.groups.GroupGraph (groups with costs, named weights and state, the
edges' bytes) and a `Cluster` (nodes with measured FLOP/s, memory bandwidth and free
memory, the weights and state resident on each; links with measured latency and
bandwidth: genie.scheduler.calibrate; `connected_cluster()` measures the nodes this program is
connected to). Output: an `ExecutionSchedule` (stages, placement, transfers, residency, the
cost model's estimate). Pure Python and numpy; no torch, except in calibrate and nodes, which
import it when called.
"""
from __future__ import annotations

from .baselines import greedy_by_memory, round_robin
from .calibrate import calibrate_link, calibrate_node, fit_hockney, measure_node
from .cluster import CLIENT_NAME, Cluster, Link, NodeSpec, compute_s, simulated
from .nodes import connected_cluster
from .placement import PlacementError, apply_schedule, check_schedule, schedule, schedule_disaggregated
from .schedule import DisaggregatedSchedule, ExecutionSchedule, PlacedGroup, Transfer, evaluate, name_sizes

__all__ = [
    "CLIENT_NAME", "Cluster", "DisaggregatedSchedule", "ExecutionSchedule", "Link", "NodeSpec", "PlacedGroup",
    "PlacementError", "Transfer", "apply_schedule", "calibrate_link", "calibrate_node", "check_schedule", "compute_s",
    "connected_cluster", "evaluate", "fit_hockney", "greedy_by_memory", "measure_node", "name_sizes", "round_robin", "schedule",
    "schedule_disaggregated", "simulated",
]
