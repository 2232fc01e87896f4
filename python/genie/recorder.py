"""Recording: what happens to one aten call on LazyTensors.

`dispatch(func, args, kwargs)` is what the PrivateUse1 kernel (python/csrc/dispatch_fallback.cc)
calls for an op its C++ path does not record. For an ordinary op it
1. checks devices (PyTorch's rule: tensors on one device; 0-dim CPU tensors and Python scalars
   may join them; those CPU tensors travel inline as `Constant`s),
2. infers the outputs' sizes, strides and dtypes locally (no round trip): from a cache keyed by
   the op and its arguments' shapes, strides, dtypes and non-tensor values, else by running the
   op on meta tensors (the remote device in arguments becomes `meta`),
3. records a `Node` in its device's runtime and wraps the meta outputs in LazyTensors:
   a view shares its input's `Storage`; an in-place or `out=` op returns the very tensor it
   wrote, now bound to the node's output (PyTorch's aliasing semantics, kept by the node
   executing ops in program order).

The exceptions, each a materialization point or a data movement:
- `aten::_to_copy` / `aten::copy_` / `aten::_copy_from` between the host and the device
  upload (`Runtime.upload`) or download (`Runtime.fetch`) (genie.transfers);
- `aten::_local_scalar_dense` (`.item()`, `bool()`, `__index__`) and ops that return Python
  scalars (`aten::equal`) run now and return the scalar;
- ops with no meta kernel or a data-dependent output shape (`aten::nonzero`,
  `aten::masked_select`, ...) run now; their outputs stay resident and only their
  descriptors come back;
- compatibility ops (genie.compat).

Over 400 lines: argument conversion, shape inference with its cache, the plan cache and output
wrapping are one path, whose hit case python/csrc/recorder_fast.cc runs from the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import make_contiguous_strides_for

from . import _C
from . import graph as _graph
from .graph import Constant, Node, Storage, Value, op_name
from .lazy import Cell, LazyTensor
from .ops import OpInfo, op_info
from .shape_rules import RULES as _SHAPE_RULES

aten = torch.ops.aten
_META = torch.device("meta")
_PRIVATEUSE1 = "remote_accelerator"  # PrivateUse1, renamed
_EMPTY_OPS = frozenset({aten.empty.memory_format, aten.empty_strided.default})


def _arg(args: tuple, kwargs: dict, where: int | str):
    if isinstance(where, int):
        return args[where] if where < len(args) else None
    return kwargs.get(where)


def _device_error(runtime, other) -> RuntimeError:
    """PyTorch's device-mismatch error; `runtime` and `other` are anything with a `.device`."""
    return RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                        f"{runtime.device} and {other.device}!")


# ---- tensor descriptors and meta tensors -----------------------------------------------------
# A desc is (shape, stride, storage_offset, dtype): what a LazyTensor is made from.

def desc_of(t: torch.Tensor) -> tuple:
    if type(t) is LazyTensor:
        return t._desc
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def meta_of(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s sizes, strides, offset and dtype (for shape inference)."""
    shape, stride, offset = t.shape, t.stride(), t.storage_offset()
    if offset == 0:
        return torch.empty_strided(shape, stride, dtype=t.dtype, device=_META)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    return torch.empty(offset + span, dtype=t.dtype, device=_META).as_strided(shape, stride, offset)


class _Call:
    """The slow path's state while converting one call's arguments: the runtime they live on,
    a CPU tensor among them (a device error unless 0-dim), and the shape-cache key so far."""

    __slots__ = ("runtime", "cpu_tensor", "key")

    def __init__(self, runtime, key: list) -> None:
        self.runtime = runtime
        self.cpu_tensor: torch.Tensor | None = None
        self.key = key


class _HostTensor:
    """A host tensor an op takes by design beside device tensors (a packed sequence's
    `batch_sizes`, which PyTorch keeps on the CPU for every device): it travels inline with the
    run (a `Constant`), and its values are part of the shape-cache key (the op's output shapes
    depend on them)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _record_form(a, call: _Call):
    """The node's form of one argument; appends its part of the shape-cache key. Exact type
    tests first: `isinstance(x, torch.Tensor)` goes through torch's metaclass and is slow."""
    t = type(a)
    if t in _PLAIN:
        call.key.append(a)
        return a
    if t is float or t is bool:  # tagged: 1 == 1.0 == True, but `x + 1.0` is not `x + 1`
        call.key.append(t)
        call.key.append(a if a == a else "nan")
        return a
    if t is list or t is tuple:
        key = call.key
        key.append(t)
        out = []
        for x in a:  # a loop, not a generator: ints (sizes, dims) are the common elements
            if type(x) is int:
                key.append(x)
                out.append(x)
            else:
                out.append(_record_form(x, call))
        key.append(len(a))
        return out if t is list else tuple(out)
    if t is LazyTensor:
        rt = a._runtime
        if call.runtime is None:
            call.runtime = rt
        elif call.runtime is not rt:
            raise _device_error(call.runtime, rt)
        call.key.append(a._desc)
        return rt.value_of(a)
    if t is torch.device:
        call.key.append(a.type)
        return a
    if t is _HostTensor:
        call.key.append(("host", a.tensor.dtype, tuple(a.tensor.tolist())))
        return Constant(a.tensor)
    if t is torch.Generator:
        # Random ops draw from the node's generator (seeded by torch.manual_seed); a local
        # generator cannot reach it. PyTorch's own error for a generator of another device:
        raise RuntimeError(f"Expected a '{_PRIVATEUSE1}' device type for generator but found '{a.device.type}' "
                           "(genie: random ops draw from the node's generator; seed it with torch.manual_seed)")
    if isinstance(a, torch.Tensor):
        if a.dim() == 0 and a.device.type == "cpu":
            call.key.append(("cpu0", a.dtype))
            return Constant(a)
        call.cpu_tensor = a
        return a
    call.key.append(t)  # complex, layouts, memory formats, ...: tagged as floats are
    call.key.append(a)
    return a


# Key parts that stand for themselves. Not bool or float: a key holds the value and equal
# numbers of different types (1, 1.0, True) promote differently, so those are tagged.
_PLAIN = frozenset({int, str, type(None), torch.dtype})


def _meta_form(a):
    if isinstance(a, LazyTensor):
        return meta_of(a)
    t = type(a)
    if t is list or t is tuple:
        return t(_meta_form(x) for x in a)
    if t is torch.device and a.type == _PRIVATEUSE1:
        return _META
    if t is torch.Generator:
        return None
    if t is _HostTensor:
        return a.tensor
    return a


def _prepare(func, args: tuple, kwargs: dict):
    """(runtime, node args, node kwargs, shape-cache key) of one call: LazyTensors become their
    `Value`s, 0-dim CPU tensors `Constant`s. The key is (id(func), then per argument its
    descriptor or value, as `_record_form` makes it); `id` because hashing an OpOverload runs
    Python code. Raises PyTorch's device-mismatch error for tensors of two devices or a
    non-scalar CPU tensor, and a lost value's error.

    Calls whose arguments are all of the common kinds are prepared in C++
    (`genie._C.prepare_fast`, python/csrc/recorder_fast.cc: the same key and node arguments);
    `_prepare_walk` takes the rest."""
    fast = _prepare_fast(func, args, kwargs)
    return fast if fast is not None else _prepare_walk(func, args, kwargs)


def _prepare_walk(func, args: tuple, kwargs: dict):
    """`_prepare` for any call: `_record_form` of each argument."""
    call = _Call(None, [id(func)])
    rec = tuple([_record_form(a, call) for a in args])
    rec_kwargs = {}
    for k, a in kwargs.items():
        call.key.append(k)
        rec_kwargs[k] = _record_form(a, call)
    runtime = call.runtime
    if call.cpu_tensor is not None and runtime is not None:
        raise _device_error(runtime, call.cpu_tensor)
    return runtime, rec, rec_kwargs, tuple(call.key)


def _structure(out):
    """The shape of an op's result: "T" (a tensor), None, or (type, [children])."""
    if isinstance(out, torch.Tensor):
        return "T"
    if out is None:
        return None
    return (type(out), [_structure(o) for o in out])


def _flat_descs(out, descs: list) -> list:
    if isinstance(out, torch.Tensor):
        descs.append(desc_of(out))
    elif out is None:
        descs.append(None)
    else:
        for o in out:
            _flat_descs(o, descs)
    return descs


def _rebuild(structure, wrapped):
    """`structure` filled, in order, with `wrapped`."""
    return _fill(structure, iter(wrapped))


def _fill(s, it):
    # Module-level, not a nested recursive closure: such a closure is a reference cycle that
    # would keep the op's outputs (LazyTensors) alive until the cyclic GC runs, and a live
    # tensor's value is kept resident on the node.
    if s == "T" or s is None:
        return next(it)
    kind, children = s
    return kind(_fill(c, it) for c in children)


_shape_cache: dict[tuple, tuple] = {}
_SHAPE_CACHE_MAX = 200_000


def infer_shapes(func, args: tuple, kwargs: dict, key: tuple):
    """(structure, flat descs) of `func`'s outputs: from the cache, else by running it on meta
    tensors. Deterministic in the key (shapes, strides, dtypes, non-tensor arguments). Raises
    what the meta kernel raises."""
    hit = _shape_cache.get(key)
    if hit is not None:
        return hit
    result = _infer_shapes(func, args, kwargs)
    if len(_shape_cache) >= _SHAPE_CACHE_MAX:
        _shape_cache.clear()
    _shape_cache[key] = result
    return result


def _infer_shapes(func, args: tuple, kwargs: dict):
    """`infer_shapes` without the cache (record_op caches its plans instead). A shape rule
    (`genie.shape_rules`) answers first where the op has one that covers these arguments."""
    rule = _SHAPE_RULES.get(id(func))
    if rule is not None:
        result = rule(args, kwargs)
        if result is not None:
            return result
    return meta_shapes(func, args, kwargs)


def meta_shapes(func, args: tuple, kwargs: dict):
    """(structure, flat descs) of `func`'s outputs from its meta kernel. Raises what it raises."""
    meta_out = func(*(_meta_form(a) for a in args), **{k: _meta_form(v) for k, v in kwargs.items()})
    return _structure(meta_out), _flat_descs(meta_out, [])


def _needs_remote_shape(error: Exception) -> bool:
    """True when meta inference cannot work for this op (no meta kernel, data-dependent shape)."""
    if isinstance(error, NotImplementedError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("meta" in text.lower() or "data-dependent" in text)


def dispatch(func, args: tuple, kwargs: dict):
    special = _SPECIAL.get(id(func))
    if special is not None:
        return special(func, args, kwargs)
    return record_op(func, args, kwargs)


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to record one shape-cache key: the op's schema facts, the result's structure and
    flat output descriptors, and for the common case of one output that is new or a view of a
    positional argument, `single` = (desc, contiguous, view_of: positional index or -1)."""

    info: OpInfo
    structure: Any
    descs: list
    single: tuple | None


_plans: dict[tuple, _Plan] = {}


def _plan_for(info: OpInfo, structure, descs: list) -> _Plan:
    if not info.returns and info.tensor_returns:
        # `-> ()` (in-place foreach ops, _amp_foreach_non_finite_check_and_unscale_): no outputs;
        # the meta kernel's None is not an undefined-tensor output, which the node would count.
        return _Plan(info, None, [], None)
    single = None
    if structure == "T" and not info.writes and not info.list_return and not info.seeded:
        kind, where = info.returns[0] if info.returns else ("new", None)
        desc = descs[0]
        if kind == "new" or (kind == "view" and isinstance(where, int)):
            single = (desc, _is_contiguous(desc), where if kind == "view" else -1)
    return _Plan(info, structure, descs, single)


def _is_contiguous(desc: tuple) -> bool:
    """True when `desc` has exactly the strides PyTorch gives a new tensor of its shape (then
    the wrapper can be made without strides, which is faster) and offset 0."""
    shape, strides, offset, _ = desc
    return offset == 0 and tuple(strides) == tuple(make_contiguous_strides_for(shape))


def record_op(func, args: tuple, kwargs: dict, prepared: tuple | None = None):
    """Records `func` (no special handling): the generic path of `dispatch`. `prepared`: what
    `_prepare` returns for this call, when the caller has it (`genie._C.record_single`)."""
    runtime, rec_args, rec_kwargs, key = prepared or _prepare(func, args, kwargs)
    if runtime is None:
        raise RuntimeError(f"{op_name(func)}: no remote_accelerator tensor among its arguments")
    plan = _plans.get(key)
    if plan is None:
        info = op_info(func)
        if info.python_impl is not None:  # never planned: every call comes here
            return info.python_impl(*args, **kwargs)
        if info.composite:  # never planned either (torch.inference_mode only, see OpInfo)
            return func.decompose(*args, **kwargs)
        if not info.tensor_returns:
            return runtime.run_scalar_op(func, rec_args, rec_kwargs)
        if not info.returns:
            # `-> ()` (fused optimizer steps, in-place foreach ops): nothing to infer, and some
            # (aten::_fused_sgd_) have no meta kernel.
            structure, descs = None, []
        else:
            try:
                structure, descs = _infer_shapes(func, args, kwargs)
            except Exception as error:  # noqa: BLE001 - classified below
                if not _needs_remote_shape(error):
                    raise type(error)(f"{op_name(func)}: {error}") from error
                return _record_with_remote_shapes(runtime, func, info, args, kwargs, rec_args, rec_kwargs)
        if len(_plans) >= _SHAPE_CACHE_MAX:
            _plans.clear()
        plan = _plans[key] = _plan_for(info, structure, descs)
    single = plan.single
    if single is not None:  # the common case: one new tensor or one view, nothing written
        node = Node(func, rec_args, rec_kwargs, 1)
        runtime.record(node)
        desc, contiguous, view_of = single
        base = args[view_of] if view_of >= 0 and type(args[view_of]) is LazyTensor else None
        value = Value(node, 0, Storage() if base is None else base._cell.value.storage, desc[3])
        node.outputs = (value,)
        return LazyTensor._make(desc, contiguous, value, runtime, base)
    info, descs = plan.info, plan.descs
    node = _record(runtime, func, info, args, kwargs, rec_args, rec_kwargs, len(descs))
    wrapped = _wrap_outputs(runtime, node, info, args, kwargs, descs)
    if not descs:
        return None
    return wrapped[0] if plan.structure == "T" else _rebuild(plan.structure, wrapped)


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
    writes = _written_storages(info, args, kwargs) if info.writes else ()
    if info.seeded:
        writes += (runtime.rng,)
    node = Node(func, rec_args, rec_kwargs, num_outputs, writes)
    runtime.record(node)
    return node


def _output_storage(kind: str, source) -> Storage:
    if kind != "new" and isinstance(source, LazyTensor):
        return source._cell.value.storage
    return Storage()


def _wrap_outputs(runtime, node: Node, info: OpInfo, args, kwargs, descs: list) -> list:
    outputs = []
    wrapped = []
    returns = info.returns
    for i, desc in enumerate(descs):
        kind, where = returns[0 if info.list_return else i] if returns else ("new", None)
        source = _arg(args, kwargs, where) if where is not None else None
        if isinstance(source, (list, tuple)):
            source = source[i] if i < len(source) else None
        value = Value(node, i, _output_storage(kind, source), desc[3] if desc is not None else torch.float32)
        outputs.append(value)
        if desc is None:
            wrapped.append(None)
        elif kind == "write" and isinstance(source, LazyTensor):
            runtime.rebind(source, value)
            if desc != source._desc:
                _resize(source, desc)  # a resizing out= op (aten::arange.start_out into empty(0))
            wrapped.append(source)
        else:
            base = source if kind == "view" and isinstance(source, LazyTensor) else None
            wrapped.append(LazyTensor(desc, value, runtime, base))
    node.outputs = tuple(outputs)
    return wrapped


def _resize(t: LazyTensor, desc: tuple) -> None:
    """Gives the wrapper `t` the sizes, strides and offset of `desc`, as resize_ would."""
    from . import _C
    shape, strides, offset, dtype = desc
    if dtype != t.dtype:
        raise RuntimeError(f"an out= op changed the dtype of a remote_accelerator tensor ({t.dtype} -> {dtype})")
    _C.set_geometry(t, list(shape), list(strides), offset)
    t._desc = desc


def _record_with_remote_shapes(runtime, func, info: OpInfo, args, kwargs, rec_args, rec_kwargs):
    """Records an op whose output shapes only the node can know, and runs it now."""
    if info.list_return:
        raise NotImplementedError(f"{op_name(func)}: returns a tensor list and has no meta kernel; "
                                  "remote_accelerator cannot infer how many tensors it returns")
    node = _record(runtime, func, info, args, kwargs, rec_args, rec_kwargs, len(info.returns))
    node.outputs = tuple(Value(node, i, _output_storage(kind, _arg(args, kwargs, where) if where is not None else None),
                               torch.float32) for i, (kind, where) in enumerate(info.returns))
    described = runtime.describe(list(node.outputs))
    wrapped = []
    for value, (kind, where), (dtype, shape, strides, offset) in zip(node.outputs, info.returns, described):
        value.dtype = dtype
        desc = (tuple(shape), tuple(strides), offset, dtype)
        source = _arg(args, kwargs, where) if where is not None else None
        if kind == "write" and isinstance(source, LazyTensor):
            runtime.rebind(source, value)
            if desc != desc_of(source):
                _resize(source, desc)
            wrapped.append(source)
        else:
            base = source if kind == "view" and isinstance(source, LazyTensor) else None
            wrapped.append(LazyTensor(desc, value, runtime, base))
    return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


# ---- the runtime layer, seen from below --------------------------------------------------------
# Capture sits below the runtime layer (docs/frontend.md "Layers") and reaches it only through
# this function, which genie.runtime installs when it is imported.

def runtime_for(device: torch.device):
    """The runtime of `device` (genie.runtime.runtime_for). RuntimeError before genie.runtime
    is imported (it always is by `import genie`)."""
    if _runtime_for is None:
        raise RuntimeError("genie.runtime is not imported: no runtime to record on")
    return _runtime_for(device)


_runtime_for = None


# ---- ops handled here, not recorded as they are ---------------------------------------------

def _same_value_view(func, args, kwargs):
    """aten::detach / alias / lift_fresh: a new tensor on the very same value (no op recorded)."""
    src = args[0]
    return LazyTensor(desc_of(src), src._runtime.value_of(src), src._runtime, src)


def record_factory(func, args, kwargs):
    """A factory op on the remote device (`aten::empty.memory_format`, ...): a pending value."""
    runtime = runtime_for(torch.device(kwargs.get("device") or "remote_accelerator"))
    _, rec_args, rec_kwargs, key = _prepare(func, args, kwargs)
    meta_kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
    _, descs = infer_shapes(func, args, meta_kwargs, key)
    node = Node(func, rec_args, rec_kwargs, 1)
    runtime.record(node)
    return _wrap_outputs(runtime, node, op_info(func), args, kwargs, descs)[0]


def _special_table():
    """Ops not recorded as they are, by id: data movement (genie.transfers), compatibility ops
    (genie.compat), and views on the same value."""
    table = {
        aten.detach.default: _same_value_view,
        aten.alias.default: _same_value_view,
        aten.lift_fresh.default: _same_value_view,
        **transfers.HANDLERS,
        **compat.HANDLERS,
    }
    return {id(op): handler for op, handler in table.items()}  # by id: hashing an OpOverload runs Python


from . import compat, transfers  # noqa: E402 - both record through this module

_SPECIAL = _special_table()

# The C++ recorder (python/csrc/recorder_fast.cc) records plan hits with these classes and
# tables; `_plans` and `_SPECIAL` are only ever changed in place, never rebound.
_C.configure_recorder(LazyTensor, Cell, Node, Value, Storage, _plans, _SPECIAL, torch.dtype, _graph._sequence)
_prepare_fast = _C.prepare_fast
