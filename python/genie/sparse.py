"""Sparse COO tensors on remote_accelerator: ops with a sparse argument or result run on the node.

A sparse tensor on the device is PyTorch's SparseTensorImpl (dispatch key SparsePrivateUse1)
whose indices (int64 [sparse_dim, nnz]) and values ([nnz, dense sizes...]) are LazyTensors.
PyTorch's device-generic sparse kernels handle what only reads or rearranges those parts, on
the client (python/csrc/sparse.cc: construction, `_indices`, `_values`, `_nnz`, `copy_`,
`clone`, ...). Every other op with a sparse argument reaches `run_on_node` through a fallback
for SparsePrivateUse1, and so do the conversions of a dense tensor to sparse (`_to_sparse`):

1. each sparse argument is rebuilt on the node from its parts
   (`aten::_sparse_coo_tensor_with_dims_and_tensors`, recorded);
2. the op is recorded on those, dense arguments as they are;
3. `genie::sparse_parts` of each output (include/genie/torch/sparse_ops.h) splits it into
   dense tensors and facts (layout, sparse_dim, dense_dim, coalesced, sizes);
4. one request runs it all: the facts come back, the parts stay resident and are described;
5. each output becomes a dense LazyTensor, or a sparse tensor made of its parts on the client.

An output's layout is known only once the op ran (`aten::add` of two sparse tensors is sparse,
of a dense and a sparse dense), hence one round trip per such op, as for ops whose output shape
depends on the data (`aten::nonzero`). An in-place op on a sparse tensor gives it the parts the
node made (`genie._C.sparse_set_parts`); a view op's values share its argument's storage.
Sparse compressed layouts (CSR, CSC, BSR, BSC): PyTorch's constructors (`torch.sparse_csr_tensor`
of device tensors) and the member accessors (`crow_indices`, `col_indices`, `values`, ...:
python/csrc/sparse.cc) work; any other op on one, and converting a dense tensor to one, raises
NotImplementedError naming the op.
"""

from __future__ import annotations

import torch

from . import _C
from .graph import op_name
from .lazy import lock
from .ops import op_info
from .record import runtime_of

aten = torch.ops.aten
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _flat(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))
        elif isinstance(a, torch.Tensor):
            yield a


def _is_remote_sparse(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo and t.device.type == "remote_accelerator"


def _runtime(args, kwargs):
    for t in _flat(args, kwargs):
        if t.layout in _COMPRESSED:
            raise NotImplementedError(f"sparse {t.layout} tensors are not supported on remote_accelerator; "
                                      "use sparse COO (to_sparse()) or dense tensors")
        if _is_remote_sparse(t):
            return runtime_of(t._values())
        if _C.is_lazy(t):
            return runtime_of(t)
    raise RuntimeError("no remote_accelerator tensor among the arguments")


def _on_node(runtime, t):
    """A sparse tensor's Value on the node, rebuilt from its parts; any other argument as is."""
    if not _is_remote_sparse(t):
        return t
    node = runtime.recording.append_node(
        aten._sparse_coo_tensor_with_dims_and_tensors.default,
        (t.sparse_dim(), t.dense_dim(), list(t.shape), t._indices(), t._values()),
        {"dtype": t.dtype, "layout": torch.sparse_coo, "device": t.device, "pin_memory": False,
         "is_coalesced": t.is_coalesced()}, [t.dtype])
    return node.outputs[0]


def run_on_node(func, args: tuple, kwargs: dict):
    """Runs `func` on the node (see the top of this module); returns its outputs as eager would.
    Raises NotImplementedError for an op returning a tensor list (how many is unknown before it
    runs) and for sparse compressed layouts; the node's error for anything it refuses."""
    with lock, torch._C._AutoDispatchBelowADInplaceOrView():
        return _run(func, args, kwargs)


def _run(func, args: tuple, kwargs: dict):
    runtime = _runtime(args, kwargs)
    info = op_info(func)
    schema = func._schema
    if info.list_return:
        raise NotImplementedError(f"{op_name(func)}: returns a tensor list; remote_accelerator cannot run it on "
                                  "sparse tensors")
    if runtime.recording.pending_count:  # run what is pending first: this op's error loses nothing else
        runtime._execute_async()
    node_args = tuple([_on_node(runtime, x) for x in a] if isinstance(a, (list, tuple)) else _on_node(runtime, a)
                      for a in args)
    node_kwargs = {k: _on_node(runtime, v) for k, v in kwargs.items()}
    bound = {**{schema.arguments[i].name: a for i, a in enumerate(args)}, **kwargs}

    def argument(index: int):
        return bound.get(schema.arguments[index].name) if index >= 0 else None

    tensor_returns = [str(r.type) in ("Tensor", "Tensor?") for r in schema.returns]
    if schema.returns and not all(tensor_returns):
        if len(schema.returns) != 1:
            raise NotImplementedError(f"{op_name(func)}: returns tensors and other values; remote_accelerator cannot "
                                      "run it on sparse tensors")
        return runtime.run_scalar_op(func, node_args, node_kwargs)

    sources = [argument(where) if kind != "new" else None for kind, where in info.returns]
    writes = [_C.lazy_value(t).storage for w in info.writes for t in _as_list(argument(w)) if _C.is_lazy(t)]
    dense_storages = [_C.lazy_value(s).storage if _C.is_lazy(s) else None for s in sources]
    node = runtime.recording.append_node(func, node_args, node_kwargs, [torch.float32] * len(info.returns), writes,
                                         [s if s is not None else _C.Storage() for s in dense_storages])
    parts = []
    for value, source, storage in zip(node.outputs, sources, dense_storages):
        values_storage = storage
        if values_storage is None and _is_remote_sparse(source):  # a view of a sparse argument: its values'
            values_storage = _C.lazy_value(source._values()).storage
        split = runtime.recording.append_node(torch.ops.genie.sparse_parts.default, (value,), {},
                                              [torch.int64, torch.float32, torch.int64], [],
                                              [_C.Storage(), values_storage or _C.Storage(), _C.Storage()])
        parts.append(split.outputs)
    facts_values = [p[2] for p in parts]
    kept = [v for p in parts for v in p[:2]]
    returned, described = runtime._execute(facts_values, kept)

    results = []
    for (indices_v, values_v, facts_v), (kind, _), source in zip(parts, info.returns, sources):
        facts = returned[facts_v].tolist()
        values = _lazy(runtime, values_v, described[values_v],
                       source._values() if kind == "view" and _is_remote_sparse(source)
                       else source if kind == "view" and _C.is_lazy(source) else None)
        if not facts[0]:  # a dense output
            if kind == "write" and _C.is_lazy(source):
                _C.rebind(source, values_v)
                dtype, shape, strides, offset = described[values_v]
                if (tuple(shape), tuple(strides), offset) != (tuple(source.shape), source.stride(),
                                                              source.storage_offset()):
                    _C.set_geometry(source, list(shape), list(strides), offset)
                results.append(source)
            else:
                results.append(values)
            continue
        _, sparse_dim, dense_dim, coalesced, *sizes = facts
        indices = _lazy(runtime, indices_v, described[indices_v], None)
        if kind == "write" and _is_remote_sparse(source):
            _C.sparse_set_parts(source, indices, values, sparse_dim, dense_dim, sizes, bool(coalesced))
            results.append(source)
        else:
            results.append(aten._sparse_coo_tensor_with_dims_and_tensors.default(
                sparse_dim, dense_dim, sizes, indices, values, dtype=values.dtype, layout=torch.sparse_coo,
                device=runtime.device, pin_memory=False, is_coalesced=bool(coalesced)))
    return results[0] if len(results) == 1 else tuple(results)


def _lazy(runtime, value, descriptor, base):
    dtype, shape, strides, offset = descriptor
    value.dtype = dtype
    return _C.make_lazy(value, runtime.recording, list(shape), list(strides), offset, base)


def _as_list(a) -> list:
    return list(a) if isinstance(a, (list, tuple)) else [a]


def _fallback(func, *args, **kwargs):
    return run_on_node(func, args, kwargs)


def _compressed(func, args, kwargs):
    raise NotImplementedError(f"{op_name(func)}: sparse compressed tensors (CSR, CSC, BSR, BSC) are not supported on "
                              "remote_accelerator; use sparse COO (to_sparse()) or dense tensors")


def _dense_to_sparse(func, args, kwargs):
    """aten::_to_sparse of a dense tensor on the device: runs on the node (its output is sparse)."""
    layout = kwargs.get("layout")
    if layout is not None and layout != torch.sparse_coo:
        raise NotImplementedError(f"{op_name(func)}: sparse {layout} tensors are not supported on remote_accelerator; "
                                  "use sparse COO (to_sparse()) or dense tensors")
    return run_on_node(func, args, kwargs)


# Ops of dense tensors whose output is sparse: the recorder hands them here (genie.python_ops).
HANDLERS = {
    aten._to_sparse.default: _dense_to_sparse,
    aten._to_sparse.sparse_dim: _dense_to_sparse,
    aten._to_sparse_csr.default: _compressed,
    aten._to_sparse_csc.default: _compressed,
    aten._to_sparse_bsr.default: _compressed,
    aten._to_sparse_bsc.default: _compressed,
}

_library = torch.library.Library("_", "IMPL")  # noqa: the registration lives as long as the module
_library.fallback(_fallback, "SparsePrivateUse1")


def _compressed_fallback(func, *args, **kwargs):
    _compressed(func, args, kwargs)


_library.fallback(_compressed_fallback, "SparseCsrPrivateUse1")
