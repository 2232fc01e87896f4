"""Shape rules: output descriptors computed in Python for ops whose shapes change every step.

The recorder infers an op's output descriptors by running it on meta tensors and caches the
result by the arguments' shapes. In autoregressive decoding the KV cache grows by one position
per step, so `aten::cat` (appending to the cache) and `aten::scaled_dot_product_attention`
(reading it) see new shapes every step and always miss that cache. On meta, SDPA runs its
math decomposition (about ten Python-level reference ops), which made it the most expensive
op to record in a GPT-2 decode step (≈9% of capture). Elementwise `add`, `sub`, `mul`, `div`
and `clone` miss too when an input is a view whose storage offset moves each step (the
position `cache_position[-1:] + 1`, a new int scalar each step): their meta kernels run
torch's Python references, 0.15-0.6 ms per call on the development VM.

A rule returns exactly what the meta kernel returns, `(structure, descs)` as in
`recorder._infer_shapes`, for the common, unambiguous cases it checks for; for anything else
(type promotion, broadcasting, channels-last inputs, invalid arguments, ...) it returns None
and the meta kernel decides (and raises PyTorch's error where there is one).
tests/python/test_shape_rules.py compares every rule with the meta kernel.
"""

from __future__ import annotations

import torch
from torch._prims_common import make_contiguous_strides_for


aten = torch.ops.aten


# genie.lazy.LazyTensor, set by genie.lazy when it is imported: the shapes layer is below
# capture and reads LazyTensors' descriptors without importing it.
lazy_type: type | None = None


def _lazy_desc(t):
    """The descriptor (shape, strides, offset, dtype) of a LazyTensor, else None."""
    return t._desc if type(t) is lazy_type else None


def _new_desc(shape: tuple, dtype) -> tuple:
    return (shape, tuple(make_contiguous_strides_for(shape)), 0, dtype)


def _strides_like_channels_last_4d(shape: tuple, strides: tuple) -> bool:
    """c10::is_channels_last_strides_2d_s4 (c10/core/MemoryFormat.h): whether
    `suggest_memory_format()` of a 4-D tensor says channels_last."""
    if strides[1] == 0:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        if shape[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:
            return False
        smallest = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def cat_shapes(args: tuple, kwargs: dict):
    """aten::cat(Tensor[] tensors, int dim=0): same-dtype tensors of one rank (1-4), equal
    sizes except along `dim`, none channels_last-like (the output is then contiguous, as
    `cat_compute_output_memory_format` decides). None otherwise."""
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if type(tensors) not in (list, tuple) or not tensors or type(dim) is not int:
        return None
    descs = [_lazy_desc(t) for t in tensors]
    first = descs[0]
    if first is None:
        return None
    shape0, _, _, dtype = first
    rank = len(shape0)
    if not 1 <= rank <= 4 or not -rank <= dim < rank:
        return None
    dim %= rank
    total = 0
    for desc in descs:
        if desc is None or desc[3] != dtype or len(desc[0]) != rank:
            return None
        shape, strides = desc[0], desc[1]
        if rank == 1 and shape[0] == 0:
            return None  # a legacy empty tensor: cat skips it
        if any(shape[d] != shape0[d] for d in range(rank) if d != dim):
            return None
        if rank == 4 and _strides_like_channels_last_4d(shape, strides):
            return None
        total += shape[dim]
    out_shape = shape0[:dim] + (total,) + shape0[dim + 1:]
    return "T", [_new_desc(out_shape, dtype)]


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def sdpa_shapes(args: tuple, kwargs: dict):
    """aten::scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
    is_causal=False, *, scale=None, enable_gqa=False) for 4-D floating query (B, H, L, E),
    key (B, H, S, E) and value (B, H, S, Ev) of one dtype, with no dropout or GQA, and an
    optional bool or same-dtype mask that broadcasts to (B, H, L, S): a contiguous
    (B, H, L, Ev) output of query's dtype. None otherwise."""
    if len(args) < 3 or kwargs.get("enable_gqa"):
        return None
    q, k, v = (_lazy_desc(t) for t in args[:3])
    if q is None or k is None or v is None:
        return None
    mask = args[3] if len(args) > 3 else None
    dropout_p = args[4] if len(args) > 4 else 0.0
    is_causal = args[5] if len(args) > 5 else False
    if dropout_p != 0.0 or (mask is not None and is_causal):
        return None
    (qs, _, _, dtype), (ks, _, _, kdtype), (vs, _, _, vdtype) = q, k, v
    if not dtype.is_floating_point or kdtype != dtype or vdtype != dtype:
        return None
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return None
    if qs[:2] != ks[:2] or ks[:2] != vs[:2] or qs[3] != ks[3] or ks[2] != vs[2] or 0 in qs + ks + vs:
        return None
    if mask is not None:
        m = _lazy_desc(mask)
        if m is None or (m[3] != torch.bool and m[3] != dtype):
            return None
        if not _broadcasts_to(m[0], (qs[0], qs[1], qs[2], ks[2])):
            return None
    return "T", [_new_desc((qs[0], qs[1], qs[2], vs[3]), dtype)]


def _dense(shape: tuple, strides: tuple) -> bool:
    """c10's is_contiguous (TensorImpl::compute_contiguous): default strides for every dimension
    of size > 1 (the strides of size-1 dimensions do not matter); any offset."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 0:
            return True
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


# The Python scalars an elementwise op takes beside a tensor without changing its dtype
# (torch.result_type: a wrapped number promotes only to a higher category). Not bool: `sub`
# refuses a bool operand.
_KEEPS_FLOAT = (int, float)
_KEEPS_INT = (int,)


def _binary_shapes(integers: bool):
    def rule(args: tuple, kwargs: dict):
        """aten::add.Tensor, sub.Tensor, mul.Tensor, div.Tensor(self, other) without keyword
        arguments: two contiguous tensors (c10's sense, any storage offset) of one shape and
        one dtype, or such a tensor and a Python scalar that does not promote it: a new
        contiguous tensor of that shape and dtype. Floating dtypes; integer dtypes (not bool)
        for add, sub and mul (integer div is true division). None otherwise (broadcasting,
        promotion, other layouts: the meta kernel decides)."""
        if kwargs or len(args) != 2:
            return None
        a = _lazy_desc(args[0])
        if a is None:
            return None
        shape, strides, _, dtype = a
        if dtype.is_floating_point:
            keeps = _KEEPS_FLOAT
        elif integers and not dtype.is_complex and dtype != torch.bool:
            keeps = _KEEPS_INT
        else:
            return None
        if not _dense(shape, strides):
            return None
        other = args[1]
        if type(other) not in keeps:
            b = _lazy_desc(other)
            if b is None or b[3] != dtype or tuple(b[0]) != tuple(shape) or not _dense(b[0], b[1]):
                return None
        return "T", [_new_desc(tuple(shape), dtype)]

    return rule


def clone_shapes(args: tuple, kwargs: dict):
    """aten::clone(self, *, memory_format=None): with `torch.contiguous_format`, a new contiguous
    tensor; with None or `torch.preserve_format`, the same when `self` has exactly the default
    strides (any offset; preserve copies the strides of a dense input, size-1 dimensions
    included). None otherwise."""
    if len(args) != 1 or set(kwargs) - {"memory_format"}:
        return None
    a = _lazy_desc(args[0])
    if a is None:
        return None
    memory_format = kwargs.get("memory_format")
    if memory_format is torch.contiguous_format or (
            memory_format in (None, torch.preserve_format) and tuple(a[1]) == tuple(make_contiguous_strides_for(a[0]))):
        return "T", [_new_desc(tuple(a[0]), a[3])]
    return None


RULES = {
    id(aten.cat.default): cat_shapes,
    id(aten.scaled_dot_product_attention.default): sdpa_shapes,
    id(aten.add.Tensor): _binary_shapes(integers=True),
    id(aten.sub.Tensor): _binary_shapes(integers=True),
    id(aten.mul.Tensor): _binary_shapes(integers=True),
    id(aten.div.Tensor): _binary_shapes(integers=False),
    id(aten.clone.default): clone_shapes,
}
