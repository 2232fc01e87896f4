"""The `remote_accelerator` device: PyTorch's PrivateUse1 backend, renamed (seed 003).

`register()` (run by `import genie`) does what PyTorch needs for a new device:
- `torch.utils.rename_privateuse1_backend("remote_accelerator")`, so that
  `torch.device("remote_accelerator:0")` parses; `genie._C` registers its device guard;
- `torch.remote_accelerator` (this module's device functions, and genie.accelerator's memory
  and device-information functions) via `torch._register_device_module`, and the generated `Tensor.remote_accelerator()` / `Tensor.is_remote_accelerator` helpers;
- the node's own operators `genie::manual_seed`, `genie::get_rng_state` and `genie::set_rng_state`,
  which `torch.manual_seed` and the device's RNG-state functions reach;
- `torch.nn.Module.to` wrapped once (`_module_to`): on a cluster (two or more nodes), a host
  module's `.to("remote_accelerator")` without an index defers it, to be placed over the nodes
  at its first call (genie.placed.defer); every other call is torch's;
- genie.accelerator's hooks, through which `torch.accelerator` (synchronize, memory_allocated,
  memory_stats, get_memory_info, ...) reaches the device (genie._C.set_accelerator_hooks);
- the recorder's PrivateUse1 kernel (genie._C, python/csrc/dispatch_kernel.cc): every op on a
  LazyTensor, and every factory with a remote_accelerator device, reaches it;
- AutogradPrivateUse1 kernels for the composite ops kept whole (SDPA, LSTM, GRU), which take a
  differentiable path when a gradient flows, and for `ctc_loss` with host lengths.
"""

from __future__ import annotations

import types

import torch

from . import _C  # loading it registers the PrivateUse1 device guard, hooks and allocator
from .accelerator import _device_of, device_count

_registered = False
_library = None
_genie_library = torch.library.Library("genie", "DEF")  # noqa: TOR901 - the node's operators



def synchronize(device=None) -> None:
    """Runs every pending op whose result is still held (all devices when `device` is None),
    sends the batched frees, and waits for the asynchronous runs sent before. Raises
    GenieRemoteError (also for a failed asynchronous run) / GenieConnectionError."""
    from .runtime import all_runtimes, lock, runtime_for
    with lock:
        for runtime in all_runtimes() if device is None else [runtime_for(_device_of(device))]:
            runtime.flush()


def _device_module() -> types.ModuleType:
    module = types.ModuleType("torch.remote_accelerator")
    module.is_available = lambda: True
    module.device_count = device_count
    module.current_device = lambda: _C.current_device()
    module.set_device = _set_device
    module.device = _DeviceContext  # `with torch.remote_accelerator.device(i):` (torch.utils.checkpoint)
    module._initialized = True  # torch.utils.checkpoint then saves and restores this device's RNG state
    module.synchronize = synchronize
    module._is_in_bad_fork = lambda: False
    # torch.autocast("remote_accelerator", dtype=...): PyTorch's AutocastPrivateUse1 policy casts
    # the inputs of matmuls and convolutions; the casts are recorded like any op.
    module.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    module.is_bf16_supported = lambda including_emulation=True: True
    # Random ops draw from the node's generator; torch.manual_seed reaches it through
    # manual_seed_all (genie::manual_seed), its state through get/set_rng_state.
    from .runtime import locked, manual_seed_all, runtime_for
    module.manual_seed = manual_seed_all  # one generator per node: the device's is the node's
    module.manual_seed_all = manual_seed_all
    module.get_rng_state = locked(lambda device=None: runtime_for(_device_of(device)).get_rng_state())
    module.set_rng_state = locked(lambda state, device=None: runtime_for(_device_of(device)).set_rng_state(state))
    # Memory and device information as torch.cuda has them, from the node's figures (genie.accelerator).
    from . import accelerator
    for function in accelerator.FUNCTIONS:
        setattr(module, function.__name__, function)
    # The legacy storage classes (`tensor.storage_type()`, TypedStorage's `_get_legacy_storage_class`
    # looks them up here): torch's own (torch.FloatStorage, ...), as for every device but CUDA.
    for name in set(torch.storage._dtype_to_storage_type_map().values()):
        setattr(module, name, getattr(torch, name))
    return module


# The current device is c10's (genie._C.current_device: per thread, as CUDA's), so that Python
# (`torch.remote_accelerator.device(i)`, `set_device`) and C++ (c10::DeviceGuard, the autograd
# engine's device threads) agree, and `device="remote_accelerator"` without an index means it.


def _set_device(device) -> None:
    _C.set_current_device(_device_of(device).index)



_torch_module_to = torch.nn.Module.to


def _defer(module: torch.nn.Module) -> None:
    """Puts a host module on the cluster (genie.placed.defer; installed by `import genie`,
    the layer above the scheduler)."""
    raise RuntimeError("genie: the cluster's placement is not installed (import genie)")


def _module_to(self, *args, **kwargs):
    """`torch.nn.Module.to`, where `remote_accelerator` without an index means the cluster when
    this process has two or more nodes (`device_count() >= 2`): a module whose parameters and
    buffers are all on the host stays there, deferred (`genie.placed.defer`): its first call
    places it over the nodes (scheduler's goal "latency"). A dtype or memory format given with
    it applies on the host now. `.to("remote_accelerator")` of a module already deferred or
    placed so changes nothing else; `.to(device)` of one to any device undoes the deferral (the
    placement's hooks are removed) and moves it as torch does. Every other call (an index, one
    node, no device, another device type, a module with weights off the host) is torch's."""
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    deferred = self.__dict__.get("_genie_deferred")  # genie.placed.deferred_of, without loading the scheduler
    cluster = device is not None and device.type == "remote_accelerator" and device.index is None
    if cluster and (deferred is not None or (device_count() >= 2 and _on_host(self))):
        if dtype is not None or memory_format is not None:
            _torch_module_to(self, dtype=dtype, memory_format=memory_format)
        if deferred is None:
            _defer(self)
        return self
    if device is not None and deferred is not None:
        deferred.cancel()  # to another device: off the cluster
    return _torch_module_to(self, *args, **kwargs)


def _on_host(module: torch.nn.Module) -> bool:
    """The module has parameters or buffers, all on the host."""
    tensors = list(module.parameters()) + list(module.buffers())
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


class _DeviceContext:
    """`with torch.remote_accelerator.device(i):` makes i the current device inside."""

    def __init__(self, device) -> None:
        self.index = _device_of(device).index

    def __enter__(self):
        self.previous = _C.current_device()
        _C.set_current_device(self.index)
        return self

    def __exit__(self, *exc) -> None:
        _C.set_current_device(self.previous)


# (graph id, its inputs' geometry) -> its outputs' (sizes, strides, dtype), as a compiled part's
# capture recorded them (genie.compile): genie::call_graph's meta kernel.
_call_graph_outputs: dict[tuple, list[tuple]] = {}


def _geometry(tensors) -> tuple:
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors)


def note_call_graph_outputs(graph: str, inputs: list[torch.Tensor], outputs) -> None:
    """Part `graph` (32 hex digits) called on `inputs` (graph input order) returns tensors of
    the geometry of `outputs`: what genie::call_graph's meta kernel answers for such inputs."""
    _call_graph_outputs[(graph, _geometry(inputs))] = [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in outputs]


def _call_graph_meta(graph: str, outputs: list[int], inputs: list[torch.Tensor],
                     written: list[torch.Tensor]) -> list[torch.Tensor]:
    """genie::call_graph's meta kernel: fresh tensors (a call's outputs own their storage) of
    the geometry noted for these inputs (`written`, inputs the part writes in place, change no
    geometry). Raises NotImplementedError for inputs of another geometry than the part was
    captured with."""
    noted = _call_graph_outputs.get((graph, _geometry(inputs)))
    if noted is None:
        raise NotImplementedError(f"genie::call_graph: part {graph} was not captured for inputs of this geometry")
    return [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in noted]


def register() -> None:
    global _registered, _library
    if _registered:
        return
    torch.utils.rename_privateuse1_backend("remote_accelerator")
    torch._register_device_module("remote_accelerator", _device_module())
    # torch.accelerator's synchronize and memory functions reach genie through c10 (the device
    # guard, the device allocator), which call these hooks.
    from .accelerator import AcceleratorHooks
    _C.set_accelerator_hooks(AcceleratorHooks())
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)
    aten = torch.ops.aten
    _library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kernels for a new backend
    # genie-node's own operators (src/node/executor.cc), so that graphs can name them; they
    # only ever run on the node.
    _genie_library.define("manual_seed(Device device, int seed) -> ()")
    _genie_library.define("get_rng_state(Device device) -> Tensor")
    _genie_library.define("set_rng_state(Device device, Tensor state) -> ()")
    # A compiled part (genie.compile, src/node/compiled_parts.h): one op of the recorded graph;
    # its outputs' shapes come from the part's capture. `written`: the inputs it writes in place
    # (a KV cache's update), declared so that the recorder and autograd see the writes.
    _genie_library.define("call_graph(str graph, int[] outputs, Tensor[] inputs, Tensor(a!)[] written) -> Tensor[]")
    _genie_library.impl("call_graph", _call_graph_meta, "Meta")
    # Composite ops kept whole: the recorder's PrivateUse1 kernel stops PyTorch from decomposing
    # them, so the node runs its fused kernel and the graph shows attention as such. A kernel for
    # a composite op has no derivative, so its AutogradPrivateUse1 kernel takes a differentiable
    # path when autograd needs one.
    _C.register_recorder_kernels(list(_WHOLE_OPS))
    _library.impl("scaled_dot_product_attention", _sdpa_autograd, "AutogradPrivateUse1")
    for name in _WHOLE_RNN_OPS:
        packet, overload = name.split(".")
        _library.impl(name, _rnn_autograd(getattr(getattr(aten, packet), overload)), "AutogradPrivateUse1")
    from .compat import ctc_loss_on_device
    _library.impl("ctc_loss.Tensor", ctc_loss_on_device, "AutogradPrivateUse1")
    torch.UntypedStorage._swap_data_ptr_ = _swap_data_ptr_
    torch.nn.Module.to = _module_to  # remote_accelerator without an index: the cluster
    _registered = True


_storage_swap_data_ptr = torch.UntypedStorage._swap_data_ptr_


def _swap_data_ptr_(self, other):
    """`UntypedStorage._swap_data_ptr_(other)`: for two storages of one remote_accelerator device
    and the same size, their bytes are exchanged on the node (three recorded copies), so that
    every tensor on either storage reads the other's bytes, as after eager's swap of the data
    pointers; a LazyTensor holds its node value, which a swap of client-side pointers would not
    move. NotImplementedError for an empty storage and a non-empty one (eager swaps those too).
    Storages of other devices, and mismatched ones (PyTorch's errors), take torch's own."""
    remote = "remote_accelerator"
    if self.device.type == remote and other.device == self.device and 0 in (self.nbytes(), other.nbytes()) and \
            self.nbytes() != other.nbytes():
        raise NotImplementedError("UntypedStorage._swap_data_ptr_: swapping with an empty storage is not supported on "
                                  "remote_accelerator (a storage cannot hand its tensors another node value)")
    if self.device.type != remote or other.device != self.device or self.nbytes() != other.nbytes():
        return _storage_swap_data_ptr(self, other)
    if self.data_ptr() == other.data_ptr():
        return None
    kept = torch.UntypedStorage(self.nbytes(), device=self.device)
    kept.copy_(self)
    self.copy_(other)
    other.copy_(kept)
    return None


# Recurrent layers kept whole as well: PyTorch's composite LSTM and GRU pick the fused cells
# (`aten::_thnn_fused_lstm_cell`, `aten::_thnn_fused_gru_cell`) for any device that is not the
# CPU, and those exist for CUDA only, so a CPU node could not run them. Recorded whole, the
# node runs its own device's implementation (the CPU one, or cuDNN on a GPU).
_WHOLE_RNN_OPS = ("lstm.input", "gru.input", "lstm.data", "gru.data")  # .data: packed sequences
_WHOLE_OPS = ("scaled_dot_product_attention",) + _WHOLE_RNN_OPS


def _sdpa_autograd(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    """aten::scaled_dot_product_attention at the autograd level of remote_accelerator.

    Without gradients (inference): below autograd, so the whole op is recorded and the node
    runs its fused kernel. When a gradient must flow through it (grad mode on, an input that
    requires grad), a differentiable op the node can run forward and backward:
    - on a node that runs the CPU's kernels, the one the CPU picks for these arguments
      (`torch._fused_sdp_choice` of CPU tensors of the same geometry): its flash kernel
      (`aten::_scaled_dot_product_flash_attention_for_cpu`, whose backward autograd records),
      so training gives the CPU's results; else
    - PyTorch's math decomposition (`aten::_scaled_dot_product_attention_math`: matmuls,
      softmax, dropout), whose ops autograd differentiates. The client cannot choose a fused
      kernel with a backward for a GPU node (CUDA flash or memory-efficient); the math path is
      correct on every device, within float rounding of the fused kernels."""
    if _gradient_flows((query, key, value, attn_mask)):
        if _cpu_picks_flash(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
            if attn_mask is not None and attn_mask.dtype == torch.bool:  # as the CPU's SDPA converts it
                attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device).masked_fill_(
                    attn_mask.logical_not(), float("-inf"))
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.scaled_dot_product_attention.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _cpu_picks_flash(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    """Whether `query`'s node runs the CPU's kernels and the CPU's SDPA would take its flash
    kernel for arguments of this geometry, dtype and requires_grad (`torch._fused_sdp_choice`)."""
    from .record import runtime_of
    if enable_gqa or not runtime_of(query).recording.cpu_kernels:
        return False

    def like(t):
        if t is None:
            return None
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad)

    choice = torch._fused_sdp_choice(like(query), like(key), like(value), like(attn_mask), dropout_p, is_causal,
                                     scale=scale)
    return choice == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)


def _gradient_flows(args) -> bool:
    """Grad mode is on and a tensor among `args` (or in a list or tuple among them) requires grad."""
    return torch.is_grad_enabled() and _requires_grad(args)


def _requires_grad(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
        if isinstance(a, (list, tuple)) and _requires_grad(a):
            return True
    return False


def _rnn_autograd(op):
    """aten::lstm / aten::gru (.input, and .data for packed sequences) at the autograd level of
    remote_accelerator: recorded
    whole below autograd (inference), or, when a gradient must flow through it, PyTorch's own
    decomposition into differentiable ops (`torch._decomp`: matmuls, sigmoid, tanh per step),
    which autograd differentiates and the node runs forward and backward."""

    def kernel(*args):
        if _gradient_flows(args):
            from torch._decomp import decomposition_table
            return decomposition_table[op](*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel
