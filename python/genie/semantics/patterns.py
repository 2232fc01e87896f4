"""Pattern plugins: find attention, KV-cache appends, convolution blocks, MLPs, embeddings and
normalizations in a `SemGraph`.

A pattern is an object with a `name`, the `ops` it needs (the graph must contain at least one
of them, else `match` is not called: the early exit of seed 000 §4.2's hierarchical index) and
`match(graph) -> list[Match]`. `describe(graph, match)` recomputes a match's shape-dependent
`detail` (heads, sequence lengths); the analysis cache calls it when it reuses a match on a
graph of the same structure with other shapes. Patterns run in registry order; `register`
adds one (`docs/semantics.md` shows how).

Matching is structural, on aten ops as PyTorch's tracers produce them (decomposed or not):
views and copies (`graph.PASSTHROUGH_OPS`) are looked through. Confidence (0..1) says how
sure a match is: 1.0 where one op states the pattern (`aten::_scaled_dot_product_*`,
`aten::embedding`, `aten::native_layer_norm`), less where it is inferred from a chain of ops.

Over 600 lines: the six built-in patterns and the registry that runs them; the patterns share the
op sets and the look-through helpers (`_view_chain`, `_is_weight`, `_seq_len`) that only they
use, so splitting them apart would make those private helpers a module of their own.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple

from .graph import PASSTHROUGH_OPS, SemGraph, base_name


class Match(NamedTuple):
    """One instance of a pattern.

    `pattern`: the pattern's name. `confidence`: 0..1. `nodes`: indices of its ops (sorted).
    `roles`: value ids by role (``"query"``, ``"key"``, ``"key_cache"``, ``"weight"``, ...).
    `detail`: a few shape facts (ints/strings), e.g. ``{"heads": 12, "q_len": 1, "kv_len": 83}``.
    """

    pattern: str
    confidence: float
    nodes: tuple[int, ...]
    roles: Mapping[str, int]
    detail: Mapping[str, Any]

    @property
    def anchor(self) -> int:
        """The first of its ops."""
        return self.nodes[0]


class Pattern:
    """Base class of pattern plugins.

    Subclasses set `name` and `ops` (aten names without overload, ``"aten::_softmax"``; the
    graph must hold at least one, an empty set means always run) and implement `match`.
    `describe` returns `detail` for a match from the graph's shapes (default: unchanged).
    """

    name: str = ""
    ops: frozenset[str] = frozenset()

    def applies(self, graph: SemGraph) -> bool:
        """Early exit: False when the graph has none of `ops`."""
        return not self.ops or not self.ops.isdisjoint(graph.op_bases)

    def match(self, graph: SemGraph) -> list[Match]:
        raise NotImplementedError

    def describe(self, graph: SemGraph, match: Match) -> dict:
        return dict(match.detail)

    def __repr__(self) -> str:
        return f"<Pattern {self.name}>"


# ---- op sets ------------------------------------------------------------------------------------

SDPA_OPS = frozenset({
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_attention_math_for_mps", "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
})
_BLHD_ATTENTION = frozenset({"aten::_flash_attention_forward", "aten::_efficient_attention_forward"})
SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_safe_softmax"})
BATCHED_MATMUL_OPS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm"})
# ops between Q·Kᵀ and softmax (scale, mask, dtype casts) and between softmax and ·V (dropout)
SCORE_OPS = frozenset({"aten::mul", "aten::div", "aten::add", "aten::sub", "aten::where", "aten::masked_fill",
                       "aten::clamp", "aten::tanh", "aten::_to_copy", "aten::native_dropout", "aten::dropout",
                       "aten::mul_", "aten::div_", "aten::add_", "aten::masked_fill_"}) | PASSTHROUGH_OPS
LINEAR_OPS = frozenset({"aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::_addmm_activation"})
CONV_OPS = frozenset({
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::cudnn_convolution",
    "aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::convolution_overrideable",
    "aten::miopen_convolution", "aten::_convolution_mode",
})
BATCH_NORM_OPS = frozenset({
    "aten::native_batch_norm", "aten::_native_batch_norm_legit_no_training", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_functional", "aten::batch_norm", "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm", "aten::_batch_norm_with_update", "aten::_batch_norm_no_update",
    "aten::_batch_norm_impl_index", "aten::instance_norm",
})
GROUP_NORM_OPS = frozenset({"aten::group_norm", "aten::native_group_norm"})
LAYER_NORM_OPS = frozenset({"aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm"})
NORM_OPS = BATCH_NORM_OPS | GROUP_NORM_OPS | LAYER_NORM_OPS
ACTIVATION_OPS = frozenset({
    "aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_", "aten::silu", "aten::silu_", "aten::hardswish",
    "aten::hardswish_", "aten::hardtanh", "aten::hardtanh_", "aten::relu6", "aten::leaky_relu", "aten::leaky_relu_",
    "aten::sigmoid", "aten::sigmoid_", "aten::mish", "aten::mish_", "aten::elu", "aten::elu_", "aten::tanh",
    "aten::tanh_", "aten::hardsigmoid", "aten::softplus", "aten::prelu", "aten::_prelu_kernel", "aten::selu",
    "aten::celu", "aten::threshold", "aten::clamp_min", "aten::clamp_min_",
})
POOL_OPS = frozenset({
    "aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d", "aten::max_pool2d_with_indices",
    "aten::max_pool3d_with_indices", "aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d",
    "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d",
    "aten::adaptive_avg_pool3d", "aten::adaptive_max_pool2d", "aten::_adaptive_avg_pool3d",
})
ELEMENTWISE_OPS = frozenset({
    "aten::mul", "aten::add", "aten::sub", "aten::div", "aten::pow", "aten::tanh", "aten::sigmoid", "aten::erf",
    "aten::exp", "aten::neg", "aten::rsub", "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::abs",
    "aten::mul_", "aten::add_", "aten::native_dropout", "aten::dropout", "aten::where", "aten::clamp",
}) | ACTIVATION_OPS | PASSTHROUGH_OPS
NONLINEAR_OPS = ACTIVATION_OPS | frozenset({"aten::erf", "aten::exp", "aten::tanh", "aten::sigmoid"})
EMBEDDING_OPS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag",
                           "aten::_embedding_bag_forward_only", "aten::index_select", "aten::index"})
# writes into a tensor: in place (self is written) or out of place (a new tensor with the write)
CACHE_WRITE_OPS = frozenset({
    "aten::index_copy_", "aten::index_copy", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
    "aten::slice_scatter", "aten::select_scatter", "aten::copy_", "aten::scatter_", "aten::scatter",
    "aten::index_add_", "aten::narrow_copy", "aten::_unsafe_index_put", "aten::fill_",
})
_NEW_ARGS = ("source", "values", "src", "value")  # the argument a write takes its new data from


# ---- helpers ------------------------------------------------------------------------------------

def _is_weight(graph: SemGraph, vid: int) -> bool:
    """`vid` is (a view of) a parameter, an unwritten buffer or a constant."""
    v = graph.values[graph.origin(vid)]
    return v.kind == "weight" or (v.kind in ("buffer", "constant") and not v.mutated)


def _is_carried(graph: SemGraph, vid: int) -> bool:
    """`vid` is a graph input that is state (not a weight): an input or a buffer of the program."""
    v = graph.values[vid]
    return v.producer < 0 and v.kind in ("input", "buffer")


def _sole_consumer(graph: SemGraph, vid: int, allowed: frozenset[str], claimed: set[int]) -> tuple[int, int] | None:
    """The one non-view node reading `vid` (through views), if its op is in `allowed` and free."""
    users = graph.through_views(vid)
    if len({c for c, _ in users}) != 1:
        return None
    c, v = users[0]
    n = graph.nodes[c]
    if n.base not in allowed or c in claimed:
        return None
    return c, v


def _view_chain(graph: SemGraph, vid: int) -> list[int]:
    """The passthrough nodes between `vid` and its origin (walking back through first inputs)."""
    out = []
    while True:
        p = graph.values[vid].producer
        if p < 0:
            return out
        n = graph.nodes[p]
        if n.base not in PASSTHROUGH_OPS or not n.inputs:
            return out
        out.append(p)
        vid = n.inputs[0]


_SCALING_OPS = frozenset({"aten::mul", "aten::div", "aten::_to_copy", "aten::neg"})


def _origin_scaled(graph: SemGraph, vid: int) -> int:
    """`graph.origin` that also walks back through ops scaling one tensor by a scalar
    (`mul`/`div` by a number, dtype casts): attention decompositions scale K before Q·Kᵀ."""
    while True:
        vid = graph.origin(vid)
        p = graph.values[vid].producer
        if p < 0:
            return vid
        n = graph.nodes[p]
        if n.base not in _SCALING_OPS or len(n.inputs) != 1:
            return vid
        vid = n.inputs[0]


def _seq_len(shape: tuple[int, ...], blhd: bool = False) -> int:
    if len(shape) < 2:
        return shape[0] if shape else 1
    return shape[1] if blhd else shape[-2]


# ---- attention ----------------------------------------------------------------------------------

class AttentionPattern(Pattern):
    """Attention: one `aten::*scaled_dot_product*` op (confidence 1.0), or Q·Kᵀ (bmm/matmul) ->
    [scale, mask: mul/div/add/where/masked_fill] -> softmax -> [dropout] -> ·V (bmm/matmul)
    (0.95 when both matmuls and the softmax are found, the scale and mask optional).

    Roles: query, key, value (the matmuls' operands / the op's arguments), mask (if any), out.
    Detail: batch, heads, q_len, kv_len, head_dim, kind ("sdpa" or "matmul_softmax").
    """

    name = "attention"
    ops = SDPA_OPS | SOFTMAX_OPS

    def match(self, graph: SemGraph) -> list[Match]:
        memo = graph._memo.get("attention")
        if memo is not None:
            return list(memo)
        found = []
        for n in graph.nodes:
            if n.base in SDPA_OPS and len(n.inputs) >= 3:
                roles = {"query": n.inputs[0], "key": n.inputs[1], "value": n.inputs[2], "out": n.outputs[0]}
                mask = n.input_named("attn_mask") or n.input_named("attn_bias")
                if mask is not None:
                    roles["mask"] = mask
                m = Match(self.name, 1.0, (n.index,), roles, {"kind": "sdpa", "op": n.op})
                found.append(m._replace(detail=self.describe(graph, m)))
            elif n.base in SOFTMAX_OPS:
                m = self._explicit(graph, n.index)
                if m is not None:
                    found.append(m._replace(detail=self.describe(graph, m)))
        graph._memo["attention"] = tuple(found)
        return found

    def _explicit(self, graph: SemGraph, softmax: int) -> Match | None:
        sm = graph.nodes[softmax]
        # back from the softmax input to Q·Kᵀ, through scale and mask ops (first input first)
        path = self._path_to_matmul(graph, sm.inputs[0], 8)
        if path is None:
            return None
        qk, between = path[0], path[1:]
        # forward from the softmax output to ·V, through dropout, casts and views
        av = None
        after: list[int] = []
        frontier = [sm.outputs[0]]
        for _ in range(6):
            nxt = []
            for v in frontier:
                for c in graph.consumers(v):
                    n = graph.nodes[c]
                    first = n.inputs[1] if n.base == "aten::baddbmm" else n.inputs[0]
                    if n.base in BATCHED_MATMUL_OPS and first == v:
                        av = c
                        break
                    if n.base in SCORE_OPS and n.outputs:
                        after.append(c)
                        nxt.append(n.outputs[0])
                if av is not None:
                    break
            if av is not None or not nxt:
                break
            frontier = nxt
        if av is None:
            return None
        qkn, avn = graph.nodes[qk], graph.nodes[av]
        q_in = qkn.inputs[1] if qkn.base == "aten::baddbmm" else qkn.inputs[0]
        k_in = qkn.inputs[2] if qkn.base == "aten::baddbmm" else qkn.inputs[1]
        v_in = avn.inputs[2] if avn.base == "aten::baddbmm" else avn.inputs[1]
        nodes = {qk, softmax, av}
        nodes.update(between)
        nodes.update(after)
        # the views that shape Q, K, V for the matmuls and the output back
        for vin in (q_in, k_in, v_in):
            nodes.update(_view_chain(graph, vin))
        roles = {"query": q_in, "key": k_in, "value": v_in, "scores": sm.inputs[0], "out": avn.outputs[0]}
        masks = [i for b in between for i in graph.nodes[b].inputs
                 if graph.values[i].producer not in nodes and len(graph.values[i].shape) >= 2]
        if masks:
            roles["mask"] = masks[0]
        return Match(self.name, 0.95, tuple(sorted(nodes)), roles, {"kind": "matmul_softmax"})

    @staticmethod
    def _path_to_matmul(graph: SemGraph, vid: int, depth: int) -> list[int] | None:
        """[matmul, score ops...]: the chain of score ops from a batched matmul to `vid`, or None."""
        p = graph.values[vid].producer
        if p < 0 or depth == 0:
            return None
        n = graph.nodes[p]
        if n.base in BATCHED_MATMUL_OPS:
            return [p]
        if n.base not in SCORE_OPS:
            return None
        for v in (n.inputs[:1] if n.base in PASSTHROUGH_OPS else n.inputs):
            sub = AttentionPattern._path_to_matmul(graph, v, depth - 1)
            if sub is not None:
                return sub + [p]
        return None

    def describe(self, graph: SemGraph, match: Match) -> dict:
        q = graph.values[match.roles["query"]].shape
        k = graph.values[match.roles["key"]].shape
        if match.detail.get("kind") == "sdpa":
            blhd = base_name(match.detail.get("op", "")) in _BLHD_ATTENTION
            if not blhd and len(q) == 4:
                # grouped-query attention may fold the query heads into the sequence dimension
                # ([B, H, L, D] -> [B, H_kv, H/H_kv * L, D]): report the query before the fold
                o = graph.values[graph.origin(match.roles["query"])].shape
                if len(o) == 4 and o[0] == q[0] and o[3] == q[3] and o[1] * o[2] == q[1] * q[2] and o[1] > q[1]:
                    q = o
            batch = q[0] if q else 1
            heads = (q[2] if blhd else q[1]) if len(q) == 4 else 1
            return {"kind": "sdpa", "op": match.detail.get("op", ""), "batch": batch, "heads": heads,
                    "q_len": _seq_len(q, blhd), "kv_len": _seq_len(k, blhd), "head_dim": q[-1] if q else 1}
        s = graph.values[match.roles["scores"]].shape
        heads = s[-3] if len(s) >= 4 else 1
        batch_heads = 1
        for d in s[:-2]:
            batch_heads *= d
        return {"kind": "matmul_softmax", "batch": batch_heads // max(heads, 1), "heads": heads,
                "q_len": s[-2] if len(s) >= 2 else 1, "kv_len": s[-1] if s else 1, "head_dim": q[-1] if q else 1}


def attention_matches(graph: SemGraph) -> list[Match]:
    """The attention matches of `graph` (computed once per graph)."""
    return AttentionPattern().match(graph)


# ---- KV cache -----------------------------------------------------------------------------------

class KVCachePattern(Pattern):
    """KV-cache append: the keys and values an attention reads are a tensor carried across steps
    (a graph input or buffer, not a weight) with this step's keys/values written into it.

    Recognized writes: in place (`index_copy_`, `index_put_`, `copy_` into a slice,
    `scatter_`, ...) into a carried tensor (confidence 0.95); out of place (`index_copy`,
    `slice_scatter`, `index_put`, ...) of a carried tensor the program marks mutated (0.95,
    `torch.export`'s buffer mutations) or returns (0.85); `cat` of a carried tensor and the new
    keys/values along the sequence dimension (0.9; DynamicCache-style, the result is returned
    as the next step's cache); the cache's creation: what the attention reads is made by this
    step and kept beyond it (one of the program's outputs, through views: a DynamicCache's first
    update stores the prompt's keys as they are, a StaticCache's first step writes them into a
    fresh tensor; 0.8). One match per attention (its key and value
    caches together).

    Roles: key_cache, value_cache (the carried inputs), key_new, value_new (what is written),
    key, value (what the attention reads). Detail: cache_len, new_len, heads, head_dim, write.
    """

    name = "kv_cache"
    ops = CACHE_WRITE_OPS | frozenset({"aten::cat"})

    def match(self, graph: SemGraph) -> list[Match]:
        out = []
        for att in attention_matches(graph):
            found = {}
            for role in ("key", "value"):
                hit = self._cache_write(graph, att.roles[role])
                if hit is not None:
                    found[role] = hit
            if not found:
                continue
            nodes: set[int] = set()
            roles: dict[str, int] = {}
            conf = 1.0
            writes = []
            for role, (cache, new, write_nodes, c, how) in found.items():
                nodes.update(write_nodes)
                roles[f"{role}_cache"] = cache
                if new is not None:
                    roles[f"{role}_new"] = new
                roles[role] = att.roles[role]
                conf = min(conf, c)
                writes.append(how)
            if len(found) == 1:
                conf *= 0.9  # only one of key and value is carried
            m = Match(self.name, round(conf, 3), tuple(sorted(nodes)), roles,
                      {"write": "/".join(sorted(set(writes))), "attention": att.anchor})
            out.append(m._replace(detail=self.describe(graph, m)))
        return out

    def _cache_write(self, graph: SemGraph, read: int) -> tuple[int, int | None, list[int], float, str] | None:
        """(cache input, new data, write nodes, confidence, op) when `read` is a carried tensor's update."""
        o = _origin_scaled(graph, read)
        p = graph.values[o].producer
        if p < 0:
            # the attention reads the carried tensor itself: a write went into a view of it
            if not _is_carried(graph, o) or not graph.values[o].mutated:
                return None
            writes = [n.index for n in graph.nodes if n.writes and n.base in CACHE_WRITE_OPS
                      and any(graph.origin(w) == o for w in n.writes)]
            if not writes:
                return None
            n = graph.nodes[writes[-1]]
            return o, self._new_data(graph, n), writes, 0.9, n.base.removeprefix("aten::")
        n = graph.nodes[p]
        if n.base == "aten::cat":
            carried = [i for i in n.inputs if _is_carried(graph, graph.origin(i))]
            if not carried:  # a cache started here (DynamicCache's first update: cat onto an empty tensor)
                return self._created(graph, read)
            new = next((i for i in n.inputs if i not in carried), None)
            rank = len(graph.values[o].shape)
            dim = n.attr("dim", 0)
            seq_dim = dim in (-2, rank - 2) or (rank == 4 and dim == 1)
            return graph.origin(carried[0]), new, [p], 0.9 if seq_dim else 0.7, "cat"
        if n.base not in CACHE_WRITE_OPS or not n.inputs:
            return self._created(graph, read)
        dest = graph.origin(n.inputs[0])
        if not _is_carried(graph, dest):
            # a cache made by this step and filled by the write (a static cache's first step)
            created = self._created(graph, read)
            if created is None:
                return None
            return created[0], self._new_data(graph, n), [p], 0.8, n.base.removeprefix("aten::")
        if n.writes:
            conf = 0.95
        elif graph.values[dest].mutated:
            conf = 0.95
        elif o in graph.outputs or n.outputs[0] in graph.outputs:
            conf = 0.85
        else:
            return None
        return dest, self._new_data(graph, n), [p], conf, n.base.removeprefix("aten::")

    @staticmethod
    def _created(graph: SemGraph, read: int) -> tuple[int, int, list[int], float, str] | None:
        """The cache made by this step: what the attention reads (or a view between it and its
        origin) is made here and outlives the program (one of its outputs: a DynamicCache's
        first update keeps the prompt's keys as the cache, no write op)."""
        chain = [read] + [graph.nodes[p].inputs[0] for p in _view_chain(graph, read)]
        kept = next((v for v in chain if v in graph.outputs), None)
        return None if kept is None else (kept, read, [], 0.8, "create")

    @staticmethod
    def _new_data(graph: SemGraph, n: Any) -> int | None:
        for name in _NEW_ARGS:
            v = n.input_named(name)
            if v is not None:
                return v
        return n.inputs[-1] if len(n.inputs) > 1 else None

    def describe(self, graph: SemGraph, match: Match) -> dict:
        cache = graph.values[match.roles.get("key_cache", match.roles.get("value_cache"))].shape
        new_id = match.roles.get("key_new", match.roles.get("value_new"))
        new = graph.values[new_id].shape if new_id is not None else ()
        return {"write": match.detail.get("write", ""), "attention": match.detail.get("attention", -1),
                "cache_len": _seq_len(cache), "new_len": _seq_len(new) if new else 0,
                "heads": cache[1] if len(cache) == 4 else 1, "head_dim": cache[-1] if cache else 1}


# ---- convolution blocks -------------------------------------------------------------------------

class ConvBlockPattern(Pattern):
    """Convolution block: conv -> [batch/group norm] -> [residual add] -> [activation] -> [pool].

    Each convolution starts one block (so the count equals the model's convolutions); the
    optional ops join when each is the only reader of the previous one's output and no earlier
    block took it. Confidence: 0.8 for a bare conv, 0.9 with a norm or activation, 0.95 with both.
    Roles: input, weight, out. Detail: in_channels, out_channels, kernel, stride, groups, out_hw.
    """

    name = "conv_block"
    ops = CONV_OPS

    def match(self, graph: SemGraph) -> list[Match]:
        claimed: set[int] = set()
        out = []
        for n in graph.nodes:
            if n.base not in CONV_OPS or n.index in claimed or len(n.inputs) < 2:
                continue
            nodes = [n.index]
            cur = n.outputs[0]
            has_norm = has_act = False
            step = _sole_consumer(graph, cur, NORM_OPS - LAYER_NORM_OPS, claimed)
            if step is not None:
                nodes.append(step[0])
                cur = graph.nodes[step[0]].outputs[0]
                has_norm = True
            step = _sole_consumer(graph, cur, frozenset({"aten::add", "aten::add_"}), claimed)
            if step is not None:
                nodes.append(step[0])
                cur = graph.nodes[step[0]].outputs[0]
            step = _sole_consumer(graph, cur, ACTIVATION_OPS, claimed)
            if step is not None:
                nodes.append(step[0])
                cur = graph.nodes[step[0]].outputs[0]
                has_act = True
            step = _sole_consumer(graph, cur, POOL_OPS | frozenset({"aten::mean"}), claimed)
            if step is not None and (graph.nodes[step[0]].base != "aten::mean" or self._spatial_mean(graph, step[0])):
                nodes.append(step[0])
                cur = graph.nodes[step[0]].outputs[0]
            claimed.update(nodes)
            conf = 0.95 if has_norm and has_act else 0.9 if has_norm or has_act else 0.8
            roles = {"input": n.inputs[0], "weight": n.inputs[1], "out": cur}
            m = Match(self.name, conf, tuple(sorted(nodes)), roles, {"op": n.op, "conv": n.index})
            out.append(m._replace(detail=self.describe(graph, m)))
        return out

    @staticmethod
    def _spatial_mean(graph: SemGraph, idx: int) -> bool:
        """`mean` over the spatial dims (global average pooling as decomposed)."""
        n = graph.nodes[idx]
        rank = len(graph.values[n.inputs[0]].shape)
        dims = n.attr("dim") or ()
        dims = {d % rank for d in dims} if rank else set()
        return rank >= 3 and bool(dims) and dims <= set(range(2, rank))

    def describe(self, graph: SemGraph, match: Match) -> dict:
        conv = graph.nodes[match.detail.get("conv", match.nodes[0])]
        w = graph.values[match.roles["weight"]].shape
        out = graph.values[conv.outputs[0]].shape
        groups = conv.attr("groups", 1) or 1
        return {"op": conv.op, "conv": conv.index, "in_channels": w[1] * groups if len(w) > 1 else 0,
                "out_channels": w[0] if w else 0, "kernel": tuple(w[2:]), "stride": conv.attr("stride", ()),
                "groups": conv.attr("groups", 1), "out_hw": tuple(out[2:])}


# ---- MLP ----------------------------------------------------------------------------------------

class MLPPattern(Pattern):
    """MLP block: linear (addmm/mm/linear/matmul with a weight operand) -> elementwise ops with
    a nonlinearity (gelu, relu, silu, tanh-approximated gelu as decomposed, gated SwiGLU with
    its up projection) -> linear. Confidence 0.9 with a named activation op, 0.85 with a
    decomposed one (tanh, erf, sigmoid, exp). Roles: input, w_in, w_out, out. Detail:
    hidden (input features), intermediate, tokens, activation.
    """

    name = "mlp"
    ops = LINEAR_OPS

    def match(self, graph: SemGraph) -> list[Match]:
        claimed: set[int] = set()
        out = []
        for n in graph.nodes:
            if n.base not in LINEAR_OPS or n.index in claimed:
                continue
            x, w = self._linear_operands(graph, n)
            if w is None:
                continue
            found = self._to_second_linear(graph, n.index, claimed)
            if found is None:
                continue
            l2, region, act, extra = found
            nodes = {n.index, l2} | region | extra
            nodes.update(_view_chain(graph, w))
            x2, w2 = self._linear_operands(graph, graph.nodes[l2])
            if w2 is not None:
                nodes.update(_view_chain(graph, w2))
            claimed.update(nodes)
            roles = {"input": x, "w_in": w, "w_out": w2, "out": graph.nodes[l2].outputs[0]}
            conf = 0.9 if act in ACTIVATION_OPS and act not in ("aten::tanh", "aten::sigmoid") else 0.85
            m = Match(self.name, conf, tuple(sorted(nodes)), roles,
                      {"activation": act.removeprefix("aten::"), "gated": bool(extra)})
            out.append(m._replace(detail=self.describe(graph, m)))
        return out

    @staticmethod
    def _linear_operands(graph: SemGraph, n: Any) -> tuple[int | None, int | None]:
        """(activation input, weight) of a linear-like node, weight None when no operand is one."""
        if n.base == "aten::addmm" or n.base == "aten::_addmm_activation":
            ins = n.inputs[1:3]
        else:
            ins = n.inputs[:2]
        if len(ins) < 2:
            return None, None
        if _is_weight(graph, ins[1]) and not _is_weight(graph, ins[0]):
            return ins[0], ins[1]
        if _is_weight(graph, ins[0]) and not _is_weight(graph, ins[1]):
            return ins[1], ins[0]
        return None, None

    def _to_second_linear(self, graph: SemGraph, l1: int, claimed: set[int]):
        """Follows elementwise ops from linear `l1` to a second linear with a weight operand."""
        region: set[int] = set()
        frontier = list(graph.nodes[l1].outputs)
        l2 = None
        while frontier and len(region) < 24:
            v = frontier.pop()
            for c in graph.consumers(v):
                n = graph.nodes[c]
                if c in region or c in claimed:
                    continue
                if n.base in LINEAR_OPS:
                    x, w = self._linear_operands(graph, n)
                    if w is not None and x is not None and c != l1 and (l2 is None or c < l2) and region:
                        l2 = c
                    continue
                if n.base in ELEMENTWISE_OPS:
                    region.add(c)
                    frontier.extend(n.outputs)
        if l2 is None:
            return None
        # keep the region nodes on a path to l2's activation input
        x2, _ = self._linear_operands(graph, graph.nodes[l2])
        keep: set[int] = set()
        stack = [x2]
        extra: set[int] = set()
        x1, _ = self._linear_operands(graph, graph.nodes[l1])
        while stack:
            v = stack.pop()
            p = graph.values[v].producer
            if p in region and p not in keep:
                keep.add(p)
                stack.extend(graph.nodes[p].inputs)
                continue
            p = graph.values[graph.origin(v)].producer
            if p >= 0 and p != l1 and p not in extra and p not in claimed and graph.nodes[p].base in LINEAR_OPS:
                # a gate's second projection of the same input (SwiGLU's up_proj)
                xo, wo = self._linear_operands(graph, graph.nodes[p])
                if wo is not None and xo is not None and x1 is not None and graph.origin(xo) == graph.origin(x1):
                    extra.add(p)
                    extra.update(_view_chain(graph, v))
                    extra.update(_view_chain(graph, wo))
                    extra.update(q for q in _view_chain(graph, xo) if q not in claimed)
        acts = [graph.nodes[i].base for i in sorted(keep) if graph.nodes[i].base in NONLINEAR_OPS]
        if not acts:
            return None
        named = [a for a in acts if a in ACTIVATION_OPS and a not in ("aten::tanh", "aten::sigmoid")]
        return l2, keep, (named or acts)[0], extra

    def describe(self, graph: SemGraph, match: Match) -> dict:
        x = graph.values[match.roles["input"]].shape
        w = graph.values[match.roles["w_in"]].shape
        hidden = x[-1] if x else 0
        inter = w[0] if len(w) == 2 and w[1] == hidden else (w[-1] if w else 0)
        tokens = 1
        for d in x[:-1]:
            tokens *= d
        return {"activation": match.detail.get("activation", ""), "gated": match.detail.get("gated", False),
                "hidden": hidden, "intermediate": inter, "tokens": tokens}


# ---- embeddings ---------------------------------------------------------------------------------

class EmbeddingPattern(Pattern):
    """Embedding lookup: `aten::embedding` / `embedding_bag` (1.0), `index_select` along dim 0 of
    a weight (0.9), `index` of a weight (0.8). Roles: table, indices, out.
    Detail: num_embeddings, dim, lookups."""

    name = "embedding"
    ops = EMBEDDING_OPS

    def match(self, graph: SemGraph) -> list[Match]:
        out = []
        for n in graph.nodes:
            if n.base not in EMBEDDING_OPS or len(n.inputs) < 2:
                continue
            if n.base in ("aten::embedding", "aten::embedding_bag", "aten::_embedding_bag",
                          "aten::_embedding_bag_forward_only"):
                conf, table, idx = 1.0, n.inputs[0], n.inputs[1]
            elif n.base == "aten::index_select" and n.attr("dim", 0) == 0 and _is_weight(graph, n.inputs[0]):
                conf, table, idx = 0.9, n.inputs[0], n.inputs[1]
            elif n.base == "aten::index" and _is_weight(graph, n.inputs[0]) \
                    and len(graph.values[n.inputs[0]].shape) == 2:
                conf, table, idx = 0.8, n.inputs[0], n.inputs[1]
            else:
                continue
            nodes = {n.index} | set(_view_chain(graph, table))
            m = Match(self.name, conf, tuple(sorted(nodes)), {"table": table, "indices": idx, "out": n.outputs[0]}, {})
            out.append(m._replace(detail=self.describe(graph, m)))
        return out

    def describe(self, graph: SemGraph, match: Match) -> dict:
        t = graph.values[match.roles["table"]].shape
        return {"num_embeddings": t[0] if t else 0, "dim": t[-1] if t else 0,
                "lookups": graph.values[match.roles["indices"]].numel}


# ---- normalization ------------------------------------------------------------------------------

class NormPattern(Pattern):
    """Normalization: one op (`native_layer_norm`, `layer_norm`, the batch norm variants,
    `group_norm`, `rms_norm`: 1.0), or RMSNorm as decomposed: x·rsqrt(mean(x², -1) + eps)
    [· weight] (0.85). Roles: input, weight (if any), out. Detail: kind, features, rows."""

    name = "norm"
    ops = NORM_OPS | frozenset({"aten::rsqrt"})

    def match(self, graph: SemGraph) -> list[Match]:
        out = []
        for n in graph.nodes:
            if n.base in NORM_OPS:
                kind = ("batch_norm" if n.base in BATCH_NORM_OPS else "group_norm" if n.base in GROUP_NORM_OPS
                        else "rms_norm" if "rms" in n.base else "layer_norm")
                roles = {"input": n.inputs[0], "out": n.outputs[0]}
                if len(n.inputs) > 1:
                    roles["weight"] = n.inputs[1]
                m = Match(self.name, 1.0, (n.index,), roles, {"kind": kind})
                out.append(m._replace(detail=self.describe(graph, m)))
            elif n.base == "aten::rsqrt":
                m = self._rms(graph, n.index)
                if m is not None:
                    out.append(m._replace(detail=self.describe(graph, m)))
        return out

    def _rms(self, graph: SemGraph, rsqrt: int) -> Match | None:
        def prod(v: int, ops: frozenset[str]) -> Any:
            p = graph.values[v].producer
            return graph.nodes[p] if p >= 0 and graph.nodes[p].base in ops else None

        r = graph.nodes[rsqrt]
        add = prod(r.inputs[0], frozenset({"aten::add"}))
        mean = prod(add.inputs[0], frozenset({"aten::mean"})) if add is not None else None
        sq = prod(mean.inputs[0], frozenset({"aten::pow", "aten::mul"})) if mean is not None else None
        if sq is None:
            return None
        x = sq.inputs[0]
        nodes = {rsqrt, add.index, mean.index, sq.index}
        out = None
        for c in graph.consumers(r.outputs[0]):
            cn = graph.nodes[c]
            if cn.base == "aten::mul" and graph.origin(x) in {graph.origin(i) for i in cn.inputs}:
                nodes.add(c)
                out = graph.nodes[c].outputs[0]
                break
        if out is None:
            return None
        roles = {"input": x, "out": out}
        for c, _ in graph.through_views(out):
            cn = graph.nodes[c]
            w = [i for i in cn.inputs if _is_weight(graph, i)]
            if cn.base == "aten::mul" and w:
                nodes.add(c)
                roles["weight"] = w[0]
                roles["out"] = cn.outputs[0]
                nodes.update(q for q in range(min(nodes), c) if graph.nodes[q].base in PASSTHROUGH_OPS
                             and graph.nodes[q].inputs and graph.origin(graph.nodes[q].inputs[0]) == graph.origin(out))
                break
        return Match(self.name, 0.85, tuple(sorted(nodes)), roles, {"kind": "rms_norm"})

    def describe(self, graph: SemGraph, match: Match) -> dict:
        x = graph.values[match.roles["input"]].shape
        kind = match.detail.get("kind", "")
        if kind in ("batch_norm", "group_norm"):
            features = x[1] if len(x) > 1 else 0
        else:
            features = x[-1] if x else 0
        numel = 1
        for d in x:
            numel *= d
        return {"kind": kind, "features": features, "rows": numel // max(features, 1)}


# ---- registry -----------------------------------------------------------------------------------

_REGISTRY: dict[str, Pattern] = {}


def register(pattern: Pattern, *, replace: bool = False) -> Pattern:
    """Adds `pattern` to the registry (run after those already there). Raises ValueError when a
    pattern of that name is registered and `replace` is False, TypeError for a non-Pattern."""
    if not isinstance(pattern, Pattern):
        raise TypeError(f"register: {pattern!r} is not a Pattern")
    if not pattern.name:
        raise ValueError("register: a pattern needs a name")
    if pattern.name in _REGISTRY and not replace:
        raise ValueError(f"register: a pattern named {pattern.name!r} is registered (pass replace=True)")
    _REGISTRY[pattern.name] = pattern
    _bump_generation()
    return pattern


def unregister(name: str) -> None:
    """Removes the pattern `name`; KeyError if there is none."""
    del _REGISTRY[name]
    _bump_generation()


def patterns() -> tuple[Pattern, ...]:
    """The registered patterns, in the order they run."""
    return tuple(_REGISTRY.values())


_GENERATION = [0]


def _bump_generation() -> None:
    _GENERATION[0] += 1


def registry_generation() -> int:
    """Changes whenever the registry does (the analysis cache keys on it)."""
    return _GENERATION[0]


def find_matches(graph: SemGraph, pats: Iterable[Pattern] | None = None) -> list[Match]:
    """All matches of `pats` (default: the registry) in `graph`, in registry then program order."""
    out: list[Match] = []
    for p in (patterns() if pats is None else pats):
        if p.applies(graph):
            out.extend(sorted(p.match(graph), key=lambda m: m.nodes))
    return out


for _p in (AttentionPattern(), KVCachePattern(), ConvBlockPattern(), MLPPattern(), EmbeddingPattern(), NormPattern()):
    register(_p)
del _p
