"""Compatibility ops: aten ops that remote_accelerator handles as CUDA does, or refuses with a
clear error, instead of recording them as they are.

Host index tensors in advanced indexing are uploaded (as CUDA moves them); packed sequences
keep `batch_sizes` on the host; `ctc_loss` lengths may be host tensors; nested tensors and
storage access are refused naming what to do instead. Part of the capture layer
(docs/frontend.md "Layers"); the known limits are in docs/frontend.md.
"""
from __future__ import annotations

import warnings

import torch

from . import _C
from .graph import op_name
from .lazy import storage_owner
from .record import record_op, runtime_of

aten = torch.ops.aten


def _no_nested_tensors(func, args, kwargs):
    """aten::_nested_tensor_from_mask_left_aligned: remote_accelerator has no nested-tensor
    layout, so its answer to "can this padded batch become a nested tensor?" is False. This is
    the question nn.TransformerEncoder asks (with its default mask_check) before its inference
    fast path converts the batch; on False it stays dense, as PyTorch does for a device or
    configuration without that path. Its outputs then equal the CPU's with
    `enable_nested_tensor=False` everywhere, and the CPU's default at every non-padded position
    (the nested path writes zeros at padded positions)."""
    return False


def _nested_tensor_from_mask(func, args, kwargs):
    raise NotImplementedError(
        f"{op_name(func)}: nested tensors are not supported on remote_accelerator (nn.TransformerEncoder "
        "with mask_check=False takes this path in eval mode under no_grad); build the encoder with "
        "enable_nested_tensor=False, or keep mask_check=True (the default)")


def _set_storage(func, args, kwargs):
    """aten::set_ onto a storage (`x.set_(storage, offset, size, stride)`, and what PyTorch does
    for element access to a storage: `storage[i]`, `.tolist()`, `.cpu()`, `storage.copy_`):
    `x` becomes a view of the storage's value on the node (`as_strided` on the tensor holding
    it, genie.lazy.storage_owner, viewed as `x`'s dtype) and takes the storage. NotImplementedError
    for a storage whose value is not known (a copy-on-write storage from `_lazy_clone`) or whose
    bytes cannot be viewed as `x`'s dtype."""
    self, source = args[0], args[1]
    rest = dict(zip(("storage_offset", "size", "stride"), args[2:]), **kwargs)
    found = storage_owner(source) if _C.is_lazy(self) else None
    itemsize = self.element_size()
    view = None
    if found is not None and found[0].device == self.device and found[1] % itemsize == 0:
        owner, start = found
        if "size" in rest:
            offset, size = rest["storage_offset"], list(rest["size"])
            stride = list(rest.get("stride") or [])
        else:
            offset, size, stride = 0, [source.nbytes() // itemsize], []
        if not stride:
            stride = [1] * len(size)
            for i in range(len(size) - 2, -1, -1):
                stride[i] = stride[i + 1] * max(size[i + 1], 1)
        try:
            with torch.no_grad():  # the owner's whole storage, as elements of self's dtype
                flat = aten.as_strided.default(owner.detach(), [torch.Tensor.untyped_storage(owner).nbytes()
                                                                // owner.element_size()], [1], 0)
                if flat.dtype != self.dtype:
                    flat = aten.view.dtype(flat, self.dtype)
                view = aten.as_strided.default(flat, size, stride, offset + start // itemsize)
        except RuntimeError:
            view = None
    if view is None:
        raise NotImplementedError(
            f"{op_name(func)}: remote_accelerator can set a tensor onto a storage only when the storage's value on "
            "the node is known (untyped_storage() of a tensor, a storage allocated on the device, or a slice of "
            "one; not a copy-on-write storage) and its bytes can be viewed as the tensor's dtype; use the tensor "
            "instead")
    _C.rebind(self, _C.lazy_value(view))
    _C.set_geometry(self, size, stride, offset)
    _C.set_storage(self, source)
    return self


def _lazy_clone(func, args, kwargs):
    """aten::_lazy_clone (`Tensor._lazy_clone()`): the node clones the value; on the client the
    result takes a copy-on-write clone of the source's storage, as c10 makes one: both are COW
    tensors on the same data address until one is written (the recorder then gives it its own
    address range, frontend/device_storage.h)."""
    out = record_op(func, args, kwargs)
    if _C.is_lazy(out) and _C.is_lazy(args[0]):
        _C.lazy_clone_storage(out, args[0])
    return out


def _masked_scatter(func, args, kwargs):
    """aten::masked_scatter / masked_scatter_(self, mask, source): eager's check that `source`
    has at least as many elements as `mask` (broadcast to self's shape) has ones, raised at the
    op when the mask's values are known on the host without a request (an uploaded mask,
    genie.host_eval), as the CPU raises it. Otherwise the node raises it at the next
    materialization, as for any error that depends on values."""
    self, mask, source = args[0], args[1], args[2]
    where = f" (genie: {op_name(func)} on remote_accelerator, checked on the client)"
    if func is aten.masked_scatter_.default and isinstance(mask, torch.Tensor):
        # eager expands the mask to self's shape (expand_inplace), with expand's error: a CPU
        # tensor of the mask's shape over one element raises it word for word
        try:
            torch.empty_strided(mask.shape, [0] * mask.dim(), dtype=mask.dtype).expand(self.shape)
        except RuntimeError as error:
            raise RuntimeError(str(error) + where) from None
    if _C.is_lazy(mask) and mask.dtype == torch.bool and isinstance(source, torch.Tensor):
        host = runtime_of(mask).host_copy(mask)
        if host is not None:
            try:
                ones = int(torch.broadcast_to(host, self.shape).sum())
            except RuntimeError:
                ones = None  # the shapes do not broadcast: the recorder raises eager's error
            if ones is not None and source.numel() < ones:
                raise RuntimeError("Number of elements of source < number of ones in mask" + where[:-1] +
                                   " with the mask's values known on the host)")
    return record_op(func, args, kwargs)


def _indices(func, args, kwargs):
    """aten::index.Tensor / index_put / index_put_ / _index_put_impl_ (`x[idx]`, `x[mask] = v`)
    whose indices the C++ recorder hands over, made what eager's advanced indexing makes of them:
    - host index tensors are uploaded first, as on CUDA, where advanced indexing moves CPU
      indices to the indexed tensor's device (every other op keeps PyTorch's device error);
    - a uint8 mask is a bool mask, with eager's deprecation warning;
    - for a put of a value with other than one element, bool masks become indices
      (`mask.nonzero()`, which the node runs now), as eager's expandTensors does: how many
      elements a mask selects decides whether the value fits, and eager raises at once when it
      does not. On CUDA this is a synchronization too; a one-element value (`x[mask] = 0`) needs
      none, there and here.
    A bool mask of index.Tensor then takes the device's data-dependent path."""
    self, indices = args[0], args[1]
    if not _C.is_lazy(self) and any(i is not None and _C.is_lazy(i) for i in indices):
        # a host tensor indexed with device indices: eager's rule (indices on the CPU or on the
        # indexed tensor's device), as CUDA raises it
        raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor "
                           f"({self.device})")
    if not _C.is_lazy(self) or not indices:
        return record_op(func, args, kwargs)
    moved = []
    for i in indices:
        if i is not None and not _C.is_lazy(i) and i.dim() > 0:
            i = i.to(self.device)  # 0-dim host indices stay: they travel inline, as any 0-dim host tensor
        if i is not None and i.dtype == torch.uint8:
            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                          UserWarning, stacklevel=3)
            i = i.to(torch.bool)
        moved.append(i)
    value = args[2] if len(args) > 2 else None
    if (func is not aten.index.Tensor and isinstance(value, torch.Tensor) and value.numel() != 1
            and any(i is not None and i.dtype == torch.bool for i in moved)):
        moved = _masks_as_indices(self, moved)
    return record_op(func, (self, moved, *args[2:]), kwargs)


def _masks_as_indices(self, indices: list) -> list:
    """Each bool mask of `indices` as the long indices of its True elements, one per dimension
    it covers (expandTensors), after eager's check of its shape against `self`'s."""
    out = []
    for i in indices:
        if i is None or i.dtype != torch.bool:
            out.append(i)
            continue
        for j in range(i.dim()):
            src = len(out) + j
            if src >= self.dim() or i.shape[j] != self.shape[src]:
                break  # eager's error for a mask of the wrong shape: raised by the recorder's checks
        else:
            nonzero = i.nonzero()
            out.extend(nonzero.select(1, j) for j in range(i.dim()))
            continue
        return indices
    return out


def _rnn_with_batch_sizes(func, args, kwargs):
    """aten::lstm.data / aten::gru.data (an RNN over a packed sequence, recorded whole, see
    `device._WHOLE_RNN_OPS`): `batch_sizes` (args[1], int64 [T]) is a host tensor by design."""
    data, batch_sizes = args[0], args[1]
    if _C.is_lazy(batch_sizes):
        return record_op(func, args, kwargs)
    args = (data, batch_sizes.to(torch.int64), *args[2:])
    return record_op(func, args, kwargs, host_args=(1,))


def _pack_padded_sequence(func, args, kwargs):
    """aten::_pack_padded_sequence(input [T, B, *] or [B, T, *], lengths int64 [B] on the
    host, batch_first) -> (data [sum(lengths), *], batch_sizes int64 [T] on the host), as
    `torch.nn.utils.rnn.pack_padded_sequence` calls it (lengths sorted in decreasing order).
    `batch_sizes` is computed on the host from `lengths`, where PyTorch keeps it for every
    device; `data` is recorded as the time steps' valid rows, concatenated (slices and one
    cat). Raises RuntimeError for lengths PyTorch refuses (not decreasing, 0, past T)."""
    input, lengths = args[0], args[1]
    batch_first = args[2] if len(args) > 2 else kwargs.get("batch_first", False)
    if _C.is_lazy(lengths):
        raise RuntimeError(f"{op_name(func)}: 'lengths' argument should be a 1D CPU int64 tensor, "
                           f"but got 1D {lengths.device} Long tensor")
    lengths = lengths.to(torch.int64).tolist()
    steps = input.shape[1] if batch_first else input.shape[0]
    if any(n <= 0 for n in lengths):
        raise RuntimeError(f"{op_name(func)}: Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    if any(a < b for a, b in zip(lengths, lengths[1:])):
        raise RuntimeError(f"{op_name(func)}: `lengths` array must be sorted in decreasing order when "
                           "`enforce_sorted` is True. You can pass `enforce_sorted=False` to "
                           "pack_padded_sequence and/or pack_sequence to sidestep this requirement "
                           "if you do not need ONNX exportability.")
    if lengths and lengths[0] > steps:
        raise RuntimeError(f"{op_name(func)}: Expected sequence length to be larger than or equal to "
                           f"{lengths[0]}, but got {steps}")
    batch_sizes = [sum(1 for n in lengths if n > t) for t in range(lengths[0] if lengths else 0)]
    time_major = input.transpose(0, 1) if batch_first else input
    data = torch.cat([time_major[t, :size] for t, size in enumerate(batch_sizes)])
    return data, torch.tensor(batch_sizes, dtype=torch.int64)


def _pad_packed_sequence(func, args, kwargs):
    """aten::_pad_packed_sequence(data, batch_sizes on the host, ...): a composite op, reached
    here only under torch.inference_mode() (elsewhere PyTorch decomposes it above autograd). Its
    decomposition slices `data` with the host `batch_sizes`, as it does above autograd."""
    return func.decompose(*args, **kwargs)


def _ctc_loss_host_lengths(func, args, kwargs):
    """aten::ctc_loss.Tensor under torch.inference_mode() (elsewhere the same
    `ctc_loss_on_device` runs above autograd): CPU lengths are moved to the device, then
    PyTorch's composite runs."""
    return ctc_loss_on_device(*args, **kwargs)


def ctc_loss_on_device(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                       zero_infinity=False):
    """aten::ctc_loss.Tensor on remote_accelerator: the lengths may be CPU tensors beside device
    log_probs, as PyTorch allows on CUDA (`F.ctc_loss`); they are moved to the device (small
    uploads), then PyTorch's composite runs as for any device. Registered at the autograd level
    (`genie.device`); under torch.inference_mode() (no autograd keys) the recorder calls it
    (`_ctc_loss_host_lengths`)."""
    device = log_probs.device
    input_lengths = input_lengths.to(device)
    target_lengths = target_lengths.to(device)
    return torch.ops.aten.ctc_loss.Tensor.decompose(log_probs, targets, input_lengths, target_lengths, blank,
                                                    reduction, zero_infinity)


HANDLERS = {
    aten._nested_tensor_from_mask_left_aligned.default: _no_nested_tensors,
    aten._nested_tensor_from_mask.default: _nested_tensor_from_mask,
    aten.index.Tensor: _indices,
    aten.index_put.default: _indices,
    aten.index_put_.default: _indices,
    aten._index_put_impl_.default: _indices,
    aten.lstm.data: _rnn_with_batch_sizes,
    aten.gru.data: _rnn_with_batch_sizes,
    aten._pack_padded_sequence.default: _pack_padded_sequence,
    aten._pad_packed_sequence.default: _pad_packed_sequence,
    aten.ctc_loss.Tensor: _ctc_loss_host_lengths,
    aten.set_.source_Storage: _set_storage,
    aten._lazy_clone.default: _lazy_clone,
    aten.masked_scatter.default: _masked_scatter,
    aten.masked_scatter_.default: _masked_scatter,
    aten.set_.source_Storage_storage_offset: _set_storage,
}
# Handled here only when an index is a host tensor, a uint8 mask or a mask of a put (see _indices);
# the C++ recorder records the rest.
CONDITIONAL = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                         aten._index_put_impl_.default})
