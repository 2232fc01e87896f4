"""Recording an aten call as it is, and the runtime layer seen from below.

`record_op` records a call on LazyTensors through the C++ recorder (`genie._C.record_op`), with
the fallbacks the C++ side leaves to Python: a lost value's error, clamp bounds and unsigned
scalars past the dtype, a factory for a device used for the first time, and ops whose output
shapes only the node knows (run now, their descriptors come back). `runtime_of` and
`runtime_for` find the runtime of a tensor or a device through hooks genie.runtime installs
(capture sits below the runtime layer, docs/frontend.md "Layers"). The recorder
(genie.python_ops) and its Python handlers (genie.transfers, genie.compat, genie.sparse) record
through this module.
"""

from __future__ import annotations

import torch

from . import _C
from .errors import GenieConnectionError
from .graph import op_name
from .ops import op_info

aten = torch.ops.aten
_PRIVATEUSE1 = "remote_accelerator"  # PrivateUse1, renamed


def record_op(func, args: tuple, kwargs: dict, host_args: tuple[int, ...] = ()):
    """Records `func(*args, **kwargs)` as it is. `host_args`: argument indices where a host
    tensor is taken by design (its values are part of the plan's key). Raises PyTorch's errors
    for invalid calls and a lost value's error."""
    info = op_info(func)
    if info.python_impl is not None:
        return info.python_impl(*args, **kwargs)
    if info.route == "scalar":
        return _runtime_of(args, kwargs).run_scalar_op(func, args, kwargs)
    result = _C.record_op(func, args, kwargs, list(host_args))
    if result is NotImplemented:
        _raise_lost(args, kwargs)
        bounded = _clamp_bounds_past_the_dtype(func, args, kwargs)
        if bounded is not None:
            return record_op(func, *bounded, host_args=host_args)
        unsigned = _unsigned_scalars_as_tensors(func, args, kwargs)
        if unsigned is not None:
            return record_op(*unsigned, host_args=host_args)
        if _make_runtimes_for_devices(args, kwargs):  # a factory for a device used for the first time
            result = _C.record_op(func, args, kwargs, list(host_args))
    if result is NotImplemented:
        return _record_with_remote_shapes(func, info, args, kwargs)
    return result


def _tensors(args: tuple, kwargs: dict):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))
        elif isinstance(a, torch.Tensor):
            yield a


def _raise_lost(args: tuple, kwargs: dict) -> None:
    """Raises the error of a lost value among the arguments, if any."""
    for t in _tensors(args, kwargs):
        value = _C.lazy_value(t)
        if value is not None and value.error is not None:
            raise value.error


_INT64_MAX = 2**63 - 1


def _unsigned_scalars_as_tensors(func, args: tuple, kwargs: dict):
    """A Python int above 2**63-1 given for a `Scalar` argument (`x[0] = 2**63` on a uint64
    tensor: aten::fill_.Scalar) has no wire form (scalars travel as int64 or double). The call
    becomes the op's overload that takes a Tensor there (fill_.Tensor, add.Tensor, ...) with the
    number as a 0-dim uint64 host tensor, which travels inline, as eager's kernel reads the
    Scalar. Returns (func, args, kwargs), or None when no argument is such a number. Raises
    NotImplementedError when the op has no such overload."""
    schema = func._schema.arguments
    given = {a.name: args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema)}
    big = {a.name for a in schema if _kind(a.type) == "NumberType" and _is_big_int(given[a.name])}
    if not big:
        return None

    def fits(o, a) -> bool:  # the other overload's argument `o` takes what was given for `a`
        if o.name != a.name:
            return False
        if a.name in big:
            return _kind(o.type) == "TensorType"
        return str(o.type) == str(a.type) or (given[a.name] is None and o.type.kind() == "OptionalType")

    for name in func._overloadpacket.overloads():
        other = getattr(func._overloadpacket, name)
        if other is func or len(other._schema.arguments) != len(schema):
            continue
        if all(fits(o, a) for o, a in zip(other._schema.arguments, schema)):
            positional = [_as_uint64(v) if schema[i].name in big else v for i, v in enumerate(args)]
            named = {k: _as_uint64(v) if k in big else v for k, v in kwargs.items()}
            return other, tuple(positional), named
    raise NotImplementedError(f"{op_name(func)}: an integer scalar above 2**63-1 has no wire form on "
                              "remote_accelerator, and the op has no overload taking a tensor there")


def _kind(t) -> str:
    """A schema type's kind, looking through Optional: "NumberType" for Scalar and Scalar?."""
    return t.getElementType().kind() if t.kind() == "OptionalType" else t.kind()


_CLAMPS = {"clamp": ("min", "max"), "clamp_": ("min", "max"), "clamp_min": ("min",), "clamp_min_": ("min",),
           "clamp_max": ("max",), "clamp_max_": ("max",)}
_C10_NAMES = {torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long", torch.uint8: "Byte",
              torch.uint16: "UInt16", torch.uint32: "UInt32"}


def _clamp_bounds_past_the_dtype(func, args: tuple, kwargs: dict):
    """clamp, clamp_min, clamp_max (and in place) of an integer tensor other than uint64 with a
    Python int bound above 2**63-1, which no wire scalar holds, as eager's kernel treats it: an
    upper bound becomes the dtype's largest value (the same result); a lower bound is eager's
    "outside the representable range" error. (args, kwargs) for the call to record, or None when
    the call is not such a clamp."""
    bounds = _CLAMPS.get(func._overloadpacket.__name__)
    if bounds is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    dtype = args[0].dtype
    if dtype not in _C10_NAMES:
        return None
    schema = func._schema.arguments
    positional, named, changed = list(args), dict(kwargs), False
    for i, a in enumerate(schema):
        if a.name not in bounds:
            continue
        value = positional[i] if i < len(positional) else named.get(a.name)
        if not _is_big_int(value):
            continue
        if a.name == "min":
            raise RuntimeError(f"Clamp min value {float(value):g} is outside the representable range of "
                               f"{_C10_NAMES[dtype]} (genie: {op_name(func)} on remote_accelerator, checked on the client)")
        if i < len(positional):
            positional[i] = torch.iinfo(dtype).max
        else:
            named[a.name] = torch.iinfo(dtype).max
        changed = True
    return (tuple(positional), named) if changed else None


def _is_big_int(v) -> bool:
    return type(v) is int and v > _INT64_MAX


def _as_uint64(v):
    return torch.tensor(v, dtype=torch.uint64) if _is_big_int(v) else v


def _make_runtimes_for_devices(args: tuple, kwargs: dict) -> bool:
    """Makes the runtime of every remote_accelerator device named among the arguments (a
    factory's `device=`); True if one was made."""
    made = False
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.device) and a.type == _PRIVATEUSE1:
            index = a.index if a.index is not None else _C.current_device()
            if not _has_runtime(index):
                runtime_for(torch.device(_PRIVATEUSE1, index))
                made = True
    return made


def runtime_of(tensor):
    """The runtime of a LazyTensor's device. GenieConnectionError when its session was shut
    down (genie.shutdown, genie.init)."""
    runtime = _C.lazy_recording(tensor).runtime
    if runtime is None:
        raise GenieConnectionError(f"a tensor on {tensor.device} of a session that was shut down")
    return runtime


def _runtime_of(args: tuple, kwargs: dict):
    """The runtime of the first LazyTensor among the arguments, else of a device argument."""
    for t in _tensors(args, kwargs):
        recording = _C.lazy_recording(t)
        if recording is not None:
            return recording.runtime
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.device) and a.type == _PRIVATEUSE1:
            return runtime_for(a)
    raise RuntimeError("no remote_accelerator tensor among the arguments")


def _record_with_remote_shapes(func, info, args: tuple, kwargs: dict):
    """Records an op whose output shapes only the node can know, and runs it now: its outputs
    stay resident, their descriptors come back. When the host can compute its outputs exactly
    (genie.host_eval; `masked_select` of what PyTorch's formatting prints) and they are the
    node's to the strides (the node runs the CPU's kernels, or `masked_select`, 1-D on every
    device), they give its outputs' descriptors and host copies, and the op stays pending."""
    if info.list_return:
        raise NotImplementedError(f"{op_name(func)}: returns a tensor list and has no meta kernel; "
                                  "remote_accelerator cannot infer how many tensors it returns")
    runtime = _runtime_of(args, kwargs)
    schema = func._schema.arguments
    bound = {**{schema[i].name: a for i, a in enumerate(args)}, **kwargs}

    def argument(index: int):
        return bound.get(schema[index].name) if index >= 0 else None

    sources = [argument(where) if kind != "new" else None for kind, where in info.returns]
    storages = [_C.lazy_value(s).storage if _C.is_lazy(s) else None for s in sources]
    writes = [_C.lazy_value(t).storage for w in info.writes for t in _as_list(argument(w)) if _C.is_lazy(t)]
    if info.seeded:
        writes.append(runtime.recording.rng)
    node = runtime.recording.append_node(func, args, kwargs, [torch.float32] * len(info.returns), writes,
                                         [s if s is not None else _C.Storage() for s in storages])
    host = runtime.host_outputs(node) if func is _MASKED_SELECT or runtime.recording.cpu_kernels else None
    if host is not None and len(host) == len(node.outputs):
        described = [(t.dtype, tuple(t.shape), t.stride(), t.storage_offset()) for t in host]
        for value, t in zip(node.outputs, host):
            value.shape, value.host = tuple(t.shape), t
    else:
        described = runtime.describe(list(node.outputs))
    wrapped = []
    for value, (kind, _), source, (dtype, shape, strides, offset) in zip(node.outputs, info.returns, sources,
                                                                        described):
        value.dtype, value.shape = dtype, tuple(shape)
        if kind == "write" and _C.is_lazy(source):
            _C.rebind(source, value)
            if (tuple(shape), tuple(strides), offset) != (tuple(source.shape), source.stride(), source.storage_offset()):
                _C.set_geometry(source, list(shape), list(strides), offset)
            wrapped.append(source)
        else:
            base = source if kind == "view" and _C.is_lazy(source) else None
            wrapped.append(_C.make_lazy(value, runtime.recording, list(shape), list(strides), offset, base))
    return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


# A data-dependent op whose output is a contiguous 1-D tensor on every device: a host answer has
# the node's geometry whatever the node's kernels.
_MASKED_SELECT = torch.ops.aten.masked_select.default


def _as_list(a) -> list:
    return list(a) if isinstance(a, (list, tuple)) else [a]


# ---- the runtime layer, seen from below --------------------------------------------------------
# Capture sits below the runtime layer (docs/frontend.md "Layers") and reaches it only through
# these functions, which genie.runtime installs when it is imported.

def runtime_for(device: torch.device):
    """The runtime of `device` (genie.runtime.runtime_for). RuntimeError before genie.runtime
    is imported (it always is by `import genie`)."""
    if _runtime_for is None:
        raise RuntimeError("genie.runtime is not imported: no runtime to record on")
    return _runtime_for(device)


def _has_runtime(index: int) -> bool:
    return _runtime_exists is not None and _runtime_exists(index)


_runtime_for = None
_runtime_exists = None
