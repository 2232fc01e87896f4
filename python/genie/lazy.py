"""LazyTensor: the `torch.Tensor` subclass that stands for a tensor on `remote_accelerator`.

A LazyTensor owns no memory: its TensorImpl (made by `genie._C.make_lazy` from a descriptor
(sizes, strides, storage offset, dtype) that shape inference computed locally) carries the
PrivateUse1 dispatch keys and no Python key, so `.shape`, `.dtype`, `.device` and `.size()` never
cost a round trip and every aten op on it passes autograd as on any device and reaches the
recorder's PrivateUse1 kernel (python/csrc/dispatch_fallback.cc), which records it. Its value
(`_cell.value`, a `genie.graph.Value`) is either pending in the runtime's graph or resident on
the node under a handle.

Materialization points (`.cpu()`, `.item()`, `.tolist()`, `.numpy()`, `bool()`, `print`,
`__index__`) reach the runtime through the aten ops PyTorch calls for them
(`aten::_to_copy`, `aten::_local_scalar_dense`, ...), plus the overrides below for the
methods PyTorch does not route through the dispatcher.
"""

from __future__ import annotations

import threading

import torch

from . import _C
from .graph import Value, op_name


class Cell:
    """The current `value` (a `genie.graph.Value`) of one LazyTensor: in-place ops rebind it.
    One object per tensor, held by its TensorImpl (`genie._C.lazy_state`) and by its runtime
    (`Runtime._refs`, until the tensor dies: the TensorImpl's destructor queues the value as
    dead, python/csrc/recorder_fast.cc `releaseState`)."""

    __slots__ = ("value",)


# The process lock: recording, runs and every entry point into the runtimes hold it, so threads
# are serialized op by op (genie.runtime "Threads"; `genie.runtime.lock` is this object).
lock = threading.RLock()


class LazyTensor(torch.Tensor):
    """A tensor on `remote_accelerator:N` whose ops are recorded, not run.

    `desc` is (shape, strides, storage_offset, dtype). The recording state lives in the C++
    TensorImpl (so PyTorch's shallow copies carry it): `_cell` (a `Cell`: its current `Value`),
    `_runtime` (the `genie.runtime.Runtime` of its device), `_desc` (its descriptor).
    """

    @staticmethod
    def __new__(cls, desc: tuple, value: Value, runtime, base: torch.Tensor | None = None) -> "LazyTensor":
        return cls._make(desc, False, value, runtime, base)

    # LazyTensor._make(desc, contiguous, value, runtime, base=None): `LazyTensor(desc, value,
    # runtime, base)`; `contiguous` says that desc's strides are the default ones of its shape
    # and its offset 0 (the wrapper is then made faster). `base`: the tensor this one is a view
    # of, if any; the view is an inference tensor exactly when its base is one, as PyTorch's
    # views are (`genie._C.make_wrapper`). The TensorImpl gets the descriptor, a `Cell` holding
    # `value` (registered in `runtime._refs`) and the runtime; `value.tensors` and
    # `value.storage.live` count it. In C++ (`genie._C.make_lazy`, python/csrc/recorder_fast.cc).
    _make = classmethod(_C.make_lazy)

    @property
    def _cell(self) -> Cell:
        return _C.lazy_state(self)[0]

    @property
    def _runtime(self):
        return _C.lazy_state(self)[1]

    @property
    def _desc(self) -> tuple:
        return _C.lazy_state(self)[2]

    @_desc.setter
    def _desc(self, desc: tuple) -> None:
        _C.set_lazy_desc(self, desc)

    # Only the dispatcher level is intercepted (the PrivateUse1 kernel): no per-call
    # __torch_function__ overhead.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def operation(self) -> str | None:
        """The aten op that will produce this tensor ("aten::add.Tensor"), None once resident."""
        node = self._cell.value.node
        return None if node is None else op_name(node.op)

    @property
    def inputs(self) -> list:
        """The pending op's tensor inputs (`genie.graph.Value`s); [] once resident."""
        node = self._cell.value.node
        return [] if node is None else list(node.inputs())

    # Methods PyTorch does not send through the dispatcher for a remote device.
    def numpy(self, *, force: bool = False):
        """Materializes: the tensor's values as a NumPy array (a copy on the host)."""
        return self.cpu().numpy(force=force)

    def tolist(self):
        """Materializes: the tensor's values as (nested) Python lists."""
        return self.cpu().tolist()

    def __array__(self, dtype=None, copy=None):
        array = self.cpu().numpy()
        return array if dtype is None else array.astype(dtype)

    def __format__(self, format_spec: str) -> str:
        """`f"{loss:.4f}"`: a 0-dim tensor formats as its Python number (materializes), as
        torch.Tensor.__format__ does for plain tensors only; other shapes as torch.Tensor."""
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents=None) -> str:
        text = repr(self.cpu())
        return text[:-1] + f", device='{self.device}')"

    @property
    def data(self) -> "LazyTensor":
        """The same value, outside autograd (as `Tensor.data`)."""
        return self.detach()

    @data.setter
    def data(self, new: "LazyTensor") -> None:
        """`tensor.data = new`: the wrapper takes `new`'s dtype, shape and strides and holds its
        value (Module.half(), Module.to(dtype), Module.float() on a module already on the
        device do this to each parameter). Raises TypeError for a tensor of another device."""
        if type(new) is not LazyTensor or new._runtime is not self._runtime:
            raise TypeError(f"data: cannot give a tensor on {self.device} the data of a tensor on {new.device}")
        with lock:
            torch._C.TensorBase.data.__set__(self, new)  # the wrapper's metadata
            self._desc = new._desc
            self._runtime.assign(self, new._cell.value)

    def __deepcopy__(self, memo):
        """copy.deepcopy (of a module, say): a copy on the same device (a recorded clone)."""
        found = memo.get(id(self))
        if found is not None:
            return found
        with torch.no_grad():
            new = self.clone(memory_format=torch.preserve_format)
        new.requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True  # nn.Parameter of a tensor subclass (Parameter.__new__)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, protocol):
        """Pickling (torch.save of a state dict, say) saves the values as a CPU tensor: loading
        gives CPU tensors, as torch.load(..., map_location="cpu") would."""
        return self.detach().cpu().__reduce_ex__(protocol)


from . import shape_rules as _shape_rules  # noqa: E402
from .recorder import dispatch as _dispatch  # noqa: E402 - the recorder imports LazyTensor
from .recorder import record_op as _record_op  # noqa: E402

_shape_rules.lazy_type = LazyTensor  # the shapes layer reads LazyTensor descriptors without importing capture
# The PrivateUse1 kernel records under the process lock: the C++ plan path first, these for the rest.
_C.configure_fallback(LazyTensor, lock, _dispatch, _record_op)
