"""`torch.compile(..., backend="genie", mode=..., options={...})`: what the backend accepts.

    torch.compile(model, backend="genie", options={"node": 1, "mode": "default"})

- `node` (int, default: the current remote_accelerator device): the device index,
  `remote_accelerator:<node>`, a graph runs on when its inputs are on the CPU. A graph whose
  inputs are on a remote_accelerator device runs on that device, and `node` must name it.
- `mode`: torch.compile's modes ("default", "reduce-overhead", "max-autotune",
  "max-autotune-no-cudagraphs"); also accepted as `torch.compile(mode=...)`. It travels as the
  name of each part's graph; the node's compile worker builds the max-autotune modes with
  Inductor's `max_autotune` (docs/compile.md).

Anything else raises ValueError naming the option and the accepted ones.
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = ("node", "mode")


@dataclass(frozen=True)
class CompileOptions:
    node: int | None  # None: the current device (genie._C.current_device) at compile time
    mode: str


def parse_options(mode: str | None, options: dict | None) -> CompileOptions:
    """The backend's options from torch.compile's `mode` and `options`. Raises ValueError for
    an unknown option, an unknown mode, two different modes, or a node that is not an int >= 0."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"torch.compile(backend='genie'): unknown option(s) {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(OPTIONS)}")
    chosen = options.get("mode")
    if mode is not None and chosen is not None and mode != chosen:
        raise ValueError(f"torch.compile(backend='genie'): mode={mode!r} and options['mode']={chosen!r} differ")
    chosen = chosen or mode or "default"
    if chosen not in MODES:
        raise ValueError(f"torch.compile(backend='genie'): unknown mode {chosen!r}; accepted: {', '.join(MODES)}")
    node = options.get("node")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
        raise ValueError(f"torch.compile(backend='genie'): options['node'] must be a device index (int >= 0), "
                         f"got {node!r}")
    return CompileOptions(node, chosen)
