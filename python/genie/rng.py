"""The node's random generator, as the runtime records it (a mixin of genie.runtime.Runtime).

Random ops (`torch.randn(..., device=...)`, dropout) draw from the node's generator, in program
order. `torch.manual_seed` seeds it (`genie::manual_seed`, docs/node.md); its state is read and
restored with `genie::get_rng_state` / `genie::set_rng_state` (torch.utils.checkpoint replays
dropout so). Each of these ops is recorded as writing the device's generator (Recording.rng),
like every op tagged `nondeterministic_seeded`, so none is dropped as dead and they run in
order with the random ops around them.
"""

from __future__ import annotations

import torch

from . import _C


def _genie_op(name: str):
    """genie-node's own operator `genie::<name>` (defined by genie.device.register())."""
    return getattr(torch.ops.genie, name).default


class RngOps:
    """The generator operations of one runtime (see the module docstring)."""

    _seed: int | None = None  # the last torch.manual_seed: runtimes made later start with it

    def __init__(self) -> None:
        self._rng_state_desc: tuple | None = None  # the generator state's (shape, strides, offset)
        if RngOps._seed is not None:
            self.manual_seed(RngOps._seed)

    @staticmethod
    def seed_all(seed: int) -> None:
        RngOps._seed = int(seed)

    def _forget_rng_state(self) -> None:
        self._rng_state_desc = None  # a new connection may reach a node with another generator

    def manual_seed(self, seed: int) -> None:
        """Seeds the node's generator (`genie::manual_seed`), in program order with the random
        ops around it. `seed` as torch.manual_seed takes it (negative: 0xffff_ffff_ffff_ffff + seed).
        RuntimeError when out of range."""
        seed = int(seed)
        if seed < 0:
            seed += 0xFFFF_FFFF_FFFF_FFFF
        if not 0 <= seed <= 0xFFFF_FFFF_FFFF_FFFF:
            raise RuntimeError(f"manual_seed: seed {seed} is out of range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff]")
        bits = seed - (1 << 64) if seed >= 1 << 63 else seed  # the uint64's bits as int64 (the schema's int)
        self._record_generator_op("manual_seed", bits)

    def _record_generator_op(self, name: str, *args, dtype: torch.dtype | None = None):
        """Records `genie::<name>(device, *args)`, which writes the node's generator; returns its
        output value when it has one (`dtype`)."""
        node = self.recording.append_node(_genie_op(name), (self.device, *args), {},
                                          [] if dtype is None else [dtype], [self.recording.rng])
        return node.outputs[0] if dtype is not None else None

    def get_rng_state(self):
        """The node generator's state at this point of the program (`genie::get_rng_state`), as
        a uint8 LazyTensor: recorded like a random op, in order. Its size is the node's
        generator's, asked once per connection (one round trip); later calls record only."""
        value = self._record_generator_op("get_rng_state", dtype=torch.uint8)
        if self._rng_state_desc is None:
            ((_, shape, strides, offset),) = self.describe([value])
            self._rng_state_desc = (list(shape), list(strides), offset)
        shape, strides, offset = self._rng_state_desc
        return _C.make_lazy(value, self.recording, shape, strides, offset)

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restores the node generator's state (`genie::set_rng_state`), in program order:
        `state` as get_rng_state returned it (on the device), or a host uint8 tensor.
        RuntimeError for a state of another device."""
        if _C.is_lazy(state):
            if state.device != self.device:
                raise RuntimeError(f"set_rng_state: a state of {state.device} given to {self.device}")
            arg = self.value_of(state)
        else:
            arg = state.detach().to(torch.uint8).contiguous().clone()
        self._record_generator_op("set_rng_state", arg)
