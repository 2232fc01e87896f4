"""The memory and device-information functions of `torch.remote_accelerator`, as torch.cuda has
them, and the hooks through which PyTorch's device-generic API (`torch.accelerator`) reaches
them (python/csrc/device_guard.cc: the device guard's synchronizeDevice and the device's
c10::DeviceAllocator call `AcceleratorHooks`).

The figures are the node's:
- allocated bytes: this session's resident bytes on its node, as the node's last reply
  reported them (every Ack and RunResult carries them: `genie._C.Client.resident_stat`), plus
  the small uploads pending locally (they travel inline with the next run), so
  `memory_allocated` needs no round trip. A value freed in the program is freed on the node
  with the next request (or `synchronize()`); the figure falls with its reply. The peak and
  the running totals (`allocated`, `freed`) are kept by the client over those replies, since
  connecting or the last reset. Reserved bytes are the allocated ones: the client caches
  nothing (the node's own device allocator may; `mem_get_info` shows the device's view).
- `mem_get_info`: the node's device, free and total bytes (one Stats request): with a memory
  limit, the limit and what is left of it; else the host's MemAvailable and MemTotal for a CPU
  node, cudaMemGetInfo's for a CUDA node.
- name and properties: the node's Welcome (its device, name, memory limit).

A device whose node was never used reports 0 bytes without connecting, as torch.cuda reports
0 before CUDA is initialized.

On a cluster (several nodes), each node is one device, as each GPU is for torch.cuda:
`device_count()` is the number of nodes, and every function here takes one device, the current
one by default (`remote_accelerator` without an index names it for tensors). A model moved to
the cluster (`module.to("remote_accelerator")`, genie.placed.defer) has its weights on several
nodes once placed: `cluster_memory_allocated()` and `cluster_mem_get_info()` sum over all nodes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from . import _C
from .runtime import all_runtimes, locked, runtime_for


def _device_of(device) -> torch.device:
    """`remote_accelerator:<i>` for None (the current device), an index, a string or a device."""
    if device is None:
        return torch.device("remote_accelerator", _C.current_device())
    if isinstance(device, int):
        return torch.device("remote_accelerator", device)
    device = torch.device(device)
    return torch.device("remote_accelerator", device.index if device.index is not None else _C.current_device())


def _client(device):
    """The connected client of `device` (None: its node was never used, or it is disconnected)."""
    runtime = _runtime(device)
    return runtime.client if runtime is not None else None


_NO_STAT = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}


def _runtime(device):
    """The runtime of `device` (None: its node was never used)."""
    index = _device_of(device).index
    for runtime in all_runtimes():
        if runtime.index == index:
            return runtime
    return None


def _pending_upload_bytes(runtime) -> int:
    """Bytes of the host tensors that travel inline with the next run (small `.to(device)`
    uploads, `aten::alias` of a host tensor) whose value a tensor still holds: resident once
    that run is answered."""
    total = 0
    for node in runtime.pending:
        if node.name != "aten::alias" or node.outputs[0].tensors <= 0:
            continue
        source = node.args[0]
        if isinstance(source, torch.Tensor) and not _C.is_lazy(source):
            total += source.untyped_storage().nbytes()
    return total


@locked
def _resident_stat(device=None) -> dict:
    """{current, peak, allocated, freed} bytes: the node's last reported figures, plus the
    uploads pending locally in `current` (and in `peak` when it passes it)."""
    runtime = _runtime(device)
    if runtime is None or runtime.client is None:
        return dict(_NO_STAT)
    stat = runtime.client.resident_stat()
    pending = _pending_upload_bytes(runtime)
    stat["current"] += pending
    stat["peak"] = max(stat["peak"], stat["current"])
    return stat


def memory_allocated(device=None) -> int:
    """Bytes this session holds resident on the node of `device` (default: the current
    device), as of the node's last reply: no round trip."""
    return _resident_stat(device)["current"]


def max_memory_allocated(device=None) -> int:
    """The largest `memory_allocated` (bytes) reported since connecting or the last
    `reset_peak_memory_stats(device)`."""
    return _resident_stat(device)["peak"]


def memory_reserved(device=None) -> int:
    """`memory_allocated`: nothing is cached on the client's side (bytes)."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    """`max_memory_allocated` (bytes)."""
    return max_memory_allocated(device)


@locked
def reset_peak_memory_stats(device=None) -> None:
    """The peak (`max_memory_allocated`) starts again at the current bytes."""
    client = _client(device)
    if client is not None:
        client.reset_resident_peak()


@locked
def reset_accumulated_memory_stats(device=None) -> None:
    """The running totals (`memory_stats()["allocated_bytes.all.allocated"]` and `.freed`)
    start again at 0."""
    client = _client(device)
    if client is not None:
        client.reset_resident_accumulated()


def memory_stats(device=None) -> collections.OrderedDict:
    """torch.cuda.memory_stats' keys that have a meaning here, sorted:
    `{allocated,reserved,active}_bytes.{all,large_pool}.{current,peak,allocated,freed}` (bytes;
    the session's resident bytes, as `memory_allocated`), `small_pool` ones 0. No round trip.
    (The node's own statistics, by residency class: `genie.memory_stats`.)"""
    stat = _resident_stat(device)
    out = {}
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{pool}.{metric}"] = 0 if pool == "small_pool" else stat[metric]
    return collections.OrderedDict(sorted(out.items()))


@locked
def empty_cache() -> None:
    """Frees on the nodes now (one request each, waiting for its Ack) the values the program
    no longer holds, which would otherwise go with the next request. Nothing pending runs."""
    for runtime in all_runtimes():
        if runtime.client is None:
            continue
        runtime.recording.drain_dead()
        if not runtime.recording.has_released:
            continue
        frees = runtime.recording.take_frees(runtime.recording.live_handles())
        if frees:
            runtime._call("free", frees, True)
            if runtime.lineage is not None:
                runtime.lineage.free(frees)


@locked
def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the node's device (one request; connects): with a memory limit,
    what is left of it and the limit; else the host's MemAvailable and MemTotal for a CPU node,
    cudaMemGetInfo for a CUDA node. Raises GenieConnectionError."""
    stats = runtime_for(_device_of(device)).stats()
    return stats["device_free"], stats["device_total"]


def device_count() -> int:
    """The number of remote_accelerator devices: the nodes this process is configured with
    (`genie.init`, `GENIE_SERVER`; 1 for the embedded node), as torch.cuda counts GPUs.
    Connects to none of them."""
    from . import _session
    return len(_session.session().servers)


def cluster_memory_allocated() -> int:
    """Bytes this session holds resident over all its nodes: `memory_allocated(i)` summed over
    every device (i < device_count()). No round trip; a node never used counts 0."""
    return sum(memory_allocated(i) for i in range(device_count()))


def cluster_mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of all the nodes' devices: `mem_get_info(i)` summed over every
    device (one request each; connects to each). Raises GenieConnectionError."""
    infos = [mem_get_info(i) for i in range(device_count())]
    return sum(free for free, _ in infos), sum(total for _, total in infos)


@dataclass(frozen=True)
class RemoteDeviceProperties:
    """What `torch.remote_accelerator.get_device_properties(i)` reports, as
    torch.cuda.get_device_properties does for a GPU: `name` (the node's device, "cpu" or
    "cuda:0"), `total_memory` (bytes: the node's memory limit for this session, else its
    device's total), `type` ("remote_accelerator"), `device` (the node's device),
    `node_name`, `address` ("host:port"), `memory_limit` (bytes, 0: none)."""

    name: str
    total_memory: int
    type: str
    device: str
    node_name: str
    address: str
    memory_limit: int


@locked
def get_device_properties(device=None) -> RemoteDeviceProperties:
    """The properties of `device`'s node (connects; one Stats request). Raises
    GenieConnectionError."""
    runtime = runtime_for(_device_of(device))
    client = runtime.connection()
    total = client.memory_limit or runtime.stats()["device_total"]
    return RemoteDeviceProperties(client.device, total, "remote_accelerator", client.device, client.node_name,
                                  client.address, client.memory_limit)


@locked
def get_device_name(device=None) -> str:
    """The node's device ("cpu", "cuda:0"), as its Welcome names it (connects)."""
    return runtime_for(_device_of(device)).connection().device


class AcceleratorHooks:
    """What python/csrc/device_guard.cc calls for torch.accelerator (device indices are ints)."""

    @staticmethod
    @locked
    def synchronize(index: int) -> None:
        """genie.synchronize(index): runs the device's pending ops, sends its frees, waits."""
        runtime_for(torch.device("remote_accelerator", index)).flush()

    resident_stat = staticmethod(_resident_stat)
    reset_peak_memory_stats = staticmethod(reset_peak_memory_stats)
    reset_accumulated_memory_stats = staticmethod(reset_accumulated_memory_stats)
    empty_cache = staticmethod(empty_cache)
    mem_get_info = staticmethod(mem_get_info)


FUNCTIONS = (memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved, reset_peak_memory_stats,
             reset_accumulated_memory_stats, memory_stats, empty_cache, mem_get_info, get_device_name,
             get_device_properties, cluster_memory_allocated, cluster_mem_get_info)
