"""Data movement between the host and remote_accelerator, as the recorder meets it.

`aten::_to_copy` and `aten::copy_` / `aten::_copy_from` upload host tensors (parameters as
PersistentWeight), download device tensors (materialization: the pending graph runs and only
the bytes read come back), or are recorded when both sides are on one device (the C++ recorder
records those itself; they reach this module only when they cross the host);
`aten::_local_scalar_dense` (`.item()`) reads one value; pinning is refused for device tensors
as PyTorch refuses it for CUDA ones. Part of the capture layer (docs/frontend.md "Layers").
"""
from __future__ import annotations

import torch

from . import _C, progress
from .recorder import _PRIVATEUSE1, record_op, runtime_for, runtime_of

aten = torch.ops.aten


def to_copy(func, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    target = torch.device(device) if device is not None else src.device
    if target.type == _PRIVATEUSE1:
        if _C.is_lazy(src) and src.device.index == (target.index if target.index is not None else _C.current_device()):
            return record_op(func, args, kwargs)
        cpu = src.cpu() if _C.is_lazy(src) else src
        converted = _host_conversion(cpu, kwargs)
        # Keyed by the source's host bytes when nothing was converted (tied weights upload once).
        uploaded = runtime_for(target).upload_tensor(converted, residency_of(src),
                                                     source=cpu if converted is cpu else None)
        progress.moved(src, target)  # a module's tensor: its module.to's bar
        return uploaded
    # To the host (or another local device): fetch, then let PyTorch convert.
    fetched = runtime_of(src).fetch(src)
    progress.moved(src, target)
    rest = {k: v for k, v in kwargs.items() if k not in ("non_blocking",)}
    if fetched.dtype == rest.get("dtype", fetched.dtype) and target.type == "cpu" and not rest.get("pin_memory"):
        return fetched
    return aten._to_copy.default(fetched, **rest)


def _host_conversion(cpu: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """`cpu` converted on the host as a `_to_copy` to the device asks (dtype, memory format);
    `cpu` itself when nothing changes."""
    dtype = kwargs.get("dtype")
    memory_format = kwargs.get("memory_format")
    if dtype is not None and dtype != cpu.dtype:
        cpu = cpu.to(dtype)
    if memory_format is not None and memory_format != torch.preserve_format:
        cpu = cpu.contiguous(memory_format=memory_format)
    return cpu


def residency_of(t: torch.Tensor) -> int:
    """PersistentWeight (1) for parameters, EphemeralActivation (0) otherwise."""
    return 1 if isinstance(t, torch.nn.Parameter) else 0


def copy(func, args, kwargs):
    """aten::copy_(dst, src) and aten::_copy_from(src, dst): uploads, downloads or records."""
    if func is aten._copy_from.default:
        src, dst = args[0], args[1]
    else:
        dst, src = args[0], args[1]
    if _C.is_lazy(dst):
        if _C.is_lazy(src) and src.device == dst.device:
            return record_op(aten.copy_.default, (dst, src), {})
        cpu = src.cpu() if _C.is_lazy(src) else src
        runtime_of(dst).copy_from_host(dst, cpu, residency_of(src))
        return dst
    # Device to host: materialize, then copy locally.
    dst.copy_(runtime_of(src).fetch(src))
    return dst


def local_scalar_dense(func, args, kwargs):
    return runtime_of(args[0]).fetch(args[0]).item()


def is_pinned(func, args, kwargs):
    return False


def pin_memory(func, args, kwargs):
    """aten::_pin_memory of a device tensor: PyTorch's error for a CUDA tensor (the node would
    otherwise try, and a CPU node fail naming the NVIDIA driver)."""
    raise RuntimeError(f"cannot pin '{args[0].device}' tensor: only dense CPU tensors can be pinned")


HANDLERS = {
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy,
    aten._copy_from.default: copy,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.is_pinned.default: is_pinned,
    aten._pin_memory.default: pin_memory,
}
# Handled here only when they cross the host; the C++ recorder records them on one device.
CONDITIONAL = frozenset({aten._to_copy.default, aten.copy_.default})
