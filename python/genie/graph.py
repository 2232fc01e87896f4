"""The IR layer: the captured graph, owned by C++ (python/csrc/frontend/ir.h).

- `Node`: one recorded aten op: `op` (the OpOverload, e.g. `aten.addmm.default`), `args` and
  `kwargs` as Python dispatch shows them (device tensors as their `Value`s, 0-dim host tensors as
  themselves: they travel inline), `outputs` (its `Value`s), `writes` (the `Storage`s it
  mutates), `seq` (program order: the node runs ops in that order, so aliasing and in-place
  semantics are PyTorch's own). Made whole by the recorder (or `Recording.append_node`), never
  changed after.
- `Value`: one tensor value, pending (`node`, output `index`) or resident on the node
  (`handle`: 16 bytes naming it there). Its IR fields (`storage`, `dtype`, `index`) are fixed;
  the rest (`handle`, `residency`, `tensors`, `error`, `host`) is the runtime's books.
- `Storage`: values that alias one memory region (views, in-place results); `live` counts the
  LazyTensors on it.

Structure from tinygrad's UOp (tinygrad/uop/ops.py): a small immutable record per op, the
runtime's state outside it.
"""

from __future__ import annotations

import os

import torch

from . import _C
from ._C import Node, Storage, Value  # noqa: F401 - the IR's classes

# RunGraph output actions (schemas/genie.fbs OutputAction) and residency classes (Residency),
# as the schema's generated header defines them.
_ACTIONS = _C.wire_enum("OutputAction")
RETURN, KEEP, RETURN_AND_KEEP, KEEP_AND_DESCRIBE = (
    _ACTIONS[n] for n in ("Return", "KeepResident", "ReturnAndKeep", "KeepAndDescribe"))
RESIDENCY: dict[str, int] = _C.wire_enum("Residency")  # {"EphemeralActivation": 0, ...}
ACTIVATION, WEIGHT, KV_CACHE, GRADIENT = (
    RESIDENCY[n] for n in ("EphemeralActivation", "PersistentWeight", "StatefulKvCache", "Gradient"))


def new_handle() -> bytes:
    """A fresh unguessable 128-bit handle (the OS's CSPRNG)."""
    return os.urandom(16)


class Graph:
    """A snapshot of recorded nodes in program order (what `genie.get_graph()` returns)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = list(nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def ops(self) -> list[str]:
        """The aten overload names, e.g. ["aten::randn", "aten::add.Tensor"]."""
        return [n.name for n in self.nodes]

    def __repr__(self) -> str:
        return "\n".join(repr(n) for n in self.nodes)


def op_name(op: torch._ops.OpOverload) -> str:
    """`aten::add.Tensor` / `aten::relu` (the overload is omitted when it is `default`)."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
