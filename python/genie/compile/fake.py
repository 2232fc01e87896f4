"""FakeTensors on remote_accelerator, as torch.compile traces with them.

Dynamo and AOTAutograd run the program on FakeTensors of the inputs' device. A meta kernel run
on a FakeTensor returns a view that keeps the FakeTensor's dispatch keys (PrivateUse1), and
`FakeTensor.__new__` detaches its meta tensor (`Tensor._make_subclass`) outside the meta
dispatch: on CUDA that `detach` is a C++ composite kernel; on remote_accelerator it reaches the
recorder's PrivateUse1 kernel, which takes LazyTensors only, hands the call to Python, and the
tensor comes back with a plain Python object that `_make_subclass` refuses ("already
associated to a python object of type Tensor"). `install()` makes `FakeTensor.__new__` run with
the Meta key included, as FakeTensorMode does around a kernel, when the device is
remote_accelerator: the detach is the meta one and nothing reaches the recorder.

(The recorder's C++ kernel could take `detach`/`alias` of a non-LazyTensor itself; until it
does, this is the seam.)
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

_installed = False


def install() -> None:
    """Wraps FakeTensor.__new__ once (idempotent)."""
    global _installed
    if _installed:
        return
    original = FakeTensor.__new__

    def __new__(cls, fake_mode, elem, device, *args, **kwargs):
        if torch.device(device).type != "remote_accelerator":
            return original(cls, fake_mode, elem, device, *args, **kwargs)
        previous = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            return original(cls, fake_mode, elem, device, *args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(previous)

    FakeTensor.__new__ = staticmethod(__new__)
    _installed = True
