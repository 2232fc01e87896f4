"""The ops the PrivateUse1 kernel hands to Python: the aten calls the C++ recorder does not take.

Ops on device tensors are recorded in C++ by the PrivateUse1 kernel (python/csrc/dispatch_kernel.cc,
python/csrc/frontend/recorder.h): device checks, shape inference with its plan cache, the node,
the output tensors. `dispatch(func, args, kwargs)` gets the rest, with the arguments as
__torch_dispatch__ would get them:
- data movement between the host and the device (genie.transfers): uploads, downloads
  (materialization), `.item()`;
- compatibility ops (genie.compat): host tensors taken as CUDA takes them, refusals;
- ops whose outputs only the node can describe (no meta kernel, a data-dependent shape:
  `aten::nonzero`, `aten::masked_select`): they run now, their outputs stay resident and only
  their descriptors come back;
- ops that return Python scalars (`aten::equal`): they run now;
- Python custom ops (`torch.library.custom_op`): their device-agnostic Python implementation runs
  on the device tensors, so the aten ops it calls are recorded;
- calls that read a lost value (a failed run, a lost node): the value's error is raised.
Everything else these handlers record goes back to the C++ recorder through `genie.record`.
"""

from __future__ import annotations

from . import _C, compat, sparse, transfers
from .graph import op_name
from .lazy import lock
from .record import record_op


def dispatch(func, args: tuple, kwargs: dict):
    """The PrivateUse1 kernel's Python path: a special handler, else `record_op`."""
    with lock:
        special = _SPECIAL.get(id(func))  # by id: hashing an OpOverload runs Python
        if special is not None:
            return special(func, args, kwargs)
        return record_op(func, args, kwargs)


# ---- ops handled here, not recorded as they are ---------------------------------------------

def _special_table():
    """Ops handled in Python, by id: data movement (genie.transfers) and compatibility ops
    (genie.compat)."""
    table = {**transfers.HANDLERS, **compat.HANDLERS, **sparse.HANDLERS}
    return {id(op): handler for op, handler in table.items()}  # by id: hashing an OpOverload runs Python


_SPECIAL = _special_table()
# The C++ recorder hands these to `dispatch` always; the rest of _SPECIAL (`_to_copy`, `copy_`,
# advanced indexing) only when they cross the host (python/csrc/frontend/op_facts.h Route).
_ALWAYS_PYTHON = [op_name(op) for op in (*transfers.HANDLERS, *compat.HANDLERS, *sparse.HANDLERS)
                  if op not in transfers.CONDITIONAL and op not in compat.CONDITIONAL]
_C.configure_recorder(dispatch, _ALWAYS_PYTHON)
