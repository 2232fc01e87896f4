"""Genie's exceptions: one class per kind of failure, each message naming what failed.

The C++ extension (`genie._C`) raises these from the data plane's status values:

- `GenieConnectionError`: the node is unreachable or went away (refused connection, peer
  died, stopped or cut off, timeout, "is shutting down" after a clean stop). The message names
  the node's address. Raised within the peer timeout plus one heartbeat tick
  (`GENIE_PEER_TIMEOUT_MS`: 2.25 s by default); never a hang. With
  `genie.init(keep_host_copy=True)` a lost node is rebuilt instead (docs/security.md).
- `GenieRemoteError`: the node answered with an error: `code` is the wire ErrorCode's name
  ("UnknownOp", "TorchError", "OutOfMemory", ...), `op_index`/`op_name` the failing op's index
  in the graph and its aten name (-1 and "" when no op failed), `node_message` the node's text.
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
                 node_message: str = ""):
        super().__init__(message)
        self.code = code
        self.op_index = op_index
        self.op_name = op_name
        self.node_message = node_message
