"""Genie's exceptions: one class per kind of failure, each message naming what failed.

The C++ extension (`genie._C`) raises these from the data plane's status values:

- `GenieConnectionError`: the node is unreachable or went away (refused connection, peer
  died, stopped or cut off, timeout, "is shutting down" after a clean stop). The message names
  the node's address. Raised within the peer timeout plus one heartbeat tick
  (`GENIE_PEER_TIMEOUT_MS`: 2.25 s by default); never a hang. With
  `genie.init(keep_host_copy=True)` a lost node is rebuilt instead (docs/security.md).
- `GenieRemoteError`: the node answered with an error: `code` is the wire ErrorCode's name
  ("UnknownOp", "TorchError", "OutOfMemory", ...), `op_index`/`op_name` the failing op's index
  in the graph and its aten name (-1 and "" when no op failed), `node_message` the node's text
  (for an op: torch's own message), `error_class` the C++ exception class the op raised
  ("c10::IndexError"). An op's error is also an instance of the class eager PyTorch raises for
  that C++ class (torch/csrc/Exceptions.h): `except IndexError` catches an index out of range
  on a remote tensor as it does on a local one (`remote_error` makes these).
- `GenieError`: anything else (bad arguments to Genie's API, internal errors).

After any of them the program's local state is intact; the next call works once a node is
reachable.
"""

from __future__ import annotations


class GenieError(RuntimeError):
    """Base class of Genie's errors."""


class GenieConnectionError(GenieError):
    """The node is unreachable or gone; the message names its address."""


class GenieRemoteError(GenieError):
    """The node refused or failed a request.

    Attributes:
        code: the wire ErrorCode name, e.g. "UnknownOp", "TorchError", "OutOfMemory".
        op_index: the failing op's index in the graph, -1 if the error is not an op's.
        op_name: the failing op's schema name, e.g. "aten::addmm.default"; "" if none.
        node_message: the node's own message (torch's message for a TorchError).
    """

    def __init__(self, message: str, code: str = "Unknown", op_index: int = -1, op_name: str = "",
                 node_message: str = "", error_class: str = ""):
        super().__init__(message)
        self.code = code
        self.op_index = op_index
        self.op_name = op_name
        self.node_message = node_message
        self.error_class = error_class


# The Python class eager raises for each C++ exception class of c10 (torch/csrc/Exceptions.h,
# CATCH_CORE_ERRORS); c10::Error and any other: RuntimeError, which GenieRemoteError already is.
_EAGER_BUILTINS = {
    "c10::IndexError": IndexError,
    "c10::ValueError": ValueError,
    "c10::TypeError": TypeError,
    "c10::NotImplementedError": NotImplementedError,
    "c10::BufferError": BufferError,
}
_REMOTE_CLASSES: dict[str, type] = {}


def _eager_class(error_class: str) -> type | None:
    if error_class in _EAGER_BUILTINS:
        return _EAGER_BUILTINS[error_class]
    if error_class in ("c10::LinAlgError", "c10::OutOfMemoryError"):
        import torch  # only when such an error came back
        return torch.linalg.LinAlgError if error_class == "c10::LinAlgError" else torch.OutOfMemoryError
    return None


def remote_error(message: str, code: str = "Unknown", op_index: int = -1, op_name: str = "", node_message: str = "",
                 error_class: str = "") -> GenieRemoteError:
    """The exception for a node's Error reply: a GenieRemoteError with these attributes which,
    when `error_class` names a C++ exception that eager raises as another Python class
    (c10::IndexError -> IndexError, c10::LinAlgError -> torch.linalg.LinAlgError, ...), is
    also an instance of that class (a subclass of both, made once per class)."""
    eager = _eager_class(error_class)
    cls = GenieRemoteError
    if eager is not None and not issubclass(GenieRemoteError, eager):
        cls = _REMOTE_CLASSES.get(error_class)
        if cls is None:
            cls = type(f"GenieRemote{eager.__name__.lstrip('_')}", (GenieRemoteError, eager), {"__module__": __name__})
            _REMOTE_CLASSES[error_class] = cls
    return cls(message, code=code, op_index=op_index, op_name=op_name, node_message=node_message,
               error_class=error_class)
