"""Device tensors and the process lock.

A tensor on `remote_accelerator:N` is a plain `torch.Tensor`, as a CUDA tensor is. It owns no
memory: its TensorImpl (python/csrc/frontend/lazy_tensor.h) carries the geometry shape inference
computed locally and the PrivateUse1 dispatch keys, no Python key, so `.shape`, `.dtype`,
`.device` and `.size()` never cost a round trip, and every aten op on it passes autograd as on
any device and reaches the recorder's PrivateUse1 kernel (python/csrc/dispatch_kernel.cc), which
records it in C++. Its Genie state, the `genie.graph.Value` it holds now (pending in its device's
graph, or resident on the node) and its device's Recording, is the TensorImpl's BackendMeta,
which PyTorch carries over every shallow copy (`detach`, `.data`, `param.data = t`); `value_of`
reads it.

Materialization points (`.cpu()`, `.item()`, `.tolist()`, `bool()`, `print`, `__index__`) reach
the runtime through the aten ops PyTorch calls for them (`aten::_to_copy`,
`aten::_local_scalar_dense`, ...), as on CUDA; `.numpy()` raises PyTorch's error for a tensor
off the host, as on CUDA.

`lock` is the process lock (python/csrc/frontend/lock.h): recording, runs and every entry point
into the runtimes hold it, so threads are serialized op by op, as one CUDA stream serializes
kernels. It is recursive, and waits with the GIL released.
"""

from __future__ import annotations

import torch

from . import _C
from .graph import Value

lock = _C.process_lock


def is_lazy(tensor) -> bool:
    """Whether `tensor` is a tensor on remote_accelerator (its ops are recorded, not run)."""
    return _C.is_lazy(tensor)


def value_of(tensor: torch.Tensor) -> Value | None:
    """The `genie.graph.Value` a device tensor holds now (an in-place op rebinds it); None for
    any other tensor."""
    return _C.lazy_value(tensor)


def operation(tensor: torch.Tensor) -> str | None:
    """The aten op that will produce device tensor `tensor` ("aten::add.Tensor"); None once its
    value is resident on the node, or for any other tensor."""
    value = _C.lazy_value(tensor)
    node = None if value is None else value.node
    return None if node is None else node.name


def storage_owner(storage) -> "tuple[torch.Tensor, int] | None":
    """(a device tensor holding the value of `storage`'s bytes, the byte offset where `storage`
    starts in that tensor's storage) for a torch.UntypedStorage on remote_accelerator, or None
    when no value is known (frontend/device_storage.h):
    - a storage made for a tensor holds that tensor's value, which spans it;
    - a storage allocated from the host (`torch.UntypedStorage(n, device=...)`,
      `Storage.to(device)`) holds a new uint8 [nbytes] `torch.empty` from its first use;
    - a slice of either (`storage[a:b]`) is found inside the other's address range."""
    return _C.storage_tensor(storage, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=storage.device))
