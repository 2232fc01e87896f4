"""The cluster this program is connected to, measured: `connected_cluster()`.

Each `remote_accelerator:i` is one genie-node. Its `NodeSpec` takes the node's memory from
its Stats (`torch.remote_accelerator.mem_get_info`: with a memory limit, what is left of it and
the limit; else the device's free and total memory) and its rates from `calibrate_node` run on
the device itself (float32 matmuls and copies, timed from here: the slope between chain lengths
cancels the round trip). The link between the client and each node is fitted from timed
uploads (`calibrate_link`: t = latency + bytes / bandwidth); between two nodes, from timed
node-to-node moves (`tensor.to("remote_accelerator:j")`), when at most `max_pair_nodes`
nodes are connected (else the cluster's default, via the client links).

A node is measured once per process and address (a short calibration when it joins: about a
second on a CPU node); `forget()` drops the measurements.

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
_links: dict[tuple[str, str], tuple[float, float]] = {}   # (end, end) -> (latency s, B/s)

_LINK_SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 23)       # bytes per timed transfer


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


def connected_cluster(devices=None, *, max_pair_nodes: int = 4, matmul_n: int = 512,
                      copy_bytes: int = 16 << 20) -> Cluster:
    """A Cluster of `devices` (indices of remote_accelerator; default: every configured one),
    named `remote_accelerator:i`, measured as the module docstring says."""
    import torch

    from .. import api, runtime
    indices = list(range(api.device_count())) if devices is None else [int(d) for d in devices]
    nodes, links = [], []
    with _lock:
        for i in indices:
            device = torch.device(_DEVICE, i)
            rt = runtime.runtime_for(device)
            address = rt.connection().address
            free, total = torch.remote_accelerator.mem_get_info(device)
            if address not in _rates:
                _rates[address] = calibrate_node(device, matmul_n=matmul_n, copy_bytes=copy_bytes)
            flops, bandwidth = _rates[address]
            kind = "cuda" if rt.connection().device.startswith("cuda") else "cpu"
            nodes.append(NodeSpec(node_name(i), kind, total, min(free, total), flops, bandwidth))
            key = ("client", address)
            if key not in _links:
                _links[key] = calibrate_link(_upload(device), _LINK_SIZES)
            latency, rate = _links[key]
            links.append(Link("client", node_name(i), rate, latency))
        if 1 < len(indices) <= max_pair_nodes:
            for i in indices:
                for j in indices:
                    if i >= j:
                        continue
                    a = runtime.runtime_for(torch.device(_DEVICE, i)).connection().address
                    b = runtime.runtime_for(torch.device(_DEVICE, j)).connection().address
                    if (a, b) not in _links:
                        _links[(a, b)] = calibrate_link(_move(torch.device(_DEVICE, i), torch.device(_DEVICE, j)),
                                                        _LINK_SIZES)
                    latency, rate = _links[(a, b)]
                    links.append(Link(node_name(i), node_name(j), rate, latency))
    return Cluster(nodes, links)


def forget() -> None:
    """Drops every measurement: the next `connected_cluster` measures again."""
    with _lock:
        _rates.clear()
        _links.clear()
