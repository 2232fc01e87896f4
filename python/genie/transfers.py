"""Data movement between the host and remote_accelerator, as the recorder meets it.

`aten::_to_copy` and `aten::copy_` / `aten::_copy_from` upload host tensors (parameters as
PersistentWeight), download device tensors (materialization: the pending graph runs and only
the bytes read come back), move a tensor from one remote device to another node to node
(`_node_to_node`: the source node sends it to the destination node's session, the bytes never
pass through this process), or are recorded when both sides are on one device (the C++ recorder
records those itself; they reach this module only when they cross the host or a node);
`aten::_local_scalar_dense` (`.item()`) reads one value; pinning is refused for device tensors
as PyTorch refuses it for CUDA ones. A quantized tensor (per-tensor affine) travels as its
integer representation: `aten::int_repr` recorded on the node before a read, and
`aten::_make_per_tensor_quantized_tensor` after an upload; its quantizer never leaves the host. Part of the capture layer (docs/frontend.md "Layers").
"""
from __future__ import annotations

import torch

from . import _C, progress
from .graph import ACTIVATION, WEIGHT, Value, new_handle
from .lazy import lock
from .record import _PRIVATEUSE1, record_op, runtime_for, runtime_of

aten = torch.ops.aten


def to_copy(func, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    target = torch.device(device) if device is not None else src.device
    if target.type == _PRIVATEUSE1:
        index = target.index if target.index is not None else _C.current_device()
        if _C.is_lazy(src) and src.device.index == index:
            return record_op(func, args, kwargs)
        if _C.is_lazy(src):
            moved = _node_to_node(src, torch.device(_PRIVATEUSE1, index), kwargs)
            if moved is not None:
                progress.moved(src, target)
                return moved
        # A lazy tensor of another node (no node-to-node path) or a tensor of a local GPU: through
        # this host's memory (the client sends host memory only).
        cpu = src.cpu() if _C.is_lazy(src) or src.device.type != "cpu" else src
        if cpu.is_quantized:
            return _upload_quantized(cpu, torch.device(_PRIVATEUSE1, index))
        converted = _host_conversion(cpu, kwargs)
        # Keyed by the source's host bytes when nothing was converted (tied weights upload once).
        uploaded = runtime_for(target).upload_tensor(converted, residency_of(src),
                                                     source=cpu if converted is cpu else None)
        progress.moved(src, target)  # a module's tensor: its module.to's bar
        return uploaded
    # To the host (or another local device): fetch, then let PyTorch convert.
    fetched = fetch(src)
    progress.moved(src, target)
    rest = {k: v for k, v in kwargs.items() if k not in ("non_blocking",)}
    if fetched.dtype == rest.get("dtype", fetched.dtype) and target.type == "cpu" and not rest.get("pin_memory"):
        return fetched
    return aten._to_copy.default(fetched, **rest)


def fetch(src: torch.Tensor) -> torch.Tensor:
    """`src` (a LazyTensor) as a host tensor: `Runtime.fetch`; for a quantized tensor, its
    integer representation fetched (`aten::int_repr`, recorded) and quantized again on the host
    with `src`'s scale and zero point. NotImplementedError for quint4x2 and quint2x4, whose
    integer representation unpacks them."""
    runtime = runtime_of(src)
    if not src.is_quantized:
        return runtime.fetch(src)
    if src.dtype not in (torch.qint8, torch.quint8, torch.qint32):
        raise NotImplementedError(f"reading a {src.dtype} tensor from remote_accelerator is not supported; "
                                  "dequantize() it on the device first")
    ints = runtime.fetch(aten.int_repr.default(src))
    return torch._make_per_tensor_quantized_tensor(ints, src.q_scale(), src.q_zero_point())


def _upload_quantized(cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A quantized host tensor on `device`: its integer representation uploaded, quantized
    again there with its scale and zero point (per-tensor affine; NotImplementedError for another
    scheme)."""
    if cpu.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        raise NotImplementedError(f"{cpu.qscheme()} quantized tensors are not supported on remote_accelerator "
                                  "(per-tensor affine only)")
    if cpu.dtype not in (torch.qint8, torch.quint8, torch.qint32):
        raise NotImplementedError(f"uploading a {cpu.dtype} tensor to remote_accelerator is not supported")
    ints = cpu.int_repr().to(device)
    return aten._make_per_tensor_quantized_tensor.default(ints, cpu.q_scale(), cpu.q_zero_point())


def _node_to_node(src, target: torch.device, kwargs: dict):
    """`src.to(target, **kwargs)` for a LazyTensor on another remote device, node to node: the
    source made resident on its node (the pending graph runs if it is not), a dtype conversion
    recorded there first, then one SendTensors to the source's node names the target node's
    address, token and session and a fresh handle; the new LazyTensor on `target` holds that
    handle: contiguous, with the source's shape and dtype (as the host path makes it). This
    process sends one small request; the bytes go from node to node.

    None (the caller takes the host path: fetch, then upload) when a memory format other than
    contiguous is asked, or when either runtime keeps host copies (`keep_host_copy`: a rebuilt
    node needs the host bytes, which only the host path has). Raises the source node's
    GenieRemoteError (PeerUnreachable naming the target's address, the target's refusal) or
    GenieConnectionError."""
    memory_format = kwargs.get("memory_format")
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
        return None
    if runtime_of(src).lineage is not None or runtime_for(target).lineage is not None:
        return None  # before a conversion is recorded for nothing
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype != src.dtype:
        src = src.to(dtype=dtype)  # recorded on the source's device: converted by its node
    moved = _send([src], target)
    return None if moved is None else moved[0]


def move_many(tensors, target: torch.device) -> list:
    """`[t.to(target) for t in tensors]` (target: a remote_accelerator device), where the
    LazyTensors on one other remote device go node to node in one SendTensors per source device
    (see `_node_to_node`); the others (host tensors, and those `_node_to_node` would send
    through the host) move one by one. Raises as `tensor.to` does."""
    with lock:  # the process lock, as the dispatcher holds it for tensor.to
        return _move_many(list(tensors), target)


def _move_many(out: list, target: torch.device) -> list:
    by_source: dict = {}
    for i, t in enumerate(out):
        if t.device != target and _C.is_lazy(t):
            by_source.setdefault(t.device, []).append(i)
    for device, positions in by_source.items():
        unique: list = []  # each tensor sent once, however often it is listed
        for i in positions:
            if not any(out[i] is t for t in unique):
                unique.append(out[i])
        if len(unique) < 2:
            continue
        moved = _send(unique, target)
        if moved is not None:
            for t, m in zip(unique, moved):
                progress.moved(t, target)
            for i in positions:
                out[i] = next(m for t, m in zip(unique, moved) if t is out[i])
    return [t if t.device == target else t.to(target) for t in out]


def _send(srcs: list, target: torch.device):
    """LazyTensors of one remote device sent to `target`'s node in one SendTensors: each made
    resident on its node first (one run of the pending graph when any is pending); the new
    LazyTensors hold fresh handles (contiguous, the sources' shapes and dtypes). None (the
    caller takes the host path) when either runtime keeps host copies or a source is not kept
    by its node."""
    source, dest = runtime_of(srcs[0]), runtime_for(target)
    if source.lineage is not None or dest.lineage is not None:
        return None
    peer = dest.connection()  # the target's session: its address and id
    values = [source.value_of(t) for t in srcs]
    if any(v.node is not None or source.recording.pending_writes(v.storage) for v in values):
        source._execute([], [])  # runs what it needs; the tensors keep it resident
        values = [source.value_of(t) for t in srcs]
    if any(v.handle is None for v in values):  # not kept by the node (nothing to send from): the host path
        return None
    moved = []
    for t, v in zip(srcs, values):
        m = Value.resident(None, t.dtype, new_handle(), v.residency)
        m.shape = tuple(t.shape)
        moved.append(m)
    try:
        source._call("send_tensors", peer.address, dest.auth_token, peer.session_id, [v.handle for v in values],
                     [m.handle for m in moved])
    except BaseException:
        # The tensors may have reached the target before the failure was seen (Ctrl-C once the
        # node sent them, a reply lost with node 0): the target frees the handles with its next
        # request (an unknown handle is ignored).
        for m in moved:
            dest.recording.note_resident(m)
            dest._release_unheld(m)
        raise
    out = []
    for t, m in zip(srcs, moved):
        dest.recording.note_resident(m)
        out.append(_C.make_lazy(m, dest.recording, list(t.shape)))
    return out


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
    """PersistentWeight for parameters, EphemeralActivation otherwise (genie.graph)."""
    return WEIGHT if isinstance(t, torch.nn.Parameter) else ACTIVATION


def copy(func, args, kwargs):
    """aten::copy_(dst, src) and aten::_copy_from(src, dst): uploads, downloads or records."""
    if func is aten._copy_from.default:
        src, dst = args[0], args[1]
    else:
        dst, src = args[0], args[1]
    if not isinstance(src, torch.Tensor):  # a Python number (`grad.copy_(float("inf"))`): a wrapped number
        src = torch.tensor(src)
    if _C.is_lazy(dst):
        if _C.is_lazy(src) and src.device == dst.device:
            return record_op(aten.copy_.default, (dst, src), {})
        if _C.is_lazy(src):  # another remote device: moved node to node, then copied there
            moved = _node_to_node(src, dst.device, {})
            if moved is not None:
                return record_op(aten.copy_.default, (dst, moved), {})
        # A lazy tensor of another node (no node-to-node path) or a tensor of a local GPU: through
        # this host's memory (the client sends host memory only).
        cpu = src.cpu() if _C.is_lazy(src) or src.device.type != "cpu" else src
        if cpu.is_quantized:
            return record_op(aten.copy_.default, (dst, _upload_quantized(cpu, dst.device)), {})
        runtime_of(dst).copy_from_host(dst, cpu, residency_of(src))
        return dst
    # Device to host: materialize, then copy locally.
    dst.copy_(fetch(src))
    return dst


def local_scalar_dense(func, args, kwargs):
    """aten::_local_scalar_dense (`tensor.item()`): the one element, read from the node."""
    if args[0].numel() == 0:  # eager's check (`item()` raises its own before it gets here)
        raise RuntimeError("_local_scalar_dense: Empty tensor not supported (genie: remote_accelerator)")
    return fetch(args[0]).item()


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
