"""FLOPs and bytes per op from shapes, arithmetic intensity, and roofline time estimates.

Units: FLOP (floating-point operations; a multiply-add counts 2) and bytes. Sources:

- Matrix products, convolutions and attention follow PyTorch's flop counter
  (`torch/utils/flop_counter.py`: `mm_flop`, `bmm_flop`, `conv_flop_count`,
  `conv_backward_flop`, `sdpa_flop_count`, `sdpa_backward_flop_count`): 2·M·N·K for an
  [M, K]·[K, N] product (bias adds not counted, as there); 2·N·C_out·(C_in/groups)·∏K·∏out
  for a convolution (the transposed case over the input's spatial size); 2·B·H·L_q·L_k·D +
  2·B·H·L_q·L_k·D_v (= 4·B·H·L_q·L_k·D) for scaled dot-product attention, the softmax and a
  causal mask's savings not counted.
- Elementwise ops: 1 FLOP per output element; transcendental functions and activations count
  1 too (the counting convention of roofline analyses, Williams, Waterman and Patterson,
  "Roofline: an insightful visual performance model", CACM 2009, where the point is the
  ratio of work to traffic; PyTorch's flop counter counts these ops as 0).
- Softmax: 5 FLOP per element (max, subtract, exp, sum, divide); normalizations (layer, batch,
  group, RMS): 5 per element (mean, variance, subtract, scale, shift); reductions (sum, mean,
  amax): 1 per input element; optimizer ops over tensor lists (`_foreach_*`, `_fused_adam_`):
  1 per element written.
- Bytes: every tensor input read once plus every output written once (dense sizes from
  shapes and dtypes), except: views move nothing (0); gathers (`embedding`, `index_select`,
  `gather`, `index`) read only the rows they return; in-place writes into part of a tensor
  (`index_copy_`, `index_put_`, `copy_` into a slice, `scatter_`) read and write only the
  written part (the source's size), not the whole destination.

The roofline time of work W (FLOP) moving Q bytes on a node of peak rate F (FLOP/s) and
memory bandwidth B (B/s) is max(W/F, Q/B) (Williams et al. 2009). The node's measured F and
B come from the scheduler's calibration; this module holds only the formulas.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .graph import VIEW_OPS, Node, SemGraph, Value, itemsize


class Cost(NamedTuple):
    """Work and memory traffic of an op or a group: `flops` (FLOP), `bytes` (B)."""

    flops: float
    bytes: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity (FLOP/B)."""
        return arithmetic_intensity(self.flops, self.bytes)

    def __add__(self, other: "Cost") -> "Cost":  # type: ignore[override]
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


ZERO = Cost(0.0, 0)


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOP per byte; 0 for no work, `inf` for work without traffic."""
    if nbytes <= 0:
        return math.inf if flops > 0 else 0.0
    return flops / nbytes


def estimate_time_s(flops: float, nbytes: float, node_flops_per_s: float, node_bytes_per_s: float) -> float:
    """Roofline time (s) of `flops` (FLOP) moving `nbytes` (B) on a node with peak compute
    `node_flops_per_s` (FLOP/s) and memory bandwidth `node_bytes_per_s` (B/s):
    max(flops / F, bytes / B) (Williams et al. 2009). Raises ValueError for a rate <= 0."""
    if node_flops_per_s <= 0 or node_bytes_per_s <= 0:
        raise ValueError("estimate_time_s: node rates must be positive")
    return max(flops / node_flops_per_s, nbytes / node_bytes_per_s)


# ---- formulas -----------------------------------------------------------------------------------

def mm_flops(m: int, k: int, n: int, batch: int = 1) -> float:
    """2·batch·M·N·K: an [M, K]·[K, N] product (flop_counter.mm_flop / bmm_flop)."""
    return 2.0 * batch * m * n * k


def conv_flops(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...],
               transposed: bool = False) -> float:
    """2·N·C_out·C_in_per_group·∏kernel·∏spatial (flop_counter.conv_flop_count).

    `w_shape` is [C_out, C_in/groups, k...] ([C_in, C_out/groups, k...] when transposed), so
    groups are accounted for by the weight's shape; spatial is the output's (the input's when
    transposed)."""
    batch = x_shape[0]
    spatial = (x_shape if transposed else out_shape)[2:]
    c_out, c_in, *kernel = w_shape
    return 2.0 * batch * c_out * c_in * math.prod(kernel) * math.prod(spatial)


def sdpa_flops(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> float:
    """2·B·H·L_q·L_k·D + 2·B·H·L_q·L_k·D_v for q [B, H, L_q, D], k [B, H_kv, L_k, D],
    v [B, H_kv, L_k, D_v] (flop_counter.sdpa_flop_count; GQA broadcasts KV heads to H)."""
    b, h, lq, d = q[-4:] if len(q) >= 4 else (1, 1, *q[-2:])
    lk = k[-2]
    dv = v[-1]
    return 2.0 * b * h * lq * lk * d + 2.0 * b * h * lq * lk * dv


def sdpa_backward_flops(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> float:
    """flop_counter.sdpa_backward_flop_count: scores recomputed (2·B·H·L_q·L_k·D), dP and dV
    (2·2·B·H·L_q·L_k·D_v), dQ and dK (2·2·B·H·L_q·L_k·D)."""
    b, h, lq, d = q[-4:] if len(q) >= 4 else (1, 1, *q[-2:])
    lk = k[-2]
    dv = v[-1]
    return 2.0 * b * h * lq * lk * (3 * d + 2 * dv)


# ---- per-op costs -------------------------------------------------------------------------------

def _shape(g: SemGraph, vid: int) -> tuple[int, ...]:
    return g.values[vid].shape


def _nbytes(v: Value) -> int:
    return math.prod(v.shape) * itemsize(v.dtype)


def _io_bytes(g: SemGraph, n: Node) -> int:
    return sum(_nbytes(g.values[i]) for i in n.inputs) + sum(_nbytes(g.values[o]) for o in n.outputs)


def _out_numel(g: SemGraph, n: Node) -> int:
    return sum(math.prod(g.values[o].shape) for o in n.outputs[:1])


def _matmul(g: SemGraph, n: Node) -> float:
    if n.base in ("aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation"):
        a, b = _shape(g, n.inputs[1]), _shape(g, n.inputs[2])
    else:
        a, b = _shape(g, n.inputs[0]), _shape(g, n.inputs[1])
    out = _shape(g, n.outputs[0])
    if n.base == "aten::linear":  # x [..., K] · Wᵀ [K, N]
        return 2.0 * math.prod(out) * a[-1]
    k = a[-1] if a else 1
    return 2.0 * math.prod(out) * k  # 2·(batch·M·N)·K for mm, bmm, matmul with broadcasting


def _conv(g: SemGraph, n: Node) -> float:
    x, w, out = _shape(g, n.inputs[0]), _shape(g, n.inputs[1]), _shape(g, n.outputs[0])
    return conv_flops(x, w, out, bool(n.attr("transposed", False)))


def _conv_backward(g: SemGraph, n: Node) -> float:
    """flop_counter.conv_backward_flop: grad_input as a transposed conv, grad_weight as a conv."""
    grad_out, x, w = _shape(g, n.inputs[0]), _shape(g, n.inputs[1]), _shape(g, n.inputs[2])
    mask = n.attr("output_mask", (True, True, True))
    transposed = bool(n.attr("transposed", False))
    total = 0.0
    if mask[0]:
        total += conv_flops(grad_out, w, x, not transposed)
    if mask[1]:
        def t(s: tuple[int, ...]) -> tuple[int, ...]:
            return (s[1], s[0], *s[2:])

        if transposed:
            total += conv_flops(t(grad_out), t(x), t(w))
        else:
            total += conv_flops(t(x), t(grad_out), t(w))
    return total


def _sdpa(g: SemGraph, n: Node) -> float:
    q, k, v = (_shape(g, i) for i in n.inputs[:3])
    if n.base in ("aten::_flash_attention_forward", "aten::_efficient_attention_forward"):  # [B, L, H, D]
        q, k, v = ((s[0], s[2], s[1], s[3]) for s in (q, k, v))
    return sdpa_flops(q, k, v)


def _sdpa_backward(g: SemGraph, n: Node) -> float:
    q, k, v = (_shape(g, i) for i in n.inputs[1:4])  # (grad_out, query, key, value, ...)
    return sdpa_backward_flops(q, k, v)


def _per_out(factor: float) -> Callable[[SemGraph, Node], float]:
    return lambda g, n: factor * _out_numel(g, n)


def _per_in(factor: float) -> Callable[[SemGraph, Node], float]:
    return lambda g, n: factor * math.prod(_shape(g, n.inputs[0])) if n.inputs else 0.0


_ELEMENTWISE = (
    "add add_ sub sub_ mul mul_ div div_ rsub neg pow pow_ exp exp_ log log_ sqrt rsqrt reciprocal abs tanh tanh_ "
    "sigmoid sigmoid_ erf relu relu_ gelu gelu_ silu silu_ hardswish hardswish_ hardtanh hardtanh_ leaky_relu "
    "leaky_relu_ mish elu selu celu softplus clamp clamp_ clamp_min clamp_min_ clamp_max where masked_fill "
    "masked_fill_ maximum minimum eq ne lt le gt ge logical_and logical_or logical_not bitwise_and bitwise_or "
    "bitwise_not sign floor ceil round trunc sin cos lerp lerp_ addcmul addcmul_ addcdiv addcdiv_ fill_ "
    "threshold threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward hardswish_backward "
    "native_dropout dropout native_dropout_backward"
).split()
_REDUCTIONS = "sum mean amax amin max min prod var var_mean std argmax argmin logsumexp norm linalg_vector_norm".split()

FLOP_FORMULAS: dict[str, Callable[[SemGraph, Node], float]] = {}
for _op in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation"):
    FLOP_FORMULAS[f"aten::{_op}"] = _matmul
for _op in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution",
            "_slow_conv2d_forward", "convolution_overrideable", "conv_transpose1d", "conv_transpose2d",
            "conv_transpose3d", "miopen_convolution"):
    FLOP_FORMULAS[f"aten::{_op}"] = _conv
FLOP_FORMULAS["aten::convolution_backward"] = _conv_backward
for _op in ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
            "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
            "_efficient_attention_forward"):
    FLOP_FORMULAS[f"aten::{_op}"] = _sdpa
for _op in ("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward"):
    FLOP_FORMULAS[f"aten::{_op}"] = _sdpa_backward
for _op in _ELEMENTWISE:
    FLOP_FORMULAS[f"aten::{_op}"] = _per_out(1.0)
for _op in _REDUCTIONS:
    FLOP_FORMULAS[f"aten::{_op}"] = _per_in(1.0)
for _op in ("_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax", "_softmax_backward_data",
            "_log_softmax_backward_data"):
    FLOP_FORMULAS[f"aten::{_op}"] = _per_out(5.0)
for _op in ("native_layer_norm", "layer_norm", "native_batch_norm", "_native_batch_norm_legit_no_training",
            "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "batch_norm", "cudnn_batch_norm",
            "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm", "instance_norm",
            "_batch_norm_with_update", "_batch_norm_no_update", "native_layer_norm_backward",
            "native_batch_norm_backward", "native_group_norm_backward", "_fused_rms_norm_backward"):
    FLOP_FORMULAS[f"aten::{_op}"] = _per_out(5.0)
for _op in ("nll_loss_forward", "nll_loss_backward", "mse_loss", "mse_loss_backward"):
    FLOP_FORMULAS[f"aten::{_op}"] = _per_in(1.0)

_GATHERS = frozenset({"aten::embedding", "aten::index_select", "aten::gather", "aten::index",
                      "aten::embedding_bag", "aten::_embedding_bag"})
_PARTIAL_WRITES = frozenset({"aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_", "aten::copy_",
                             "aten::scatter_", "aten::index_add_", "aten::slice_scatter", "aten::select_scatter",
                             "aten::index_copy", "aten::index_put"})
_NO_TRAFFIC = VIEW_OPS | frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::_assert_async",
                                    "aten::sym_size", "aten::sym_numel"})


def node_bytes(g: SemGraph, n: Node) -> int:
    """Bytes an op reads and writes (see the module docstring for the exceptions)."""
    base = n.base
    if base in _NO_TRAFFIC:
        return 0
    if base in _GATHERS:
        idx = sum(_nbytes(g.values[i]) for i in n.inputs[1:])
        return idx + 2 * sum(_nbytes(g.values[o]) for o in n.outputs)
    if base in _PARTIAL_WRITES and n.inputs:
        small = sum(_nbytes(g.values[i]) for i in n.inputs[1:])
        if n.writes or base in ("aten::index_copy", "aten::index_put", "aten::slice_scatter", "aten::select_scatter"):
            # in place: read the source and the indices, write the source's size into the destination;
            # out of place: the same plus a copy of the destination (read + write)
            extra = 0 if n.writes else 2 * _nbytes(g.values[n.inputs[0]])
            src = _nbytes(g.values[n.inputs[-1]])
            return small + src + extra
    return _io_bytes(g, n)


def node_cost(g: SemGraph, n: Node) -> Cost:
    """FLOPs (0 for ops without a formula: data movement, creation) and bytes of one op."""
    f = FLOP_FORMULAS.get(n.base)
    if f is not None and n.outputs:
        flops = f(g, n)
    elif n.base.startswith(("aten::_foreach_", "aten::_fused_")):
        # optimizer updates over tensor lists: 1 FLOP per element of every tensor written or made
        flops = float(sum(math.prod(g.values[v].shape) for v in (n.writes or n.outputs)))
    else:
        flops = 0.0
    return Cost(float(flops), node_bytes(g, n))


def graph_costs(g: SemGraph) -> tuple[Cost, ...]:
    """`node_cost` of every node, in program order."""
    return tuple(node_cost(g, n) for n in g.nodes)


def total(costs: "list[Cost] | tuple[Cost, ...]", nodes: "list[int] | tuple[int, ...] | None" = None) -> Cost:
    """The sum of `costs` over `nodes` (all when None)."""
    sel = costs if nodes is None else (costs[i] for i in nodes)
    f = 0.0
    b = 0
    for c in sel:
        f += c.flops
        b += c.bytes
    return Cost(f, b)
