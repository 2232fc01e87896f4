"""The ops layer: what an aten op's schema says, read once per OpOverload.

The facts come from the C++ recorder's own reading of the schema (`genie._C.op_facts`,
python/csrc/frontend/op_facts.h): one implementation for both. Python adds what only Python
knows: the Python implementation of a `torch.library.custom_op` (genie-node runs C++ kernels
only, so such an op's device-agnostic Python implementation runs on the LazyTensors instead and
the aten ops it calls are recorded).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _C
from .graph import op_name


@dataclass(frozen=True, slots=True)
class OpInfo:
    """`returns[i]` is ("new", -1), ("view", arg) or ("write", arg), arg the schema index of the
    argument the output aliases; `writes` the argument indices the op mutates; `list_return`
    whether it returns one Tensor[]; `seeded` whether it draws from the device's generator;
    `route` how the C++ recorder takes it ("record", "python", "composite", "scalar", ...);
    `python_impl` the Python implementation of a Python custom op (None for any other op)."""

    returns: tuple[tuple[str, int], ...]
    writes: tuple[int, ...]
    list_return: bool
    seeded: bool
    route: str
    python_impl: Any = None


_op_infos: dict[int, OpInfo] = {}


def op_info(func) -> OpInfo:
    info = _op_infos.get(id(func))  # by id: hashing an OpOverload runs Python
    if info is None:
        facts = _C.op_facts(func)
        info = OpInfo(facts["returns"], facts["writes"], facts["list_return"], facts["seeded"], facts["route"],
                      _python_impl(func))
        _op_infos[id(func)] = info
    return info


def _python_impl(func):
    """The device-agnostic Python implementation of a `torch.library.custom_op`, or None for
    any other op. A custom op with only device-specific kernels (`device_types="cpu"`) gets a
    function that raises NotImplementedError naming the op and the devices it supports."""
    if func._schema.name.split("::", 1)[0] in ("aten", "prims", "genie"):
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
