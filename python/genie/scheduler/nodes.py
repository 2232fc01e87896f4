"""The cluster this program is connected to, measured: `connected_cluster()`.

Each `remote_accelerator:i` is one genie-node. Its `NodeSpec` takes the node's memory from
its Stats (`torch.remote_accelerator.mem_get_info`: with a memory limit, what is left of it and
the limit; else the device's free and total memory) and its rates from `calibrate_node` run on
the device itself (float32 matmuls and copies, timed from here: the slope between chain lengths
cancels the round trip). The link between the client and each node is fitted from timed
uploads (`calibrate_link`: t = latency + bytes / bandwidth); between two nodes, from timed
node-to-node moves (`tensor.to("remote_accelerator:j")`), when at most `max_pair_nodes`
nodes are connected (else the cluster's default, via the client links). A link whose times
do not grow with the sizes twice (a noisy machine, only small sizes fitting) keeps the
cluster's default too.

A node is measured once per process and address (a short calibration when it joins: about a
second on a CPU node), with tensors sized to fit its free memory (the calibration's tensors
take at most half of it, a timed transfer a quarter); its memory is read after the
calibration's tensors are freed. `forget()` drops the measurements.

Errors: GenieConnectionError when a node cannot be reached; RuntimeError from a calibration
that could not measure (see calibrate.py).
"""
from __future__ import annotations

import threading

from .calibrate import calibrate_link, calibrate_node
from .cluster import Cluster, Link, NodeSpec

_DEVICE = "remote_accelerator"
_lock = threading.Lock()
_rates: dict[str, tuple[float, float]] = {}               # node address -> (FLOP/s, B/s)
_links: dict[tuple[str, str], tuple[float, float] | None] = {}   # (end, end) -> (latency s, B/s)

_LINK_SIZES = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 20, 1 << 23)     # bytes per timed transfer


def node_name(index: int) -> str:
    """The scheduler's name of `remote_accelerator:index`."""
    return f"{_DEVICE}:{index}"


def _upload(device):
    import torch

    def send(nbytes: int) -> None:
        t = torch.ones(max(1, nbytes // 4)).to(device)
        t.reshape(-1)[:1].cpu()  # the upload is done when the node answers a read of it
    return send


def _move(src, dst):
    import torch

    def send(nbytes: int) -> None:
        t = torch.ones(max(1, nbytes // 4), device=src)
        t.reshape(-1)[:1].cpu()  # made on src before the timed move
        t.to(dst).reshape(-1)[:1].cpu()
    return send


def _fitting(free: int, matmul_n: int, copy_bytes: int) -> tuple[int, int]:
    """(matmul_n, copy_bytes) made small enough for a node with `free` bytes: the calibration's
    matmul tensors (two operands, a chain's two results) and its copy's source and
    destination, alive together, take at most half of it; never less than a 64 x 64 matmul
    and a 64 KiB copy."""
    n = max(64, min(matmul_n, int((free / (4 * 4 * 4)) ** 0.5)))
    return n, max(64 << 10, min(copy_bytes, free // 8))


def _link_sizes(free: int) -> tuple[int, ...]:
    """The timed transfer sizes (B) that fit a quarter of `free` (at least the three smallest)."""
    fitting = tuple(s for s in _LINK_SIZES if s <= free // 4)
    return fitting if len(fitting) >= 3 else _LINK_SIZES[:3]


def _calibrated_link(send, free: int) -> tuple[float, float] | None:
    """calibrate_link(send) over `_link_sizes(free)`, tried twice: (latency s, B/s), or None
    when the times did not grow with the sizes either time (a machine too noisy for the
    sizes that fit: the cluster's default link is used)."""
    for _ in range(2):
        try:
            return calibrate_link(send, _link_sizes(free))
        except ValueError:
            continue
    return None


def connected_cluster(devices=None, *, max_pair_nodes: int = 4, matmul_n: int = 512,
                      copy_bytes: int = 16 << 20) -> Cluster:
    """A Cluster of `devices` (indices of remote_accelerator; default: every configured one),
    named `remote_accelerator:i`, measured as the module docstring says."""
    import torch

    from .. import api, runtime
    indices = list(range(api.device_count())) if devices is None else [int(d) for d in devices]
    devices_ = [torch.device(_DEVICE, i) for i in indices]
    addresses = [runtime.runtime_for(d).connection().address for d in devices_]
    with _lock:
        for device, address in zip(devices_, addresses):
            free, total = torch.remote_accelerator.mem_get_info(device)
            room = min(free, total)
            if address not in _rates:
                n, nbytes = _fitting(room, matmul_n, copy_bytes)
                chain = min(64, max(4, -(-copy_bytes // nbytes)))  # small tensors: longer chains than the noise
                _rates[address] = calibrate_node(device, matmul_n=n, copy_bytes=nbytes, chain=chain)
            if ("client", address) not in _links:
                _links[("client", address)] = _calibrated_link(_upload(device), room)
            torch.remote_accelerator.synchronize(device)  # the calibration's tensors freed
        pairs = []
        if 1 < len(indices) <= max_pair_nodes:
            for a in range(len(indices)):
                for b in range(a + 1, len(indices)):
                    key = (addresses[a], addresses[b])
                    if key not in _links:
                        room = min(min(torch.remote_accelerator.mem_get_info(d)) for d in (devices_[a], devices_[b]))
                        _links[key] = _calibrated_link(_move(devices_[a], devices_[b]), room)
                        torch.remote_accelerator.synchronize(devices_[a])
                        torch.remote_accelerator.synchronize(devices_[b])
                    pairs.append((a, b, key))
        nodes, links = [], []
        for i, device, address in zip(indices, devices_, addresses):
            free, total = torch.remote_accelerator.mem_get_info(device)  # after the calibration
            flops, bandwidth = _rates[address]
            kind = "cuda" if runtime.runtime_for(device).connection().device.startswith("cuda") else "cpu"
            nodes.append(NodeSpec(node_name(i), kind, total, min(free, total), flops, bandwidth))
            if _links[("client", address)] is not None:
                latency, rate = _links[("client", address)]
                links.append(Link("client", node_name(i), rate, latency))
        for a, b, key in pairs:
            if _links[key] is not None:
                latency, rate = _links[key]
                links.append(Link(node_name(indices[a]), node_name(indices[b]), rate, latency))
    return Cluster(nodes, links)


def forget() -> None:
    """Drops every measurement: the next `connected_cluster` measures again."""
    with _lock:
        _rates.clear()
        _links.clear()
