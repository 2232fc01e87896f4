"""Semantic analysis: what a captured graph is (patterns, phases, residency, costs).

    from genie.semantics import capture, analyze
    g = capture(model, input_ids, cache=static_cache)    # fake-tensor trace, nothing runs
    ann = analyze(g)                                      # cached by structure, then by shapes
    ann.phase, ann.count("attention"), ann.residency, ann.to_groups()

`SemGraph` (graph.py) is the graph form; `patterns.py` holds the pattern plugins and their
registry; `phases.py`, `residency.py` and `cost.py` the rules and formulas; `cache.py` the
two-level analysis cache, `Annotated` and `to_groups` (the scheduler's `groups.GroupGraph`).
See docs/semantics.md.
"""
from __future__ import annotations

from .cache import AnalysisCache, Annotated, analyze, cache_stats, clear_cache, to_groups, wl_hash
from .cost import Cost, arithmetic_intensity, estimate_time_s
from .graph import GraphBuilder, Node, SemGraph, Value, capture, from_fx
from .groups import CLIENT, Edge, Group, GroupGraph
from .patterns import Match, Pattern, find_matches, patterns, register, unregister
from .residency import CLASSES as RESIDENCY_CLASSES

__all__ = [
    "AnalysisCache", "Annotated", "CLIENT", "Cost", "Edge", "GraphBuilder", "Group", "GroupGraph", "Match", "Node",
    "Pattern", "RESIDENCY_CLASSES", "SemGraph", "Value", "analyze", "arithmetic_intensity", "cache_stats", "capture",
    "clear_cache", "estimate_time_s", "find_matches", "from_fx", "patterns", "register", "to_groups", "unregister",
    "wl_hash",
]
