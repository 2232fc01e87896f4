"""Recording: what happens to one aten call on LazyTensors.

`dispatch(func, args, kwargs)` is `LazyTensor.__torch_dispatch__`. For an ordinary op it
1. checks devices (PyTorch's rule: tensors on one device; 0-dim CPU tensors and Python scalars
   may join them; those CPU tensors travel inline as `Constant`s),
2. infers the outputs' sizes, strides and dtypes by running the op on meta tensors (no round
   trip), converting the remote device in arguments to `meta`,
3. records a `Node` in its device's runtime and wraps the meta outputs in LazyTensors:
   a view shares its input's `Storage`; an in-place or `out=` op returns the very tensor it
   wrote, now bound to the node's output (PyTorch's aliasing semantics, kept by the node
   executing ops in program order).

The exceptions, each a materialization point or a data movement:
- `aten::_to_copy` / `aten::copy_` / `aten::_copy_from` between the host and the device
  upload (`Runtime.upload`) or download (`Runtime.fetch`);
- `aten::_local_scalar_dense` (`.item()`, `bool()`, `__index__`) and ops that return Python
  scalars (`aten::equal`) run now and return the scalar;
- ops with no meta kernel or a data-dependent output shape (`aten::nonzero`,
  `aten::masked_select`, ...) run now; their outputs stay resident and only their
  descriptors come back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .graph import Constant, Node, Storage, Value, op_name
from .lazy import LazyTensor

aten = torch.ops.aten
_META = torch.device("meta")
_PRIVATEUSE1 = "privateuse1"
_EMPTY_OPS = frozenset({aten.empty.memory_format, aten.empty_strided.default})


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What the schema says about an op's outputs, computed once per OpOverload.

    `returns[i]` is ("new", None), ("view", arg) or ("write", arg) where arg is the positional
    index (int) or keyword name (str) of the argument the output aliases. `writes` are the
    arguments the op mutates. `tensor_returns` is False when the op returns Python scalars.
    """

    returns: tuple[tuple[str, int | str | None], ...]
    writes: tuple[int | str, ...]
    tensor_returns: bool
    list_return: bool


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
        if alias is None or not alias.before_set:
            returns.append(("new", None))
            continue
        arg = alias_to_arg.get(next(iter(alias.before_set)))
        returns.append(("write" if alias.is_write else "view", arg))
    info = OpInfo(tuple(returns), tuple(writes), tensor_returns, list_return)
    _op_infos[func] = info
    return info


def _arg(args: tuple, kwargs: dict, where: int | str):
    if isinstance(where, int):
        return args[where] if where < len(args) else None
    return kwargs.get(where)


class _Unwrapped:
    """The meta-side and record-side forms of one call's arguments, and its runtime."""

    __slots__ = ("runtime", "cpu_tensor")

    def __init__(self) -> None:
        self.runtime = None
        self.cpu_tensor: torch.Tensor | None = None


def _device_error(runtime, other: torch.Tensor) -> RuntimeError:
    return RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                        f"{runtime.device} and {other.device}!")


def _unwrap(a, u: _Unwrapped):
    """Returns (meta form, record form) of one argument."""
    if isinstance(a, LazyTensor):
        rt = a._runtime
        if u.runtime is None:
            u.runtime = rt
        elif u.runtime is not rt:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               f"{u.runtime.device} and {rt.device}!")
        return a._meta, a._runtime.value_of(a)
    if isinstance(a, torch.Tensor):
        if a.dim() == 0 and a.device.type == "cpu":
            return a, Constant(a)
        u.cpu_tensor = a
        return a, a
    if type(a) in (list, tuple):
        pairs = [_unwrap(x, u) for x in a]
        return type(a)(p[0] for p in pairs), type(a)(p[1] for p in pairs)
    if isinstance(a, torch.device) and a.type == _PRIVATEUSE1:
        return _META, a
    if isinstance(a, torch.Generator):
        return None, None  # random ops use the node's generator
    return a, a


def _unwrap_all(args: tuple, kwargs: dict):
    u = _Unwrapped()
    meta_args, rec_args = [], []
    for a in args:
        m, r = _unwrap(a, u)
        meta_args.append(m)
        rec_args.append(r)
    meta_kwargs, rec_kwargs = {}, {}
    for k, a in kwargs.items():
        m, r = _unwrap(a, u)
        meta_kwargs[k] = m
        rec_kwargs[k] = r
    if u.cpu_tensor is not None and u.runtime is not None:
        raise _device_error(u.runtime, u.cpu_tensor)
    return u.runtime, tuple(meta_args), tuple(rec_args), meta_kwargs, rec_kwargs


def _flatten_outputs(out) -> list:
    if isinstance(out, torch.Tensor) or out is None:
        return [out]
    flat = []
    for o in out:
        flat.extend(_flatten_outputs(o) if isinstance(o, (list, tuple)) else [o])
    return flat


def _rebuild(out, wrapped: list):
    """`out`'s structure with its tensors replaced, in order, by `wrapped`."""
    it = iter(wrapped)

    def rec(o):
        if isinstance(o, torch.Tensor) or o is None:
            return next(it)
        return type(o)(rec(x) for x in o)

    return rec(out)


def _needs_remote_shape(error: Exception) -> bool:
    """True when meta inference cannot work for this op (no meta kernel, data-dependent shape)."""
    if isinstance(error, NotImplementedError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("meta" in text.lower() or "data-dependent" in text)


def dispatch(func, args: tuple, kwargs: dict):
    special = _SPECIAL.get(func)
    if special is not None:
        return special(func, args, kwargs)
    return record_op(func, args, kwargs)


def record_op(func, args: tuple, kwargs: dict):
    """Records `func` (no special handling): the generic path of `dispatch`."""
    runtime, meta_args, rec_args, meta_kwargs, rec_kwargs = _unwrap_all(args, kwargs)
    if runtime is None:
        raise RuntimeError(f"{op_name(func)}: no remote_accelerator tensor among its arguments")
    info = op_info(func)
    if not info.tensor_returns:
        return runtime.run_scalar_op(func, rec_args, rec_kwargs)
    try:
        meta_out = func(*meta_args, **meta_kwargs)
    except Exception as error:  # noqa: BLE001 - classified below
        if not _needs_remote_shape(error):
            raise type(error)(f"{op_name(func)}: {error}") from error
        return _record_with_remote_shapes(runtime, func, info, args, kwargs, rec_args, rec_kwargs)
    flat = _flatten_outputs(meta_out)
    node = _record(runtime, func, info, args, kwargs, rec_args, rec_kwargs, len(flat))
    wrapped = _wrap_outputs(runtime, node, info, args, kwargs, flat)
    return wrapped[0] if isinstance(meta_out, torch.Tensor) else _rebuild(meta_out, wrapped)


def _written_storages(info: OpInfo, args: tuple, kwargs: dict) -> tuple[Storage, ...]:
    storages = []
    for where in info.writes:
        target = _arg(args, kwargs, where)
        targets = target if isinstance(target, (list, tuple)) else (target,)
        for t in targets:
            if isinstance(t, LazyTensor):
                storages.append(t._cell.value.storage)
    return tuple(storages)


def _record(runtime, func, info, args, kwargs, rec_args, rec_kwargs, num_outputs: int) -> Node:
    node = Node(func, rec_args, rec_kwargs, num_outputs, _written_storages(info, args, kwargs))
    runtime.record(node)
    return node


def _output_storage(kind: str, source) -> Storage:
    if kind in ("view", "write") and isinstance(source, LazyTensor):
        return source._cell.value.storage
    return Storage()


def _wrap_outputs(runtime, node: Node, info: OpInfo, args, kwargs, flat: list) -> list:
    outputs = []
    wrapped = []
    for i, meta in enumerate(flat):
        kind, where = info.returns[i] if i < len(info.returns) and not info.list_return else (
            info.returns[0] if info.returns else ("new", None))
        source = _arg(args, kwargs, where) if where is not None else None
        if isinstance(source, (list, tuple)):
            source = source[i] if i < len(source) else None
        dtype = meta.dtype if meta is not None else torch.float32
        value = Value(node, i, _output_storage(kind, source), dtype)
        outputs.append(value)
        if meta is None:
            wrapped.append(None)
        elif kind == "write" and isinstance(source, LazyTensor):
            if source._meta.shape != source.shape or source._meta.stride() != source.stride():
                raise NotImplementedError(f"{op_name(node.op)}: in-place ops that change a tensor's shape or "
                                          "strides are not supported on remote_accelerator")
            runtime.rebind(source, value)
            wrapped.append(source)
        else:
            wrapped.append(LazyTensor(meta, value, runtime))
    node.outputs = tuple(outputs)
    return wrapped


def _record_with_remote_shapes(runtime, func, info: OpInfo, args, kwargs, rec_args, rec_kwargs):
    """Records an op whose output shapes only the node can know, and runs it now."""
    if info.list_return:
        raise NotImplementedError(f"{op_name(func)}: returns a tensor list and has no meta kernel; "
                                  "remote_accelerator cannot infer how many tensors it returns")
    node = _record(runtime, func, info, args, kwargs, rec_args, rec_kwargs, len(info.returns))
    node.outputs = tuple(Value(node, i, _output_storage(kind, _arg(args, kwargs, where) if where is not None else None),
                               torch.float32) for i, (kind, where) in enumerate(info.returns))
    descs = runtime.describe(list(node.outputs))
    wrapped = []
    for value, (kind, where), desc in zip(node.outputs, info.returns, descs):
        dtype, shape, strides, offset = desc
        value.dtype = dtype
        meta = torch.empty_strided(shape, strides, dtype=dtype, device=_META)
        if offset:
            meta = torch.as_strided(meta, shape, strides, offset)
        source = _arg(args, kwargs, where) if where is not None else None
        if kind == "write" and isinstance(source, LazyTensor):
            runtime.rebind(source, value)
            wrapped.append(source)
        else:
            wrapped.append(LazyTensor(meta, value, runtime))
    return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


# ---- data movement and materialization ------------------------------------------------------

def _to_copy(func, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    target = torch.device(device) if device is not None else src.device
    if target.type == _PRIVATEUSE1:
        if isinstance(src, LazyTensor) and src._runtime.index == (target.index or 0):
            return record_op(func, args, kwargs)
        from .runtime import runtime_for
        cpu = src.cpu() if isinstance(src, LazyTensor) else src
        rest = {k: v for k, v in kwargs.items() if k != "device"}
        cpu = aten._to_copy.default(cpu, **rest) if rest else cpu
        return runtime_for(target).upload_tensor(cpu, residency_of(src))
    # To the host (or another local device): fetch, then let PyTorch convert.
    fetched = src._runtime.fetch(src)
    rest = {k: v for k, v in kwargs.items() if k not in ("non_blocking",)}
    if fetched.dtype == rest.get("dtype", fetched.dtype) and target.type == "cpu" and not rest.get("pin_memory"):
        return fetched
    return aten._to_copy.default(fetched, **rest)


def residency_of(t: torch.Tensor) -> int:
    """PersistentWeight (1) for parameters, EphemeralActivation (0) otherwise."""
    return 1 if isinstance(t, torch.nn.Parameter) else 0


def _copy(func, args, kwargs):
    """aten::copy_(dst, src) and aten::_copy_from(src, dst): uploads, downloads or records."""
    if func is aten._copy_from.default:
        src, dst = args[0], args[1]
    else:
        dst, src = args[0], args[1]
    if isinstance(dst, LazyTensor):
        if isinstance(src, LazyTensor) and src._runtime is dst._runtime:
            return record_op(aten.copy_.default, (dst, src), {})
        cpu = src.cpu() if isinstance(src, LazyTensor) else src
        dst._runtime.copy_from_host(dst, cpu, residency_of(src))
        return dst
    # Device to host: materialize, then copy locally.
    dst.copy_(src._runtime.fetch(src))
    return dst


def _local_scalar_dense(func, args, kwargs):
    return args[0]._runtime.fetch(args[0]).item()


def _is_pinned(func, args, kwargs):
    return False


def record_factory(func, args, kwargs):
    """A factory op on the remote device (`aten::empty.memory_format`, ...): a pending value."""
    from .runtime import runtime_for
    device = torch.device(kwargs.get("device") or "remote_accelerator")
    runtime = runtime_for(device)
    meta_kwargs = dict(kwargs, device=_META)
    meta_kwargs.pop("pin_memory", None)
    meta = func(*args, **meta_kwargs)
    info = op_info(func)
    node = Node(func, tuple(args), dict(kwargs), 1)
    runtime.record(node)
    return _wrap_outputs(runtime, node, info, args, kwargs, [meta])[0]


def _special_table():
    table = {
        aten._to_copy.default: _to_copy,
        aten.copy_.default: _copy,
        aten._copy_from.default: _copy,
        aten._local_scalar_dense.default: _local_scalar_dense,
        aten.is_pinned.default: _is_pinned,
    }
    return table


_SPECIAL = _special_table()
