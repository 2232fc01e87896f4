"""Progress bars of long transfers between the host and remote_accelerator (tqdm, on standard error).

Two kinds of transfer show one:
- A module's tensors moved by `module.to(device)` / `module.cpu()` / `module.to("cpu")`: one bar
  per call, in bytes, advanced as each parameter, buffer and gradient has moved (each is one
  request). The call is found as the outermost `torch.nn.Module._apply` frame on the stack; its
  total is the bytes of that module's parameters, their gradients and its buffers.
- A read of one contiguous tensor of at least `LARGE_READ_BYTES` (`.cpu()`, `.numpy()`, a copy to
  the host): read in `CHUNK_BYTES` slices (one request each), advanced per slice.

A bar appears only once its transfer has taken `DELAY_S` (about a second) and only when standard
error is a terminal; ``GENIE_PROGRESS=0`` turns bars off (and with them the reads in slices).
"""
from __future__ import annotations

import os
import sys
import weakref

import torch

from . import config

DELAY_S = 1.0  # a transfer shows its bar once it has taken this long
LARGE_READ_BYTES = 64 << 20  # bytes: a read of one tensor this large goes in slices, with a bar
CHUNK_BYTES = 16 << 20  # bytes per slice of a large read


def enabled() -> bool:
    """True when bars are wanted: GENIE_PROGRESS is on and standard error is a terminal."""
    if not config.get("GENIE_PROGRESS"):
        return False
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


def bar(total_bytes: int, desc: str):
    """A tqdm bar of `total_bytes` (binary units) that appears after DELAY_S."""
    from tqdm.auto import tqdm  # only when a transfer may show one

    try:  # a terminal that reports no size (a bare pty) gets 80 columns, not an empty bar
        sized = os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):
        sized = False
    return tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, delay=DELAY_S,
                leave=False, file=sys.stderr, dynamic_ncols=sized, ncols=None if sized else 80, nrows=None if sized else 24)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _ModuleTransfer:
    """The bar of one `Module._apply(fn)` call: the tensors it will move (by id) and the bytes
    moved. It closes when all have moved or when `fn` is freed (the call has returned)."""

    def __init__(self, module: torch.nn.Module, fn, desc: str) -> None:
        tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
        for p in module.parameters():
            if p.grad is not None:
                tensors[id(p.grad)] = p.grad
        self.total = sum(_nbytes(t) for t in tensors.values())
        self.expected = set(tensors)
        self.counted: set[int] = set()
        self.done = 0
        self.fn = weakref.ref(fn)
        self.bar = bar(self.total, desc)
        weakref.finalize(fn, self.close)

    def count(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        if key in self.counted or key not in self.expected:
            return
        self.counted.add(key)
        nbytes = _nbytes(tensor)
        self.done += nbytes
        self.bar.update(nbytes)
        if self.done >= self.total:
            self.close()

    def close(self) -> None:
        global _current
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if _current is self:
            _current = None


_current: _ModuleTransfer | None = None
_APPLY_CODE = torch.nn.Module._apply.__code__


def _outermost_apply():
    """The (module, fn) of the outermost `Module._apply(fn)` call on this thread's stack, or None."""
    frame = sys._getframe(2)
    found = None
    while frame is not None:
        if frame.f_code is _APPLY_CODE:
            found = frame
        frame = frame.f_back
    if found is None:
        return None
    local = found.f_locals
    module, fn = local.get("self"), local.get("fn")
    return (module, fn) if isinstance(module, torch.nn.Module) and fn is not None else None


def moved(tensor: torch.Tensor, device: torch.device | str) -> None:
    """Counts `tensor` (a module's parameter, gradient or buffer, before its conversion) as moved
    to `device` in the bar of the module call it belongs to, if any (see the module docstring)."""
    if not enabled():
        return
    call = _outermost_apply()
    if call is None:
        return
    module, fn = call
    global _current
    if _current is None or _current.fn() is not fn:
        if _current is not None:
            _current.close()
        target = torch.device(device)
        where = f"to {target}" if target.type != "cpu" else f"from {tensor.device}"
        try:
            _current = _ModuleTransfer(module, fn, f"genie: {type(module).__name__} {where}")
        except TypeError:  # an `fn` that cannot be weakly referenced: no bar
            return
    _current.count(tensor)


def large_read(tensor: torch.Tensor) -> bool:
    """True when reading `tensor` goes in slices with a bar: bars are on, it is contiguous and
    at least LARGE_READ_BYTES."""
    return _nbytes(tensor) >= LARGE_READ_BYTES and tensor.is_contiguous() and enabled()
