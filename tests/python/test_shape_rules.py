"""The C++ shape rules (python/csrc/frontend/shapes.h) against the meta kernels: a rule either
answers exactly what the meta kernel answers (shapes, strides, offset, dtype) or declines (None);
it never answers where the meta kernel raises."""

import itertools
import random

import pytest
import torch

import genie
from genie import _C

DEV = "remote_accelerator:0"
aten = torch.ops.aten


def lazy(shape, strides=None, dtype=torch.float32):
    """A LazyTensor with exactly these sizes and strides (default: contiguous)."""
    if strides is None:
        return torch.empty(shape, dtype=dtype, device=DEV)
    return torch.empty_strided(shape, strides, dtype=dtype, device=DEV)


def permuted(shape, order, dtype=torch.float32):
    """A contiguous tensor of the permuted shape, permuted back: `shape` with strides in `order`."""
    base = lazy([shape[d] for d in order], dtype=dtype)
    return base.permute([order.index(d) for d in range(len(shape))])


def meta(a):
    """The oracle's argument: a meta tensor of a LazyTensor's geometry."""
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(meta(x) for x in a)
    return a


def check(op, args, kwargs=None):
    """Returns True when the rule answered; asserts it answered as the meta kernel would."""
    kwargs = kwargs or {}
    answer = _C.shape_rule(op, args, kwargs)
    try:
        out = op(*meta(args), **{k: meta(v) for k, v in kwargs.items()})
    except Exception as error:  # noqa: BLE001 - the rule must not answer for invalid arguments
        assert answer is None, f"{op}: the meta kernel raised {error!r}, the rule answered {answer}"
        return False
    expected = [(tuple(out.shape), tuple(out.stride()), out.storage_offset(), out.dtype)]
    if answer is not None:
        assert answer == expected, f"{op}: rule {answer} != meta {expected}"
    return answer is not None


def test_decode_step_shapes_take_the_rules():
    # GPT-2 decode: the cache (contiguous) gains the new key (a transposed view) along dim -2,
    # and one query position attends over the whole cache.
    cache = lazy((1, 12, 7, 64))
    new_key = lazy((1, 1, 12, 64)).transpose(1, 2)
    assert check(aten.cat.default, ([cache, new_key], -2))
    query = lazy((1, 1, 12, 64)).transpose(1, 2)
    key = value = lazy((1, 12, 8, 64))
    assert check(aten.scaled_dot_product_attention.default, (query, key, value))
    assert check(aten.scaled_dot_product_attention.default, (query, key, value, None, 0.0, False), {"scale": 0.125})
    mask = lazy((1, 1, 1, 8), dtype=torch.bool)
    assert check(aten.scaled_dot_product_attention.default, (query, key, value, mask))


def test_cat_rule_matches_meta_on_random_layouts():
    rng = random.Random(0)
    answered = 0
    for _ in range(300):
        rank = rng.randint(1, 4)
        shape = [rng.choice([0, 1, 1, 2, 3]) for _ in range(rank)]
        dim = rng.randint(-rank - 1, rank)
        tensors = []
        for _ in range(rng.randint(1, 3)):
            s = list(shape)
            if -rank <= dim < rank:
                s[dim % rank] = rng.randint(0, 3)
            if rng.random() < 0.1:
                s = [rng.randint(1, 3) for _ in range(rank)]  # mismatched sizes: meta raises
            if rng.random() < 0.05:
                s = [0]  # a legacy empty tensor
            order = list(range(len(s)))
            rng.shuffle(order)
            dtype = torch.float16 if rng.random() < 0.1 else torch.float32
            tensors.append(permuted(s, order, dtype))
        answered += check(aten.cat.default, (tensors, dim) if dim else (tensors,))
    assert answered > 50  # the common cases are covered


def test_cat_declines_channels_last_inputs():
    x = lazy((2, 3, 4, 5)).contiguous(memory_format=torch.channels_last)
    assert not check(aten.cat.default, ([x, x], 1))


def test_sdpa_rule_matches_meta_on_shape_variations():
    answered = 0
    for (b, h, lq, s, e, ev), kv_batch, dtype, mask_shape, mask_dtype, causal in itertools.product(
            [(1, 2, 1, 5, 4, 4), (2, 3, 4, 4, 8, 6), (1, 1, 3, 0, 4, 4)],
            [None, (1,)],                       # key/value batch: same, or broadcast (declined)
            [torch.float32, torch.int64],
            [None, (1, 1, 1, -1), (-1,), (2, 2, 2, 2, 2)],
            [torch.bool, torch.float32, torch.int32],
            [False, True]):
        kb = kv_batch[0] if kv_batch else b
        q = lazy((b, h, lq, e), dtype=dtype)
        k = lazy((kb, h, s, e), dtype=dtype)
        v = lazy((kb, h, s, ev), dtype=dtype)
        mask = None
        if mask_shape is not None:
            mask = lazy(tuple(s if n == -1 else n for n in mask_shape), dtype=mask_dtype)
        answered += check(aten.scaled_dot_product_attention.default, (q, k, v, mask, 0.0, causal))
    assert answered >= 6
    q = lazy((1, 2, 3, 4))
    # Dropout is random and GQA regroups heads: the rule leaves both to the meta kernel.
    assert _C.shape_rule(aten.scaled_dot_product_attention.default, (q, q, q, None, 0.5, False), {}) is None
    assert _C.shape_rule(aten.scaled_dot_product_attention.default, (q, q, q), {"enable_gqa": True}) is None


@pytest.mark.parametrize("op", [aten.cat.default, aten.scaled_dot_product_attention.default])
def test_recorded_ops_use_the_rule(op):
    # The recorder asks the rule first: a plan-cache miss of these ops is answered by the rule,
    # not by the meta kernel.
    x = lazy((3, 5, 41, 7))  # shapes no other test records (no cached plan)
    before = _C.recorder_counters()
    out = torch.cat([x, x], 2) if op is aten.cat.default else torch.nn.functional.scaled_dot_product_attention(x, x, x)
    after = _C.recorder_counters()
    assert out.shape == ((3, 5, 82, 7) if op is aten.cat.default else (3, 5, 41, 7))
    assert genie.lazy.operation(out) == genie.graph.op_name(op)
    assert (after["rule"] - before["rule"], after["meta"] - before["meta"]) == (1, 0)
