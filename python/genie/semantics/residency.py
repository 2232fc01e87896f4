"""Residency: where each value lives, in Genie's wire classes.

Classes (`CLASSES`, the numbers of `genie.graph` / schemas/genie.fbs `Residency`):
"activation" (0, EPHEMERAL_ACTIVATION), "weight" (1, PERSISTENT_WEIGHT), "kv_cache"
(2, STATEFUL_KV_CACHE), "gradient" (3, GRADIENT).

Rules, first that applies:

1. A carried tensor a KV-cache match writes (its `key_cache`/`value_cache` input) and the
   results of the match's writes (the updated cache) -> kv_cache.
2. Graph inputs: parameters ("weight" kind), buffers (frozen or updated by the module, e.g.
   batch norm's running statistics: they live with the module's weights) and constants ->
   weight; incoming gradients ("gradient" kind) -> gradient; other inputs -> activation.
3. An in-place op's result is its written tensor: the written input's class. A view's
   result (`graph.VIEW_OPS`: no memory of its own) has its source's class.
4. Values a backward node makes (`phases.regions`) -> gradient: gradients of the loss with
   respect to activations and parameters (parameter gradients are among them, with the
   values they are computed from).
5. The rest -> activation.
"""
from __future__ import annotations

from typing import Sequence

from ..graph import ACTIVATION, GRADIENT, KV_CACHE, WEIGHT
from .graph import VIEW_OPS, SemGraph
from .patterns import Match

CLASSES = {"activation": ACTIVATION, "weight": WEIGHT, "kv_cache": KV_CACHE, "gradient": GRADIENT}


def kv_values(graph: SemGraph, matches: Sequence[Match]) -> set[int]:
    """Value ids rule 1 makes kv_cache: caches the KV-cache matches write, and their updates."""
    out: set[int] = set()
    for m in matches:
        if m.pattern != "kv_cache":
            continue
        for role in ("key_cache", "value_cache"):
            if role in m.roles:
                out.add(m.roles[role])
        for i in m.nodes:
            out.update(graph.nodes[i].outputs)
    return out


def assign(graph: SemGraph, matches: Sequence[Match], region: Sequence[str]) -> dict[int, str]:
    """Value id -> class name for every value of `graph` (rules of the module docstring)."""
    kv = kv_values(graph, matches)
    res: dict[int, str] = {}
    for vid in graph.inputs:
        v = graph.values[vid]
        if vid in kv:
            res[vid] = "kv_cache"
        elif v.kind in ("weight", "buffer", "constant"):
            res[vid] = "weight"
        elif v.kind == "gradient":
            res[vid] = "gradient"
        else:
            res[vid] = "activation"
    for n in graph.nodes:
        if n.writes:
            same = res.get(n.writes[0], "activation")
        elif n.base in VIEW_OPS and n.inputs:
            same = res.get(n.inputs[0], "activation")
        elif region[n.index] == "backward":
            same = "gradient"
        else:
            same = "activation"
        for o in n.outputs:
            res[o] = "kv_cache" if o in kv else same
    return res
