"""Graph passes of the genie backend: which aten nodes the node can run, and the split.

- `NodeSupport`: an FX node the node's executor runs (src/node/executor.cc finds ops in the
  dispatcher by name): an aten `OpOverload` (or a `getitem` of one's tuple) whose tensor
  arguments and results are all on remote_accelerator, that the C++ recorder records as it is
  (genie.ops `route`: not a host transfer, not a Python-only or scalar-returning op), and that
  returns tensors only (no host scalar: `aten::_local_scalar_dense` is a host read), and
  that neither writes a graph input nor is a view of one that the graph returns (a functionalized graph's `copy_`
  back into a KV cache or a BatchNorm statistic, a forward graph's `t(weight)` saved for the
  backward stay outside the parts, recorded as eager records them), so that a part is a pure
  function whose outputs own their memory: the node may run it as a compiled package.
  Everything else (Python custom ops, `prims`, host reads, ops on CPU tensors) is a host part.
- `partition(gm)`: `CapabilityBasedPartitioner` (torch.fx.passes.infra.partitioner) groups
  the supported nodes into submodules `fused_<i>`; unsupported nodes stay in the outer graph.
- `retarget_devices(gm, device)`: factory calls that name the CPU (`torch.arange(n,
  device="cpu")`, a graph traced from CPU inputs) name `device` instead.
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .. import ops

_NODE_ROUTES = frozenset({"record", "same_value", "composite", "to_copy", "copy", "index"})
_DEVICE = "remote_accelerator"


def _values(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v)
    else:
        yield value


def _on_device(value) -> bool:
    """Every tensor in `value` (an FX node's `meta["val"]`) is on remote_accelerator, and it
    holds nothing but tensors and None."""
    items = list(_values(value))
    return bool(items) and all(v is None or (isinstance(v, torch.Tensor) and v.device.type == _DEVICE)
                               for v in items)


class NodeSupport(OperatorSupportBase):
    """Which FX nodes the node's executor runs (see the module docstring)."""

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return _on_device(node.meta.get("val"))
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return False
        info = ops.op_info(target)
        if info.route not in _NODE_ROUTES:
            return False
        if any(i < len(node.args) and isinstance(node.args[i], torch.fx.Node) and node.args[i].op == "placeholder"
               for i in info.writes):
            return False  # an in-place update of an input (a KV cache, BN statistics): kept outside parts
        if (info.returns and any(u.op == "output" for u in node.users)
                and all(kind == "view" and i < len(node.args) and isinstance(node.args[i], torch.fx.Node)
                        and node.args[i].op == "placeholder" for kind, i in info.returns)):
            return False  # a view of an input the graph returns (t(weight) saved for the backward): outside

        if not _on_device(node.meta.get("val")):
            return False
        for arg in node.all_input_nodes:
            if not all(v is None or not isinstance(v, torch.Tensor) or v.device.type == _DEVICE
                       for v in _values(arg.meta.get("val"))):
                return False
        return True


def partition(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with its supported nodes fused into submodules `fused_<i>` (in place; returned)."""
    partitioner = CapabilityBasedPartitioner(gm, NodeSupport(), allows_single_node_partition=True)
    return partitioner.partition_and_fuse()


def is_part(name: str) -> bool:
    """Whether a submodule of `partition`'s result is a node part."""
    return name.startswith("fused_")


def retarget_devices(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Factory calls whose `device` is the CPU name `device` instead (in place). Returns how
    many were changed."""
    changed = 0
    for node in gm.graph.nodes:
        where = node.kwargs.get("device")
        if where is not None and torch.device(where).type == "cpu":
            node.kwargs = {**node.kwargs, "device": device}
            changed += 1
    if changed:
        gm.recompile()
    return changed
