"""Host tensors put on the node, as the runtime does it (a mixin of genie.runtime.Runtime).

- `upload` puts a host tensor on the node now (one PutTensors) and returns its resident value;
  parameters are PersistentWeight, the rest EphemeralActivation. While the device's recording
  names a co-location group (`Recording.colocation_group`, set by genie.placed), weights carry
  it: the node admits the group whole and keeps them (schemas/genie.fbs Colocation).
- `copy_from_host` is `dst.copy_(src)` for a host `src`: parameters and tensors over
  `inline_max_bytes` are put on the node now; smaller ones travel inline with the next run (no
  round trip). A freshly made `dst` (`tensor.to(device)`) simply becomes the uploaded value.
- A weight whose host bytes were uploaded before (tied weights: GPT-2's lm_head and wte are one
  Parameter, moved once per module by `module.to`) gets the value already resident, so it
  travels and occupies node memory once.
- Small integer and bool uploads keep their host copy (genie.host_eval): reads the host can
  answer exactly need no round trip.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _C
from .graph import WEIGHT, Value, new_handle

aten = torch.ops.aten
_FRESH_OPS = frozenset(map(id, (aten.empty.memory_format, aten.empty_strided.default)))


class Uploads:
    """The uploads of one runtime (see the module docstring)."""

    inline_max_bytes = 64 * 1024  # host tensors up to this size travel inline with a run

    def __init__(self) -> None:
        # Host bytes of uploaded weights -> (a weak reference to their host storage, their handle).
        self._weights: dict[tuple, tuple[StorageWeakRef, bytes]] = {}

    def upload(self, cpu: torch.Tensor, residency: int, storage=None) -> Value:
        """Puts a host tensor on the node now (one PutTensors); returns its resident value (on
        `storage`, or a new one)."""
        handle = new_handle()
        data = cpu.detach()
        if data.requires_grad or isinstance(data, torch.nn.Parameter):
            data = data.data
        item = (handle, data, residency)
        group = self.recording.colocation_group
        if group and residency == WEIGHT:  # the scheduler's co-location hint (genie.placed)
            item += (group, self.recording.colocation_bytes)
        self._request("put", [item])  # no report of failed runs here: the handle would leak
        if self.lineage is not None:
            self.lineage.put([(handle, data, residency)])
        value = Value.resident(storage, data.dtype, handle, residency)
        value.shape = tuple(data.shape)
        self.recording.note_resident(value)
        if _C.keeps_host_copy(data.dtype, data.numel() * data.element_size()):
            value.host = data.clone()
        if self._interrupt is not None:
            self._release_unheld(value)  # no tensor will hold it: freed with the next request
            self._raise_interrupt()
        return value

    def _release_unheld(self, value: Value) -> None:
        """A resident value that no tensor holds: freed on the node once nothing queued reads it."""
        value.add_tensor()
        self.recording.note_dead(value)

    def upload_tensor(self, cpu: torch.Tensor, residency: int, source: torch.Tensor | None = None):
        """A new LazyTensor holding a copy of host tensor `cpu` (contiguous): put on the node now,
        or, for an activation up to `inline_max_bytes`, travelling inline with the next run.
        `source`: the program's tensor whose bytes `cpu` holds (a weight uploaded before from the
        same bytes is not uploaded again), or None."""
        data = cpu if cpu.storage_offset() == 0 and cpu.is_contiguous() else cpu.contiguous()
        if residency != WEIGHT and data.numel() * data.element_size() <= self.inline_max_bytes:
            source = data.detach().clone()  # a snapshot, as .to() makes
            value = self.recording.append_node(aten.alias.default, (source,), {}, [data.dtype]).outputs[0]
            if _C.keeps_host_copy(source.dtype, source.numel() * source.element_size()):
                value.host = source
        else:
            value = self._upload_weight_once(source if source is not None else data, data, residency, None)
        return _C.make_lazy(value, self.recording, list(data.shape), list(data.stride()), 0)

    def copy_from_host(self, dst, src: torch.Tensor, residency: int) -> None:
        """`dst.copy_(src)` for a host `src` (see the module docstring)."""
        data = src
        same_layout = (src.dtype == dst.dtype and src.shape == dst.shape and src.stride() == dst.stride()
                       and src.storage_offset() == 0 and src.device.type == "cpu")
        if not same_layout or not src.is_contiguous():
            data = torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype)
            data.copy_(src)
        elif src.requires_grad:
            data = src.detach()
        value = self.value_of(dst)
        node = value.node
        fresh = (node is not None and id(node.op) in _FRESH_OPS and value.tensors == 1
                 and value.storage.live == 1 and dst.storage_offset() == 0)
        inline = residency != WEIGHT and data.numel() * data.element_size() <= self.inline_max_bytes
        if fresh:
            self.recording.drop_last(node)  # the empty tensor is never needed
        rec = self.recording
        if inline:
            source = data.clone() if data is src else data  # a snapshot, as .to() makes
            if fresh:
                node = rec.append_node(aten.alias.default, (source,), {}, [dst.dtype], [], [value.storage])
                if _C.keeps_host_copy(source.dtype, source.numel() * source.element_size()):
                    node.outputs[0].host = source
            else:
                node = rec.append_node(aten.copy_.default, (value, source), {}, [dst.dtype], [value.storage],
                                       [value.storage])
            _C.rebind(dst, node.outputs[0])
            return
        if fresh:
            _C.rebind(dst, self._upload_weight_once(src, data, residency, value.storage))
            return
        uploaded = self.upload(data, residency)
        node = rec.append_node(aten.copy_.default, (value, uploaded), {}, [dst.dtype], [value.storage],
                               [value.storage])
        _C.rebind(dst, node.outputs[0])
        self._release_unheld(uploaded)  # freed once the copy has run

    def _upload_weight_once(self, src: torch.Tensor, data: torch.Tensor, residency: int, storage) -> Value:
        """Uploads `data`, or for a weight whose host bytes were uploaded before, returns the
        value already resident. The host bytes are named by their storage's address, offset,
        shape, strides, dtype and version, and the entry holds a weak reference to that storage:
        once it is freed, a new storage at the same address (the next model's weights) is not
        mistaken for it."""
        if residency != WEIGHT:
            return self.upload(data, residency, storage=storage)
        host = src.untyped_storage()
        key = (host.data_ptr(), src.storage_offset(), tuple(src.shape), src.stride(), src.dtype, src._version)
        entry = self._weights.get(key)
        if entry is not None and not entry[0].expired():
            known = self.recording.resident_value(entry[1])
            if known is not None and known.error is None:
                return known
        value = self.upload(data, residency, storage=storage)
        if len(self._weights) >= 4096:  # forget the weights whose host storage or value is gone
            self._weights = {k: e for k, e in self._weights.items()
                             if not e[0].expired() and self.recording.resident_value(e[1]) is not None}
        self._weights[key] = (StorageWeakRef(host), value.handle)
        return value
