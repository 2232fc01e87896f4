"""Genie: remote GPUs that feel local to PyTorch.

    import genie, torch
    model = model.to("remote_accelerator:0")    # weights go to the node once, stay resident
    out = model(x.to("remote_accelerator:0"))   # ops are recorded lazily, plain torch.Tensors
    print(out.argmax(-1).tolist())              # materialization: one request, only these bytes

Importing genie registers the `remote_accelerator` device with PyTorch. The node is named
by `genie.init(server=...)` or `GENIE_SERVER`; with neither, an embedded `genie-node` runs on
loopback. See docs/architecture.md.
"""

from __future__ import annotations

from . import device as _device
from . import runtime as _runtime
from .api import (DeviceProperties, capture, client_stats, device_count, get_device, get_graph, init,
                  memory_stats, shutdown, synchronize)
from .errors import GenieConnectionError, GenieError, GenieRemoteError

_device.register()


def _residency_ids(cut, outputs) -> dict[int, int]:
    """The KV caches and gradients of a graph structure's first cut (genie.runtime.
    set_residency_analysis). An analysis that fails marks nothing, with a warning: residency is
    an annotation, never a reason for the program to fail."""
    from .semantics.recorded import residency_ids  # not at import: loaded by the first new graph
    try:
        return residency_ids(cut, outputs)
    except Exception as error:  # noqa: BLE001 - see the docstring
        import warnings
        warnings.warn(f"genie: the residency analysis of a graph failed ({type(error).__name__}: {error}); "
                      "its values keep residency EphemeralActivation", RuntimeWarning, stacklevel=2)
        return {}


_runtime.set_residency_analysis(_residency_ids)


def _defer(module) -> None:
    from .placed import defer  # not at import: it loads the analysis and the scheduler
    defer(module)


_device._defer = _defer  # module.to("remote_accelerator") on a cluster (genie.device._module_to)


def compile_stats() -> dict:
    """What `torch.compile(backend="genie")` did in this process: graphs, recompiles, graph
    breaks, and which engine ran each part (genie.compile.stats; docs/compile.md)."""
    from .compile import stats  # not at import: it loads torch._dynamo
    return stats()


def explain(fn, *args, **kwargs):
    """What Genie understands of `fn(*args, **kwargs)`: per step its patterns, phase, residency
    and costs, and with `cluster=` the schedule (genie.explanation.explain; docs/semantics.md).
    CPU modules and tensors are analysed as if on remote_accelerator without running."""
    from .explanation import explain as _explain  # not at import: it loads the analysis
    return _explain(fn, *args, **kwargs)


def place(model, *example_args, **kwargs):
    """Places a host `model` over the connected nodes from one example call, as the scheduler
    decides for `goal=` ("latency" or "throughput"), and moves it there block by block; returns
    the Placement (genie.placed.place; docs/scheduler.md "Running a placement")."""
    from .placed import place as _place  # not at import: it loads the analysis and the scheduler
    return _place(model, *example_args, **kwargs)


def disaggregate(model, example_ids, **kwargs):
    """Serves a transformers causal LM with prefill on one node and decode on another, the KV
    cache moved node to node once (genie.placed.disaggregate; docs/scheduler.md)."""
    from .placed import disaggregate as _disaggregate
    return _disaggregate(model, example_ids, **kwargs)


__all__ = [
    "DeviceProperties", "GenieConnectionError", "GenieError", "GenieRemoteError", "capture",
    "client_stats", "compile_stats", "device_count", "disaggregate", "explain", "get_device", "get_graph", "init", "memory_stats", "place", "shutdown", "synchronize",
]
