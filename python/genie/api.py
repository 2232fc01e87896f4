"""Genie's public functions (re-exported by `genie`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from . import _C, _session
from .device import _device_of, device_count, synchronize  # noqa: F401 - part of genie's API
from .graph import Graph
from .runtime import all_runtimes, locked, runtime_for


@dataclass(frozen=True)
class DeviceProperties:
    """What `genie.get_device(i)` reports about `remote_accelerator:i`.

    `address` is the node's "host:port"; `device` the node's own device ("cpu", "cuda:0");
    `memory_limit` this session's limit in bytes, the smaller of its quota and the node's limit
    (0: none); `embedded` whether this process started it.
    """

    index: int
    address: str
    node_name: str
    device: str
    memory_limit: int
    embedded: bool

    def __str__(self) -> str:
        return f"remote_accelerator:{self.index}"

    def to_torch_device(self) -> torch.device:
        return torch.device("remote_accelerator", self.index)


def init(server=None, auth_token: str | None = None, timeout_ms: int | None = None,
         keep_host_copy: bool | None = None, etcd: str | None = None) -> None:
    """Chooses the node(s): `server` is "host:port", "h1:p1,h2:p2" or a list; default
    `GENIE_SERVER`; with neither, an embedded genie-node on loopback. Connects lazily.

    `etcd` (default `GENIE_ETCD`): an etcd client URL, "http://127.0.0.1:2379"; the nodes are
    those registered there now (`genie-node --etcd`, key prefix `GENIE_ETCD_PREFIX`), sorted by
    address (genie.membership): a node that joins or leaves later changes only later
    sessions. Not together with `server` (ValueError).

    `keep_host_copy` (default `GENIE_KEEP_HOST_COPY`, off): keep the host tensors sent to the
    nodes (the weights) and the lineage of what each node holds (`genie.lineage`), so that when
    a node is lost the program goes on: Genie connects again (the node restarted at its
    address, for up to 60 s, or a restarted embedded node), uploads the weights again, replays
    the runs that made the lost state (a KV cache), and repeats the request that failed. It
    costs host memory (the copies), no bytes on the wire. Off, values of a lost node raise
    GenieConnectionError naming it.

    Raises ValueError for a malformed address, GenieConnectionError if the embedded node
    cannot start, or naming the etcd URL when etcd cannot be reached or lists no node."""
    _session.init(server, auth_token, timeout_ms, keep_host_copy, etcd)


def shutdown() -> None:
    """Frees everything on the nodes, closes the sessions, stops the embedded node."""
    _session.shutdown()


@locked
def get_device(index: int = 0) -> DeviceProperties:
    """Properties of `remote_accelerator:index` (connects). Raises GenieConnectionError."""
    session = _session.session()
    runtime = runtime_for(torch.device("remote_accelerator", index))
    client = runtime.connection()
    return DeviceProperties(index, client.address, client.node_name, client.device, client.memory_limit,
                            session.embedded is not None)


@locked
def memory_stats(device=None) -> dict:
    """The node's statistics: `resident` bytes by residency class ("PersistentWeight",
    "StatefulKvCache", "EphemeralActivation", "Gradient"), `sessions`, `graphs_cached`,
    `ops_executed`, `bytes_in`, `bytes_out` (bytes), `memory_limit` (bytes, 0: none), the
    compiled parts' engines (`package_calls`, `executor_calls`, `packages_built`,
    `packages_loaded`, `compile_failures`) and the node-to-node traffic (`peer_bytes_sent`,
    `peer_bytes_received`: bytes, `peer_transfers`)."""
    runtime = runtime_for(_device_of(device))  # None: the current device
    runtime.flush()
    return runtime.stats()


@locked
def client_stats() -> dict:
    """This process's traffic over all devices since start: `bytes_sent`, `bytes_received`
    (headers and payloads, bytes), `messages_sent`, `round_trips` (requests that waited for a
    reply), `async_runs` (graphs sent without waiting), `node_exec_us` (the nodes' execution
    time of every answered graph, µs), `graphs_registered`, and how the ops on LazyTensors were
    handled since start: `ops_recorded_cpp` (recorded by the C++ recorder of the PrivateUse1
    kernel), `ops_handled_python` (handed to genie.python_ops: transfers between host and device,
    reads, data-dependent, scalar-returning and compatibility ops, Python custom ops)."""
    total = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "round_trips": 0, "async_runs": 0,
             "node_exec_us": 0}
    for runtime in all_runtimes():
        for k, v in runtime.counters().items():
            total[k] = total.get(k, 0) + v
    total["graphs_registered"] = sum(r.recording.graph_count for r in all_runtimes())
    ops = _C.recorder_counters()
    total["ops_recorded_cpp"] = ops["cpp"]
    total["ops_handled_python"] = ops["python"]
    return total


_last_graph: Graph | None = None


@contextlib.contextmanager
def capture(device="remote_accelerator:0"):
    """Within the block, factory functions without a device (`torch.randn(3)`) make
    LazyTensors on `device`, and every recorded op is logged; `genie.get_graph()` then
    returns what was recorded (seed 000's capture API)."""
    global _last_graph
    recording = runtime_for(torch.device(device)).recording
    recording.logging = True
    try:
        with torch.device(device):
            yield
    finally:
        _last_graph = Graph(recording.log)
        recording.logging = False


def get_graph() -> Graph:
    """The graph recorded by the last `genie.capture()` block (nodes in program order)."""
    if _last_graph is None:
        raise RuntimeError("genie.get_graph(): no genie.capture() block has run")
    return _last_graph
