"""The captured graph: small immutable op records and the values that flow between them.

Structure taken from tinygrad's UOp (`tinygrad/uop/ops.py`): the graph node is a tiny slotted
record `(op, args, kwargs, num_outputs)`; everything else (which tensors are alive, which
handle a value got on the node) lives in `Value`, not on the node.

- `Node`: one recorded aten op. `op` is the `torch._ops.OpOverload` (e.g. `aten.addmm.default`);
  `args`/`kwargs` hold `Value` for tensor arguments, `Constant` for CPU tensors that travel
  inline, and plain Python values (ints, floats, dtypes, lists) for the rest. `seq` is its
  position in program order: the node executes ops in that order, so aliasing and in-place
  semantics are PyTorch's own.
- `Value`: one tensor value. Either *pending* (`node` is the op that will produce it, output
  `index`) or *resident* (`handle`: 16 bytes naming it on the node). `storage` groups values
  that alias the same memory (views, in-place results): an op that writes a storage must run
  whenever any tensor of that storage is still alive.
- `Storage`: an aliasing group and the number of live LazyTensors on it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import torch

# RunGraph output actions (schemas/genie.fbs OutputAction) and residency classes (Residency).
RETURN, KEEP, RETURN_AND_KEEP, KEEP_AND_DESCRIBE = 0, 1, 2, 3
ACTIVATION, WEIGHT, KV_CACHE = 0, 1, 2


def new_handle() -> bytes:
    """A fresh unguessable 128-bit handle (the OS's CSPRNG)."""
    return os.urandom(16)

_sequence = itertools.count()


class Storage:
    """Values that alias one memory region; `live` counts the LazyTensors on it; `written`
    says that some recorded op writes it (then no value on it has a host copy)."""

    __slots__ = ("live", "written", "__weakref__")

    def __init__(self) -> None:
        self.live = 0
        self.written = False


class Value:
    """A tensor value: pending (`node`, `index`) or resident on the node (`handle`).

    `tensors` counts the live LazyTensors whose current value this is; a resident value whose
    count drops to 0 is freed on the node (batched). `residency` is the wire class it is kept
    under (0 activation, 1 weight, 2 KV cache, 3 gradient). `host` is its exact contents on the
    host when known (a CPU tensor, see `genie.host_eval`), else None.
    """

    __slots__ = ("node", "index", "handle", "storage", "tensors", "residency", "dtype", "error", "host",
                 "__weakref__")

    def __init__(self, node: "Node | None", index: int, storage: Storage, dtype: torch.dtype,
                 handle: bytes | None = None, residency: int = 0) -> None:
        self.node = node
        self.index = index
        self.handle = handle
        self.storage = storage
        self.tensors = 0
        self.residency = residency
        self.dtype = dtype
        self.error: BaseException | None = None  # set when the value is lost (failed run, node gone)
        self.host: torch.Tensor | None = None

    def __repr__(self) -> str:
        if self.node is not None:
            return f"%{self.node.seq}.{self.index}"
        return f"<resident {self.handle.hex()[:8] if self.handle else 'freed'}>"


@dataclass(frozen=True, slots=True)
class Constant:
    """A CPU tensor used by an op (a 0-dim scalar tensor): it travels inline with the run."""

    tensor: torch.Tensor


class Node:
    """One recorded op. Immutable after construction; `outputs` are its `Value`s in order."""

    __slots__ = ("op", "args", "kwargs", "num_outputs", "seq", "outputs", "writes", "__weakref__")

    def __init__(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, num_outputs: int,
                 writes: tuple[Storage, ...] = ()) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.num_outputs = num_outputs
        self.seq = next(_sequence)
        self.outputs: tuple[Value, ...] = ()
        self.writes = writes  # storages this op mutates (in-place and out= ops)

    def inputs(self) -> list:
        """The `Value`s this node reads, in argument order."""
        out = []
        for a in self.args:
            t = type(a)
            if t is Value:
                out.append(a)
            elif t is list or t is tuple:
                out.extend(x for x in a if type(x) is Value)
        if self.kwargs:
            for a in self.kwargs.values():
                t = type(a)
                if t is Value:
                    out.append(a)
                elif t is list or t is tuple:
                    out.extend(x for x in a if type(x) is Value)
        return out

    def __repr__(self) -> str:
        def show(a: Any) -> str:
            if type(a) in (list, tuple):
                return "[" + ", ".join(show(x) for x in a) + "]"
            if type(a) is Constant:
                return f"const{tuple(a.tensor.shape)}"
            return repr(a)

        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        outs = ", ".join(f"%{self.seq}.{i}" for i in range(self.num_outputs))
        return f"{outs} = {self.op}({', '.join(parts)})"


class Graph:
    """A snapshot of recorded nodes in program order (what `genie.get_graph()` returns)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = list(nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def ops(self) -> list[str]:
        """The aten overload names, e.g. ["aten::randn", "aten::add.Tensor"]."""
        return [op_name(n.op) for n in self.nodes]

    def __repr__(self) -> str:
        return "\n".join(repr(n) for n in self.nodes)


def op_name(op: torch._ops.OpOverload) -> str:
    """`aten::add.Tensor` / `aten::relu` (the overload is omitted when it is `default`)."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
