"""Host evaluation: reads the host can answer exactly, without a round trip to the node.

The rules are the C++ recorder's (python/csrc/frontend/host_eval.h: small integer and bool
values computed on the host from small integer uploads, by exact ops only). This module holds
the switch: `GENIE_HOST_EVAL` (genie.config, default on); `set_enabled(False)` sends every read
to the node (perf/op_coverage.py does, to test the node's kernels).
"""

from __future__ import annotations

from . import _C, config

MAX_BYTES = _C.HOST_EVAL_MAX_BYTES  # a tensor larger than this is never kept or computed on the host (bytes)


def set_enabled(enabled: bool) -> None:
    _C.set_host_eval(bool(enabled))


def is_enabled() -> bool:
    return _C.host_eval_enabled()


set_enabled(config.get("GENIE_HOST_EVAL"))
