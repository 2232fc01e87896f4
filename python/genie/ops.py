"""The ops layer: what an aten op's schema says, computed once per OpOverload.

`op_info(func)` reads the schema of an `OpOverload` (torch.ops.aten.add.Tensor, ...): which
outputs are new tensors, views or written arguments, which arguments it writes, whether it
returns tensors, whether it is a Python custom op, draws random numbers, or is a
CompositeImplicitAutograd op. The capture layer plans each op from it; host evaluation asks it
which ops are exact on the host. Imports torch and genie.graph only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from .graph import op_name


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What the schema says about an op's outputs, computed once per OpOverload.

    `returns[i]` is ("new", None), ("view", arg) or ("write", arg) where arg is the positional
    index (int) or keyword name (str) of the argument the output aliases. `writes` are the
    arguments the op mutates. `tensor_returns` is False when the op returns Python scalars.
    `python_impl` is set for a Python custom op (`torch.library.custom_op`): genie-node runs
    C++ kernels only, so its Python implementation runs on the LazyTensors instead and the
    aten ops it calls are recorded (see `_python_impl`). `seeded` ops draw from the device's
    random generator (tag `nondeterministic_seeded`: randn's `normal_`, dropout, bernoulli):
    they are recorded as writing the runtime's generator (`Runtime.rng`), so none is dropped
    as dead and each draws in program order, as locally. `composite` ops have a
    CompositeImplicitAutograd kernel and no remote_accelerator (PrivateUse1) kernel: PyTorch
    decomposes them above autograd, so they reach the recorder only where autograd is
    skipped (`torch.inference_mode()`, whose tensors have no autograd keys); they are then
    decomposed here as PyTorch would (`OpOverload.decompose`), never recorded whole.
    """

    returns: tuple[tuple[str, int | str | None], ...]
    writes: tuple[int | str, ...]
    tensor_returns: bool
    list_return: bool
    python_impl: Any = None
    seeded: bool = False
    composite: bool = False


_op_infos: dict[Any, OpInfo] = {}


def _is_tensor_type(t) -> bool:
    kind = t.kind()
    if kind == "OptionalType":
        return _is_tensor_type(t.getElementType())
    return kind == "TensorType"


def op_info(func) -> OpInfo:
    info = _op_infos.get(func)
    if info is not None:
        return info
    schema = func._schema
    alias_to_arg: dict[str, int | str] = {}
    writes: list[int | str] = []
    for i, arg in enumerate(schema.arguments):
        where = arg.name if arg.kwarg_only else i
        if arg.alias_info is not None:
            for name in arg.alias_info.before_set:
                alias_to_arg[name] = where
            if arg.alias_info.is_write:
                writes.append(where)
    writes.extend(w for w in _UNDECLARED_WRITES.get(op_name(func), ()) if w not in writes)
    returns = []
    tensor_returns = True
    list_return = False
    for ret in schema.returns:
        t = ret.type
        if t.kind() == "ListType" and _is_tensor_type(t.getElementType()):
            list_return = True
        elif not _is_tensor_type(t):
            tensor_returns = False
        alias = ret.alias_info
        alias_set = alias.before_set if alias is not None else set()
        if list_return and not alias_set and len(schema.returns) == 1:
            alias_set = _list_return_alias(schema)
        if not alias_set:
            returns.append(("new", None))
            continue
        arg = alias_to_arg.get(next(iter(alias_set)))
        returns.append(("write" if alias is not None and alias.is_write else "view", arg))
    name = func.name()
    composite = (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
                 and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"))
    info = OpInfo(tuple(returns), tuple(writes), tensor_returns, list_return, _python_impl(func),
                  torch.Tag.nondeterministic_seeded in func.tags, composite)
    _op_infos[func] = info
    return info


# Ops that write arguments their schemas do not mark written: aten::native_batch_norm updates
# running_mean and running_var (arguments 3 and 4) in training mode. Without the write, a
# forward whose output is discarded (torch.optim.swa_utils.update_bn) would be dropped as dead
# and the statistics never updated. (In eval mode the node is then kept where it could be
# dropped: conservative.)
_UNDECLARED_WRITES = {"aten::native_batch_norm": (3, 4)}

_LIST_ALIAS = re.compile(r"^Tensor\((\w+)\)\[\]$")


def _list_return_alias(schema) -> set[str]:
    """The alias set of a `Tensor(a)[]` return (aten::split, unbind, chunk: every element is a
    view of `a`). The schema's Python binding gives such a list's alias info an empty set (the
    alias is on the elements), so it is read from the schema's text."""
    match = _LIST_ALIAS.match(str(schema).rsplit(" -> ", 1)[1].strip())
    return {match.group(1)} if match else set()


def _python_impl(func):
    """The device-agnostic Python implementation of a `torch.library.custom_op`, or None for
    any other op. A custom op with only device-specific kernels (`device_types="cpu"`) gets a
    function that raises NotImplementedError naming the op and the devices it supports."""
    if func._schema.name.split("::", 1)[0] in ("aten", "prims"):
        return None
    try:
        from torch._library.custom_ops import _maybe_get_opdef
        opdef = _maybe_get_opdef(func)
        kernels = dict(opdef._backend_fns) if opdef is not None else {}
    except (ImportError, AttributeError):  # a torch without Python custom ops: record as usual
        return None
    if opdef is None:
        return None  # a C++ operator: the node runs it if it has it registered
    if None in kernels:
        return kernels[None]
    devices = ", ".join(sorted(str(d) for d in kernels)) or "none"

    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"{op_name(func)} is a Python custom op with kernels for {devices} only; "
                                  f"register one for remote_accelerator or a device-agnostic one "
                                  f"(torch.library.custom_op without device_types)")
    return unsupported
