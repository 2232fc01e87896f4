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

from . import _C
from .graph import WEIGHT, Value

aten = torch.ops.aten
_FRESH_OPS = frozenset(map(id, (aten.empty.memory_format, aten.empty_strided.default)))


class Uploads:
    """The uploads of one runtime (see the module docstring); the work is the C++ runtime's
    (DeviceRuntime.put and .upload), which the recorder's kernel calls for `.to(device)`."""

    inline_max_bytes = 64 * 1024  # host tensors up to this size travel inline with a run

    def upload(self, cpu: torch.Tensor, residency: int, storage=None, source: torch.Tensor | None = None) -> Value:
        """Puts a host tensor on the node now (one PutTensors); returns its resident value (on
        `storage`, or a new one). A weight put before from `source`'s host bytes is not put again."""
        data = cpu.detach()
        if data.requires_grad or isinstance(data, torch.nn.Parameter):
            data = data.data
        return self.native.put(data, residency, storage, source)

    def _release_unheld(self, value: Value) -> None:
        """A resident value that no tensor holds: freed on the node once nothing queued reads it."""
        value.add_tensor()
        self.recording.note_dead(value)

    def upload_tensor(self, cpu: torch.Tensor, residency: int, source: torch.Tensor | None = None):
        """A new LazyTensor holding a copy of host tensor `cpu`: put on the node now, or, for an
        activation up to `inline_max_bytes`, travelling inline with the next run. `source`: the
        program's tensor whose bytes `cpu` holds (a weight uploaded before from the same bytes is
        not uploaded again), or None."""
        return self.native.upload(cpu, residency, source)

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
            _C.rebind(dst, self.upload(data, residency, value.storage, source=src))
            return
        uploaded = self.upload(data, residency)
        node = rec.append_node(aten.copy_.default, (value, uploaded), {}, [dst.dtype], [value.storage],
                               [value.storage])
        _C.rebind(dst, node.outputs[0])
        self._release_unheld(uploaded)  # freed once the copy has run
