"""`torch.compile(model, backend="genie")`: Dynamo's graphs run on remote_accelerator.

The backend `genie` is registered through the `torch_dynamo_backends` entry point
(pyproject.toml), so `torch.compile(..., backend="genie")` finds it without `import genie`
(loading it imports genie, which registers the device). docs/compile.md describes a call.

- `backend`: the Dynamo backend (genie.compile.compiler.backend);
- `stats()`: graphs, recompiles, graph breaks, parts and the engine that ran each;
- `mark()`, `ran_since(mark)`, `graph_breaks_since(mark)`: the compiled functions (Dynamo
  graphs) that ran in a window, for genie.explain's compiled section;
- modules: `options` (what `options=` accepts), `partition` (what runs on the node),
  `fake` (FakeTensors on remote_accelerator), `compiler` (the backend, the runners),
  `records` (the books: per Dynamo graph its aten graphs, their analysis and parts).
"""
from __future__ import annotations

from . import fake
from .compiler import backend, graph_breaks_since, mark, ran_since, reset_stats, stats
from .options import CompileOptions, parse_options

# Before Dynamo traces: loading the backend by name (the entry point) imports this package first.
fake.install()

__all__ = ["CompileOptions", "backend", "graph_breaks_since", "mark", "parse_options", "ran_since", "reset_stats",
           "stats"]
