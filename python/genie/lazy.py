"""LazyTensor: the Python class of tensors on `remote_accelerator`, and the process lock.

A LazyTensor owns no memory. Its TensorImpl (python/csrc/frontend/lazy_tensor.h) carries the
geometry shape inference computed locally and the PrivateUse1 dispatch keys, no Python key, so
`.shape`, `.dtype`, `.device` and `.size()` never cost a round trip, and every aten op on it
passes autograd as on any device and reaches the recorder's PrivateUse1 kernel
(python/csrc/dispatch_kernel.cc), which records it in C++. Its value (`_value`, a
`genie.graph.Value`) is either pending in its device's graph or resident on the node.

Materialization points (`.cpu()`, `.item()`, `.tolist()`, `.numpy()`, `bool()`, `print`,
`__index__`) reach the runtime through the aten ops PyTorch calls for them
(`aten::_to_copy`, `aten::_local_scalar_dense`, ...), plus the overrides below for the
methods PyTorch does not route through the dispatcher.

`lock` is the process lock (python/csrc/frontend/lock.h): recording, runs and every entry point
into the runtimes hold it, so threads are serialized op by op, as one CUDA stream serializes
kernels. It is recursive, and waits with the GIL released.
"""

from __future__ import annotations

import torch

from . import _C
from .graph import Value

lock = _C.process_lock

def storage_owner(storage) -> "tuple[LazyTensor, int] | None":
    """(a LazyTensor holding the value of `storage`'s bytes, the byte offset where `storage`
    starts in that tensor's storage) for a torch.UntypedStorage on remote_accelerator, or None
    when no value is known (frontend/device_storage.h):
    - a storage `untyped_storage()` handed out holds the value of the tensor spanning it;
    - a storage allocated from the host (`torch.UntypedStorage(n, device=...)`,
      `Storage.to(device)`) holds a new uint8 [nbytes] `torch.empty` from its first use;
    - a slice of either (`storage[a:b]`) is found inside the other's address range."""
    return _C.storage_tensor(storage, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=storage.device))


class LazyTensor(torch.Tensor):
    """A tensor on `remote_accelerator:N` whose ops are recorded, not run.

    `_value` is the `genie.graph.Value` it holds now (an in-place op rebinds it), `_runtime` the
    `genie.runtime.Runtime` of its device, `_desc` its (shape, strides, storage offset, dtype).
    """

    # Only the dispatcher level is intercepted (the PrivateUse1 kernel): no per-call
    # __torch_function__ overhead.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def _value(self) -> Value:
        return _C.lazy_value(self)

    @property
    def _runtime(self):
        recording = _C.lazy_recording(self)
        return None if recording is None else recording.runtime

    @property
    def _desc(self) -> tuple:
        return (tuple(self.shape), self.stride(), self.storage_offset(), self.dtype)

    @property
    def operation(self) -> str | None:
        """The aten op that will produce this tensor ("aten::add.Tensor"), None once resident."""
        node = self._value.node
        return None if node is None else node.name

    @property
    def inputs(self) -> list:
        """The pending op's tensor inputs (`genie.graph.Value`s); [] once resident."""
        node = self._value.node
        return [] if node is None else node.inputs()

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """AOTAutograd (torch.compile) traced the backward with plain tensors, and a LazyTensor
        is one to it (no Python dispatch key): a gradient arriving as a LazyTensor is used as it is."""
        return self if expected_type in (None, torch.Tensor) else None

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

    def untyped_storage(self) -> torch.UntypedStorage:
        """The storage, as torch.Tensor.untyped_storage. It holds the value of the tensor that
        spans it (the view's base, else this tensor) from now on, so that `other.set_(storage,
        ...)` and storage reads view that value (genie.lazy.storage_owner)."""
        storage = super().untyped_storage()
        _C.pin_storage(self._base if self._base is not None else self)
        return storage

    @property
    def data(self) -> "LazyTensor":
        """The same value, outside autograd, with a version counter of its own (as
        `Tensor.data`: in-place changes through it do not bump this tensor's version)."""
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new: "LazyTensor") -> None:
        """`tensor.data = new`: the tensor takes `new`'s dtype, shape and strides and holds its
        value (Module.half(), Module.to(dtype), Module.float() on a module already on the device
        do this to each parameter; LazyTensorImpl::shallow_copy_from). Raises TypeError for a
        tensor of another device."""
        mine, theirs = _C.lazy_recording(self), _C.lazy_recording(new)
        if theirs is None or theirs.device_index != mine.device_index:
            raise TypeError(f"data: cannot give a tensor on {self.device} the data of a tensor on {new.device}")
        torch._C.TensorBase.data.__set__(self, new)

    def __copy__(self):
        """copy.copy: a shallow copy, as eager's (a new tensor on the same storage and value, with
        the same requires_grad): writes through either show in both."""
        new = torch._C.TensorBase.data.__get__(self)
        new.requires_grad_(self.requires_grad)
        return new

    def __reduce_ex__(self, protocol):
        """Pickling (torch.save) as a plain device tensor, as CUDA's: its storage is saved with its
        device's location tag ("remote_accelerator:0"), and torch.load, weights_only included,
        rebuilds it on that device (or map_location's) without naming this class."""
        return self._reduce_ex_internal(protocol)
