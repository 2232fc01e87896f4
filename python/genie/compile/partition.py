"""Graph passes of the genie backend: which aten nodes the node can run, and the split.

- `NodeSupport`: an FX node the node's executor runs (src/node/executor.cc finds ops in the
  dispatcher by name): an aten `OpOverload` (or a `getitem` of one's tuple) whose tensor
  arguments and results are all on remote_accelerator, that the C++ recorder records as it is
  (genie.ops `route`: not a host transfer, not a Python-only or scalar-returning op), and that
  returns tensors only (no host scalar: `aten::_local_scalar_dense` is a host read), that
  writes no graph input but by a write-back (a functionalized graph's `copy_(input, updated)`
  of a KV cache or a BatchNorm statistic: the part writes its input in place, declared by
  `genie::call_graph`'s `written`), and that is no view of an input the graph returns (a
  forward graph's `t(weight)` saved for the backward stays outside, recorded as eager records
  it), so that a part's outputs own their memory: the node may run it as a compiled package.
  Everything else (Python custom ops, `prims`, host reads, ops on CPU tensors) is a host part.
- `partition(gm, why)`: `CapabilityBasedPartitioner` (torch.fx.passes.infra.partitioner) groups
  the supported nodes into submodules `fused_<i>`; unsupported nodes stay in the outer graph,
  each with its reason in `why` (`NodeSupport.why_not`: what genie.explain shows).
  A write-back stays outside when its part would run before a node outside it that reads the
  input (that node reads the value before the write, in program order).
- `retarget_devices(gm, device)`: factory calls that name the CPU (`torch.arange(n,
  device="cpu")`, a graph traced from CPU inputs) name `device` instead.
"""
from __future__ import annotations

import copy
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


def _is_write_back(node: torch.fx.Node) -> bool:
    """`aten.copy_(input, value)` of a graph input (a functionalized graph's write-back)."""
    return (node.target is torch.ops.aten.copy_.default and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].op == "placeholder")


class NodeSupport(OperatorSupportBase):
    """Which FX nodes the node's executor runs (see the module docstring); `kept_out`: names
    of write-back nodes to keep outside the parts."""

    def __init__(self, kept_out: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.kept_out = kept_out

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return self.why_not(node) is None

    def why_not(self, node: torch.fx.Node) -> str | None:
        """None when the node's executor can run `node` in a part; else why not, in words."""
        if node.op != "call_function":
            return f"an FX {node.op} node, not a call"
        if node.target is operator.getitem:
            return None if _on_device(node.meta.get("val")) else "an item of a result not on remote_accelerator"
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return (f"{target} is not an aten operator (a Python custom op or prims: the node's executor "
                    "finds aten ops by name)")
        info = ops.op_info(target)
        if info.route not in _NODE_ROUTES:
            return (f"genie.ops routes {target} as '{info.route}' (a host transfer, a Python-only or a "
                    "scalar-returning op), not recorded as it is")
        if _is_write_back(node):
            if node.name in self.kept_out:
                return "a write-back whose part would run before an op outside it that reads the input"
        elif any(i < len(node.args) and isinstance(node.args[i], torch.fx.Node) and node.args[i].op == "placeholder"
                 for i in info.writes):
            return "writes a graph input in place and is no write-back"  # kept outside parts
        if (info.returns and any(u.op == "output" for u in node.users)
                and all(kind == "view" and i < len(node.args) and isinstance(node.args[i], torch.fx.Node)
                        and node.args[i].op == "placeholder" for kind, i in info.returns)):
            return "a view of an input that the graph returns (t(weight) saved for the backward)"

        if not _on_device(node.meta.get("val")):
            return "its results are not all tensors on remote_accelerator (a host scalar or a CPU tensor)"
        for arg in node.all_input_nodes:
            if not all(v is None or not isinstance(v, torch.Tensor) or v.device.type == _DEVICE
                       for v in _values(arg.meta.get("val"))):
                return f"reads {arg.name}, which is not on remote_accelerator"
        return None


def partition(gm: torch.fx.GraphModule, why: dict[str, str] | None = None) -> torch.fx.GraphModule:
    """`gm` with its supported nodes fused into submodules `fused_<i>` (in place; returned).
    `why`, when given, receives for each call node that is not supported its name -> the
    reason (`NodeSupport.why_not`), found before fusing, while the nodes' metadata is whole."""
    has_write_backs = any(_is_write_back(n) for n in gm.graph.nodes)
    original = copy.deepcopy(gm) if has_write_backs else None
    support = NodeSupport()
    _reasons(gm, support, why)
    split = _fuse(gm, support)
    misplaced = _misplaced_write_backs(split) if has_write_backs else frozenset()
    if not misplaced:
        return split
    support = NodeSupport(kept_out=misplaced)
    _reasons(original, support, why)
    return _fuse(original, support)


def _reasons(gm: torch.fx.GraphModule, support: NodeSupport, why: dict[str, str] | None) -> None:
    if why is None:
        return
    for node in gm.graph.nodes:
        if node.op == "call_function":
            reason = support.why_not(node)
            if reason is not None:
                why[node.name] = reason


def _fuse(gm: torch.fx.GraphModule, support: NodeSupport) -> torch.fx.GraphModule:
    return CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).partition_and_fuse()


def _misplaced_write_backs(split: torch.fx.GraphModule) -> frozenset[str]:
    """The write-backs fused into a part that runs before an outer node reading their input."""
    order = {n: k for k, n in enumerate(split.graph.nodes)}
    misplaced = set()
    for call in split.graph.nodes:
        if call.op != "call_module" or not is_part(str(call.target)):
            continue
        sub = split.get_submodule(str(call.target))
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for node in sub.graph.nodes:
            if node.op != "call_function" or not _is_write_back(node):
                continue
            outer = call.args[placeholders.index(node.args[0])]
            if any(user is not call and order[user] > order[call] for user in outer.users):
                misplaced.add(node.name)
    return frozenset(misplaced)


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
