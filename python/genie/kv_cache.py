"""The KV-cache pass: which values of a cut hold a KV cache (semantic annotation).

A KV cache is what attention (`aten::scaled_dot_product_attention`) reads as key or value and a
cache-update op (`cat` along the sequence, `index_copy(_)`, `slice_scatter`) produced, seen
through single-input views (transpose, expand, contiguous, ...). Such values get residency
STATEFUL_KV_CACHE, so the node keeps and accounts them as state, not as activations. Part of
the passes layer (docs/frontend.md "Layers"); the runtime runs it on every cut.
"""
from __future__ import annotations

import torch

from .graph import KV_CACHE, Node, Value

# Op sets hold ids (`id(node.op) in ...`): hashing an OpOverload runs Python code.
SDPA = frozenset({id(torch.ops.aten.scaled_dot_product_attention.default)})
CACHE_WRITE_GRACE = 64  # nodes an asynchronous cut may wait for attention to read a KV-cache write
CACHE_WRITERS = frozenset(map(id, (torch.ops.aten.cat.default, torch.ops.aten.index_copy_.default,
                                     torch.ops.aten.index_copy.default, torch.ops.aten.slice_scatter.default)))


def annotate_kv_cache(nodes: list[Node]) -> None:
    """Semantic pass: values that hold a KV cache get residency STATEFUL_KV_CACHE.

    A KV cache is what attention reads as key or value and a cache-update op (cat along the
    sequence, index_copy_, slice_scatter) produced: seen through views (transpose, expand,
    contiguous, ...), its source is the cat's output.
    """
    for node in nodes:
        if id(node.op) not in SDPA:
            continue
        for arg in node.args[1:3]:
            v = arg
            for _ in range(8):
                if type(v) is not Value or v.node is None:
                    break
                producer = v.node
                if id(producer.op) in CACHE_WRITERS:
                    v.residency = KV_CACHE
                    break
                inputs = list(producer.inputs())
                if len(inputs) != 1:
                    break
                v = inputs[0]
