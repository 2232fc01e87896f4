"""Execution phases: per node and per graph.

Phases: "prefill", "decode" (an LLM step), "vision" (a convolutional network), "forward"
(any other forward pass), "backward", "optimizer".

Rules, in order (seed 000 §4.3's phases; the prefill/decode split read from shapes):

1. Region of each node (structural, `regions`):
   - backward: a `*_backward*` op (`convolution_backward`, `_softmax_backward_data`,
     `threshold_backward`, ...), a node reading an incoming gradient (a "gradient"-kind input,
     AOTAutograd's `tangents_*`), or the autograd seed (`ones_like`/`full_like` of a 0-dim
     reduction result, the loss); and every node reading a value a backward node made, except
     the optimizer's updates below (so the next step's forward, recorded in the same graph as
     this step's update, reads updated weights, not gradients). A
     graph built with ``backward=True`` (AOTAutograd's backward graph) is backward throughout.
   - optimizer: an in-place write into a weight (`sub_`, `add_`, `addcdiv_`, `copy_`, ... whose
     written tensor is a parameter, or a parameter already updated in place in the graph), a `_foreach_*` op writing tensors or a `_fused_adam*` /
     `_fused_sgd*` op; and, walking back, every node whose outputs only such nodes read
     (the learning-rate scaling of a gradient).
   - forward: the rest.
2. The forward phase of the graph (`assign`, from shapes):
   - an LLM step when a KV-cache match feeds an attention, or an attention reads a longer key
     than its query with a single query token: "decode" when each of them takes one new token
     per sequence (the KV-cache write's new length, the attention's query length: one token
     against the cache), else "prefill" (the prompt's tokens at once, writing the cache from
     its start; also a chunk of a chunked prefill);
   - else "vision" when convolution blocks hold at least half of the forward FLOPs;
   - else "forward".
3. Per node: backward and optimizer regions keep their name; forward nodes inside a
   convolution block are "vision"; other forward nodes take the graph's forward phase.
4. The graph's phase: "backward" if any node is backward (a training step's graph), else
   "optimizer" if optimizer FLOPs are at least the forward FLOPs, else the forward phase.
"""
from __future__ import annotations

from typing import Sequence

from .cost import Cost
from .graph import SemGraph
from .patterns import Match

PHASES = ("prefill", "decode", "vision", "forward", "backward", "optimizer")

_SEED_OPS = frozenset({"aten::ones_like", "aten::full_like", "aten::new_ones", "aten::new_full"})
_LOSS_OPS = frozenset({"aten::sum", "aten::mean", "aten::nll_loss_forward", "aten::mse_loss", "aten::nll_loss",
                       "aten::cross_entropy_loss", "aten::binary_cross_entropy", "aten::l1_loss",
                       "aten::smooth_l1_loss", "aten::binary_cross_entropy_with_logits", "aten::huber_loss"})
_OPTIMIZER_PREFIXES = ("aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")


def _is_backward_op(base: str) -> bool:
    return "_backward" in base


def _is_seed(graph: SemGraph, n) -> bool:
    """The autograd seed: a ones/full-like of a 0-dim value a reduction (the loss) made."""
    if n.base not in _SEED_OPS or not n.inputs:
        return False
    v = graph.values[n.inputs[0]]
    if v.shape != () or v.producer < 0:
        return False
    return graph.nodes[v.producer].base in _LOSS_OPS


def _optimizer_ops(graph: SemGraph) -> list[bool]:
    """Per node: an optimizer update (rule 1): a fused optimizer op, a `_foreach_*` op that
    writes, or an in-place write into a weight, also one already updated in place in this
    graph (AdamW's decay `p.mul_` then `p.addcdiv_`)."""
    updated: set[int] = set()  # values that are a weight after in-place updates
    out = []
    for n in graph.nodes:
        opt = (n.base.startswith(_OPTIMIZER_PREFIXES) or (n.base.startswith("aten::_foreach_") and bool(n.writes))
               or any(graph.values[o].kind == "weight" or o in updated for o in map(graph.origin, n.writes)))
        if opt:
            updated.update(n.outputs)
        out.append(opt)
    return out


def regions(graph: SemGraph) -> tuple[str, ...]:
    """"forward", "backward" or "optimizer" for every node (rule 1 of the module docstring)."""
    region = ["backward" if graph.backward else "forward"] * len(graph.nodes)
    opt = _optimizer_ops(graph)
    if not graph.backward:
        grad_values: set[int] = {vid for vid, v in graph.values.items() if v.kind == "gradient"}
        for n in graph.nodes:
            if opt[n.index]:  # an update reads gradients; what it writes (the weights) is not one
                continue
            if (_is_backward_op(n.base) or _is_seed(graph, n) or any(i in grad_values for i in n.inputs)):
                region[n.index] = "backward"
                grad_values.update(n.outputs)
    outputs = set(graph.outputs)
    for n in reversed(graph.nodes):  # nodes only optimizer nodes read
        if opt[n.index] or not n.outputs or any(o in outputs for o in n.outputs):
            continue
        readers = {c for o in n.outputs for c in graph.consumers(o)}
        if readers and all(opt[c] for c in readers):
            opt[n.index] = True
    for i, o in enumerate(opt):
        if o:
            region[i] = "optimizer"
    return tuple(region)


def llm_phase(matches: Sequence[Match]) -> str | None:
    """"prefill" or "decode" when the matches make an LLM step (rule 2), else None."""
    new_tokens = [m.detail.get("new_len", 0) for m in matches if m.pattern == "kv_cache"]
    new_tokens += [m.detail.get("q_len") for m in matches if m.pattern == "attention"
                   and m.detail.get("q_len") == 1 and m.detail.get("kv_len", 1) > 1]
    if not new_tokens:
        return None
    return "decode" if all(t == 1 for t in new_tokens) else "prefill"


def assign(graph: SemGraph, matches: Sequence[Match], region: Sequence[str],
           costs: Sequence[Cost]) -> tuple[tuple[str, ...], str]:
    """(phase per node, phase of the graph) by rules 2-4 of the module docstring."""
    conv_nodes = {i for m in matches if m.pattern == "conv_block" for i in m.nodes}
    fwd_flops = sum(c.flops for c, r in zip(costs, region) if r == "forward")
    opt_flops = sum(c.flops for c, r in zip(costs, region) if r == "optimizer")
    conv_flops = sum(costs[i].flops for i in conv_nodes if region[i] == "forward")
    forward = llm_phase(matches)
    if forward is None:
        forward = "vision" if conv_nodes and conv_flops * 2 >= fwd_flops else "forward"
    per_node = tuple(
        r if r != "forward" else ("vision" if i in conv_nodes else forward)
        for i, r in enumerate(region))
    if "backward" in region:
        overall = "backward"
    elif "optimizer" in region and opt_flops >= fwd_flops:
        overall = "optimizer"
    else:
        overall = forward
    return per_node, overall
