"""Host evaluation: a read the host can answer exactly, without a round trip to the node.

Programs often read small integer values derived from tensors they uploaded themselves:
HuggingFace checks `attention_mask.all()` before choosing an attention path, `generate`
checks `(input_ids < 0).any()`. Such a read would cost a round trip (and a run of its
subgraph) although the host already has everything the answer depends on.

A value's *host copy* (`Value.host`, a CPU tensor) is its exact contents, known on the host:
- small uploads (`Runtime.upload`, and the inline copies a `tensor.to(device)` records as
  `aten::alias` of a `Constant`) are their own host copies;
- a pending value whose subgraph reads only values with host copies is computed on the
  host's CPU when the program reads it (`host_value`), if every op of it is *exact*:
  integer or bool tensors only (in and out: integer arithmetic and comparisons give the same
  bits on every device, floating point does not), deterministic (no random op, no `empty`,
  no sort whose tie order may differ), writes nothing, and every tensor is at most
  `MAX_BYTES`.
The node still runs those ops when the program uses the values there: host evaluation only
answers reads. `GENIE_HOST_EVAL=0` (or `genie.host_eval.enabled = False`) sends every read to
the node (perf/op_coverage.py does, to test the node's kernels). A storage that any recorded op writes (in-place, `out=`, `copy_`) never gets
host copies again (`Storage.written`): a write would make copies of its views stale.
"""

from __future__ import annotations

import torch

from . import config
from .graph import Constant, Value
from .ops import op_info

enabled = config.get("GENIE_HOST_EVAL")
MAX_BYTES = 64 * 1024  # a tensor larger than this is never kept or computed on the host (bytes)
MAX_NODES = 64         # ops one read may evaluate on the host

# Ops never evaluated on the host (aten names without the namespace, by prefix): uninitialized
# memory, storage tricks, orders of ties that may differ between devices, and ops the node's
# accelerator may refuse for integers (a host answer would hide the node's error).
_DENIED_PREFIXES = ("empty", "new_empty", "resize", "set_", "as_strided", "sort", "argsort", "msort", "topk",
                    "kthvalue", "unique", "_unique", "mode", "median", "nanmedian", "_local_scalar_dense", "mm",
                    "bmm", "addmm", "matmul", "conv", "_conv", "baddbmm", "addbmm", "dot", "vdot", "mv")
_op_exact: dict[int, bool] = {}
_CPU = torch.device("cpu")


class _NotExact(Exception):
    """The value cannot be computed exactly on the host (internal)."""


def small(t: torch.Tensor) -> bool:
    return t.numel() * t.element_size() <= MAX_BYTES


def exact_dtype(dtype: torch.dtype) -> bool:
    """Integer and bool dtypes: their ops give the same bits on every device."""
    return not (dtype.is_floating_point or dtype.is_complex)


def host_copy_of_upload(data: torch.Tensor, snapshot: bool = True) -> torch.Tensor | None:
    """The host copy to keep for an uploaded tensor, or None: only small integer and bool
    tensors get one. Floating-point values never do, even uploaded ones: some ops write
    tensors their schemas do not declare written (`aten::native_batch_norm` updates its
    running statistics in place), so only the node knows them for sure. `snapshot` clones
    `data` (the program may change its own tensor later)."""
    if not (exact_dtype(data.dtype) and small(data)):
        return None
    return data.detach().clone() if snapshot else data


def host_value(value: Value) -> torch.Tensor | None:
    """`value`'s exact contents computed on the host, or None (then the node must answer).
    Values computed on the way keep their host copies (`Value.host`)."""
    if not enabled or not exact_dtype(value.dtype):
        return None
    try:
        with torch.no_grad(), torch._C._DisableTorchDispatch():
            return _host_of(value, [MAX_NODES])
    except _NotExact:
        return None


def _op_is_exact(op) -> bool:
    known = _op_exact.get(id(op))
    if known is None:
        info = op_info(op)  # what the schema says: writes, seeded, returns
        name = op._schema.name.split("::", 1)[-1]
        known = not (info.writes or info.seeded or info.python_impl is not None or not info.tensor_returns
                     or name.startswith(_DENIED_PREFIXES))
        _op_exact[id(op)] = known
    return known


def _host_of(value: Value, budget: list) -> torch.Tensor:
    if value.storage.written:
        raise _NotExact
    if value.host is not None:
        return value.host
    node = value.node
    if node is None or budget[0] <= 0 or node.writes or not _op_is_exact(node.op):
        raise _NotExact
    if not all(exact_dtype(v.dtype) for v in node.outputs):
        raise _NotExact
    budget[0] -= 1
    args = tuple(_host_arg(a, budget) for a in node.args)
    kwargs = {k: _host_arg(a, budget) for k, a in node.kwargs.items()}
    try:
        out = node.op(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the node will report its own error
        raise _NotExact from error
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    if len(outs) != len(node.outputs):
        raise _NotExact
    for v, t in zip(node.outputs, outs):
        if isinstance(t, torch.Tensor) and t.dtype == v.dtype and small(t):
            v.host = t
    if value.host is None:
        raise _NotExact
    return value.host


def _host_arg(a, budget: list):
    t = type(a)
    if t is Value:
        if not exact_dtype(a.dtype):
            raise _NotExact
        return _host_of(a, budget)
    if t is Constant:
        if not exact_dtype(a.tensor.dtype):
            raise _NotExact
        return a.tensor
    if t is list or t is tuple:
        return t(_host_arg(x, budget) for x in a)
    if t is torch.device and a.type != "cpu":
        return _CPU
    return a

